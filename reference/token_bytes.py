"""Where the reference says one written token lives: byte runs of its K and V, per head.

The GPU path's worker observes where vLLM's own views place each written token
(``gpu_impl.cuda.datacheck``); ``conformance.gpu_verdict`` compares those byte runs with
the ones predicted here. Everything here is the reference's prediction
(``reference.derive.Derivation``):

- the token's chunk for head ``h``: the reference's registered ``TensorView`` element
  ``[kernel_block, h, kernel_offset, 0:C]`` in bytes (the view's element strides are the
  reference's own, derived from the layout, not read from vLLM);
- which bytes of that chunk are K and which are V: the intersection of the chunk with
  ``Derivation.block_bytes(layer, block).k`` / ``.v`` (the per-block ``Region`` runs);
- a consistency check: the chunk lies inside the block's ``page`` region.

A slot is in manager (logical) units in both runners: ``block = slot // block_size``,
``offset = slot % block_size``; the kernel-block view addresses it as
``kernel_block = block * ratio + offset // kernel_block_size`` (the same number as
``slot // kernel_block_size``) and ``kernel_offset = offset % kernel_block_size``.

Pure Python: no vLLM, no torch.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Iterable, NamedTuple

from reference.errors import ConfigError, NotModeledError
from reference.views import Region

Run = tuple[int, int]
"""``[start, stop)`` byte range in the pool (relative to the allocation's first byte)."""


class HeadBytes(NamedTuple):
    """One (token, head) of a layer: its whole chunk, and the K and V runs inside it."""

    head: int
    chunk: Run
    k: tuple[Run, ...]
    v: tuple[Run, ...]


@dataclass(frozen=True)
class TokenBytes:
    """The bytes the reference predicts for one written slot of one layer."""

    layer: str
    slot: int
    block_size: int
    kernel_block_size: int
    block_id: int
    offset: int
    kernel_block_id: int
    kernel_offset: int
    element_size: int
    heads: tuple[HeadBytes, ...]

    @property
    def k_runs(self) -> tuple[Run, ...]:
        """K runs of every head, head after head (the order tensor indexing reads them)."""
        return tuple(r for h in self.heads for r in h.k)

    @property
    def v_runs(self) -> tuple[Run, ...]:
        return tuple(r for h in self.heads for r in h.v)

    @property
    def chunk_runs(self) -> tuple[Run, ...]:
        return tuple(h.chunk for h in self.heads)

    def shifted(self, delta: int) -> "TokenBytes":
        """The same runs ``delta`` bytes later: a deliberately wrong prediction (tests)."""

        def move(runs: tuple[Run, ...]) -> tuple[Run, ...]:
            return tuple((a + delta, b + delta) for a, b in runs)

        heads = tuple(HeadBytes(h.head, (h.chunk[0] + delta, h.chunk[1] + delta), move(h.k), move(h.v)) for h in self.heads)
        return replace(self, heads=heads)

    def to_dict(self) -> dict:
        return {
            "layer": self.layer,
            "slot": self.slot,
            "block_id": self.block_id,
            "offset": self.offset,
            "kernel_block_id": self.kernel_block_id,
            "kernel_offset": self.kernel_offset,
            "first_k_run": list(self.k_runs[0]) if self.k_runs else None,
            "first_v_run": list(self.v_runs[0]) if self.v_runs else None,
        }


def runs_nbytes(runs: Iterable[Run]) -> int:
    return sum(b - a for a, b in runs)


class _SortedRuns:
    """A Region's runs, sorted, for interval queries."""

    __slots__ = ("starts", "runs")

    def __init__(self, region: Region | None) -> None:
        runs = sorted(region.runs()) if region is not None else []
        self.runs = runs
        self.starts = [a for a, _ in runs]

    def intersect(self, lo: int, hi: int) -> tuple[Run, ...]:
        """The parts of the runs inside ``[lo, hi)``, in address order."""
        out: list[Run] = []
        i = max(0, bisect.bisect_right(self.starts, lo) - 1)
        while i < len(self.runs):
            a, b = self.runs[i]
            if a >= hi:
                break
            a, b = max(a, lo), min(b, hi)
            if a < b:
                out.append((a, b))
            i += 1
        return tuple(out)

    def covers(self, lo: int, hi: int) -> bool:
        return runs_nbytes(self.intersect(lo, hi)) == hi - lo


@lru_cache(maxsize=256)
def _block_runs(page: Region, k: Region, v: Region | None) -> tuple[_SortedRuns, _SortedRuns, _SortedRuns]:
    return _SortedRuns(page), _SortedRuns(k), _SortedRuns(v)


def layer_block_size(d, layer: str) -> int:
    """The manager block size of the layer's KV cache group (slots are in these units)."""
    view = d.registered[layer]
    return d.plan.groups[view.group_id].spec.block_size


def token_bytes(d, layer: str, slot: int) -> TokenBytes:
    """The reference's bytes for ``slot`` of ``layer`` (``d``: a ``Derivation``).

    Raises ConfigError for a slot outside the pool or a layer the reference does not
    have, NotModeledError where a (token, head) chunk of the view holds no K (backends
    that store K and V as per-head planes, CPU_ATTN), and AssertionError if the reference
    contradicts itself (a chunk outside its block's page region, or overlapping K/V runs).
    """
    if layer not in d.registered:
        raise ConfigError(f"layer {layer!r} is not registered in the reference ({len(d.registered)} layers)")
    if isinstance(slot, bool) or not isinstance(slot, int) or slot < 0:
        raise ConfigError(f"slot {slot!r} must be a non-negative int (PAD slots are -1 and never written)")
    view = d.registered[layer]
    block_size = layer_block_size(d, layer)
    kbs = view.kernel_block_size
    if block_size % kbs:
        raise ConfigError(f"kernel block size {kbs} does not divide block size {block_size}")
    ratio = block_size // kbs
    block_id, offset = divmod(slot, block_size)
    if block_id >= d.num_blocks:
        raise ConfigError(f"slot {slot} is in block {block_id}, outside the pool's {d.num_blocks} blocks")
    kernel_block_id = block_id * ratio + offset // kbs
    kernel_offset = offset % kbs
    bb = d.block_bytes(layer, block_id)
    page, k_runs, v_runs = _block_runs(bb.page, bb.k, bb.v)
    es = view.element_size
    if view.stride[3] != 1:
        raise ConfigError(f"layer {layer!r}: the reference view's last dim is not contiguous (stride {view.stride})")
    chunk_bytes = view.shape[3] * es
    heads: list[HeadBytes] = []
    for h in range(view.shape[1]):
        elem = view.storage_offset + kernel_block_id * view.stride[0] + h * view.stride[1] + kernel_offset * view.stride[2]
        lo, hi = elem * es, elem * es + chunk_bytes
        if not page.covers(lo, hi):
            raise AssertionError(
                f"reference inconsistency: {layer} slot {slot} head {h} bytes [{lo}, {hi}) are not inside "
                f"block {block_id}'s page region {bb.page}"
            )
        k, v = k_runs.intersect(lo, hi), v_runs.intersect(lo, hi)
        if not k or (bb.v is not None and not v):
            raise NotModeledError(
                f"{layer} slot {slot} head {h}: the reference's K and V regions do not both reach this token's "
                f"chunk [{lo}, {hi}) (K/V stored as per-head planes, e.g. CPU_ATTN): a per-token read is not modeled"
            )
        if runs_nbytes(k) + runs_nbytes(v) > hi - lo or (v and set(k) & set(v)):
            raise AssertionError(
                f"reference inconsistency: {layer} slot {slot} head {h}: K runs {k} and V runs {v} "
                f"do not split the chunk [{lo}, {hi})"
            )
        heads.append(HeadBytes(h, (lo, hi), k, v))
    return TokenBytes(
        layer=layer,
        slot=slot,
        block_size=block_size,
        kernel_block_size=kbs,
        block_id=block_id,
        offset=offset,
        kernel_block_id=kernel_block_id,
        kernel_offset=kernel_offset,
        element_size=es,
        heads=tuple(heads),
    )


__all__ = ["HeadBytes", "Run", "TokenBytes", "layer_block_size", "runs_nbytes", "token_bytes"]
