"""A seeded sweep of random valid configs through vLLM 0.33.0's own layout code.

The sample is drawn at collection time from a fixed seed (KVCONFORM_SEED overrides), so
test ids are identical on every xdist worker and every failure names a replayable case.
"""

from __future__ import annotations

import os
import shlex

import pytest

from conformance.diff import compare
from reference.derive import derive
from reference.errors import NotModeledError, StartupError
from suites.strategies import sample_cases

SEED = int(os.environ.get("KVCONFORM_SEED", "20261129"))
COUNT = int(os.environ.get("KVCONFORM_SWEEP", "300"))
CASES = sample_cases(SEED, COUNT)


def _modeled(case) -> bool:
    try:
        derive(case)
    except StartupError:
        return True  # vLLM must refuse it the same way: still a comparison
    except NotModeledError:
        return False
    return True


def test_sweep_compares_at_least_200_configs() -> None:
    modeled = sum(_modeled(c) for c in CASES)
    assert modeled >= 200, f"only {modeled} of {COUNT} sampled configs (seed {SEED}) are modeled by the reference"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_random_config_conforms(case) -> None:
    from gpu_impl.vllm_cpu.planning import observe

    runners = ("mrv1", "mrv2") if any(layer.is_draft for layer in case.layers) else ("mrv1",)
    for runner in runners:
        result = compare(case, runner, observe(case, runner))
        if result.status == "not_modeled":
            pytest.skip(f"not modeled by the reference: {result.detail}")
        if result.status == "unsupported":
            pytest.skip(f"unsupported by this vLLM: {result.detail}")
        if result.status != "pass":
            lines = "\n".join(f"  {d.message}" for d in result.divergences)
            pytest.fail(
                f"seed {SEED}, runner {runner}:\n{lines}\n  config: {case.to_json()}\n"
                f"  replay: python -m gpu_impl.vllm_cpu.planning {shlex.quote(case.to_json())} {runner}",
                pytrace=False,
            )
