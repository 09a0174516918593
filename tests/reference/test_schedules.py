"""Request schedules of a case without vLLM: the plan, the groups, and the comparator.

``conformance.diff.compare_schedule`` is the one place a schedule's observation is
judged; these tests feed it the reference's own prediction (no divergence) and planted
wrong observations (each a fitting divergence).
"""

from __future__ import annotations

import copy

import pytest

from conformance.diff import compare_schedule, kinds_of
from conformance.schedules import plan_schedules, schedule_summary
from reference.block_tables.scenarios import case_groups, predict_runner
from reference.derive import derive
from suites.named_cases import CASES

SEED = 11


def _plan(name: str, count: int = 2):
    return plan_schedules(CASES[name], SEED, count)


def test_plans_are_seeded_per_case_and_need_no_vllm() -> None:
    a, b = _plan("flashinfer-b128-k64"), _plan("flashinfer-b128-k64")
    assert a == b and len(a.scenarios) == 2 and a.scenarios[0] != a.scenarios[1]
    assert plan_schedules(CASES["flashinfer-b128-k64"], SEED + 1, 2).scenarios != a.scenarios
    # A case's schedules do not depend on the other cases of the run.
    assert _plan("flashinfer-b16").scenarios[0]["name"].startswith("flashinfer-b16#s11.")
    assert plan_schedules(CASES["flashinfer-b16"], SEED, 0).skipped


def test_case_groups_follow_the_reference_groups() -> None:
    d = derive(CASES["mamba-hybrid"], "mrv2")
    groups = case_groups(d)
    assert isinstance(groups, list) and len(groups) == len(d.groups)
    assert {g["kind"] for g in groups} == {"attention", "mamba"}
    swa = case_groups(derive(CASES["swa-hybrid-scaled"], "mrv1"))
    assert isinstance(swa, list) and any(g["sliding_window_reach"] > 0 for g in swa)
    split = case_groups(derive(CASES["flashinfer-b128-k64"], "mrv1"))
    assert split[0]["block_size"] == 128 and split[0]["kernel_block_size"] == 64


def test_a_cross_attention_case_schedules_its_encoder_inputs() -> None:
    """An encoder-decoder case: its cross-attention group's blocks hold each request's encoder
    tokens from the step it is added (never appended), every row is sized for the encoder budget
    too, and the reference predicts the builder's slots at each request's first step only."""
    from reference.block_tables.scenarios import MAX_NUM_ENCODER_INPUT_TOKENS

    case = CASES["enc-dec-cross-b16"]
    plan = plan_schedules(case, SEED, 2)
    assert plan.scenarios, plan.skipped
    groups = plan.scenarios[0]["groups"]
    assert [g["kind"] for g in groups] == ["attention", "cross"]
    row_len = max(case.max_model_len, MAX_NUM_ENCODER_INPUT_TOKENS)
    assert all(g["max_num_blocks"] == -(-row_len // 16) for g in groups)
    for sc in plan.scenarios:
        lens = sc["encoder_lens"]
        for step in sc["steps"]:
            for op in step["ops"]:
                if op[0] == "add":
                    assert len(op[2][1]) == -(-lens[op[1]] // 16), (op, lens[op[1]])
                if op[0] == "append":
                    assert op[2][1] == [], op
        for runner in ("mrv1", "mrv2"):
            predicted = predict_runner(sc, runner)
            for step, seen in zip(sc["steps"], predicted["steps"]):
                if "cross_slot_mappings" not in seen:
                    continue
                starting = [req for req, pos in step["batch"] if pos and pos[0] == 0]
                assert seen["cross_slot_mappings"][0] is None
                assert len(seen["cross_slot_mappings"][1]) == sum(lens[req] for req in starting)


def test_cross_slots_follow_the_kernel_rows() -> None:
    from reference.block_tables.slots import cross_slot_mapping

    rows = [[7, 3, 9], [5, 0, 0]]
    batch = [("a", [0, 1]), ("b", [4])]  # b is past its first step: its encoder K/V are written
    assert cross_slot_mapping(rows, 4, batch, {"a": 6, "b": 3}) == [28, 29, 30, 31, 12, 13]
    from reference.errors import ConfigError

    with pytest.raises(ConfigError, match="13 encoder tokens need 4 kernel blocks"):
        cross_slot_mapping(rows, 4, batch, {"a": 13})


@pytest.mark.parametrize(("lens", "message"), [
    ({}, "request 'r0' has no encoder_lens entry"),
    ({"r0": 0}, "encoder_lens['r0'] 0 is not an integer in"),
    ({"r0": "12"}, "encoder_lens['r0'] '12' is not an integer in"),
    ([12], "encoder_lens [12] is not an object"),
])
def test_bad_encoder_lengths_are_named(lens, message: str) -> None:
    from reference.config import ScenarioError, normalize_scenario

    scenario = {"name": "x", "max_num_reqs": 2, "max_num_batched_tokens": 16, "encoder_lens": lens,
                "groups": [{"kind": "attention", "block_size": 16, "max_num_blocks": 4},
                           {"kind": "cross", "block_size": 16, "max_num_blocks": 4}],
                "steps": [{"ops": [["add", "r0", [[1], [2]]]], "batch": [["r0", [0]]]}]}
    with pytest.raises(ScenarioError, match=message.replace("[", r"\[").replace("]", r"\]")):
        normalize_scenario(scenario)


def _cross_judge(runner: str, mutate=None):
    plan = plan_schedules(CASES["enc-dec-cross-b16"], SEED, 1)
    scenario = plan.scenarios[0]
    got = copy.deepcopy(predict_runner(scenario, runner))
    layers = sorted(name for name in plan.layer_kernel_block_sizes[runner]["runner"] if "encoder_attn" in name)
    for step in got["steps"]:
        if "cross_slot_mappings" in step:
            step["cross_slot_mappings"] = [{"group": 1, "owner": "runner", "layers": layers, "slot_mapping": slots}
                                           for slots in step["cross_slot_mappings"][1:]]
            step.pop("kernel_tables")
    if mutate:
        mutate(got)
    return compare_schedule(CASES["enc-dec-cross-b16"], runner, scenario, predict_runner(scenario, runner), got,
                            plan.layer_kernel_block_sizes[runner])


def _writing_step(got):
    return next(step for step in got["steps"] if step.get("cross_slot_mappings", [{}])[0].get("slot_mapping"))


@pytest.mark.parametrize("runner", ["mrv1", "mrv2"])
def test_cross_slots_are_judged(runner: str) -> None:
    assert _cross_judge(runner) == ()

    def shifted(got):
        _writing_step(got)["cross_slot_mappings"][0]["slot_mapping"][-1] += 1

    def missing(got):
        _writing_step(got)["cross_slot_mappings"] = []

    for mutate, needle in ((shifted, "cross_slot_mapping[g=1, "), (missing, "no cross-attention builder")):
        divergences = _cross_judge(runner, mutate)
        assert kinds_of(divergences) == {"slot_mapping"}, [d.message for d in divergences]
        assert any(needle in d.message for d in divergences), [d.message for d in divergences]


def _judge(name: str, runner: str, mutate=None):
    plan = _plan(name, 1)
    scenario = plan.scenarios[0]
    got = copy.deepcopy(predict_runner(scenario, runner))
    # The reference's kernel tables as a driver reports them: one entry per attention group.
    for step in got["steps"]:
        if "kernel_tables" in step:
            layers = sorted(plan.layer_kernel_block_sizes[runner]["runner"])
            step["kernel_tables"] = [{"group": 0, "owner": "runner", "layers": layers, "rows": step["kernel_tables"][0]}]
    if mutate:
        mutate(got)
    return compare_schedule(CASES[name], runner, scenario, predict_runner(scenario, runner), got,
                            plan.layer_kernel_block_sizes[runner])


def _first_batch(got):
    return next(step for step in got["steps"] if "tables" in step)


@pytest.mark.parametrize("runner", ["mrv1", "mrv2"])
def test_the_reference_agrees_with_itself(runner: str) -> None:
    assert _judge("flashinfer-b128-k64", runner) == ()


def _wrong_slot(got) -> None:
    _first_batch(got)["slot_mappings"][0][0] += 1


def _wrong_block(got) -> None:
    _first_batch(got)["tables"][0][0][0] += 1


def _unsplit_kernel(got) -> None:
    step = _first_batch(got)
    entry = step["kernel_tables"][0]
    entry["rows"] = step["tables"][0]  # not expanded to 64-token kernel blocks


def _failed(got) -> None:
    got["error"] = {"step": 0, "message": "RuntimeError: boom"}
    got["steps"] = []


@pytest.mark.parametrize(("mutate", "kind", "needle"), [
    (_wrong_slot, "slot_mapping", "slot_mappings[g=0]"),
    (_wrong_block, "block_table", "tables[g=0] row 0"),
    (_unsplit_kernel, "block_table", "kernel_tables[g=0"),
    (_failed, "block_table", "failing step"),
])
def test_a_planted_wrong_observation_is_a_fitting_divergence(mutate, kind: str, needle: str) -> None:
    divergences = _judge("flashinfer-b128-k64", "mrv1", mutate)
    assert kinds_of(divergences) == {kind}, [d.message for d in divergences]
    assert any(needle in d.field for d in divergences), [d.field for d in divergences]
    assert all("\n" not in d.message and "flashinfer-b128-k64#s11.0" in d.message for d in divergences)
