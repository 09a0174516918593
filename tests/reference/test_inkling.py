"""Inkling's own layers in the reference (``models/inkling/nvidia``): its short-conv state (kind
``inkling_conv_state``, ``InklingConvState``) and its attention (family ``inkling``, ``InklingAttention``).

What the classes build is checked against vLLM in ``tests/vllm`` (the named cases, the sampler's
``inkling`` family and the mutation ``inkling-conv-state-without-hidden-streams``); here, without vLLM:
the case's validation, the specs and pages the reference predicts, and its refusals.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from reference.config import CaseConfig, LayerConfig
from reference.derive import derive
from reference.errors import ConfigError, StartupError
from suites.named_cases import CASES, inkling_layers


def _case(layers, **options) -> CaseConfig:
    return CaseConfig("inkling-test", tuple(layers), block_size=options.pop("block_size", 16), num_blocks=16, **options)


def test_the_conv_state_is_a_window_of_the_kernel_in_blocks_of_as_many_tokens() -> None:
    d = derive(CASES["inkling-sconv-b16"], "mrv2")
    conv = d.specs["model.layers.0.conv_state"]
    attention = d.specs["model.layers.0.attn"]
    local = d.specs["model.layers.1.attn"]
    # 4 KV heads x 1,024 packed bf16 channels a token, no V: 8 KiB a token, 4 tokens a block.
    assert (conv.block_size, conv.sliding_window, conv.head_size_v) == (4, 4, 0)
    assert conv.page_size_bytes == 4 * 4 * 1024 * 2
    # K and V of 4 x 128 bf16 at --block-size 16: the same 32 KiB page, so nothing is padded or scaled.
    assert attention.page_size_bytes == local.page_size_bytes == conv.page_size_bytes
    assert (local.block_size, local.sliding_window) == (16, 512)  # the window at --block-size, no block of its own
    assert sorted(g.spec.block_size for g in d.groups) == [4, 4, 16, 16]


def test_a_larger_attention_page_scales_the_conv_block() -> None:
    # At --block-size 64 the attention page is 128 KiB: the conv state's 8 KiB-a-token page takes 16-token blocks.
    d = derive(_case(inkling_layers((False, True)), block_size=64), "mrv1")
    assert d.specs["model.layers.0.conv_state"].block_size == 16
    assert d.specs["model.layers.0.conv_state"].page_size_bytes == d.specs["model.layers.0.attn"].page_size_bytes


def test_a_float16_model_is_refused_as_the_conv_state_asserts() -> None:
    with pytest.raises(StartupError, match="sconv SWA cache supports bfloat16 only, got torch.float16") as info:
        derive(CASES["inkling-sconv-fp16-refused"], "mrv1")
    assert info.value.where.endswith("InklingConvState.__init__")


def test_with_the_hybrid_manager_off_the_promoted_conv_states_are_refused_as_vllm_refuses_them() -> None:
    """--disable-hybrid-kv-cache-manager promotes the conv states (4-token windows) to full attention beside
    Inkling's global layers: with a local layer's 512-token window too, FullAttentionSpec.merge refuses the two
    windows (before it compares the heads, which differ); without one, the conv state's builder asserts it gets its
    own window spec."""
    with pytest.raises(StartupError, match="must have the same window size") as info:
        derive(CASES["inkling-hma-off-windows-refused"], "mrv1")
    assert info.value.where.endswith("merge_window_sizes")
    with pytest.raises(StartupError, match=r"AssertionError\(\)") as info:
        derive(CASES["inkling-hma-off-builder-refused"], "mrv2")
    assert "InklingSconvMetadataBuilder.__init__" in info.value.where
    # With the hybrid manager on, neither: the conv states keep their own groups.
    assert derive(replace(CASES["inkling-hma-off-builder-refused"], disable_hybrid_kv_cache_manager=False), "mrv1")


@pytest.mark.parametrize(("cache_dtype", "content"), [
    ("auto", 2 * 128 * 2), ("fp8", 2 * 128), ("int8_per_token_head", 2 * 128), ("nvfp4", 2 * 128),
])
def test_a_quantized_inkling_cache_has_plain_pages(cache_dtype: str, content: int) -> None:
    """InklingAttention.get_kv_cache_spec sets no kv_quant_mode: its pages hold the cache dtype's elements and no
    scales, whatever --kv-cache-dtype names (the backend's customize_spec reads the spec's quantization mode)."""
    conv, attention = inkling_layers((False,))
    case = _case((conv, replace(attention, cache_dtype=cache_dtype)), capability=(10, 0))
    spec = derive(case, "mrv1").specs["model.layers.0.attn"]
    assert spec.kv_quant_mode == "NONE" and spec.state_content_size_bytes == content


def _conv(name: str = "model.layers.0.conv_state", **fields) -> LayerConfig:
    return LayerConfig(name, **{**dict(kind="inkling_conv_state", backend="INKLING_SCONV_SWA", num_kv_heads=4,
                                        head_size=1024, sliding_window=4), **fields})


def _attention(name: str = "model.layers.0.attn", **fields) -> LayerConfig:
    return LayerConfig(name, **{**dict(backend="FLASH_ATTN", num_kv_heads=4, head_size=128, family="inkling"), **fields})


@pytest.mark.parametrize(("layers", "message"), [
    (lambda: (_conv(head_size=1000), _attention()), "head_size 1000 must be a power of two"),
    (lambda: (_conv(sliding_window=None), _attention()), "needs sliding_window: the short conv's kernel size"),
    (lambda: (_conv(cache_dtype="fp8"), _attention()), "cache_dtype 'fp8' must be 'auto'"),
    (lambda: (_attention(), _conv()), "list an 'inkling_conv_state' layer 'model.layers.0.conv_state' right before it"),
    (lambda: (_conv(), _attention("model.layers.0.self_attn")),
     "list a family 'inkling' layer 'model.layers.0.attn' right after it"),
    (lambda: (_conv(num_kv_heads=2), _attention()), "has its attention's KV heads (4), not 2"),
    (lambda: (_conv(head_size=256), _attention()), "head_size 256 must be the power of two InklingConvState pads"),
    (lambda: (_conv(), _attention(backend="TRITON_ATTN")), "family 'inkling' runs on FLASH_ATTN"),
    (lambda: (_conv(), _attention(kind="mla")), "family 'inkling' builds kind(s) full, sliding_window"),
])
def test_a_bad_inkling_case_names_the_value(layers, message: str) -> None:
    import re

    with pytest.raises(ConfigError, match=re.escape(message)):
        _case(layers())
