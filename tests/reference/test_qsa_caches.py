"""Qwen4-exp's QSA side caches (``models/qwen4_exp/common/qsa_cache.py``) in the reference."""

from __future__ import annotations

from dataclasses import replace

import pytest

from reference.config import LAYER_OWN_BACKENDS, CaseConfig, LayerConfig
from reference.derive import derive, qsa_ring
from reference.errors import ConfigError, StartupError
from reference.specs import SpecKind, layer_spec_of
from suites.named_cases import CASES, attention_with_qsa_caches


@pytest.mark.parametrize(("ratio", "drafts", "ring"), [(4, 0, 4), (4, 1, 8), (4, 4, 8), (4, 5, 12), (128, 3, 256), (1, 2, 3)])
def test_the_ring_holds_the_open_group_and_the_drafts_in_whole_groups(ratio: int, drafts: int, ring: int) -> None:
    assert qsa_ring(ratio, drafts) == ring


def _specs(case: CaseConfig, runner: str = "mrv2"):
    d = derive(case, runner)
    return d, {name: layer_spec_of(g.spec, name) for g in d.plan.groups for name in g.layer_names}


def test_compressed_keys_are_one_bf16_key_per_ratio_tokens_and_the_ring_one_block_per_request() -> None:
    d, specs = _specs(CASES["qwen4-qsa-caches-b64"])
    compressed = specs["model.layers.0.self_attn.qsa.compressed_key_cache"]
    ring = specs["model.layers.0.self_attn.qsa.key_state_cache"]
    assert compressed.kind is SpecKind.MLA and compressed.tokens_per_state == 4
    assert compressed.page_size_bytes == (64 // 4) * 128 * 2  # 16 keys of 128 bf16
    assert ring.kind is SpecKind.CIRCULAR_BUFFER and ring.block_size == 4
    assert ring.page_size_bytes == 4 * 128 * 2
    # The compressed keys ride in the attention group (same block, packed), the rings in their own group.
    assert [len(g.layer_names) for g in d.plan.groups] == [4, 2]


@pytest.mark.parametrize("runner", ["mrv1", "mrv2"])
def test_a_ratio_not_dividing_the_block_is_refused_as_the_constructor_does(runner: str) -> None:
    with pytest.raises(StartupError, match="QSA cache block size must be divisible by the compression ratio"):
        derive(CASES["qwen4-qsa-ratio-refused-b16"], runner)


def test_qsa_layers_need_a_ratio_bf16_and_their_own_backend() -> None:
    backend = LAYER_OWN_BACKENDS["qsa_key_state"][0]
    with pytest.raises(ConfigError, match="needs index_kpool"):
        LayerConfig("x", kind="qsa_key_state", backend=backend)
    with pytest.raises(ConfigError, match="must be 'auto'"):
        LayerConfig("x", kind="qsa_compressed_key", backend=backend, index_kpool=4, cache_dtype="fp8")
    with pytest.raises(ConfigError, match="runs on QWEN4_EXP_EXP_QSA_STATE"):
        LayerConfig("x", kind="qsa_compressed_key", backend="FLASH_ATTN", index_kpool=4)


def test_a_larger_ratio_shrinks_the_compressed_page_and_grows_the_ring() -> None:
    base = CaseConfig("qsa", attention_with_qsa_caches(1, "FLASH_ATTN", compress_ratio=8), block_size=64, layout="BLHNC")
    _, specs = _specs(base)
    assert specs["model.layers.0.self_attn.qsa.compressed_key_cache"].page_size_bytes == 8 * 128 * 2
    assert specs["model.layers.0.self_attn.qsa.key_state_cache"].block_size == 8
