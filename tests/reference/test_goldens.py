"""Hand-computed goldens for generation 2 (vLLM 0.33.0).

Every expected number below was computed by hand from vLLM's formulas, and where a
comment says "research [run]" it was also observed running vLLM 0.33.0's own code on
CPU (shared/research/vllm-specs-backends.md and vllm-blocktables-runners.md). None of
them was produced by running the reference.
"""

from __future__ import annotations

import pytest

from reference.config import CaseConfig
from reference.derive import derive
from reference.errors import StartupError
from reference.specs import AttentionSpec, SpecKind
from suites.named_cases import CASES

L0, L1 = "model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"

# Worked example A (research [run], vllm-blocktables-runners.md section 3.2): two layers of
# FullAttentionSpec(B=128, Hkv=8, D=128, bf16), num_blocks=4. Page = 8*128*256*2 = 524288 B,
# bytes per block = 2 layers * 524288 = 1048576, pool = 4 * 1048576.
# Columns: (layer_stride, block_stride) in bytes; view strides in bf16 elements; layer 1's
# storage offset in elements.
EXAMPLE_A = {
    "lbhnc": ((2097152, 524288), (262144, 32768, 256, 1), 1048576),
    "lbnhc": ((2097152, 524288), (262144, 256, 2048, 1), 1048576),
    "lhbnc": ((2097152, 65536), (32768, 131072, 256, 1), 1048576),
    "blhnc": ((524288, 1048576), (524288, 32768, 256, 1), 262144),
    "blnhc": ((524288, 1048576), (524288, 256, 2048, 1), 262144),
    "bhlnc": ((65536, 1048576), (524288, 65536, 256, 1), 32768),
}


@pytest.mark.parametrize("layout", sorted(EXAMPLE_A))
def test_example_a_every_layout(layout: str) -> None:
    (layer_stride, block_stride), strides, l1_offset = EXAMPLE_A[layout]
    d = derive(CASES[f"dense-fa-b128-{layout}"])
    assert d.layout.name == layout.upper()
    assert d.plan.bytes_per_block == 1048576
    assert d.plan.size == 4 * 1048576
    (tensor,) = d.plan.tensors
    assert (tensor.layer_stride, tensor.block_stride, tensor.offset) == (layer_stride, block_stride, 0)
    assert d.kernel_block_sizes == (128,)
    v0, v1 = d.registered[L0], d.registered[L1]
    assert v0.shape == v1.shape == (4, 8, 128, 256)
    assert v0.stride == v1.stride == strides
    assert (v0.storage_offset, v1.storage_offset) == (0, l1_offset)
    assert v0.dtype == "bfloat16"


def test_flashinfer_block_128_views_64_token_kernel_blocks() -> None:
    # FlashInfer's kernel sizes are [16, 32, 64]: select_common_block_size(128) = 64, R = 2.
    # View: (4*2, 8, 64, 256); under LBNHC the kernel block stride is 524288/2 bytes = 131072
    # elements, H stride 256, N stride 8*256 = 2048 (research [run], example A, K=64 column).
    d = derive(CASES["flashinfer-b128-k64"])
    assert d.kernel_block_sizes == (64,)
    assert d.block_ratio(0) == 2
    assert d.registered[L0].shape == (8, 8, 64, 256)
    assert d.registered[L0].stride == (131072, 256, 2048, 1)
    assert d.connector_kernel_block_size == 64


def test_flashinfer_block_128_hnd() -> None:
    # LBHNC, K=64: H stride 64*256 = 16384 (research [run]: (131072,16384,256,1)).
    d = derive(CASES["flashinfer-b128-k64-hnd"])
    assert d.registered[L1].stride == (131072, 16384, 256, 1)
    assert d.registered[L1].storage_offset == 1048576


def test_lhbnc_cannot_split_kernel_blocks() -> None:
    # LHBNC block stride 65536 != page 524288 (research [run]: "ValueError ... block stride").
    with pytest.raises(StartupError, match=r"block stride 65536 != page 524288"):
        derive(CASES["flashinfer-b128-k64-lhbnc"])


def test_packed_blhnc_fails_in_metadata_builder() -> None:
    # BLHNC with one 2-layer group: block_stride 1048576 > layer_stride 524288, so
    # prepare_kernel_block_sizes keeps 128; FlashInfer's own pass then needs 64 and the
    # packed view cannot be split (vllm-specs-backends.md 4.4).
    with pytest.raises(StartupError, match=r"FLASHINFER needs 64-token kernel blocks"):
        derive(CASES["flashinfer-b128-blhnc-packed"])


def test_flashinfer_block_16_is_not_split() -> None:
    # 16 is in [16, 32, 64]: no split. Page 8*16*256*2 = 65536 B; 2 layers -> 131072 B/block.
    d = derive(CASES["flashinfer-b16"])
    assert d.kernel_block_sizes == (16,)
    assert d.plan.bytes_per_block == 131072
    assert d.registered[L0].shape == (8, 8, 16, 256)
    assert d.registered[L0].stride == (32768, 256, 2048, 1)


def test_flashinfer_sm100_declares_hnd_and_large_kernel_blocks() -> None:
    # SM10x: supported_kv_cache_layouts() = (LBHNC, BLHNC); TRT-LLM accepts 128 -> no split.
    d = derive(CASES["flashinfer-sm100-b128"])
    assert d.layout.name == "LBHNC"
    assert d.kernel_block_sizes == (128,)
    assert d.registered[L0].shape == (4, 8, 128, 256)


def test_tiny_uniform_num_blocks_from_memory() -> None:
    # Research [run]: H=2, D=8, bf16, block 16 -> page 2*16*16*2 = 1024 B, 2 layers -> 2048 B per
    # block; 20485 // 2048 = 10 blocks. LBNHC element strides (512, 16, 32, 1), l1 at 5120.
    d = derive(CASES["tiny-uniform-lbnhc"])
    assert d.num_blocks == 10
    assert d.plan.size == 20480
    assert d.registered[L0].stride == (512, 16, 32, 1)
    assert d.registered[L1].storage_offset == 5120


def test_tiny_uniform_blhnc_and_lhbnc() -> None:
    # Research [run] table "Uniform placement": BLHNC (ls 1024, bs 2048, strides (1024,256,16,1),
    # l1 at 512); LHBNC (ls 10240, bs 512, strides (256,2560,16,1), l1 at 5120).
    blhnc = derive(CASES["tiny-uniform-blhnc"])
    assert (blhnc.plan.tensors[0].layer_stride, blhnc.plan.tensors[0].block_stride) == (1024, 2048)
    assert blhnc.registered[L0].stride == (1024, 256, 16, 1)
    assert blhnc.registered[L1].storage_offset == 512
    lhbnc = derive(CASES["tiny-uniform-lhbnc"])
    assert (lhbnc.plan.tensors[0].layer_stride, lhbnc.plan.tensors[0].block_stride) == (10240, 512)
    assert lhbnc.registered[L0].stride == (256, 2560, 16, 1)
    assert lhbnc.registered[L1].storage_offset == 5120


def test_mixed_heads_one_uniform_type_group() -> None:
    # Research [run]: H=2 and H=4 -> pages 1024 and 2048, one UniformType group, bpb 3072.
    # LBNHC tensors ([layer 0], ls=10240, bs=1024, off=0) and ([layer 1], ls=20480, bs=2048, off=10240).
    d = derive(CASES["tiny-mixed-heads-lbnhc"])
    assert len(d.groups) == 1
    assert d.plan.bytes_per_block == 3072
    got = [(t.layers, t.layer_stride, t.block_stride, t.offset) for t in d.plan.tensors]
    l0, l1 = ("model.layers.0.attn",), ("model.layers.1.attn",)
    assert got == [(l0, 10240, 1024, 0), (l1, 20480, 2048, 10240)]
    blhnc = derive(CASES["tiny-mixed-heads-blhnc"])
    got = [(t.layers, t.layer_stride, t.block_stride, t.offset) for t in blhnc.plan.tensors]
    assert got == [(l0, 1024, 3072, 0), (l1, 2048, 3072, 1024)]


def test_mla_target_with_gqa_draft_example_b() -> None:
    # Research [run] worked example B: 2x MLA(B=64, 576, bf16) + FA draft (8x128).
    # MLA page 64*576*2 = 73728, draft page 8*64*256*2 = 262144; bpb = 2*73728 + 262144 = 409600.
    d = derive(CASES["mla-gqa-draft-b64"])
    assert len(d.groups) == 1 and d.plan.bytes_per_block == 409600
    got = [(t.layer_stride, t.block_stride, t.offset) for t in d.plan.tensors]
    assert got == [(294912, 73728, 0), (1048576, 262144, 589824)]
    assert d.registered[L0].shape == (4, 1, 64, 576)
    assert d.registered[L0].stride == (36864, 576, 576, 1)
    draft = d.registered["draft.layers.2.attn"]
    assert (draft.shape, draft.stride) == ((4, 8, 64, 256), (131072, 256, 2048, 1))


def test_mla_target_with_gqa_draft_blhnc() -> None:
    # Research [run]: BLHNC MLA strides (204800, 36864, 576, 1), draft (204800, 16384, 256, 1);
    # the draft's tensor starts at byte 147456 = 2 * 73728.
    d = derive(CASES["mla-gqa-draft-b64-blhnc"])
    assert d.registered[L0].stride == (204800, 36864, 576, 1)
    draft = d.registered["draft.layers.2.attn"]
    assert draft.stride == (204800, 16384, 256, 1)
    assert draft.byte_offset == 147456


def test_mla_with_draft_split_to_64() -> None:
    # FLASHMLA supports only 64: select_common_block_size(128, [FLASHMLA, FLASH_ATTN]) = 64, and
    # both kinds are viewed in 64-token kernel blocks (research [run]: (8,1,64,576), (8,8,64,256)).
    # N sits at index -2 for both, so Mooncake's old shape[-2 if use_mla else -3] reads 8 heads
    # as the draft's block size.
    d = derive(CASES["mla-gqa-draft-b128-k64"])
    assert d.kernel_block_sizes == (64,)
    assert d.registered[L0].shape == (8, 1, 64, 576)
    draft = d.registered["draft.layers.2.attn"]
    assert draft.shape == (8, 8, 64, 256)
    assert draft.shape[-3] == 8 != d.kernel_block_sizes[0]


def test_swa_hybrid_scales_block_size() -> None:
    # Research [run]: FA (H=2, bs 32, page 2*32*16*2 = 2048) and SW (H=1, page 1024): the SW
    # block size becomes 64 so both pages are 2048. Two buckets of 2 -> two groups.
    d = derive(CASES["swa-hybrid-scaled"])
    assert [g.spec.block_size for g in d.groups] == [32, 64]
    assert d.plan.bytes_per_block == 2 * 2048
    assert d.kernel_block_sizes == (32, 64)
    assert d.cache_block_size == 32
    assert d.registered["model.layers.2.self_attn.attn"].shape == (8, 1, 64, 16)


def test_swa_hybrid_pads_full_attention_pages() -> None:
    # Research [run]: FA page 2048 and SW (H=3) page 3072 -> FA gets page_size_padded=3072.
    # Under LBNHC the padded page raises the block stride to 3072 B = 1536 elements.
    d = derive(CASES["swa-hybrid-padded"])
    full = d.specs[L0]
    assert isinstance(full, AttentionSpec) and full.page_size_padded == 3072
    assert d.plan.bytes_per_block == 2 * 3072
    assert d.registered[L0].shape == (8, 2, 32, 16)
    assert d.registered[L0].stride == (1536, 16, 32, 1)


def test_mamba_hybrid_pads_state_to_attention_page() -> None:
    # Attention H=2, D=64, bf16, block 16: page 2*16*128*2 = 8192. Mamba state
    # (2*64 + 4*32*16) * 2 B = 4352, padded to 8192 by unify_kv_cache_spec_page_size. Groups
    # hold 2 layers each: bpb = 2*8192. Mamba views stay int8 (16, 1, 1, 4352), block stride 8192.
    d = derive(CASES["mamba-hybrid"])
    assert d.plan.bytes_per_block == 16384
    assert d.kernel_block_sizes == (16, 4096)
    mamba = d.registered["model.layers.2.mixer"]
    assert (mamba.shape, mamba.stride, mamba.dtype) == ((16, 1, 1, 4352), (8192, 4352, 4352, 1), "int8")
    assert d.registered["model.layers.3.mixer"].storage_offset == 16 * 8192


def test_fp8_cache_is_uint8_with_half_pages() -> None:
    # fp8 is stored as uint8: page 8*16*256*1 = 32768 B, elements are bytes.
    d = derive(CASES["fp8-fa-b16"])
    view = d.registered[L0]
    assert view.dtype == "uint8"
    assert d.plan.bytes_per_block == 2 * 32768
    assert view.stride == (32768, 256, 2048, 1)


def test_b12x_packs_k_and_v_into_two_head_slots() -> None:
    # B12X customize_spec: H = 2 slots, C = 8*128*2 = 2048 B; declared layouts (LBHNC, BLHNC).
    d = derive(CASES["b12x-two-slots"])
    assert d.layout.name == "LBHNC"
    view = d.registered[L0]
    assert view.shape == (4, 2, 64, 1024)
    assert view.stride == (131072, 65536, 1024, 1)
    block = d.block_bytes(L0, 1)
    assert block.v is not None
    assert block.k.start == 262144 and block.v.start == 262144 + 131072


def test_cpu_attn_requires_hnd_and_reads_kv_planes() -> None:
    # CPU_ATTN declares (LBHNC,); each (block, head) run of N*C = 32*512 B is K rows then V rows.
    d = derive(CASES["cpu-attn-b32"])
    assert d.layout.name == "LBHNC"
    block = d.block_bytes(L0, 0)
    assert block.v is not None
    assert (block.k.run, block.v.start - block.k.start) == (8192, 8192)


def test_nixl_asks_for_hnd() -> None:
    # NixlConnector.get_required_kvcache_layout -> LBHNC for non-MLA models.
    d = derive(CASES["nixl-dense-fa"])
    assert d.layout.name == "LBHNC"
    assert d.registered[L0].stride == (32768, 4096, 256, 1)


def test_mooncake_with_mla_keeps_default_layout() -> None:
    # Mooncake asks for no layout on MLA models: the default preference LBNHC wins.
    d = derive(CASES["mla-flashinfer-draft-mooncake"])
    assert d.layout.name == "LBNHC"
    assert d.kernel_block_sizes == (64,)
    assert d.connector_kernel_block_size == 64


@pytest.mark.parametrize(
    ("cache_dtype", "page"),
    # Research [run] (vllm-specs-backends.md 1.3): MLA block 64, head 576.
    [("auto", 73728), ("fp8", 36864), ("fp8_ds_mla", 41984), ("nvfp4_ds_mla", 22528)],
)
def test_mla_page_sizes(cache_dtype: str, page: int) -> None:
    from reference.config import CaseConfig, LayerConfig
    from reference.derive import raw_spec
    from reference.backends import get_backend

    case = CaseConfig("mla", (LayerConfig("l", kind="mla", backend="FLASHMLA", head_size=576, cache_dtype=cache_dtype),), block_size=64)
    spec = raw_spec(case, case.layers[0], get_backend("FLASHMLA"))
    assert spec.kind is SpecKind.MLA
    assert spec.page_size_bytes == page


@pytest.mark.parametrize(
    ("backend", "cache_dtype", "model_dtype", "heads", "content", "dtype"),
    # Full attention, 4 KV heads x 128, block 16: page = H * 16 * C. Hand-computed from
    # AttentionSpec.page_size_bytes and each backend's customize_spec (vllm-specs-backends.md 1.3).
    [
        ("FLASH_ATTN", "auto", "bfloat16", 4, 256 * 2, "bfloat16"),
        ("FLASH_ATTN", "auto", "float16", 4, 256 * 2, "float16"),
        ("FLASH_ATTN", "bfloat16", "float16", 4, 256 * 2, "bfloat16"),
        ("FLEX_ATTENTION", "auto", "float32", 4, 256 * 4, "float32"),
        ("FLASH_ATTN", "fp8", "bfloat16", 4, 256, "uint8"),
        ("FLASH_ATTN", "fp8_e4m3", "bfloat16", 4, 256, "uint8"),
        ("FLASHINFER", "fp8_e5m2", "bfloat16", 4, 256, "uint8"),
        # nvfp4: 2*Hkv slots, C = 128//2 + 128//16 = 72 bytes (fp4 data + fp8 scales).
        ("FLASHINFER", "nvfp4", "bfloat16", 8, 72, "uint8"),
        # per-token-head: (hk + hv) * 1 + two fp32 scales = 264; int4 halves the data: 136.
        ("TRITON_ATTN", "int8_per_token_head", "bfloat16", 4, 264, "int8"),
        ("TRITON_ATTN", "fp8_per_token_head", "bfloat16", 4, 264, "uint8"),
        ("TRITON_ATTN", "int4_per_token_head", "bfloat16", 4, 136, "uint8"),
    ],
)
def test_page_size_for_every_cache_dtype(backend: str, cache_dtype: str, model_dtype: str, heads: int, content: int, dtype: str) -> None:
    from reference.config import CaseConfig, uniform_layers

    case = CaseConfig("dt", uniform_layers(1, backend=backend, num_kv_heads=4, head_size=128, cache_dtype=cache_dtype), block_size=16, num_blocks=2, model_dtype=model_dtype)
    d = derive(case)
    spec = d.specs[L0]
    assert (spec.num_heads, spec.state_content_size_bytes, spec.dtype) == (heads, content, dtype)
    assert spec.page_size_bytes == heads * 16 * content
    view = d.registered[L0]
    assert view.dtype == dtype and view.shape[1] == heads


def test_hybrid_groups_share_bytes_by_layer_index() -> None:
    # Groups alias the pool from byte 0: layer i of every group starts at the same byte
    # (the HMA sharing of vLLM >= 0.30, vllm-specs-backends.md 2.8).
    d = derive(CASES["swa-hybrid-scaled"])
    sharing = d.shared_bytes()
    assert sharing == [
        ("model.layers.0.self_attn.attn", "model.layers.2.self_attn.attn"),
        ("model.layers.1.self_attn.attn", "model.layers.3.self_attn.attn"),
    ]
    assert derive(CASES["flashinfer-b16"]).shared_bytes() == []


def test_draft_kernel_block_size_follows_the_group_split() -> None:
    # MLA target (FLASHMLA [64]) + FA draft at block 128: the group's kernel size is 64, and the
    # drafter's own attention group re-selects over its backend: FA accepts 64 -> 64.
    d = derive(CASES["mla-gqa-draft-b128-k64"])
    assert d.draft_kernel_block_sizes == {"draft.layers.2.attn": 64}
    assert d.builder_kernel_block_sizes[L0] == 64


def test_packed_block_outermost_grouping_matches_research_runs() -> None:
    # Research [run] (vllm-specs-backends.md 2.6), BLHNC: FA (H=2, page 2*32*16*2 = 2048) x2 and
    # SW (H=1, 1024) x4 -> groups [f0, f1] and [s0..s3], each 4096 B per block. FA x2 with Mamba
    # states of 1120 B x6 -> [f0, f1], [m0, m2, m4], [m1, m3, m5] (3360 B each).
    from reference.config import CaseConfig, LayerConfig

    fa = tuple(LayerConfig(f"f{i}", num_kv_heads=2, head_size=8) for i in range(2))
    sw = tuple(LayerConfig(f"s{i}", kind="sliding_window", sliding_window=64, num_kv_heads=1, head_size=8) for i in range(4))
    d = derive(CaseConfig("p", fa + sw, block_size=32, num_blocks=4, layout="BLHNC"))
    assert [(g.layer_names, g.spec.page_size_bytes) for g in d.groups] == [(("f0", "f1"), 4096), (("s0", "s1", "s2", "s3"), 4096)]
    mamba = tuple(LayerConfig(f"m{i}", kind="mamba", backend="MAMBA2_ATTN", mamba_shapes=((2, 280),)) for i in range(6))
    case = CaseConfig("p", fa + mamba, block_size=32, num_blocks=4, layout="BLHNC", mamba_block_size=32)
    # The research run called get_kv_cache_groups on the specs as the layers report them (unpadded states).
    from dataclasses import replace

    from reference import backends as bk
    from reference.derive import raw_spec
    from reference.layout import KVCacheLayout
    from reference.planning import get_kv_cache_groups

    specs = {}
    for layer in case.layers:
        spec = raw_spec(case, layer, bk.get_backend(layer.backend))
        specs[layer.name] = replace(spec, page_size_padded=None) if layer.kind == "mamba" else spec
    groups = get_kv_cache_groups(specs, KVCacheLayout.BLHNC)
    assert [(g.layer_names, g.spec.page_size_bytes) for g in groups] == [
        (("f0", "f1"), 4096),
        (("m0", "m2", "m4"), 3360),
        (("m1", "m3", "m5"), 3360),
    ]
    # Through engine start-up, update_block_size_for_backend first pads each state page to the attention
    # page (2048 B): the six states pair up, three groups of two (as vLLM 0.33 plans it, driven on CPU).
    d = derive(case)
    assert [(g.layer_names, g.spec.page_size_bytes) for g in d.groups] == [
        (("f0", "f1"), 2048), (("m0", "m3"), 2048), (("m1", "m4"), 2048), (("m2", "m5"), 2048),
    ]
    assert d.plan.bytes_per_block == 4096


def test_approximate_gcd() -> None:
    from reference.planning import approximate_gcd

    # pad(d) = sum((d - x % d) % d): for [4, 6] d=2 pads 0 and is the largest zero-pad d.
    assert approximate_gcd([4, 6]) == 2
    # From 3: d=3 pads 2+0, d=4 pads 0+2, d=5 pads 1+4, d=6 pads 2+0: ties go to the larger d.
    assert approximate_gcd([4, 6], lower_bound=3) == 6
    assert approximate_gcd([5], lower_bound=9) == 9


# --- the hybrid manager disabled (unify_hybrid_kv_cache_specs) ----------------------------------


def test_hma_off_promotes_chunked_local_layers_into_one_full_group() -> None:
    from suites.named_cases import CASES

    d = derive(CASES["chunked-local-hma-off"])
    (group,) = d.groups
    assert len(group.layer_names) == 4 and group.spec.kind.value == "full_attention"
    # FullAttentionSpec.merge keeps the one chunk size; with the manager on: one group per layer.
    assert group.spec.attention_chunk_size == 8192
    assert len(derive(CASES["chunked-local-hma-off"].with_(disable_hybrid_kv_cache_manager=False)).groups) == 4


def test_hma_off_refuses_what_cannot_be_promoted() -> None:
    from reference.config import LayerConfig, uniform_layers

    mamba = LayerConfig("model.layers.2.mixer", kind="mamba", backend="MAMBA2_ATTN", mamba_shapes=((2, 64), (4, 32, 16)))
    case = CaseConfig("hma-off-mamba", uniform_layers(2, num_kv_heads=2, head_size=64) + (mamba,), disable_hybrid_kv_cache_manager=True)
    with pytest.raises(StartupError, match=r"^Failed to promote local KV cache specs to one unified type\.$"):
        derive(case)
    two_windows = uniform_layers(1, num_kv_heads=2, head_size=64) + tuple(
        LayerConfig(f"model.layers.{i}.self_attn.attn", kind="sliding_window", sliding_window=w, num_kv_heads=2, head_size=64)
        for i, w in ((1, 64), (2, 128))
    )
    with pytest.raises(StartupError, match="must have the same window size"):
        derive(CaseConfig("hma-off-two-windows", two_windows, disable_hybrid_kv_cache_manager=True))
