#!/usr/bin/env python
"""Standalone reproduction: MooncakeStoreConnector moves whole block rows per head
region under VLLM_KV_CACHE_LAYOUT=BHLNC (vLLM 0.33.0).

Run on CPU, no GPU and no Mooncake install needed:

    python repro_mooncake_store_bhlnc_head_region_length.py

Imports only vllm, torch and the standard library. Exits 1 while the bug is
present, 0 once the planned buffers cover exactly the bytes of the block (or once
registration refuses these caches with a clear error).

What runs for real (vLLM's own code):
  * config/planning: VllmConfig, resolve_kv_cache_layout (VLLM_KV_CACHE_LAYOUT=BHLNC,
    FlashAttentionBackend's supported layouts), get_kv_cache_config_from_groups,
    allocate_kv_cache (the same per-layer [B, H, N, C] views the model runner
    registers with connectors);
  * the connector's store-side objects, built the way MooncakeStoreWorker.__init__
    builds them: resolve_kv_cache_block_sizes, MooncakeStoreCoordinator.
    from_kv_cache_config, ChunkedTokenDatabase (its default RankLocalStoreLayout);
  * registration: the exact steps of MooncakeStoreWorker.register_kv_caches for the
    non-HiSparse path (worker.py ~1753-1779): group_kernel_blocks on each layer cache,
    store.register_buffer once per backing storage, then
    db.store_layout.register_kv_caches(cache_tensors, num_blocks)  <- data.py ~268-304;
  * the load path: KVCacheStoreRecvingThread._handle_request (the body of the receive
    thread's run loop), which calls RankLocalStoreLayout.prepare_values and hands the
    result to store.batch_get_into_multi_buffers.

What is faked (the external service only): FakeMooncakeStore stands in for
mooncake.store.MooncakeDistributedStore. It implements the two calls the path
makes: register_buffer (records the region) and batch_get_into_multi_buffers with
Mooncake's multi-buffer semantics (the object is scattered into the buffers in
order). It holds an object for every key, of exactly the requested size, filled with
0xA5, as if a put of the same shape had stored it. Before copying it checks every
buffer against the registered regions: a real transfer engine would either fail such
a transfer or, for a local copy, write outside the KV pool; the fake refuses and
reports it instead of corrupting this process.

MooncakeStoreWorker itself is not constructed: its __init__ needs a model config and
a running Mooncake master; the objects it builds are built here directly.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading

# The user-facing trigger: resolve the KV cache layout to BHLNC.
os.environ["VLLM_KV_CACHE_LAYOUT"] = "BHLNC"

import torch  # noqa: E402

from vllm.config import CacheConfig, DeviceConfig, KVTransferConfig, VllmConfig  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.coordinator import (  # noqa: E402
    MooncakeStoreCoordinator,
)
from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.data import (  # noqa: E402
    ChunkedTokenDatabase,
    KeyMetadata,
    LoadSpec,
    ReqMeta,
)
from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.worker import (  # noqa: E402
    KVCacheStoreRecvingThread,
)
from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend  # noqa: E402
from vllm.v1.attention.backends.utils import (  # noqa: E402
    get_supported_kv_cache_layouts,
    resolve_kv_cache_layout,
)
from vllm.v1.core.kv_cache_planning import get_kv_cache_config_from_groups  # noqa: E402
from vllm.v1.core.kv_cache_utils import BlockHash, resolve_kv_cache_block_sizes  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheGroupSpec,
    group_kernel_blocks,
)
from vllm.v1.worker.utils import allocate_kv_cache  # noqa: E402

LAYERS = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
CONFIGS = [
    # name, block_size, num_blocks, KV cache dtype (8 KV heads x head_size 128, 2 layers)
    ("dense-fa-b128-bhlnc", 128, 4, torch.bfloat16),
    ("fp8-fa-b16-bhlnc", 16, 8, torch.float8_e4m3fn),
]


class FakeMooncakeStore:
    """Stand-in for mooncake.store.MooncakeDistributedStore (see module docstring)."""

    FILL = 0xA5

    def __init__(self) -> None:
        self.regions: list[tuple[int, int]] = []
        self.gets: list[tuple[str, list[tuple[int, int]]]] = []
        self.refused: list[tuple[int, int]] = []

    def register_buffer(self, addr: int, length: int) -> int:
        self.regions.append((addr, length))
        return 0

    def _inside(self, addr: int, n: int) -> bool:
        return any(a <= addr and addr + n <= a + length for a, length in self.regions)

    def batch_get_into_multi_buffers(self, keys, addrs, sizes) -> list[int]:
        out = []
        for key, key_addrs, key_sizes in zip(keys, addrs, sizes, strict=True):
            buffers = [(int(a), int(n)) for a, n in zip(key_addrs, key_sizes, strict=True)]
            self.gets.append((key, buffers))
            bad = [(a, n) for a, n in buffers if not self._inside(a, n)]
            if bad:
                self.refused.extend(bad)
                out.append(-1)  # refuse rather than write outside the pool
                continue
            for a, n in buffers:
                ctypes.memset(a, self.FILL, n)
            out.append(sum(n for _, n in buffers))
        return out


def merge(runs):
    """Merge (start, end) intervals."""
    out: list[list[int]] = []
    for s, e in sorted(runs):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [tuple(r) for r in out]


def owned_runs(view: torch.Tensor, pool_base: int):
    """The byte intervals (pool offsets) a strided view really covers."""
    el = view.element_size()
    n_el = view.untyped_storage().nbytes() // el
    idx = torch.arange(n_el, dtype=torch.int64).as_strided(
        view.shape, view.stride(), view.storage_offset()
    )
    starts = (idx.flatten().sort().values * el + (view.untyped_storage().data_ptr() - pool_base)).tolist()
    runs: list[list[int]] = []
    for s in starts:
        if runs and runs[-1][1] == s:
            runs[-1][1] = s + el
        else:
            runs.append([s, s + el])
    return merge(runs)


def runs_of(offsets: torch.Tensor):
    """Sorted byte offsets -> merged (start, end) intervals."""
    breaks = (offsets[1:] != offsets[:-1] + 1).nonzero().flatten() + 1
    bounds = [0, *breaks.tolist(), len(offsets)]
    return [(int(offsets[a]), int(offsets[b - 1]) + 1) for a, b in zip(bounds, bounds[1:])]


def fmt(runs, limit=3):
    shown = " ".join(f"[{s}, {e})" for s, e in runs[:limit])
    return shown + (f" +{len(runs) - limit} more" if len(runs) > limit else "")


def run_config(name: str, block_size: int, num_blocks: int, dtype: torch.dtype) -> bool:
    """Returns True when the planned buffers are wrong (the bug)."""
    vc = VllmConfig(
        device_config=DeviceConfig(device="cpu"),
        cache_config=CacheConfig(block_size=block_size, num_gpu_blocks_override=num_blocks),
        kv_transfer_config=KVTransferConfig(kv_connector="MooncakeStoreConnector", kv_role="kv_both"),
    )
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=8, head_size=128, dtype=dtype)
    supported = [layout.name for layout in get_supported_kv_cache_layouts([FlashAttentionBackend])]
    layout = resolve_kv_cache_layout(vc, [supported], [spec])  # -> BHLNC (from the env var)
    groups = [KVCacheGroupSpec(list(LAYERS), spec)]
    kcc = get_kv_cache_config_from_groups(vc, groups, num_blocks * len(LAYERS) * spec.page_size_bytes)
    kcc.kv_cache_layout = layout.name  # what EngineCore does before workers build connectors
    kv_caches = allocate_kv_cache(kcc, torch.device("cpu"), layout, [block_size])

    # --- the connector's objects, as MooncakeStoreWorker.__init__ builds them ---
    blk, hash_blk = resolve_kv_cache_block_sizes(kcc, vc)
    coord = MooncakeStoreCoordinator.from_kv_cache_config(kcc, vc, blk, hash_blk)
    meta = KeyMetadata(model_name="repro", tp_rank=0, pcp_rank=0, dcp_rank=0, pp_rank=0, group_id=0)
    db = ChunkedTokenDatabase(meta, spec.block_size, hash_block_size=hash_blk)
    store = FakeMooncakeStore()

    # --- MooncakeStoreWorker.register_kv_caches, non-HiSparse path (worker.py ~1753-1779) ---
    n_blocks = kcc.num_blocks
    cache_tensors = [group_kernel_blocks(kv_caches[name], n_blocks) for name in LAYERS]
    seen: set[int] = set()
    for cache in cache_tensors:
        storage = cache.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            store.register_buffer(storage.data_ptr(), storage.nbytes())
    try:
        db.store_layout.register_kv_caches(cache_tensors, n_blocks)  # data.py ~268 (the bug)
    except (ValueError, NotImplementedError) as exc:  # a clear refusal also counts as fixed
        print(f"== {name}: register_kv_caches refused the BHLNC caches: {exc}")
        return False

    c0 = cache_tensors[0]
    pool_base, pool_len = c0.untyped_storage().data_ptr(), c0.untyped_storage().nbytes()
    el = c0.element_size()
    print(f"== {name}: FLASH_ATTN-shaped FullAttentionSpec, {len(LAYERS)} layers, 8 KV heads x 128, "
          f"{str(dtype).removeprefix('torch.')}, block_size {block_size}, {n_blocks} blocks, "
          f"VLLM_KV_CACHE_LAYOUT={layout.name}")
    print(f"   pool {pool_len} bytes; view strides (bytes) {tuple(s * el for s in c0.stride())}; "
          f"layer page {spec.page_size_bytes} bytes")
    lay = db.store_layout
    print(f"   registered: {len(lay.kv_caches_base_addr)} regions at pool offsets "
          f"{[a - pool_base for a in lay.kv_caches_base_addr][:4]}..., block_len {sorted(set(lay.block_len))}")

    buggy = False
    thread = KVCacheStoreRecvingThread(store, coord, [db], blk, 0, threading.Event())
    for block_id in (num_blocks - 2, num_blocks - 1):
        owned = merge(r for name in LAYERS for r in owned_runs(kv_caches[name][block_id], pool_base))
        owned_bytes = sum(e - s for s, e in owned)
        # Pool bytes before the load: zero, so we can see exactly what the load wrote.
        raw = torch.empty(0, dtype=torch.uint8).set_(c0.untyped_storage())
        raw.zero_()
        first = len(store.gets)
        refused_before = len(store.refused)
        block_hash = BlockHash(f"repro-{name}-{block_id}".encode().ljust(32, b"\0"))
        req = ReqMeta(
            req_id=f"req-{block_id}",
            token_len_chunk=block_size,
            block_ids=([block_id],),
            block_hashes=[block_hash] * (block_size // hash_blk),
            load_spec=LoadSpec(vllm_cached_tokens=0, kvpool_cached_tokens=block_size, can_load=True,
                               token_len=block_size),
        )
        # One iteration of the receive thread's run loop: real load handler ->
        # prepare_values -> store.batch_get_into_multi_buffers.
        thread.request_queue.put(req)
        thread._handle_request(thread.request_queue.get())
        planned = [b for _, bufs in store.gets[first:] for b in bufs]
        planned_runs = merge((a - pool_base, a - pool_base + n) for a, n in planned)
        planned_bytes = sum(n for _, n in planned)
        past_end = max(0, max(e for _, e in planned_runs) - pool_len)
        stray = raw != 0
        for s, e in owned:
            stray[s:e] = False
        outside = stray.nonzero().flatten()
        print(f"   block {block_id}: owns {owned_bytes} bytes at {fmt(owned)}")
        print(f"            planned {len(planned)} buffers, {planned_bytes} bytes, covering {fmt(planned_runs)}"
              + (f"; runs {past_end} bytes past the end of the pool" if past_end else ""))
        if len(store.refused) > refused_before:
            print(f"            load refused by the fake store: {len(store.refused) - refused_before} buffers "
                  "outside the registered KV pool")
        elif len(outside):
            other = runs_of(outside)
            row = c0.stride(0) * el
            hit = sorted({o // row for o in (other[0][0], other[-1][1] - 1)})
            print(f"            load wrote {len(outside)} bytes outside block {block_id}, into block(s) "
                  f"{', '.join(map(str, hit))}: {fmt(other)}")
        ok = planned_runs == owned and planned_bytes == owned_bytes and not past_end
        buggy |= not ok
    return buggy


def main() -> int:
    bug = False
    for cfg in CONFIGS:
        bug |= run_config(*cfg)
    if bug:
        print("RESULT: BUG PRESENT - RankLocalStoreLayout registers one region per KV head with "
              "block_len = head_cache.stride(0)*elem (the whole block row) and prepare_values uses it "
              "as both the block stride and the transfer length")
        return 1
    print("RESULT: OK - planned buffers cover exactly the bytes each block owns")
    return 0


if __name__ == "__main__":
    sys.exit(main())
