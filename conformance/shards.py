"""Shards: a deterministic part of a selection, for CI agents that split one run.

``--shard K/N`` (``kvconform run`` and ``check``, the plugin's ``--kvconform-shard``) keeps
the K-th of N parts of whatever the other options selected. Every shard computes the same
assignment from the whole selection, so the N parts are disjoint and their union is exactly
the selection, on any machine: items are dealt out by expected cost, the most expensive
first, each to the shard with the least cost so far (ties: the lower shard; items of equal
cost in selection order). ``--shard auto`` reads Buildkite's parallel-job variables.

A sharded report says which part it is (``shard`` in ``kvconform.report/1``: index, count,
the selection's size and digest, and each result's position in the selection), so
``kvconform report merge`` can tell a complete set of shards from an incomplete one and put
the results back in selection order.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence, TypeVar

T = TypeVar("T")

MAX_SHARDS = 4096
"""More shards than any CI runs agents; a bound, so ``--shard 1/10**9`` is bad input, not a huge list."""
BUILDKITE_JOB, BUILDKITE_COUNT = "BUILDKITE_PARALLEL_JOB", "BUILDKITE_PARALLEL_JOB_COUNT"
"""Buildkite's parallel-job variables: a 0-based job index and the job count (``parallelism: N``)."""


class ShardError(ValueError):
    """A shard argument that is not ``K/N`` with 1 <= K <= N (one line, naming the value)."""


@dataclass(frozen=True)
class Shard:
    """The K-th of N parts of a selection."""

    index: int
    """K, from 1."""
    count: int
    """N, at least 1."""

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(text: str, environ: Mapping[str, str] | None = None) -> Shard:
    """``K/N`` (1 <= K <= N <= ``MAX_SHARDS``), or ``auto``: Buildkite's job (0-based) + 1 of its count."""
    environ = os.environ if environ is None else environ
    if text == "auto":
        job, count = environ.get(BUILDKITE_JOB), environ.get(BUILDKITE_COUNT)
        if job is None or count is None:
            raise ShardError(f"--shard auto needs {BUILDKITE_JOB} and {BUILDKITE_COUNT} in the environment "
                             f"(Buildkite sets them for a step with parallelism); got {job!r} and {count!r}")
        text = f"{_whole(job, BUILDKITE_JOB) + 1}/{_whole(count, BUILDKITE_COUNT)}"
    left, sep, right = text.partition("/")
    if not sep:
        raise ShardError(f"shard {text!r} is not K/N (e.g. 2/4: the second of four parts)")
    index, count = _whole(left, f"shard {text!r}: the index"), _whole(right, f"shard {text!r}: the count")
    if not 1 <= count <= MAX_SHARDS:
        raise ShardError(f"shard {text!r}: the count {count} must be from 1 to {MAX_SHARDS}")
    if not 1 <= index <= count:
        raise ShardError(f"shard {text!r}: the index {index} must be from 1 to the count {count}")
    return Shard(index, count)


def _whole(text: str, what: str) -> int:
    if not text.strip().isdigit():
        raise ShardError(f"{what} {text!r} is not a whole number")
    return int(text)


def case_cost(case: Any) -> float:
    """Expected cost of a case relative to one dense layer: each layer is built and viewed,
    a draft adds the drafter's own initialisation and draft steps, a Mamba mixer its state."""
    layers = case.layers
    cost = 1.0 + 0.25 * len(layers)
    if any(layer.is_draft for layer in layers):
        cost *= 2.0
    if any(layer.kind == "mamba" for layer in layers):
        cost += 0.5
    return cost


def item_cost(item: Any) -> float:
    """A collected pytest item: its sampled case's cost (``kv_case``), else one dense case's."""
    callspec = getattr(item, "callspec", None)
    case = None if callspec is None else callspec.params.get("kv_case")
    return case_cost(case) if hasattr(case, "layers") else 1.0


def assign(costs: Sequence[float], count: int) -> list[int]:
    """Per item, its shard (1 to ``count``): the greedy longest-processing-time deal."""
    loads = [0.0] * count
    out = [0] * len(costs)
    for position in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        shard = min(range(count), key=lambda s: (loads[s], s))
        loads[shard] += costs[position]
        out[position] = shard + 1
    return out


def take(items: Sequence[T], shard: Shard, cost: Callable[[T], float]) -> tuple[list[T], list[int]]:
    """The items of ``shard`` in selection order, and their positions in ``items``."""
    owners = assign([cost(item) for item in items], shard.count)
    positions = [i for i, owner in enumerate(owners) if owner == shard.index]
    return [items[i] for i in positions], positions


def selection_digest(keys: Sequence[str]) -> str:
    """Names one selection (its items' JSON, in order): shards of the same selection share it."""
    h = hashlib.sha256()
    for key in keys:
        h.update(key.encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()[:16]


def shard_record(shard: Shard, keys: Sequence[str], positions: Sequence[int]) -> dict[str, Any]:
    """What a sharded report carries (``shard`` in ``report.schema.json``)."""
    return {
        "index": shard.index,
        "count": shard.count,
        "selection_size": len(keys),
        "selection_digest": selection_digest(keys),
        "positions": list(positions),
    }


__all__ = ["MAX_SHARDS", "Shard", "ShardError", "assign", "case_cost", "item_cost", "parse_shard", "selection_digest",
           "shard_record", "take"]
