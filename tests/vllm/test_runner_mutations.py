"""Runner-level meta-tests: a bug in ONE runner's own code is seen in that runner only.

Each test replaces a function that only one runner's own code calls (in
``gpu_model_runner.py``, the MRv1 drafter, or MRv2's draft-config path) by a plausible
wrong variant and asserts that the comparison ``kvconform run`` makes reports a fitting
divergence for the affected runner, none for the other, and an ``mrv1_mrv2_mismatch``
(or, where the bug makes the runners agree, that the expected mismatch disappears).
The same case unpatched is checked first, so a test can only pass because of the patch.
"""

from __future__ import annotations

import pytest

from conformance.diff import compare, compare_runners, kinds_of
from gpu_impl.vllm_cpu.planning import observe
from suites.named_cases import CASES

pytestmark = pytest.mark.kvconform_vllm


def _run(case_name: str):
    case = CASES[case_name]
    observations = {runner: observe(case, runner) for runner in ("mrv1", "mrv2")}
    comparisons = {runner: compare(case, runner, obs) for runner, obs in observations.items()}
    return observations, comparisons, compare_runners(case, observations["mrv1"], observations["mrv2"])


def _explain(comparisons, mismatches) -> str:
    lines = [f"{r}: {c.status} {[d.message for d in c.divergences]}" for r, c in comparisons.items()]
    return "\n".join(lines + [d.message for d in mismatches])


def test_mrv1_runner_forgetting_the_kernel_split_is_seen_in_mrv1_only(monkeypatch: pytest.MonkeyPatch) -> None:
    import vllm.v1.worker.gpu_model_runner as mrv1_module

    observations, comparisons, mismatches = _run("flashinfer-b128-k64")
    assert observations["mrv1"].fidelity == "runner", observations["mrv1"].fidelity_reason
    assert {c.status for c in comparisons.values()} == {"pass"} and not mismatches, _explain(comparisons, mismatches)

    def prepare_kernel_block_sizes(kv_cache_config, attn_groups):
        # A runner that hands its manager block size to allocation and builders.
        return [group.kv_cache_spec.block_size for group in kv_cache_config.kv_cache_groups]

    # Only GPUModelRunner.initialize_kv_cache calls this binding (MRv2 has its own).
    monkeypatch.setattr(mrv1_module, "prepare_kernel_block_sizes", prepare_kernel_block_sizes)
    observations, comparisons, mismatches = _run("flashinfer-b128-k64")
    assert comparisons["mrv2"].status == "pass", _explain(comparisons, mismatches)
    # FlashInfer cannot run 128-token blocks: the runner's own binding step refuses
    # (map_kv_cache_to_kernel_blocks), where the reference predicts a clean start.
    assert comparisons["mrv1"].status == "fail"
    assert kinds_of(comparisons["mrv1"].divergences) == {"startup_error"}, _explain(comparisons, mismatches)
    assert observations["mrv1"].error_stage == "bind" and "64-token kernel blocks" in observations["mrv1"].error
    assert {"error", "kernel_block_sizes"} <= {d.field for d in mismatches}, _explain(comparisons, mismatches)


def test_mrv1_drafter_inheriting_the_target_backend_is_seen_in_mrv1_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    case = "gqa+draft-attention-backend-b128"
    observations, comparisons, mismatches = _run(case)
    # Unpatched: MRv1's drafter auto-selects (FLASHINFER), MRv2 keeps --attention-backend.
    assert observations["mrv1"].layer_backends["draft.layers.2.attn"] == "FLASHINFER"
    assert observations["mrv2"].layer_backends["draft.layers.2.attn"] == "TRITON_ATTN"
    assert {c.status for c in comparisons.values()} == {"pass"}, _explain(comparisons, mismatches)
    assert any(d.field == "draft.layers.2.attn.backend" for d in mismatches)

    def _create_draft_vllm_config(self):
        return self.vllm_config  # inherits the target's attention backend, as MRv2 does

    monkeypatch.setattr(SpecDecodeBaseProposer, "_create_draft_vllm_config", _create_draft_vllm_config)
    observations, comparisons, mismatches = _run(case)
    assert observations["mrv1"].layer_backends["draft.layers.2.attn"] == "TRITON_ATTN"
    assert comparisons["mrv2"].status == "pass", _explain(comparisons, mismatches)
    assert comparisons["mrv1"].status == "fail"
    assert "kernel_block_size" in kinds_of(comparisons["mrv1"].divergences), _explain(comparisons, mismatches)
    assert mismatches == (), "the runners now agree: the mismatch the reference expects is gone"


def test_mrv2_draft_path_not_inheriting_the_target_backend_is_seen_in_mrv2_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.config.speculative import SpeculativeConfig

    def apply_draft_overrides(self, vllm_config):
        import dataclasses

        # Auto-selects the draft's backend like MRv1 (the override MRv2 must not make).
        return dataclasses.replace(
            vllm_config, attention_config=dataclasses.replace(vllm_config.attention_config, backend=None)
        )

    monkeypatch.setattr(SpeculativeConfig, "apply_draft_overrides", apply_draft_overrides)
    observations, comparisons, mismatches = _run("gqa+draft-attention-backend-b128")
    assert observations["mrv2"].layer_backends["draft.layers.2.attn"] == "FLASHINFER"
    assert comparisons["mrv1"].status == "pass", _explain(comparisons, mismatches)
    assert comparisons["mrv2"].status == "fail"
    assert "kernel_block_size" in kinds_of(comparisons["mrv2"].divergences), _explain(comparisons, mismatches)
