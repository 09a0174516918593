"""Grouping layers into KV cache groups, page-size unification, num_blocks and placement.

Mirrors ``vllm/v1/core/kv_cache_planning.py`` (the target release): ``get_kv_cache_groups``
(uniform, uniform-type, ``unify_kv_cache_spec_page_size``,
``_get_kv_cache_groups_uniform_page_size``), ``validate_kv_cache_layout``,
``_get_kv_cache_bytes_per_block`` and ``get_kv_cache_config_from_groups``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

from reference.errors import StartupError
from reference.layout import B, L, KVCacheLayout, compute_layout_strides
from reference.specs import (
    AttentionSpec,
    GroupSpec,
    LayerSpec,
    MambaSpec,
    SpecKind,
    UniformTypeSpecs,
    is_uniform_type,
    layer_spec_of,
)

_PLANNING = "vllm.v1.core.kv_cache_planning"


@dataclass(frozen=True)
class KVCacheGroup:
    """Layers that share one block table (vLLM ``KVCacheGroupSpec``)."""

    layer_names: tuple[str, ...]
    spec: GroupSpec


@dataclass(frozen=True)
class KVCacheTensor:
    """Placement of a run of same-spec layers in the shared allocation (``KVCacheTensor``).

    Layer ``layers[l]``'s page for block ``b`` starts at byte
    ``offset + l*layer_stride + b*block_stride``.
    """

    size: int
    layers: tuple[str, ...]
    layer_stride: int
    block_stride: int
    offset: int = 0


@dataclass(frozen=True)
class KVCachePlan:
    """What the planner hands the workers (``KVCacheConfig``)."""

    num_blocks: int
    bytes_per_block: int
    tensors: tuple[KVCacheTensor, ...]
    groups: tuple[KVCacheGroup, ...]
    layout: KVCacheLayout

    @property
    def size(self) -> int:
        return self.tensors[0].size if self.tensors else 0

    def group_of(self, layer: str) -> int:
        for gid, group in enumerate(self.groups):
            if layer in group.layer_names:
                return gid
        raise KeyError(layer)


# --- grouping -----------------------------------------------------------------------


_FULL_ATTENTION_CLASSES = (SpecKind.FULL, SpecKind.SINK_FULL, SpecKind.RSWA)
"""``FullAttentionSpec`` and its non-MLA subclasses (``SinkFullAttentionSpec``, ``RSWASpec``):
what ``FullAttentionSpec.merge``'s ``isinstance`` check admits."""


def _merge_equal(specs: Sequence[LayerSpec]) -> LayerSpec | None:
    """``specs[0].merge(specs)`` as ``is_kv_cache_spec_uniform`` calls it: the merged spec, or
    None where vLLM's merge asserts (the specs are not uniform).

    Specs that are all equal (``is_draft`` excluded) merge to the first. Otherwise the first
    spec's class decides, as in ``vllm/v1/kv_cache_interface.py``:

    - ``FullAttentionSpec.merge`` (also ``SinkFullAttentionSpec``'s, and ``RSWASpec``'s once every
      spec is R-SWA with one window) admits any full-attention class, compares only the fields
      of ``AttentionSpec`` (not the window, chunk, sinks, R-SWA window or ``non_causal``) and
      builds the *first* spec's class: a causal full first spec makes a later sink, R-SWA or
      Prefix-LM layer plain full attention; ``non_causal`` is any layer's. At most one window and
      one chunk size, never both.
    - ``MLAAttentionSpec.merge``: every spec MLA, differing only in a promoted local layer's
      window or chunk, which it drops.
    """
    first = specs[0]
    if all(s == first for s in specs):
        return first
    if not isinstance(first, AttentionSpec) or not all(isinstance(s, AttentionSpec) for s in specs):
        return None
    if first.kind is SpecKind.MLA:
        if not all(s.kind is SpecKind.MLA for s in specs):
            return None
        bare = [replace(s, sliding_window=None, attention_chunk_size=None) for s in specs]
        return bare[0] if all(b == bare[0] for b in bare) else None
    if first.kind not in _FULL_ATTENTION_CLASSES:
        return None
    if first.kind is SpecKind.RSWA and not all(
        s.kind is SpecKind.RSWA and s.rswa_window == first.rswa_window for s in specs
    ):
        return None  # RSWASpec.merge: "All attention layers ... must be RSWASpec", one rswa_window
    if not all(s.kind in _FULL_ATTENTION_CLASSES for s in specs):
        return None  # FullAttentionSpec.merge: isinstance(spec, FullAttentionSpec), MLA excluded
    # FullAttentionSpec.merge builds the merged spec, whose windows must be one (ValueError, which
    # is_kv_cache_spec_uniform does not catch), before it asserts the other fields equal: two windows
    # refuse even specs that differ elsewhere (Inkling's promoted conv states beside its local layers).
    windows = {s.sliding_window for s in specs if s.sliding_window is not None}
    chunks = {s.attention_chunk_size for s in specs if s.attention_chunk_size is not None}
    if len(windows) > 1 or len(chunks) > 1:
        raise StartupError(
            "All attention layers in the same KV cache group must have the same window size.",
            where="vllm.v1.kv_cache_interface.FullAttentionSpec.merge_window_sizes",
        )
    own = dict(kind=SpecKind.FULL, sliding_window=None, attention_chunk_size=None, sink_len=None,
               rswa_window=None, non_causal=False)
    bare = [replace(s, **own) for s in specs]
    if not all(b == bare[0] for b in bare):
        return None  # an AttentionSpec field differs
    if windows and chunks:
        return None  # "Model with both sliding window layers and chunked local attention layers"
    return replace(
        bare[0],
        kind=first.kind,
        sink_len=first.sink_len if first.kind is SpecKind.SINK_FULL else None,
        rswa_window=first.rswa_window,
        sliding_window=next(iter(windows), None),
        attention_chunk_size=next(iter(chunks), None),
        non_causal=any(s.non_causal for s in specs),
    )


def unify_page_size(specs: dict[str, LayerSpec]) -> dict[str, LayerSpec]:
    """``unify_kv_cache_spec_page_size``: scale block sizes or pad pages to the largest page."""
    pages = {s.page_size_bytes for s in specs.values()}
    if len(pages) == 1:
        return dict(specs)
    largest = max(pages)
    out: dict[str, LayerSpec] = {}
    # Most layers share a spec: rescale each distinct one once (is_draft is not part of
    # spec equality, so it is part of the key).
    unified: dict[tuple[LayerSpec, bool], LayerSpec] = {}
    for name, spec in specs.items():
        key = (spec, spec.is_draft)
        if key not in unified:
            unified[key] = _unified_spec(name, spec, largest)
        out[name] = unified[key]
    return out


def _unified_spec(name: str, spec: LayerSpec, largest: int) -> LayerSpec:
    page = spec.page_size_bytes
    if page == largest:
        return spec
    if page == 0:
        # vLLM takes the largest page modulo this one: ZeroDivisionError (the crash _stride_alignment names too).
        raise _zero_page(name, spec, "unify_kv_cache_spec_page_size")
    if isinstance(spec, MambaSpec):
        return replace(spec, page_size_padded=largest)
    if largest % page == 0:
        return spec.with_block_size(spec.block_size * (largest // page))
    if isinstance(spec, AttentionSpec) and not spec.kind.is_mla:
        return replace(spec, page_size_padded=largest)
    raise StartupError(
        f"Layer {name}: page size is not divisible by the maximum page size and cannot "
        "be padded. Padding is only supported for non-MLA attention layers.",
        where=f"{_PLANNING}.unify_kv_cache_spec_page_size",
    )


def _uniform_page_groups(specs: dict[str, LayerSpec]) -> list[KVCacheGroup]:
    """``_get_kv_cache_groups_uniform_page_size``: bucket equal specs, split evenly, strided."""
    buckets: dict[LayerSpec, list[str]] = {}
    for name, spec in specs.items():
        buckets.setdefault(spec, []).append(name)
    lengths = [len(v) for v in buckets.values()]
    min_n, max_n = min(lengths), max(lengths)
    group_size = max_n if max_n < 1.5 * min_n else min_n
    groups: list[KVCacheGroup] = []
    for spec, layers in buckets.items():
        num_groups = -(-len(layers) // group_size)
        for i in range(num_groups):
            members = tuple(layers[i::num_groups])
            groups.append(KVCacheGroup(members, _merge_equal([specs[m] for m in members]) or spec))
    return groups


def get_kv_cache_groups(
    specs: dict[str, LayerSpec], layout: KVCacheLayout, *, hybrid_manager: bool = True,
    hidden_state_page_grows: bool = True, sliding_window_packed_as_state: bool = True,
) -> list[KVCacheGroup]:
    """Group the per-layer specs (``get_kv_cache_groups``).

    ``hybrid_manager=False`` (``--disable-hybrid-kv-cache-manager``) first promotes
    local-attention layers to full attention (``unify_hybrid_kv_cache_specs``).
    ``hidden_state_page_grows=False`` and ``sliding_window_packed_as_state=False`` are 0.29
    (``reference.releases.HIDDEN_STATE_PAGE_GROWS``, ``SLIDING_WINDOW_PACKED_AS_STATE``).
    """
    if not specs:
        return []
    if not hybrid_manager:
        specs = unify_hybrid_specs(specs)
    values = list(specs.values())
    merged = _merge_equal(values)
    if merged is not None:
        return [KVCacheGroup(tuple(specs), merged)]
    if is_uniform_type(values):
        return [KVCacheGroup(tuple(specs), UniformTypeSpecs(tuple(specs.items())))]
    # Hidden-state layers keep their own block table: planned apart, then added back.
    hidden = {n: s for n, s in specs.items() if isinstance(s, AttentionSpec) and s.kind is SpecKind.HIDDEN_STATE}
    rest = {n: s for n, s in specs.items() if n not in hidden}
    if layout.is_block_outermost and len({s.page_size_bytes for s in rest.values()}) > 1:
        # Block-outermost blocks are strided by the widest group: hidden groups need no alignment.
        return _packed_groups(rest, sliding_window_as_state=sliding_window_packed_as_state) + [KVCacheGroup((n,), s) for n, s in hidden.items()]
    try:
        unified = unify_page_size(rest)
    except StartupError:
        fallback = None if hidden else _full_allocation_fallback(specs)
        if fallback is None:
            raise
        return fallback
    groups = _uniform_page_groups(unified)
    return _with_hidden_state_groups(groups, hidden, hidden_state_page_grows) if hidden else groups


def _with_hidden_state_groups(groups: list[KVCacheGroup], hidden: dict[str, AttentionSpec],
                              page_grows: bool = True) -> list[KVCacheGroup]:
    """``get_kv_cache_groups``' hidden-state tail: the common page grows (every group's block
    size scaled) until it holds one token of the widest hidden state (``_ensure_min_page_size``),
    then each hidden-state layer gets its own group with the largest block size that divides the
    groups' GCD and fits the page, padded to the common page."""
    common_page = groups[0].spec.page_size_bytes
    per_token = {n: s.num_kv_heads * s.head_size * s.element_size for n, s in hidden.items()}
    widest = max(per_token.values())
    if widest > common_page and not page_grows:
        # 0.29: the hidden-state group is padded to a page smaller than its own one-token page.
        raise StartupError("AssertionError()", where="vllm.v1.kv_cache_interface.AttentionSpec.page_size_bytes "
                                                     "(assert self.page_size_padded >= self.unpadded_page_size_bytes)")
    if widest > common_page:
        scale = -(-widest // common_page)
        common_page *= scale
        scaled = []
        for g in groups:
            # One replace, as vLLM's: a padded page scales with its block (a block grown first would
            # briefly carry a padded page smaller than itself).
            changes: dict = {"block_size": g.spec.block_size * scale}
            if getattr(g.spec, "page_size_padded", None) is not None:
                changes["page_size_padded"] = g.spec.page_size_padded * scale  # type: ignore[union-attr]
            scaled.append(KVCacheGroup(g.layer_names, replace(g.spec, **changes)))
        groups = scaled
    group_block_size = math.gcd(*(g.spec.block_size for g in groups))
    out = list(groups)
    for name, spec in hidden.items():
        fits = max(common_page // per_token[name], 1)
        block_size = next(c for c in range(min(group_block_size, fits), 0, -1) if group_block_size % c == 0)
        out.append(KVCacheGroup((name,), replace(spec, block_size=block_size, page_size_padded=common_page)))
    return out


_PROMOTIONS = {
    SpecKind.SLIDING_WINDOW_MLA: SpecKind.MLA,
    SpecKind.SLIDING_WINDOW: SpecKind.FULL,
    SpecKind.CHUNKED_LOCAL: SpecKind.FULL,
}
"""``_promote_local_kv_cache_specs``' promotions (vLLM walks the MRO; the MLA window first)."""


def unify_hybrid_specs(specs: dict[str, LayerSpec]) -> dict[str, LayerSpec]:
    """``unify_hybrid_kv_cache_specs``: promote the DCP-sharded layers and the replicated attention
    layers (``dcp_sharded`` False: a circular buffer, a replicated draft) each among themselves."""
    parts: dict[bool, dict[str, LayerSpec]] = {}
    for name, spec in specs.items():
        replicated = isinstance(spec, AttentionSpec) and not spec.dcp_sharded
        parts.setdefault(replicated, {})[name] = spec
    unified = dict(specs)
    for part in parts.values():
        unified.update(promote_local_specs(part))
    return unified


def promote_local_specs(specs: dict[str, LayerSpec]) -> dict[str, LayerSpec]:
    """``_promote_local_kv_cache_specs``: allocate local-attention layers as full attention.

    Only when full-attention layers sit beside sliding-window or chunked-local ones; the
    promoted specs keep their window for compute, take the full layers' block size, and
    must then form one (uniform or uniform-type) spec, else vLLM refuses.
    """
    values = list(specs.values())
    if _merge_equal(values) is not None or is_uniform_type(values):
        return dict(specs)
    kinds = {s.kind for s in values}
    has_full = any(k.uniform_type_base == "full" for k in kinds)
    full_sizes = {s.block_size for s in values if s.kind.uniform_type_base == "full"}
    full_block_size = next(iter(full_sizes)) if len(full_sizes) == 1 else None
    promoted = dict(specs)
    if has_full and kinds & set(_PROMOTIONS):
        for name, spec in specs.items():
            target = _PROMOTIONS.get(spec.kind)
            if target is None:
                continue
            assert isinstance(spec, AttentionSpec)
            block_size = full_block_size or spec.block_size
            padded = spec.page_size_padded
            if padded is not None:
                padded = max(padded, spec.real_page_size_bytes * block_size // spec.block_size)
            promoted[name] = replace(spec, kind=target, block_size=block_size, page_size_padded=padded)
    values = list(promoted.values())
    if _merge_equal(values) is None and not is_uniform_type(values):
        raise StartupError(
            "Failed to promote local KV cache specs to one unified type.",
            where="vllm.v1.core.kv_cache_planning._promote_local_kv_cache_specs",
        )
    return promoted


def _full_allocation_fallback(specs: dict[str, LayerSpec]) -> list[KVCacheGroup] | None:
    """``_try_get_full_allocation_fallback_groups``: MLA + sliding window as full attention.

    When MLA pages cannot be unified with sliding-window pages, vLLM promotes the window
    layers to full attention (keeping the window for compute) in one group.
    """
    kinds = {s.kind for s in specs.values()}
    if SpecKind.SLIDING_WINDOW_MLA in kinds or SpecKind.CHUNKED_LOCAL in kinds:
        return None
    if not (SpecKind.MLA in kinds and SpecKind.SLIDING_WINDOW in kinds):
        return None
    try:
        promoted = promote_local_specs(specs)
    except StartupError:
        return None
    values = list(promoted.values())
    if is_uniform_type(values):
        return [KVCacheGroup(tuple(promoted), UniformTypeSpecs(tuple(promoted.items())))]
    return None


def approximate_gcd(values: Sequence[int], lower_bound: int = 1) -> int:
    """``_approximate_gcd``: the chunk size in [lower_bound, max] with least round-up padding."""
    lo, hi = max(1, lower_bound), max(values)
    if lo > hi:
        return lo
    best, best_pad = lo, None
    for d in range(lo, hi + 1):
        pad = sum((d - x % d) % d for x in values)
        if best_pad is None or pad < best_pad or (pad == best_pad and d > best):
            best, best_pad = d, pad
    return best


def _packed_groups(specs: dict[str, LayerSpec], *, sliding_window_as_state: bool = True) -> list[KVCacheGroup]:
    """``_get_packed_kv_cache_groups``: block-outermost layouts keep mixed pages side by side.

    Layers are bucketed greedily by uniform type; balanced buckets (equal layer counts per
    page size) split into groups of the same number of pattern repeats; state buckets
    (Mamba; circular buffers and sliding windows when nothing repeats, unless
    ``sliding_window_as_state`` is False: 0.29 caps Mamba alone) split to fit the widest block.
    """
    buckets: list[dict[str, LayerSpec]] = []
    for name, spec in specs.items():
        for bucket in buckets:
            if is_uniform_type([*bucket.values(), spec]):
                bucket[name] = spec
                break
        else:
            buckets.append({name: spec})
    described = []
    for bucket in buckets:
        by_page: dict[int, list[str]] = {}
        for name, spec in bucket.items():
            by_page.setdefault(spec.page_size_bytes, []).append(name)
        balanced = len({len(v) for v in by_page.values()}) == 1
        described.append((bucket, by_page, balanced, max(len(v) for v in by_page.values())))
    min_repeats = max((most for _, by_page, balanced, most in described if balanced and len(by_page) > 1), default=0)
    repeats = (
        approximate_gcd([most for _, _, balanced, most in described if balanced], min_repeats) if min_repeats else None
    )

    def num_groups_for(balanced: bool, most: int) -> int:
        return -(-most // repeats) if balanced and repeats is not None else 1

    def is_state(bucket: dict[str, LayerSpec]) -> bool:
        first = next(iter(bucket.values()))
        # kv_cache_planning.is_state_bucket: Mamba and circular buffers go down to one state per group.
        if isinstance(first, MambaSpec):
            return True
        if not sliding_window_as_state:
            return False  # 0.29 caps only a Mamba bucket ("isinstance(spec.first_spec, MambaSpec)")
        if first.kind is SpecKind.CIRCULAR_BUFFER:
            return True
        # isinstance(first_spec, SlidingWindowSpec): SlidingWindowMLASpec is one (DeepSeek V4's SWA caches).
        return repeats is None and first.kind in (SpecKind.SLIDING_WINDOW, SpecKind.SLIDING_WINDOW_MLA)

    def widest(by_page: dict[int, list[str]], n: int) -> int:
        return sum(-(-len(names) // n) * page for page, names in by_page.items())

    anchor = max(
        (widest(by_page, len(bucket) if is_state(bucket) else num_groups_for(balanced, most)) for bucket, by_page, balanced, most in described),
        default=0,
    )
    groups: list[KVCacheGroup] = []
    for bucket, by_page, balanced, most in described:
        n = num_groups_for(balanced, most)
        if anchor and is_state(bucket):
            per_block = max(anchor // next(iter(bucket.values())).page_size_bytes, 1)
            n = max(n, -(-len(bucket) // per_block))
        if n == 1:
            groups.append(KVCacheGroup(tuple(bucket), UniformTypeSpecs(tuple(bucket.items()))))
            continue
        pattern = list(zip(*by_page.values()))
        for i in range(n):
            members = tuple(name for repeat in pattern[i::n] for name in repeat)
            groups.append(KVCacheGroup(members, UniformTypeSpecs(tuple((m, bucket[m]) for m in members))))
    return groups


def validate_layout(layout: KVCacheLayout, groups: Sequence[KVCacheGroup]) -> None:
    """``validate_kv_cache_layout``: mixed per-layer pages need a block-compact layout."""
    pages = sorted(
        {layer_spec_of(g.spec, n).page_size_bytes for g in groups for n in g.layer_names}
    )
    if len(pages) <= 1:
        return
    if not layout.is_block_compact or (len(groups) > 1 and layout.is_layer_compact):
        raise StartupError(
            f"KV cache layout {layout.name} cannot express this model's mixed page sizes "
            f"({pages}); a backend should declare block-outermost supported layouts (e.g. "
            "BLHNC), or set VLLM_KV_CACHE_LAYOUT=BLHNC.",
            where=f"{_PLANNING}.validate_kv_cache_layout",
        )


# --- placement ----------------------------------------------------------------------


def _round_up(x: int, a: int) -> int:
    return -(-x // a) * a


def _layer_specs(group: KVCacheGroup) -> list[tuple[str, LayerSpec]]:
    return [(n, layer_spec_of(group.spec, n)) for n in group.layer_names]


def _stride_alignment(name: str, spec: LayerSpec) -> int:
    """``get_block_stride_alignment``: the page of one kernel block. A kernel block too short to hold one state
    (a compressed cache of more tokens per state than the kernel block has) makes it 0 bytes, and vLLM's
    ``round_up`` then divides by zero (ZeroDivisionError, a crash): a configuration vLLM cannot start with, refused
    here with what is wrong."""
    align = spec.get_block_stride_alignment()
    if align == 0:
        raise _zero_page(name, spec, "_get_kv_cache_bytes_per_block", "its block-stride alignment")
    return align


def _zero_page(name: str, spec: LayerSpec, function: str, what: str = "its page") -> StartupError:
    """A compressed cache whose block (or kernel block) holds no whole state: a page of 0 bytes, which vLLM divides
    by (ZeroDivisionError, a crash: expectation dsv4-zero-byte-stride-alignment); refused with what is wrong."""
    return StartupError(
        f"KV cache layer {name} stores one state per {spec.tokens_per_state} tokens, more than its "
        f"{spec.block_size}-token block's kernel blocks hold: {what} is 0 bytes "
        "(vLLM divides by it); use a --block-size that is a multiple of the compress ratio and of the kernel block.",
        where=f"{_PLANNING}.{function}",
    )


def bytes_per_block(groups: Sequence[KVCacheGroup], layout: KVCacheLayout) -> int:
    """``_get_kv_cache_bytes_per_block``: the pool stride of one block id."""
    if not layout.is_block_outermost:
        return max(
            sum(_round_up(s.page_size_bytes, _stride_alignment(n, s)) for n, s in _layer_specs(g))
            for g in groups
        )
    widest = max(sum(s.page_size_bytes for _, s in _layer_specs(g)) for g in groups)
    align = 1
    for g in groups:
        for n, s in _layer_specs(g):
            align = math.lcm(align, _stride_alignment(n, s))
    return _round_up(widest, align)


def logical_shape(spec: LayerSpec, num_blocks: int, num_layers: int, kernel_block_size: int | None = None) -> tuple[int, ...]:
    """``[L, B, H, N, C]`` of a run of layers, blocks in kernel units, C in bytes."""
    kbs = kernel_block_size or spec.block_size
    ratio = spec.block_size // kbs
    return (
        num_layers,
        num_blocks * ratio,
        spec.num_heads,
        spec.num_kernel_states(kbs),
        spec.state_content_size_bytes,
    )


def place_tensors(
    groups: Sequence[KVCacheGroup], layout: KVCacheLayout, num_blocks: int, bpb: int
) -> tuple[KVCacheTensor, ...]:
    """``get_kv_cache_config_from_groups`` step 4: every group aliases the pool from byte 0."""
    size = bpb * num_blocks
    tensors: list[KVCacheTensor] = []
    for group in groups:
        runs: dict[LayerSpec, list[str]] = {}
        for name, spec in _layer_specs(group):
            runs.setdefault(spec, []).append(name)
        offset = 0
        for spec, names in runs.items():
            fixed_block: int | None = None
            if layout.is_block_outermost:
                fixed_block = bpb
            else:
                padded = _round_up(spec.page_size_bytes, spec.get_block_stride_alignment())
                if padded != spec.page_size_bytes:
                    assert layout.is_block_compact, "padded pages need a block-compact layout"
                    fixed_block = padded
            strides = compute_layout_strides(
                logical_shape(spec, num_blocks, len(names)),
                layout,
                (None, fixed_block, None, None, None),
                spec.page_size_padded,
            )
            tensors.append(KVCacheTensor(size, tuple(names), strides[L], strides[B], offset))
            offset += len(names) * (spec.page_size_bytes if layout.is_block_outermost else strides[L])
    return tuple(tensors)


def plan(
    groups: Sequence[KVCacheGroup],
    layout: KVCacheLayout,
    *,
    num_blocks: int | None,
    available_memory: int | None,
    memory_check_divides_by_page: bool = False,
) -> KVCachePlan:
    """Size the pool and place every tensor (``get_kv_cache_config_from_groups``). ``memory_check_divides_by_page``:
    the release's planning runs the memory check, which sizes each spec's need in pages, before anything else
    divides by a page (vLLM 0.29-0.31, which set no stride alignment)."""
    validate_layout(layout, groups)
    bpb = bytes_per_block(groups, layout)
    # The memory check's max_memory_usage_pages (cdiv(bytes, page)) divides by a page of 0 bytes. From 0.32 the
    # stride alignment divides by it first (bytes_per_block), except in a packed block-outermost pool, whose
    # planning divides by no page: the engine core's later checks then refuse or pass it as they do.
    if memory_check_divides_by_page:
        for group in groups:
            for name, spec in _layer_specs(group):
                if spec.page_size_bytes == 0:
                    raise _zero_page(name, spec, "_check_enough_kv_cache_memory")
    available = num_blocks * bpb if num_blocks is not None else available_memory
    assert available is not None
    # get_kv_cache_configs reserves the null block (block 0) before checking memory.
    if available - bpb <= 0:
        raise StartupError(
            f"No available memory for the cache blocks: {available} bytes leave nothing after "
            f"reserving the null block of {bpb} bytes",
            where=f"{_PLANNING}._check_enough_kv_cache_memory",
        )
    if num_blocks is None:
        num_blocks = available // bpb
    return KVCachePlan(num_blocks, bpb, place_tensors(groups, layout, num_blocks, bpb), tuple(groups), layout)


__all__ = [
    "KVCacheGroup",
    "KVCachePlan",
    "KVCacheTensor",
    "bytes_per_block",
    "get_kv_cache_groups",
    "logical_shape",
    "place_tensors",
    "plan",
    "unify_page_size",
    "validate_layout",



]
