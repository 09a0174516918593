"""Encoder-only models (``EncoderOnlyAttention``: no KV cache) in the reference."""

from __future__ import annotations

from dataclasses import replace

import pytest

from reference.config import CaseConfig, LayerConfig
from reference.derive import derive
from reference.errors import StartupError
from suites.named_cases import CASES


@pytest.mark.parametrize("runner", ["mrv1", "mrv2"])
def test_an_encoder_only_model_keeps_no_kv_cache_but_its_builders(runner: str) -> None:
    case = CASES["bert-encoder-only-b16"]
    d = derive(case, runner)
    assert d.plan.groups == () and d.plan.tensors == () and d.registered == {}
    assert (d.plan.num_blocks, d.plan.bytes_per_block) == (1, 0)  # one block of nothing
    assert d.builder_kernel_block_sizes == {layer.name: 16 for layer in case.layers}


@pytest.mark.parametrize("runner", ["mrv1", "mrv2"])
def test_backends_without_the_attention_type_are_refused(runner: str) -> None:
    with pytest.raises(StartupError, match=r"ENCODER_ONLY not supported"):
        derive(CASES["bert-encoder-only-flashinfer-refused"], runner)


def test_the_builders_follow_the_block_size() -> None:
    d = derive(replace(CASES["bert-encoder-only-b16"], block_size=64))
    assert set(d.builder_kernel_block_sizes.values()) == {64}


def test_dcp_still_asks_every_impl_for_the_softmax_lse() -> None:
    layers = tuple(LayerConfig(f"enc.{i}.attn", kind="encoder_only", backend="TRITON_ATTN", num_kv_heads=1) for i in range(2))
    with pytest.raises(StartupError, match="requires attention implementations to return the softmax LSE"):
        derive(CaseConfig("bert-dcp", layers, tensor_parallel_size=2, decode_context_parallel_size=2))


@pytest.mark.parametrize("runner", ["mrv1", "mrv2"])
def test_beside_kv_cache_layers_only_those_get_groups_and_every_builder_the_block_size(runner: str) -> None:
    case = CASES["encoder-only-beside-kv-b16"]
    d = derive(case, runner)
    decoder = [l.name for l in case.layers if l.kind != "encoder_only"]
    assert sorted(n for g in d.plan.groups for n in g.layer_names) == sorted(decoder) == sorted(d.registered)
    assert d.builder_kernel_block_sizes == {layer.name: 16 for layer in case.layers}


def test_beside_gated_deltanet_layers_the_builders_take_the_negotiated_block() -> None:
    """ColQwen3.5's shape: the GDN state raises --block-size 16 to 32 (the model heads' 512-byte token page); the
    encoder-only builders are sized by cache_config.block_size as engine start-up left it."""
    case = CASES["colqwen-like-gdn-encoder-only"]
    d = derive(case)
    assert [g.layer_names for g in d.plan.groups] == [("model.layers.0.linear_attn", "model.layers.1.linear_attn")]
    assert d.builder_kernel_block_sizes["model.layers.2.self_attn.attn"] == 32
    assert {g.spec.page_size_bytes for g in d.plan.groups} == {32 * 512}
