"""The installed release's own NIXL worker on what each runner registered
(``gpu_impl.connectors.nixl_gen1``), judged by ``reference.gen1``: every logical block's transfer
descriptors are exactly its bytes, and the worker refuses exactly where the reference predicts,
which is vLLM #42846 itself ("NIXL + FlashInfer fails with Qwen3 MRV2 and --block-size 128"):
before 0.22 MRv2's views hold logical blocks while the worker counts kernel blocks."""

from __future__ import annotations

import pytest

from conformance.connectors.mooncake_gen1 import NIXL_CONNECTOR, judge
from reference.errors import StartupError
from reference.gen1 import derive_gen1, nixl_refusal
from reference.releases import MRV2_KERNEL_BLOCKS, holds
from installed_release import installed_version, release_cases


@pytest.mark.parametrize("runner", ["mrv1", "mrv2"])
@pytest.mark.parametrize("case", release_cases(), ids=lambda c: c.name)
def test_nixl_moves_each_blocks_bytes_and_refuses_exactly_where_predicted(case, runner: str) -> None:
    from gpu_impl.connectors.nixl_gen1 import observe_registration

    obs = observe_registration(case, runner)
    assert obs.unsupported is None, obs.unsupported
    verdict = judge(case, runner, obs, NIXL_CONNECTOR)
    try:
        predicted = nixl_refusal(derive_gen1(case, runner))
    except StartupError:  # the runner itself refuses: nothing reaches the connector
        assert obs.runner_error and verdict.status == "unsupported", verdict
        return
    assert verdict.status != "failure", (verdict.detail, verdict.findings)
    assert (verdict.status == "refusal") == (predicted is not None), (verdict.status, verdict.detail, predicted)
    if verdict.status == "refusal":
        assert "predicted by the reference" in verdict.detail
    else:
        assert obs.transfers and len(obs.transfers) == derive_gen1(case, runner).num_blocks, obs.notes


def test_42846_is_a_nixl_refusal_on_mrv2_until_022() -> None:
    from gpu_impl.connectors.nixl_gen1 import observe_registration

    case = next(c for c in release_cases() if c.name == "gen1-flashinfer-b128")
    verdict = judge(case, "mrv2", observe_registration(case, "mrv2"), NIXL_CONNECTOR)
    if holds(MRV2_KERNEL_BLOCKS, installed_version()):
        assert verdict.status == "pass", verdict.detail
    else:
        assert verdict.status == "refusal" and "same number of blocks" in verdict.detail, verdict.detail
