"""A seeded sweep of random valid configs through vLLM 0.33.0's own layout code.

The sample comes from the kvconform pytest plugin: ``kv_case`` is parametrized at
collection time over ``sampled_cases(config)``, drawn from ``--kvconform-seed`` (default:
the project seed) with ``--kvconform-examples`` cases (ci profile: 1000), so test ids are
identical on every xdist worker and every failure prints the seed, the config JSON and
the replay command (``assert_conforms``).
"""

from __future__ import annotations

import math

import pytest


from conformance.pytest_plugin import check_runners_agree, run_settings, sampled_cases
from reference.derive import derive
from reference.errors import NotModeledError, StartupError

MIN_MODELED_SHARE = 2 / 3
"""At least two thirds of the sampled configs must be compared, not skipped."""


def _modeled(case) -> bool:
    try:
        derive(case)
    except StartupError:
        return True  # vLLM must refuse it the same way: still a comparison
    except NotModeledError:
        return False
    return True


def test_sweep_compares_at_least_200_configs(pytestconfig) -> None:
    s = run_settings(pytestconfig)
    cases = sampled_cases(pytestconfig)
    if s.profile in ("ci", "thorough") and not s.examples_given:
        assert len(cases) >= 1000, f"the {s.profile} profile samples only {len(cases)} configs"
    needed = math.ceil(len(cases) * MIN_MODELED_SHARE)
    if len(cases) >= 300:
        needed = max(needed, 200)
    modeled = sum(_modeled(c) for c in cases)
    assert modeled >= needed, (
        f"only {modeled} of {len(cases)} sampled configs (seed {s.seed}) are modeled by the reference; need {needed}"
    )


def test_random_config_conforms(kv_case, kv_observed, assert_conforms, pytestconfig) -> None:
    if not any(layer.is_draft for layer in kv_case.layers):
        # Observes through the installed vLLM; skips with the reason where vLLM cannot run
        # the case or the reference does not model it; fails with seed, config and replay.
        assert_conforms(kv_case, "mrv1")
        return
    # A draft makes the runners differ in what they build (D1): diff each runner against
    # the reference, then the runners against each other, known divergences allowed.
    observations = {runner: kv_observed(kv_case, runner) for runner in ("mrv1", "mrv2")}
    for runner, observation in observations.items():
        assert_conforms(kv_case, observation, runner=runner)
    s = run_settings(pytestconfig)
    check_runners_agree(kv_case, observations["mrv1"], observations["mrv2"], seed=s.seed, profile=s.profile)


def test_check_runners_agree_allows_only_declared_differences() -> None:
    from conformance.pytest_plugin import reference_observation
    from suites.named_cases import CASES

    case = CASES["gqa+draft-attention-backend-b128"]
    mrv1, mrv2 = reference_observation(case, "mrv1"), reference_observation(case, "mrv2")
    expected = check_runners_agree(case, mrv1, mrv2)
    assert expected and all(m.expectation.id == "mrv2-draft-keeps-attention-backend" for m in expected)
    plain = CASES["flashinfer-b128-k64"]
    moved = reference_observation(plain, "mrv2")
    moved.layout = "BHLNC"
    with pytest.raises(AssertionError) as info:
        check_runners_agree(plain, reference_observation(plain, "mrv1"), moved, seed=7, profile="ci")
    text = str(info.value)
    assert "layout: MRv1 'LBNHC' vs MRv2 'BHLNC'" in text and "seed: 7" in text
    assert f"config: {plain.to_json()}" in text and "replay: kvconform run --case flashinfer-b128-k64" in text
