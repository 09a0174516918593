"""Per-layer tensor views and the bytes each (layer, logical block) occupies.

Mirrors ``vllm/v1/kv_cache_interface.py`` ``create_kv_cache_views`` and
``vllm/v1/worker/utils.py`` ``allocate_kv_cache`` (vLLM 0.33.0): one int8 pool,
viewed per layer as ``[B_k, H, N_k, C]`` in the spec's dtype with layout strides.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from reference.backends import Packing
from reference.errors import NotModeledError, StartupError
from reference.layout import B, C, H, L, N, KVCacheLayout, compute_layout_strides
from reference.planning import KVCacheTensor, logical_shape
from reference.specs import AttentionSpec, LayerSpec


@dataclass(frozen=True, slots=True)
class TensorView:
    """A tensor as a connector receives it: torch-style shape, element strides and offset."""

    name: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    """In elements of ``dtype``."""
    dtype: str
    storage_offset: int
    """In elements of ``dtype``."""
    storage_nbytes: int
    """Size of the one shared allocation every view aliases."""
    group_id: int
    kernel_block_size: int

    @property
    def element_size(self) -> int:
        from reference.dtypes import dtype_size

        return dtype_size(self.dtype)

    @property
    def byte_offset(self) -> int:
        return self.storage_offset * self.element_size

    def max_byte(self) -> int:
        """One past the last byte the view can address."""
        es = self.element_size
        last = self.storage_offset + sum((d - 1) * s for d, s in zip(self.shape, self.stride))
        return (last + 1) * es


@dataclass(frozen=True, slots=True)
class Region:
    """A set of equal-length byte runs: ``start + sum(i_k * stride_k)`` for ``i_k < count_k``.

    Compact for strided K/V inside a page (one K run per (head, token) under LBNHC)
    without materialising thousands of ranges.
    """

    start: int
    run: int
    dims: tuple[tuple[int, int], ...] = ()
    """``(stride, count)`` pairs, outermost first."""

    @property
    def count(self) -> int:
        n = 1
        for _, c in self.dims:
            n *= c
        return n

    @property
    def nbytes(self) -> int:
        return self.run * self.count

    def span(self) -> tuple[int, int]:
        """``[lo, hi)`` covering every run (equal to the region if it is contiguous)."""
        hi = self.start + sum((c - 1) * s for s, c in self.dims) + self.run
        return self.start, hi

    def runs(self) -> Iterator[tuple[int, int]]:
        """Every ``(start, stop)`` run in address order of the dims."""

        def walk(base: int, dims: tuple[tuple[int, int], ...]) -> Iterator[tuple[int, int]]:
            if not dims:
                yield base, base + self.run
                return
            (stride, count), rest = dims[0], dims[1:]
            for i in range(count):
                yield from walk(base + i * stride, rest)

        return walk(self.start, self.dims)


def make_region(start: int, run: int, dims: list[tuple[int, int]]) -> Region:
    """Drop unit dims and merge dims that continue the run, so contiguous bytes are one run."""
    dims = sorted(((s, c) for s, c in dims if c > 1), key=lambda d: -d[0])
    while dims and dims[-1][0] == run:
        run *= dims.pop()[1]
    return Region(start, run, tuple(dims))


@dataclass(frozen=True, slots=True)
class BlockBytes:
    """Where one logical block of one layer lives: the whole page, its K and its V."""

    layer: str
    block_id: int
    page: Region
    k: Region
    v: Region | None
    """None when there is no separate V (MLA latent, Mamba state)."""


def create_views(
    tensor: KVCacheTensor,
    spec: LayerSpec,
    group_id: int,
    num_blocks: int,
    layout: KVCacheLayout,
    kernel_block_size: int,
) -> list[tuple[TensorView, tuple[int, ...]]]:
    """One view per layer of ``tensor``, plus its byte strides ``[B, H, N, C]``.

    Raises the StartupError vLLM raises when a packed layout cannot be split into kernel
    blocks (block stride is not one dense page).
    """
    ratio = spec.block_size // kernel_block_size
    block_stride = tensor.block_stride
    if ratio > 1:
        dense = spec.num_heads * spec.num_states * spec.state_content_size_bytes
        if block_stride != dense:
            raise StartupError(
                f"The resolved KV cache layout ({layout.name}) does not store blocks as dense, "
                f"unpadded pages (block stride {block_stride} != page {dense}), so a manager block "
                f"cannot be split into {ratio} kernel blocks of {kernel_block_size} tokens. Reduce "
                f"--block-size to {kernel_block_size} or set VLLM_KV_CACHE_LAYOUT to a layer-compact "
                "layout (e.g. LBNHC).",
                where="vllm.v1.kv_cache_interface.create_kv_cache_views",
            )
        block_stride //= ratio
    shape = logical_shape(spec, num_blocks, len(tensor.layers), kernel_block_size)
    strides = compute_layout_strides(
        shape, layout, (tensor.layer_stride, block_stride, None, None, None)
    )
    es = spec.element_size
    view_shape = (shape[B], shape[H], shape[N], shape[C] // es)
    byte_strides = (strides[B], strides[H], strides[N], strides[C])
    if any(s % es for s in byte_strides[:3]) or tensor.offset % es or tensor.layer_stride % es:
        raise NotModeledError(
            f"byte strides {byte_strides} are not whole {spec.dtype} elements; vLLM's dtype view would fail"
        )
    elem_strides = tuple(s // es for s in byte_strides[:3]) + (1,)
    out = []
    for index, name in enumerate(tensor.layers):
        byte_offset = tensor.offset + index * tensor.layer_stride
        view = TensorView(
            name=name,
            shape=view_shape,
            stride=elem_strides,
            dtype=spec.dtype,
            storage_offset=byte_offset // es,
            storage_nbytes=tensor.size,
            group_id=group_id,
            kernel_block_size=kernel_block_size,
        )
        out.append((view, byte_strides))
    return out


@dataclass(frozen=True, slots=True)
class LayerBytes:
    """Precomputed byte geometry of one layer, so block queries are O(1)."""

    name: str
    base: int
    block_stride: int
    """Bytes between kernel blocks."""
    ratio: int
    """Kernel blocks per logical block."""
    page_dims: tuple[tuple[int, int], ...]
    """(stride, count) of H and N inside one kernel block."""
    content_bytes: int
    packing: Packing
    k_bytes: int
    v_bytes: int
    head_stride: int
    num_heads: int
    token_stride: int
    num_tokens: int

    def block(self, block_id: int) -> BlockBytes:
        start = self.base + block_id * self.ratio * self.block_stride
        outer = [(self.block_stride, self.ratio)] if self.ratio > 1 else []
        page = make_region(start, self.content_bytes, outer + list(self.page_dims))
        packing = self.packing
        if packing is Packing.KV_IN_C:
            k = make_region(start, self.k_bytes, outer + list(self.page_dims))
            v = make_region(start + self.k_bytes, self.v_bytes, outer + list(self.page_dims))
        elif packing is Packing.TWO_HEAD_SLOTS or packing is Packing.CPU_KV_PLANES:
            # Two head slots: slot 0 = K, slot 1 = V (or the first/second half of the heads
            # for nvfp4). CPU_ATTN reads each head's N*C bytes as [2, N, D]: K rows then V rows.
            if packing is Packing.CPU_KV_PLANES:
                half = self.num_tokens * self.content_bytes // 2
                heads = [(self.head_stride, self.num_heads)]
                k = make_region(start, half, outer + heads)
                v = make_region(start + half, half, outer + heads)
            else:
                half_heads = self.num_heads // 2
                dims = outer + [(self.head_stride, half_heads), (self.token_stride, self.num_tokens)]
                k = make_region(start, self.content_bytes, dims)
                v = make_region(start + half_heads * self.head_stride, self.content_bytes, dims)
        else:
            k, v = page, None
        return BlockBytes(self.name, block_id, page, k, v)


def layer_bytes(view: TensorView, byte_strides: tuple[int, ...], spec: LayerSpec, packing: Packing, ratio: int) -> LayerBytes:
    """Byte geometry of a layer view, with K/V split according to the backend's packing."""
    sB, sH, sN, _ = byte_strides
    _, heads, tokens, _ = view.shape
    content = spec.state_content_size_bytes
    k_bytes = v_bytes = 0
    if isinstance(spec, AttentionSpec) and packing is Packing.KV_IN_C:
        if spec.num_head_slots is not None:  # nvfp4: K heads then V heads
            packing = Packing.TWO_HEAD_SLOTS
        elif spec.state_content_bytes is not None:
            k_bytes = v_bytes = spec.state_content_bytes // 2  # per-token-head: [data|scale] halves
        else:
            k_bytes, v_bytes = spec.head_size * spec.element_size, spec.head_size_v * spec.element_size
    if packing is Packing.CPU_KV_PLANES and sN != content:
        raise NotModeledError(f"CPU_ATTN K/V planes need tokens contiguous per head; token stride {sN} != {content}")
    return LayerBytes(
        name=view.name,
        base=view.byte_offset,
        block_stride=sB,
        ratio=ratio,
        page_dims=((sH, heads), (sN, tokens)),
        content_bytes=content,
        packing=packing,
        k_bytes=k_bytes,
        v_bytes=v_bytes,
        head_stride=sH,
        num_heads=heads,
        token_stride=sN,
        num_tokens=tokens,
    )
