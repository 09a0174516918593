"""Generation 1 (vLLM 0.21 to 0.28): per-backend shapes, gen-1 placement, MRv1 vs MRv2.

Goldens are hand-computed; each says where its numbers come from. Element strides
of a contiguous tensor are products of the inner sizes; bf16 is 2 bytes.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from reference.specs import SpecKind, layer_spec_of
from reference.config import CaseConfig, LayerConfig, uniform_layers
from reference.errors import ConfigError, NotModeledError, StartupError
from reference.gen1 import (
    hybrid_block_size,
    derive_gen1,
    gen1_kv_cache_shape,
    gen1_stride_order,
    merged_runs,
    mooncake_gen1_block_size,
    mrv1_mrv2_differences,
    permuted_view_strides,
    use_mla,
)

# Qwen3-like attention: 8 kv heads x 128, bf16 (the #42846 report's model family).
QWEN3 = dict(backend="FLASHINFER", num_kv_heads=8, head_size=128)


def gen1(name: str, layers, **kw) -> CaseConfig:
    kw.setdefault("vllm_version", "0.21.0")
    kw.setdefault("num_blocks", 10)
    return CaseConfig(name, tuple(layers), generation=1, **kw)


def only_view(d):
    (view,) = d.registered.values()
    return view


def one_line_config_error(excinfo, *needles: str) -> None:
    text = str(excinfo.value)
    assert "\n" not in text
    for needle in needles:
        assert needle in text, f"{needle!r} not in {text!r}"


# --- goldens ----------------------------------------------------------------------------


def test_golden_42846_flashinfer_block_128_kernel_64() -> None:
    # feasibility-cpu.md section 9: FlashInfer declares [16, 32, 64] off SM100, so block
    # 128 -> kernel 64. MRv1 calls get_kv_cache_shape(N*128//64, 64, H, D) = (2N, 2, 64, 8, 128);
    # MRv2 in 0.21 calls it with (N, 128, H, D) = (N, 2, 128, 8, 128). N = 10 here.
    case = gen1("qwen3-fi-128", uniform_layers(2, **QWEN3), block_size=128)
    v1, v2 = derive_gen1(case, "mrv1"), derive_gen1(case, "mrv2")
    for name in v1.registered:
        a, b = v1.registered[name], v2.registered[name]
        assert a.shape == (20, 2, 64, 8, 128)
        # contiguous (NHD = identity order): D 1, H 128, N 8*128, K/V 64*1024, B 2*65536
        assert a.stride == (131072, 65536, 1024, 128, 1)
        assert b.shape == (10, 2, 128, 8, 128)
        assert b.stride == (262144, 131072, 1024, 128, 1)
        assert a.dtype == b.dtype == "bfloat16"
    assert v1.kernel_block_sizes == (64,)
    assert v2.kernel_block_sizes == (128,)  # builders saw block 128 (kernel_block_size=None)
    assert v2.selected_kernel_block_sizes == (64,)  # but NIXL derives 64 -> 2N expected blocks
    diffs = mrv1_mrv2_differences(case)
    assert len(diffs) == 2
    assert all("(20, 2, 64, 8, 128)" in d and "(10, 2, 128, 8, 128)" in d for d in diffs)

    fixed = case.with_(vllm_version="0.22.0")  # #42766: MRv2 takes kernel_block_sizes
    assert mrv1_mrv2_differences(fixed) == []
    assert derive_gen1(fixed, "mrv2").registered == derive_gen1(fixed, "mrv1").registered
    assert derive_gen1(fixed, "mrv2").registered[case.layers[0].name].shape == (20, 2, 64, 8, 128)


def test_golden_flash_attn_2bnhd_nhd_and_hnd_strides() -> None:
    # FlashAttentionBackend.get_kv_cache_shape = (2, N, B, H, D) = (2, 10, 16, 4, 64);
    # stride order NHD (0,1,2,3,4), HND (0,1,3,2,4) (flash_attn.py get_kv_cache_stride_order).
    case = gen1("fa", uniform_layers(1, backend="FLASH_ATTN", num_kv_heads=4, head_size=64), block_size=16)
    nhd = only_view(derive_gen1(case.with_(layout="NHD")))
    assert nhd.shape == (2, 10, 16, 4, 64)
    # contiguous: D 1, H 64, N 4*64, B 16*256, K/V 10*4096
    assert nhd.stride == (40960, 4096, 256, 64, 1)
    hnd = only_view(derive_gen1(case.with_(layout="HND")))
    assert hnd.shape == (2, 10, 16, 4, 64)  # permuted back: same logical shape
    # physical (2, 10, 4, 16, 64) is contiguous: D 1, N 64, H 16*64, B 4*1024, K/V 40960;
    # logical N (dim 2) is physical dim 3, logical H (dim 3) physical dim 2.
    assert hnd.stride == (40960, 4096, 64, 1024, 1)


def test_golden_flash_attn_block_bytes_live_in_two_planes() -> None:
    # (2, 10, 16, 4, 64) bf16: one plane = 10*16*4*64*2 = 81920 bytes, one block's K (or V)
    # = 16*4*64*2 = 8192 bytes. Block 3: K [3*8192, 4*8192), V 81920 later.
    case = gen1("fa", uniform_layers(1, backend="FLASH_ATTN", num_kv_heads=4, head_size=64), block_size=16)
    for layout in ("NHD", "HND"):  # HND permutes inside the block; the block stays contiguous
        d = derive_gen1(case.with_(layout=layout))
        bb = d.block_bytes(case.layers[0].name, 3)
        assert merged_runs([bb.k]) == ((24576, 32768),)
        assert merged_runs([bb.v]) == ((106496, 114688),)
        assert merged_runs([bb.page]) == ((24576, 32768), (106496, 114688))


def test_golden_mla_bnd_with_and_without_kernel_split() -> None:
    # MLA get_kv_cache_shape = (N, B, 576); bf16 contiguous strides (B*576, 576, 1).
    mla = dict(kind="mla", backend="FLASHMLA", head_size=576)
    d = derive_gen1(gen1("ds", uniform_layers(1, **mla), block_size=64))
    assert only_view(d).shape == (10, 64, 576)
    assert only_view(d).stride == (36864, 576, 1)  # 64*576
    # FlashMLA declares [64]: block 128 splits 2x in MRv1 -> (20, 64, 576); MRv2@0.21 keeps 128.
    case = gen1("ds128", uniform_layers(1, **mla), block_size=128)
    assert only_view(derive_gen1(case, "mrv1")).shape == (20, 64, 576)
    assert only_view(derive_gen1(case, "mrv2")).shape == (10, 128, 576)
    assert only_view(derive_gen1(case, "mrv2")).stride == (73728, 576, 1)  # 128*576


def test_golden_flash_attn_blocks_first_from_0_23() -> None:
    # GEN1_LAYOUT_OVERRIDES: FA moved to (N, 2, B, H, D) in 0.23 (vLLM #42095, FlexKV#187).
    # (10, 2, 16, 4, 64) contiguous: D 1, H 64, N 256, K/V 16*256, B 2*4096.
    case = gen1("fa23", uniform_layers(1, backend="FLASH_ATTN", num_kv_heads=4, head_size=64),
                block_size=16, vllm_version="0.23.0")
    v = only_view(derive_gen1(case))
    assert v.shape == (10, 2, 16, 4, 64)
    assert v.stride == (8192, 4096, 256, 64, 1)
    assert gen1_kv_cache_shape("FLASH_ATTN", 10, 16, 4, 64, vllm_version="0.22.0") == (2, 10, 16, 4, 64)


def test_golden_packed_0_28_and_the_mooncake_heuristic_reads_heads() -> None:
    # 0.28: (N, H, B, 2D) = (10, 4, 16, 128) with NHD strides: physical (10, 16, 4, 128),
    # so C 1, H 128, N 4*128, B 16*512 (kvcached#493; a 0.28 connector's notes).
    case = gen1("fi28", uniform_layers(1, backend="FLASHINFER", num_kv_heads=4, head_size=64),
                block_size=16, vllm_version="0.28.0")
    d = derive_gen1(case)
    v = only_view(d)
    assert v.shape == (10, 4, 16, 128)
    assert v.stride == (8192, 128, 512, 1)
    assert mooncake_gen1_block_size(v, use_mla=False) == 4  # H, not the block size 16
    # K of block 3 = the first 64 elements (128 bytes) of every (token, head) entry.
    bb = d.block_bytes(case.layers[0].name, 3)
    assert bb.k.start == 3 * 16384 and bb.k.run == 128 and bb.k.count == 64
    assert bb.v.start == bb.k.start + 128
    assert merged_runs([bb.page]) == ((49152, 65536),)


def test_golden_mooncake_heuristic_mixed_mla_and_gqa_draft() -> None:
    # #39596: model-global use_mla makes shape[-2] read H on the GQA draft. One
    # UniformTypeKVCacheSpecs group (MLA and full share a base type), kernel
    # select_common_block_size(128, [FLASHMLA [64], FLASHINFER [16,32,64]]) = 64.
    layers = uniform_layers(2, kind="mla", backend="FLASHMLA", head_size=576) + (
        LayerConfig("model.layers.2.self_attn.attn", backend="FLASHINFER", num_kv_heads=8, head_size=128,
                    is_draft=True),
    )
    case = gen1("ds-eagle", layers, block_size=128, num_blocks=4)
    assert use_mla(case)
    d = derive_gen1(case, "mrv1")
    assert d.kernel_block_sizes == (64,)
    # gen-1 uniform-type placement: one tensor per layer, sized by its own page.
    assert [t.shared_by for t in d.kv_cache_tensors] == [(n.name,) for n in layers]
    assert [t.size for t in d.kv_cache_tensors] == [128 * 576 * 2 * 4] * 2 + [2 * 128 * 8 * 128 * 2 * 4]
    reads = {n: mooncake_gen1_block_size(v, use_mla(case)) for n, v in d.registered.items()}
    assert reads[layers[0].name] == reads[layers[1].name] == 64  # MLA (8, 64, 576): N, right
    assert reads[layers[2].name] == 8  # draft (8, 2, 64, 8, 128): H, wrong
    assert d.registered[layers[2].name].shape == (8, 2, 64, 8, 128)


def test_golden_mooncake_heuristic_vs_kernel_block_by_layout_and_runner() -> None:
    # shape[-3] is the token axis of both (2, B, N, H, D) and (B, 2, N, H, D): it reads the
    # kernel block in MRv1, but the logical block in MRv2@0.21 (the #42846 class).
    fi = gen1("fi", uniform_layers(1, **QWEN3), block_size=128)
    fa = gen1("fa", uniform_layers(1, backend="FLASH_ATTN", num_kv_heads=8, head_size=128), block_size=128)
    assert mooncake_gen1_block_size(only_view(derive_gen1(fi, "mrv1")), False) == 64
    assert mooncake_gen1_block_size(only_view(derive_gen1(fi, "mrv2")), False) == 128  # != kernel 64
    # FA accepts MultipleOf(16): no split, so both runners agree on (2, 10, 128, 8, 128).
    assert only_view(derive_gen1(fa, "mrv1")).shape == (2, 10, 128, 8, 128)
    assert mooncake_gen1_block_size(only_view(derive_gen1(fa, "mrv2")), False) == 128


def test_golden_hma_tensor_i_shared_by_layer_i_of_every_group() -> None:
    # Llama-4-like: full + chunked-local layers form two groups; gen-1 placement makes
    # group_size = 2 tensors, tensor i shared by (full_i, chunked_i), each of
    # page * num_blocks = (2*32*2*64*2) * 4 = 65536 bytes.
    geo = dict(backend="FLASH_ATTN", num_kv_heads=2, head_size=64)
    layers = uniform_layers(2, **geo) + uniform_layers(2, start=2, kind="chunked_local", attention_chunk_size=256, **geo)
    d = derive_gen1(gen1("l4", layers, block_size=32, num_blocks=4))
    names = [layer.name for layer in layers]
    assert [g.layer_names for g in d.groups] == [tuple(names[:2]), tuple(names[2:])]
    assert [(t.size, t.shared_by) for t in d.kv_cache_tensors] == [
        (65536, (names[0], names[2])),
        (65536, (names[1], names[3])),
    ]
    # Sharing layers alias: same bytes for the same block id (one group owns it at a time).
    assert d.block_bytes(names[0], 2) == d.block_bytes(names[2], 2)._replace(layer=names[0])
    assert d.block_bytes(names[1], 2).page.start == 65536 + 2 * 8192  # tensor 1's base + block 2


def test_golden_42846_same_page_bytes_but_k_moves() -> None:
    # The corruption mechanism: FlashInfer page of block b = 2*128*8*128*2 = 524288 bytes at
    # b*524288 in both runners, but MRv1 stores [K64|V64][K64|V64] and MRv2@0.21 [K128|V128].
    case = gen1("qwen3-fi-128", uniform_layers(1, **QWEN3), block_size=128)
    name = case.layers[0].name
    a, b = derive_gen1(case, "mrv1").block_bytes(name, 3), derive_gen1(case, "mrv2").block_bytes(name, 3)
    start = 3 * 524288
    assert merged_runs([a.page]) == merged_runs([b.page]) == ((start, start + 524288),)
    assert merged_runs([a.k]) == ((start, start + 131072), (start + 262144, start + 393216))
    assert merged_runs([b.k]) == ((start, start + 262144),)


# --- backend facts and overrides ----------------------------------------------------------


def test_stride_orders_per_backend_and_overrides() -> None:
    assert gen1_stride_order("FLASHINFER", "HND") == (0, 1, 3, 2, 4)
    assert gen1_stride_order("TRITON_ATTN", "HND") == (0, 1, 3, 2, 4)  # after #37940
    assert gen1_stride_order("FLASHMLA", "HND") == (0, 1, 2)
    # Override: Flex had no get_kv_cache_stride_order, so HND fell back to the identity.
    assert gen1_stride_order("FLEX_ATTENTION", "HND") == (0, 1, 2, 3, 4)
    assert gen1_stride_order("FLASH_ATTN", "NHD", vllm_version="0.28.0") == (0, 2, 1, 3)
    # Observed on 0.19.1: Triton's HND order is still the identity (#37940 is in 0.20.0).
    assert gen1_stride_order("TRITON_ATTN", "HND", vllm_version="0.19.1") == (0, 1, 2, 3, 4)
    assert gen1_stride_order("TRITON_ATTN", "HND", vllm_version="0.20.0") == (0, 1, 3, 2, 4)


def test_flex_kernel_block_sizes_per_release() -> None:
    """Multiples of 1 on 0.19/0.20 (block 8 starts), of 16 from 0.21 (MRv1 refuses block 8;
    MRv2 before 0.22 never asks, so the runners differ in outcome)."""
    case = gen1("flex", [LayerConfig("l0", backend="FLEX_ATTENTION")], block_size=8, vllm_version="0.20.0")
    assert derive_gen1(case, "mrv1").kernel_block_sizes == (8,)
    later = case.with_(vllm_version="0.21.0")
    with pytest.raises(StartupError, match="No common block size for 8"):
        derive_gen1(later, "mrv1")
    assert derive_gen1(later, "mrv2").kernel_block_sizes == (8,)
    assert mrv1_mrv2_differences(later) and mrv1_mrv2_differences(later)[0].startswith("error: MRv1 refuses")
    with pytest.raises(StartupError):
        derive_gen1(later.with_(vllm_version="0.22.0"), "mrv2")
    assert mrv1_mrv2_differences(later.with_(vllm_version="0.22.0")) == []


def test_permuted_view_strides_uses_the_inverse_order() -> None:
    # x.view((4, 2, 3)).permute(inverse of (2, 0, 1)): the physical strides are (6, 3, 1);
    # logical dim i is physical dim order.index(i) = 1, 2, 0 -> (3, 1, 6). A non-involution
    # order, so confusing order[i] with order.index(i) would give (1, 6, 3).
    assert permuted_view_strides((2, 3, 4), (2, 0, 1)) == (3, 1, 6)
    with pytest.raises(ConfigError):
        permuted_view_strides((2, 3, 4), (0, 0, 1))


def test_unverified_versions_are_refused_not_guessed() -> None:
    # Read off 0.25.0 and 0.26.0's backend classes: packing (#44455) arrived in 0.26.
    assert gen1_kv_cache_shape("FLASH_ATTN", 4, 16, 2, 64, vllm_version="0.25.0") == (4, 2, 16, 2, 64)
    assert gen1_kv_cache_shape("FLASH_ATTN", 4, 16, 2, 64, vllm_version="0.26.0") == (4, 2, 16, 128)
    assert gen1_kv_cache_shape("TRITON_MLA", 4, 16, 1, 576, vllm_version="0.27.0") == (4, 16, 576)
    with pytest.raises(ConfigError, match="0.29.0 is generation 2"):
        gen1_kv_cache_shape("FLASH_ATTN", 4, 16, 2, 64, vllm_version="0.29.0")
    with pytest.raises(ConfigError):
        gen1_kv_cache_shape("FLASH_ATTN", 4, 16, 2, 64, vllm_version="0.33.0")
    with pytest.raises(NotModeledError, match="older than 0.19.0"):
        gen1_kv_cache_shape("FLASH_ATTN", 4, 16, 2, 64, vllm_version="0.18.1")


def test_flash_attn_block_size_not_multiple_of_16() -> None:
    case = gen1("fa8", uniform_layers(1, backend="FLASH_ATTN"), block_size=8)
    with pytest.raises(StartupError, match="No common block size for 8"):
        derive_gen1(case, "mrv1")
    with pytest.raises(StartupError, match="multiple of 16"):
        derive_gen1(case, "mrv2")  # 0.21 MRv2 goes straight to get_kv_cache_shape


def test_nixl_defaults_to_hnd_unless_mla() -> None:
    gqa = gen1("g", uniform_layers(1, backend="FLASH_ATTN"), connector="nixl")
    assert derive_gen1(gqa).layout == "HND"
    assert derive_gen1(gqa.with_(layout="NHD")).layout == "NHD"  # the env var wins
    mla = gen1("m", uniform_layers(1, kind="mla", backend="TRITON_MLA", head_size=576), connector="nixl")
    assert derive_gen1(mla).layout == "NHD"


# --- invalid input --------------------------------------------------------------------------


def test_unknown_backend_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as e:
        gen1_kv_cache_shape("NO_SUCH_BACKEND", 4, 16, 2, 64)
    one_line_config_error(e, "NO_SUCH_BACKEND", "expected")


def test_backend_without_gen1_shape_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as e:
        gen1_stride_order("CPU_ATTN", "NHD")
    one_line_config_error(e, "CPU_ATTN", "FLASH_ATTN")
    with pytest.raises(ConfigError) as e:
        derive_gen1(gen1("cpu", uniform_layers(1, backend="CPU_ATTN")))
    one_line_config_error(e, "CPU_ATTN")


def test_layout_other_than_nhd_or_hnd_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as e:
        gen1_stride_order("FLASH_ATTN", "LBHNC")
    one_line_config_error(e, "LBHNC", "NHD or HND")
    with pytest.raises(ConfigError) as e:
        derive_gen1(gen1("lay", uniform_layers(1, backend="FLASH_ATTN"), layout="LBNHC"))
    one_line_config_error(e, "LBNHC", "NHD or HND")


def test_generation_2_case_is_a_config_error() -> None:
    case = CaseConfig("g2", uniform_layers(1, backend="FLASH_ATTN"))
    with pytest.raises(ConfigError) as e:
        derive_gen1(case)
    one_line_config_error(e, "generation 2")


# --- properties ---------------------------------------------------------------------------

GQA_HEADS = {"FLASH_ATTN": (64, 128), "FLASHINFER": (64, 128), "TRITON_ATTN": (64, 128), "FLEX_ATTENTION": (64,)}
MLA_BACKENDS = ("TRITON_MLA", "FLASHMLA", "FLASHINFER_MLA", "CUTLASS_MLA", "FLASH_ATTN_MLA")
VERSIONS = ("0.21.0", "0.22.0", "0.23.0", "0.25.1", "0.28.0")


@st.composite
def gen1_cases(draw, versions=VERSIONS) -> CaseConfig:
    family = draw(st.sampled_from(("gqa", "hma", "mla")))
    gqa_backend = draw(st.sampled_from(sorted(GQA_HEADS)))
    gqa = dict(
        backend=gqa_backend,
        num_kv_heads=draw(st.integers(1, 4)),
        head_size=draw(st.sampled_from(GQA_HEADS[gqa_backend])),
        cache_dtype="auto" if gqa_backend == "FLEX_ATTENTION" else draw(st.sampled_from(("auto", "fp8"))),
    )
    n = draw(st.integers(1, 3))
    if family == "mla":
        layers = uniform_layers(n, kind="mla", backend=draw(st.sampled_from(MLA_BACKENDS)), head_size=576)
        if draw(st.booleans()):
            layers += (LayerConfig(f"model.layers.{n}.self_attn.attn", is_draft=True, **gqa),)
    else:
        layers = uniform_layers(n, **gqa)
        if family == "hma":
            # A local kind beside full attention: its own group (a window's block from 0.25 is
            # the backend's smallest kernel block, rescaled by page unification).
            local = draw(st.sampled_from((dict(kind="chunked_local", attention_chunk_size=512),
                                          dict(kind="sliding_window", sliding_window=256),
                                          dict(kind="sink_full", sink_len=64))))
            layers += uniform_layers(draw(st.integers(1, 3)), start=n, **local, **gqa)
    return CaseConfig(
        "prop",
        layers,
        block_size=draw(st.sampled_from((16, 32, 64, 128))),
        num_blocks=draw(st.integers(1, 5)),
        model_dtype=draw(st.sampled_from(("bfloat16", "float16"))),
        layout=draw(st.sampled_from(("NHD", "HND"))),
        generation=1,
        vllm_version=draw(st.sampled_from(versions)),
    )


def derive_or_reject(case: CaseConfig, runner: str):
    try:
        return derive_gen1(case, runner)
    except (StartupError, NotModeledError):
        assume(False)  # vLLM refuses it, or the release is deliberately not modeled


@settings(max_examples=60, deadline=None)
@given(gen1_cases(), st.sampled_from(("mrv1", "mrv2")))
def test_distinct_layer_blocks_never_overlap_within_a_group(case: CaseConfig, runner: str) -> None:
    d = derive_or_reject(case, runner)
    for group in d.groups:
        spans = []
        for name in group.layer_names:
            for b in range(d.num_blocks):
                bb = d.block_bytes(name, b)
                k, v = merged_runs([bb.k]), merged_runs([bb.v]) if bb.v is not None else ()
                page = merged_runs([bb.page])
                assert merged_runs([bb.k] + ([bb.v] if bb.v is not None else [])) == page
                assert not set(k) & set(v)
                spans.extend((lo, hi, name, b) for lo, hi in page)
        spans.sort()
        for (lo1, hi1, n1, b1), (lo2, hi2, n2, b2) in zip(spans, spans[1:]):
            assert hi1 <= lo2, f"{n1} block {b1} overlaps {n2} block {b2}"


@settings(max_examples=60, deadline=None)
@given(gen1_cases(versions=VERSIONS[1:]))
def test_mrv1_and_mrv2_register_identical_tensors_from_0_22(case: CaseConfig) -> None:
    one, two = derive_or_reject(case, "mrv1"), derive_or_reject(case, "mrv2")
    assert one.registered == two.registered
    assert one.kernel_block_sizes == two.kernel_block_sizes
    assert mrv1_mrv2_differences(case) == []


@settings(max_examples=60, deadline=None)
@given(gen1_cases(), st.sampled_from(("mrv1", "mrv2")))
def test_every_view_addresses_only_its_raw_tensor(case: CaseConfig, runner: str) -> None:
    d = derive_or_reject(case, runner)
    bases = d.tensor_bases
    for name, view in d.registered.items():
        tensor = d.kv_cache_tensors[d.tensor_index(name)]
        assert view.storage_nbytes == tensor.size and view.storage_offset == 0
        assert view.max_byte() <= tensor.size
        numel = 1
        for size in view.shape:
            numel *= size
        assert numel * view.element_size == tensor.size  # .view() of the whole raw tensor
        base = bases[d.tensor_index(name)]
        for b in range(d.num_blocks):
            lo, hi = d.block_bytes(name, b).page.span()
            assert base <= lo and hi <= base + tensor.size


@settings(max_examples=60, deadline=None)
@given(gen1_cases(versions=("0.21.0",)))
def test_same_logical_block_bytes_in_mrv1_and_mrv2_0_21(case: CaseConfig) -> None:
    one, two = derive_or_reject(case, "mrv1"), derive_or_reject(case, "mrv2")
    assert one.kv_cache_tensors == two.kv_cache_tensors
    for name in one.registered:
        for b in range(one.num_blocks):
            assert merged_runs([one.block_bytes(name, b).page]) == merged_runs([two.block_bytes(name, b).page])


def test_nixl_refuses_mrv2s_logical_block_views_until_022_and_an_unsplittable_block() -> None:
    from reference.gen1 import nixl_refusal
    from suites.release_cases import gen1_cases

    def case(release: str, name: str):
        return next(c for c in gen1_cases(release) if c.name == name)

    assert "same number of blocks" in nixl_refusal(derive_gen1(case("0.21.0", "gen1-flashinfer-b128"), "mrv2"))
    assert nixl_refusal(derive_gen1(case("0.21.0", "gen1-flashinfer-b128"), "mrv1")) is None
    assert nixl_refusal(derive_gen1(case("0.22.0", "gen1-flashinfer-b128"), "mrv2")) is None
    assert "No common block size" in nixl_refusal(derive_gen1(case("0.21.0", "gen1-flex-b8"), "mrv2"))


# --- sliding windows (SLIDING_WINDOW_BLOCK_DECOUPLED, ATTENTION_PAGES_PADDED, PROMOTED_WINDOW_KEEPS_ITS_BLOCK) ---


def _window_hybrid(version: str, *, window_heads: int = 2, **kw) -> CaseConfig:
    geo = dict(backend="TRITON_ATTN", head_size=64)
    layers = (uniform_layers(2, num_kv_heads=2, **geo)
              + uniform_layers(2, start=2, kind="sliding_window", sliding_window=128, num_kv_heads=window_heads, **geo))
    return gen1(f"swa-{version}", layers, block_size=64, vllm_version=version, **kw)


def test_a_window_takes_the_configured_block_until_0_25_then_the_smallest_kernel_block() -> None:
    # Triton takes MultipleOf(16): from 0.25 a window's own block is 16 tokens, and page
    # unification scales it back by the whole ratio 64 / 16 (same heads, same page per token).
    for version, window_block in (("0.24.0", 64), ("0.25.0", 64)):
        d = derive_gen1(_window_hybrid(version))
        assert [g.spec.block_size for g in d.groups] == [64, window_block]
    from reference.gen1 import _sliding_window_block_size, gen1_spec

    for version, own in (("0.24.0", 64), ("0.25.0", 16)):
        case = _window_hybrid(version)
        window = case.layers[2]
        assert _sliding_window_block_size("TRITON_ATTN", gen1_spec(case, window, "TRITON_ATTN"), case) == own


def test_a_page_that_does_not_divide_is_refused_before_0_24_and_padded_after() -> None:
    # Full pages 64 * 2*2*64*2 = 32768 bytes, window pages of 3 heads 49152: no whole ratio.
    with pytest.raises(StartupError, match="^The page size of the layer is not divisible by the maximum page size"):
        derive_gen1(_window_hybrid("0.23.0", window_heads=3))
    d = derive_gen1(_window_hybrid("0.24.0", window_heads=3))
    full = d.registered["model.layers.0.self_attn.attn"]
    # Triton splits no 64-token block: each block strided by the padded 49,152-byte page, its 32,768 bytes first.
    assert full.shape[0] == d.num_blocks and full.stride[0] == 49152 // 2
    assert merged_runs([d.block_bytes("model.layers.0.self_attn.attn", 1).page]) == ((49152, 49152 + 32768),)


def test_a_padded_page_split_into_kernel_blocks_strides_each_by_the_whole_page_54877() -> None:
    # FlashInfer splits a 96-token block into 3 kernel blocks of 32: each kernel block is strided by
    # the padded logical page (vllm/v1/worker/gpu/attn_utils.py _reshape_attention_kv_cache, #54877),
    # so the view reaches 3 times past its tensor (the contract's view_bounds; an expectation).
    case = _window_hybrid("0.24.0", window_heads=3)  # 0.24: the window takes the configured block
    case = case.with_(block_size=96, layers=tuple(replace(l, backend="FLASHINFER") for l in case.layers))
    d = derive_gen1(case)
    padded = [n for g in d.groups for n in g.layer_names if getattr(layer_spec_of(g.spec, n), "page_size_padded", None)]
    assert padded
    view = d.registered[padded[0]]
    page = layer_spec_of(d.groups[d.group_of(padded[0])].spec, padded[0]).page_size_bytes
    ratio = d.block_ratio(d.group_of(padded[0]))
    assert ratio > 1 and view.shape[0] == d.num_blocks * ratio and view.stride[0] * 2 == page


def test_a_disabled_hybrid_manager_refuses_a_window_of_its_own_block_in_0_25_and_0_26_only() -> None:
    # 0.25/0.26 promote the 16-token window to a 16-token full spec beside 64-token ones: no
    # unified type. 0.24 (the configured block) and 0.27 (the full layers' block) start.
    for version in ("0.25.0", "0.26.0"):
        with pytest.raises(StartupError, match="^Hybrid KV cache manager is disabled but failed to convert"):
            derive_gen1(_window_hybrid(version, disable_hybrid_kv_cache_manager=True))
    for version in ("0.24.0", "0.27.0"):
        d = derive_gen1(_window_hybrid(version, disable_hybrid_kv_cache_manager=True))
        assert len(d.groups) == 1 and d.groups[0].spec.block_size == 64


# --- FlashInfer on SM10x ------------------------------------------------------------------


@pytest.mark.parametrize("requested", [None, "NHD", "HND"])
def test_flashinfer_on_sm10x_is_hnd_whatever_the_env_asks(requested) -> None:
    # The selector sets FlashInfer's required layout (HND on SM10x) as the process's override,
    # which get_kv_cache_layout() reads before VLLM_KV_CACHE_LAYOUT; off SM10x the env decides.
    layers = uniform_layers(2, **QWEN3)
    assert derive_gen1(gen1("fi-sm100", layers, block_size=64, layout=requested, capability=(10, 0))).layout == "HND"
    assert derive_gen1(gen1("fi-sm90", layers, block_size=64, layout=requested)).layout == (requested or "NHD")
    # Another backend on SM10x: no override.
    triton = uniform_layers(2, backend="TRITON_ATTN", num_kv_heads=8, head_size=128)
    assert derive_gen1(gen1("triton-sm100", triton, block_size=64, layout=requested, capability=(10, 0))).layout == (requested or "NHD")


@pytest.mark.parametrize(("version", "kernel"), [("0.23.0", 64), ("0.24.0", 128), ("0.28.0", 128)])
def test_flashinfer_trtllm_pages_on_sm100_from_024(version: str, kernel: int) -> None:
    # 0.19.1 to 0.23.0: [16, 32, 64] on every capability, so block 128 splits into 64s;
    # 0.24.0 on: 128 to 1024 too where TRT-LLM attention serves a GQA model on SM100.
    case = gen1("fi-sm100-b128", uniform_layers(2, **QWEN3), block_size=128, capability=(10, 0), vllm_version=version)
    d = derive_gen1(case, "mrv1")
    assert list(d.selected_kernel_block_sizes) == [kernel]
    # Off SM100 the base sizes: block 128 splits into 64s on every release.
    assert list(derive_gen1(case.with_(capability=(9, 0)), "mrv1").selected_kernel_block_sizes) == [64]


def test_flashinfer_mla_is_hnd_on_every_capability() -> None:
    # FlashInferMLABackend.get_required_kv_cache_layout() is "HND" unconditionally (0.19.1 to 0.28.0).
    mla = [LayerConfig(f"model.layers.{i}.self_attn.attn", kind="mla", backend="FLASHINFER_MLA", num_kv_heads=1,
                       head_size=576) for i in range(2)]
    for capability in ((9, 0), (10, 0)):
        assert derive_gen1(gen1("fi-mla", mla, block_size=64, layout="NHD", capability=capability,
                                vllm_version="0.28.0")).layout == "HND"


# --- Mamba hybrids (HYBRID_BLOCK_ALIGNMENT, MAMBA_STATE_PAGE_VIEW, HYBRID_LAYOUT_BY_SHAPE, MRV2_MAMBA) ---


def _hybrid(release: str, name: str) -> CaseConfig:
    from suites.release_cases import gen1_hybrid_cases

    return next(c for c in gen1_hybrid_cases(release) if c.name == f"gen1-{name}")


@pytest.mark.parametrize(("release", "name", "block_size"), [
    # 0.19: alignment 16 (MLA 64); 0.20 on: the backend's smallest kernel block or --block-size; 0.27 on: MLA 128.
    ("0.19.1", "mamba-fa-b32", 80), ("0.21.0", "mamba-fa-b32", 96), ("0.21.0", "mamba-flashinfer-b16", 80),
    ("0.19.1", "mamba-triton-mla-b16", 64), ("0.21.0", "mamba-triton-mla-b16", 32), ("0.26.0", "mamba-triton-mla-b16", 32),
    ("0.27.0", "mamba-triton-mla-b16", 128), ("0.28.0", "mamba-triton-mla-b16", 128),
])
def test_the_negotiation_raises_the_attention_block_per_release_and_pads_the_state(release, name, block_size) -> None:
    case = _hybrid(release, name)
    negotiated, padded = hybrid_block_size(case)
    assert negotiated == block_size
    d = derive_gen1(case, "mrv1")
    attention_page = {g.spec.page_size_bytes for g in d.groups}
    assert attention_page == {padded}, "every group, the states' too, has the one attention page"
    assert {g.spec.block_size for g in d.groups if g.spec.kind is not SpecKind.MAMBA} == {block_size}


def test_a_small_state_keeps_the_configured_block_and_still_gets_padded() -> None:
    case = _hybrid("0.24.0", "mamba-fa-b32").with_(layers=tuple(
        replace(l, mamba_shapes=((3, 8), (1, 16, 8))) if l.kind == "mamba" else l for l in _hybrid("0.24.0", "mamba-fa-b32").layers))
    assert hybrid_block_size(case) == (32, 32 * 512)


def test_states_register_as_a_list_to_0_26_and_as_one_int8_page_view_from_0_27() -> None:
    listed = derive_gen1(_hybrid("0.26.0", "mamba-fa-b32"), "mrv1").registered
    conv, ssm = listed["model.layers.1.mixer[0]"], listed["model.layers.1.mixer[1]"]
    page = 96 * 512
    assert (conv.shape, conv.stride, conv.storage_offset) == ((4, 3, 256), (page // 2, 256, 1), 0)
    assert (ssm.shape, ssm.stride, ssm.storage_offset) == ((4, 16, 64, 16), (page // 2, 1024, 16, 1), 3 * 256)
    assert "model.layers.1.mixer" not in listed
    paged = derive_gen1(_hybrid("0.27.0", "mamba-fa-b32"), "mrv2").registered["model.layers.1.mixer"]
    assert (paged.shape, paged.stride, paged.dtype) == ((4, 1, 1, page), (page, page, page, 1), "int8")


def test_a_kv_first_view_beside_states_is_restrided_block_outermost() -> None:
    # FA is KV-first to 0.22: (2, num_blocks, ...) becomes (hidden, 2 * hidden, ...) so block b is page b.
    d = derive_gen1(_hybrid("0.22.0", "mamba-fa-b32"), "mrv1")
    view = d.registered["model.layers.0.self_attn.attn"]
    hidden = 96 * 2 * 64
    assert view.shape == (2, 4, 96, 2, 64) and view.stride[:2] == (hidden, 2 * hidden)
    assert merged_runs([d.block_bytes("model.layers.0.self_attn.attn", 1).page]) == ((2 * hidden * 2, 4 * hidden * 2),)


@pytest.mark.parametrize(("release", "runner", "refuses"), [
    ("0.19.1", "mrv1", True), ("0.20.0", "mrv1", False), ("0.21.0", "mrv2", True), ("0.22.0", "mrv2", True),
    ("0.23.0", "mrv2", False),
])
def test_the_shape_heuristic_refuses_a_view_of_two_kernel_blocks(release, runner, refuses) -> None:
    case = _hybrid(release, "mamba-fa-b32").with_(num_blocks=2)  # FA splits no block: 2 kernel blocks
    if refuses:
        with pytest.raises(StartupError, match="determine"):
            derive_gen1(case, runner)
    else:
        assert derive_gen1(case, runner).num_blocks == 2


def test_mrv2_refuses_states_before_0_21() -> None:
    with pytest.raises(StartupError, match="AssertionError"):
        derive_gen1(_hybrid("0.20.0", "mamba-fa-b32"), "mrv2")
    assert derive_gen1(_hybrid("0.21.0", "mamba-fa-b32"), "mrv2").num_blocks == 4


def test_a_registered_state_names_its_layer_in_explain_and_the_summary() -> None:
    from conformance.derivation_summary import gen1_summary
    from conformance.explain import explain_gen1

    d = derive_gen1(_hybrid("0.24.0", "mamba-triton-mla-b16"))
    assert d.layer_of("model.layers.1.mixer[1]") == "model.layers.1.mixer" and d.tensor_index("model.layers.1.mixer[1]") == 0
    with pytest.raises(ConfigError):
        d.layer_of("model.layers.9.mixer[0]")
    assert "model.layers.1.mixer[1]        MAMBA2_ATTN" in explain_gen1(d)
    assert gen1_summary(d)["registered"]["model.layers.3.mixer[0]"]["backend"] == "MAMBA2_ATTN"
