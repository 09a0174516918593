"""vLLM 0.33.0's own DecodeBenchConnector (scheduler block selection and worker fill), driven
on CPU: the bytes its per-request fill writes, checked by validate_registration. Under a
kernel split its fill writes kernel block b for logical block b (hazard H2, confirmed here,
also without kvconform). Skips with a reason where vLLM (or torch) is missing."""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = [
    pytest.mark.kvconform_vllm,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch (validate_registration builds CPU tensors)"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm 0.33.0 importable (pip install 'kvconform[vllm]')"),
]

ADAPTER = "gpu_impl.connectors.decode_bench:DecodeBenchAdapter"
RIGHT = [
    "nixl-dense-fa",
    "dense-fa-b128-lhbnc",
    "dense-fa-b128-blhnc",  # block-outermost views are manager-granular: dim 0 is the logical id
    "mla-gqa-draft-b64",
    "swa-hybrid-padded",  # the SWA group aliases the full group from byte 0
    "mamba-hybrid",  # int8 state pages: filled with zeros
    "fp8-fa-b16",  # uint8 cache filled with fp8 values
    "cpu-attn-b32",
]
KERNEL_SPLIT = ["flashinfer-b128-k64", "flashinfer-b128-k64-hnd"]  # 128-token blocks as 64-token kernel blocks


def test_decode_bench_fill_on_both_runners():
    """Right wherever dim 0 of the registered view is the logical block; wrong under a split."""
    from conformance.connectors import validate_registration

    report = validate_registration(ADAPTER, cases=RIGHT + KERNEL_SPLIT, runners=("mrv1", "mrv2"))
    status = {(r.case, r.runner): r.status for r in report.results}
    assert status == {(c, r): "pass" if c in RIGHT else "failure" for c in RIGHT + KERNEL_SPLIT for r in ("mrv1", "mrv2")}, report.format()
    for case in KERNEL_SPLIT:
        wrong = {(d.runner, d.layer) for d in report.for_case(case) if d.field == "descriptors"}
        layers = {"model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"}
        assert wrong == {(r, n) for r in ("mrv1", "mrv2") for n in layers}, report.format()


def test_h2_fill_writes_kernel_block_b_for_logical_block_b():
    """flashinfer-b128-k64: the view is [8, 8, 64, 256] over 4 logical blocks (524288-byte
    pages, 262144-byte kernel blocks). The fill for logical b writes kernel row b only: half
    a block, and for b >= 1 a row of another logical block (b // 2); blocks 2 and 3 are never
    written at all."""
    from conformance.connectors.validate import build_kv_caches, make_context
    from gpu_impl.connectors.decode_bench import DecodeBenchAdapter
    from reference.derive import derive
    from suites.named_cases import get_case

    d = derive(get_case("flashinfer-b128-k64"), "mrv1")
    pool, caches = build_kv_caches(d)
    layer = "model.layers.0.self_attn.attn"
    assert tuple(caches[layer].shape) == (8, 8, 64, 256) and d.num_blocks == 4
    a = DecodeBenchAdapter(make_context(d))
    a.register(caches)
    kernel_block, page = 262144, 524288
    base = pool.data_ptr()
    for b in range(4):
        assert a.descriptors(layer, b) == [(base + b * kernel_block, kernel_block)]
        assert list(d.block_bytes(layer, b).page.runs()) == [(b * page, (b + 1) * page)]
    written = [a.descriptors(layer, b)[0][0] - base for b in range(4)]
    assert max(written) + kernel_block <= 2 * page  # only logical blocks 0 and 1 are ever filled
    assert not pool.any()  # the adapter restores the pool after observing


def test_h2_standalone_reproduction():
    """The same without kvconform: vLLM's own allocator and the connector's worker."""
    from types import SimpleNamespace

    import torch
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.decode_bench_connector import (
        DecodeBenchConnectorMetadata,
        DecodeBenchConnectorWorker,
    )
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheTensor
    from vllm.v1.kv_cache_layout import KVCacheLayout
    from vllm.v1.worker.utils import allocate_kv_cache

    spec = FullAttentionSpec(block_size=128, num_kv_heads=8, head_size=128, dtype=torch.bfloat16)
    page, n = spec.page_size_bytes, 4
    kcc = KVCacheConfig(
        num_blocks=n,
        kv_cache_groups=[KVCacheGroupSpec(["l0"], spec)],
        kv_cache_tensors=[KVCacheTensor(size=n * page, layers=["l0"], layer_stride=n * page, block_stride=page, offset=0)],
    )
    # What the runner registers when the backend's kernel takes 64-token blocks (FlashInfer off SM100).
    caches = allocate_kv_cache(kcc, torch.device("cpu"), KVCacheLayout.LBNHC, kernel_block_sizes=[64])
    config = SimpleNamespace(
        kv_transfer_config=KVTransferConfig(kv_connector="DecodeBenchConnector", kv_role="kv_both"),
        cache_config=SimpleNamespace(cache_dtype="auto"),
    )
    worker = DecodeBenchConnectorWorker(config, kcc)
    worker.register_kv_caches(caches)
    worker.start_fill_kv(DecodeBenchConnectorMetadata(reqs_to_fill={"req": (([3],), 128)}))  # logical block 3
    cache = caches["l0"]
    assert tuple(cache.shape) == (8, 8, 64, 256)
    filled = [k for k in range(cache.shape[0]) if cache[k].any()]
    assert filled == [3]  # logical block 3 is kernel blocks [6, 7]
