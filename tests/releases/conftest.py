"""Tests of the drivers of older vLLM releases, run in a release venv
(``bash scripts/release_env.sh 0.21.0``, then that venv's ``python -m pytest tests/releases``).

Each module says which releases it is for: the generation-1 ones (0.19 to 0.28) skip, with the
reason, where the installed vLLM is not one of them; ``test_gen2_facts`` where it is not a
generation-2 release older than the target that the reference has facts for (0.30 on). The
project's own venv holds the target release, so there every test here is skipped.
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


@pytest.fixture(scope="module", autouse=True)
def _release_vllm(request: pytest.FixtureRequest) -> None:
    if request.node.path.name == "test_gen2_facts.py":
        from installed_release import older_gen2_release_problem

        problem = older_gen2_release_problem()
        if problem is not None:
            pytest.skip(f"needs a generation-2 release older than the target (bash scripts/release_env.sh 0.30.0): "
                        f"{problem}")
        return
    problem = gen1_problem()
    if problem is not None:
        pytest.skip(f"needs a generation-1 vLLM (bash scripts/release_env.sh 0.21.0): {problem}")
