"""Standalone reproduction: DecodeBenchConnector fills the wrong KV rows under a kernel split.

vLLM 0.33.0. Needs only vllm, torch and the standard library; runs on CPU in well under a minute
(most of it is ``import vllm``):

    python docs/findings/repro_decode_bench_logical_ids_on_kernel_blocks.py
    python docs/findings/repro_decode_bench_logical_ids_on_kernel_blocks.py --with-suggested-fix

Exit status: 1 when the bug is present (a request's fill writes bytes it does not own or leaves
its own bytes unfilled), 0 when the fill covers exactly the request's own blocks.

What is real (vLLM's own code, unchanged):
  * FlashInferBackend.get_supported_kernel_block_sizes + select_common_block_size (the 128 -> 64
    kernel-block choice prepare_kernel_block_sizes makes off SM100);
  * compute_layout_strides (how get_kv_cache_config_from_groups places the layer), KVCacheConfig;
  * allocate_kv_cache(..., kernel_block_sizes=[64]): exactly what GPUModelRunner.
    initialize_kv_cache_tensors returns and then passes to connector.register_kv_caches();
  * DecodeBenchConnector constructed for both roles, as the engine does; the scheduler side's
    get_num_new_matched_tokens / update_state_after_alloc / build_connector_meta choose the
    blocks, a real Request and real KVCacheBlocks/KVCacheBlock carry them; the worker side's
    register_kv_caches / bind_connector_metadata / start_load_kv -> start_fill_kv -> _fill_blocks
    -> _fill_block_tensor do the fill.

What is faked: no hardware or service is needed (the fill is plain torch indexing), so only the
VllmConfig is a stand-in: VllmConfig() cannot be built without a device/model, and the connector
reads just kv_transfer_config, cache_config.cache_dtype and
parallel_config.decode_context_parallel_size from it. The "GPU" pool is a CPU tensor.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import torch

from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.decode_bench_connector import (
    DecodeBenchConnector,
    DecodeBenchConnectorWorker,
)
from vllm.sampling_params import SamplingParams
from vllm.v1.attention.backends.flashinfer import FlashInferBackend
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import KVCacheBlock
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    compute_layout_strides,
    group_kernel_blocks,
)
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.request import Request
from vllm.v1.worker.utils import allocate_kv_cache, select_common_block_size

LAYER = "model.layers.0.self_attn.attn"
NUM_BLOCKS = 4
BLOCK_SIZE = 128  # --block-size 128
LAYOUT = KVCacheLayout.LBNHC  # the default (NHD) layout resolved for FlashInfer off SM100
A_BYTE = 0x11  # "live KV" of another running request


def runs(mask: torch.Tensor) -> list[tuple[int, int]]:
    """[start, end) runs of True in a flat bool tensor."""
    idx = mask.nonzero().flatten().tolist()
    out: list[tuple[int, int]] = []
    for i in idx:
        if out and out[-1][1] == i:
            out[-1] = (out[-1][0], i + 1)
        else:
            out.append((i, i + 1))
    return out


def fmt(rs: list[tuple[int, int]]) -> str:
    return " ".join(f"[{a}, {b})" for a, b in rs) or "nothing"


def main() -> int:
    with_fix = "--with-suggested-fix" in sys.argv[1:]

    # Qwen3-like layer: 8 KV heads x head_size 128, bf16 -> 524288-byte pages at 128 tokens.
    spec = FullAttentionSpec(
        block_size=BLOCK_SIZE, num_kv_heads=8, head_size=128, dtype=torch.bfloat16
    )
    page = spec.page_size_bytes

    # FlashInfer off SM100 advertises [16, 32, 64] (no current VllmConfig here = not SM100),
    # so the runner views each 128-token block as two 64-token kernel blocks.
    kernel_block_size = select_common_block_size(BLOCK_SIZE, [FlashInferBackend], [spec])
    ratio = BLOCK_SIZE // kernel_block_size

    # The placement get_kv_cache_config_from_groups computes for one layer in this layout.
    layer_stride, block_stride, *_ = compute_layout_strides(spec, NUM_BLOCKS, 1, LAYOUT)
    kv_cache_config = KVCacheConfig(
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[
            KVCacheTensor(
                size=NUM_BLOCKS * page,
                layers=[LAYER],
                layer_stride=layer_stride,
                block_stride=block_stride,
            )
        ],
        kv_cache_groups=[KVCacheGroupSpec([LAYER], spec)],
    )
    # What GPUModelRunner.initialize_kv_cache_tensors hands to register_kv_caches().
    kv_caches = allocate_kv_cache(
        kv_cache_config, torch.device("cpu"), LAYOUT, kernel_block_sizes=[kernel_block_size]
    )
    cache = kv_caches[LAYER]
    pool = torch.empty(0, dtype=torch.int8).set_(cache.untyped_storage())
    kernel_block = cache.stride(0) * cache.element_size()
    print(f"vLLM {__import__('vllm').__version__}: FlashInfer kernel block size for "
          f"--block-size {BLOCK_SIZE}: {kernel_block_size} (ratio {ratio})")
    print(f"registered view {LAYER}: shape {tuple(cache.shape)} over {NUM_BLOCKS} logical "
          f"blocks; logical page {page} B, kernel block {kernel_block} B")

    vllm_config = SimpleNamespace(  # stand-in: only the fields the connector reads
        kv_transfer_config=KVTransferConfig(
            kv_connector="DecodeBenchConnector", kv_role="kv_both"
        ),
        cache_config=SimpleNamespace(cache_dtype="auto"),
        parallel_config=SimpleNamespace(decode_context_parallel_size=1),
    )
    scheduler = DecodeBenchConnector(vllm_config, KVConnectorRole.SCHEDULER, kv_cache_config)
    worker = DecodeBenchConnector(vllm_config, KVConnectorRole.WORKER, kv_cache_config)

    if with_fix:
        # The suggested fix: index the manager-granular view, [num_blocks, r, H, kbs, C].
        original = DecodeBenchConnectorWorker._fill_block_tensor

        def fixed(self, kv_cache, block_ids, *args, **kwargs):
            grouped = group_kernel_blocks(kv_cache, kv_cache_config.num_blocks)
            return original(self, grouped, block_ids, *args, **kwargs)

        DecodeBenchConnectorWorker._fill_block_tensor = fixed
        print("(running with the suggested fix applied)")

    worker.register_kv_caches(kv_caches)

    # Request A is running and owns logical block 1: its KV is live in the pool.
    by_block = group_kernel_blocks(cache, NUM_BLOCKS)  # [num_blocks, r, H, kbs, C] view
    by_block[1].view(torch.int8).fill_(A_BYTE)

    # Request B arrives with a 257-token prompt and is allocated logical blocks [2, 3]: the
    # connector fills 256 tokens (everything but the last one) = both blocks.
    req = Request("B", list(range(2 * BLOCK_SIZE + 1)), SamplingParams(max_tokens=1), None)
    n_ext, _ = scheduler.get_num_new_matched_tokens(req, 0)
    blocks = KVCacheBlocks(blocks=([KVCacheBlock(2), KVCacheBlock(3)],))
    scheduler.update_state_after_alloc(req, blocks, n_ext)
    meta = scheduler.build_connector_meta(None)  # the scheduler output is not read
    print(f"scheduler metadata: {meta.reqs_to_fill}")

    before = pool.clone()
    worker.bind_connector_metadata(meta)
    worker.start_load_kv(None)  # -> start_fill_kv -> _fill_blocks -> _fill_block_tensor
    worker.clear_connector_metadata()
    written = runs(pool != before)

    b_owns = [(2 * page, 4 * page)]  # logical blocks 2 and 3
    owned = torch.zeros_like(pool, dtype=torch.bool)
    owned[2 * page : 4 * page] = True
    changed = pool != before
    foreign = (changed & ~owned).sum().item()
    unfilled = (~changed & owned).sum().item()
    a_clobbered = (pool[page : 2 * page] != A_BYTE).sum().item()

    print(f"request B owns pool bytes {fmt(b_owns)} (logical blocks 2, 3 = kernel rows "
          f"{2 * ratio}..{4 * ratio - 1})")
    print(f"DecodeBench fill wrote     {fmt(written)}")
    print(f"  bytes written outside B's blocks: {foreign}; bytes of B's blocks left "
          f"unfilled: {unfilled}")
    print(f"  request A's live block 1 [{page}, {2 * page}): {a_clobbered} of {page} bytes "
          f"overwritten")
    if foreign or unfilled:
        print("BUG PRESENT: _fill_block_tensor indexed the kernel-granular view with logical "
              "block ids (kernel row b instead of rows [b*r, (b+1)*r))")
        return 1
    print("OK: the fill covered exactly request B's blocks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
