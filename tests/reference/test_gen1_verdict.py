"""The one comparator on generation-1 observations (``conformance.diff`` against
``reference.gen1``), without vLLM: observations made from the reference itself pass,
and each changed fact lands in its kind."""

from __future__ import annotations

import dataclasses
import pytest

from conformance.diff import compare, compare_runners
from gpu_impl.observation import GroupObs, Observation, TensorObs, ViewObs
from reference.errors import StartupError
from reference.gen1 import derive_gen1
from reference.releases import MRV2_KERNEL_BLOCKS, holds

from suites.release_cases import gen1_cases


def perfect(case, runner: str) -> Observation:
    """What a generation-1 vLLM that behaves exactly as the reference says would show."""
    try:
        d = derive_gen1(case, runner)
    except StartupError as exc:  # vLLM refuses with the predicted message
        return Observation(case.name, runner, error=f"ValueError: {exc.vllm_message}", error_stage="kernel_block_sizes",
                           fidelity="runner_methods")
    return Observation(
        case.name,
        runner,
        layout=d.layout,
        groups=tuple(GroupObs(tuple(g.layer_names), g.spec.block_size, "FullAttentionSpec") for g in d.groups),
        num_blocks=d.num_blocks,
        tensors=tuple(TensorObs(t.size, tuple(t.shared_by), 0, 0, 0) for t in d.kv_cache_tensors),
        # The driver reports the runner's own prepare_kernel_block_sizes: MRv2 before 0.22
        # never calls it (gpu_impl/vllm_cpu/gen1.py), so there is nothing to report.
        kernel_block_sizes=(tuple(d.selected_kernel_block_sizes)
                            if runner == "mrv1" or holds(MRV2_KERNEL_BLOCKS, d.version) else None),
        registered={n: ViewObs(v.shape, v.stride, v.dtype, v.storage_offset, v.storage_nbytes) for n, v in d.registered.items()},
        fidelity="runner_methods",
    )


CASES = {c.name: c for c in gen1_cases("0.21.0")}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("runner", ["mrv1", "mrv2"])
def test_an_observation_the_reference_would_make_conforms(name: str, runner: str) -> None:
    assert compare(CASES[name], runner, perfect(CASES[name], runner)).status == "pass"


def _kinds(case, runner, obs) -> set[str]:
    """The kinds of the facts' divergences (the contract's are tested in tests/reference/test_contract.py)."""
    return {d.kind for d in compare(case, runner, obs).divergences if d.basis == "facts"}


def test_each_changed_fact_lands_in_its_kind() -> None:
    case = CASES["gen1-flashinfer-b128"]
    good = perfect(case, "mrv1")
    layer = case.layers[0].name
    view = good.registered[layer]
    assert _kinds(case, "mrv1", dataclasses.replace(good, layout="HND")) == {"layout"}
    assert _kinds(case, "mrv1", dataclasses.replace(good, num_blocks=9)) == {"num_blocks"}
    assert _kinds(case, "mrv1", dataclasses.replace(good, kernel_block_sizes=(128,))) == {"kernel_block_size"}
    unsplit = dataclasses.replace(view, shape=(10, 2, 128, 8, 128))
    assert _kinds(case, "mrv1", dataclasses.replace(good, registered={**good.registered, layer: unsplit})) == {"registered_shape"}
    assert _kinds(case, "mrv1", dataclasses.replace(good, tensors=good.tensors[:1])) == {"tensor_placement"}


def test_a_refusal_for_another_reason_does_not_conform() -> None:
    case = CASES["gen1-flex-b8"]  # 0.21: no kernel block size fits block 8 under MRv1
    wrong = dataclasses.replace(perfect(case, "mrv1"), error="ValueError: Block size must be a multiple of 16.")
    assert compare(case, "mrv1", perfect(case, "mrv1")).status == "pass"
    assert compare(case, "mrv1", wrong).status == "fail"


def test_the_42846_shape_is_an_mrv1_mrv2_mismatch_before_0_22_only() -> None:
    for version, mismatched in (("0.19.1", True), ("0.20.0", True), ("0.21.0", True), ("0.22.0", False)):
        case = next(c for c in gen1_cases(version) if c.name == "gen1-flashinfer-b128")
        diffs = compare_runners(case, perfect(case, "mrv1"), perfect(case, "mrv2"))
        assert bool(diffs) is mismatched, (version, [d.message for d in diffs])
