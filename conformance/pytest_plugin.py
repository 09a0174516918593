"""kvconform's pytest plugin (``pytest11`` entry point): markers and fixtures for users' tests.

Fixtures:
- ``kv_reference``: a function ``(case_or_name, runner="mrv1") -> Derivation``.
Markers:
- ``gpu``: the test needs a CUDA GPU; skipped with a reason where there is none.
- ``vllm``: the test needs vLLM importable; skipped with a reason where it is not.
"""

from __future__ import annotations

import importlib.util
import shutil
from typing import Any, Callable

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU; skipped with a reason on CPU")
    config.addinivalue_line("markers", "vllm: needs the vllm package importable")


def _has_gpu() -> bool:
    # Avoid importing torch.cuda at collection time: a driver tool on PATH is the cheap
    # signal; tests that pass this gate still check torch.cuda.is_available() themselves.
    return shutil.which("nvidia-smi") is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU (none found: no nvidia-smi); run scripts/gpu_check.sh on a GPU machine")
    no_vllm = pytest.mark.skip(reason="needs vllm importable (pip install 'kvconform[vllm]')")
    has_gpu = _has_gpu()
    has_vllm = importlib.util.find_spec("vllm") is not None
    for item in items:
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(no_gpu)
        if "vllm" in item.keywords and not has_vllm:
            item.add_marker(no_vllm)


@pytest.fixture
def kv_reference() -> Callable[..., Any]:
    """Derive the reference layout of a named case or a ``CaseConfig``."""
    from reference.config import CaseConfig
    from reference.derive import derive
    from suites.named_cases import get_case

    def _derive(case: "CaseConfig | str", runner: str = "mrv1"):
        return derive(get_case(case) if isinstance(case, str) else case, runner)

    return _derive
