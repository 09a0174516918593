"""Standalone reproduction: NixlConnector moves only 2048 of each 3072-byte sliding-window block.

vLLM 0.33.0. Needs only vllm, torch and the standard library; runs on CPU in well under a minute
(most of it is ``import vllm``):

    python docs/findings/repro_nixl_blhnc_hybrid_group_block_len.py

Exit status: 1 when the bug is present (the NIXL descriptors for some (layer, block) do not cover
exactly that block's bytes), 0 when every block is covered exactly, or when register_kv_caches
refuses the layout with an error (a loud refusal is an acceptable fix).

Configuration: 2 full-attention layers (2 KV heads x head 8) + 2 sliding-window layers
(window 64, 3 KV heads x head 8), bf16, FLASH_ATTN, block size 32, 8 blocks,
VLLM_KV_CACHE_LAYOUT=BLHNC, hybrid KV cache manager on (vLLM's default with NixlConnector
on CUDA), NixlConnector (pull), TP=1.

What is real (vLLM's own code, unchanged):
  * get_global_kv_cache_groups / get_kv_cache_config_from_groups (kv_cache_planning.py): three
    KV cache groups ([full x2], [swa], [swa]) aliasing one pool from byte 0, one 4096-byte row
    per block id;
  * allocate_kv_cache(..., KVCacheLayout.BLHNC): the per-layer views
    GPUModelRunner.initialize_kv_cache_tensors passes to connector.register_kv_caches();
  * NixlConnectorWorker.__init__, _sync_block_size_with_kernel, register_kv_caches (region
    dedup, block_len/block_stride per region, region_group_ids), register_local_xfer_handler /
    _build_fa_local (the local Nx5 strided descriptor table handed to prep_xfer_dlist) and
    _compute_desc_ids (the descriptor ids _read_blocks passes to make_prepped_xfer).

What is faked, and why (the same things vLLM's tests/v1/kv_connector/unit fake):
  * NixlWrapper: the nixl package / RDMA agent; the stand-in records register_memory and
    prep_xfer_dlist and does nothing else;
  * current_platform: a CUDA stand-in (device_type "cuda", NIXL memory type VRAM); the tensors
    live in CPU memory;
  * TP rank / world size (0 / 1): no torch.distributed group on this machine;
  * get_current_attn_backends[_and_specs]: they read constructed Attention layers from the
    static forward context; the stand-ins return FlashAttentionBackend and the layers' specs;
  * model_config: no HF model on disk; only the few fields read (use_mla=False, the
    compatibility-hash factors, ...);
  * scheduler_config.disable_hybrid_kv_cache_manager=False: what VllmConfig resolves on CUDA
    with NixlConnector (SupportsHMA); this CPU platform would otherwise turn HMA off.
"""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace
from unittest import mock

os.environ["VLLM_KV_CACHE_LAYOUT"] = "BLHNC"  # the triggering layout (set before import vllm)

import torch

from vllm.config import CacheConfig, DeviceConfig, KVTransferConfig, VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.nixl import base_worker as bw
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.worker import NixlConnectorWorker
from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend
from vllm.v1.core import kv_cache_planning as planning
from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheLayout, SlidingWindowSpec
from vllm.v1.worker.utils import allocate_kv_cache

BLOCK = 32
NUM_BLOCKS = 8
FULL = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
SWA = ["model.layers.2.self_attn.attn", "model.layers.3.self_attn.attn"]


class RecordingNixl:
    """Stands in for nixl_agent: records registrations and descriptor lists, nothing else."""

    def __init__(self, *args, **kwargs):
        self.registered, self.dlists = [], []

    def get_reg_descs(self, ranges, mem_type):
        return (list(ranges), mem_type)

    def register_memory(self, descs, backends=None):
        self.registered.append(descs)

    def prep_xfer_dlist(self, agent, descs, *args, **kwargs):
        self.dlists.append(descs)
        return len(self.dlists)

    def get_agent_metadata(self):
        return b"agent"

    def __getattr__(self, name):  # anything else the worker pokes: a no-op
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *a, **k: None


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
    specs = {n: FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=8, dtype=torch.bfloat16) for n in FULL}
    specs |= {
        n: SlidingWindowSpec(block_size=BLOCK, num_kv_heads=3, head_size=8, dtype=torch.bfloat16, sliding_window=64)
        for n in SWA
    }

    vc = VllmConfig(device_config=DeviceConfig(device="cpu"), cache_config=CacheConfig(block_size=BLOCK))
    object.__setattr__(vc, "model_config", SimpleNamespace(  # stand-in: the fields read
        supports_kv_cache_grouping=False, use_mla=False, enable_sleep_mode=False,
        dtype=torch.bfloat16, get_total_num_kv_heads=lambda: 2,
        model="kvconform/tiny-swa-hybrid", get_head_size=lambda: 8,  # compatibility hash factors
        get_total_num_hidden_layers=lambda: 4,
    ))
    vc.scheduler_config.disable_hybrid_kv_cache_manager = False  # CUDA + NixlConnector default
    vc.cache_config.kv_cache_layout = "BLHNC"
    vc.cache_config.num_gpu_blocks_override = NUM_BLOCKS
    object.__setattr__(vc, "kv_transfer_config", KVTransferConfig(
        kv_connector="NixlConnector", kv_role="kv_both", kv_buffer_device="cuda"))
    register_all_kvcache_specs(vc)

    groups = planning.get_global_kv_cache_groups(vc, [specs])
    per_block = planning._pool_bytes_per_block(vc, groups)
    kcc = planning.get_kv_cache_config_from_groups(vc, groups, NUM_BLOCKS * per_block)
    print(f"vLLM {__import__('vllm').__version__}, layout BLHNC, {kcc.num_blocks} blocks x {per_block} B per block id")
    for g, group in enumerate(kcc.kv_cache_groups):
        print(f"  KV cache group {g}: {group.layer_names}")
    for t in kcc.kv_cache_tensors:
        print(f"  KVCacheTensor layers={t.layers} offset={t.offset} layer_stride={t.layer_stride} block_stride={t.block_stride}")

    kv_caches = allocate_kv_cache(kcc, torch.device("cpu"), KVCacheLayout.BLHNC, [BLOCK] * len(kcc.kv_cache_groups))
    storage = next(iter(kv_caches.values())).untyped_storage()
    base = storage.data_ptr()
    pool = torch.empty(0, dtype=torch.int8).set_(storage)
    for n, t in kv_caches.items():
        print(f"  view {n}: shape {tuple(t.shape)} stride {t.stride()} at pool offset {t.data_ptr() - base} "
              f"(block page {t[0].nbytes} B)")

    layer_specs = [specs[n] for n in kv_caches]
    platform = SimpleNamespace(device_type="cuda", get_nixl_memory_type=lambda: "VRAM")
    fakes = {
        "NixlWrapper": RecordingNixl,
        "nixl_agent_config": None,
        "check_nixl_version": lambda *a, **k: None,
        "current_platform": platform,
        "get_tensor_model_parallel_rank": lambda: 0,
        "get_tensor_model_parallel_world_size": lambda: 1,
        "get_current_attn_backends": lambda *a, **k: [FlashAttentionBackend] * len(layer_specs),
        "get_current_attn_backends_and_specs": lambda *a, **k: ([FlashAttentionBackend] * len(layer_specs), layer_specs),
    }
    with mock.patch.multiple(bw, **{k: v for k, v in fakes.items() if hasattr(bw, k)}):
        worker = NixlConnectorWorker(vc, "engine-0", kcc)
        try:
            worker.register_kv_caches(kv_caches)
        except (AssertionError, ValueError, NotImplementedError, RuntimeError) as exc:
            print(f"register_kv_caches refused the layout: {type(exc).__name__}: {exc}")
            print("OK (fixed by refusal): nothing is transferred from a layout it cannot address")
            return 0
        finally:
            worker._handshake_initiation_executor.shutdown(wait=False)

    regions = worker.kv_caches_base_addr[worker.engine_id][worker.tp_rank]
    print("NIXL regions (register_kv_caches):")
    for i, addr in enumerate(regions):
        print(f"  region {i}: base pool offset {addr - base}, block_len {worker.block_len_per_layer[i]}, "
              f"block_stride {worker.block_stride_per_layer[i]}, group id {worker.region_group_ids[i]} "
              f"(-1 = shared by all groups), first layer {worker.region_names[i]}")

    # The local descriptor table NIXL prepped (register_local_xfer_handler -> prep_xfer_dlist):
    # Nx5 rows (addr, len, device, stride, count), one descriptor per (row, j < count).
    table = worker.src_blocks_data
    flat = [(int(a) + j * int(s), int(n)) for a, n, _, s, c in table.tolist() for j in range(int(c))]

    def moved(group: int, block: int, wire: list | None = None) -> torch.Tensor:
        """Pool bytes a READ of logical block `block` of `group` transfers (_read_blocks' ids);
        `wire` collects the descriptor sizes (overlapping descriptors count once in the mask)."""
        block_ids = [[] for _ in kcc.kv_cache_groups]
        block_ids[group] = [block]
        ids = worker._compute_desc_ids(
            block_ids=block_ids, dst_num_blocks=worker.dst_num_blocks[worker.engine_id],
            block_size_ratio=1, physical_blocks_per_logical=worker._physical_blocks_per_logical_kv_block,
            region_num_blocks=worker.dst_region_num_blocks.get(worker.engine_id) or None,
            region_group_ids=worker.region_group_ids or None,
            uses_region_group_mapping=worker._uses_region_group_mapping,
        )
        mask = torch.zeros(storage.nbytes(), dtype=torch.bool)
        for i in ids.tolist():
            addr, size = flat[i]
            mask[addr - base: addr - base + size] = True
            if wire is not None:
                wire.append(size)
        return mask

    def owned(layers: list[str], block: int) -> torch.Tensor:
        """Pool bytes of block `block` of these layers' views (their [H, N, C] elements)."""
        mask = torch.zeros(storage.nbytes(), dtype=torch.bool)
        for layer in layers:
            view = kv_caches[layer]
            el = view.element_size()
            elems = torch.arange(storage.nbytes() // el).as_strided(
                view.shape, view.stride(), view.storage_offset())[block].flatten()
            m = torch.zeros(storage.nbytes() // el, el, dtype=torch.bool)
            m[elems] = True
            mask |= m.flatten()
        return mask

    group_layers = [list(g.layer_names) for g in kcc.kv_cache_groups]
    bug = False
    print("planned (NIXL descriptors) vs owned (the views' bytes), block 1 of each group:")
    for g, layers in enumerate(group_layers):
        wire: list[int] = []
        m, e = moved(g, 1, wire), owned(layers, 1)
        print(f"  group {g} {layers}: owned {int(e.sum())} B at {fmt(runs(e))}; "
              f"NIXL moves {int(m.sum())} B at {fmt(runs(m))} ({len(wire)} descriptors, {sum(wire)} B "
              f"on the wire); missed {int((e & ~m).sum())} B, foreign {int((m & ~e).sum())} B")
    for g, layers in enumerate(group_layers):
        for b in range(kcc.num_blocks):
            bug |= not torch.equal(moved(g, b), owned(layers, b))

    # Round trip: "remote" pool with random bytes, READ block 1 of group 1 into a zeroed local pool
    # through the same descriptors (homogeneous P/D: the remote's table equals the local one).
    gen = torch.Generator().manual_seed(0)
    remote = torch.randint(-128, 128, (pool.numel(),), dtype=torch.int8, generator=gen)
    pool.zero_()
    m = moved(1, 1)
    pool[m] = remote[m]
    layer = group_layers[1][0]
    view = kv_caches[layer]
    remote_view = torch.empty(0, dtype=view.dtype).set_(remote.untyped_storage()).as_strided(
        view.shape, view.stride(), view.storage_offset())
    for h in range(view.shape[1]):
        same = torch.equal(view[1, h].view(torch.int8), remote_view[1, h].view(torch.int8))
        print(f"  round trip {layer} block 1 head {h}: {'transferred' if same else 'NOT transferred'}")
        bug |= not same

    if bug:
        print("BUG PRESENT: register_kv_caches dedups the sliding-window layer onto the full-attention "
              "region at the same base address and keeps its block_len 2048; "
              "each 3072-byte sliding-window block loses its last 1024 bytes (head 2)")
        return 1
    print("OK: every (group, block) is transferred exactly")
    return 0


if __name__ == "__main__":
    sys.exit(main())
