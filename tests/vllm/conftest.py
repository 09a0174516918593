"""Tests that diff the reference model against the real vLLM 0.33.0, driven on CPU.

The whole folder is skipped, with a reason, when vLLM is not importable or is not
the release the reference was read from. The CPU shim set is applied once per
session (environment first, before anything imports vLLM); what it did is
printed in the pytest header.
"""

from __future__ import annotations

import pytest

from gpu_impl.vllm_cpu import shims
from reference.backends import VLLM_VERSION

# Environment variables vLLM reads at import time must be set before the import.
shims.prepare_env()
vllm = pytest.importorskip("vllm", reason="vllm is not importable; the reference-vs-vLLM diff needs vllm==0.33.0")
if getattr(vllm, "__version__", None) != VLLM_VERSION:
    pytest.skip(
        f"vllm {getattr(vllm, '__version__', '?')} is installed; these tests target {VLLM_VERSION}, "
        "the release reference/ was read from",
        allow_module_level=True,
    )
_SHIMS = shims.apply()


def pytest_report_header(config):
    return ["vllm_cpu shims:"] + [f"  - {line}" for line in _SHIMS]


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/vllm/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.vllm)
