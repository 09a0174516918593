"""Example connector adapters: one correct, five with the bug classes real connectors shipped.

- ``ReferenceAdapter``: correct; derives everything from the registered view (``shape[0]``,
  ``stride()``, ``data_ptr()``), as the target release's NIXL connector does for layer-outermost layouts.
- ``ShapeMinus3Adapter``: takes ``shape[-3]`` as the tokens per block (Mooncake before #39596;
  in the target release's ``[B, H, N, C]`` view that is the head count).
- ``LogicalBlockAdapter``: uses the scheduler's logical block size when vLLM split blocks into
  kernel blocks (the #42846 class: FlashInfer at block 128 registers 64-token kernel blocks).
- ``PermutationBlindAdapter``: assumes each layer's blocks are contiguous pages laid out
  ``[N, H, C]`` (LBNHC), ignoring strides: wrong under LBHNC (its K/V positions),
  block-outermost layouts and LHBNC.
- ``KVInLastDimAdapter``: K then V halves of the last dim for every backend: wrong K/V
  under two head slots (ROCM_ATTN, B12X) and K/V planes (CPU_ATTN).
- ``UnpaddedPageAdapter``: blocks spaced by their K/V bytes, ignoring page padding (hybrid
  models whose groups share one padded page size).
"""

from __future__ import annotations

from typing import Any, Mapping

from conformance.connectors.protocol import Ranges, RegistrationContext


def _view_runs(t: Any, index: int) -> Ranges:
    """Byte runs of ``t[index]`` (a ``[H, N, C]`` block) from its strides, merged where contiguous."""
    es = t.element_size()
    base = t.data_ptr() + index * t.stride(0) * es
    # last dim must be element-contiguous (it is for every vLLM KV view)
    run = t.shape[-1] * es if t.stride(-1) == 1 else es
    dims = sorted(((t.stride(d) * es, t.shape[d]) for d in range(1, t.dim() - 1) if t.shape[d] > 1), reverse=True)
    while dims and dims[-1][0] == run:
        run *= dims.pop()[1]
    starts = [base]
    for stride, count in dims:
        starts = [s + i * stride for s in starts for i in range(count)]
    return [(s, run) for s in starts]


class ReferenceAdapter:
    """Correct: kernel blocks per logical block = ``shape[0] // num_blocks``; addresses from strides."""

    def __init__(self, ctx: RegistrationContext) -> None:
        self.ctx = ctx
        self.caches: dict[str, Any] = {}

    def register(self, kv_caches: Mapping[str, Any]) -> None:
        self.caches = dict(kv_caches)

    def _ratio(self, layer: str) -> int:
        return self.caches[layer].shape[0] // self.ctx.num_blocks

    def descriptors(self, layer: str, block_id: int) -> Ranges:
        t, r = self.caches[layer], self._ratio(layer)
        out: Ranges = []
        for k in range(block_id * r, block_id * r + r):
            out += _view_runs(t, k)
        return out

    def block_len(self, layer: str) -> int:
        t = self.caches[layer]
        return t[0].numel() * t.element_size()

    def num_blocks(self, layer: str) -> int:
        return self.caches[layer].shape[0]

    def head_descriptors(self, layer: str, block_id: int, start: int, stop: int) -> Ranges:
        """Bytes of view heads ``[start, stop)`` (a hetero-TP head-sharded read)."""
        t, r = self.caches[layer], self._ratio(layer)
        out: Ranges = []
        for k in range(block_id * r, block_id * r + r):
            for h in range(start, stop):
                out += _view_runs(t[:, h : h + 1], k)
        return out


class ShapeMinus3Adapter(ReferenceAdapter):
    """Wrong: ``block_size = cache.shape[-3]`` (the pre-#39596 Mooncake check, 5-D era)."""

    def register(self, kv_caches: Mapping[str, Any]) -> None:
        super().register(kv_caches)
        first = next(iter(self.caches.values()))
        self.kernel_block_size = first.shape[-3]

    def block_len(self, layer: str) -> int:
        t = self.caches[layer]
        per_token = t.shape[-3] * t.shape[-1] * t.element_size()  # heads x content, per token
        return self.caches[layer].shape[-3] * per_token

    def descriptors(self, layer: str, block_id: int) -> Ranges:
        # one "block" of shape[-3] tokens per block id: the block size it believes in
        t = self.caches[layer]
        bl = self.block_len(layer)
        return [(t.data_ptr() + block_id * bl, bl)]


class LogicalBlockAdapter(ReferenceAdapter):
    """Wrong: block length and count from the logical block size; ids not expanded (#42846)."""

    @property
    def kernel_block_size(self) -> int:
        return self.ctx.block_size

    def block_len(self, layer: str) -> int:
        return self.ctx.layers[layer].page_size_bytes  # one logical page

    def num_blocks(self, layer: str) -> int:
        return self.ctx.num_blocks

    def descriptors(self, layer: str, block_id: int) -> Ranges:
        t = self.caches[layer]
        stride = t.stride(0) * t.element_size()  # the view's (kernel) block stride
        return [(t.data_ptr() + block_id * stride, self.block_len(layer))]


class PermutationBlindAdapter(ReferenceAdapter):
    """Wrong: blocks as contiguous pages, ``[N, H, C]`` inside, K then V per (token, head)."""

    def descriptors(self, layer: str, block_id: int) -> Ranges:
        k, v = self.kv_descriptors(layer, block_id)
        return k + v

    def head_descriptors(self, layer: str, block_id: int, start: int, stop: int) -> Ranges:
        t = self.caches[layer]
        info = self.ctx.layers[layer]
        es = t.element_size()
        heads, content = t.shape[1], t.shape[3] * es
        tokens = info.block_size
        block = t.data_ptr() + block_id * heads * tokens * content
        return [(block + (n * heads + start) * content, (stop - start) * content) for n in range(tokens)]

    def kv_descriptors(self, layer: str, block_id: int) -> tuple[Ranges, Ranges]:
        t = self.caches[layer]
        info = self.ctx.layers[layer]
        es = t.element_size()
        heads, content = t.shape[1], t.shape[3] * es
        tokens = info.block_size if not info.is_mamba else 1
        page = heads * tokens * content
        start = t.data_ptr() + block_id * page
        if info.is_mla or info.is_mamba or not info.head_size_v:
            return [(start, page)], []
        k_bytes = info.head_size * es
        k: Ranges = []
        v: Ranges = []
        for n in range(tokens):
            for h in range(heads):
                at = start + (n * heads + h) * content
                k.append((at, k_bytes))
                v.append((at + k_bytes, content - k_bytes))
        return k, v




class KVInLastDimAdapter(ReferenceAdapter):
    """Wrong: K is the first half of the last dim and V the second, for every backend (what
    ``protocol.py`` used to promise): right pages, wrong K/V under ROCM_ATTN / B12X (two head
    slots) and CPU_ATTN (K/V planes per head)."""

    def kv_descriptors(self, layer: str, block_id: int) -> tuple[Ranges, Ranges]:
        t, r = self.caches[layer], self._ratio(layer)
        info = self.ctx.layers[layer]
        if info.is_mla or info.is_mamba:
            return self.descriptors(layer, block_id), []
        half = t.shape[-1] // 2
        k: Ranges = []
        v: Ranges = []
        for kb in range(block_id * r, block_id * r + r):
            k += _view_runs(t[..., :half], kb)
            v += _view_runs(t[..., half:], kb)
        return k, v


class UnpaddedPageAdapter(ReferenceAdapter):
    """Wrong: consecutive blocks ``heads x tokens x content`` bytes apart (the block's K/V bytes),
    ignoring the page padding vLLM adds so every group of a hybrid model shares one page size."""

    def descriptors(self, layer: str, block_id: int) -> Ranges:
        t, r = self.caches[layer], self._ratio(layer)
        per_kernel_block = t[0].numel() * t.element_size()  # content only, as if pages were dense
        return [(t.data_ptr() + k * per_kernel_block, per_kernel_block) for k in range(block_id * r, block_id * r + r)]


__all__ = ["KVInLastDimAdapter", "LogicalBlockAdapter", "PermutationBlindAdapter", "ReferenceAdapter", "ShapeMinus3Adapter",
           "UnpaddedPageAdapter"]
