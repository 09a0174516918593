"""Block tables of the releases before 0.32: rows of kernel block ids, and MRv1's ``move_row``
before 0.27 (``reference.releases.BLOCK_TABLES_HOLD_KERNEL_IDS``, ``MRV1_MOVE_ROW_CLEARS_SOURCE``).

The same schedule is predicted for the target release and for an older one: the older
release's tables must hold each block id as its kernel ids, its slots must not change (the
slot invariant), and the comparator and the contract must judge each release's rows in
their own unit.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest

from conformance.checks.contract import _own_slot
from conformance.diff import compare_schedule
from conformance.schedules import plan_schedules
from reference.block_tables.mrv1 import MRv1BlockTable
from reference.block_tables.scenarios import predict_runner
from reference.config import ScenarioError, normalize_scenario
from reference.kernel_blocks import expand_block_id
from suites.named_cases import CASES
from suites.release_cases import gen1_cases

SEED = 7


def _at(name: str, version: str):
    return dataclasses.replace(CASES[name], vllm_version=version)


def _expanded(ids, ratio):
    return [k for b in ids for k in expand_block_id(b, ratio)]


@pytest.mark.parametrize("runner", ["mrv1", "mrv2"])
def test_before_032_the_tables_hold_each_block_id_as_its_kernel_ids(runner: str) -> None:
    old = plan_schedules(_at("flashinfer-b128-k64", "0.31.0"), SEED, 1).scenarios[0]
    new = plan_schedules(_at("flashinfer-b128-k64", "0.33.0"), SEED, 1).scenarios[0]
    assert old["kernel_ids"] == {"mrv1": [2], "mrv2": [2]} and "kernel_ids" not in new
    assert {k: v for k, v in old.items() if k != "kernel_ids"} == new  # the same schedule otherwise
    before, after = predict_runner(old, runner), predict_runner(new, runner)
    assert before["ids_per_block"] == [2] and after["ids_per_block"] == [1]
    assert before["widths"] == [2 * w for w in after["widths"]]
    batches = 0
    for b, a, step in zip(before["steps"], after["steps"], normalize_scenario(new)["steps"]):
        assert b["blocks"] == {req: [_expanded(ids, 2) for ids in groups] for req, groups in a["blocks"].items()}
        if "tables" in a:
            batches += 1
            assert b["slot_mappings"] == a["slot_mappings"]  # the slot invariant
            assert b["kernel_tables"] == b["tables"]  # handed to the builders as they are
            # The ids a request holds are where 0.32's builders expand its row to.
            for i, (req, _) in enumerate(step["batch"]):
                n = 2 * len(a["blocks"][req][0])
                assert b["kernel_tables"][0][i][:n] == a["kernel_tables"][0][i][:n]
    assert batches


def test_mrv2_tables_hold_scheduler_ids_until_022() -> None:
    case = next(c for c in gen1_cases("0.21.0") if c.name == "gen1-flashinfer-b128")
    plan = plan_schedules(case, SEED, 1)
    assert plan.scenarios and plan.scenarios[0]["kernel_ids"]["mrv2"] is None
    assert plan.scenarios[0]["kernel_ids"]["mrv1"] == [2]
    assert plan.scenarios[0]["draft"] is None and plan.scenarios[0]["mrv1_move_clears_source"] is False
    later = plan_schedules(dataclasses.replace(case, vllm_version="0.28.0"), SEED, 1).scenarios[0]
    assert later["kernel_ids"] == {"mrv1": [2], "mrv2": [2]} and "mrv1_move_clears_source" not in later


def test_the_comparator_judges_kernel_id_rows_as_they_are() -> None:
    case = _at("flashinfer-b128-k64", "0.31.0")
    plan = plan_schedules(case, SEED, 1)
    scenario = plan.scenarios[0]
    predicted = predict_runner(scenario, "mrv1")
    got = copy.deepcopy(predicted)
    layers = sorted(plan.layer_kernel_block_sizes["mrv1"]["runner"])
    for step in got["steps"]:
        if "kernel_tables" in step:
            step["kernel_tables"] = [{"group": 0, "owner": "runner", "layers": layers, "rows": step["tables"][0]}]
    judge = lambda observed: compare_schedule(case, "mrv1", scenario, predicted, observed,  # noqa: E731
                                              plan.layer_kernel_block_sizes["mrv1"])
    assert judge(got) == ()
    wrong = copy.deepcopy(got)
    wrong["ids_per_block"] = [1]
    assert [d.field for d in judge(wrong)] == [f"schedule {scenario['name']}: ids stored per block id"]


def test_move_row_keeps_the_source_before_027() -> None:
    for clears, (row0, count0) in ((True, ([0, 0, 0], 0)), (False, ([5, 6, 0], 2))):
        table = MRv1BlockTable(16, 2, 3, 8, move_clears_source=clears)
        table.add_row([5, 6], 0)
        table.move_row(0, 1)
        assert (table.row(0), table.num_blocks(0)) == (row0, count0)
        assert table.valid(1) == [5, 6]


@pytest.mark.parametrize("world", [1, 2])
def test_the_contract_reads_a_slot_in_the_rows_own_unit(world: int) -> None:
    logical, block, ratio = [7, 3], 128, 2
    for position in range(0, 2 * block * world, 5):
        expected = _own_slot(logical, position, block, (world, 0, 1))
        assert _own_slot(_expanded(logical, ratio), position, block, (world, 0, 1), ratio) == expected


@pytest.mark.parametrize("bad", [{"mrv3": None}, {"mrv1": [0]}, {"mrv1": [2, 2]}, {"mrv1": True}, [1]])
def test_a_malformed_kernel_ids_entry_is_refused_with_its_value(bad) -> None:
    scenario = {"max_num_reqs": 2, "max_num_batched_tokens": 8, "groups": [{"block_size": 16, "max_num_blocks": 4}],
                "steps": [], "kernel_ids": bad}
    with pytest.raises(ScenarioError, match="kernel_ids"):
        normalize_scenario(scenario)
    with pytest.raises(ScenarioError, match="mrv1_move_clears_source"):
        normalize_scenario({**scenario, "kernel_ids": None, "mrv1_move_clears_source": "no"})


def test_rows_before_027_are_not_widened_to_128_tokens() -> None:
    case = next(c for c in gen1_cases("0.25.0") if c.name == "gen1-fa-b16")
    old = plan_schedules(case, SEED, 1).scenarios[0]
    new = plan_schedules(dataclasses.replace(case, vllm_version="0.27.0"), SEED, 1).scenarios[0]
    assert old["widths_token_aligned"] is False and "widths_token_aligned" not in new
    max_blocks = old["groups"][0]["max_num_blocks"]
    for runner in ("mrv1", "mrv2"):
        assert predict_runner(old, runner)["widths"] == [max_blocks]
        assert predict_runner(new, runner)["widths"][0] % (128 // 16) == 0


def test_mrv2_slots_before_029_are_judged_by_who_is_live() -> None:
    """0.19-0.28 free a step's slots in set order: the same blocks in other slots conform, a
    request missing does not."""
    case = next(c for c in gen1_cases("0.25.0") if c.name == "gen1-fa-b16")
    plan = plan_schedules(case, SEED, 1)
    scenario = plan.scenarios[0]
    assert scenario["mrv2_frees_in_id_order"] is False
    predicted = predict_runner(scenario, "mrv2")
    got = copy.deepcopy(predicted)
    for observed_step in got["steps"]:
        observed_step.pop("kernel_tables", None)  # the driver's per-attention-group entries: not compared here
    step = next(s for s in got["steps"] if len(s["locations"]) >= 2)
    a, b = list(step["locations"])[:2]
    step["locations"][a], step["locations"][b] = step["locations"][b], step["locations"][a]
    judge = lambda observed: compare_schedule(case, "mrv2", scenario, predicted, observed, None)  # noqa: E731
    assert [d for d in judge(got) if "live requests" in d.field or "locations" in d.field] == []
    del step["locations"][a]
    assert any("live requests" in d.field for d in judge(got))
