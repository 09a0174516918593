"""The CPU driver itself: shims, unsupported backends, error capture and the replay CLI."""

from __future__ import annotations

import json

import pytest

from gpu_impl.vllm_cpu import planning, shims
from reference.config import CaseConfig, LayerConfig, uniform_layers


def _case(**kw) -> CaseConfig:
    kw.setdefault("layers", uniform_layers(2, backend="FLASH_ATTN", num_kv_heads=2, head_size=64))
    kw.setdefault("name", "driver")
    kw.setdefault("num_blocks", 4)
    return CaseConfig(**kw)


def test_shims_are_idempotent_and_listed():
    first = shims.apply()
    assert shims.apply() == first
    text = "\n".join(first)
    for needle in ("support_hybrid_kv_cache", "get_device_capability", "PIN_MEMORY", "CUTLASS_MLA", "HF_HUB_OFFLINE"):
        assert needle in text
    from vllm.platforms import current_platform

    with shims.fake_capability((10, 0)):
        assert current_platform.get_device_capability().major == 10
    assert current_platform.get_device_capability().major == shims.current_capability()[0]
    assert current_platform.support_hybrid_kv_cache()


def test_unimportable_backend_is_unsupported_not_a_crash():
    # NO_ATTENTION's module does not exist in vLLM 0.33.0.
    case = _case(layers=(LayerConfig(name="model.layers.0.self_attn.attn", backend="NO_ATTENTION"),))
    obs = planning.observe(case)
    assert obs.unsupported is not None and "NO_ATTENTION" in obs.unsupported
    assert obs.error is None
    unknown = planning.observe(_case(layers=(LayerConfig(name="l0", backend="NOT_A_BACKEND"),)))
    assert unknown.unsupported is not None


def test_vllm_errors_are_captured_with_their_stage():
    obs = planning.observe(_case(block_size=8))  # FLASH_ATTN takes multiples of 16 only
    assert obs.error is not None and obs.error.startswith("ValueError: No common block size for 8")
    assert obs.error_stage == "kernel_block_sizes"
    # The steps before the failing one are kept for diagnosis; later ones are empty.
    assert obs.layout == "LBNHC" and obs.num_blocks == 4
    assert obs.kernel_block_sizes == () and obs.registered == {}


def test_case_state_does_not_leak_between_observations():
    import os

    packed = planning.observe(_case(layout="BLHNC"))
    plain = planning.observe(_case())
    assert packed.layout == "BLHNC" and plain.layout == "LBNHC"
    assert "VLLM_KV_CACHE_LAYOUT" not in os.environ
    sm100 = planning.observe(_case(layers=uniform_layers(1, backend="FLASHINFER", num_kv_heads=2), capability=(10, 0)))
    assert sm100.layout == "LBHNC"
    assert shims.current_capability() == (9, 0)


def test_replay_cli_prints_the_observation(capsys):
    case = _case(block_size=32)
    assert planning.main([case.to_json(), "mrv2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["case_name"] == "driver" and out["runner"] == "mrv2"
    assert out["kernel_block_sizes"] == [32]
    assert set(out["registered"]) == {layer.name for layer in case.layers}


def test_a_layer_module_that_failed_to_import_stays_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed import leaves sibling submodules behind, so a retry can succeed without the part
    that failed (0.30.0 without torchvision): the driver keeps the first answer for every case."""
    import importlib

    from gpu_impl.vllm_cpu import runners
    from reference.config import LayerConfig

    attempts = []

    def import_module(name: str):
        attempts.append(name)
        if len(attempts) == 1:
            raise ModuleNotFoundError("No module named 'torchvision'")
        return importlib.import_module("types")

    monkeypatch.setattr(runners.importlib, "import_module", import_module)
    monkeypatch.setattr(runners, "_IMPORT_FAILURES", {})
    layer = LayerConfig("x", kind="full", backend="FLASH_ATTN")
    for _ in range(2):
        with pytest.raises(runners.RunnerUnavailable, match="does not import here .ModuleNotFoundError: No module named 'torchvision'"):
            runners._own_layer_class(layer, "kvconform.test.module", "SimpleNamespace")
    assert attempts == ["kvconform.test.module"]


def test_step5_is_built_by_its_own_classes_and_refused_by_mrv1s_own_validator() -> None:
    """Step5's DSA layer is vLLM's Step5Attention, which registers its Attention, its summaries and its ring
    itself; what the observation says about them comes from vLLM's own objects (specs, backends, alignments)."""
    from suites.named_cases import CASES

    case = CASES["step5-dsa-b64"]
    mrv1 = planning.observe(case, "mrv1")
    assert mrv1.error == "ValueError: Model Runner V1 does not support: Step5" and mrv1.error_stage == "config"
    obs = planning.observe(case, "mrv2")
    assert obs.error is None and obs.layout == "BLNHC"
    dsa = "model.layers.1.self_attn.attn"
    assert {obs.layer_backends[n] for n in (dsa, dsa + ".sparse_summary_cache", dsa + ".csa_tail_ring")} == {
        "STEP5_DSA", "STEP5_CSA_SUMMARY", "STEP5_CSA_TAIL_RING"}
    # The DSA backend's customize_spec: 8-token pages tile the block stride (an 8-token page of 2 x 192 bf16 K and V);
    # the ring's 1 KiB rows; the summaries declare none.
    assert obs.stride_alignments[dsa] == 8 * 2 * 192 * 2 * 2
    assert obs.stride_alignments[dsa + ".csa_tail_ring"] == 1024
    assert obs.stride_alignments[dsa + ".sparse_summary_cache"] == 1
    # The ring is one main page; the summaries one 256-byte row per 8 tokens.
    assert obs.page_bytes[dsa + ".csa_tail_ring"] == obs.page_bytes[dsa]
    assert obs.page_bytes[dsa + ".sparse_summary_cache"] == (64 // 8 * 256, 64 // 8 * 256)


def test_deepseek_v41_is_built_by_its_own_attention_class_as_each_runner_selects_it() -> None:
    """DeepSeek V4.1's decoder layers are vLLM's own DeepseekV4Attention (the class its selector picks for FlashMLA),
    which registers its caches itself from the model's config: what the observation says about them (backends, pages,
    stride alignments, the runner's bounded replay) comes from vLLM's own objects."""
    from suites.named_cases import CASES

    source, swa_only = "model.layers.2.attn", "model.layers.1.attn"
    observed = {runner: planning.observe(CASES["dsv41-mxfp8-sm100-b128"], runner) for runner in ("mrv1", "mrv2")}
    for obs in observed.values():
        assert obs.error is None
        assert {obs.layer_backends[source + suffix] for suffix in ("", ".indexer.k_cache", ".swa_cache",
                                                                   ".compressor.state_cache")} == {
            "FLASHMLA_SPARSE_DSV41", "DEEPSEEK_V41_INDEXER", "DEEPSEEK_SPARSE_SWA", "CompressorBackend"}
        # A layer owning only its SWA cache reports nothing else (its attention's spec is None).
        assert [n for n in obs.page_bytes if n.startswith(swa_only)] == [swa_only + ".swa_cache"]
        # SM100: the MXFP8 record, 64 states of 528 bytes at ratio 2; the SWA block stride holds whole records.
        assert obs.page_bytes[source][0] == 64 * 528
        assert obs.stride_alignments[source + ".swa_cache"] == 528
    # Bounded replay keeps the SWA window out of prefix caching under MRv2 only.
    assert (observed["mrv1"].cache_block_size, observed["mrv2"].cache_block_size) == (32, 128)
