"""The contract on vLLM 0.33.0's own code: every named case holds it (apart from the shipped
expectations), and wrong block tables and slot mappings in the runners' own code are caught
by it with no release facts at all (``compare(..., basis="contract")``).

The layout mutations' contract figures are in ``test_mutations.py``
(``test_what_the_contract_alone_catches``); these are the request-schedule ones.
"""

from __future__ import annotations

import pytest

from conformance.diff import compare, kinds_of
from conformance.expectations import RUN_KINDS, Environment, case_facts, classify, load
from conformance.replay import replay_command
from conformance.schedules import plan_schedules
from gpu_impl.vllm_cpu.planning import observe
from gpu_impl.vllm_cpu.runner_tables import schedule_support
from suites.named_cases import CASES
from suites.profiles import PROJECT_SEED

SCHEDULES = 2
CONTRACT_SCHEDULE_MUTATION_KINDS = frozenset({"slot_address", "kernel_table"})
"""The contract's schedule kinds the mutations below catch (test_mutations.test_every_kind_has_a_mutation)."""
CASE = "flashinfer-b128-k64"  # 128-token blocks in 64-token kernel blocks: tables are expanded


@pytest.fixture(scope="module", autouse=True)
def _interpreter() -> None:
    why = schedule_support()
    if why is not None:
        pytest.skip(f"vLLM's block-table kernels cannot run in this process: {why}")


def _judge(case_name: str, basis: str = "contract"):
    case = CASES[case_name]
    plan = plan_schedules(case, PROJECT_SEED, SCHEDULES)
    observations = {runner: observe(case, runner, schedules=plan.scenarios) for runner in ("mrv1", "mrv2")}
    return plan, observations, {runner: compare(case, runner, obs, plan, basis=basis) for runner, obs in observations.items()}


def _explain(case_name: str, comparisons) -> str:
    case = CASES[case_name]
    lines = [f"seed: {PROJECT_SEED}", f"config: {case.to_json()}", f"replay: {replay_command(case, PROJECT_SEED, SCHEDULES)}"]
    for runner, c in comparisons.items():
        lines += [f"{runner}: {c.status}"] + [f"  {d.message}" for d in c.divergences[:12]]
    return "\n".join(lines)


def test_every_named_case_holds_the_contract_with_its_schedules() -> None:
    """Both runners, their schedules included, judged by the contract alone; what it finds is
    exactly what the shipped expectations acknowledge, and the schedules did run."""
    divergences, facts, ran = [], {}, 0
    for name, case in CASES.items():
        _, observations, comparisons = _judge(name)
        facts[name] = case_facts(case, observations.values())
        ran += sum(1 for obs in observations.values() for s in obs.schedules if "steps" in s)
        for c in comparisons.values():
            divergences += c.divergences
    import vllm

    verdict = classify(divergences, Environment(vllm.__version__, facts), load(), kinds=RUN_KINDS)
    assert not verdict.unexpected, "\n".join(d.message for d in verdict.unexpected)
    assert ran >= 100, f"only {ran} schedules ran: the slot and table checks were hardly exercised"
    assert {m.expectation.id for m in verdict.expected} == {
        "mrv2-speculator-draft-builder-off-the-views", "mrv2-speculator-draft-table-unexpanded",
        "mrv1-drafter-draft-slots-ignore-dcp"}  # the draft steps' finding (docs/findings/mrv1-drafter-dcp-draft-slots.md)


def test_slots_one_token_off_are_caught_by_the_contract(monkeypatch: pytest.MonkeyPatch) -> None:
    """``GPUModelRunner._get_slot_mappings`` (MRv1) handing every real token the next slot."""
    import vllm.v1.worker.gpu_model_runner as mrv1_module

    _, _, clean = _judge(CASE)
    assert {c.status for c in clean.values()} == {"pass"}, _explain(CASE, clean)
    original = mrv1_module.GPUModelRunner._get_slot_mappings

    def next_slot(self, *args, **kwargs):
        by_gid, by_layer = original(self, *args, **kwargs)
        shifted = {gid: t.where(t < 0, t + 1) for gid, t in by_gid.items()}
        return shifted, by_layer

    monkeypatch.setattr(mrv1_module.GPUModelRunner, "_get_slot_mappings", next_slot)
    _, _, mutated = _judge(CASE)
    assert kinds_of(mutated["mrv1"].divergences) == {"slot_address"}, _explain(CASE, mutated)
    assert mutated["mrv2"].status == "pass", _explain(CASE, mutated)
    assert all(d.basis == "contract" for d in mutated["mrv1"].divergences)


def test_kernel_blocks_out_of_order_are_caught_by_the_contract(monkeypatch: pytest.MonkeyPatch) -> None:
    """``AttentionGroup.map_to_kernel_block_table`` (vllm/v1/worker/utils.py) listing each
    block's kernel blocks backwards: every slot still lands, but attention reads the halves
    of a block in the wrong order."""
    from vllm.v1.worker.utils import AttentionGroup

    original = AttentionGroup.map_to_kernel_block_table

    def backwards(self, block_table, ubatch_idx: int = 0):
        out = original(self, block_table, ubatch_idx)
        if self.kernel_block_size is None:
            return out
        ratio = self.kv_cache_spec.block_size // self.kernel_block_size
        rows, cols = out.shape
        return out.reshape(rows, cols // ratio, ratio).flip(-1).reshape(rows, cols)

    monkeypatch.setattr(AttentionGroup, "map_to_kernel_block_table", backwards)
    _, _, mutated = _judge(CASE)
    caught = {runner: kinds_of(c.divergences) for runner, c in mutated.items()}
    assert "kernel_table" in set().union(*caught.values()), _explain(CASE, mutated)
    assert set().union(*caught.values()) <= {"kernel_table"}, _explain(CASE, mutated)


def test_the_same_mutation_judged_by_the_facts_is_a_block_table_divergence_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the facts as well (an unreleased build: drift), the reference's own tables see it."""
    import vllm.v1.worker.gpu_model_runner as mrv1_module

    original = mrv1_module.GPUModelRunner._get_slot_mappings

    def next_slot(self, *args, **kwargs):
        by_gid, by_layer = original(self, *args, **kwargs)
        return {gid: t.where(t < 0, t + 1) for gid, t in by_gid.items()}, by_layer

    monkeypatch.setattr(mrv1_module.GPUModelRunner, "_get_slot_mappings", next_slot)
    _, _, mutated = _judge(CASE, basis="drift")
    found = {(d.kind, d.basis) for d in mutated["mrv1"].divergences}
    assert found == {("slot_address", "contract"), ("slot_mapping", "drift")}, _explain(CASE, mutated)
