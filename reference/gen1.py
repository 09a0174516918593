"""Generation 1 of vLLM's KV-cache layout (vLLM 0.19 to 0.28): per-backend shapes.

Each attention backend declared ``get_kv_cache_shape`` / ``get_kv_cache_stride_order``; the
planner handed the workers ``KVCacheTensor(size, shared_by)`` entries, each one raw ``int8``
allocation, and each runner viewed it per layer as
``raw.view(dtype).view(permuted_shape).permute(inverse_order)``. This module models that
(shapes, placement, the derivation, Mooncake's old check); what differs per release is in
``reference.releases``, with its sources. Raw tensor *i* starts at
``Gen1Derivation.tensor_bases[i]`` in a virtual address space, so bytes compare across layers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Sequence

from reference import backends as bk
from reference.config import CaseConfig, LayerConfig
from reference.derive import layer_backend, raw_spec
from reference.dtypes import dtype_size
from reference.errors import ConfigError, NotModeledError, StartupError
from reference.intervals import merge
from reference.kernel_blocks import select_common_block_size
from reference.layout import KVCacheLayout
from reference.planning import KVCacheGroup, get_kv_cache_groups
from reference.releases import (
    GEN1_KERNEL_BLOCK_SIZES,
    GEN1_LAYOUT_OVERRIDES,
    HYBRID_BLOCK_ALIGNMENT,
    HYBRID_LAYOUT_BY_SHAPE,
    MAMBA_PAGE_PADDED_BY_UNIFY,
    MAMBA_STATE_PAGE_VIEW,
    MRV2_MAMBA,
    PADDED_PAGE_VIEW,
    MOONCAKE_KERNEL_SYNC,
    ATTENTION_PAGES_PADDED,
    MRV2_KERNEL_BLOCKS,
    PROMOTED_WINDOW_KEEPS_ITS_BLOCK,
    SLIDING_WINDOW_BLOCK_DECOUPLED,
    Version,
    check_gen1_version,
    fact_at,
    holds,
    parse_version,
)
from reference.specs import (AttentionSpec, KernelBlockSize, LayerSpec, MambaSpec, MultipleOf, SpecKind,
                             UniformTypeSpecs, layer_spec_of)
from reference.views import BlockBytes, Region, TensorView, contiguous_strides, make_region, state_views

LAYOUTS = ("NHD", "HND")
MODELED_KINDS = ("full", "mla", "chunked_local", "sliding_window", "sink_full", "mamba")
"""A sliding-window layer's block size is the configured one to 0.24 and its backend's smallest
kernel block from 0.25 (``releases.SLIDING_WINDOW_BLOCK_DECOUPLED``); a Mamba layer's page is
padded to the attention page the block-size negotiation picks (``hybrid_block_size``)."""
MODELED_CACHE_DTYPES = ("auto", "float16", "bfloat16", "float32", "fp8", "fp8_e4m3", "fp8_e5m2")

# Shape families of get_kv_cache_shape, as axis letters outermost first:
# K = the K/V axis of size 2, B = blocks, N = tokens per block, H = kv heads,
# D = head size, C = packed content (K then V, 2*D).
SHAPE_AXES: dict[str, str] = {
    "2BNHD": "KBNHD",  # FA (<= 0.22) and Flex: (2, num_blocks, block_size, H, D)
    "B2NHD": "BKNHD",  # FlashInfer, Triton; FA from 0.23: (num_blocks, 2, block_size, H, D)
    "BND": "BND",  # MLA: (num_blocks, block_size, head_size)
    "BHNC": "BHNC",  # packed, after vLLM #44455: (num_blocks, H, block_size, 2*D)
}


def gen1_kernel_block_sizes(backend_name: str, spec: AttentionSpec, capability: tuple[int, int],
                              vllm_version: str) -> tuple[KernelBlockSize, ...]:
    """The backend's supported kernel block sizes at ``vllm_version``."""
    era = fact_at(GEN1_KERNEL_BLOCK_SIZES.get(backend_name, ()), check_gen1_version(vllm_version))
    if era is not None and era.value is not None:
        return era.value
    return bk.get_backend(backend_name).supported_kernel_block_sizes(spec, capability, gqa=not spec.kind.is_mla)


# FA and Triton's get_kv_cache_shape raise ValueError("Block size must be a multiple of 16.").
_BLOCK_MULTIPLE_OF_16 = ("FLASH_ATTN", "TRITON_ATTN")


# --- 1. per-backend shape and stride order ----------------------------------------------


def gen1_layout(backend_name: str, vllm_version: str = "0.21.0") -> bk.Gen1Layout:
    """The backend's gen-1 shape family and stride orders at ``vllm_version``.

    The table entry, unless ``releases.GEN1_LAYOUT_OVERRIDES`` says it changed by then.
    """
    backend = bk.get_backend(backend_name)
    if backend.gen1 is None:
        with_gen1 = sorted(n for n, b in bk.BACKENDS.items() if b.gen1 is not None)
        raise ConfigError(
            f"backend {backend_name!r} has no generation-1 get_kv_cache_shape in the table; "
            f"expected one of {', '.join(with_gen1)}"
        )
    era = fact_at(GEN1_LAYOUT_OVERRIDES.get(backend_name, ()), check_gen1_version(vllm_version))
    if era is None:
        return backend.gen1
    if era.value is None:
        raise NotModeledError(f"{backend_name} at vLLM {vllm_version}: {era.source}")
    return era.value


def gen1_kv_cache_shape(
    backend_name: str,
    num_blocks: int,
    block_size: int,
    num_kv_heads: int,
    head_size: int,
    *,
    vllm_version: str = "0.21.0",
) -> tuple[int, ...]:
    """``AttentionBackend.get_kv_cache_shape`` of vLLM 0.19 to 0.28 (logical shape)."""
    for label, value in (("num_blocks", num_blocks), ("block_size", block_size),
                         ("num_kv_heads", num_kv_heads), ("head_size", head_size)):
        if not isinstance(value, int) or value <= 0:
            raise ConfigError(f"{label} {value!r} must be a positive integer")
    layout_facts = gen1_layout(backend_name, vllm_version)
    if backend_name in _BLOCK_MULTIPLE_OF_16 and block_size % 16:
        raise StartupError(
            "Block size must be a multiple of 16.",
            where=f"vllm.v1.attention.backends.{backend_name.lower()}.get_kv_cache_shape",
        )
    if layout_facts.shape == "BND":
        if num_kv_heads != 1:
            raise ConfigError(f"MLA backend {backend_name} needs num_kv_heads 1, got {num_kv_heads}")
        return (num_blocks, block_size, head_size)
    if layout_facts.shape == "2BNHD":
        return (2, num_blocks, block_size, num_kv_heads, head_size)
    if layout_facts.shape == "B2NHD":
        return (num_blocks, 2, block_size, num_kv_heads, head_size)
    if layout_facts.shape == "BHNC":
        return (num_blocks, num_kv_heads, block_size, 2 * head_size)
    raise ConfigError(f"generation-1 shape {layout_facts.shape!r} is not one of {', '.join(SHAPE_AXES)}")


def gen1_stride_order(backend_name: str, layout: str, *, vllm_version: str = "0.21.0") -> tuple[int, ...]:
    """``get_kv_cache_stride_order()`` under ``get_kv_cache_layout() == layout``.

    The permutation from the logical shape to the physical (allocation) order.
    """
    if layout not in LAYOUTS:
        raise ConfigError(f"KV cache layout {layout!r} is not valid in generation 1; expected NHD or HND")
    layout_facts = gen1_layout(backend_name, vllm_version)
    return layout_facts.stride_order_nhd if layout == "NHD" else layout_facts.stride_order_hnd


def permuted_view_strides(logical_shape: Sequence[int], order: Sequence[int]) -> tuple[int, ...]:
    """Strides of ``x.view(permuted_shape).permute(inverse_order)`` for a contiguous ``x``.

    ``permuted_shape[j] = logical_shape[order[j]]``; after the inverse permute, logical dim
    ``i`` is physical dim ``order.index(i)``.
    """
    if sorted(order) != list(range(len(logical_shape))):
        raise ConfigError(f"stride order {tuple(order)} is not a permutation of {len(logical_shape)} dims")
    physical = [logical_shape[i] for i in order]
    phys_strides = contiguous_strides(physical)
    return tuple(phys_strides[list(order).index(i)] for i in range(len(logical_shape)))


# --- 2. placement: KVCacheTensor(size, shared_by) ---------------------------------------


@dataclass(frozen=True)
class Gen1KVCacheTensor:
    """Gen-1 ``KVCacheTensor(size, shared_by)``: one raw ``int8`` allocation of ``size`` bytes."""

    size: int
    shared_by: tuple[str, ...]


def place_gen1_tensors(groups: Sequence[KVCacheGroup], num_blocks: int) -> tuple[Gen1KVCacheTensor, ...]:
    """``get_kv_cache_config_from_groups`` (gen 1): who shares which raw tensor.

    One ``UniformTypeKVCacheSpecs`` group: one tensor per layer, sized by that layer's
    page. Otherwise (HMA): ``group_size`` tensors; tensor *i* is shared by layer *i* of
    every group (a block id belongs to one group at a time), sized by the one uniform
    page size.
    """
    if len(groups) == 1 and isinstance(groups[0].spec, UniformTypeSpecs):
        spec = groups[0].spec
        return tuple(
            Gen1KVCacheTensor(spec.spec_of(n).page_size_bytes * num_blocks, (n,)) for n in groups[0].layer_names
        )
    pages = {layer_spec_of(g.spec, n).page_size_bytes for g in groups for n in g.layer_names}
    if len(pages) != 1:
        # get_uniform_page_size asserts this; unify_kv_cache_spec_page_size ran first.
        raise NotModeledError(f"generation-1 HMA placement needs one page size, got {sorted(pages)}")
    page = pages.pop()
    group_size = max(len(g.layer_names) for g in groups)
    return tuple(
        Gen1KVCacheTensor(
            page * num_blocks,
            tuple(g.layer_names[i] for g in groups if i < len(g.layer_names)),
        )
        for i in range(group_size)
    )


def _num_blocks(case: CaseConfig, groups: Sequence[KVCacheGroup]) -> int:
    """``num_gpu_blocks_override``, else ``get_num_blocks`` / the uniform-type division."""
    if case.num_blocks is not None:
        return case.num_blocks
    assert case.kv_cache_memory_bytes is not None
    if len(groups) == 1 and isinstance(groups[0].spec, UniformTypeSpecs):
        per_block = groups[0].spec.page_size_bytes
    else:
        page = layer_spec_of(groups[0].spec, groups[0].layer_names[0]).page_size_bytes
        per_block = page * max(len(g.layer_names) for g in groups)
    n = case.kv_cache_memory_bytes // per_block
    if n <= 0:
        raise StartupError(
            f"No available memory for the cache blocks: {case.kv_cache_memory_bytes} bytes is less than "
            f"one block of {per_block} bytes",
            where="vllm.v1.core.kv_cache_utils.check_enough_kv_cache_memory",
        )
    return n


# --- 3. the derivation ------------------------------------------------------------------


@dataclass(frozen=True)
class _LayerGeometry:
    """Byte strides of one registered view, keyed by axis letter (see ``SHAPE_AXES``)."""

    name: str
    shape_kind: str
    base: int
    ratio: int
    element_size: int
    byte_strides: dict[str, int]
    sizes: dict[str, int]
    head_size: int

    def block(self, block_id: int) -> BlockBytes:
        s, n, es = self.byte_strides, self.sizes, self.element_size
        start = self.base + block_id * self.ratio * s["B"]
        outer = [(s["B"], self.ratio), (s["N"], n["N"])] + ([(s["H"], n["H"])] if "H" in s else [])
        if self.shape_kind == "BND":
            page = make_region(start, es, outer + [(s["D"], n["D"])])
            return BlockBytes(self.name, block_id, page, page, None)
        if self.shape_kind == "BHNC":
            d = self.head_size
            k = make_region(start, es, outer + [(s["C"], d)])
            v = make_region(start + d * s["C"], es, outer + [(s["C"], d)])
            page = make_region(start, es, outer + [(s["C"], 2 * d)])
            return BlockBytes(self.name, block_id, page, k, v)
        inner = outer + [(s["D"], n["D"])]
        k = make_region(start, es, inner)
        v = make_region(start + s["K"], es, inner)
        page = make_region(start, es, [(s["K"], 2)] + inner)
        return BlockBytes(self.name, block_id, page, k, v)


@dataclass(frozen=True)
class Gen1Derivation:
    """What a gen-1 runner registers for one case, and where every logical block lives."""

    case: CaseConfig
    runner: str
    version: Version
    layout: str
    """``get_kv_cache_layout()``: "NHD" or "HND"."""
    layer_backends: dict[str, str]
    groups: tuple[KVCacheGroup, ...]
    num_blocks: int
    kv_cache_tensors: tuple[Gen1KVCacheTensor, ...]
    kernel_block_sizes: tuple[int, ...]
    """Per group: the block size the views were reshaped with (MRv2 < 0.22: the logical one)."""
    selected_kernel_block_sizes: tuple[int | None, ...]
    """Per group: ``select_common_block_size`` (what MRv1 and NIXL derive); None where it fails."""
    registered: dict[str, TensorView]
    shape_kinds: dict[str, str]
    _geometry: dict[str, "_LayerGeometry | _StateGeometry"] = field(repr=False, compare=False)

    @property
    def tensor_bases(self) -> tuple[int, ...]:
        """Virtual start address of each raw tensor (they are separate allocations)."""
        bases, at = [], 0
        for t in self.kv_cache_tensors:
            bases.append(at)
            at += t.size
        return tuple(bases)

    def layer_of(self, registered: str) -> str:
        """The layer a registered entry belongs to: itself, or for ``"<layer>[i]"`` (state *i* of a
        Mamba layer that registers a list of state tensors) the layer."""
        if registered in self.layer_backends:
            return registered
        base, bracket, _ = registered.rpartition("[")
        if bracket and base in self.layer_backends:
            return base
        raise ConfigError(f"{registered!r} is not one of the case's layers or their registered states")

    def tensor_index(self, layer: str) -> int:
        layer = self.layer_of(layer)
        for i, t in enumerate(self.kv_cache_tensors):
            if layer in t.shared_by:
                return i
        raise ConfigError(f"layer {layer!r} is not one of the case's layers")

    def group_of(self, layer: str) -> int:
        layer = self.layer_of(layer)
        for gid, g in enumerate(self.groups):
            if layer in g.layer_names:
                return gid
        raise ConfigError(f"layer {layer!r} is not one of the case's layers")

    def block_ratio(self, group_id: int) -> int:
        """Kernel blocks per logical block in the registered views of ``group_id``."""
        return self.groups[group_id].spec.block_size // self.kernel_block_sizes[group_id]

    def block_bytes(self, layer: str, logical_block_id: int) -> BlockBytes:
        """Page, K and V bytes of ``logical_block_id`` in ``layer`` (virtual addresses)."""
        try:
            geometry = self._geometry[layer]
        except KeyError:
            raise ConfigError(f"layer {layer!r} is not one of the case's layers") from None
        if not 0 <= logical_block_id < self.num_blocks:
            raise ConfigError(f"block id {logical_block_id} is outside [0, {self.num_blocks})")
        return geometry.block(logical_block_id)


_REQUIRED_LAYOUTS: dict[str, Callable[[tuple[int, int]], str | None]] = {
    # v1/attention/backends/flashinfer.py of 0.19.1 to 0.28.0: HND where capability.major == 10.
    "FLASHINFER": lambda capability: "HND" if capability[0] == 10 else None,
    # v1/attention/backends/mla/flashinfer_mla.py of 0.19.1 to 0.28.0: HND on every capability.
    "FLASHINFER_MLA": lambda capability: "HND",
}
"""``AttentionBackend.get_required_kv_cache_layout()`` of the generation-1 backends that have one."""


def resolve_gen1_layout(case: CaseConfig) -> str:
    """``get_kv_cache_layout()``: the selector's override (FlashInfer on SM10x, FlashInfer-MLA: HND), else
    VLLM_KV_CACHE_LAYOUT, else the connector's, else NHD.

    NIXL's ``get_required_kvcache_layout`` asks for HND unless the model uses MLA.
    """
    if case.layout is not None and case.layout not in LAYOUTS:
        raise ConfigError(f"KV cache layout {case.layout!r} is not valid in generation 1; expected NHD or HND")
    # The selector (vllm/v1/attention/selector.py _cached_get_attn_backend) sets a backend's
    # get_required_kv_cache_layout() as the process's override, which get_kv_cache_layout()
    # reads before VLLM_KV_CACHE_LAYOUT.
    required = {_REQUIRED_LAYOUTS[layer.backend](case.capability) for layer in case.layers
                if layer.backend in _REQUIRED_LAYOUTS} - {None}
    if required:
        (layout,) = required
        return layout
    if case.layout is not None:
        return case.layout
    if case.connector == "nixl" and not use_mla(case):
        return "HND"
    return "NHD"


def use_mla(case: CaseConfig) -> bool:
    """``model_config.use_mla``: model-global, decided by the target (not draft) layers."""
    return any(layer.kind in ("mla", "sliding_window_mla") for layer in case.layers if not layer.is_draft)


def gen1_spec(case: CaseConfig, layer: LayerConfig, backend_name: str,
              mamba_page_size_padded: int | None = None) -> LayerSpec:
    """The layer's spec as its ``get_kv_cache_spec`` builds it at ``case.vllm_version`` (a Mamba
    layer's with the page the negotiation padded it to)."""
    if layer.kind == "mamba":
        if layer.is_draft:
            raise NotModeledError(f"layer {layer.name!r}: a Mamba draft is not modeled in generation 1")
        backend = bk.get_backend(backend_name)
        if not backend.is_ssm:
            raise ConfigError(f"layer {layer.name!r}: mamba layers need a state-space backend, got {backend_name}")
        if case.mamba_cache_mode != "none":
            raise NotModeledError(f"mamba_cache_mode {case.mamba_cache_mode!r} (prefix caching of Mamba state) is not "
                                  "modeled in generation 1")
        spec = raw_spec(case, layer, backend)
        assert isinstance(spec, MambaSpec)
        return spec if mamba_page_size_padded is None else replace(spec, page_size_padded=mamba_page_size_padded)
    if layer.kind not in MODELED_KINDS:
        raise NotModeledError(
            f"layer {layer.name!r}: kind {layer.kind!r} is not modeled in generation 1; "
            f"modeled: {', '.join(MODELED_KINDS)}"
        )
    if layer.cache_dtype not in MODELED_CACHE_DTYPES:
        raise NotModeledError(
            f"layer {layer.name!r}: cache dtype {layer.cache_dtype!r} is not modeled in generation 1; "
            f"modeled: {', '.join(MODELED_CACHE_DTYPES)}"
        )
    backend = bk.get_backend(backend_name)
    gen1_layout(backend_name, case.vllm_version)  # ConfigError / NotModeledError early
    spec = raw_spec(case, layer, backend)
    assert isinstance(spec, AttentionSpec)
    if layer.kind == "sliding_window":
        spec = spec.with_block_size(_sliding_window_block_size(backend_name, spec, case))
    bk.check_backend_accepts(backend, spec, layer.name)
    if not spec.kind.is_mla and spec.head_size_v != spec.head_size:
        raise NotModeledError(f"layer {layer.name!r}: the 5-D generation-1 shape needs head_size_v == head_size")
    return spec


def _sliding_window_block_size(backend_name: str, spec: AttentionSpec, case: CaseConfig) -> int:
    """``Attention.get_kv_cache_spec``'s block size for a sliding-window layer: the configured one,
    or from 0.25 ``_largest_kernel_block_within`` with no padded page: the smallest of the
    backend's kernel block sizes at that release (a ``MultipleOf``'s base where it takes only
    multiples); the configured one where the backend declares none."""
    if not holds(SLIDING_WINDOW_BLOCK_DECOUPLED, case.vllm_version):
        return case.block_size
    sizes = gen1_kernel_block_sizes(backend_name, spec, case.capability, case.vllm_version)
    candidates = [s for s in sizes if isinstance(s, int)] or [s.base for s in sizes if not isinstance(s, int)]
    return min(candidates) if candidates else case.block_size


def _check_promotion_unifies(specs: dict[str, LayerSpec]) -> None:
    """``unify_hybrid_kv_cache_specs`` up to 0.26 (``PROMOTED_WINDOW_KEEPS_ITS_BLOCK``): beside full
    attention a window (or chunk) layer becomes a full-attention spec of its own block size, and
    block sizes that then differ leave no unified type."""
    kinds = {s.kind for s in specs.values() if isinstance(s, AttentionSpec)}
    local = {SpecKind.SLIDING_WINDOW, SpecKind.CHUNKED_LOCAL}
    if not kinds & {SpecKind.FULL, SpecKind.MLA} or not kinds & local:
        return
    if len({s.block_size for s in specs.values()}) > 1:
        raise StartupError("Hybrid KV cache manager is disabled but failed to convert the KV cache specs to one "
                           "unified type.", where="vllm.v1.core.kv_cache_utils.unify_hybrid_kv_cache_specs")


def _select(block_size: int, members: Iterable[tuple[str, AttentionSpec]], capability: tuple[int, int],
            vllm_version: str) -> int:
    """``select_common_block_size`` over a group's (backend, spec) pairs (0.21 took no specs)."""
    pairs = dict.fromkeys(members)
    return select_common_block_size(
        block_size,
        [(name, gen1_kernel_block_sizes(name, spec, capability, vllm_version)) for name, spec in pairs],
    )


# --- hybrid (attention + Mamba) models ---------------------------------------------------


def _state_page_bytes(layer: LayerConfig) -> int:
    dtypes = layer.mamba_dtypes or ("bfloat16",) * len(layer.mamba_shapes)
    return sum(math.prod(shape) * dtype_size(d) for shape, d in zip(layer.mamba_shapes, dtypes))


def hybrid_block_size(case: CaseConfig) -> tuple[int, int | None]:
    """``(block size, mamba_page_size_padded)`` after the release's block-size negotiation of a
    hybrid model (``releases.HYBRID_BLOCK_ALIGNMENT``); ``(case.block_size, None)`` without Mamba
    layers or without attention.

    The attention page per token is the model's (its first target attention layer's heads and
    head size, the model-wide cache dtype); the state page is the model class's (the case's
    largest). The attention block becomes the smallest multiple of the alignment whose page holds
    the state, if that is larger than ``--block-size``; the state's page is then padded to the
    attention page."""
    states = [layer for layer in case.layers if layer.kind == "mamba"]
    targets = [layer for layer in case.layers if layer.kind != "mamba" and not layer.is_draft]
    attention = [layer for layer in case.layers if layer.kind != "mamba"]
    if not states or not targets:
        return case.block_size, None
    if case.mamba_cache_mode != "none":
        raise NotModeledError(f"mamba_cache_mode {case.mamba_cache_mode!r} (prefix caching of Mamba state) is not "
                              "modeled in generation 1")
    first = targets[0]
    probe = raw_spec(case, first, bk.get_backend(first.backend))
    assert isinstance(probe, AttentionSpec)
    per_token = probe.page_size_bytes // probe.block_size
    state_page = max(_state_page_bytes(layer) for layer in states)
    mla = use_mla(case)
    era = fact_at(HYBRID_BLOCK_ALIGNMENT, check_gen1_version(case.vllm_version))
    assert era is not None
    if era.value == "fixed":
        alignment = (128 if case.attention_backend == "CUTLASS_MLA" else 64) if mla else 16
    else:
        # _find_non_ssm_backend: the first layer that is not a state layer, drafts included.
        lead = attention[0]
        lead_backend = layer_backend(case, lead, "mrv1")
        lead_spec = raw_spec(case, lead, bk.get_backend(lead_backend))
        assert isinstance(lead_spec, AttentionSpec)
        sizes = gen1_kernel_block_sizes(lead_backend, lead_spec, case.capability, case.vllm_version)
        alignment = max(min(s.base if isinstance(s, MultipleOf) else s for s in sizes), case.block_size)
        if era.value == "backend_mla_128" and mla:
            alignment = max(alignment, 128)
    needed = alignment * -(-state_page // (alignment * per_token))
    block_size = max(case.block_size, needed)
    attention_page = block_size * per_token
    return block_size, (None if attention_page == state_page else attention_page)


def _check_state_pages(specs: dict[str, LayerSpec], version: Version) -> None:
    """``unify_kv_cache_spec_page_size`` before 0.28 on a Mamba page smaller than the largest page
    (``releases.MAMBA_PAGE_PADDED_BY_UNIFY``): it scales the state's block size, which leaves its
    page as it is, and the assert after it fails (or the page does not divide the largest)."""
    if holds(MAMBA_PAGE_PADDED_BY_UNIFY, version):
        return
    largest = max(s.page_size_bytes for s in specs.values())
    for name, spec in specs.items():
        if isinstance(spec, MambaSpec) and spec.page_size_bytes != largest:
            if largest % spec.page_size_bytes:
                message = ("The page size of the layer is not divisible by the maximum page size. Cannot unify by "
                           "adjusting block_size." if not holds(ATTENTION_PAGES_PADDED, version) else
                           f"Layer {name}: page size is not divisible by the maximum page size and cannot be padded.")
                raise StartupError(message, where="vllm.v1.core.kv_cache_utils.unify_kv_cache_spec_page_size")
            raise StartupError("AssertionError()", where="vllm.v1.core.kv_cache_utils.unify_kv_cache_spec_page_size "
                                                       "(assert new_spec.page_size_bytes == max_page_size)")


def _state_views(name: str, spec: MambaSpec, tensor: Gen1KVCacheTensor, group_id: int,
                 version: Version) -> dict[str, TensorView]:
    """What a Mamba layer registers (``releases.MAMBA_STATE_PAGE_VIEW``): from 0.27 one int8
    ``[num_blocks, 1, 1, page]`` view; before, one strided tensor per state, ``"<layer>[i]"``:
    ``(num_blocks, *shape)`` with the page as its block stride, after the states before it."""
    page = spec.page_size_bytes
    num_blocks = tensor.size // page
    if holds(MAMBA_STATE_PAGE_VIEW, version):
        return {name: TensorView(name=name, shape=(num_blocks, 1, 1, page), stride=(page, page, page, 1), dtype="int8",
                                 storage_offset=0, storage_nbytes=tensor.size, group_id=group_id,
                                 kernel_block_size=spec.block_size)}
    return {
        f"{name}[{i}]": TensorView(name=f"{name}[{i}]", shape=state.shape, stride=state.stride, dtype=state.dtype,
                                   storage_offset=state.storage_offset, storage_nbytes=tensor.size, group_id=group_id,
                                   kernel_block_size=spec.block_size)
        for i, state in enumerate(state_views(num_blocks, page, 0, spec.shapes, spec.dtypes))
    }


def _hybrid_attention_layout(view: TensorView, geometry: "_LayerGeometry", runner: str,
                             version: Version) -> tuple[TensorView, "_LayerGeometry"]:
    """``_update_hybrid_attention_mamba_layout`` (MRv1) / ``_update_hybrid_attention_layout``
    (MRv2) on one attention view of a model with Mamba layers: a KV-first view (``2BNHD``: block
    dimension 1) is restrided block-outermost, ``(hidden, 2 * hidden, ...)``, so that block *b*'s
    K and V lie in page *b*, where the state of block *b* lies. Where the runner finds such views
    by their shape (``releases.HYBRID_LAYOUT_BY_SHAPE``) it takes any view of ``shape[0] == 2``
    for one, and refuses when ``shape[1]`` is 2 too."""
    if holds(HYBRID_LAYOUT_BY_SHAPE[runner], version):
        if view.shape[0] != 2:
            return view, geometry
        if view.shape[1] == 2:
            shape = "torch.Size([" + ", ".join(map(str, view.shape)) + "])"
            message = (f"Fail to determine whether the layout is (2, num_blocks, ...) or (num_blocks, 2, ...) for a "
                       f"tensor of shape {shape}" if runner == "mrv1" else
                       f"Cannot determine layout for tensor of shape {shape}")
            raise StartupError(message, where="vllm.v1.worker." + ("gpu_model_runner._update_hybrid_attention_mamba_layout"
                                                                   if runner == "mrv1" else
                                                                   "gpu.attn_utils._update_hybrid_attention_layout"))
    elif geometry.shape_kind != "2BNHD":
        return view, geometry
    hidden = math.prod(view.shape[2:])
    stride = (hidden, 2 * hidden, *view.stride[2:])
    axes = SHAPE_AXES[geometry.shape_kind]
    es = geometry.element_size
    return (replace(view, stride=stride),
            replace(geometry, byte_strides={a: st * es for a, st in zip(axes, stride)}))


@dataclass(frozen=True)
class _StateGeometry:
    """One Mamba layer's pages: block *b* is the page at ``base + b * page``, its state bytes first."""

    name: str
    base: int
    page: int
    state_bytes: int
    shape_kind: str = "state"

    def block(self, block_id: int) -> BlockBytes:
        region = make_region(self.base + block_id * self.page, 1, [(1, self.state_bytes)])
        return BlockBytes(self.name, block_id, region, region, None)


def derive_gen1(case: CaseConfig, runner: str = "mrv1") -> Gen1Derivation:
    """What ``register_kv_caches`` receives from ``runner`` in vLLM 0.19 to 0.28.

    MRv1 (``_reshape_kv_cache_tensors``) and MRv2 from 0.22 reshape with kernel blocks:
    ``get_kv_cache_shape(num_blocks * bs // kbs, kbs, H, D)``. MRv2 up to 0.21
    (``gpu/attn_utils._reshape_kv_cache``) uses ``(num_blocks, bs, H, D)`` (#42846;
    observed on 0.19.1, 0.20.0 and 0.21.0).
    """
    if runner not in ("mrv1", "mrv2"):
        raise ConfigError(f"runner {runner!r} is not one of mrv1, mrv2")
    if case.generation != 1:
        raise ConfigError(
            f"case {case.name!r} is generation {case.generation}; derive_gen1 models generation 1 (vLLM < 0.30)"
        )
    version = check_gen1_version(case.vllm_version)
    if case.prefill_context_parallel_size > 1:
        raise NotModeledError("prefill context parallelism in vLLM 0.19 to 0.28 is not modeled "
                              "(generation 2 predicts its refusals: reference.parallel)")
    layout = resolve_gen1_layout(case)
    hybrid = any(layer.kind == "mamba" for layer in case.layers)
    # The block-size negotiation of a hybrid model runs at start-up, before the specs are built.
    block_size, state_page = hybrid_block_size(case)
    spec_case = case if block_size == case.block_size else case.with_(block_size=block_size)

    specs: dict[str, LayerSpec] = {}
    backends: dict[str, str] = {}
    for layer in case.layers:
        name = layer_backend(case, layer, runner)
        specs[layer.name] = gen1_spec(spec_case, layer, name, state_page)
        backends[layer.name] = name
    if hybrid:
        _check_state_pages(specs, version)

    if case.disable_hybrid_kv_cache_manager and holds(PROMOTED_WINDOW_KEEPS_ITS_BLOCK, version):
        _check_promotion_unifies(specs)
    # Gen 1 groups with the same HMA algorithm; a layer-compact layout keeps the
    # block-outermost (gen-2 packed) branch out of it.
    try:
        groups = tuple(get_kv_cache_groups(dict(specs), KVCacheLayout.LBNHC,
                                          hybrid_manager=not case.disable_hybrid_kv_cache_manager))
    except StartupError:
        if holds(ATTENTION_PAGES_PADDED, version) and any(isinstance(s, AttentionSpec) and s.kind.is_mla
                                                          for s in specs.values()):
            # Generation 1 pads an MLA page too (its backends opt in); the shared unification refuses it.
            raise NotModeledError("a padded MLA page (generation 1 from 0.24) is not modeled") from None
        raise
    grouped = {n: layer_spec_of(g.spec, n) for g in groups for n in g.layer_names}
    if any(isinstance(s, AttentionSpec) and s.page_size_padded is not None for s in grouped.values()):
        if not holds(ATTENTION_PAGES_PADDED, version):
            raise StartupError("The page size of the layer is not divisible by the maximum page size. "
                               "Cannot unify by adjusting block_size.",
                               where="vllm.v1.core.kv_cache_utils.unify_kv_cache_spec_page_size")
    num_blocks = _num_blocks(case, groups)
    tensors = place_gen1_tensors(groups, num_blocks)

    selected: list[int | None] = []
    kernel: list[int] = []
    expand = runner == "mrv1" or holds(MRV2_KERNEL_BLOCKS, version)
    for group in groups:
        members = [(backends[n], grouped[n]) for n in group.layer_names]
        if isinstance(group.spec, MambaSpec):
            # prepare_kernel_block_sizes: a state group keeps its block size (no splitting).
            selected.append(group.spec.block_size)
            kernel.append(group.spec.block_size)
            continue
        if expand:
            kbs = _select(group.spec.block_size, members, case.capability, case.vllm_version)
            selected.append(kbs)
            kernel.append(kbs)
        else:
            # MRv2 0.21: nothing on the runner path calls select_common_block_size; a
            # connector (NIXL) still does, so record what it would get.
            try:
                selected.append(_select(group.spec.block_size, members, case.capability, case.vllm_version))
            except StartupError:
                selected.append(None)
            kernel.append(group.spec.block_size)

    if hybrid and runner == "mrv2" and not holds(MRV2_MAMBA, version):
        raise StartupError("AssertionError()", where="vllm.v1.worker.gpu.attn_utils._reshape_kv_cache "
                                                   "(assert isinstance(kv_cache_spec, AttentionSpec))")
    registered: dict[str, TensorView] = {}
    kinds: dict[str, str] = {}
    geometry: dict[str, _LayerGeometry | _StateGeometry] = {}
    states: dict[str, dict[str, TensorView]] = {}
    base = 0
    for tensor in tensors:
        for name in tensor.shared_by:
            gid = next(i for i, g in enumerate(groups) if name in g.layer_names)
            spec = grouped[name]
            if isinstance(spec, MambaSpec):
                states[name] = _state_views(name, spec, tensor, gid, version)
                kinds[name] = "state"
                geometry[name] = _StateGeometry(name, base, spec.page_size_bytes, spec.real_page_size_bytes)
                continue
            view, geo = _layer_view(name, spec, backends[name], tensor, gid, kernel[gid], layout, case, base)
            registered[name] = view
            kinds[name] = geo.shape_kind
            geometry[name] = geo
        base += tensor.size
    if hybrid:
        # The runners restride after every layer is viewed (attention groups first, MRv1's group order).
        for name in list(registered):
            registered[name], geometry[name] = _hybrid_attention_layout(registered[name], geometry[name], runner, version)  # type: ignore[arg-type]
    # Dict order follows the case's layers, like the runner's kv_caches dict (a list of state
    # tensors in its place, one entry per state).
    for name, views in states.items():
        registered.update(views)
    order = [n for layer in case.layers for n in (states[layer.name] if layer.name in states else (layer.name,))]
    return Gen1Derivation(
        case=case,
        runner=runner,
        version=version,
        layout=layout,
        layer_backends=backends,
        groups=groups,
        num_blocks=num_blocks,
        kv_cache_tensors=tensors,
        kernel_block_sizes=tuple(kernel),
        selected_kernel_block_sizes=tuple(selected),
        registered={n: registered[n] for n in order},
        shape_kinds={layer.name: kinds[layer.name] for layer in case.layers},
        _geometry=geometry,
    )


def _layer_view(
    name: str,
    spec: AttentionSpec,
    backend: str,
    tensor: Gen1KVCacheTensor,
    group_id: int,
    kbs: int,
    layout: str,
    case: CaseConfig,
    base: int,
) -> tuple[TensorView, _LayerGeometry]:
    """``raw.view(dtype).view(permuted_shape).permute(inverse_order)`` for one layer."""
    page = spec.page_size_bytes
    if tensor.size % page:
        raise StartupError(
            f"raw tensor of {tensor.size} bytes is not a whole number of {page}-byte pages",
            where="vllm.v1.worker.gpu_model_runner._reshape_kv_cache_tensors",
        )
    # The runner derives the block count from the raw tensor, not from the config.
    num_blocks = tensor.size // page
    ratio = spec.block_size // kbs
    heads = 1 if spec.kind.is_mla else spec.num_kv_heads
    shape = gen1_kv_cache_shape(
        backend, num_blocks * ratio, kbs, heads, spec.head_size, vllm_version=case.vllm_version
    )
    order = gen1_stride_order(backend, layout, vllm_version=case.vllm_version)
    strides = permuted_view_strides(shape, order)
    es = dtype_size(spec.dtype)
    padded = spec.page_size_padded is not None
    if padded:
        # PADDED_PAGE_VIEW: as_strided with every kernel block strided by the padded logical page (#54877).
        assert holds(PADDED_PAGE_VIEW, case.vllm_version)
        if shape[0] != num_blocks * ratio:
            raise StartupError(
                f"Padded KV pages require a num-blocks-first KV cache layout (got shape {shape} with "
                f"num_blocks={num_blocks * ratio}); kv-first layouts are not supported.",
                where="vllm.v1.worker.gpu.attn_utils._reshape_attention_kv_cache")
        strides = (page // es, *strides[1:])
    elif math.prod(shape) * es != tensor.size:
        # .view(permuted_shape) would raise: the element count must match exactly.
        raise NotModeledError(f"layer {name!r}: shape {shape} does not fill its {tensor.size}-byte raw tensor")
    kind = gen1_layout(backend, case.vllm_version).shape
    axes = SHAPE_AXES[kind]
    view = TensorView(
        name=name,
        shape=shape,
        stride=strides,
        dtype=spec.dtype,
        storage_offset=0,
        storage_nbytes=tensor.size,
        group_id=group_id,
        kernel_block_size=kbs,
    )
    geo = _LayerGeometry(
        name=name,
        shape_kind=kind,
        base=base,
        ratio=ratio,
        element_size=es,
        byte_strides={a: s * es for a, s in zip(axes, strides)},
        sizes=dict(zip(axes, shape)),
        head_size=spec.head_size,
    )
    return view, geo


# --- 4. MRv1 vs MRv2 --------------------------------------------------------------------


def mrv1_mrv2_differences(case: CaseConfig) -> list[str]:
    """Per-layer shape/stride differences between what MRv1 and MRv2 register.

    Empty from 0.22 on (both reshape with kernel blocks); the #42846 split before. Where
    one runner refuses and the other starts (before 0.22 MRv2 never asks for a kernel
    block size, so it starts where no kernel block size fits), ``error: ...``.
    """

    def outcome(runner: str) -> Gen1Derivation | StartupError:
        try:
            return derive_gen1(case, runner)
        except StartupError as exc:
            return exc

    one, two = outcome("mrv1"), outcome("mrv2")
    if isinstance(one, StartupError) or isinstance(two, StartupError):
        said = ["starts" if isinstance(o, Gen1Derivation) else f"refuses ({o})" for o in (one, two)]
        return [] if said[0] == said[1] else [f"error: MRv1 {said[0]} vs MRv2 {said[1]}"]
    out: list[str] = []
    for name, a in one.registered.items():
        b = two.registered[name]
        if (a.shape, a.stride, a.dtype) != (b.shape, b.stride, b.dtype):
            out.append(
                f"{name}: MRv1 shape {a.shape} stride {a.stride} vs MRv2 shape {b.shape} stride {b.stride}"
            )
    return out


# --- 5. the pre-#39596 Mooncake heuristic ------------------------------------------------


def mooncake_gen1_block_size(view: TensorView, use_mla: bool) -> int:
    """``cache.shape[-2 if use_mla else -3]``: what old Mooncake asserted equals block_size.

    ``use_mla`` is model-global, so a GQA draft under an MLA target reads ``H``.
    """
    if len(view.shape) < 3:
        raise ConfigError(f"view {view.name!r} has shape {view.shape}; the heuristic needs >= 3 dims")
    return view.shape[-2 if use_mla else -3]


def mooncake_block_size(d: Gen1Derivation) -> int:
    """``MooncakeConnectorWorker.block_size`` when ``register_kv_caches`` runs: the
    configured block size before #39596, after it ``_sync_block_size_with_kernel``'s
    ``select_common_block_size`` of the *configured* block size over every layer's backend,
    whatever block size each group has (a 0.25 window group of 16-token blocks beside a
    64-token one still gives 64); where none fits, the configured one."""
    if not holds(MOONCAKE_KERNEL_SYNC, d.version):
        return d.case.block_size
    members = [(d.layer_backends[n], layer_spec_of(g.spec, n)) for g in d.groups for n in g.layer_names]
    try:
        return _select(d.case.block_size, members, d.case.capability, d.case.vllm_version)
    except StartupError:
        return d.case.block_size


def mooncake_refusal(d: Gen1Derivation) -> str | None:
    """Why Mooncake's worker refuses what ``d``'s runner registers, or None: from #39596 its
    ``__init__`` needs a common kernel block size; ``register_kv_caches`` needs every
    tensor to have the first one's ``shape[0]`` and, before #39596, the
    token axis the heuristic reads (``mooncake_gen1_block_size``) must equal the
    configured block size. ``use_mla`` is the target model's, as vLLM's ModelConfig has it."""
    mla = any(layer.kind == "mla" for layer in d.case.layers if not layer.is_draft)
    if holds(MOONCAKE_KERNEL_SYNC, d.version) and None in d.selected_kernel_block_sizes:
        # _sync_block_size_with_kernel asks select_common_block_size, which finds none
        # (MRv2 before 0.22 never asked, so the runner started).
        return f"no common kernel block size for {d.case.block_size} (_sync_block_size_with_kernel)"
    first: int | None = None
    for name, view in d.registered.items():
        if first is None:
            first = view.shape[0]
        if view.shape[0] != first:
            return f"{name}: shape[0] {view.shape[0]} != {first} ('All kv cache tensors must have the same number of blocks')"
        if not holds(MOONCAKE_KERNEL_SYNC, d.version):
            read = mooncake_gen1_block_size(view, mla)
            if read != d.case.block_size:
                axis = -2 if mla else -3
                layer = next(c for c in d.case.layers if c.name == name)
                why = (f"use_mla={mla} is model-global, so a non-MLA layer's heads are read: vLLM #39596"
                       if mla and layer.kind != "mla" else
                       f"the runner viewed it in kernel blocks of {d.kernel_block_sizes[d.group_of(name)]}")
                return (f"{name}: shape[{axis}] of {view.shape} is {read}, not the block size {d.case.block_size} "
                        f"(assert self.block_size == kernel_block_size; {why})")
    return None


def nixl_refusal(d: Gen1Derivation) -> str | None:
    """Why the release's ``NixlConnectorWorker`` refuses what this runner registered (None: it
    does not). Its ``__init__`` selects the kernel block size over the backends
    (``select_common_block_size``; none fits: a refusal); ``register_kv_caches`` then asserts
    every tensor holds ``num_blocks * block_size // kernel`` blocks, which views reshaped with
    another block size do not (MRv2 before 0.22 uses the logical one: vLLM #42846, the report
    that named NIXL)."""
    if None in d.selected_kernel_block_sizes:
        return "No common block size (NixlConnectorWorker.__init__: select_common_block_size)"
    if any(k != s for k, s in zip(d.kernel_block_sizes, d.selected_kernel_block_sizes)):
        return ("All kv cache tensors must have the same number of blocks (register_kv_caches: the views hold "
                "logical blocks, the worker counts kernel blocks; vLLM #42846)")
    return None


# --- helpers for byte-set comparisons -----------------------------------------------------


def merged_runs(regions: Iterable[Region]) -> tuple[tuple[int, int], ...]:
    """The union of every run of ``regions``, as sorted, merged ``[lo, hi)`` intervals."""
    return tuple(merge(run for region in regions for run in region.runs()))


# check_gen1_version and parse_version live in reference.releases; they stay importable from
# here for the importers that still name this module.
__all__ = [
    "Gen1Derivation",
    "Gen1KVCacheTensor",
    "check_gen1_version",
    "contiguous_strides",
    "derive_gen1",
    "gen1_kernel_block_sizes",
    "nixl_refusal",
    "gen1_kv_cache_shape",
    "gen1_layout",
    "gen1_spec",
    "gen1_stride_order",
    "merged_runs",
    "mooncake_block_size",
    "mooncake_gen1_block_size",
    "mooncake_refusal",
    "mrv1_mrv2_differences",
    "parse_version",
    "permuted_view_strides",
    "place_gen1_tensors",
    "resolve_gen1_layout",
    "use_mla",
]
