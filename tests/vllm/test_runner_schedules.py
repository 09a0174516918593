"""Request schedules through each runner's own block tables, as ``kvconform run`` checks them.

Every named case a schedule fits runs seeded schedules (``conformance.schedules``)
through the block tables, slot mappings and attention groups MRv1's and MRv2's own
``initialize_kv_cache`` built, and is diffed step by step with the reference
(kinds ``block_table`` / ``slot_mapping``). Meta-tests replace a function only one
runner's own code calls by a plausible wrong variant and assert the divergence is
reported for that runner only. Each failure prints the seed, the config and a replay line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from conformance.diff import compare, kinds_of
from conformance.expectations import Environment, case_facts, classify, load
from conformance.schedules import plan_schedules, schedule_summary
from conformance.replay import replay_command
from gpu_impl.vllm_cpu.planning import observe
from gpu_impl.vllm_cpu.runner_tables import schedule_support
from reference.backends import VLLM_VERSION
from suites.named_cases import CASES
from suites.profiles import PROJECT_SEED

pytestmark = pytest.mark.kvconform_vllm

REPO = Path(__file__).resolve().parents[2]
SCHEDULES = 2

SCHEDULE_MUTATION_KINDS = frozenset({"block_table", "slot_mapping"})
"""The kinds the meta-tests below prove are caught (``test_mutations`` counts them)."""


@pytest.fixture(scope="module", autouse=True)
def _interpreter() -> None:
    why = schedule_support()
    if why is not None:
        pytest.skip(f"vLLM's block-table kernels cannot run in this process: {why}")


def _run(case_name: str, seed: int = PROJECT_SEED):
    case = CASES[case_name]
    plan = plan_schedules(case, seed, SCHEDULES)
    observations = {runner: observe(case, runner, schedules=plan.scenarios) for runner in ("mrv1", "mrv2")}
    comparisons = {runner: compare(case, runner, obs, plan) for runner, obs in observations.items()}
    return plan, observations, comparisons


def _explain(case_name: str, comparisons, seed: int = PROJECT_SEED) -> str:
    case = CASES[case_name]
    lines = [f"seed: {seed}", f"config: {case.to_json()}", f"replay: {replay_command(case, seed, SCHEDULES)}"]
    for runner, c in comparisons.items():
        lines += [f"{runner}: {c.status}"] + [f"  {d.message}" for d in c.divergences[:12]]
    return "\n".join(lines)


def _schedulable() -> list[str]:
    return [name for name, case in CASES.items() if plan_schedules(case, PROJECT_SEED, 1).scenarios]


@pytest.mark.parametrize("case_name", _schedulable())
def test_schedules_through_both_runners_match_the_reference(case_name: str) -> None:
    plan, observations, comparisons = _run(case_name)
    for runner, obs in observations.items():
        if obs.unsupported or obs.error:
            continue  # judged by compare() as a refusal; nothing was scheduled
        summary = schedule_summary(plan, obs)
        if obs.fidelity == "shared":
            # The runner's own initialize_kv_cache could not be driven on CPU (MRv2's Mamba
            # "align" state context needs CUDA): no block tables of its own to schedule
            # through, and the report says why.
            assert summary["run"] == 0 and "not driven" in summary["not_run"], (runner, summary)
            continue
        assert summary["run"] == SCHEDULES, (runner, summary)
    # None but the shipped expectations' findings (MRv1's slot mapping of a circular buffer).
    schedule = [d for c in comparisons.values() for d in c.divergences if d.kind in ("block_table", "slot_mapping")]
    facts = {case_name: case_facts(CASES[case_name], observations.values())}
    verdict = classify(schedule, Environment(_installed_version(), facts, VLLM_VERSION), load())
    assert not verdict.unexpected, _explain(case_name, comparisons)


def _installed_version() -> str:
    import vllm

    return vllm.__version__


def test_named_cases_mostly_schedule() -> None:
    """Every named case but the refused, unsupported and attention-free ones gets schedules."""
    assert len(_schedulable()) >= 30


def _padded(plan) -> tuple[bool, bool]:
    steps = [s for sc in plan.scenarios for s in sc["steps"] if s.get("batch")]
    rows = any(s.get("num_reqs_padded", len(s["batch"])) > len(s["batch"]) for s in steps)
    tokens = any(s.get("num_tokens_padded", 0) > sum(len(p) for _, p in s["batch"]) + sum(s.get("dummy_tokens", []))
                 for s in steps)
    return rows, tokens


CASE = "flashinfer-b128-k64"


def test_mrv1_slot_mappings_without_their_padding_are_seen_in_mrv1_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """``GPUModelRunner._get_slot_mappings`` (gpu_model_runner.py) cut to the real tokens:
    the padded tokens a CUDA graph replays have no slot (PAD_SLOT_ID) to skip."""
    import vllm.v1.worker.gpu_model_runner as mrv1_module

    plan, _, comparisons = _run(CASE)
    assert _padded(plan)[1], "the schedules have no token padding: the mutant could not show"
    assert {c.status for c in comparisons.values()} == {"pass"}, _explain(CASE, comparisons)
    original = mrv1_module.GPUModelRunner._get_slot_mappings

    def unpadded(self, num_tokens_padded, num_reqs_padded, num_tokens_unpadded, ubatch_slices=None):
        by_gid, by_layer = original(self, num_tokens_padded, num_reqs_padded, num_tokens_unpadded, ubatch_slices)
        return {gid: t[:num_tokens_unpadded] for gid, t in by_gid.items()}, by_layer

    monkeypatch.setattr(mrv1_module.GPUModelRunner, "_get_slot_mappings", unpadded)
    _, _, comparisons = _run(CASE)
    assert kinds_of(comparisons["mrv1"].divergences) == {"slot_mapping"}, _explain(CASE, comparisons)
    assert comparisons["mrv2"].status == "pass", _explain(CASE, comparisons)


def test_mrv2_gather_without_request_padding_is_seen_in_mrv2_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """``GPUModelRunner.prepare_attn`` (gpu/model_runner.py) gathering only the real
    requests: the padded rows CUDA graphs replay are missing from the tables."""
    import vllm.v1.worker.gpu.model_runner as mrv2_module

    plan, _, comparisons = _run(CASE)
    assert _padded(plan)[0], "the schedules have no request padding: the mutant could not show"
    assert {c.status for c in comparisons.values()} == {"pass"}, _explain(CASE, comparisons)
    original = mrv2_module.GPUModelRunner.prepare_attn

    def unpadded(self, input_batch):
        batch = SimpleNamespace(**{**vars(input_batch), "num_reqs_after_padding": int(input_batch.idx_mapping.shape[0])})
        return original(self, batch)

    monkeypatch.setattr(mrv2_module.GPUModelRunner, "prepare_attn", unpadded)
    _, _, comparisons = _run(CASE)
    assert kinds_of(comparisons["mrv2"].divergences) == {"block_table"}, _explain(CASE, comparisons)
    assert comparisons["mrv1"].status == "pass", _explain(CASE, comparisons)


def test_mrv2_speculator_kernel_tables_are_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """MRv2's speculator expands the draft's block table with its own attention group
    (128-token kernel blocks on this case), the runner's own group with the target's 64:
    a speculator that reused the runner's groups would show as a block_table divergence."""
    import vllm.v1.worker.gpu.spec_decode.eagle.speculator as speculator_module  # noqa: F401

    name = "mla-gqa-draft-b128-k64"
    plan, observations, comparisons = _run(name)
    # The facts predict the speculator's own 128-token tables; the contract sees them read
    # 64-token kernel blocks (known: mrv2-speculator-draft-table-unexpanded).
    assert _by_facts(comparisons["mrv2"]) == set(), _explain(name, comparisons)
    assert {d.kind for d in comparisons["mrv2"].divergences if d.basis == "contract"} <= {"kernel_blocks", "kernel_table"}
    steps = [st for s in observations["mrv2"].schedules for st in s["steps"] if "kernel_tables" in st]
    owners = {(e["owner"], e["layers"][0]) for st in steps for e in st["kernel_tables"]}
    assert ("drafter", "draft.layers.2.attn") in owners and ("runner", "draft.layers.2.attn") in owners, owners
    from gpu_impl.vllm_cpu import runner_tables

    original = runner_tables._MRv2Schedule.__init__

    def shared_groups(self, instance, sc):
        original(self, instance, sc)
        own = [e for e in self.entries if e[1] == "runner"]
        self.entries = own + [(gid, "drafter", group) for gid, _, group in own]

    monkeypatch.setattr(runner_tables._MRv2Schedule, "__init__", shared_groups)
    _, _, comparisons = _run(name)
    assert _by_facts(comparisons["mrv2"]) == {"block_table"}, _explain(name, comparisons)


# --- draft steps: the slot mappings the MRv1 drafter and the MRv2 speculator compute themselves ---


def _draft_steps(observation) -> list[dict]:
    return [d for s in observation.schedules for st in s.get("steps", ()) for d in st.get("draft_steps", ())]


def test_draft_steps_run_through_both_runners_own_drafters() -> None:
    """Every forward of a draft case's schedules is followed by the drafter's (MRv1) and the
    speculator's (MRv2) own draft steps, in the drafts' group, and they match the facts."""
    name = "mla-gqa-draft-b64"
    plan, observations, comparisons = _run(name)
    forwards = sum(1 for sc in plan.scenarios for st in sc["steps"] if st["batch"])
    for runner, obs in observations.items():
        steps = _draft_steps(obs)
        assert len(steps) == forwards * plan.scenarios[0]["draft"]["steps"], (runner, len(steps), forwards)
        assert all(d["group"] == 0 and d["slot_mapping"] and -1 not in d["slot_mapping"] for d in steps), runner
        assert schedule_summary(plan, obs)["draft_steps"] == len(steps)
    assert {c.status for c in comparisons.values()} == {"pass"}, _explain(name, comparisons)


def test_the_mrv1_drafter_ignoring_dcp_is_seen_by_the_contract_only() -> None:
    """Under DCP the MRv1 drafter addresses its draft tokens without DCP (a finding:
    expectation mrv1-drafter-draft-slots-ignore-dcp); the facts model that, the contract
    does not accept it; MRv2's speculator conforms."""
    name = "mla-gqa-draft-dcp2"
    _, observations, comparisons = _run(name)
    assert comparisons["mrv2"].status == "pass", _explain(name, comparisons)
    mrv1 = comparisons["mrv1"].divergences
    assert mrv1 and _by_facts(comparisons["mrv1"]) == set(), _explain(name, comparisons)
    assert {(d.kind, d.basis) for d in mrv1} == {("slot_address", "contract")}, _explain(name, comparisons)
    assert all(" draft step " in d.field for d in mrv1), _explain(name, comparisons)


def test_the_findings_repro_shows_the_mrv1_drafter_ignoring_dcp() -> None:
    """docs/findings/repro_mrv1_drafter_dcp_draft_slots.py, as a reader runs it: exit 1 and
    the slots the report quotes (vLLM's own two functions, side by side)."""
    repro = REPO / "docs" / "findings" / "repro_mrv1_drafter_dcp_draft_slots.py"
    done = subprocess.run([sys.executable, str(repro)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr[-2000:]
    assert "position 16: runner's slot on DCP rank 0 is 56, the drafter's 80" in done.stdout, done.stdout


def test_an_mrv1_drafter_on_kernel_blocks_is_seen_in_mrv1_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A drafter that addressed draft tokens with its builders' kernel block size (64)
    but the logical block table (128-token blocks), a plausible slip since the drafter is
    handed the kernel block sizes (llm_base_proposer.py initialize_attn_backend)."""
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    name = "mla-gqa-draft-b128-k64"
    _, _, comparisons = _run(name)
    assert comparisons["mrv1"].status == "pass", _explain(name, comparisons)
    original = SpecDecodeBaseProposer.initialize_attn_backend

    def on_kernel_blocks(self, kv_cache_config, kernel_block_sizes=None):
        original(self, kv_cache_config, kernel_block_sizes)
        if kernel_block_sizes:
            self.block_size = kernel_block_sizes[self.kv_cache_gid]

    monkeypatch.setattr(SpecDecodeBaseProposer, "initialize_attn_backend", on_kernel_blocks)
    _, _, mutated = _run(name)
    assert {(d.kind, d.basis) for d in mutated["mrv1"].divergences} == {("slot_mapping", "facts"), ("slot_address", "contract")}, \
        _explain(name, mutated)
    assert [d.message for d in mutated["mrv2"].divergences] == [d.message for d in comparisons["mrv2"].divergences]


def test_an_mrv2_speculator_that_does_not_advance_is_seen_in_mrv2_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """``update_draft_inputs`` (target_dependent_ar/speculator.py) without advancing the
    positions: every draft step writes the first draft token's slot again."""
    from vllm.v1.worker.gpu.spec_decode.target_dependent_ar import speculator as ar

    name = "mla-gqa-draft-b64"
    original = ar.update_draft_inputs

    def stuck(*args, **kwargs):
        return original(*args, **{**kwargs, "advance_draft_positions": False})

    monkeypatch.setattr(ar, "update_draft_inputs", stuck)
    _, _, comparisons = _run(name)
    assert {(d.kind, d.basis) for d in comparisons["mrv2"].divergences} == {("slot_mapping", "facts"), ("slot_address", "contract")}, \
        _explain(name, comparisons)
    assert comparisons["mrv1"].status == "pass", _explain(name, comparisons)


def _by_facts(comparison) -> set[str]:
    """The kinds of a comparison's divergences from the reference's facts (not the contract's)."""
    return {d.kind for d in comparison.divergences if d.basis == "facts"}


# --- cross attention: the encoder K/V each runner's cross-attention builder writes ---------------

CROSS_CASE = "enc-dec-cross-b16"


def _cross_steps(observation) -> list[dict]:
    return [st for s in observation.schedules for st in s.get("steps", ()) if "cross_slot_mappings" in st]


def test_cross_attention_schedules_write_each_encoder_input_once() -> None:
    """An encoder-decoder case's schedules run through both runners: the cross-attention group's
    blocks hold each request's encoder tokens from its first step (never appended), its builder
    writes them then and only then, and everything matches the reference and the contract."""
    plan, observations, comparisons = _run(CROSS_CASE)
    assert all(sc.get("encoder_lens") for sc in plan.scenarios), plan.scenarios
    first_steps = sum(1 for sc in plan.scenarios for st in sc["steps"] for _, pos in st["batch"] if pos and pos[0] == 0)
    assert first_steps >= 2, "no request starts in the schedules: nothing would be written"
    for runner, obs in observations.items():
        summary = schedule_summary(plan, obs)
        assert summary["run"] == SCHEDULES and summary.get("cross_slot_mappings"), (runner, summary)
        written = sum(len(e["slot_mapping"]) for st in _cross_steps(obs) for e in st["cross_slot_mappings"])
        expected = sum(sc["encoder_lens"][req] for sc in plan.scenarios for st in sc["steps"]
                       for req, pos in st["batch"] if pos and pos[0] == 0)
        assert written == expected, (runner, written, expected)
    assert {c.status for c in comparisons.values()} == {"pass"}, _explain(CROSS_CASE, comparisons)


def test_cross_slots_assuming_contiguous_blocks_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """``_get_cross_slot_mapping`` (cross_attention.py) addressing a request's encoder tokens as if
    its cross-attention blocks were contiguous (``first block * B + i``): both runners' builders
    call it, the facts and the contract both see it."""
    import vllm.model_executor.layers.attention.cross_attention as cross_module

    original = cross_module._get_cross_slot_mapping

    def contiguous(encoder_seq_lens, block_table_tensor, kv_cache_spec, device):
        import torch

        slots = [torch.arange(int(n), dtype=torch.int64) + int(block_table_tensor[i][0]) * kv_cache_spec.block_size
                 for i, n in enumerate(encoder_seq_lens) if n]
        return torch.cat(slots) if slots else original(encoder_seq_lens, block_table_tensor, kv_cache_spec, device)

    monkeypatch.setattr(cross_module, "_get_cross_slot_mapping", contiguous)
    _, _, comparisons = _run(CROSS_CASE)
    for runner, comparison in comparisons.items():
        assert _by_facts(comparison) == {"slot_mapping"}, _explain(CROSS_CASE, comparisons)
        assert {d.kind for d in comparison.divergences if d.basis == "contract"} == {"slot_address"}, runner


def test_mrv1_encoder_lengths_of_a_cuda_graph_capture_are_seen_in_mrv1_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """MRv1's ``_get_encoder_seq_lens`` (gpu_model_runner.py) answering every step as it answers a
    CUDA-graph capture (each request's encoder input as long as the encoder budget): its cross
    builder writes slots for tokens the request does not have."""
    import vllm.v1.worker.gpu_model_runner as mrv1_module

    original = mrv1_module.GPUModelRunner._get_encoder_seq_lens

    def as_captured(self, num_scheduled_tokens, kv_cache_spec, num_reqs, for_cudagraph_capture=False):
        return original(self, num_scheduled_tokens, kv_cache_spec, num_reqs, for_cudagraph_capture=True)

    monkeypatch.setattr(mrv1_module.GPUModelRunner, "_get_encoder_seq_lens", as_captured)
    _, _, comparisons = _run(CROSS_CASE)
    assert _by_facts(comparisons["mrv1"]) == {"slot_mapping"}, _explain(CROSS_CASE, comparisons)
    assert {d.kind for d in comparisons["mrv1"].divergences if d.basis == "contract"} == {"slot_address"}
    assert comparisons["mrv2"].status == "pass", _explain(CROSS_CASE, comparisons)


def test_a_process_without_the_interpreter_says_why(tmp_path: Path) -> None:
    """Triton imported before TRITON_INTERPRET=1 could be set: the report says the schedules did not run, and why."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "CUDA_VISIBLE_DEVICES")}
    code = (
        "import triton, sys\n"
        "from conformance.cli import main\n"
        f"sys.exit(main(['run', '--case', 'flashinfer-b16', '--json', {str(tmp_path / 'r.json')!r}]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    report = json.loads((tmp_path / "r.json").read_text())
    summaries = [r["schedules"] for res in report["results"] for r in res["runners"].values()]
    assert summaries and all(s["run"] == 0 and "TRITON_INTERPRET" in s["not_run"] for s in summaries), summaries
