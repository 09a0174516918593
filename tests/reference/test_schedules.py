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


def test_a_cross_attention_case_says_why_it_has_no_schedule() -> None:
    from suites.strategies import sample_cases

    case = next(c for c in sample_cases(SEED, 300) if any(layer.kind == "cross" for layer in c.layers)
                and plan_schedules(c, SEED, 1).skipped and "cross" in plan_schedules(c, SEED, 1).skipped)
    plan = plan_schedules(case, SEED, 2)
    assert not plan.scenarios and "cross_attention" in plan.skipped
    assert schedule_summary(plan, object())["not_run"] == plan.skipped


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
