"""vLLM 0.33.0's own UMBPStoreConnector (worker role) driven on CPU with a recording fake UMBP
runtime: its registration (regions planned from the KVCacheConfig placement, checked against
the tensors), the KVRange lists its worker materializes for a block, and the bytes those move,
checked by validate_registration and the round trip. Skips with a reason where vLLM (or
torch) is missing."""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = [
    pytest.mark.kvconform_vllm,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch (validate_registration builds CPU tensors)"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm 0.33.0 importable (pip install 'kvconform[vllm]')"),
]

UMBP = "gpu_impl.connectors.umbp:UMBPAdapter"
RUNNERS = ("mrv1", "mrv2")
PASSING = [
    "nixl-dense-fa",
    "flashinfer-b128-k64",  # 128 -> 64 split: a logical block is 2 kernel-block ranges
    "flashinfer-b128-k64-hnd",
    "dense-fa-b128-blhnc",  # block_stride is the row, a layer's page one run inside it
    "mla-gqa-draft-b64",
    "swa-hybrid-padded",
    "mamba-hybrid",  # the Mamba group is prefix-cacheable: its state pages move as blocks
    "fp8-fa-b16",
    "cpu-attn-b32",
]


def test_umbp_named_cases_both_runners():
    """Each case on both runners' own registrations: what passes (descriptors and the round
    trip through the worker's own store/load), what it refuses, what it moves wrongly."""
    from conformance.connectors import validate_registration

    cases = PASSING + ["dense-fa-b128-lhbnc", "dense-fa-b128-bhlnc"]
    report = validate_registration(UMBP, cases=cases, runners=RUNNERS)
    got = {(r.case, r.runner): r for r in report.results}
    assert set(got) == {(c, r) for c in cases for r in RUNNERS}, report.format()
    for case in PASSING:
        for runner in RUNNERS:
            assert got[case, runner].status == "pass", report.format()
            assert got[case, runner].round_trip == "pass", report.format()

    # LHBNC: the KVCacheTensor's block_stride is one head's 128-token run (65536 bytes), the
    # page all 8 heads' (524288): the planner's KVRegion refuses a page wider than its stride.
    for runner in RUNNERS:
        r = got["dense-fa-b128-lhbnc", runner]
        assert r.status == "refusal", report.format()
        assert "KV region bytes (524288) exceed its stride (65536)" in r.detail and "umbp/data.py" in r.detail

    # BHLNC: block_stride (the 1 MiB row) is stride(0), so registration accepts it, but the
    # plan moves a layer's page as one contiguous run from the layer's base; the page is 8 head
    # runs of 65536 bytes, 131072 apart (interleaved with the other layer's).
    for runner in RUNNERS:
        assert got["dense-fa-b128-bhlnc", runner].status == "failure", report.format()
        assert got["dense-fa-b128-bhlnc", runner].round_trip == "fail"
    divs = [d for d in report.for_case("dense-fa-b128-bhlnc") if d.field == "descriptors" and d.block == 0]
    observed = {d.layer: d.observed for d in divs}
    assert observed["model.layers.0.self_attn.attn"].startswith("524288 bytes at pool offsets [0, 524288)"), report.format()
    assert observed["model.layers.1.self_attn.attn"].startswith("524288 bytes at pool offsets [65536, 589824)"), report.format()


def _registered(name: str, runner: str = "mrv1"):
    from conformance.connectors.validate import build_kv_caches, make_context
    from gpu_impl.connectors.umbp import UMBPAdapter
    from reference.derive import derive
    from suites.named_cases import get_case

    d = derive(get_case(name), runner)
    pool, caches = build_kv_caches(d)
    adapter = UMBPAdapter(make_context(d))
    adapter.register(caches)
    return adapter, pool, caches


def test_umbp_regions_and_store_load():
    """What the planner derived from the KVCacheConfig, and the copies its ranges make."""
    import torch

    from conformance.connectors.memory import CopyEngine

    page = 8 * 128 * 256 * 2  # one layer's 128-token bf16 block: 8 heads x 128 tokens x (K|V 256)
    kernel = page // 2

    # 128 -> 64 split: regions keep the config's logical block_stride (the page); the tensor's
    # stride(0) (one 64-token kernel block) divides it, so a block is 2 ranges, kernel blocks
    # 2b and 2b + 1, laid out one after the other in the object.
    split, pool, caches = _registered("flashinfer-b128-k64")
    layout = split.worker.layout
    assert [(r.block_stride, r.block_bytes, r.object_offset) for r in layout.regions] == [(page, page, 0), (page, page, page)]
    views = list(caches.values())
    assert split.descriptors("model.layers.0.self_attn.attn", 3) == [(views[0].data_ptr() + k * kernel, kernel) for k in (6, 7)]
    assert split.runtime.registered == {pool.data_ptr(): pool.numel()}

    # BLHNC: block_stride is the row of both layers; a layer's page is one run in it.
    row, row_pool, row_caches = _registered("dense-fa-b128-blhnc")
    layer1 = row_caches["model.layers.1.self_attn.attn"]
    assert [r.block_stride for r in row.worker.layout.regions] == [2 * page, 2 * page]
    assert row.descriptors("model.layers.1.self_attn.attn", 3) == [(layer1.data_ptr() + 3 * 2 * page, page)]

    # Mamba group: planned and transferred like an attention group (its own block ids).
    hybrid, _, _ = _registered("mamba-hybrid")
    assert hybrid.groups == [0, 1] and "model.layers.2.mixer" in hybrid.transferred_layers

    # Store block 1 through the worker: one object per group, each range copied to its
    # object_offset; load it into block 2.
    engine = CopyEngine(views)
    pool.copy_(torch.randint(-128, 128, (pool.numel(),), dtype=torch.int8, generator=torch.Generator().manual_seed(1)))
    snapshot = pool.clone()
    handle = split.store([1], engine)
    host = engine.regions[1]
    assert host.label == "host buffer 0" and host.end - host.start == 2 * page
    assert engine.copies == [(t.data_ptr() + k * kernel, host.start + i * page + j * kernel, kernel)
                             for i, t in enumerate(views) for j, k in enumerate((2, 3))]
    assert torch.equal(pool, snapshot) and split.runtime.published == [split.codec.key(handle[0], 0)]
    pool.zero_()
    split.load(handle, [2], engine)
    expected = torch.zeros_like(pool)
    for t in views:
        lo = t.data_ptr() - pool.data_ptr()
        expected[lo + 2 * page : lo + 3 * page] = snapshot[lo + page : lo + 2 * page]
    assert torch.equal(pool, expected)

    # An object the runtime no longer holds: the worker reports the block as a load error.
    split.runtime.objects.clear()
    with pytest.raises(RuntimeError, match=r"failed loads .*\['2'\]"):
        split.load(handle, [2], engine)
