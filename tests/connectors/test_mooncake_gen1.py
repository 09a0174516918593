"""The generation-1 Mooncake verdict (``conformance.connectors.mooncake_gen1.judge``) without
vLLM: observations built from the reference's own bytes pass; the #39596 assert is a
predicted refusal; planning logical block ids as kernel block ids is a failure that names
the kernel-block cause; accepting what the reference says is refused is a failure."""

from __future__ import annotations

import dataclasses

from conformance.connectors.mooncake_gen1 import judge
from gpu_impl.connectors.mooncake_gen1 import LayerTensor, MooncakeRegistration
from reference.gen1 import derive_gen1, merged_runs, mooncake_block_size
from suites.release_cases import gen1_cases

POOL = 1 << 30
"""Where the fake tensors start (any address: the verdict works on offsets)."""


def _case(name: str, version: str):
    return next(c for c in gen1_cases(version) if c.name == name)


def _registration(case, runner: str, *, logical_as_kernel: bool = False) -> MooncakeRegistration:
    """What a Mooncake worker that plans exactly the reference's bytes would show; with
    ``logical_as_kernel`` one that takes logical block b for kernel block b (vLLM #46334's class)."""
    d = derive_gen1(case, runner)
    layers, transfers = [], {}
    for i, (name, view) in enumerate(d.registered.items()):
        nbytes = d.kv_cache_tensors[d.tensor_index(name)].size
        layers.append(LayerTensor(name, POOL + d.tensor_bases[i], nbytes, view.shape, view.stride, 2))
    block_size = mooncake_block_size(d)
    for b in range(d.num_blocks):
        copies = []
        for i, name in enumerate(d.registered):
            runs = merged_runs([d.block_bytes(name, b).page])
            if logical_as_kernel:
                (lo, hi), = runs
                per = (hi - lo) // (case.block_size // block_size)
                runs = ((d.tensor_bases[i] + b * per, d.tensor_bases[i] + (b + 1) * per),)
            copies += [(POOL + lo, hi - lo) for lo, hi in runs]
        transfers[b] = tuple(copies)
    return MooncakeRegistration(case.name, runner, layers=tuple(layers), block_size=block_size, num_blocks=d.num_blocks,
                                transfers=transfers)


def test_a_worker_that_plans_the_reference_bytes_passes() -> None:
    for name in ("gen1-flashinfer-b128", "gen1-fa-b16", "gen1-mla-eagle-b64"):
        case = _case(name, "0.22.0")
        for runner in ("mrv1", "mrv2"):
            verdict = judge(case, runner, _registration(case, runner))
            assert verdict.status == "pass", (name, runner, verdict.detail, verdict.findings)


def test_the_39596_assert_is_a_predicted_refusal_before_0_20_only() -> None:
    case = _case("gen1-mla-eagle-b64", "0.19.1")
    raised = MooncakeRegistration(case.name, "mrv1", error="AssertionError",
                                  error_line="mooncake_connector.py:1259: assert self.block_size == kernel_block_size")
    verdict = judge(case, "mrv1", raised)
    assert verdict.status == "refusal" and "predicted by the reference" in verdict.detail
    assert "shape[-2]" in verdict.detail and "is 8" in verdict.detail and "#39596" in verdict.detail
    # Accepting it on 0.19.1 contradicts the reference: a failure.
    assert judge(case, "mrv1", _registration(case, "mrv1")).status == "failure"
    # From 0.20 the same assert would be an unpredicted refusal.
    later = case.with_(vllm_version="0.20.0")
    assert "NOT predicted" in judge(later, "mrv1", dataclasses.replace(raised, case=later.name)).detail


def test_logical_block_ids_planned_as_kernel_blocks_fail_naming_the_cause() -> None:
    case = _case("gen1-flashinfer-b128", "0.22.0")  # FlashInfer: kernel blocks of 64 under 128-token blocks
    verdict = judge(case, "mrv1", _registration(case, "mrv1", logical_as_kernel=True))
    assert verdict.status == "failure"
    assert verdict.findings and all("kernel blocks" in f for f in verdict.findings), verdict.findings
    assert "block 1: moves [262144, 524288) where the block's bytes are [524288, 1048576)" in " ".join(verdict.findings)
    assert verdict.replay.endswith("--case case.json") and "MooncakeAdapter" in verdict.replay


def test_a_copy_outside_every_tensor_is_its_own_finding() -> None:
    case = _case("gen1-fa-b16", "0.22.0")
    good = _registration(case, "mrv1")
    stray = dict(good.transfers)
    stray[0] = stray[0] + ((POOL - 4096, 64),)
    verdict = judge(case, "mrv1", dataclasses.replace(good, transfers=stray))
    assert verdict.status == "failure" and any("outside every registered tensor" in f for f in verdict.findings)


def test_a_failure_an_expectation_cites_is_known_and_others_are_not() -> None:
    from conformance.connectors.mooncake_gen1 import known_failures
    from conformance.expectations import loads

    case = _case("gen1-flashinfer-b128", "0.22.0")
    failed = judge(case, "mrv1", _registration(case, "mrv1", logical_as_kernel=True))
    entries = loads('''schema = 1
[[expectation]]
id = "known-copy-plan"
kind = "connector_copy_plan"
field = "mooncake.*"
vllm = ">=0.22,<0.23"
reason = "vllm/distributed/kv_transfer/kv_connector/v1/mooncake/mooncake_connector.py: _build_transfer_params"
''')
    (marked,) = known_failures([failed], [case], "0.22.0", entries)
    assert marked.status == "failure" and marked.expected_by == "known-copy-plan"
    (unmarked,) = known_failures([failed], [case], "0.23.0", entries)  # outside the entry's range
    assert unmarked.expected_by is None


def test_a_copy_longer_than_its_kernel_block_is_an_overlap_with_the_neighbour() -> None:
    case = _case("gen1-flashmla-b128", "0.25.0")  # FlashMLA: 64-token kernel blocks under 128-token blocks
    good = _registration(case, "mrv1")
    # Each logical block copied as its two kernel blocks, each with the logical block's length
    # (vLLM #54272's class): the second copy runs one kernel block into the next block.
    long = {b: tuple((addr, 2 * n) for addr, n in copies) for b, copies in good.transfers.items()}
    verdict = judge(case, "mrv1", dataclasses.replace(good, transfers=long))
    assert verdict.status == "failure"
    assert any("overlap" in f and "belong to its neighbour" in f for f in verdict.findings), verdict.findings
