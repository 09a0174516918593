"""Tests of the drivers of older vLLM releases, run in a release venv
(``bash scripts/release_env.sh 0.21.0``, then that venv's ``python -m pytest tests/releases``).

Skipped, with the reason, where the installed vLLM is not a generation-1 release (0.19 to
0.28): the project's own venv holds 0.33.0, and CI builds no release venv.
"""

from __future__ import annotations

import functools
import pytest


@functools.lru_cache(maxsize=None)
def gen1_problem() -> str | None:
    from conformance.pytest_plugin import vllm_absent

    if vllm_absent():
        return "vLLM is not installed"
    from gpu_impl import vllm_api

    return vllm_api.api_problem("gen1")


@pytest.fixture(scope="session", autouse=True)
def _gen1_vllm() -> None:
    problem = gen1_problem()
    if problem is not None:
        pytest.skip(f"needs a generation-1 vLLM (bash scripts/release_env.sh 0.21.0): {problem}")
