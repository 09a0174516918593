"""The installed release's own Mooncake worker on what each runner registered
(``gpu_impl.connectors.mooncake_gen1``), judged by ``reference.gen1``: it refuses exactly
where the reference predicts (0.19.x: the MLA + Eagle block-size assert, vLLM #39596), and
an MLA target with a GQA draft at block 64 passes from 0.20.0, after the fix."""

from __future__ import annotations

import pytest

from conformance.connectors.mooncake_gen1 import judge
from reference.errors import StartupError
from reference.gen1 import derive_gen1, mooncake_refusal
from reference.releases import MOONCAKE_KERNEL_SYNC, holds
from installed_release import installed_version, release_cases


@pytest.mark.parametrize("runner", ["mrv1", "mrv2"])
@pytest.mark.parametrize("case", release_cases(), ids=lambda c: c.name)
def test_mooncake_refuses_exactly_where_the_reference_predicts(case, runner: str) -> None:
    from gpu_impl.connectors.mooncake_gen1 import observe_registration

    obs = observe_registration(case, runner)
    assert obs.unsupported is None, obs.unsupported
    verdict = judge(case, runner, obs)
    try:
        predicted = mooncake_refusal(derive_gen1(case, runner))
    except StartupError:  # the runner itself refuses: nothing reaches the connector
        assert obs.runner_error and verdict.status == "unsupported", verdict
        return
    assert (verdict.status == "refusal") == (predicted is not None), (verdict.status, verdict.detail, predicted)
    if verdict.status == "refusal":
        assert "predicted by the reference" in verdict.detail
    assert obs.transfers is not None or verdict.status == "refusal", obs.notes


@pytest.mark.parametrize("runner", ["mrv1", "mrv2"])
def test_mla_with_a_gqa_draft_is_refused_before_39596_and_passes_after(runner: str) -> None:
    from gpu_impl.connectors.mooncake_gen1 import observe_registration

    case = next(c for c in release_cases() if c.name == "gen1-mla-eagle-b64")
    verdict = judge(case, runner, observe_registration(case, runner))
    if not holds(MOONCAKE_KERNEL_SYNC, installed_version()):
        assert verdict.status == "refusal" and "assert self.block_size == kernel_block_size" in verdict.detail, verdict
    else:
        assert verdict.status == "pass", (verdict.detail, verdict.findings)
