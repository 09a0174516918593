"""Draft steps in request schedules: the scenario's ``draft`` entry, the reference's
prediction of the MRv1 drafter's and the MRv2 speculator's own steps, and the contract's
``slot_address`` check of them. No vLLM needed (the drivers' side is in
``tests/vllm/test_runner_schedules.py``)."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest

from conformance.checks.contract import PAD_SLOT, contract_divergences
from conformance.diff import compare_schedule, kinds_of
from conformance.schedules import DRAFT_STEPS, plan_schedules
from gpu_impl.observation import GroupObs
from reference.block_tables.scenarios import predict_runner
from reference.config import ScenarioError, normalize_scenario
from suites.named_cases import CASES

B = 16


def _scenario(positions: list[int], *, dcp=(1, 0, 1), max_model_len: int = 1024, steps: int = 2) -> dict:
    """One request holding blocks 3, 5 (and 7), one forward at ``positions``, ``steps`` draft steps."""
    return {"name": "d", "max_num_reqs": 2, "max_num_batched_tokens": 64, "dcp": list(dcp),
            "groups": [{"kind": "attention", "block_size": B, "max_num_blocks": 8}],
            "draft": {"group": 0, "steps": steps, "max_model_len": max_model_len},
            "steps": [{"ops": [["add", "r0", [[3, 5, 7]]]], "batch": [["r0", positions]]}]}


def _drafts(scenario: dict, runner: str) -> list[dict]:
    return predict_runner(scenario, runner)["steps"][0]["draft_steps"]


@pytest.mark.parametrize("draft", [
    {"group": 1, "steps": 2, "max_model_len": 64},
    {"group": 0, "steps": 0, "max_model_len": 64},
    {"group": 0, "steps": 2},
    {"group": 0, "steps": True, "max_model_len": 64},
    [0, 2, 64],
])
def test_a_malformed_draft_entry_is_one_line_naming_it(draft) -> None:
    scenario = dict(_scenario([0]), draft=draft)
    with pytest.raises(ScenarioError) as info:
        normalize_scenario(scenario)
    assert "draft" in str(info.value) and "\n" not in str(info.value)


def test_a_draft_in_a_mamba_group_is_refused() -> None:
    scenario = _scenario([0])
    scenario["groups"][0] = {"kind": "mamba", "block_size": B, "max_num_blocks": 8}
    scenario["steps"][0]["ops"] = [["add", "r0", [[3]]]]
    with pytest.raises(ScenarioError, match="mamba"):
        normalize_scenario(scenario)


@pytest.mark.parametrize("runner", ["mrv1", "mrv2"])
def test_draft_tokens_follow_the_last_position(runner: str) -> None:
    """Positions 14, 15 forward; the drafts sit at 16 and 17: block 5, offsets 0 and 1."""
    steps = _drafts(_scenario([14, 15]), runner)
    assert [s["positions"] for s in steps] == [[16], [17]]
    assert [s["slot_mapping"] for s in steps] == [[5 * B + 0], [5 * B + 1]]


def test_past_max_model_len_mrv1_pads_and_mrv2_clamps() -> None:
    """D15: at max_model_len 17 the second draft token (position 17) has no place."""
    mrv1 = _drafts(_scenario([14, 15], max_model_len=17), "mrv1")
    mrv2 = _drafts(_scenario([14, 15], max_model_len=17), "mrv2")
    assert mrv1[1] == {"group": 0, "positions": [0], "slot_mapping": [PAD_SLOT]}
    assert mrv2[1] == {"group": 0, "positions": [16], "slot_mapping": [5 * B + 0]}


def test_under_dcp_mrv2_addresses_the_ranks_tokens_and_mrv1_does_not() -> None:
    """DCP 2, rank 0: a virtual block spans 32 tokens, even positions are this rank's.
    Position 16 is rank 0's, in virtual block 0 (block 3) at local offset 8; 17 is rank 1's.
    The MRv1 drafter's kernel takes no DCP: it addresses block 5 (16 // 16) offset 0."""
    scenario = _scenario([14, 15], dcp=(2, 0, 1))
    assert [s["slot_mapping"] for s in _drafts(scenario, "mrv2")] == [[3 * B + 8], [PAD_SLOT]]
    assert [s["slot_mapping"] for s in _drafts(scenario, "mrv1")] == [[5 * B + 0], [5 * B + 1]]


def _as_observed(predicted: dict) -> dict:
    """The reference's steps as a driver reports them (kernel tables per attention group: none here)."""
    got = copy.deepcopy(predicted)
    for step in got["steps"]:
        step.pop("kernel_tables", None)
    return got


def _contract_kinds(scenario: dict, runner: str, drafts: list[dict] | None = None) -> list:
    got = _as_observed(predict_runner(scenario, runner))
    if drafts is not None:
        got["steps"][0]["draft_steps"] = drafts
    observation = SimpleNamespace(registered={}, groups=(GroupObs(("a",), B, "FullAttentionSpec"),),
                                  kernel_block_sizes=(B,), schedules=(got,))
    return contract_divergences(CASES["flashinfer-b16"], runner, observation, (scenario,))


def test_the_contract_holds_draft_slots_to_the_tokens_own() -> None:
    scenario = _scenario([14, 15])
    assert _contract_kinds(scenario, "mrv2") == []
    assert _contract_kinds(scenario, "mrv1") == []
    wrong = [{"group": 0, "positions": [16], "slot_mapping": [5 * B + 1]}]
    found = _contract_kinds(scenario, "mrv2", wrong)
    assert kinds_of(found) == {"slot_address"} and "draft step 1" in found[0].field, [d.message for d in found]


def test_the_contract_sees_the_mrv1_drafter_ignore_dcp() -> None:
    scenario = _scenario([14, 15], dcp=(2, 0, 1))
    assert _contract_kinds(scenario, "mrv2") == []
    found = _contract_kinds(scenario, "mrv1")
    assert kinds_of(found) == {"slot_address"}
    assert {d.expected for d in found} == {3 * B + 8, PAD_SLOT}, [d.message for d in found]


def test_past_max_model_len_a_slot_must_stay_in_the_requests_blocks() -> None:
    scenario = _scenario([14, 15], max_model_len=17)
    assert _contract_kinds(scenario, "mrv1") == [] and _contract_kinds(scenario, "mrv2") == []
    stray = [{"group": 0, "positions": [16], "slot_mapping": [5 * B]},
             {"group": 0, "positions": [16], "slot_mapping": [9 * B]}]  # block 9 is not the request's
    found = _contract_kinds(scenario, "mrv2", stray)
    assert kinds_of(found) == {"slot_address"} and "past max_model_len" in str(found[0].expected)


def test_the_facts_compare_every_draft_step() -> None:
    scenario = _scenario([14, 15])
    case = CASES["flashinfer-b16"]
    for runner in ("mrv1", "mrv2"):
        predicted = predict_runner(scenario, runner)
        assert compare_schedule(case, runner, scenario, predicted, _as_observed(predicted)) == ()
        got = _as_observed(predicted)
        got["steps"][0]["draft_steps"][1]["slot_mapping"][0] += 1
        found = compare_schedule(case, runner, scenario, predicted, got)
        assert kinds_of(found) == {"slot_mapping"} and "draft step 2" in found[0].field
        got["steps"][0]["draft_steps"].pop()
        assert any("draft steps run" in d.field for d in compare_schedule(case, runner, scenario, predicted, got))
        # A driver that cannot run draft steps reports none: not a divergence.
        del got["steps"][0]["draft_steps"]
        assert compare_schedule(case, runner, scenario, predicted, got) == ()


def test_a_case_with_a_draft_plans_draft_steps_in_its_drafts_group() -> None:
    plan = plan_schedules(CASES["mla-gqa-draft-dcp2"], 7, 2)
    assert plan.scenarios and all(sc["draft"] == {"group": 0, "steps": DRAFT_STEPS, "max_model_len": 4096}
                                  for sc in plan.scenarios)
    assert all("draft" not in sc for sc in plan_schedules(CASES["flashinfer-b16"], 7, 1).scenarios)
