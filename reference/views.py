"""Per-layer tensor views and the bytes each (layer, logical block) occupies.

Mirrors ``vllm/v1/kv_cache_interface.py`` ``create_kv_cache_views`` and
``vllm/v1/worker/utils.py`` ``allocate_kv_cache`` (the target release): one int8 pool,
viewed per layer as ``[B_k, H, N_k, C]`` in the spec's dtype with layout strides.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, NamedTuple, Sequence

from reference.backends import Packing
from reference.errors import NotModeledError, StartupError
from reference.layout import B, C, H, L, N, KVCacheLayout, compute_layout_strides
from reference.planning import KVCacheTensor, logical_shape
from reference.specs import AttentionSpec, LayerSpec


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Element strides of a contiguous tensor of ``shape``."""
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    return tuple(strides)


class StateView(NamedTuple):
    """One state of a state layer's page, as ``MambaBase`` slices it: element shape, strides and
    offset in the state's own dtype."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str
    storage_offset: int


def state_views(num_blocks: int, page_stride_bytes: int, base_offset_bytes: int,
                shapes: Sequence[tuple[int, ...]], dtypes: Sequence[str]) -> tuple[StateView, ...]:
    """The states of a state layer's pages, each in turn after the ones before it within a page:
    ``(num_blocks, *shape)`` with the page as its block stride (``MambaBase.bind_kv_cache``'s
    ``pages[:, offset:offset + nbytes].view(dtype).view(-1, *shape)``, and generation 1's list of
    registered state tensors)."""
    import math

    from reference.dtypes import dtype_size

    out, offset = [], 0
    for shape, dtype in zip(shapes, dtypes):
        size = dtype_size(dtype)
        out.append(StateView((num_blocks, *shape), (page_stride_bytes // size, *contiguous_strides(shape)), dtype,
                             (base_offset_bytes + offset) // size))
        offset += math.prod(shape) * size
    return tuple(out)


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


class Region(NamedTuple):
    """A set of equal-length byte runs: ``start + sum(i_k * stride_k)`` for ``i_k < count_k``.

    Compact for strided K/V inside a page (one K run per (head, token) under LBNHC)
    without materialising thousands of ranges. A NamedTuple rather than a frozen
    dataclass because byte-range queries create millions of them (5x cheaper).
    """

    start: int
    run: int
    dims: tuple[tuple[int, int], ...] = ()
    """``(stride, count)`` pairs, outermost first."""

    def shifted(self, delta: int) -> "Region":
        return Region(self.start + delta, self.run, self.dims)

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


class BlockBytes(NamedTuple):
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
    """Byte geometry of one layer: regions of logical block 0, shifted per block id."""

    name: str
    logical_block_stride: int
    page: Region
    k: Region
    v: Region | None

    def block(self, block_id: int) -> BlockBytes:
        delta = block_id * self.logical_block_stride
        v = self.v
        return BlockBytes(
            self.name,
            block_id,
            self.page.shifted(delta),
            self.k.shifted(delta),
            v.shifted(delta) if v is not None else None,
        )


def effective_packing(spec: LayerSpec, packing: Packing) -> Packing:
    """How K and V sit in this layer's page: the backend's packing, except that a spec with
    head slots (nvfp4) puts K heads then V heads whatever the backend, and a layer without
    attention holds raw state."""
    if not isinstance(spec, AttentionSpec):
        return Packing.STATE
    if packing is Packing.KV_IN_C and spec.num_head_slots is not None:
        return Packing.TWO_HEAD_SLOTS  # nvfp4: K heads, then V heads
    return packing


def layer_bytes(view: TensorView, byte_strides: tuple[int, ...], spec: LayerSpec, packing: Packing, ratio: int) -> LayerBytes:
    """Byte geometry of a layer view, with K/V split according to the backend's packing."""
    sB, sH, sN, _ = byte_strides
    _, heads, tokens, _ = view.shape
    content = spec.state_content_size_bytes
    start = view.byte_offset
    outer = [(sB, ratio)] if ratio > 1 else []
    page_dims = outer + [(sH, heads), (sN, tokens)]
    page = make_region(start, content, page_dims)
    k: Region
    v: Region | None
    packing = effective_packing(spec, packing)
    if not isinstance(spec, AttentionSpec) or packing in (Packing.MLA_LATENT, Packing.STATE):
        k, v = page, None
    elif packing is Packing.KV_IN_C:
        if spec.state_content_bytes is not None:
            k_bytes = v_bytes = content // 2  # per-token-head: [data | scale] halves
        else:
            k_bytes, v_bytes = spec.head_size * spec.element_size, spec.head_size_v * spec.element_size
        k = make_region(start, k_bytes, page_dims)
        # No V at all (a hidden-state cache, a ring's [K, gate] slots): not an empty V region.
        v = make_region(start + k_bytes, v_bytes, page_dims) if v_bytes else None
    elif packing is Packing.CPU_KV_PLANES:
        # CPU_ATTN reads each head's N*C bytes as [2, N, D]: all K rows, then all V rows.
        if sN != content:
            raise NotModeledError(f"CPU_ATTN K/V planes need tokens contiguous per head; token stride {sN} != {content}")
        half = tokens * content // 2
        k = make_region(start, half, outer + [(sH, heads)])
        v = make_region(start + half, half, outer + [(sH, heads)])
    else:  # two head slots: slot group 0 holds K, slot group 1 holds V
        half_heads = heads // 2
        dims = outer + [(sH, half_heads), (sN, tokens)]
        k = make_region(start, content, dims)
        v = make_region(start + half_heads * sH, content, dims)
    return LayerBytes(view.name, sB * ratio, page, k, v)
