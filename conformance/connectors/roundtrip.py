"""The connector round trip: store logical block b, clear the pool, load it into block b'.

Descriptor ranges say which bytes a connector *means* to move; the round trip checks the
bytes it *does* move, on real CPU tensors:

1. every byte of the pool gets a seeded pseudo-random value (a distinct pattern per
   (layer, block, byte), up to chance agreement of one byte in 256);
2. the connector stores logical block ``src`` through its own planned copies (``store``),
   or, for a descriptor-only adapter, each layer's ``descriptors(layer, src)`` are copied
   out in order; the pool must be unchanged afterwards (a store only reads);
3. the pool is overwritten with a second pattern ("cleared");
4. the connector loads what it stored into block ``dst`` (``load``, or the descriptors of
   ``dst`` in the same order);
5. each transferred layer's page of ``dst`` must hold exactly the original bytes of its
   page of ``src`` (the reference says which bytes those are), and every other byte of
   the pool must still hold the cleared pattern. Bytes no layer owns (page padding) may
   change; bytes of any other (layer, block) are an *overwritten neighbour*.

Copies made through the ``CopyEngine`` are bounds-checked before they move anything: one
outside the pool and the adapter's host buffers is an *out-of-pool access*.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from conformance.connectors.memory import CopyEngine, OutOfBoundsAccess

SEED = 20261201
"""Seed of the fill pattern (the cleared pattern uses ``SEED + 1``)."""
MAX_POOL_BYTES = 256 << 20
"""Pools larger than this are not round-tripped (three copies of the pool are held)."""
_SHOW = 3
_MAX_ATTRIBUTED = 64
"""Runs of wrongly written bytes attributed to their owners (the rest are counted)."""


@dataclass(frozen=True)
class Finding:
    """One way the bytes after the round trip differ from what the reference expects."""

    kind: str
    """``not_loaded`` (bytes of the destination block still cleared), ``wrong_bytes`` (the
    destination block holds other data), ``overwritten_neighbour``, ``out_of_pool``,
    ``store_wrote_pool``, ``descriptor_mismatch``, ``raised``."""
    layer: str
    """The layer concerned (``*``: the whole transfer)."""
    nbytes: int
    message: str
    """One line for the report."""

    def line(self) -> str:
        return f"{self.kind}: {self.layer}: {self.message}"


@dataclass(frozen=True)
class RoundTripResult:
    src_block: int
    dst_block: int
    status: str
    """``pass``, ``fail``, ``not_applicable`` (the connector moves no bytes back: fill-only)
    or ``skipped`` (the pool is too large, or the tensors are not one storage)."""
    findings: tuple[Finding, ...] = ()
    detail: str = ""
    copies: int = 0
    """Copies made through the copy engine."""
    layers: tuple[str, ...] = field(default=())
    """The layers round-tripped."""

    @property
    def ok(self) -> bool:
        return self.status != "fail"


def _pool_tensor(kv_caches: Mapping[str, Any]):
    """The one storage behind every registered tensor, as a flat int8 tensor (None if more than one)."""
    import torch

    storages = {t.untyped_storage().data_ptr(): t for t in kv_caches.values()}
    if len(storages) != 1:
        return None
    storage = next(iter(storages.values())).untyped_storage()
    return torch.empty(0, dtype=torch.int8).set_(storage)


def _index(runs: Sequence[tuple[int, int]]):
    import torch

    parts = [torch.arange(a, b, dtype=torch.int64) for a, b in runs if b > a]
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64)


class _Owners:
    """Which (layer, block) owns a pool byte, by interval search."""

    def __init__(self, derivation, layers: Sequence[str]) -> None:
        spans = []
        for name in layers:
            for b in range(derivation.num_blocks):
                for a, z in derivation.block_bytes(name, b).page.runs():
                    spans.append((a, z, name, b))
        spans.sort()
        self.spans = spans
        self.starts = [s[0] for s in spans]

    def owners(self, a: int, z: int) -> list[tuple[str, int, int]]:
        """(layer, block, overlapping bytes) for the pool bytes [a, z)."""
        out: dict[tuple[str, int], int] = {}
        # Spans may overlap (aliased groups), so every span starting before z is a candidate.
        for s0, s1, name, b in self.spans[: bisect.bisect_left(self.starts, z)]:
            if s1 > a:
                out[name, b] = out.get((name, b), 0) + min(s1, z) - max(s0, a)
        return [(n, b, k) for (n, b), k in out.items()]


def _runs_of(mask, gap: int = 1) -> list[tuple[int, int]]:
    """Runs of True in a bool tensor; runs less than ``gap`` apart are merged (a wrongly
    written range is broken up wherever a byte agrees by chance, one in 256)."""
    import torch

    idx = torch.nonzero(mask).flatten()
    if idx.numel() == 0:
        return []
    breaks = torch.nonzero(idx[1:] > idx[:-1] + gap).flatten()
    starts = torch.cat([idx[:1], idx[breaks + 1]]).tolist()
    ends = torch.cat([idx[breaks], idx[-1:]]).add(1).tolist()
    return list(zip(starts, ends))


def _show(runs: list[tuple[int, int]]) -> str:
    parts = " ".join(f"[{a}, {b})" for a, b in runs[:_SHOW])
    return parts + (f" +{len(runs) - _SHOW} more" if len(runs) > _SHOW else "")


MAX_DESCRIPTORS = 1 << 16
"""Descriptors one ``descriptors`` call may return (as ``validate.MAX_DESCRIPTORS``)."""


def _descriptors(adapter, layer: str, block: int) -> list[tuple[int, int]]:
    """``adapter.descriptors``, bounded (an endless iterator is a connector bug, not a hang)."""
    out = []
    for index, item in enumerate(adapter.descriptors(layer, block) or ()):
        if index >= MAX_DESCRIPTORS:
            raise TypeError(f"descriptors({layer!r}, {block}) returned more than {MAX_DESCRIPTORS} ranges")
        addr, length = item
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (addr, length)):
            raise TypeError(f"descriptors({layer!r}, {block}) returned {item!r}; expected (address, length) non-negative integers")
        out.append((addr, length))
    return out


def _default_store(adapter, layers, src: int, engine: CopyEngine):
    saved = []
    for name in layers:
        for addr, length in _descriptors(adapter, name, src):
            buf = engine.host_buffer(length)
            engine.copy(addr, buf.data_ptr(), length)
            saved.append((name, length, buf))
    return saved


def _default_load(adapter, layers, saved, dst: int, engine: CopyEngine) -> list[Finding]:
    findings: list[Finding] = []
    by_layer: dict[str, list] = {}
    for name, length, buf in saved:
        by_layer.setdefault(name, []).append((length, buf))
    for name in layers:
        targets = _descriptors(adapter, name, dst)
        sources = by_layer.get(name, [])
        if [n for _, n in targets] != [n for n, _ in sources]:
            findings.append(Finding("descriptor_mismatch", name, 0,
                                    f"descriptors of block {dst} ({[n for _, n in targets][:4]}...) do not pair with "
                                    f"those of the stored block ({[n for n, _ in sources][:4]}...): lengths differ"))
            continue
        for (addr, length), (_, buf) in zip(targets, sources):
            engine.copy(buf.data_ptr(), addr, length)
    return findings


def _padding_runs(derivation, name: str, block: int) -> list[tuple[int, int]]:
    """The bytes of ``name``'s page in ``block`` past its view: the padding of a page stored as one run."""
    page = derivation.block_bytes(name, block).page
    padded = getattr(derivation.specs.get(name), "page_size_bytes", None)
    if page.dims or padded is None or padded <= page.run:
        return []
    return [(page.start + page.run, page.start + padded)]


def check_round_trip(adapter: Any, derivation, kv_caches: Mapping[str, Any], src_block: int = 1,
                     dst_block: int = 2, *, adapter_errors: tuple[type[BaseException], ...] = (Exception,)) -> RoundTripResult:
    """Round-trip ``src_block`` to ``dst_block`` through ``adapter`` (already registered with
    ``kv_caches``), judged by ``derivation`` (the reference for the case and runner)."""
    import torch

    pool = _pool_tensor(kv_caches)
    if pool is None:
        return RoundTripResult(src_block, dst_block, "skipped", detail="the registered tensors are not views of one storage")
    if pool.numel() > MAX_POOL_BYTES:
        return RoundTripResult(src_block, dst_block, "skipped",
                               detail=f"pool of {pool.numel()} bytes is over the round trip's {MAX_POOL_BYTES}-byte bound")
    if derivation.num_blocks <= max(src_block, dst_block):
        return RoundTripResult(src_block, dst_block, "skipped", detail=f"the case has only {derivation.num_blocks} blocks")
    if getattr(adapter, "fill_only", False):
        return RoundTripResult(src_block, dst_block, "not_applicable",
                               detail="the connector only writes the pool (fills blocks); nothing is stored to load back")
    has_store, has_load = hasattr(adapter, "store"), hasattr(adapter, "load")
    if not (has_store and has_load) and not hasattr(adapter, "descriptors"):
        return RoundTripResult(src_block, dst_block, "not_applicable", detail="the adapter has neither store/load nor descriptors")
    if has_store != has_load:
        return RoundTripResult(src_block, dst_block, "not_applicable",
                               detail=f"the connector {'stores' if has_store else 'loads'} only (no way back to compare)")
    moved = getattr(adapter, "transferred_layers", None)
    layers = [n for n in derivation.registered if moved is None or n in moved]
    engine = CopyEngine(kv_caches.values())
    gen = torch.Generator().manual_seed(SEED)
    pool.copy_(torch.randint(-128, 128, (pool.numel(),), dtype=torch.int8, generator=gen))
    original = pool.clone()
    findings: list[Finding] = []

    def raised(stage: str, exc: BaseException) -> RoundTripResult:
        kind = "out_of_pool" if isinstance(exc, OutOfBoundsAccess) else "raised"
        text = str(exc).splitlines()[0] if str(exc) else ""
        findings.append(Finding(kind, "*", 0, f"{stage} of block {src_block if stage == 'store' else dst_block}: "
                                f"{type(exc).__name__}: {text}"[:300]))
        return RoundTripResult(src_block, dst_block, "fail", tuple(findings), copies=len(engine.copies), layers=tuple(layers))

    try:
        handle = adapter.store([src_block], engine) if has_store else _default_store(adapter, layers, src_block, engine)
    except (OutOfBoundsAccess, *adapter_errors) as exc:
        return raised("store", exc)
    changed = _runs_of(pool != original, gap=64)
    if changed:
        findings.append(Finding("store_wrote_pool", "*", sum(b - a for a, b in changed),
                                f"storing block {src_block} changed {sum(b - a for a, b in changed)} pool bytes at {_show(changed)}"))
    cleared = torch.randint(-128, 128, (pool.numel(),), dtype=torch.int8, generator=gen)
    pool.copy_(cleared)
    try:
        if has_load:
            adapter.load(handle, [dst_block], engine)
        else:
            findings.extend(_default_load(adapter, layers, handle, dst_block, engine))
    except (OutOfBoundsAccess, *adapter_errors) as exc:
        return raised("load", exc)
    for oob in engine.out_of_bounds:
        findings.append(Finding("out_of_pool", "*", oob.nbytes, oob.line()))

    expected = cleared.clone()
    dst_index: dict[str, Any] = {}
    for name in layers:
        src_i = _index(derivation.block_bytes(name, src_block).page.runs())
        dst_i = _index(derivation.block_bytes(name, dst_block).page.runs())
        expected[dst_i] = original[src_i]
        dst_index[name] = (src_i, dst_i)
    for name, (src_i, dst_i) in dst_index.items():
        got = pool[dst_i]
        bad = got != expected[dst_i]
        if bool(bad.any()):
            n_bad = int(bad.sum())
            still = int((bad & (got == cleared[dst_i])).sum())
            if still == n_bad:
                findings.append(Finding("not_loaded", name, n_bad,
                                        f"{n_bad} of {dst_i.numel()} bytes of block {dst_block} were not loaded (still cleared)"))
            else:
                findings.append(Finding("wrong_bytes", name, n_bad,
                                        f"{n_bad} of {dst_i.numel()} bytes of block {dst_block} hold other data than block "
                                        f"{src_block}'s" + (f" ({still} of them not loaded)" if still else "")))
    outside = torch.ones(pool.numel(), dtype=torch.bool)
    for _, dst_i in dst_index.values():
        outside[dst_i] = False
    for name in dst_index:
        # A padded page's tail (page_size_padded: DeepSeek's records in aligned pages) is its layer's own: a connector
        # moving whole pages writes it. In a block-outermost pool other groups' views alias those bytes, but the
        # destination block belongs to the transferred group, so nothing live is overwritten.
        for a, z in _padding_runs(derivation, name, dst_block):
            outside[a:z] = False
    wrong = _runs_of((pool != expected) & outside, gap=64)
    if wrong:
        owners = _Owners(derivation, list(derivation.registered))
        hit: dict[tuple[str, int], int] = {}
        for a, z in wrong[:_MAX_ATTRIBUTED]:
            for name, b, k in owners.owners(a, z):
                hit[name, b] = hit.get((name, b), 0) + k
        for (name, b), k in sorted(hit.items(), key=lambda item: -item[1])[:8]:
            findings.append(Finding("overwritten_neighbour", name, k,
                                    f"loading block {dst_block} overwrote {k} bytes of block {b}"
                                    + (" (a layer the connector does not transfer)" if name not in dst_index else "")))
    status = "fail" if findings else "pass"
    detail = f"block {src_block} -> {dst_block} over {len(layers)} layers, {len(engine.copies)} engine copies"
    return RoundTripResult(src_block, dst_block, status, tuple(findings), detail, len(engine.copies), tuple(layers))


__all__ = ["Finding", "MAX_POOL_BYTES", "RoundTripResult", "SEED", "check_round_trip"]
