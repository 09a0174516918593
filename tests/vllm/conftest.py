"""Tests that diff the reference model against the real vLLM, driven on CPU.

Every test in this folder is skipped, with a reason, when vLLM is not installed, and
fails with one line when vLLM is installed but does not provide what the drivers import
(``gpu_impl.vllm_api``): a CI job against an undrivable release must not be green with
nothing checked (an autouse fixture: a module-level skip in a conftest named on the
command line would abort the whole pytest run).
The CPU shim set is applied once per session; the environment part is set here,
before anything imports vLLM, and the full list is printed in the pytest header.
"""

from __future__ import annotations

import functools

import pytest

from gpu_impl.vllm_cpu import shims
from reference.backends import VLLM_VERSION

# Environment variables vLLM reads at import time must be set before the import.
shims.prepare_env()

_NEEDS = f"the reference-vs-vLLM diff needs vLLM (the reference's facts are vLLM {VLLM_VERSION}'s: pip install 'kvconform[vllm]')"


@functools.lru_cache(maxsize=None)
def _vllm_problem() -> str | None:
    """Why vLLM cannot be driven here, or None (the plugin's check, one source of truth)."""
    from conformance.pytest_plugin import vllm_problem

    return vllm_problem()


@pytest.fixture(scope="session", autouse=True)
def vllm_cpu_shims() -> list[str]:
    """Skip the folder without vLLM; fail it where vLLM cannot be driven; otherwise apply
    the CPU shim set once."""
    from conformance.pytest_plugin import vllm_absent

    if vllm_absent():
        pytest.skip(f"vllm is not installed; {_NEEDS}")
    problem = _vllm_problem()
    if problem is not None:
        pytest.fail(f"vLLM is installed but cannot be driven: {problem}", pytrace=False)
    return shims.apply()


def pytest_report_header(config):
    problem = _vllm_problem()
    if problem is not None:
        return [f"vllm_cpu: tests/vllm cannot run: {problem}"]
    return ["vllm_cpu shims:"] + [f"  - {line}" for line in shims.apply()]


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "/tests/vllm/" in str(item.path).replace("\\", "/"):
            item.add_marker(pytest.mark.kvconform_vllm)
