"""The reference-vs-vLLM case list: small models that exercise every layout decision.

Each case is a reference ``CaseConfig``; ``test_reference_vs_vllm`` derives it with the
reference and observes it with vLLM's own code, then diffs them field by field.
Keep cases small (few layers, few blocks): every one runs on CPU in milliseconds.
"""

from __future__ import annotations

from reference.config import CaseConfig, LayerConfig, uniform_layers

LAYOUTS = ("LBNHC", "LBHNC", "LHBNC", "BLHNC", "BLNHC", "BHLNC")


def gqa(n: int = 2, backend: str = "FLASH_ATTN", *, start: int = 0, **kw) -> tuple[LayerConfig, ...]:
    kw.setdefault("num_kv_heads", 2)
    kw.setdefault("head_size", 128)
    return uniform_layers(n, backend=backend, start=start, **kw)


def mla(n: int = 2, backend: str = "FLASHMLA", **kw) -> tuple[LayerConfig, ...]:
    return uniform_layers(n, kind="mla", backend=backend, head_size=576, **kw)


def draft(backend: str, index: int = 2, **kw) -> LayerConfig:
    kw.setdefault("num_kv_heads", 2)
    kw.setdefault("head_size", 128)
    return LayerConfig(name=f"draft.model.layers.{index}.self_attn.attn", backend=backend, is_draft=True, **kw)


def swa(n: int, backend: str, *, start: int, window: int = 512, **kw) -> tuple[LayerConfig, ...]:
    return gqa(n, backend, start=start, kind="sliding_window", sliding_window=window, **kw)


def mamba(index: int, backend: str = "MAMBA2_ATTN", shapes=((2, 64), (4, 32, 16))) -> LayerConfig:
    return LayerConfig(name=f"model.layers.{index}.mixer", kind="mamba", backend=backend, mamba_shapes=shapes)


def _case(name: str, layers, **kw) -> CaseConfig:
    kw.setdefault("num_blocks", 8)
    return CaseConfig(name=name, layers=tuple(layers), **kw)


def _dense() -> list[CaseConfig]:
    out = []
    # Every backend x block size x layout combination would be hundreds of cases;
    # walk the layouts round-robin so each backend/block size meets several of them.
    dense = [
        ("FLASH_ATTN", (16, 32, 64, 128, 256)),
        ("TRITON_ATTN", (16, 32, 64, 128, 256)),
        ("FLASHINFER", (16, 32, 64, 128, 256)),
        ("FLEX_ATTENTION", (16, 64, 256)),
    ]
    i = 0
    for backend, sizes in dense:
        for bs in sizes:
            layout = LAYOUTS[i % len(LAYOUTS)]
            i += 1
            out.append(_case(f"{backend.lower()}-bs{bs}-{layout}", gqa(3, backend), block_size=bs, layout=layout))
        out.append(_case(f"{backend.lower()}-bs{sizes[-1]}-default", gqa(2, backend), block_size=sizes[-1]))
    out.append(_case("flex_attention-bs64-LBNHC", gqa(2, "FLEX_ATTENTION"), block_size=64, layout="LBNHC"))
    out += [
        _case("flash_attn-bs32-legacy-HND", gqa(2), block_size=32, layout="HND"),
        _case("triton_attn-bs16-legacy-NHD", gqa(2, "TRITON_ATTN"), block_size=16, layout="NHD"),
        # FlashInfer at 128 splits into 64-token kernel blocks (layer-compact layouts only).
        _case("flashinfer-bs128-kernel64", gqa(4, "FLASHINFER"), block_size=128),
        _case("flashinfer-bs128-LBHNC-kernel64", gqa(2, "FLASHINFER"), block_size=128, layout="LBHNC"),
        _case("flashinfer-bs256-fp16", gqa(2, "FLASHINFER"), block_size=256, model_dtype="float16"),
        _case("flash_attn-mixed-heads-LBNHC", gqa(1) + gqa(1, start=1, num_kv_heads=4), block_size=16),
        _case("flash_attn-mixed-heads-BLHNC", gqa(1) + gqa(1, start=1, num_kv_heads=4), block_size=16, layout="BLHNC"),
        _case("flash_attn-mixed-heads-LHBNC", gqa(1) + gqa(1, start=1, num_kv_heads=4), block_size=16, layout="LHBNC"),
        _case("flash_attn-memory-budget", gqa(2), block_size=16, num_blocks=None, kv_cache_memory_bytes=3_000_000),
        _case("flash_attn-bs8-no-kernel-size", gqa(2), block_size=8),
        # get_kv_cache_configs reserves the null block: an override of one block leaves
        # no memory, but a budget a little over one block still passes that check.
        _case("flash_attn-one-block", gqa(2), block_size=16, num_blocks=1),
        _case("flash_attn-memory-one-block", gqa(2), block_size=16, num_blocks=None, kv_cache_memory_bytes=2 * 16384 + 100),
        _case("flash_attn-memory-too-small", gqa(2), block_size=16, num_blocks=None, kv_cache_memory_bytes=1000),
        _case("flex+flash_attn", gqa(1, "FLEX_ATTENTION") + gqa(1, start=1), block_size=32),
        # "auto" on a bf16 model and an explicit "bfloat16" store the same spec in vLLM
        # (FullAttentionSpec has dtype and kv_quant_mode, no cache-dtype string).
        _case("flash_attn-auto-and-bfloat16-cache-dtypes", gqa(1) + gqa(1, start=1, cache_dtype="bfloat16"), block_size=16),
        _case("flex-LBHNC-refused", gqa(2, "FLEX_ATTENTION"), block_size=32, layout="LBHNC"),
    ]
    return out


def _quantized() -> list[CaseConfig]:
    return [
        _case("flashinfer-fp8-bs128", gqa(2, "FLASHINFER", cache_dtype="fp8"), block_size=128),
        _case("flashinfer-fp8_e5m2-bs32-LBHNC", gqa(2, "FLASHINFER", cache_dtype="fp8_e5m2"), block_size=32, layout="LBHNC"),
        _case("flash_attn-fp8_e4m3-bs64", gqa(2, cache_dtype="fp8_e4m3"), block_size=64),
        _case("triton-fp8-bs32-BLNHC", gqa(2, "TRITON_ATTN", cache_dtype="fp8"), block_size=32, layout="BLNHC"),
        _case("triton-int8_per_token_head-bs32", gqa(2, "TRITON_ATTN", cache_dtype="int8_per_token_head"), block_size=32),
        _case("triton-int4_per_token_head-bs16", gqa(2, "TRITON_ATTN", cache_dtype="int4_per_token_head"), block_size=16),
        _case("flashinfer-nvfp4-sm100-bs64", gqa(2, "FLASHINFER", cache_dtype="nvfp4"), block_size=64, capability=(10, 0)),
        _case("flashmla-fp8-bs64", mla(2, cache_dtype="fp8"), block_size=64),
    ]


def _sm100() -> list[CaseConfig]:
    return [
        _case("flashinfer-sm100-bs128", gqa(2, "FLASHINFER"), block_size=128, capability=(10, 0)),
        _case("flashinfer-sm100-bs256-BLHNC", gqa(2, "FLASHINFER"), block_size=256, layout="BLHNC", capability=(10, 0)),
        _case("flashinfer-sm100-bs1024-LBHNC", gqa(2, "FLASHINFER"), block_size=1024, num_blocks=2, capability=(10, 0)),
        _case("flashinfer-sm100-bs16", gqa(2, "FLASHINFER"), block_size=16, capability=(10, 0)),
        _case("flashinfer-sm100-LBNHC-refused", gqa(2, "FLASHINFER"), block_size=64, layout="LBNHC", capability=(10, 0)),
        _case("flashinfer+flash_attn-sm100", gqa(1, "FLASHINFER") + gqa(1, start=1), block_size=64, capability=(10, 0)),
        # FA4's hd256 kernel (head 256 on SM10x/11x) takes 128-token pages only.
        _case("flash_attn-hd256-sm100-bs256", gqa(2, head_size=256), block_size=256, capability=(10, 0)),
        _case("flash_attn-hd256-sm90-bs256", gqa(2, head_size=256), block_size=256),
    ]


def _mla() -> list[CaseConfig]:
    out = []
    for backend in ("FLASHMLA", "TRITON_MLA", "FLASHINFER_MLA"):
        for bs in (64, 128):
            out.append(_case(f"{backend.lower()}-bs{bs}", mla(3, backend), block_size=bs))
    out += [
        _case("cutlass_mla-bs128", mla(2, "CUTLASS_MLA"), block_size=128),
        _case("flash_attn_mla-bs64", mla(2, "FLASH_ATTN_MLA"), block_size=64),
        _case("flashmla-bs16-refused", mla(2), block_size=16),
        _case("flashmla-bs256-LBHNC", mla(2), block_size=256, layout="LBHNC"),
        _case("triton_mla-bs64-BLHNC", mla(2, "TRITON_MLA"), block_size=64, layout="BLHNC"),
        # MLA target + GQA Eagle draft: one UniformTypeKVCacheSpecs group.
        _case("flashmla+fa-draft-bs64", mla(3) + (draft("FLASH_ATTN", 3),), block_size=64),
        _case("flashmla+flashinfer-draft-bs128", mla(3) + (draft("FLASHINFER", 3),), block_size=128),
        _case("triton_mla+fa-draft-bs128", mla(3, "TRITON_MLA") + (draft("FLASH_ATTN", 3),), block_size=128),
        _case("flashinfer_mla+flashinfer-draft-bs64", mla(2, "FLASHINFER_MLA") + (draft("FLASHINFER"),), block_size=64),
        _case("flashmla+fa-draft-bs64-BLHNC", mla(2) + (draft("FLASH_ATTN"),), block_size=64, layout="BLHNC"),
        _case("cutlass_mla+flashinfer-draft-refused", mla(2, "CUTLASS_MLA") + (draft("FLASHINFER"),), block_size=128),
        # An MLA page cannot be padded and the SW page is no multiple of it: vLLM falls back
        # to allocating the sliding-window layers as full attention (one UniformType group).
        _case("flashmla+swa-full-allocation-fallback", mla(2) + swa(1, "FLASH_ATTN", start=2, num_kv_heads=8), block_size=64),
        # MRv1 and MRv2 differ in which backend a draft inherits (--attention-backend).
        # MRv1 auto-selects the draft's backend (FLASHINFER: kernel 64 for the group);
        # MRv2 keeps --attention-backend (TRITON_ATTN: no split).
        _case(
            "gqa+draft-attention-backend-bs128",
            gqa(2) + (draft("FLASHINFER"),),
            block_size=128,
            attention_backend="TRITON_ATTN",
        ),
        _case(
            "gqa+speculative-attention-backend-bs128",
            gqa(2, "FLASHINFER") + (draft("FLASHINFER"),),
            block_size=128,
            speculative_attention_backend="FLASH_ATTN",
        ),
    ]
    return out


def _packed_failures() -> list[CaseConfig]:
    return [
        _case("flashinfer-bs128-BLHNC-cannot-split", gqa(2, "FLASHINFER"), block_size=128, layout="BLHNC"),
        _case("flashinfer-bs128-BLNHC-cannot-split", gqa(2, "FLASHINFER"), block_size=128, layout="BLNHC"),
        _case("flashinfer-bs128-LHBNC-not-dense", gqa(2, "FLASHINFER"), block_size=128, layout="LHBNC"),
        _case("flashmla-bs128-BLHNC-cannot-split", mla(2), block_size=128, layout="BLHNC"),
        _case("flashmla+fa-draft-bs128-BLHNC", mla(2) + (draft("FLASH_ATTN"),), block_size=128, layout="BLHNC"),
        _case("flashinfer-1layer-bs128-BLHNC", gqa(1, "FLASHINFER"), block_size=128, layout="BLHNC"),
    ]


def _hybrid() -> list[CaseConfig]:
    return [
        _case("swa-flash_attn-bs16", gqa(2) + swa(2, "FLASH_ATTN", start=2), block_size=16),
        _case("swa-flash_attn-bs64-LBHNC", gqa(1) + swa(3, "FLASH_ATTN", start=1, window=128), block_size=64, layout="LBHNC"),
        _case("swa-triton-bs32-interleaved", gqa(1, "TRITON_ATTN") + swa(1, "TRITON_ATTN", start=1) + gqa(1, "TRITON_ATTN", start=2) + swa(1, "TRITON_ATTN", start=3), block_size=32),
        _case("swa-flashinfer-bs128", gqa(2, "FLASHINFER") + swa(2, "FLASHINFER", start=2), block_size=128),
        _case("swa-flashinfer-bs64", gqa(2, "FLASHINFER") + swa(2, "FLASHINFER", start=2), block_size=64),
        _case("swa-flashinfer-bs256-LBHNC", gqa(1, "FLASHINFER") + swa(1, "FLASHINFER", start=1), block_size=256, layout="LBHNC"),
        _case("swa-flash_attn-bs8", gqa(1) + swa(1, "FLASH_ATTN", start=1), block_size=8),
        _case("mamba-flash_attn-bs64", gqa(1) + (mamba(1),), block_size=64),
        _case("mamba-flashinfer-bs128", gqa(2, "FLASHINFER") + (mamba(2), mamba(3)), block_size=128),
        _case("mamba-triton-bs16-mamba_block", gqa(1, "TRITON_ATTN") + (mamba(1),), block_size=16, mamba_block_size=256),
        _case("mamba-fa-bs32-LBHNC", gqa(1) + (mamba(1, shapes=((3, 64), (4, 16, 16))),), block_size=32, layout="LBHNC"),
        _case("mamba-only", (mamba(0), mamba(1)), block_size=64),
        # MambaSpec.mamba_type is part of vLLM's spec equality.
        _case("mamba-mixed-types", (mamba(0, "MAMBA2_ATTN"), mamba(1, "MAMBA1_ATTN")), block_size=64),
    ]


def _packing() -> list[CaseConfig]:
    return [
        _case("b12x-bs64", gqa(2, "B12X"), block_size=64),
        _case("b12x-bs128-BLHNC", gqa(2, "B12X"), block_size=128, layout="BLHNC"),
        _case("b12x-bs256-kernel128", gqa(2, "B12X"), block_size=256),
        _case("rocm_attn-bs16", gqa(2, "ROCM_ATTN"), block_size=16),
        _case("rocm_attn-bs32-LBHNC", gqa(2, "ROCM_ATTN", cache_dtype="fp8"), block_size=32, layout="LBHNC"),
        _case("rocm_aiter_fa-bs64-kernel32", gqa(2, "ROCM_AITER_FA"), block_size=64),
        _case("cpu_attn-bs32", gqa(2, "CPU_ATTN"), block_size=32),
        _case("cpu_attn-bs128", gqa(2, "CPU_ATTN", head_size=64), block_size=128),
        _case("cpu_attn-bs16-refused", gqa(2, "CPU_ATTN"), block_size=16),
        _case("cpu_attn+flex-refused", gqa(1, "CPU_ATTN") + gqa(1, "FLEX_ATTENTION", start=1), block_size=32),
        _case("hpc_attn-bs128-kernel64", gqa(2, "HPC_ATTN"), block_size=128),
        _case("rocm_attn+flash_attn-LHBNC", gqa(1, "ROCM_ATTN") + gqa(1, start=1), block_size=16),
    ]


def _connectors() -> list[CaseConfig]:
    return [
        _case("nixl-flash_attn-bs16", gqa(2), block_size=16, connector="nixl"),
        _case("nixl-flashmla-bs64", mla(2), block_size=64, connector="nixl"),
        _case("mooncake-flashinfer-bs128", gqa(2, "FLASHINFER"), block_size=128, connector="mooncake"),
    ]


def _pcp() -> list[CaseConfig]:
    """Prefill context parallelism: MRv1 refuses it, MRv2 runs it for MLA models only."""
    return [
        _case("pcp2-flashmla-bs64", mla(2), block_size=64, prefill_context_parallel_size=2),
        _case("pcp2-triton_mla-bs128", mla(2, "TRITON_MLA"), block_size=128, prefill_context_parallel_size=2),
        _case("pcp2-tp2-dcp4-flashmla-refused", mla(2), block_size=64, tensor_parallel_size=2,
              decode_context_parallel_size=4, prefill_context_parallel_size=2),
        _case("pcp2-gqa-refused", gqa(2), prefill_context_parallel_size=2),
        _case("pcp2-flashmla+fa-draft-refused", mla(2) + (draft("FLASH_ATTN"),), block_size=64,
              prefill_context_parallel_size=2),
        # An MLA model with a GQA layer: the selector finds no backend supporting PCP for it.
        _case("pcp2-flashmla+gqa-refused", mla(2) + gqa(1, start=2), block_size=64, prefill_context_parallel_size=2),
    ]


CASES: list[CaseConfig] = [
    *_pcp(),
    *_dense(),
    *_quantized(),
    *_sm100(),
    *_mla(),
    *_packed_failures(),
    *_hybrid(),
    *_packing(),
    *_connectors(),
]

_names = [c.name for c in CASES]
assert len(set(_names)) == len(_names), sorted({n for n in _names if _names.count(n) > 1})


def admission_cases() -> list[CaseConfig]:
    """Cases whose pool holds a max_model_len request, for the engine-core planning path."""
    picked = [
        "flash_attn-bs16-LBNHC",
        "flashinfer-bs128-kernel64",
        "flashinfer-sm100-bs128",
        "flashmla+flashinfer-draft-bs128",
        "swa-flash_attn-bs16",
        "mamba-flashinfer-bs128",
        "b12x-bs128-BLHNC",
        "flash_attn-memory-budget",
    ]
    by_name = {c.name: c for c in CASES}
    out = []
    for name in picked:
        case = by_name[name]
        if case.num_blocks is not None:
            case = case.with_(num_blocks=256)
        out.append(case.with_(name=f"{name}-admitted", max_model_len=512))
    return out
