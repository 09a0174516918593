"""The facts of the generation-2 releases older than the target (``reference.releases.GEN2_DIFFERENCES``),
each seen through both runners' own code in that release's venv
(``bash scripts/release_env.sh 0.30.0``, then that venv's ``python -m pytest tests/releases``).

For every fact that differs between the installed release and the target, the named cases that
show it must conform when judged by the installed release's facts, and must not when judged by
the target's: the fact, not a coincidence, is what makes the case conform.
"""

from __future__ import annotations

import pytest

from conformance.diff import compare
from conformance.matrix import CONNECTORS
from reference.config import CaseConfig, LayerConfig
from reference.releases import (DSV4_INDEXER_REFUSES_DCP, HIDDEN_STATE_PAGE_GROWS, PACKED_GROUPS_KEEP_MANAGER_BLOCKS, SLIDING_WINDOW_BLOCK_FROM_PRIMARY,
                                SLIDING_WINDOW_PACKED_AS_STATE, STRIDE_ALIGNMENT_FROM_KERNEL_SIZES, TARGET_RELEASE, holds)
from suites.named_cases import get_case
from installed_release import installed_version

CASES_SHOWING = {
    "PACKED_GROUPS_KEEP_MANAGER_BLOCKS": (PACKED_GROUPS_KEEP_MANAGER_BLOCKS,
                                          ("flashinfer-b128-blhnc-packed", "gqa+draft-attention-backend-blhnc-b48")),
    "STRIDE_ALIGNMENT_FROM_KERNEL_SIZES": (STRIDE_ALIGNMENT_FROM_KERNEL_SIZES,
                                           ("gqa+draft-attention-backend-b128", "gqa+flex-draft-b48")),
    "SLIDING_WINDOW_BLOCK_FROM_PRIMARY": (SLIDING_WINDOW_BLOCK_FROM_PRIMARY, ("swa-hybrid-padded",)),
    "HIDDEN_STATE_PAGE_GROWS": (HIDDEN_STATE_PAGE_GROWS, ("hidden-states-swa-hybrid",)),
    "SLIDING_WINDOW_PACKED_AS_STATE": (SLIDING_WINDOW_PACKED_AS_STATE, ("swa-packed-three-windows-blhnc",)),
    "DSV4_INDEXER_REFUSES_DCP": (DSV4_INDEXER_REFUSES_DCP, ("dsv4-dcp2-refused",)),
}
"""Per fact, the cases whose outcome it decides on MRv1 (where both runners differ, MRv1 shows it):
named cases, or one of ``OWN_CASES``."""

OWN_CASES = {
    # The ci profile's random-s20261129-295-swa_hybrid, which 0.29 groups differently from 0.30: one
    # fp8 full-attention layer (2,048-byte pages) and three bf16 window layers (4,096) side by side.
    "swa-packed-three-windows-blhnc": CaseConfig(
        "swa-packed-three-windows-blhnc",
        (LayerConfig("model.layers.0.self_attn.attn", num_kv_heads=1, head_size=64, cache_dtype="fp8"),)
        + tuple(LayerConfig(f"model.layers.{i}.self_attn.attn", kind="sliding_window", sliding_window=64,
                            num_kv_heads=1, head_size=64) for i in (1, 2, 3)),
        block_size=16, kv_cache_memory_bytes=8 << 20, layout="BLHNC"),
}
"""Cases no named case covers, each the smallest form of a random config that showed its fact."""


def _params():
    for fact_name, (_facts, cases) in CASES_SHOWING.items():
        for case in cases:
            yield pytest.param(fact_name, case, id=f"{fact_name}-{case}")


@pytest.mark.parametrize(("fact_name", "case_name"), list(_params()))
def test_the_releases_own_fact_decides_the_case(fact_name: str, case_name: str) -> None:
    from gpu_impl.vllm_cpu.planning import observe

    facts, _ = CASES_SHOWING[fact_name]
    version = installed_version()
    if holds(facts, version) == holds(facts, TARGET_RELEASE):
        pytest.skip(f"vLLM {version} has the target release's {fact_name}: nothing to tell apart")
    case = (OWN_CASES.get(case_name) or get_case(case_name)).with_(vllm_version=version)
    observation = observe(case, "mrv1")
    assert observation.unsupported is None, observation.unsupported
    by_release = compare(case, "mrv1", observation)
    assert by_release.divergences == (), [d.message for d in by_release.divergences]
    by_target = compare(case.with_(vllm_version=TARGET_RELEASE), "mrv1", observation)
    assert by_target.divergences, f"{case_name} conforms by {TARGET_RELEASE}'s facts too: it does not show {fact_name}"


@pytest.mark.parametrize("case_name", ["mla-gqa-draft-dcp2", "mla-gqa-draft-b64", "gqa-tp8-dcp4-flashinfer-b128"])
def test_drafts_and_dcp_are_driven_through_this_releases_own_entry_points(case_name: str) -> None:
    """0.30 has no SpeculativeConfig.apply_draft_overrides (MRv2's load_eagle_model applies the draft's
    overrides itself) and no parallel_state.get_dcp_world_size_and_rank: both runners are still driven."""
    from gpu_impl.vllm_cpu.planning import observe

    case = get_case(case_name).with_(vllm_version=installed_version())
    for runner in ("mrv1", "mrv2"):
        observation = observe(case, runner)
        assert observation.unsupported is None, observation.unsupported
        result = compare(case, runner, observation)
        assert result.divergences == (), [d.message for d in result.divergences]


SCHEDULE_CASES = (("flashinfer-b128-k64", "mrv1"), ("flashinfer-b128-k64", "mrv2"), ("gqa-tp8-dcp4-flashinfer-b128", "mrv1"))


@pytest.mark.parametrize(("case_name", "runner"), SCHEDULE_CASES)
def test_schedules_conform_by_this_releases_block_tables_not_the_targets(case_name: str, runner: str) -> None:
    """Before 0.32 both runners' tables hold kernel ids (BLOCK_TABLES_HOLD_KERNEL_IDS): the same
    seeded schedules conform by this release's facts and diverge by the target's."""
    from conformance.schedules import plan_schedules
    from gpu_impl.vllm_cpu.planning import observe
    from reference.releases import BLOCK_TABLES_HOLD_KERNEL_IDS

    version = installed_version()
    if holds(BLOCK_TABLES_HOLD_KERNEL_IDS[runner], version) == holds(BLOCK_TABLES_HOLD_KERNEL_IDS[runner], TARGET_RELEASE):
        pytest.skip(f"vLLM {version}'s {runner} tables hold the target release's ids")
    case = get_case(case_name).with_(vllm_version=version)
    plan = plan_schedules(case, 5, 2)
    observation = observe(case, runner, schedules=plan.scenarios)
    assert [s for s in observation.schedules if "steps" in s], observation.schedules_unsupported or observation.schedules
    by_release = compare(case, runner, observation, plan)
    assert by_release.divergences == (), [d.message for d in by_release.divergences][:5]
    target = case.with_(vllm_version=TARGET_RELEASE)
    by_target = compare(target, runner, observation, plan_schedules(target, 5, 2))
    assert any(d.kind == "block_table" for d in by_target.divergences)


@pytest.mark.parametrize("adapter", sorted(set(CONNECTORS.values())))
def test_the_releases_own_transfer_workers_move_each_blocks_bytes(adapter: str) -> None:
    """The release history's connector check of this release (``matrix.gen2_connector_cases``):
    its own NIXL and Mooncake workers register the dense layouts and every block's transfer is
    exactly its bytes, on both runners (0.29's workers name no regions and keep no per-region
    block counts, which the adapters find by address and from the worker's own counts)."""
    from conformance.connectors.validate import validate_registration
    from conformance.matrix import gen2_connector_cases, release_cases

    cases = gen2_connector_cases(release_cases(installed_version()))
    assert len(cases) == 4, [c.name for c in cases]
    report = validate_registration(adapter, cases=cases)
    assert report.counts()["pass"] == 2 * len(cases), [(r.case, r.runner, r.status, r.detail[:300])
                                                      for r in report.results if r.status != "pass"]
