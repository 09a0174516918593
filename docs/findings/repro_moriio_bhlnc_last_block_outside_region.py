"""Standalone reproduction: MoRIIOConnector (vLLM 0.33.0) under VLLM_KV_CACHE_LAYOUT=BHLNC
registers a shared RDMA memory region that ends before the last block's bytes, so the READ
it plans for the highest block id leaves the registered region.

Exit 1 while the bug is present, 0 when fixed. vllm + torch + stdlib only, CPU.

What runs real (vLLM's own code): the BHLNC layout resolution, the KV cache config and
``allocate_kv_cache`` (the views each layer gets), ``build_layer_to_spec``,
``MoRIIOConnectorWorker._build_shared_kv_mr`` (the region MoRIIO registers; it sizes the
region from ``moriio_layout.iter_layer_registration_regions``), ``MoRIIOWrapper.register_local_tensor``,
``MoRIIOConnectorWorker._record_slice_layouts`` and ``_compute_read_attention_offsets`` (the
offsets ``_read_blocks`` posts, here on the head-slice path BHLNC takes), then
``MoRIIOWrapper.read_remote_data`` -> ``session.batch_read``.

What is faked: only ``mori.io`` (not installed; AMD RDMA). ``register_torch_tensor`` does what
mori's Python binding does (``mori/io/engine.py``: contiguous tensor, ``data_ptr()``,
``nelement() * element_size()`` bytes). ``batch_read`` takes offsets relative to the two
``MemoryDesc`` regions, as ``IOEngineSession::BatchRead`` does, and fails a read outside them,
as the NIC does for a work request outside the memory region (local protection / remote
access error). Nothing is copied.

The bare worker (``object.__new__``) holds only the attributes these methods read; the
peer is an identical engine (same layout), reached through its packed region metadata.

ROCm's ``allocate_kv_cache`` pads the pool to 4 KiB pages and the device allocator returns
page-aligned memory; a CPU tensor is not page-aligned, so the repro re-binds vLLM's views
(same shape, stride, storage offset) onto a page-aligned pool of the same size.
"""

from __future__ import annotations

import ctypes
import os
import sys
import types
from types import SimpleNamespace

os.environ["VLLM_KV_CACHE_LAYOUT"] = "BHLNC"  # the user-facing trigger


# --- the mori.io stand-in (must exist before vLLM's moriio modules import it) -------------------
class _Status:
    def __init__(self, message: str = "") -> None:
        self.message = message

    def Succeeded(self) -> bool:  # noqa: N802 (mori's API)
        return not self.message

    def Failed(self) -> bool:  # noqa: N802
        return bool(self.message)

    def Message(self) -> str:  # noqa: N802
        return self.message

    def Code(self) -> int:  # noqa: N802
        return 1 if self.message else 0


class MemoryDesc:
    _registry: dict[bytes, "MemoryDesc"] = {}

    def __init__(self, data: int, size: int) -> None:
        self.data, self.size = data, size

    def pack(self) -> bytes:
        key = f"{self.data}:{self.size}".encode()
        MemoryDesc._registry[key] = self
        return key

    @classmethod
    def unpack(cls, packed: bytes) -> "MemoryDesc":
        return cls._registry[packed]


class _Session:
    def __init__(self, local: MemoryDesc, remote: MemoryDesc) -> None:
        self.local, self.remote = local, remote

    def batch_read(self, local_offsets, remote_offsets, sizes, uid) -> _Status:
        for lo, ro, n in zip(local_offsets, remote_offsets, sizes):
            if lo + n > self.local.size or ro + n > self.remote.size:
                return _Status(f"read of {n} bytes at local offset {lo} / remote offset {ro} is outside the "
                               f"registered regions ({self.local.size} / {self.remote.size} bytes)")
        return _Status()


class IOEngine:
    def __init__(self, key: str, config=None) -> None:
        self.key = key
        self._uid = 0

    def register_torch_tensor(self, tensor) -> MemoryDesc:
        if not tensor.is_contiguous():
            raise RuntimeError("input tensor must be contiguous")
        return MemoryDesc(tensor.data_ptr(), tensor.nelement() * tensor.element_size())

    def create_session(self, local: MemoryDesc, remote: MemoryDesc) -> _Session:
        return _Session(local, remote)

    def allocate_transfer_uid(self) -> int:
        self._uid += 1
        return self._uid


_mori_io = types.ModuleType("mori.io")
_mori_io.IOEngine, _mori_io.MemoryDesc = IOEngine, MemoryDesc
for _name in ("BackendType", "IOEngineConfig", "EngineDesc", "PollCqMode", "RdmaBackendConfig",
              "XgmiBackendConfig", "StatusCode"):
    setattr(_mori_io, _name, SimpleNamespace(RDMA="rdma", XGMI="xgmi", POLLING="polling", SUCCESS=0))
_mori = types.ModuleType("mori")
_mori.io = _mori_io
sys.modules.setdefault("mori", _mori)
sys.modules.setdefault("mori.io", _mori_io)

import torch  # noqa: E402

from vllm.config import CacheConfig, DeviceConfig, VllmConfig  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.moriio.moriio_connector import (  # noqa: E402
    MoRIIOConnectorWorker,
)
from vllm.distributed.kv_transfer.kv_connector.v1.moriio.moriio_engine import MoRIIOWrapper  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.moriio.moriio_layout import (  # noqa: E402
    build_layer_to_spec,
)
from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend  # noqa: E402
from vllm.v1.attention.backends.utils import (  # noqa: E402
    get_supported_kv_cache_layouts,
    resolve_kv_cache_layout,
)
from vllm.v1.core.kv_cache_planning import get_kv_cache_config_from_groups  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec  # noqa: E402
from vllm.v1.worker.utils import allocate_kv_cache  # noqa: E402

PAGE = 4096
LAYERS = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
CONFIGS = [
    # name, block_size, num_blocks, KV cache dtype (8 KV heads x head_size 128, 2 layers)
    ("dense-fa-b128-bhlnc", 128, 4, torch.bfloat16),
    ("fp8-fa-b16-bhlnc", 16, 8, torch.float8_e4m3fn),
]
_keep: list = []  # page-aligned pools stay alive


def page_aligned_views(kv_caches: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """vLLM's views, re-bound onto a page-aligned, page-padded pool (what ROCm gives)."""
    storage = next(iter(kv_caches.values())).untyped_storage()
    nbytes = -(-storage.nbytes() // PAGE) * PAGE
    raw = ctypes.create_string_buffer(nbytes + PAGE)  # zeroed
    addr = ctypes.addressof(raw)
    aligned = (ctypes.c_uint8 * nbytes).from_address(addr + (-addr) % PAGE)
    pool = torch.frombuffer(aligned, dtype=torch.uint8)  # its storage starts on the page
    _keep.append((raw, aligned))
    return {name: pool.view(v.dtype).as_strided(v.shape, v.stride(), v.storage_offset())
            for name, v in kv_caches.items()}


def block_extent(view: torch.Tensor, block: int, base: int) -> tuple[int, int]:
    """[first byte, one past the last byte) of block ``block`` of a [B, ...] view, pool offsets."""
    b = view[block]
    el = b.element_size()
    last = sum((n - 1) * s for n, s in zip(b.shape, b.stride())) * el + el
    return b.data_ptr() - base, b.data_ptr() - base + last


def run_config(name: str, block_size: int, num_blocks: int, dtype: torch.dtype) -> bool:
    """Returns True when the planned READ of some block leaves the registered region (the bug)."""
    vc = VllmConfig(device_config=DeviceConfig(device="cpu"),
                    cache_config=CacheConfig(block_size=block_size, num_gpu_blocks_override=num_blocks))
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=8, head_size=128, dtype=dtype)
    supported = [layout.name for layout in get_supported_kv_cache_layouts([FlashAttentionBackend])]
    layout = resolve_kv_cache_layout(vc, [supported], [spec])  # -> BHLNC (from the env var)
    kcc = get_kv_cache_config_from_groups(vc, [KVCacheGroupSpec(list(LAYERS), spec)],
                                          num_blocks * len(LAYERS) * spec.page_size_bytes)
    kcc.kv_cache_layout = layout.name
    kv_caches = page_aligned_views(allocate_kv_cache(kcc, torch.device("cpu"), layout, [block_size]))

    # --- the worker state register_kv_caches builds (moriio_connector.py:2484-2717) ---
    w = object.__new__(MoRIIOConnectorWorker)
    w.kv_caches = kv_caches
    w.layer_to_spec = build_layer_to_spec(kcc)
    w._conv_decomp = None
    w.moriio_wrapper = MoRIIOWrapper(moriio_engine=IOEngine("local"))
    regions = {n: w._iter_layer_registration_regions(n) for n in LAYERS}
    reg, w.kv_layer_mr_offset = w._build_shared_kv_mr(kv_caches)  # moriio_connector.py:2440 (the bug)
    packed = w.moriio_wrapper.register_local_tensor(reg)  # moriio_connector.py:2652
    mr = MemoryDesc.unpack(packed)
    w._record_slice_layouts(kv_caches)
    w.num_blocks = w._get_layer_transfer_geometry(LAYERS[0]).num_blocks
    w.layer_base_addr_index = {n: i for i, n in enumerate(LAYERS)}
    # The peer: an identical engine; its advertised region metadata and base addresses.
    w.layer_name_to_remote_kv_cache_metadata = {"peer": {n: [packed] for n in LAYERS}}
    peer = SimpleNamespace(kv_head_layouts={n: lay.to_wire() for n, lay in w.kv_head_layouts.items()},
                           num_blocks=w.num_blocks, attention_block_sizes=w.attention_block_sizes,
                           kv_caches_base_addr=[kv_caches[n].data_ptr() for n in LAYERS])
    session = w.moriio_wrapper.build_session(mr, mr)

    pool_base = kv_caches[LAYERS[0]].untyped_storage().data_ptr()
    pool_len = kv_caches[LAYERS[0]].untyped_storage().nbytes()
    v0 = kv_caches[LAYERS[0]]
    el = v0.element_size()
    print(f"== {name}: FLASH_ATTN FullAttentionSpec, {len(LAYERS)} layers, 8 KV heads x 128, "
          f"{str(dtype).removeprefix('torch.')}, block_size {block_size}, {num_blocks} blocks, "
          f"VLLM_KV_CACHE_LAYOUT={layout.name}")
    print(f"   pool {pool_len} bytes; layer view shape {tuple(v0.shape)}, strides (bytes) "
          f"{tuple(s * el for s in v0.stride())}")
    for n in LAYERS:
        (t, region_len), = regions[n]
        print(f"   {n}: registration region at pool offset {t.data_ptr() - pool_base}, length {region_len}; "
              f"last block's bytes end at pool offset {block_extent(kv_caches[n], num_blocks - 1, pool_base)[1]}")
    print(f"   shared MR registered: pool offsets [{mr.data - pool_base}, {mr.data - pool_base + mr.size}) "
          f"({mr.size} bytes of a {pool_len}-byte pool)")

    buggy = False
    for block in range(num_blocks):
        outside = []
        for n in LAYERS:
            lo, ro, sz = w._compute_read_attention_offsets(n, [block], [block], peer, 1, "peer")
            outside += [(n, a, s) for a, s in zip(lo, sz) if a + s > mr.size]
            status = w.moriio_wrapper.read_remote_data(sz, lo, ro, session)
            if status.Failed():
                buggy = True
                print(f"   block {block} {n}: READ failed: {status.Message()}")
        if outside:
            past = sum(min(s, a + s - max(a, mr.size)) for _, a, s in outside)
            print(f"   block {block}: {len(outside)} of the planned reads ({past} bytes) lie past the region's "
                  f"end at {mr.size}; first at MR offset {min(a for _, a, _ in outside)}")
    return buggy


def main() -> int:
    bug = False
    for cfg in CONFIGS:
        bug |= run_config(*cfg)
    if bug:
        print("RESULT: BUG PRESENT - MoRIIO sizes each layer's registration region as "
              "(num_blocks-1)*block_stride + block_len (iter_layer_registration_regions), which assumes a "
              "block is one dense run; under BHLNC a block's heads are spread over the block row, so the "
              "shared MR ends before the last block's bytes and its READ leaves the registered region")
        return 1
    print("RESULT: OK - every planned READ lies inside the registered region")
    return 0


if __name__ == "__main__":
    sys.exit(main())
