"""Both runners of a generation-1 vLLM (0.19 to 0.28) through their own allocate/reshape
code (``gpu_impl.vllm_cpu.gen1``) against ``reference.gen1``, and against each other:
vLLM #42846 (MRv2 registering logical blocks where the kernel's are smaller: FlashInfer
and FlashMLA at block 128) must show before 0.22 (0.19.1 to 0.21.x) as an MRv1/MRv2 mismatch of exactly
the layers the reference predicts, and nowhere on 0.22 and later."""

from __future__ import annotations

import pytest

from conformance.diff import compare, compare_runners
from reference.gen1 import mrv1_mrv2_differences
from reference.releases import MAMBA_STATE_PAGE_VIEW, MRV2_KERNEL_BLOCKS, holds
from installed_release import installed_version, release_cases


@pytest.mark.parametrize("case", release_cases(), ids=lambda c: c.name)
def test_each_runner_conforms_and_only_42846_splits_them(case) -> None:
    from gpu_impl.vllm_cpu.planning import observe

    observations = {runner: observe(case, runner) for runner in ("mrv1", "mrv2")}
    for runner, observation in observations.items():
        assert observation.fidelity == "runner_methods", observation
        result = compare(case, runner, observation)
        assert result.status == "pass", [d.message for d in result.divergences] or result.detail
    mismatches = compare_runners(case, observations["mrv1"], observations["mrv2"])
    # Where reference.gen1 says the runners register differently (the #42846 split: on
    # 0.21 MRv2 reshapes with the logical block size wherever the kernel's is smaller).
    predicted = {line.split(":", 1)[0] for line in mrv1_mrv2_differences(case)}
    assert {d.field.rsplit(".", 1)[0] for d in mismatches} == predicted, [d.message for d in mismatches]
    before_fix = not holds(MRV2_KERNEL_BLOCKS, installed_version())
    if before_fix and case.block_size == 128 and case.layers[0].backend in ("FLASHINFER", "FLASHMLA"):
        assert predicted and all(d.expected[0] == 2 * d.observed[0] for d in mismatches if d.field.endswith(".shape"))
    elif not before_fix:
        assert mismatches == (), [d.message for d in mismatches]


@pytest.mark.parametrize("case", release_cases()[:4], ids=lambda c: c.name)
def test_the_contract_sees_vllms_own_pages_and_storages(case) -> None:
    """The generation-1 driver reports what the contract holds views to (vLLM's own spec
    objects' page sizes, the storages): it holds, and a page size one spec would not report
    is caught by the contract alone."""
    import dataclasses

    from conformance.checks.contract import contract_divergences
    from gpu_impl.vllm_cpu.planning import observe

    observation = observe(case, "mrv1")
    if observation.error:
        pytest.skip(f"vLLM {installed_version()} refuses {case.name}: {observation.error}")
    assert set(observation.page_bytes) == set(observation.registered) == set(observation.storage_of)
    assert contract_divergences(case, "mrv1", observation) == []
    doubled = dataclasses.replace(observation, page_bytes={n: (2 * real, 2 * padded) for n, (real, padded) in observation.page_bytes.items()})
    assert {d.kind for d in contract_divergences(case, "mrv1", doubled)} >= {"page_bytes"}


def _sampled(count: int = 60):
    from suites.profiles import PROJECT_SEED
    from suites.release_cases import gen1_sample_cases

    try:
        return gen1_sample_cases(installed_version(), PROJECT_SEED, count)
    except Exception:  # noqa: BLE001 - no generation-1 vLLM: the folder's fixture skips with the reason
        return gen1_sample_cases("0.21.0", PROJECT_SEED, count)


@pytest.mark.parametrize("case", _sampled(), ids=lambda c: c.name)
def test_the_profiles_random_configs_conform_or_say_why_not(case) -> None:
    """``kvconform run --profile ci`` on a generation-1 release: each sampled config through both
    runners' own code conforms to reference.gen1, or one line says what is not driven or modeled."""
    from gpu_impl.vllm_cpu.planning import observe

    observations = {runner: observe(case, runner) for runner in ("mrv1", "mrv2")}
    results = {runner: compare(case, runner, observation) for runner, observation in observations.items()}
    if any(r.status in ("unsupported", "not_modeled") for r in results.values()):
        for result in results.values():
            assert result.status in ("unsupported", "not_modeled") and result.detail and "\n" not in result.detail, result
        return
    for result in results.values():
        assert result.status in ("pass", "refused"), [d.message for d in result.divergences] or result.detail
    mismatches = compare_runners(case, observations["mrv1"], observations["mrv2"])
    predicted = {line.split(":", 1)[0] for line in mrv1_mrv2_differences(case)}
    assert {d.field.rsplit(".", 1)[0] for d in mismatches if d.field != "error"} <= predicted, [d.message for d in mismatches]


def test_request_schedules_run_through_both_runners_own_block_tables() -> None:
    """Both runners' own block tables (MRv1: its may_reinitialize_input_batch's InputBatch;
    MRv2: its own initialize_kv_cache) run the cases' seeded schedules, judged by
    reference.block_tables with this release's facts: MRv1 rows hold kernel ids, MRv2's from
    0.22, and a FlashInfer case at block 128 stores two per block."""
    from conformance.diff import compare
    from conformance.schedules import plan_schedules
    from gpu_impl.vllm_cpu.planning import observe
    from reference.releases import BLOCK_TABLES_HOLD_KERNEL_IDS

    version = installed_version()
    ran = {"mrv1": 0, "mrv2": 0}
    for case in release_cases():
        plan = plan_schedules(case, 5, 2)
        if not plan.scenarios:
            continue
        for runner in ran:
            observation = observe(case, runner, schedules=plan.scenarios)
            ran[runner] += sum("steps" in s for s in observation.schedules)
            result = compare(case, runner, observation, plan)
            assert result.status == "pass", [d.message for d in result.divergences][:5]
            if case.name == "gen1-flashinfer-b128" and observation.schedules:
                stored = 2 if holds(BLOCK_TABLES_HOLD_KERNEL_IDS[runner], version) else 1
                assert observation.schedules[0]["ids_per_block"] == [stored]
    assert ran["mrv1"] >= 16 and ran["mrv2"] >= 10, ran


@pytest.mark.parametrize("runner", ["mrv1", "mrv2"])
def test_a_window_hybrid_without_the_hybrid_manager_is_refused_exactly_where_predicted(runner: str) -> None:
    """Sliding-window layers beside full attention under ``--disable-hybrid-kv-cache-manager``:
    from 0.25 a window layer takes the backend's smallest kernel block (SLIDING_WINDOW_BLOCK_DECOUPLED,
    Triton's 16 beside the configured 64), and 0.25/0.26 promote it to full attention keeping that
    block (PROMOTED_WINDOW_KEEPS_ITS_BLOCK), which leaves no unified type: vLLM refuses there, as
    the reference predicts, and nowhere else."""
    from gpu_impl.vllm_cpu.planning import observe
    from reference.releases import PROMOTED_WINDOW_KEEPS_ITS_BLOCK, SLIDING_WINDOW_BLOCK_DECOUPLED

    version = installed_version()
    case = next(c for c in release_cases() if c.name == "gen1-triton-swa-b64").with_(disable_hybrid_kv_cache_manager=True)
    observation = observe(case, runner)
    result = compare(case, runner, observation)
    refused = holds(SLIDING_WINDOW_BLOCK_DECOUPLED, version) and holds(PROMOTED_WINDOW_KEEPS_ITS_BLOCK, version)
    # A refusal for the predicted reason conforms: the verdict passes either way, and vLLM's
    # own error says which way it went.
    assert result.status == "pass", [d.message for d in result.divergences] or result.detail
    assert ("unified type" in (observation.error or "")) == refused, observation.error


@pytest.mark.parametrize("runner", ["mrv1", "mrv2"])
def test_flashinfer_on_sm100_runs_hnd_with_the_releases_own_page_sizes(runner: str) -> None:
    """FlashInfer at block 128 on SM100 with NHD asked for: the release's own selector makes the
    process HND, and its kernel pages are [16, 32, 64] to 0.23 (a split into 64s) and take 128
    from 0.24 (TRT-LLM attention for a GQA model); the reference predicts both, and the next
    case does not inherit the layout."""
    from gpu_impl.vllm_cpu.planning import observe

    version = installed_version()
    base = next(c for c in release_cases() if c.name == "gen1-flashinfer-b128")
    case = base.with_(name="gen1-flashinfer-b128-sm100", capability=(10, 0), layout="NHD")
    observation = observe(case, runner)
    result = compare(case, runner, observation)
    assert result.status in ("pass", "expected"), [d.message for d in result.divergences] or result.detail
    assert observation.layout == "HND"
    if runner == "mrv1" or holds(MRV2_KERNEL_BLOCKS, version):
        from reference.releases import parse_version

        large_pages = parse_version(version) >= (0, 24, 0)
        assert list(observation.kernel_block_sizes) == [128 if large_pages else 64]
    after = observe(base.with_(layout="NHD"), runner)
    assert after.layout == "NHD", after.layout


def _hybrid_cases():
    from suites.release_cases import gen1_hybrid_cases

    try:
        return gen1_hybrid_cases(installed_version())
    except Exception:  # noqa: BLE001 - no vLLM: the folder's fixture skips with the reason
        return gen1_hybrid_cases("0.21.0")


@pytest.mark.parametrize("runner", ["mrv1", "mrv2"])
@pytest.mark.parametrize("case", _hybrid_cases(), ids=lambda c: c.name)
def test_a_mamba_hybrid_negotiates_its_block_and_registers_its_states_as_predicted(case, runner: str) -> None:
    """The release's own negotiation raises the attention block where the state outgrows its page
    (0.19: to a multiple of 16, MLA 64; 0.20 on: of the backend's smallest kernel block or
    --block-size; 0.27 on: MLA 128), and each runner's reshape registers the states as the
    reference says (a list per state to 0.26, one int8 page view from 0.27; MRv2 refuses before 0.21)."""
    from gpu_impl.vllm_cpu.planning import observe
    from reference.gen1 import hybrid_block_size

    observation = observe(case, runner)
    assert observation.unsupported is None, observation.unsupported
    assert observation.cache_block_size == hybrid_block_size(case)[0] > case.block_size
    result = compare(case, runner, observation)
    assert result.status == "pass", [d.message for d in result.divergences] or result.detail
    if observation.error is None:
        states = [name for name in observation.registered if "mixer" in name]
        listed = not holds(MAMBA_STATE_PAGE_VIEW, installed_version())
        assert states == (["model.layers.1.mixer[0]", "model.layers.1.mixer[1]", "model.layers.3.mixer[0]",
                           "model.layers.3.mixer[1]"] if listed else ["model.layers.1.mixer", "model.layers.3.mixer"])


def test_a_page_that_does_not_divide_is_refused_before_0_24_and_viewed_padded_after() -> None:
    """Full-attention pages of 2 heads beside sliding-window pages of 3 (Triton, 64-token blocks):
    no whole ratio, so before 0.24 vLLM refuses and from 0.24 it pads the smaller page and views it
    with ``as_strided`` (``releases.PADDED_PAGE_VIEW``); both runners as the reference says."""
    from gpu_impl.vllm_cpu.planning import observe
    from reference.config import CaseConfig, LayerConfig
    from reference.gen1 import derive_gen1
    from reference.releases import ATTENTION_PAGES_PADDED

    layers = tuple(LayerConfig(f"model.layers.{i}.self_attn.attn", backend="TRITON_ATTN", num_kv_heads=2, head_size=64)
                   for i in (0, 1))
    windows = tuple(LayerConfig(f"model.layers.{i}.self_attn.attn", kind="sliding_window", sliding_window=128,
                                backend="TRITON_ATTN", num_kv_heads=3, head_size=64) for i in (2, 3))
    case = CaseConfig(name="gen1-triton-swa-padded-b64", layers=layers + windows, block_size=64, num_blocks=4,
                      generation=1, vllm_version=installed_version())
    for runner in ("mrv1", "mrv2"):
        observation = observe(case, runner)
        result = compare(case, runner, observation)
        assert result.status == "pass", [d.message for d in result.divergences] or result.detail
        assert (observation.error is None) == holds(ATTENTION_PAGES_PADDED, installed_version()), observation.error
    if holds(ATTENTION_PAGES_PADDED, installed_version()):
        d = derive_gen1(case)
        assert any(getattr(g.spec, "page_size_padded", None) for g in d.groups)
