"""Standalone reproduction: LMCache reads vLLM's kernel block split as slot compression.

LMCache 0.5.6 (multi-process mode, LMCacheMPConnector) with vLLM 0.33.0. Needs vllm, lmcache,
torch and the standard library; runs on CPU in well under a minute. Run it in a venv that has
both packages, e.g. kvconform's:

    bash scripts/lmcache_env.sh python docs/findings/repro_lmcache_kernel_split_as_compression.py

Exit status: 1 when the bug is present (storing logical block b does not read exactly block b's
bytes, or loading it back does not write exactly them), 0 when every block round-trips exactly,
or when LMCache refuses the registration with an error (a loud refusal is an acceptable fix).

Configuration: 2 Qwen3-like attention layers (8 KV heads x head 128, bf16), FLASHINFER,
--block-size 128, 4 blocks, layout LBNHC (FlashInfer NHD; vLLM's default for FlashInfer).
FlashInfer's kernels take 16/32/64-token pages, so vLLM's select_common_block_size picks 64 and
registers each layer as (8 kernel blocks, 8 heads, 64 tokens, 256) -- two kernel blocks per
logical 128-token block id. The scheduler (and LMCache's connector) address logical block ids.

What is real (the packages' own code, unchanged):
  * vLLM: FlashInferBackend.get_supported_kernel_block_sizes + select_common_block_size (the
    kernel block size), compute_layout_strides (the placement get_kv_cache_config_from_groups
    computes for LBNHC), allocate_kv_cache(..., kernel_block_sizes) (the views
    GPUModelRunner.initialize_kv_cache_tensors passes to connector.register_kv_caches());
  * LMCache worker side, as LMCacheMPConnector.register_kv_caches runs it
    (lmcache/integration/vllm/lmcache_mp_connector.py:859-884): translate_vllm_kv_cache_layout
    (vllm_layout_hints), apply_kv_cache_group_edits, create_engine_group_infos_from_vllm;
  * LMCache server side, as LMCacheDrivenTransferModule.register_kv_cache / store / retrieve run
    it (lmcache/v1/multiprocess/modules/lmcache_driven_transfer.py:483, 698, 781):
    create_cache_context (CPU cache context: format detection, KVLayerGroupsManager),
    get_layout_desc, downsample_and_stage_block_ids, transfer_kv_per_object_group with
    LMCache's own torch device ops (its CPU path).

What is faked, and why:
  * the ZMQ transport and CUDA IPC between vLLM's worker and the LMCache server: the server-side
    calls get the registered tensors and the block ids directly (CUDA IPC maps the same memory);
  * the L1 storage manager: the destination memory object comes from LMCache's own
    AdHocMemoryAllocator (a plain CPU buffer of the size get_layout_desc asks for) instead of
    the pinned L1 pool; nothing about the bytes copied depends on which allocator made it;
  * VLLM_TARGET_DEVICE=cuda (env): the CUDA target whose backends and layouts are modelled;
    the tensors live in CPU memory.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cuda")  # model the CUDA target, not vLLM's CPU platform
os.environ.setdefault("LMCACHE_LOG_LEVEL", "WARNING")

import torch

from vllm.v1.attention.backends.flashinfer import FlashInferBackend
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    compute_layout_strides,
)
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.worker.utils import allocate_kv_cache, select_common_block_size

import lmcache
import lmcache.lmcache_native as lmcache_native  # LMCache's TransferDirection enum
from lmcache.integration.vllm.kv_cache_group_edits import apply_kv_cache_group_edits
from lmcache.integration.vllm.kv_cache_groups import create_engine_group_infos_from_vllm
from lmcache.integration.vllm.utils import translate_vllm_kv_cache_layout
from lmcache.utils import EngineType
from lmcache.v1.memory_allocators.ad_hoc_memory_allocator import AdHocMemoryAllocator
from lmcache.v1.multiprocess.modules.lmcache_driven_transfer import get_layout_desc
from lmcache.v1.multiprocess.object_group_transfer import (
    downsample_and_stage_block_ids,
    transfer_kv_per_object_group,
)
from lmcache.v1.platform.cache_context import create_cache_context

LAYERS = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
BLOCK = 128  # --block-size 128 (logical block: what the scheduler and the connector address)
NUM_BLOCKS = 4
CHUNK = BLOCK  # LMCache chunk size: one logical block per chunk (any multiple of 128 behaves alike)
LAYOUT = KVCacheLayout.LBNHC


class SharedTensorHandle:
    """Stands in for LMCache's CUDA IPC tensor wrapper (lmcache.v1.platform.kv_wrap): the server
    maps the very memory the worker registered, so to_tensor() returns the tensor itself."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor
        self.shape, self.stride, self.dtype = tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype
        self.storage_offset = int(tensor.storage_offset())

    def to_tensor(self) -> torch.Tensor:
        return self.tensor


def runs(mask: torch.Tensor) -> list[tuple[int, int]]:
    idx = mask.nonzero().flatten()
    if idx.numel() == 0:
        return []
    breaks = (idx[1:] != idx[:-1] + 1).nonzero().flatten()
    starts = torch.cat([idx[:1], idx[breaks + 1]]).tolist()
    ends = (torch.cat([idx[breaks], idx[-1:]]) + 1).tolist()
    return list(zip(starts, ends))


def fmt(rs, limit=3) -> str:
    shown = " ".join(f"[{a}, {b})" for a, b in rs[:limit]) or "nothing"
    return shown + (f" +{len(rs) - limit} more" if len(rs) > limit else "")


def main() -> int:
    # --- vLLM: the registered tensors ----------------------------------------------------------
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=8, head_size=128, dtype=torch.bfloat16)
    kernel_block = select_common_block_size(BLOCK, [FlashInferBackend], [spec])
    layer_stride, block_stride, *_ = compute_layout_strides(spec, NUM_BLOCKS, len(LAYERS), LAYOUT)
    kcc = KVCacheConfig(
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[KVCacheTensor(size=len(LAYERS) * NUM_BLOCKS * spec.page_size_bytes, layers=list(LAYERS),
                                        layer_stride=layer_stride, block_stride=block_stride)],
        kv_cache_groups=[KVCacheGroupSpec(list(LAYERS), spec)],
    )
    kv_caches = allocate_kv_cache(kcc, torch.device("cpu"), LAYOUT, [kernel_block])
    storage = kv_caches[LAYERS[0]].untyped_storage()
    pool = torch.empty(0, dtype=torch.int8).set_(storage)
    base = pool.data_ptr()
    print(f"vLLM {__import__('vllm').__version__} + LMCache {lmcache.__version__}; FlashInfer kernel block sizes "
          f"{FlashInferBackend.get_supported_kernel_block_sizes()} -> kernel block {kernel_block} for block {BLOCK}")
    for n, t in kv_caches.items():
        print(f"  view {n}: shape {tuple(t.shape)} stride {t.stride()} at pool offset {t.data_ptr() - base}; "
              f"logical page {spec.page_size_bytes} B = {BLOCK // kernel_block} kernel blocks of {t[0].nbytes} B")

    # --- LMCache worker side (LMCacheMPConnector.register_kv_caches) ---------------------------
    layout_hints = {"kv_layout": translate_vllm_kv_cache_layout(LAYOUT.name)}  # = vllm_layout_hints()
    try:
        edited = apply_kv_cache_group_edits(kcc, kv_caches, layout_hints=layout_hints)
        infos = create_engine_group_infos_from_vllm(kcc, edited, layout_hints=layout_hints, dcp_size=1)
        print(f"  apply_kv_cache_group_edits: {'re-viewed' if any(edited[n] is not kv_caches[n] for n in LAYERS) else 'unchanged (no Mamba layers)'}")
        print(f"  EngineGroupInfo tokens_per_block = {[i.tokens_per_block for i in infos]} (the spec's block size)")
        # --- LMCache server side (register_kv_cache -> create_cache_context) -------------------
        ctx = create_cache_context([SharedTensorHandle(edited[n]) for n in LAYERS], CHUNK, layout_hints=layout_hints,
                                   engine_group_infos=infos, engine_type=EngineType.VLLM)
    except (AssertionError, ValueError, NotImplementedError, RuntimeError) as exc:
        print(f"LMCache refused the registration: {type(exc).__name__}: {exc}")
        print("OK (fixed by refusal): nothing is stored from a layout it cannot address")
        return 0
    mgr = ctx.kv_layer_groups_manager
    g = mgr._kernel_groups[0]
    print(f"  KVLayerGroupsManager group 0: tokens_per_block {g.tokens_per_block}, slots_per_block "
          f"{g.slots_per_block} -> calculate_num_blocks({CHUNK}) = {ctx.calculate_num_blocks(CHUNK, 0)} block id(s) "
          f"per chunk, {mgr.get_slots_per_chunk_in_sw(0)} slots per chunk")
    layout_desc = get_layout_desc(ctx, CHUNK, object_group_id=0)
    print(f"  memory object per chunk: shapes {[tuple(s) for s in layout_desc.shapes]} "
          f"= {sum(s.numel() for s in layout_desc.shapes) * 2} B, for {len(LAYERS)} layers x {spec.page_size_bytes} B "
          f"of KV per logical block")

    D2H = lmcache_native.TransferDirection.D2H
    H2D = lmcache_native.TransferDirection.H2D

    def transfer(block: int, mo, direction) -> None:
        """The server's store (D2H) / retrieve (H2D) of one chunk whose block ids are [block]."""
        block_ids = [[block]]  # the connector's logical block ids, one group
        staged = downsample_and_stage_block_ids(ctx, block_ids)
        transfer_kv_per_object_group(ctx, staged, [mo], object_group_id=0, batch_size=1, skip_first_n_tokens=0,
                                     direction=direction, transfer_key="repro", block_ids_host=block_ids)

    def owned(block: int) -> torch.Tensor:
        """Pool bytes of logical block `block` of every layer: its kernel blocks [2b, 2b+1]."""
        mask = torch.zeros(storage.nbytes(), dtype=torch.bool)
        ratio = BLOCK // kernel_block
        for n in LAYERS:
            view = kv_caches[n]
            el = view.element_size()
            idx = torch.arange(storage.nbytes() // el).as_strided(view.shape, view.stride(), view.storage_offset())
            m = torch.zeros(storage.nbytes() // el, el, dtype=torch.bool)
            m[idx[block * ratio:(block + 1) * ratio].flatten()] = True
            mask |= m.flatten()
        return mask

    # Every 4-byte word of the pool holds its own word index, so a stored object names the pool
    # bytes it was read from.
    words = pool.view(torch.int32)
    allocator = AdHocMemoryAllocator(device="cpu")
    bug = False
    for block in range(NUM_BLOCKS):
        words.copy_(torch.arange(words.numel(), dtype=torch.int32))
        mo = allocator.allocate(layout_desc.shapes, layout_desc.dtypes)
        mo.raw_data.zero_()
        transfer(block, mo, D2H)
        read = torch.zeros(storage.nbytes(), dtype=torch.bool)
        src = mo.raw_data.view(torch.int32).long()
        for off in (0, 1, 2, 3):
            read[src * 4 + off] = True
        # Load it back in place from an object of 0xFF bytes: the 0xFF bytes in the zeroed pool
        # are the ones the load writes.
        mo.raw_data.fill_(255)
        pool.zero_()
        transfer(block, mo, H2D)
        written = pool.view(torch.uint8) == 255
        mo.ref_count_down()
        want = owned(block)
        exact = torch.equal(read, want) and torch.equal(written, want)
        bug |= not exact
        if block in (0, 1):
            print(f"logical block {block}: owned {int(want.sum())} B at {fmt(runs(want))}")
            print(f"  store reads  {int(read.sum())} B at {fmt(runs(read))}")
            print(f"  load writes  {int(written.sum())} B at {fmt(runs(written))}")

    # Round trip: store logical block 1, load it as logical block 2 (a prefix hit of a new request).
    gen = torch.Generator().manual_seed(0)
    pool.copy_(torch.randint(-128, 128, (pool.numel(),), dtype=torch.int8, generator=gen))
    snapshot = {n: kv_caches[n].clone() for n in LAYERS}
    mo = allocator.allocate(layout_desc.shapes, layout_desc.dtypes)
    transfer(1, mo, D2H)
    transfer(2, mo, H2D)
    mo.ref_count_down()
    r = BLOCK // kernel_block
    for n in LAYERS:
        got = kv_caches[n][2 * r:3 * r].view(torch.int8)
        src_blk = snapshot[n][1 * r:2 * r].view(torch.int8)
        same = int((got == src_blk).sum())
        clobbered = int((kv_caches[n][1 * r:2 * r].view(torch.int8) != src_blk).sum())
        print(f"round trip 1 -> 2, {n}: {same} of {src_blk.numel()} B of block 2 equal block 1's; "
              f"{clobbered} B of block 1 overwritten (random bytes match by chance ~1/256)")
        bug |= same != src_blk.numel() or clobbered != 0

    if bug:
        print("BUG PRESENT: LMCache takes tokens_per_block 128 from the spec and 64 slots per registered "
              "block as 2:1 compression; logical block b moves kernel block b (half of the block, "
              "from the wrong place) instead of kernel blocks 2b and 2b+1")
        return 1
    print("OK: every logical block is stored and loaded exactly")
    return 0


if __name__ == "__main__":
    sys.exit(main())
