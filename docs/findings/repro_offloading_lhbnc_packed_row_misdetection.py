"""Standalone reproduction: OffloadingConnector under VLLM_KV_CACHE_LAYOUT=LHBNC offloads the wrong bytes.

vLLM 0.33.0. Needs only vllm, torch and the standard library; runs on CPU in well under a minute
(most of it is ``import vllm``):

    python docs/findings/repro_offloading_lhbnc_packed_row_misdetection.py

Exit status: 1 when the bug is present (the store for some (layer, block) does not copy exactly
that block's bytes), 0 when every block is copied exactly, or when register_kv_caches refuses
the layout with an error (a loud refusal is an acceptable fix: no silent corruption).

What is real (vLLM's own code, unchanged):
  * compute_layout_strides (the placement get_kv_cache_config_from_groups computes for two
    layers in LHBNC), KVCacheConfig, FullAttentionSpec;
  * allocate_kv_cache(..., KVCacheLayout.LHBNC): the per-layer [B, H, N, C] views
    GPUModelRunner.initialize_kv_cache_tensors passes to connector.register_kv_caches();
  * OffloadingConnectorWorker.register_kv_caches (offloading/worker.py): derive_canonical_mappings,
    group_kernel_blocks, the (num_blocks, page) byte views, the packed-row detection, and the
    CanonicalKVCaches it hands to the tier's spec.get_worker();
  * compute_sub_block_ptrs (kv_offload/cpu/gpu_worker.py): the CPU tier's own computation of the
    GPU-side address of each copy; the copy size is the ref's page_size_bytes, as in
    SingleDirectionOffloadingHandler._fill_direct_ops.

What is faked, and why:
  * the OffloadingSpec: CPUOffloadingSpec.get_worker refuses non-CUDA platforms and its worker
    needs CUDA streams/events, pinned memory and a /dev/shm region; the stand-in only records the
    CanonicalKVCaches that register_kv_caches hands it (the complete description of what every
    later store/load copies);
  * VllmConfig: it cannot be built without a device/model. The worker reads only
    parallel_config (a real default ParallelConfig: TP=1) and
    model_config.get_total_num_kv_heads() (8, the layer's KV heads at TP=1);
  * cuMemcpyBatchAsync (ops.swap_blocks_batch): the round trip at the end copies the same
    (address, size) descriptors with torch slices on the CPU "GPU" pool.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import torch

from vllm.config import ParallelConfig
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.worker import (
    OffloadingConnectorWorker,
)
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    compute_layout_strides,
)
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.kv_offload.cpu.gpu_worker import compute_sub_block_ptrs
from vllm.v1.worker.utils import allocate_kv_cache

LAYERS = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
NUM_BLOCKS = 4
LAYOUT = KVCacheLayout.LHBNC  # VLLM_KV_CACHE_LAYOUT=LHBNC


def runs(mask: torch.Tensor) -> list[tuple[int, int]]:
    """[start, end) runs of True in a flat bool tensor."""
    idx = mask.nonzero().flatten()
    if idx.numel() == 0:
        return []
    breaks = (idx[1:] != idx[:-1] + 1).nonzero().flatten()
    starts = torch.cat([idx[:1], idx[breaks + 1]]).tolist()
    ends = (torch.cat([idx[breaks], idx[-1:]]) + 1).tolist()
    return list(zip(starts, ends))


def fmt(rs: list[tuple[int, int]], limit: int = 3) -> str:
    shown = " ".join(f"[{a}, {b})" for a, b in rs[:limit]) or "nothing"
    return shown + (f" +{len(rs) - limit} more" if len(rs) > limit else "")


class RecordingSpec:
    """Stands in for CPUOffloadingSpec: records what register_kv_caches hands the tier."""

    replicated_layout = False
    config = SimpleNamespace(canonical_layout=False, parallel=SimpleNamespace(rank=0))

    def __init__(self) -> None:
        self.canonical = None

    def get_worker(self, kv_caches):
        self.canonical = kv_caches
        return SimpleNamespace()  # the tier's worker; not exercised here


def main() -> int:
    # Two Qwen3-like layers: 8 KV heads x head_size 128, bf16, 128-token blocks (FLASH_ATTN
    # takes 128-token kernel blocks, so there is no kernel split here).
    spec = FullAttentionSpec(block_size=128, num_kv_heads=8, head_size=128, dtype=torch.bfloat16)
    page = spec.page_size_bytes
    layer_stride, block_stride, head_stride, *_ = compute_layout_strides(
        spec, NUM_BLOCKS, len(LAYERS), LAYOUT
    )
    kv_cache_config = KVCacheConfig(
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[
            KVCacheTensor(
                size=len(LAYERS) * NUM_BLOCKS * page,
                layers=list(LAYERS),
                layer_stride=layer_stride,
                block_stride=block_stride,
            )
        ],
        kv_cache_groups=[KVCacheGroupSpec(list(LAYERS), spec)],
    )
    kv_caches = allocate_kv_cache(kv_cache_config, torch.device("cpu"), LAYOUT)
    view0 = kv_caches[LAYERS[0]]
    storage = view0.untyped_storage()
    pool = torch.empty(0, dtype=torch.int8).set_(storage)
    base = pool.data_ptr()
    print(f"vLLM {__import__('vllm').__version__}, layout {LAYOUT.name}: per-layer view "
          f"{tuple(view0.shape)} [B, H, N, C], page {page} B; byte strides: layer "
          f"{layer_stride}, head {head_stride}, block {block_stride} "
          f"(= view stride(0) {view0.stride(0) * view0.element_size()})")

    vllm_config = SimpleNamespace(  # stand-in: only the fields the worker reads
        parallel_config=ParallelConfig(),
        model_config=SimpleNamespace(get_total_num_kv_heads=lambda: spec.num_kv_heads),
    )
    tier = RecordingSpec()
    worker = OffloadingConnectorWorker(tier, vllm_config, kv_cache_config)
    try:
        worker.register_kv_caches(kv_caches)
    except (AssertionError, ValueError, NotImplementedError, RuntimeError) as exc:
        print(f"register_kv_caches refused the layout: {type(exc).__name__}: {exc}")
        print("OK (fixed by refusal): nothing is offloaded from a layout it cannot address")
        return 0

    canonical = tier.canonical
    print("CanonicalKVCaches handed to the tier:")
    for i, t in enumerate(canonical.tensors):
        print(f"  tensor {i}: shape {tuple(t.tensor.shape)} stride {t.tensor.stride()} at pool "
              f"offset {t.tensor.data_ptr() - base}, page_size_bytes {t.page_size_bytes}")
    for g, refs in enumerate(canonical.group_data_refs):
        print(f"  group {g} refs: {[(r.tensor_idx, r.page_size_bytes) for r in refs]}")

    # The GPU tensors the CPU tier builds from them (CPUOffloadingWorker.__init__).
    gpu_tensors = [
        t.tensor.view(torch.int8).view((-1, t.page_size_bytes)) for t in canonical.tensors
    ]

    def store_descriptors(group: int, block: int) -> list[tuple[int, int]]:
        """(pool offset, size) of each GPU-side copy of a one-block store of ``block``."""
        out = []
        for ref in canonical.group_data_refs[group]:
            # The tier passes numpy arrays; make them via torch (no direct numpy import).
            ptr = torch.zeros(1, dtype=torch.int64).numpy()
            block_ids = torch.tensor([block], dtype=torch.int64).numpy()
            compute_sub_block_ptrs(block_ids, 1, ptr, gpu_tensors[ref.tensor_idx])
            out.append((int(ptr[0]) - base, ref.page_size_bytes))
        return out

    def owned(layer: str, block: int) -> torch.Tensor:
        """Pool bytes of ``layer``'s block ``block`` (its [H, N, C] elements), as a mask."""
        view = kv_caches[layer]
        el = view.element_size()
        elems = torch.arange(storage.nbytes() // el).as_strided(
            view.shape, view.stride(), view.storage_offset()
        )[block].flatten()
        mask = torch.zeros(storage.nbytes() // el, el, dtype=torch.bool)
        mask[elems] = True
        return mask.flatten()

    moved_mask = torch.zeros(storage.nbytes(), dtype=torch.bool)
    for off, size in store_descriptors(0, 1):
        moved_mask[off : off + size] = True
    moved_total = int(moved_mask.sum())
    bug = False
    print("store of logical block 1 (group 0):")
    print(f"  copies pool bytes {fmt(runs(moved_mask))} ({moved_total} B in all)")
    for layer in LAYERS:
        own = owned(layer, 1)
        hit = int((own & moved_mask).sum())
        print(f"  {layer} block 1 is {int(own.sum())} B at {fmt(runs(own))}: "
              f"{hit} B of it copied")
    expected = torch.zeros_like(moved_mask)
    for layer in LAYERS:
        expected |= owned(layer, 1)
    foreign = int((moved_mask & ~expected).sum())
    print(f"  bytes copied that are not block 1 of this group: {foreign}")
    for block in range(NUM_BLOCKS):
        m = torch.zeros_like(moved_mask)
        for off, size in store_descriptors(0, block):
            m[off : off + size] = True
        e = torch.zeros_like(moved_mask)
        for layer in LAYERS:
            e |= owned(layer, block)
        bug |= not torch.equal(m, e)

    # Round trip through the same descriptors: store block 1, load it into block 2.
    gen = torch.Generator().manual_seed(0)
    pool.copy_(torch.randint(-128, 128, (pool.numel(),), dtype=torch.int8, generator=gen))
    snapshot = {layer: kv_caches[layer][1].clone() for layer in LAYERS}
    host = [pool[off : off + size].clone() for off, size in store_descriptors(0, 1)]
    for (off, size), data in zip(store_descriptors(0, 2), host):
        pool[off : off + size] = data
    print("round trip (store block 1, load into block 2):")
    for layer in LAYERS:
        got = kv_caches[layer][2].view(torch.int8)
        want = snapshot[layer].view(torch.int8)
        same = int((got == want).sum())
        print(f"  {layer}: {same} of {want.numel()} bytes of block 2 equal block 1's "
              f"(random bytes match by chance ~1/256)")
        bug |= same != want.numel()

    if bug:
        print("BUG PRESENT: under LHBNC register_kv_caches took stride(0) != page as a packed "
              "row and offloads as_strided((num_blocks, stride(0)), storage_offset=0): layer 0, "
              "head 0 only")
        return 1
    print("OK: every (layer, block) is stored and loaded exactly")
    return 0


if __name__ == "__main__":
    sys.exit(main())
