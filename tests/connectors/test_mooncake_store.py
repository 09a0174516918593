"""vLLM 0.33.0's own MooncakeStoreConnector (worker role) driven on CPU with a recording fake
Mooncake store: its registration, the put/get buffers its own planning hands the store, and
the bytes those move, checked by validate_registration and the round trip. Skips with a
reason where vLLM (or torch) is missing."""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = [
    pytest.mark.kvconform_vllm,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch (validate_registration builds CPU tensors)"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm 0.33.0 importable (pip install 'kvconform[vllm]')"),
]

STORE = "gpu_impl.connectors.mooncake_store:MooncakeStoreAdapter"
RUNNERS = ("mrv1", "mrv2")
PASSING = [
    "nixl-dense-fa",
    "flashinfer-b128-k64",  # 128 -> 64 kernel split: group_kernel_blocks views logical blocks again
    "flashinfer-b128-k64-hnd",
    "dense-fa-b128-lhbnc",  # cache[0] not dense: one region per head segment
    "dense-fa-b128-blhnc",  # stride(0) * num_blocks == storage: one whole-row region
    "mla-gqa-draft-b64",
    "swa-hybrid-padded",  # two groups aliasing rows; SWA stores only the prompt's reachable tail
    "fp8-fa-b16",
    "cpu-attn-b32",
]


def test_mooncake_store_named_cases_both_runners():
    """Each case on both runners' own registrations: what passes (descriptors and the round
    trip through the connector's own put/get), and what the connector refuses."""
    from conformance.connectors import validate_registration

    cases = PASSING + ["mamba-hybrid", "dense-fa-b128-bhlnc"]
    report = validate_registration(STORE, cases=cases, runners=RUNNERS)
    got = {(r.case, r.runner): r for r in report.results}
    assert set(got) == {(c, r) for c in cases for r in RUNNERS}, report.format()
    for case in PASSING:
        for runner in RUNNERS:
            assert got[case, runner].status == "pass", report.format()
            assert got[case, runner].round_trip == "pass", report.format()

    # The connector validates its KV cache config before it builds the worker: a Mamba group
    # without prefix-caching "align" mode (the case's max_model_len-sized Mamba block) is refused.
    for runner in RUNNERS:
        r = got["mamba-hybrid", runner]
        assert r.status == "refusal", report.format()
        assert "mamba_cache_mode='none' != 'align'" in r.detail and "mooncake/store/connector.py" in r.detail

    # BHLNC: a layer's block is 8 head runs of 128 x 256 x 2 = 65536 bytes, 131072 apart in
    # a 1 MiB row of both layers. cache[0] is not dense, so RankLocalStoreLayout makes one
    # region per head, but takes its block_len from the head view's stride(0): the whole row.
    # Each of the 16 regions (8 heads x 2 layers, 65536 apart) then moves 1 MiB, so block 0
    # covers [0, 15 x 65536 + 1 MiB) and loading block 2 spills into block 3.
    for runner in RUNNERS:
        assert got["dense-fa-b128-bhlnc", runner].status == "failure", report.format()
        assert got["dense-fa-b128-bhlnc", runner].round_trip == "fail"
    divs = report.for_case("dense-fa-b128-bhlnc")
    first = [d for d in divs if d.field == "descriptors" and d.block == 0]
    assert first and all(d.observed.startswith("2031616 bytes at pool offsets [0, 2031616)") for d in first), report.format()
    assert any(d.field == "round_trip:overwritten_neighbour" and "of block 3" in d.message for d in divs), report.format()


def _registered(name: str, runner: str = "mrv1"):
    from conformance.connectors.validate import build_kv_caches, make_context
    from gpu_impl.connectors.mooncake_store import MooncakeStoreAdapter
    from reference.derive import derive
    from suites.named_cases import get_case

    d = derive(get_case(name), runner)
    pool, caches = build_kv_caches(d)
    adapter = MooncakeStoreAdapter(make_context(d))
    adapter.register(caches)
    return adapter, pool, caches


def test_mooncake_store_regions_and_put_get():
    """What RankLocalStoreLayout derived, and the buffers the put and the get carry."""
    import torch

    from conformance.connectors.memory import CopyEngine

    page = 8 * 128 * 256 * 2  # one layer's 128-token bf16 block: 8 heads x 128 tokens x (K|V 256)

    # 128 -> 64 split (LBNHC): the registered view is (8, 8, 64, 256); grouped back to 4
    # logical blocks, each layer is one region whose block_len is the whole 128-token page.
    split, pool, caches = _registered("flashinfer-b128-k64")
    (layout,) = [db.store_layout for db in split.worker.token_dbs]
    views = list(caches.values())
    assert tuple(views[0].shape) == (8, 8, 64, 256)
    assert layout.kv_caches_base_addr == [t.data_ptr() for t in views] and layout.block_len == [page, page]
    # one register_buffer per storage: the shared pool
    assert split.store_service.registered == [(pool.data_ptr(), pool.numel())]

    # LHBNC: a block is 8 head segments of 128 x 256 x 2 bytes, 4 blocks apart per head.
    per_head, head_pool, _ = _registered("dense-fa-b128-lhbnc")
    (layout,) = [db.store_layout for db in per_head.worker.token_dbs]
    segment = page // 8
    assert layout.block_len == [segment] * 16
    assert [a - head_pool.data_ptr() for a in layout.kv_caches_base_addr[:3]] == [0, 4 * segment, 8 * segment]

    # BLHNC: stride(0) * num_blocks is the whole storage, so one region of whole rows.
    row, row_pool, _ = _registered("dense-fa-b128-blhnc")
    (layout,) = [db.store_layout for db in row.worker.token_dbs]
    assert layout.kv_caches_base_addr == [row_pool.data_ptr()] and layout.block_len == [2 * page]
    assert row.descriptors("model.layers.1.self_attn.attn", 3) == [(row_pool.data_ptr() + 3 * 2 * page, 2 * page)]

    # The put of block 1: one key per group, one buffer per region (layer), each a whole
    # page read from block 1; the get of block 2 writes the same object back there.
    engine = CopyEngine(views)
    pool.copy_(torch.randint(-128, 128, (pool.numel(),), dtype=torch.int8, generator=torch.Generator().manual_seed(1)))
    snapshot = pool.clone()
    service = split.store_service
    puts, gets = len(service.puts), len(service.gets)
    handle = split.store([1], engine)
    ((key, buffers),) = service.puts[puts:]
    assert "@group:0@" in key and buffers == [(t.data_ptr() + page, page) for t in views]
    assert torch.equal(pool, snapshot)
    pool.zero_()
    split.load(handle, [2], engine)
    ((get_key, targets),) = service.gets[gets:]
    assert get_key == key and targets == [(t.data_ptr() + 2 * page, page) for t in views]
    expected = torch.zeros_like(pool)
    for t in views:
        lo = t.data_ptr() - pool.data_ptr()
        expected[lo + 2 * page : lo + 3 * page] = snapshot[lo + page : lo + 2 * page]
    assert torch.equal(pool, expected)

    # A key the store no longer holds: the get fails and the connector reports the block.
    service.objects.clear()
    with pytest.raises(RuntimeError, match=r"failed loads .*\['2'\]"):
        split.load(handle, [2], engine)
