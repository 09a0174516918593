"""Both runners of a generation-1 vLLM (0.21 to 0.28) through their own allocate/reshape
code (``gpu_impl.vllm_cpu.gen1``) against ``reference.legacy``, and against each other:
vLLM #42846 (MRv2 at FlashInfer block 128 registering logical blocks) must show on 0.21.x
as an MRv1/MRv2 mismatch of the registered shapes, and nowhere on 0.22 and later."""

from __future__ import annotations

import pytest

from conformance.diff import compare, compare_runners
from suites.release_cases import gen1_cases


def _version() -> str:
    import vllm

    return vllm.__version__


def _cases():
    try:
        return gen1_cases(_version())
    except Exception:  # noqa: BLE001 - no vLLM: the folder's fixture skips with the reason
        return gen1_cases("0.21.0")


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c.name)
def test_each_runner_conforms_and_only_42846_splits_them(case) -> None:
    from gpu_impl.vllm_cpu.planning import observe

    observations = {runner: observe(case, runner) for runner in ("mrv1", "mrv2")}
    for runner, observation in observations.items():
        assert observation.fidelity == "runner_methods", observation
        result = compare(case, runner, observation)
        assert result.status == "pass", [d.message for d in result.divergences] or result.detail
    mismatches = compare_runners(case, observations["mrv1"], observations["mrv2"])
    buggy = _version().startswith("0.21.") and case.name.startswith("gen1-flashinfer-b128")
    if buggy:
        assert {d.field for d in mismatches} == {f"{layer.name}.shape" for layer in case.layers}
        (first, *_) = mismatches
        assert first.expected[0] == 2 * first.observed[0]  # MRv1: 64-token kernel blocks; MRv2: 128-token blocks
    else:
        assert mismatches == (), [d.message for d in mismatches]
