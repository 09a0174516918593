"""vLLM 0.33.0's LMCacheMPConnector (gpu_impl/connectors/lmcache_mp.py).

Without lmcache (the main venv) nothing of the connector imports: every case is
unsupported, with that reason. With lmcache (``bash scripts/lmcache_env.sh python -m pytest
tests/connectors/test_lmcache_mp.py``) the connector class vLLM resolves (LMCache's own) runs
its registration, planning and copies against LMCache's own server, in this process."""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = [
    pytest.mark.kvconform_vllm,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch (validate_registration builds CPU tensors)"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm 0.33.0 importable (pip install 'kvconform[vllm]')"),
]

SERVER_DRIVEN = "gpu_impl.connectors.lmcache_mp:LMCacheMPAdapter"
ENGINE_DRIVEN = "gpu_impl.connectors.lmcache_mp:LMCacheMPEngineDrivenAdapter"
CASES = ["nixl-dense-fa", "flashinfer-b128-k64", "dense-fa-b128-lhbnc", "mla-gqa-draft-b64", "mamba-hybrid"]
HAS_LMCACHE = importlib.util.find_spec("lmcache") is not None
needs_lmcache = pytest.mark.skipif(not HAS_LMCACHE, reason="needs lmcache: bash scripts/lmcache_env.sh python -m pytest tests/connectors/test_lmcache_mp.py")


@pytest.mark.skipif(HAS_LMCACHE, reason="lmcache is installed here: the driven cases are tested below")
def test_without_lmcache_every_case_is_unsupported():
    from conformance.connectors import validate_registration

    report = validate_registration(SERVER_DRIVEN, cases=CASES, runners=("mrv1",))
    assert report.passed_cases == [] and report.refused_cases == [], report.format()
    for result in report.results:
        assert result.status == "unsupported" and "lmcache is not installed" in result.detail, report.format()


def _by_case(report):
    return {r.case: r for r in report.results}


@needs_lmcache
def test_server_driven_path_across_layouts():
    """LMCache's default on CUDA: its server builds the cache context from the registered
    tensors and copies per group."""
    from conformance.connectors import validate_registration

    report = validate_registration(SERVER_DRIVEN, cases=[*CASES, "dense-fa-b128-blnhc"], runners=("mrv1",))
    # MLA target + GQA draft (two KV cache groups) are copied per group by the server.
    assert set(report.passed_cases) == {"nixl-dense-fa", "mla-gqa-draft-b64"}, report.format()
    results = _by_case(report)
    lhbnc = results["dense-fa-b128-lhbnc"]
    assert lhbnc.status == "refusal" and "does not support the 'LHBNC' KV cache layout" in lhbnc.detail
    assert "lmcache/integration/vllm/utils.py" in lhbnc.detail
    mamba = results["mamba-hybrid"]
    assert mamba.status == "refusal" and "mamba_cache_mode='none'" in mamba.detail
    # Kernel split 128 -> 64: half of every logical block moves (see the next test).
    assert results["flashinfer-b128-k64"].status == "failure"
    halves = [d for d in report.for_case("flashinfer-b128-k64") if d.field == "descriptors"]
    assert halves and all(d.observed.startswith("262144 bytes") for d in halves), report.format()
    # Blocks-first rows (a per-block stride over all layers): only LMCache's CUDA kernel copies them.
    rows = results["dense-fa-b128-blnhc"]
    assert rows.status == "unsupported" and "Non-tight per-block strides" in rows.detail, report.format()


@needs_lmcache
def test_server_driven_kernel_split_is_read_as_compression():
    """What LMCache is told and does for FlashInfer's 128-token blocks viewed as 64-token
    kernel blocks: the group's tokens_per_block (128, the spec) against the 64 slots per
    registered block read as a 2:1 *compressed* group, so logical block b addresses kernel
    block b (vLLM's logical block b is kernel blocks 2b and 2b+1)."""
    from conformance.connectors.validate import build_kv_caches, make_context
    from gpu_impl.connectors.lmcache_mp import LMCacheMPAdapter
    from reference.derive import derive
    from suites.named_cases import get_case

    d = derive(get_case("flashinfer-b128-k64"), "mrv1")
    _, caches = build_kv_caches(d)
    adapter = LMCacheMPAdapter(make_context(d))
    adapter.register(caches)
    ((_, args),) = [(rpc, a) for rpc, a in adapter.transport.sent if rpc == "register_kv_cache"]
    handles, infos = args[1], args[6]
    layer0 = next(iter(caches.values()))
    assert [h.tensor for h in handles] == list(caches.values())  # every tensor, in dict order
    assert [i.tokens_per_block for i in infos] == [128] and layer0.shape[2] == 64
    assert adapter.kernel_block_size == 64
    kernel_block = layer0.stride(0) * layer0.element_size()
    name = next(iter(caches))
    assert adapter.descriptors(name, 1) == [(layer0.data_ptr() + 1 * kernel_block, kernel_block)]
    # The store request carries the logical id, per group.
    stores = [a for rpc, a in adapter.transport.sent if rpc == "store"]
    assert stores and stores[0][2] == [[1]]


@needs_lmcache
def test_engine_driven_path():
    """LMCache's default on CPU tensors: the worker gathers/scatters, one group only."""
    from conformance.connectors import validate_registration

    report = validate_registration(ENGINE_DRIVEN, cases=["nixl-dense-fa", "mla-gqa-draft-b64"], runners=("mrv1",))
    assert report.passed_cases == ["nixl-dense-fa"], report.format()
    results = _by_case(report)
    two_groups = results["mla-gqa-draft-b64"]
    assert two_groups.status == "refusal" and "does not support multiple KV transfer groups" in two_groups.detail
