"""vLLM 0.33.0's LMCacheMPConnector (gpu_impl/connectors/lmcache_mp.py).

Without lmcache (the main venv) the connector does not import and every case is
unsupported with that reason. With lmcache (``bash scripts/lmcache_env.sh python -m pytest
tests/connectors/test_lmcache_mp.py``) LMCache's own registration, planning and CPU
gather/scatter run against a recording fake server."""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = [
    pytest.mark.kvconform_vllm,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch (validate_registration builds CPU tensors)"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm 0.33.0 importable (pip install 'kvconform[vllm]')"),
]

ADAPTER = "gpu_impl.connectors.lmcache_mp:LMCacheMPAdapter"
CASES = ["nixl-dense-fa", "flashinfer-b128-k64", "dense-fa-b128-lhbnc", "mla-gqa-draft-b64", "mamba-hybrid"]
HAS_LMCACHE = importlib.util.find_spec("lmcache") is not None


@pytest.mark.skipif(HAS_LMCACHE, reason="lmcache is installed here: the driven cases are tested below")
def test_without_lmcache_every_case_is_unsupported():
    from conformance.connectors import validate_registration

    report = validate_registration(ADAPTER, cases=CASES, runners=("mrv1",))
    assert report.passed_cases == [], report.format()
    for name in CASES:
        (div,) = report.for_case(name)
        assert div.field == "register" and "lmcache is not installed" in div.message, report.format()


@pytest.mark.skipif(not HAS_LMCACHE, reason="needs lmcache (bash scripts/lmcache_env.sh python -m pytest ...)")
def test_lmcache_own_path():
    from conformance.connectors import validate_registration

    report = validate_registration(ADAPTER, cases=CASES, runners=("mrv1",))
    print(report.format())
    assert False, report.format()
