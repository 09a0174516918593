"""The vLLM releases the reference has facts for, and the facts that differ between them.

- Generation 1, vLLM 0.19 to 0.28 (per-backend ``get_kv_cache_shape``): ``reference.gen1``,
  with its per-release eras (``GEN1_LAYOUT_OVERRIDES``, ``GEN1_KERNEL_BLOCK_SIZES``).
- Generation 2 (``KVCacheLayout``): ``reference.derive`` models vLLM 0.33.0. vLLM 0.32.x was
  run through the same drivers (``kvconform run`` in ``scripts/release_env.sh 0.32.0``'s
  venv: every named case, both runners, their own code) and differs only where this module
  says (``GEN2_DIFFERENCES``); each fact names the release it was read from.
- vLLM 0.29 to 0.31 and 0.34 on: no facts. A run there says so in one line instead of
  judging by 0.33.0's rules.

A case says which release it is judged by (``CaseConfig.vllm_version``); ``kvconform run``
stamps the installed release on each generation-2 case.
"""

from __future__ import annotations

from dataclasses import dataclass

from reference.errors import ConfigError, NotModeledError

Version = tuple[int, int, int]

GEN2_FACTS_FROM: Version = (0, 32, 0)
"""The oldest generation-2 release the reference has facts for."""
GEN2_FACTS_UNTIL: Version = (0, 34, 0)
"""The first release after the newest one it has facts for."""


@dataclass(frozen=True)
class ReleaseFact:
    """One behaviour that changed at ``since``, with where it was read."""

    name: str
    since: Version
    source: str


MRV2_SLIDING_WINDOW_REACH = ReleaseFact(
    "MRv2 BlockTables nulls block ids below a sliding window",
    (0, 33, 0),
    "vllm/v1/worker/gpu/block_table.py: BlockTables(sliding_window_reach=...) is new in 0.33.0; 0.32.0's "
    "BlockTables gathers every block id of the row (observed: swa-hybrid-* cases through 0.32.0's own "
    "BlockTables keep the ids below the window)",
)
GEN2_DIFFERENCES: tuple[ReleaseFact, ...] = (MRV2_SLIDING_WINDOW_REACH,)


def parse_release(text: str) -> Version:
    """``"0.32.1.dev3+cpu"`` -> ``(0, 32, 1)``."""
    from reference.gen1 import parse_version

    return parse_version(text)


def _fmt(v: Version) -> str:
    return ".".join(map(str, v))


def check_gen2_version(text: str) -> Version:
    """The release, or why the reference has no generation-2 facts for it (NotModeledError)."""
    v = parse_release(text)
    if not GEN2_FACTS_FROM <= v < GEN2_FACTS_UNTIL:
        raise NotModeledError(
            f"the reference has no generation-2 facts for vLLM {text} (it has them for "
            f"{_fmt(GEN2_FACTS_FROM)} to {_fmt((0, GEN2_FACTS_UNTIL[1] - 1, 0))[:-2]}.x; generation 1: 0.19 to 0.28)"
        )
    return v


def has(fact: ReleaseFact, vllm_version: str) -> bool:
    """Whether ``vllm_version`` has the behaviour ``fact`` describes."""
    if not isinstance(vllm_version, str):
        raise ConfigError(f"vLLM version {vllm_version!r} is not a string like '0.33.0'")
    return parse_release(vllm_version) >= fact.since


__all__ = ["GEN2_DIFFERENCES", "GEN2_FACTS_FROM", "GEN2_FACTS_UNTIL", "MRV2_SLIDING_WINDOW_REACH", "ReleaseFact",
           "check_gen2_version", "has", "parse_release"]
