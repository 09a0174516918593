#!/usr/bin/env python
"""Standalone reproduction: UMBPStoreConnector moves each layer's page as one
contiguous run under VLLM_KV_CACHE_LAYOUT=BHLNC (vLLM 0.33.0).

Run on CPU, no GPU and no UMBP/MORI install needed:

    python repro_umbp_bhlnc_layer_page_as_one_run.py

Imports only vllm, torch and the standard library. Exits 1 while the bug is
present, 0 once every planned range lies exactly on the bytes its layer owns (or
once register_kv_caches refuses these caches with a clear error).

What runs for real (vLLM's own code):
  * config/planning: VllmConfig, resolve_kv_cache_layout (VLLM_KV_CACHE_LAYOUT=BHLNC,
    FlashAttentionBackend's supported layouts), get_kv_cache_config_from_groups,
    allocate_kv_cache (the per-layer [B, H, N, C] views the model runner registers);
  * the connector, worker role: UMBPStoreConnector(vllm_config, WORKER, kv_cache_config)
    -> KVLayoutPlanner.from_kv_cache_config, UMBPStoreConnectorWorker;
    conn.register_kv_caches -> KVLayoutPlanner.register_kv_caches (data.py ~358);
  * one engine step that stores block 1 and one that loads it back into block 2, sent
    the way the scheduler sends them (BlockStoreBatch / BlockLoadBatch in
    UMBPConnectorMetadata, keys from the connector's own BlockIdentityCodec), through
    bind_connector_metadata / start_load_kv / wait_for_save / get_finished, which
    materialize every plan with KVLayoutPlanner._ranges_for_block (data.py ~434-500).

What is faked (the external service only): the UMBP runtime. vLLM ships only its
registry (UMBPRuntimeFactory, empty; MORI registers the real one), so FakeRuntime is
registered as the "embedded" mode. Its worker handle keeps each stored object in a
bytearray and copies every KVRange [base_address, +length) to/from object_offset
with ctypes.memmove; jobs complete synchronously. Nothing else is patched.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import sys

# The user-facing trigger: resolve the KV cache layout to BHLNC.
os.environ["VLLM_KV_CACHE_LAYOUT"] = "BHLNC"

import torch  # noqa: E402

from vllm.config import CacheConfig, DeviceConfig, KVTransferConfig, VllmConfig  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.umbp.connector import UMBPStoreConnector  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.umbp.data import (  # noqa: E402
    BlockLoadBatch,
    BlockStoreBatch,
    TransferJobState,
    UMBPConnectorMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.umbp.runtime import UMBPRuntimeFactory  # noqa: E402
from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend  # noqa: E402
from vllm.v1.attention.backends.utils import (  # noqa: E402
    get_supported_kv_cache_layouts,
    resolve_kv_cache_layout,
)
from vllm.v1.core.kv_cache_planning import get_kv_cache_config_from_groups  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec  # noqa: E402
from vllm.v1.worker.utils import allocate_kv_cache  # noqa: E402

LAYERS = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
CONFIGS = [
    # name, block_size, num_blocks, KV cache dtype (8 KV heads x head_size 128, 2 layers)
    ("dense-fa-b128-bhlnc", 128, 4, torch.bfloat16),
    ("fp8-fa-b16-bhlnc", 16, 8, torch.float8_e4m3fn),
]


class FakeRuntime:
    """The UMBP runtime (IUMBPRuntime) and its worker handle (UMBPWorkerHandle)."""

    def __init__(self) -> None:
        self.objects: dict[str, bytearray] = {}
        self.stored: list = []
        self.loaded: list = []

    # IUMBPRuntime
    def create_worker_handle(self, namespace, topology, layout):
        return self

    def create_scheduler_handle(self, namespace, topology, layout):
        raise AssertionError("worker role only")

    # UMBPWorkerHandle
    def register_buffers(self, kv_caches) -> None:
        pass

    @staticmethod
    def _job(plans) -> TransferJobState:
        job = TransferJobState(plans=tuple(plans))
        job.start()
        return job

    def store(self, plans):
        self.stored.extend(plans)
        for plan in plans:
            size = max((r.object_offset + r.length for r in plan.ranges), default=0)
            obj = self.objects[plan.key] = bytearray(size)
            dst = (ctypes.c_char * size).from_buffer(obj)
            for r in plan.ranges:
                ctypes.memmove(ctypes.addressof(dst) + r.object_offset, r.base_address, r.length)
        job = self._job(plans)
        job.complete()
        return job

    def load(self, plans):
        self.loaded.extend(plans)
        for plan in plans:
            obj = self.objects[plan.key]
            src = (ctypes.c_char * len(obj)).from_buffer(obj)
            for r in plan.ranges:
                ctypes.memmove(r.base_address, ctypes.addressof(src) + r.object_offset, r.length)
        job = self._job(plans)
        job.complete()
        return job

    def wait(self, job):
        return job

    def poll(self, job):
        return job

    def publish(self, job) -> None:
        pass

    def cancel(self, job):
        return job

    def take_evicted_keys(self):
        return []

    def close(self) -> None:
        pass


RUNTIME: FakeRuntime | None = None


def _build_runtime(config) -> FakeRuntime:
    global RUNTIME
    RUNTIME = FakeRuntime()
    return RUNTIME


UMBPRuntimeFactory.register("embedded", _build_runtime)


def merge(runs):
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


def fmt(runs, limit=3):
    shown = " ".join(f"[{s}, {e})" for s, e in runs[:limit])
    return shown + (f" +{len(runs) - limit} more" if len(runs) > limit else "")


def step(conn, metadata) -> None:
    """One engine step's worker hooks, as the model runner calls them."""
    conn.bind_connector_metadata(metadata)
    conn.start_load_kv(None)
    conn.wait_for_save()
    conn.get_finished(set())
    conn.clear_connector_metadata()


def run_config(name: str, block_size: int, num_blocks: int, dtype: torch.dtype) -> bool:
    """Returns True when the planned ranges are wrong (the bug)."""
    vc = VllmConfig(
        device_config=DeviceConfig(device="cpu"),
        cache_config=CacheConfig(block_size=block_size, num_gpu_blocks_override=num_blocks),
        # 0.33.0's KVConnectorFactory registry has no UMBPStoreConnector entry, so the
        # connector is selected by module path; "mode": "embedded" is its default mode.
        kv_transfer_config=KVTransferConfig(
            kv_connector="UMBPStoreConnector",
            kv_connector_module_path="vllm.distributed.kv_transfer.kv_connector.v1.umbp.connector",
            kv_role="kv_both",
            kv_connector_extra_config={"mode": "embedded"},
        ),
    )
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=8, head_size=128, dtype=dtype)
    supported = [layout.name for layout in get_supported_kv_cache_layouts([FlashAttentionBackend])]
    layout = resolve_kv_cache_layout(vc, [supported], [spec])  # -> BHLNC (from the env var)
    groups = [KVCacheGroupSpec(list(LAYERS), spec)]
    kcc = get_kv_cache_config_from_groups(vc, groups, num_blocks * len(LAYERS) * spec.page_size_bytes)
    kcc.kv_cache_layout = layout.name  # what EngineCore does before workers build connectors
    kv_caches = allocate_kv_cache(kcc, torch.device("cpu"), layout, [block_size])

    conn = UMBPStoreConnector(vc, KVConnectorRole.WORKER, kcc)
    try:
        conn.register_kv_caches(dict(kv_caches))  # accepted: stride(0) divides the planned block_stride
    except (ValueError, NotImplementedError) as exc:  # a clear refusal also counts as fixed
        print(f"== {name}: register_kv_caches refused the BHLNC caches: {exc}")
        return False
    codec = conn._codec(conn._namespace)
    runtime = RUNTIME
    assert runtime is not None

    c0 = kv_caches[LAYERS[0]]
    storage = c0.untyped_storage()
    pool_base, pool_len = storage.data_ptr(), storage.nbytes()
    el = c0.element_size()
    pool = torch.empty(0, dtype=torch.uint8).set_(storage)
    print(f"== {name}: FLASH_ATTN-shaped FullAttentionSpec, {len(LAYERS)} layers, 8 KV heads x 128, "
          f"{str(dtype).removeprefix('torch.')}, block_size {block_size}, {num_blocks} blocks, "
          f"VLLM_KV_CACHE_LAYOUT={layout.name}")
    tensor = kcc.kv_cache_tensors[0]
    print(f"   pool {pool_len} bytes; KVCacheTensor layer_stride {tensor.layer_stride}, block_stride "
          f"{tensor.block_stride}; view strides (bytes) {tuple(s * el for s in c0.stride())}; "
          f"page_size_bytes {spec.page_size_bytes}")

    # Random pool contents; store block 1, clear block 2, load block 1's object into block 2.
    gen = torch.Generator().manual_seed(0)
    pool.copy_(torch.randint(1, 256, (pool_len,), dtype=torch.uint8, generator=gen))
    src, dst = 1, 2
    block_hash = hashlib.sha256(f"repro:{name}".encode()).digest()
    key = codec.key(block_hash, 0)
    store = BlockStoreBatch([key], [src], [0], [block_hash], [None], [()], [block_size], "req-store")
    step(conn, UMBPConnectorMetadata(store_requests={"req-store": store}))
    for name_ in LAYERS:
        kv_caches[name_][dst].zero_()
    before = pool.clone()
    first = len(runtime.loaded)
    load = BlockLoadBatch([key], [dst], [0], "req-load")
    step(conn, UMBPConnectorMetadata(async_load=True, load_requests={"req-load": load}))
    plans = runtime.loaded[first:]

    buggy = False
    for layer in LAYERS:
        owned = owned_runs(kv_caches[layer][dst], pool_base)
        ranges = [r for plan in plans for r in plan.ranges if r.layer_name == layer]
        planned = merge((r.base_address - pool_base, r.base_address - pool_base + r.length) for r in ranges)
        short = layer.removeprefix("model.").removesuffix(".self_attn.attn")
        print(f"   {short} block {dst}: owns {sum(e - s for s, e in owned)} bytes at {fmt(owned)}")
        print(f"   {'':{len(short)}} planned {len(ranges)} range(s), {sum(r.length for r in ranges)} bytes "
              f"at {fmt(planned)}")
        buggy |= planned != owned

    # What the round trip did to the cache.
    for layer in LAYERS:
        got, want = kv_caches[layer][dst], kv_caches[layer][src]
        diff = (got.view(torch.uint8) != want.view(torch.uint8)).sum().item()
        total = got.numel() * el
        short = layer.removeprefix("model.").removesuffix(".self_attn.attn")
        print(f"   round trip block {src} -> {dst}, {short}: {diff} of {total} bytes differ from block {src}")
    owned_all = merge(r for layer in LAYERS for r in owned_runs(kv_caches[layer][dst], pool_base))
    stray = pool != before
    for s, e in owned_all:
        stray[s:e] = False
    if stray.any():
        print(f"   the load also wrote {int(stray.sum())} bytes outside block {dst}")
    return buggy


def main() -> int:
    bug = False
    for cfg in CONFIGS:
        bug |= run_config(*cfg)
    if bug:
        print("RESULT: BUG PRESENT - KVLayoutPlanner plans each layer's page as one contiguous run of "
              "page_size_bytes from the layer's base; under BHLNC a layer's page is one run per KV head, "
              "so ranges cover other layers' heads and miss the layer's own last heads")
        return 1
    print("RESULT: OK - every planned range lies on the bytes its layer owns")
    return 0


if __name__ == "__main__":
    sys.exit(main())
