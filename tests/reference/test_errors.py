"""Invalid or refused configurations give one clear error naming the value and what was expected."""

from __future__ import annotations

import pytest

from reference.config import CaseConfig, LayerConfig, uniform_layers
from reference.derive import derive
from reference.errors import ConfigError, StartupError
from reference.kernel_blocks import select_common_block_size
from reference.layout import layout_from_name
from reference.specs import MultipleOf


def _case(**layer: object) -> CaseConfig:
    block_size = layer.pop("block_size", 16)
    return CaseConfig("e", uniform_layers(2, **layer), block_size=block_size, num_blocks=4)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("case", "error", "message"),
    [
        (lambda: _case(backend="FOO"), ConfigError, r"unknown attention backend 'FOO'; expected one of B12X, "),
        (lambda: _case(backend="FLASHINFER", head_size=96), ConfigError, r"head size 96 is not supported by FLASHINFER; supported: 64, 128, 256, 512"),
        (lambda: _case(backend="FLEX_ATTENTION", cache_dtype="fp8"), ConfigError, r"cache dtype 'fp8' is not supported by FLEX_ATTENTION"),
        (lambda: _case(kind="mla", backend="FLASH_ATTN", head_size=128), ConfigError, r"FLASH_ATTN is not an MLA backend"),
        (lambda: _case(backend="MAMBA2_ATTN"), ConfigError, r"MAMBA2_ATTN is a state-space backend"),
        (lambda: _case(backend="FLASHINFER", block_size=40), StartupError, r"No common block size for 40 \(FLASHINFER: 16, 32, 64\)\."),
        (lambda: _case(kind="mla", backend="FLASHMLA", head_size=576, block_size=16), StartupError, r"No common block size for 16 \(FLASHMLA: 64\)"),
        (lambda: _case(backend="ROCM_AITER_FA", block_size=24), ConfigError, r"block size 24 is not a multiple of 16, which ROCM_AITER_FA requires"),
        (lambda: _case(cache_dtype="fp9"), ConfigError, r"cache dtype 'fp9' is not one of auto, "),
        (lambda: _case(kind="windowed"), ConfigError, r"kind 'windowed' is not one of full, "),
        (lambda: _case(kind="sliding_window"), ConfigError, r"kind 'sliding_window' needs sliding_window > 0"),
        (lambda: _case(num_kv_heads=0), ConfigError, r"num_kv_heads 0 must be a positive integer"),
    ],
)
def test_invalid_cases(case, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message) as info:
        derive(case())
    assert "\n" not in str(info.value)


def test_cpu_and_flex_share_no_layout() -> None:
    layers = (LayerConfig("a", backend="CPU_ATTN"), LayerConfig("b", backend="FLEX_ATTENTION"))
    with pytest.raises(StartupError, match=r"No KV cache layout satisfies every supported set: CPU_ATTN: \['LBHNC'\]; FLEX_ATTENTION: \['LBNHC'\]"):
        derive(CaseConfig("x", layers, num_blocks=2))


def test_env_layout_must_be_a_candidate() -> None:
    with pytest.raises(StartupError, match=r"VLLM_KV_CACHE_LAYOUT=LBHNC does not satisfy every supported set; valid layouts: \['LBNHC'\]"):
        derive(CaseConfig("x", uniform_layers(1, backend="FLEX_ATTENTION"), num_blocks=2, layout="LBHNC"))


def test_mixed_pages_need_a_block_compact_layout() -> None:
    # research [run]: env=LHBNC with mixed HNC -> ValueError listing the block-compact layouts.
    layers = (LayerConfig("a", num_kv_heads=2, head_size=8), LayerConfig("b", num_kv_heads=4, head_size=8))
    with pytest.raises(StartupError, match=r"valid layouts: \['LBNHC', 'LBHNC', 'BLNHC', 'BLHNC'\]"):
        derive(CaseConfig("x", layers, num_blocks=2, layout="LHBNC"))


def test_mla_page_that_cannot_be_padded() -> None:
    # MLA page 64*576*2 = 73728; a Mamba state of 2*50000*2 = 200000 B is the largest page,
    # 73728 does not divide it, MLA pages cannot be padded, and without sliding-window layers
    # there is no full-allocation fallback.
    layers = (
        LayerConfig("m", kind="mla", backend="FLASHMLA", head_size=576),
        LayerConfig("s", kind="mamba", backend="MAMBA2_ATTN", mamba_shapes=((2, 50000),)),
    )
    case = CaseConfig("x", layers, block_size=64, num_blocks=2, mamba_block_size=64)
    from dataclasses import replace

    from reference import backends as bk
    from reference.derive import raw_spec
    from reference.planning import unify_page_size

    # The specs as the layers report them, unpadded: unify_kv_cache_spec_page_size refuses.
    specs = {l.name: raw_spec(case, l, bk.get_backend(l.backend)) for l in layers}
    specs["s"] = replace(specs["s"], page_size_padded=None)
    with pytest.raises(StartupError, match=r"Layer m: page size is not divisible by the maximum page size"):
        unify_page_size(specs)
    # Engine start-up never gets there: update_block_size_for_backend raises an MLA hybrid's block to a
    # multiple of 128 whose page holds the state (128 * ceil(200000 / (128 * 1152)) = 256 tokens), and pads
    # the state to that page.
    d = derive(case)
    assert {g.spec.page_size_bytes for g in d.groups} == {256 * 1152}


def test_mla_with_sliding_window_falls_back_to_full_allocation() -> None:
    # Same MLA page with an SW layer of page 5*64*512 = 163840 (not a multiple of 73728):
    # _try_get_full_allocation_fallback_groups promotes the SW layer to full attention and
    # puts everything in one UniformType group (bpb = 73728 + 163840).
    layers = (
        LayerConfig("m", kind="mla", backend="FLASHMLA", head_size=576),
        LayerConfig("s", kind="sliding_window", sliding_window=128, num_kv_heads=5, head_size=128),
    )
    d = derive(CaseConfig("x", layers, block_size=64, num_blocks=2))
    assert [g.layer_names for g in d.groups] == [("m", "s")]
    assert d.specs["s"].kind.value == "full_attention" and d.specs["s"].sliding_window == 128
    assert d.plan.bytes_per_block == 73728 + 163840


def test_not_enough_memory_for_one_block() -> None:
    with pytest.raises(StartupError, match=r"100 bytes leave nothing after reserving the null block of 131072 bytes"):
        derive(CaseConfig("x", uniform_layers(2), num_blocks=None, kv_cache_memory_bytes=100))


@pytest.mark.parametrize(("name", "message"), [("XYZ", "KV cache layout 'XYZ' is not one of LBHNC, LBNHC"), ("nhd", "'nhd'")])
def test_unknown_layout_names(name: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        layout_from_name(name)


def test_select_common_block_size_matches_research_table() -> None:
    # Research [run] (vllm-specs-backends.md 4.1): FLASHMLA [64], ROCM_AITER_FA [16, 32],
    # TOKENSPEED_MLA [32, 64], CPU_MLA [16], FA [MultipleOf(16)].
    fa, fmla, aiter, ts = [MultipleOf(16)], [64], [16, 32], [32, 64]
    assert select_common_block_size(256, [("FLASHMLA", fmla)]) == 64
    assert select_common_block_size(48, [("ROCM_AITER_FA", aiter)]) == 16
    assert select_common_block_size(96, [("TOKENSPEED_MLA", ts)]) == 32
    assert select_common_block_size(272, [("FLASH_ATTN", fa)]) == 272
    assert select_common_block_size(256, [("FLASH_ATTN", fa), ("FLASHMLA", fmla)]) == 64
    assert select_common_block_size(96, [("TOKENSPEED_MLA", ts), ("ROCM_AITER_FA", aiter)]) == 32
    with pytest.raises(StartupError, match=r"No common block size for 16 \(TOKENSPEED_MLA: 32, 64\)\."):
        select_common_block_size(16, [("TOKENSPEED_MLA", ts)])


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"tensor_parallel_size": 3, "decode_context_parallel_size": 2}, "tp_size=3 must be divisible by dcp_size=2."),
        ({"tensor_parallel_size": "8"}, "tensor_parallel_size '8' must be a positive integer (at most 4096)"),
        ({"decode_context_parallel_size": 0}, "decode_context_parallel_size 0 must be a positive integer (at most 4096)"),
        ({"prefill_context_parallel_size": 0}, "prefill_context_parallel_size 0 must be a positive integer (at most 4096)"),
        ({"prefill_context_parallel_size": 1 << 20}, "prefill_context_parallel_size 1048576 must be an integer from 1 to 4096"),
        ({"tensor_parallel_size": 2, "decode_context_parallel_size": 3, "prefill_context_parallel_size": 2},
         "When PCP is enabled, DCP must be disabled, span the PCP axis, or span the full TP x PCP axis. "
         "Got TP=2, PCP=2, DCP=3; valid DCP sizes are [1, 2, 4]."),
        ({"disable_hybrid_kv_cache_manager": "yes"}, "disable_hybrid_kv_cache_manager 'yes' must be true or false"),
    ],
)
def test_parallel_and_manager_options_are_checked(fields: dict, message: str) -> None:
    from reference.config import CaseConfig
    from reference.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        CaseConfig.from_dict({"name": "x", "layers": [{"name": "a"}], **fields})
    assert str(info.value) == message
