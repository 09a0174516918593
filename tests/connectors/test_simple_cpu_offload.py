"""vLLM 0.33.0's own SimpleCPUOffloadConnector worker (registration, copy planning, store and
load paths), driven on CPU with a faked cuMemcpyBatchAsync, checked by validate_registration
and by a direct store/load through the copy engine. Skips with a reason where vLLM (or
torch) is missing."""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = [
    pytest.mark.kvconform_vllm,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch (validate_registration builds CPU tensors)"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm 0.33.0 importable (pip install 'kvconform[vllm]')"),
]

ADAPTER = "gpu_impl.connectors.simple_cpu_offload:SimpleCPUOffloadAdapter"
CASES = [
    "nixl-dense-fa",
    "flashinfer-b128-k64",  # kernel split 128 -> 64: the connector uses the config's manager strides
    "flashinfer-b128-k64-hnd",
    "dense-fa-b128-lhbnc",  # one region per (layer, head)
    "dense-fa-b128-blhnc",  # block-outermost: one packed-row region
    "mla-gqa-draft-b64",  # two KVCacheTensors with different block strides
    "swa-hybrid-padded",  # SWA group aliases the full group: deduped regions
    "mamba-hybrid",
    "fp8-fa-b16",
    "cpu-attn-b32",
]


def _adapter(name: str):
    from conformance.connectors.validate import build_kv_caches, make_context
    from gpu_impl.connectors.simple_cpu_offload import SimpleCPUOffloadAdapter
    from reference.derive import derive
    from suites.named_cases import get_case

    d = derive(get_case(name), "mrv1")
    pool, caches = build_kv_caches(d)
    adapter = SimpleCPUOffloadAdapter(make_context(d))
    adapter.register(caches)
    return d, pool, caches, adapter


def test_simple_cpu_offload_on_both_runners():
    """The runners' own tensors: every case's descriptors and round trip (store through
    wait_for_save, load through start_load_kv) are right, on MRv1 and MRv2."""
    from conformance.connectors import validate_registration

    report = validate_registration(ADAPTER, cases=CASES, runners=("mrv1", "mrv2"))
    assert {(r.case, r.runner) for r in report.results if r.status == "pass"} == {
        (c, r) for c in CASES for r in ("mrv1", "mrv2")
    }, report.format()
    assert all(r.round_trip == "pass" for r in report.results), report.format()


def test_regions_and_descriptors_the_worker_derived():
    """What register_kv_caches cut from kv_cache_tensors, read off the worker."""
    lhbnc = _adapter("dense-fa-b128-lhbnc")
    _, pool, _, a = lhbnc
    w = a.worker
    layer0 = "model.layers.0.self_attn.attn"
    # LHBNC: a layer is 8 head planes of 4 blocks x 128 tokens x 256 bf16 (65536 bytes each),
    # so the 2 MiB layer stride holds 8 [num_blocks, 65536] regions per layer.
    assert list(w.gpu_kv_caches)[:2] == [f"{layer0}.0", f"{layer0}.1"] and len(w.gpu_kv_caches) == 16
    assert {tuple(r.shape) for r in w.gpu_kv_caches.values()} == {(4, 65536)}
    base = pool.data_ptr()
    assert a.descriptors(layer0, 1) == [(base + h * 4 * 65536 + 65536, 65536) for h in range(8)]

    _, pool, _, a = _adapter("dense-fa-b128-blhnc")
    # Block-outermost: one region from byte 0, each block the packed row of both layers' pages.
    assert len(a.worker.gpu_kv_caches) == 1
    row = 2 * 8 * 128 * 256 * 2
    for layer in ("model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"):
        assert a.descriptors(layer, 2) == [(pool.data_ptr() + 2 * row, row)]

    _, pool, _, a = _adapter("mla-gqa-draft-b64")
    # MLA layers (64 x 576 bf16 = 73728-byte pages) and the GQA draft (64 x 8 x 256 bf16)
    assert [r.stride(0) for r in a.worker.gpu_kv_caches.values()] == [73728, 73728, 262144]
    assert a.descriptors("draft.layers.2.attn", 3) == [(pool.data_ptr() + 589824 + 3 * 262144, 262144)]


def test_store_and_load_go_through_the_copy_engine():
    """A direct round trip on the SWA+full hybrid whose groups alias from byte 0: the worker
    dedupes the SWA tensor's regions, stores block 1 into CPU block 0 and loads it into block 5."""
    import torch

    from conformance.connectors.memory import CopyEngine

    d, pool, caches, a = _adapter("swa-hybrid-padded")
    w = a.worker
    # 2 layer regions of 8 x 3072 bytes (the SWA layers alias them); a CPU pool as large as
    # the 49152-byte GPU pool then holds 49152 // (2 * 3072) = 8 blocks.
    assert list(w.gpu_kv_caches) == ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
    assert w.num_cpu_blocks == 8

    engine = CopyEngine(caches.values())
    pool.copy_(torch.randint(-128, 128, (pool.numel(),), dtype=torch.int8, generator=torch.Generator().manual_seed(1)))
    snapshot = pool.clone()
    handle = a.store([1], engine)
    assert handle == [0] and torch.equal(pool, snapshot)
    # One CPU tensor per region (the worker's _init_cpu_mode), each an engine host buffer.
    assert [(engine.region_of(src, n).label, engine.region_of(dst, n).label, n) for src, dst, n in engine.copies] == [
        ("pool", "host buffer 0", 3072), ("pool", "host buffer 1", 3072)
    ]
    assert [src - pool.data_ptr() for src, _, _ in engine.copies] == [3072, 24576 + 3072]

    pool.zero_()
    a.load(handle, [5], engine)
    assert len(engine.copies) == 4 and not engine.out_of_bounds
    for layer in d.registered:
        for (s0, s1), (t0, t1) in zip(d.block_bytes(layer, 1).page.runs(), d.block_bytes(layer, 5).page.runs()):
            assert torch.equal(pool[t0:t1], snapshot[s0:s1]), layer
    # Whole 3072-byte blocks of the two regions move (page padding included), nothing else.
    outside_block5 = torch.ones(pool.numel(), dtype=torch.bool)
    for region_base in (0, 24576):
        outside_block5[region_base + 5 * 3072 : region_base + 6 * 3072] = False
    assert not pool[outside_block5].any()

    with pytest.raises(ValueError, match="the engine the blocks were stored with"):
        a.load(handle, [5], CopyEngine(caches.values()))
