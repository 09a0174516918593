"""Step5's DSA layers in the reference (``models/step5/nvidia``): the DSA attention (family ``step5``,
``Step5Attention`` on ``STEP5_DSA``), its region summaries (kind ``step5_summary``,
``Step5SparseSummaryCacheLayer``) and its tail ring (kind ``step5_csa_ring``, ``Step5CSATailRing``).

What the classes build is checked against vLLM in ``tests/vllm`` (the named cases, the sampler's
``step5`` family and the mutations ``step5-ring-half-page`` and ``step5-summary-per-four-tokens``); here,
without vLLM: the case's validation, the specs, pages and block strides the reference predicts, and its
refusals.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from reference.config import CaseConfig
from reference.derive import derive
from reference.errors import ConfigError, StartupError
from reference.specs import SpecKind
from suites.named_cases import CASES, step5_layers

ATTN = "model.layers.0.self_attn.attn"


def _case(layers, **options) -> CaseConfig:
    return CaseConfig("step5-test", tuple(layers), block_size=options.pop("block_size", 64), num_blocks=16, **options)


def test_the_summaries_and_the_ring_follow_the_main_page() -> None:
    d = derive(_case(step5_layers((True,))), "mrv2")
    main, summary, ring = (d.specs[ATTN + suffix] for suffix in ("", ".sparse_summary_cache", ".csa_tail_ring"))
    assert main.page_size_bytes == 64 * 2 * 192 * 2 * 2  # K and V of 2 x 192 bf16
    # One 256-byte uint8 summary per 8 tokens, no V.
    assert (summary.kind, summary.tokens_per_state, summary.dtype, summary.head_size_v) == (SpecKind.FULL, 8, "uint8", 0)
    assert summary.page_size_bytes == 64 // 8 * 256
    # The ring is one main page of 1 KiB rows, at the main block size, addressed across 1 KiB-aligned blocks.
    assert ring.kind is SpecKind.CIRCULAR_BUFFER and not ring.uses_slot_mapping
    assert (ring.page_size_bytes, ring.block_size, ring.get_block_stride_alignment()) == (main.page_size_bytes, 64, 1024)
    # The summaries share the DSA layer's group; the ring is a group of its own.
    assert [set(g.layer_names) for g in d.groups] == [{ATTN, ATTN + ".sparse_summary_cache"}, {ATTN + ".csa_tail_ring"}]


def test_the_dsa_backend_tiles_every_block_stride_with_eight_token_pages() -> None:
    d = derive(CASES["step5-dsa-b64"], "mrv2")
    # STEP5_DSA's customize_spec: MultipleOf(8), so a 64-token block's stride is a multiple of an 8-token page.
    assert d.specs["model.layers.1.self_attn.attn"].get_block_stride_alignment() == 8 * 2 * 192 * 2 * 2
    assert d.layout.name == "BLNHC"
    # Two DSA pages and two summaries (200704 bytes) rounded up to 17 x 12288.
    assert d.plan.tensors[0].block_stride == 17 * 12288


def test_mrv1_refuses_a_step5_model_and_mrv2_starts_it() -> None:
    case = _case(step5_layers((False, True)))
    with pytest.raises(StartupError, match="^Model Runner V1 does not support: Step5$"):
        derive(case, "mrv1")
    derive(case, "mrv2")
    # Under PCP MRv1 lists both, in its validator's order.
    with pytest.raises(StartupError, match="^Model Runner V1 does not support: prefill context parallel, Step5$"):
        derive(replace(case, prefill_context_parallel_size=2), "mrv1")
    # Before 0.33 MRv1's validator names no architecture (Step5's model is new in 0.33): it goes on to the layers.
    derive(replace(case, vllm_version="0.32.0"), "mrv1")


@pytest.mark.parametrize(("layers", "options", "message"), [
    (step5_layers((True,), num_kv_heads=1, cache_dtype="fp8"), {"block_size": 16},
     "Step5 CSA tail ring needs 7 rows of 1024 bytes in one 6144-byte KV page; increase --block-size."),
    (step5_layers((True,), head_size=128), {}, "Step5 DSA kernels require head_size 192, got 128."),
    (step5_layers((True,), head_size=256), {}, "Step5 DSA supports attention head dimensions 128 or 192, got 256."),
    (step5_layers((True,)), {"capability": (12, 0)},
     "Step5 DSA requires SM90, SM100 or SM103; got DeviceCapability(major=12, minor=0)."),
    (step5_layers((True,), cache_dtype="fp8_e5m2"), {}, "Step5 DSA supports E4M3 FP8 KV cache only"),
    (step5_layers((True,)), {"model_dtype": "float16"}, "Step5 DSA kernels require bfloat16 activations, got torch.float16."),
    (step5_layers((True,)), {"block_size": 12}, "Step5 KV blocks must align to eight-token regions"),
    (step5_layers((True,)), {"connector": "mooncake"}, "Step5 DSA sparse summaries are only transferred by MooncakeStoreConnector"),
    (step5_layers((True,), num_kv_heads=1), {"tensor_parallel_size": 4, "decode_context_parallel_size": 2},
     "Step5 does not support decode context parallelism"),
])
def test_what_a_step5_layer_refuses(layers, options, message) -> None:
    with pytest.raises(StartupError) as refused:
        derive(_case(layers, **options), "mrv2")
    assert str(refused.value).startswith(message), refused.value


def test_seven_rows_are_enough_for_the_ring() -> None:
    # A one-head bf16 DSA layer at --block-size 16: 12 rows of 1 KiB, more than the 7 a closing region replays.
    d = derive(_case(step5_layers((True,), num_kv_heads=1), block_size=16), "mrv2")
    assert d.specs[ATTN + ".csa_tail_ring"].page_size_bytes // 1024 == 12


@pytest.mark.parametrize(("capability", "head_size", "cache_dtype", "refused"), [
    ((9, 0), 192, "fp8", False),   # FA3 reads fp8
    ((10, 0), 128, "fp8", False),  # FA4 up to head size 128
    ((10, 0), 192, "fp8", True),   # a wider head falls back to FA2, which reads none
    ((10, 0), 192, "auto", False),
    ((12, 0), 64, "fp8", True),    # FA2 only
])
def test_flash_attention_refuses_a_quantized_cache_its_version_cannot_read(capability, head_size, cache_dtype, refused) -> None:
    # Step5's sliding-window layers are FlashAttention layers of its head size.
    case = _case(step5_layers((False,), head_size=head_size, cache_dtype=cache_dtype), capability=capability)
    if refused:
        with pytest.raises(StartupError, match="FlashAttention does not support fp8 kv-cache on this device"):
            derive(case, "mrv2")
    else:
        derive(case, "mrv2")


def test_a_side_cache_must_follow_its_dsa_layer() -> None:
    main, summary, ring = step5_layers((True,))
    with pytest.raises(ConfigError, match="builds its CSA side caches after it"):
        _case((main, ring, summary))
    with pytest.raises(ConfigError, match="is built by a Step5 DSA layer"):
        _case((summary, main, ring))
    with pytest.raises(ConfigError, match="head_size 384 must be 512"):
        _case((main, summary, replace(ring, head_size=384)))
