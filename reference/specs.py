"""KV cache specs: what one layer stores per block, and how many bytes that takes.

Mirrors ``vllm/v1/kv_cache_interface.py`` (the target release): ``AttentionSpec`` and its
subclasses, ``MambaSpec`` and ``UniformTypeKVCacheSpecs``. vLLM uses a class per
kind; here one frozen dataclass carries a ``kind``, because grouping only needs
equality and the page-size formula is shared.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from typing import Union

from reference.dtypes import dtype_size
from reference.errors import ConfigError


@dataclass(frozen=True)
class MultipleOf:
    """A kernel block size entry meaning "any multiple of ``base``" (vLLM ``MultipleOf``)."""

    base: int

    def __repr__(self) -> str:
        return f"MultipleOf({self.base})"


KernelBlockSize = Union[int, MultipleOf]


class SpecKind(str, enum.Enum):
    """vLLM's ``KVCacheSpecKind`` values, plus the classes that share a kind."""

    FULL = "full_attention"
    MLA = "mla_attention"
    SLIDING_WINDOW = "sliding_window"
    SLIDING_WINDOW_MLA = "sliding_window_mla"
    CHUNKED_LOCAL = "chunked_local_attention"
    SINK_FULL = "sink_full_attention"
    ENCODER_ONLY = "encoder_only_attention"
    CROSS = "cross_attention"
    MAMBA = "mamba"
    HIDDEN_STATE = "hidden_state"
    """``HiddenStateCacheSpec``: an ``MLAAttentionSpec`` subclass (no V) with one head per captured
    layer; planned apart from the other groups (``get_kv_cache_groups``)."""
    CIRCULAR_BUFFER = "circular_buffer"
    """``CircularBufferSpec``: one ring block per request (``max_num_blocks_per_req`` 1), written at
    ``position % block_size`` by the layer itself: no slot mapping, no prefix caching, no block-table
    token alignment; its own uniform-type base (``is_uniform_with_collection``) and manager."""
    RSWA = "rswa"
    """``RSWASpec``: vLLM reports it as ``full_attention`` (``KVCacheSpecRegistry.get_kind``
    matches it as a ``FullAttentionSpec``), but it is its own class, so it never equals a
    full-attention spec and gets its own manager (``RSWAManager``)."""

    @property
    def is_mla(self) -> bool:
        """An ``MLAAttentionSpec`` (or SW-MLA) class: the hidden-state cache is one too."""
        return self in (SpecKind.MLA, SpecKind.SLIDING_WINDOW_MLA, SpecKind.HIDDEN_STATE)

    @property
    def uniform_type_base(self) -> str:
        """``KVCacheSpecRegistry.get_uniform_type_base_spec``: MLA and sinks count as full."""
        if self in (SpecKind.FULL, SpecKind.MLA, SpecKind.SINK_FULL, SpecKind.RSWA, SpecKind.HIDDEN_STATE):
            return "full"
        return self.value


@dataclass(frozen=True)
class AttentionSpec:
    """One attention layer's KV cache spec (vLLM ``AttentionSpec`` and subclasses).

    The logical page is ``[H, N, C]``: head slots, stored states (tokens), content bytes.
    K and V are concatenated in C unless a backend's ``customize_spec`` packs them
    differently (head slots, nvfp4, per-token-head scales).
    """

    kind: SpecKind
    block_size: int
    num_kv_heads: int
    head_size: int
    head_size_v: int
    dtype: str
    """Storage dtype name (fp8 caches are ``uint8``)."""
    cache_dtype: str = field(default="auto", compare=False)
    """The ``--kv-cache-dtype`` string; vLLM's attention specs keep only ``dtype`` and
    ``kv_quant_mode`` (so "auto" on a bf16 model equals "bfloat16"); MLA keeps the string
    as ``cache_dtype_str``."""
    kv_quant_mode: str = "NONE"
    cache_dtype_str: str | None = None
    sliding_window: int | None = None
    attention_chunk_size: int | None = None
    sink_len: int | None = None
    rswa_window: int | None = None
    """``RSWASpec.rswa_window``; None for every other kind."""
    cache_role: str = "sparse"
    """``MLAAttentionSpec.cache_role`` (``SparseCacheRole``): ``indexer`` for DeepSeek V3.2's indexer
    cache; MLA specs of two roles never merge (``MLAAttentionSpec.merge``)."""
    max_tp_shards: int | None = None
    """``AttentionSpec.max_tp_shards``: 1 for the indexer cache (replicated across TP ranks)."""
    non_causal: bool = False
    """``FullAttentionSpec.non_causal`` (``PrefillPrefixLMAttention``): part of equality in vLLM,
    so a non-causal layer never shares a spec with a causal one; the layout is unchanged."""
    page_size_padded: int | None = None
    num_head_slots: int | None = None
    state_content_bytes: int | None = None
    tokens_per_state: int = 1
    block_stride_alignment: int | MultipleOf | None = None
    alignment: int | None = None
    """``MLAAttentionSpec`` / ``SlidingWindowMLASpec.alignment`` (DeepSeek V4's caches): the page is rounded up to a
    multiple of it when built, and again on every copy (``_apply_alignment_padding`` in ``__post_init__``, which
    keeps a copy's inherited ``page_size_padded`` when the new page is already a multiple)."""
    bounded_replay: bool = False
    """``SlidingWindowMLASpec.bounded_replay`` (DeepSeek V4.1's SWA cache under MRv2, ``--swa-bounded-replay``): the
    window is kept out of prefix caching (``prefix_cacheable`` False) and rebuilt after a hit by recomputing it."""
    dcp_sharded: bool = True
    is_draft: bool = field(default=False, compare=False)
    """Draft (speculative) layer; like vLLM, never part of equality or grouping."""

    def __post_init__(self) -> None:
        if self.block_size <= 0:
            raise ConfigError(f"block size {self.block_size} must be a positive integer")
        if isinstance(self.block_stride_alignment, int) and self.block_stride_alignment <= 0:
            raise ConfigError(
                f"block_stride_alignment {self.block_stride_alignment} must be positive"
            )
        if self.alignment is not None:
            if self.alignment <= 0:
                raise ConfigError(f"alignment {self.alignment} must be positive")
            real = self.real_page_size_bytes
            padded = _cdiv(real, self.alignment) * self.alignment
            if padded != real:
                object.__setattr__(self, "page_size_padded", padded)
        if self.page_size_padded is not None and self.page_size_padded < self.real_page_size_bytes:
            raise ConfigError(
                f"page_size_padded {self.page_size_padded} is smaller than the page "
                f"{self.real_page_size_bytes}"
            )
        _cache_hash(self)

    def __hash__(self) -> int:
        # Specs are dict keys throughout grouping; hashing 16 fields each time dominated.
        return self.__dict__["_hash"]

    # --- the page-size formula (AttentionSpec in kv_cache_interface.py) -------------
    @property
    def element_size(self) -> int:
        return dtype_size(self.dtype)

    @property
    def num_heads(self) -> int:
        """H: head slots (``num_head_slots`` if a backend packed K/V into slots)."""
        return self.num_head_slots if self.num_head_slots is not None else self.num_kv_heads

    def num_kernel_states(self, kernel_block_size: int) -> int:
        """N for a block of ``kernel_block_size`` tokens (``get_num_kernel_states``)."""
        if self.tokens_per_state > 0:
            return kernel_block_size // self.tokens_per_state
        return 1

    @property
    def num_states(self) -> int:
        return self.num_kernel_states(self.block_size)

    @property
    def state_content_size_bytes(self) -> int:
        """C in bytes."""
        if self.state_content_bytes is not None:
            return self.state_content_bytes
        return (self.head_size + self.head_size_v) * self.element_size

    @property
    def real_page_size_bytes(self) -> int:
        return self.num_heads * self.num_states * self.state_content_size_bytes

    @property
    def page_size_bytes(self) -> int:
        return self.page_size_padded if self.page_size_padded is not None else self.real_page_size_bytes

    @property
    def has_layer_views(self) -> bool:
        return True

    @property
    def is_ring(self) -> bool:
        """A ``CircularBufferSpec``: the one attention spec that overrides the four below."""
        return self.kind is SpecKind.CIRCULAR_BUFFER

    @property
    def uses_slot_mapping(self) -> bool:
        return not self.is_ring

    @property
    def prefix_cacheable(self) -> bool:
        return not self.is_ring and not self.bounded_replay

    @property
    def block_table_token_alignment(self) -> int | None:
        return None if self.is_ring else 128

    def get_block_stride_alignment(self) -> int:
        """Bytes the stride between physical blocks must be a multiple of."""
        return self._block_stride_alignment_bytes

    @cached_property
    def _block_stride_alignment_bytes(self) -> int:
        align = self.block_stride_alignment
        if align is None:
            return 1
        if isinstance(align, int):
            return align
        k = math.gcd(align.base, self.block_size)
        if k == self.block_size:
            return 1
        return replace(self, block_size=k).page_size_bytes

    def max_num_blocks_per_req(self, max_len: int, dcp_size: int = 1) -> int:
        if self.is_ring:
            return 1  # CircularBufferSpec: the ring occupies one block for the request's lifetime
        return _cdiv(max_len, self.block_size * (dcp_size if self.dcp_sharded else 1))

    def with_block_size(self, block_size: int) -> "AttentionSpec":
        return replace(self, block_size=block_size)

    @property
    def k_content_bytes(self) -> int:
        """Bytes of K at the start of C (default packing)."""
        return self.head_size * self.element_size

    def describe(self) -> str:
        extra = ""
        if self.sliding_window:
            extra += f", window={self.sliding_window}"
        if self.page_size_padded:
            extra += f", padded={self.page_size_padded}"
        return (
            f"{self.kind.value}(block={self.block_size}, H={self.num_heads}, "
            f"D={self.head_size}/{self.head_size_v}, {self.dtype}"
            f"{'' if self.cache_dtype == 'auto' else ', ' + self.cache_dtype}{extra})"
        )


@dataclass(frozen=True)
class MambaSpec:
    """A Mamba-style state layer (vLLM ``MambaSpec``): one state per block, raw int8 view."""

    block_size: int
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    page_size_padded: int | None = None
    mamba_type: str = "MAMBA2"
    """vLLM's ``MambaAttentionBackendEnum`` member: Mamba1 and Mamba2 states never share a spec."""
    mamba_cache_mode: str = "none"
    num_speculative_blocks: int = 0
    tp_replicated: bool = False
    is_draft: bool = field(default=False, compare=False)

    kind = SpecKind.MAMBA
    dtype = "int8"
    num_heads = 1
    tokens_per_state = -1
    dcp_sharded = False
    block_stride_alignment = None

    def __post_init__(self) -> None:
        if len(self.shapes) != len(self.dtypes):
            raise ConfigError(
                f"mamba shapes {self.shapes} and dtypes {self.dtypes} differ in length"
            )
        _cache_hash(self)

    def __hash__(self) -> int:
        return self.__dict__["_hash"]

    @property
    def element_size(self) -> int:
        return 1

    @property
    def state_content_size_bytes(self) -> int:
        return sum(math.prod(s) * dtype_size(d) for s, d in zip(self.shapes, self.dtypes))

    real_page_size_bytes = state_content_size_bytes

    @property
    def page_size_bytes(self) -> int:
        return self.page_size_padded if self.page_size_padded is not None else self.real_page_size_bytes

    def num_kernel_states(self, kernel_block_size: int) -> int:
        return 1

    @property
    def num_states(self) -> int:
        return 1

    has_layer_views = True
    prefix_cacheable = True

    @property
    def uses_slot_mapping(self) -> bool:
        return True

    @property
    def block_table_token_alignment(self) -> None:
        return None

    def get_block_stride_alignment(self) -> int:
        return 1

    def max_num_blocks_per_req(self, max_len: int, dcp_size: int = 1) -> int:
        if self.mamba_cache_mode == "align":
            return _cdiv(max_len, self.block_size) + self.num_speculative_blocks
        return 1 + self.num_speculative_blocks

    def with_block_size(self, block_size: int) -> "MambaSpec":
        return replace(self, block_size=block_size)

    def describe(self) -> str:
        return f"mamba(block={self.block_size}, state={self.real_page_size_bytes}B" + (
            f", padded={self.page_size_padded})" if self.page_size_padded else ")"
        )


LayerSpec = Union[AttentionSpec, MambaSpec]


@dataclass(frozen=True)
class UniformTypeSpecs:
    """Several per-layer specs of one type sharing a group (``UniformTypeKVCacheSpecs``)."""

    layer_specs: tuple[tuple[str, LayerSpec], ...]

    @property
    def block_size(self) -> int:
        return self.layer_specs[0][1].block_size

    @property
    def kind(self) -> SpecKind:
        return self.layer_specs[0][1].kind

    @property
    def first(self) -> LayerSpec:
        return self.layer_specs[0][1]

    @property
    def page_size_bytes(self) -> int:
        return sum(s.page_size_bytes for _, s in self.layer_specs)

    @property
    def dcp_sharded(self) -> bool:
        return self.first.dcp_sharded

    def spec_of(self, layer: str) -> LayerSpec:
        for name, spec in self.layer_specs:
            if name == layer:
                return spec
        raise KeyError(layer)

    def describe(self) -> str:
        kinds = sorted({s.describe() for _, s in self.layer_specs})
        return "uniform_type[" + "; ".join(kinds) + "]"


GroupSpec = Union[AttentionSpec, MambaSpec, UniformTypeSpecs]


_VLLM_CLASS = {
    SpecKind.FULL: "FullAttentionSpec",
    SpecKind.MLA: "MLAAttentionSpec",
    SpecKind.SLIDING_WINDOW: "SlidingWindowSpec",
    SpecKind.SLIDING_WINDOW_MLA: "SlidingWindowMLASpec",
    SpecKind.CHUNKED_LOCAL: "ChunkedLocalAttentionSpec",
    SpecKind.SINK_FULL: "SinkFullAttentionSpec",
    SpecKind.ENCODER_ONLY: "EncoderOnlyAttentionSpec",
    SpecKind.CROSS: "CrossAttentionSpec",
    SpecKind.MAMBA: "MambaSpec",
    SpecKind.RSWA: "RSWASpec",
    SpecKind.HIDDEN_STATE: "HiddenStateCacheSpec",
    SpecKind.CIRCULAR_BUFFER: "CircularBufferSpec",
}


def vllm_spec_class(group_spec: "GroupSpec") -> str:
    """The name of the ``vllm/v1/kv_cache_interface.py`` class a group's spec is: it picks the
    group's manager (``KVCacheSpecRegistry``), so a layer merged into another class's group
    (an R-SWA or sink layer after a causal full one) loses its own manager."""
    if isinstance(group_spec, UniformTypeSpecs):
        return "UniformTypeKVCacheSpecs"
    return _VLLM_CLASS[group_spec.kind]


def layer_spec_of(group_spec: GroupSpec, layer: str) -> LayerSpec:
    """The per-layer spec inside a group spec (unwraps ``UniformTypeSpecs``)."""
    if isinstance(group_spec, UniformTypeSpecs):
        return group_spec.spec_of(layer)
    return group_spec


def first_layer_spec(group_spec: GroupSpec) -> LayerSpec:
    return group_spec.first if isinstance(group_spec, UniformTypeSpecs) else group_spec


def _cache_hash(spec: object) -> None:
    """Store the hash of the compared fields (what dataclass would compute) once."""
    key = tuple(getattr(spec, f.name) for f in fields(spec) if f.compare)  # type: ignore[arg-type]
    object.__setattr__(spec, "_hash", hash((type(spec).__name__,) + key))


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def is_uniform_type(specs: list[LayerSpec]) -> bool:
    """``UniformTypeKVCacheSpecs.is_uniform_type``: same block size, dcp, and base type."""
    if len({s.block_size for s in specs}) != 1:
        return False
    if len({s.dcp_sharded for s in specs}) != 1:
        return False
    first = specs[0]
    base = first.kind.uniform_type_base
    if any(s.kind.uniform_type_base != base for s in specs):
        return False
    if base == "full":
        return all(isinstance(s, AttentionSpec) for s in specs)
    if first.kind in (SpecKind.SLIDING_WINDOW, SpecKind.SLIDING_WINDOW_MLA):
        return len({s.sliding_window for s in specs}) == 1  # type: ignore[union-attr]
    if first.kind is SpecKind.CHUNKED_LOCAL:
        return len({s.attention_chunk_size for s in specs}) == 1  # type: ignore[union-attr]
    if first.kind is SpecKind.MAMBA:
        # MambaSpec.is_uniform_with_collection: also whether the state is whole on every TP rank (Qwen4-exp's PLE
        # conv beside its sharded GDN states: two buckets). Prefill checkpoint blocks are not modeled (none here).
        return (
            len({(s.num_speculative_blocks, s.page_size_bytes, s.tp_replicated) for s in specs}) == 1  # type: ignore[union-attr]
        )
    return True
