"""The backend table: the single source of truth for what each attention backend declares.

Read from the target release (``vllm/v1/attention/backends/**``; see
``shared/research/vllm-specs-backends.md`` section 3.3). Each row records what the
backend's ``get_supported_kernel_block_sizes``, ``supported_kv_cache_layouts`` and
``customize_spec`` declare, plus the generation-1 (pre-0.30) ``get_kv_cache_shape`` /
``get_kv_cache_stride_order`` for the backends that had one. Capability-dependent
answers are ``Variant`` rows, applied in order.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace

from reference.errors import ConfigError
from reference.layout import KVCacheLayout
from reference.releases import TARGET_RELEASE, Gen1Layout
from reference.specs import AttentionSpec, KernelBlockSize, MultipleOf

VLLM_VERSION = TARGET_RELEASE
"""The vLLM release this table was read from: the target release."""

LBHNC, LBNHC, LHBNC, BLHNC = (
    KVCacheLayout.LBHNC,
    KVCacheLayout.LBNHC,
    KVCacheLayout.LHBNC,
    KVCacheLayout.BLHNC,
)


class Packing(str, enum.Enum):
    """How a backend arranges K and V inside the ``[B, H, N, C]`` page (``customize_spec``)."""

    KV_IN_C = "kv_in_c"
    """K then V concatenated in C per (token, head): FA, FlashInfer, Triton, Flex."""
    TWO_HEAD_SLOTS = "two_head_slots"
    """H = 2 slots (K, V), C = all heads of one token: ROCM_ATTN, B12X."""
    CPU_KV_PLANES = "cpu_kv_planes"
    """Same bytes as KV_IN_C, but read as ``[2, N, D]`` per (block, head): CPU_ATTN."""
    MLA_LATENT = "mla_latent"
    """One latent vector per token (H = 1, no V): the MLA family."""
    STATE = "state"
    """Raw recurrent state: Mamba-like backends."""


@dataclass(frozen=True)
class HeadSizes:
    """Which head sizes a backend accepts (``get_supported_head_sizes`` / ``supports_head_size``)."""

    values: tuple[int, ...] | None = None
    multiple_of: int = 1
    minimum: int = 1
    maximum: int | None = None

    def accepts(self, head_size: int) -> bool:
        if self.values is not None:
            return head_size in self.values
        if head_size % self.multiple_of or head_size < self.minimum:
            return False
        return self.maximum is None or head_size <= self.maximum

    def __str__(self) -> str:
        if self.values is not None:
            return ", ".join(map(str, self.values))
        parts = [f"multiples of {self.multiple_of}"] if self.multiple_of > 1 else []
        if self.minimum > 1:
            parts.append(f">= {self.minimum}")
        if self.maximum is not None:
            parts.append(f"<= {self.maximum}")
        return " and ".join(parts) or "any"


@dataclass(frozen=True)
class Variant:
    """A capability- or spec-dependent override of a backend's declarations."""

    capability_majors: tuple[int, ...] = ()
    """Applies only on these compute-capability majors (empty: any)."""
    requires_gqa: bool = False
    head_size: int | None = None
    """Applies only when head_size == head_size_v == this."""
    unquantized_only: bool = False
    """Applies only to unquantized caches (the kernel falls back otherwise)."""
    kernel_block_sizes: tuple[KernelBlockSize, ...] | None = None
    layouts: tuple[KVCacheLayout, ...] | None = None
    note: str = ""


_FA_GEN1 = Gen1Layout("2BNHD", (0, 1, 2, 3, 4), (0, 1, 3, 2, 4))
_FI_GEN1 = Gen1Layout("B2NHD", (0, 1, 2, 3, 4), (0, 1, 3, 2, 4))
_MLA_GEN1 = Gen1Layout("BND", (0, 1, 2), (0, 1, 2))

_DEFAULT_KV = ("auto", "float16", "bfloat16")
_FP8 = ("fp8", "fp8_e4m3")



ENCODER_ONLY_BACKENDS = frozenset({"FLASH_ATTN", "TRITON_ATTN", "FLEX_ATTENTION", "CPU_ATTN", "ROCM_ATTN"})
"""The backends whose ``supports_attn_type`` admits ``AttentionType.ENCODER_ONLY`` (read off vLLM 0.33.0)."""


def _mla_sliding_window_refusal(impl: str) -> str:
    """The dense MLA impls' constructor check (``unsupported_features = [alibi_slopes, sliding_window,
    logits_soft_cap]`` in each ``v1/attention/backends/mla/*.py``)."""
    return f"{impl} does not support one of the following: alibi_slopes, sliding_window, logits_soft_cap"

@dataclass(frozen=True)
class BackendInfo:
    """One attention backend's layout-relevant declarations (the target release's)."""

    name: str
    source: str
    kernel_block_sizes: tuple[KernelBlockSize, ...]
    layouts: tuple[KVCacheLayout, ...] | None = None
    head_sizes: HeadSizes = HeadSizes()
    kv_cache_dtypes: tuple[str, ...] = _DEFAULT_KV
    packing: Packing = Packing.KV_IN_C
    is_mla: bool = False
    is_ssm: bool = False
    variants: tuple[Variant, ...] = ()
    gen1: Gen1Layout | None = None
    require_block_multiple_of_16: bool = False
    """``customize_spec`` raises "Block size must be a multiple of 16." (ROCM_AITER_FA)."""
    returns_lse_for_decode: bool = False
    """The impl's ``can_return_lse_for_decode`` (``v1/attention/backend.py``): DCP needs it
    (``v1/worker/cp_utils.py: check_attention_cp_compatibility``). True for FLASH_ATTN,
    FLASHINFER and every MLA backend in the target release; see ``returns_lse``."""

    supports_cross_attention: bool = False
    """``supports_attn_type(AttentionType.ENCODER_DECODER)``: a backend that does not is
    never selected for a cross-attention layer (the platform's selection refuses it)."""
    runs_on: tuple[tuple[int, ...], str] | None = None
    """(capability majors, the impl constructor's refusal elsewhere): FLASH_ATTN_MLA's FA3
    MLA kernels exist on SM90 only (``fa_utils.flash_attn_supports_mla``)."""
    sliding_window_refusal: str | None = None
    """What the impl's constructor raises for a layer with a sliding window (``NotImplementedError``;
    every dense MLA impl: a ``sliding_window_mla`` layer needs DeepSeek V4's own SWA cache)."""
    required_block_sizes: tuple[int, ...] | None = None
    """The impl's constructor refuses any other ``--block-size`` (B12X: ``_B12X_SUPPORTED_PAGE_SIZES``)."""
    power_of_two_builder_blocks: bool = False
    """The metadata builder refuses a block size that is not a power of 2 (FLEX_ATTENTION:
    ``FlexAttentionMetadataBuilder._get_block_sizes``, ``flex_attn_kv_block_size``)."""
    pooled_kernel_states: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] = ()
    """For a spec storing one state per ``tokens_per_state`` > 1 tokens: the kernel pages in states
    by capability majors ((majors, states); empty majors: any other), scaled to tokens by the spec.
    GLM-5-next's ``Glm5NextIndexerBackend`` (same name as DeepSeek V3.2's, which its layer class
    picks for a pooled cache): ``index_kpool * n`` for n in DeepGEMM's paged-MQA page sizes
    (``utils/deep_gemm.py: get_paged_mqa_page_sizes``: 32 and 64, only 64 on SM120)."""

    block_stride_alignment: MultipleOf | None = None
    """What the backend's own ``customize_spec`` sets as the spec's ``block_stride_alignment`` (Step5's DSA backend:
    ``MultipleOf(8)``, its sparse prefill reading eight-token pages that must tile every block stride)."""

    pcp_without_mla: bool = False
    """``supports_pcp()`` on a backend that is not MLA: GLM-5-next's ``KpoolTailBackend`` (a
    ``DeepseekV32IndexerBackend``). Every MLA impl supports PCP (``MLAAttentionImpl.supports_pcp``);
    no other attention or state backend does."""

    @property
    def supports_encoder_only(self) -> bool:
        """``supports_attn_type(AttentionType.ENCODER_ONLY)``: a backend an ``EncoderOnlyAttention`` layer
        may be given (``ENCODER_ONLY_BACKENDS``)."""
        return self.name in ENCODER_ONLY_BACKENDS

    @property
    def supports_pcp(self) -> bool:
        """``AttentionBackend.supports_pcp`` (``get_impl_cls().supports_pcp``; the indexers say so
        themselves): what PCP needs of every layer's backend."""
        return self.is_mla or self.pcp_without_mla

    @property
    def returns_lse(self) -> bool:
        return self.returns_lse_for_decode or self.is_mla or self.name in ("FLASH_ATTN", "FLASHINFER")

    def _variant(self, spec: AttentionSpec | None, capability: tuple[int, int], gqa: bool) -> Variant | None:
        for v in self.variants:
            if v.capability_majors and capability[0] not in v.capability_majors:
                continue
            if v.requires_gqa and not gqa:
                continue
            if v.head_size is not None and (
                spec is None or spec.head_size != v.head_size or spec.head_size_v != v.head_size
            ):
                continue
            if v.unquantized_only and (spec is None or spec.kv_quant_mode != "NONE"):
                continue
            return v
        return None

    def supported_kernel_block_sizes(
        self, spec: AttentionSpec | None = None, capability: tuple[int, int] = (9, 0), gqa: bool = True
    ) -> tuple[KernelBlockSize, ...]:
        if spec is not None and spec.tokens_per_state > 1 and self.pooled_kernel_states:
            for majors, states in self.pooled_kernel_states:
                if not majors or capability[0] in majors:
                    return tuple(spec.tokens_per_state * n for n in states)
        v = self._variant(spec, capability, gqa)
        if v is not None and v.kernel_block_sizes is not None:
            return v.kernel_block_sizes
        return self.kernel_block_sizes

    def supported_layouts(self, capability: tuple[int, int] = (9, 0)) -> tuple[KVCacheLayout, ...] | None:
        for v in self.variants:
            if v.layouts is not None and (not v.capability_majors or capability[0] in v.capability_majors):
                return v.layouts
        return self.layouts


BACKENDS: dict[str, BackendInfo] = {
    b.name: b
    for b in (
        BackendInfo(
            "FLASH_ATTN",
            "v1/attention/backends/flash_attn.py",
            (MultipleOf(16),),
            head_sizes=HeadSizes(multiple_of=8, maximum=256),
            kv_cache_dtypes=_DEFAULT_KV + _FP8,
            variants=(
                Variant(
                    capability_majors=(10, 11),
                    head_size=256,
                    unquantized_only=True,
                    kernel_block_sizes=(128,),
                    note="FA4's head-256 kernel pages 128 tokens (fa_utils.FA4_HD256_PAGE_SIZE)",
                ),
            ),
            gen1=_FA_GEN1,
            supports_cross_attention=True,
        ),
        BackendInfo(
            "FLASHINFER",
            "v1/attention/backends/flashinfer.py",
            (16, 32, 64),
            head_sizes=HeadSizes(values=(64, 128, 256, 512)),
            kv_cache_dtypes=_DEFAULT_KV + _FP8 + ("fp8_e5m2", "nvfp4", "nvfp4_4over6"),
            variants=(
                Variant(
                    capability_majors=(10,),
                    requires_gqa=True,
                    kernel_block_sizes=(16, 32, 64, 128, 256, 512, 1024),
                    layouts=(LBHNC, BLHNC),
                    note="SM100 with TRT-LLM attention (GQA)",
                ),
                Variant(capability_majors=(10,), layouts=(LBHNC, BLHNC), note="SM10x"),
            ),
            gen1=_FI_GEN1,
        ),
        BackendInfo(
            "TRITON_ATTN",
            "v1/attention/backends/triton_attn.py",
            (MultipleOf(16),),
            head_sizes=HeadSizes(minimum=32),
            kv_cache_dtypes=_DEFAULT_KV
            + _FP8
            + ("fp8_e5m2", "int8_per_token_head", "fp8_per_token_head", "int4_per_token_head"),
            gen1=_FI_GEN1,
            supports_cross_attention=True,
        ),
        BackendInfo(
            "FLEX_ATTENTION",
            "v1/attention/backends/flex_attention.py",
            (MultipleOf(16),),
            layouts=(LBNHC,),
            gen1=_FA_GEN1,
            power_of_two_builder_blocks=True,
        ),
        BackendInfo(
            "CPU_ATTN",
            "v1/attention/backends/cpu_attn.py",
            (MultipleOf(32),),
            layouts=(LBHNC,),
            head_sizes=HeadSizes(values=(32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)),
            kv_cache_dtypes=_DEFAULT_KV + _FP8 + ("fp8_e5m2",),
            packing=Packing.CPU_KV_PLANES,
            supports_cross_attention=True,
        ),
        BackendInfo(
            "HPC_ATTN",
            "v1/attention/backends/hpc_attn.py",
            (64,),
            layouts=(LBNHC,),
            head_sizes=HeadSizes(values=(128,)),
            kv_cache_dtypes=("auto", "bfloat16", "fp8_e4m3"),
        ),
        BackendInfo(
            "B12X",
            "v1/attention/backends/b12x.py",
            (64, 128),
            layouts=(LBHNC, BLHNC),
            head_sizes=HeadSizes(values=(64, 128, 192, 256)),
            kv_cache_dtypes=("auto", "bfloat16") + _FP8,
            packing=Packing.TWO_HEAD_SLOTS,
            required_block_sizes=(64, 128),
        ),
        BackendInfo(
            "ROCM_ATTN",
            "v1/attention/backends/rocm_attn.py",
            (MultipleOf(16),),
            layouts=(LHBNC, LBHNC),
            head_sizes=HeadSizes(values=(32, 64, 80, 96, 128, 160, 192, 224, 256)),
            kv_cache_dtypes=_DEFAULT_KV + _FP8 + ("fp8_e5m2",),
            packing=Packing.TWO_HEAD_SLOTS,
        ),
        BackendInfo(
            "ROCM_AITER_FA",
            "v1/attention/backends/rocm_aiter_fa.py",
            (16, 32),
            layouts=(LBHNC, LHBNC),
            head_sizes=HeadSizes(values=(64, 128, 256)),
            kv_cache_dtypes=_DEFAULT_KV + _FP8 + ("fp8_e5m2",),
            require_block_multiple_of_16=True,
        ),
        BackendInfo(
            "TRITON_MLA",
            "v1/attention/backends/mla/triton_mla.py",
            (MultipleOf(16),),
            sliding_window_refusal=_mla_sliding_window_refusal("TritonMLAImpl"),
            kv_cache_dtypes=_DEFAULT_KV + _FP8,
            packing=Packing.MLA_LATENT,
            is_mla=True,
            gen1=_MLA_GEN1,
        ),
        BackendInfo(
            "FLASHMLA",
            "v1/attention/backends/mla/flashmla.py",
            (64,),
            sliding_window_refusal=_mla_sliding_window_refusal("FlashMLAImpl"),
            head_sizes=HeadSizes(values=(320, 512, 576)),
            kv_cache_dtypes=_DEFAULT_KV + _FP8,
            packing=Packing.MLA_LATENT,
            is_mla=True,
            gen1=_MLA_GEN1,
        ),
        BackendInfo(
            "FLASH_ATTN_MLA",
            "v1/attention/backends/mla/flashattn_mla.py",
            (MultipleOf(16),),
            sliding_window_refusal=_mla_sliding_window_refusal("FlashAttnMLAImpl"),
            head_sizes=HeadSizes(values=(320, 512, 576)),
            packing=Packing.MLA_LATENT,
            is_mla=True,
            gen1=_MLA_GEN1,
            runs_on=((9,), "FlashAttnMLA is not supported on this device"),
        ),
        BackendInfo(
            "CUTLASS_MLA",
            "v1/attention/backends/mla/cutlass_mla.py",
            (128,),
            sliding_window_refusal=_mla_sliding_window_refusal("CutlassMLAImpl"),
            head_sizes=HeadSizes(values=(320, 512, 576)),
            kv_cache_dtypes=_DEFAULT_KV + _FP8,
            packing=Packing.MLA_LATENT,
            is_mla=True,
            gen1=_MLA_GEN1,
        ),
        BackendInfo(
            "FLASHINFER_MLA",
            "v1/attention/backends/mla/flashinfer_mla.py",
            (32, 64),
            sliding_window_refusal=_mla_sliding_window_refusal("FlashInferMLAImpl"),
            head_sizes=HeadSizes(values=(320, 512, 576)),
            kv_cache_dtypes=_DEFAULT_KV + _FP8,
            packing=Packing.MLA_LATENT,
            is_mla=True,
            gen1=_MLA_GEN1,
        ),
        BackendInfo(
            "TOKENSPEED_MLA",
            "v1/attention/backends/mla/tokenspeed_mla.py",
            (32, 64),
            sliding_window_refusal=_mla_sliding_window_refusal("TokenspeedMLAImpl"),
            head_sizes=HeadSizes(values=(320, 512, 576)),
            kv_cache_dtypes=_FP8,
            packing=Packing.MLA_LATENT,
            is_mla=True,
        ),
        BackendInfo(
            "DEEPSEEK_V32_INDEXER",
            "v1/attention/backends/mla/indexer.py",
            (64,),
            pooled_kernel_states=(((12,), (64,)), ((), (32, 64))),
            head_sizes=HeadSizes(values=(32, 64, 128)),
            kv_cache_dtypes=("auto",),
            packing=Packing.MLA_LATENT,
            is_mla=True,
        ),
        BackendInfo(
            "MINIMAX_M3_SPARSE_INDEXER",
            "models/minimax_m3/common/indexer.py",
            (128,),
            head_sizes=HeadSizes(values=(128,)),
            kv_cache_dtypes=("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"),
            packing=Packing.MLA_LATENT,
            is_mla=True,
        ),
        BackendInfo(
            # MiniMaxM3SparseAttention's main cache: its Triton block-sparse backend, picked by the layer itself
            # (select_main_backend_and_impl_cls) everywhere but SM100 (MSA) and ROCm (AITER sparse PA).
            "MINIMAX_M3_SPARSE",
            "models/minimax_m3/common/sparse_attention.py",
            (128,),
            head_sizes=HeadSizes(values=(128,)),
            kv_cache_dtypes=("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"),
        ),
        BackendInfo(
            # Qwen4ExpQSAAttention's main cache: a FlashAttention subclass that takes any 16-token multiple (it reads
            # the manager's pages itself), picked by the layer.
            "QWEN4_EXP_QSA_TRITON",
            "models/qwen4_exp/nvidia/qsa.py",
            (MultipleOf(16),),
            head_sizes=HeadSizes(multiple_of=8, maximum=256),
            kv_cache_dtypes=("auto", "bfloat16", "fp8", "fp8_e4m3"),
        ),
        BackendInfo(
            # Step5's DSA layers (models/step5/nvidia/sparse_attention.py Step5DSAAttentionBackend): a FlashAttention
            # subclass named by Step5Attention, head size 192 only, its region summaries packed beside the KV in each
            # block (BLNHC only), eight-token pages tiling every block stride.
            "STEP5_DSA",
            "models/step5/nvidia/sparse_attention.py",
            (MultipleOf(16),),
            layouts=(KVCacheLayout.BLNHC,),
            head_sizes=HeadSizes(values=(192,)),
            kv_cache_dtypes=("auto", "bfloat16", "fp8", "fp8_e4m3"),
            block_stride_alignment=MultipleOf(8),
        ),
        # Step5's CSA side caches name their own backends (a metadata builder each, no kernel, any block).
        BackendInfo(
            "STEP5_CSA_SUMMARY",
            "models/step5/nvidia/sparse_summary_cache.py",
            (MultipleOf(1),),
        ),
        BackendInfo(
            "STEP5_CSA_TAIL_RING",
            "models/step5/nvidia/csa_tail_ring.py",
            (MultipleOf(1),),
        ),
        BackendInfo(
            "KPOOL_TAIL",
            "v1/attention/backends/mla/indexer.py",
            (MultipleOf(1),),
            layouts=(BLHNC,),
            kv_cache_dtypes=("auto",),
            pcp_without_mla=True,
        ),
        BackendInfo(
            # Qwen4-exp's QSAStateBackend: key-only side caches packed beside the main pages.
            "QWEN4_EXP_EXP_QSA_STATE",
            "models/qwen4_exp/common/qsa_cache.py",
            (MultipleOf(1),),
            layouts=(KVCacheLayout.BLNHC, BLHNC),
            kv_cache_dtypes=("auto", "bfloat16", "fp8", "fp8_e4m3"),
        ),
        # DeepSeek V4's FlashMLA path (models/deepseek_v4/): the compressed attention cache's backend, the SWA
        # cache's (DeepseekSparseSWAFlashMLABackend, named as the default it subclasses), the C4 indexer's and the
        # compressors'. Each is named by its layer (no selection): the head sizes are what they declare.
        BackendInfo(
            "FLASHMLA_SPARSE_DSV4",
            "models/deepseek_v4/sparse_mla.py",
            (256,),
            head_sizes=HeadSizes(values=(512,)),
            kv_cache_dtypes=("auto", "fp8_ds_mla", "fp8"),
            packing=Packing.MLA_LATENT,
            is_mla=True,
        ),
        BackendInfo(
            "DEEPSEEK_SPARSE_SWA",
            "v1/attention/backends/mla/sparse_swa.py",
            (MultipleOf(32),),
            head_sizes=HeadSizes(values=(512,)),
            packing=Packing.MLA_LATENT,
        ),
        BackendInfo(
            "DEEPSEEK_V4_INDEXER",
            "v1/attention/backends/mla/indexer.py",
            (256,),
            layouts=(BLHNC, KVCacheLayout.BLNHC),
            head_sizes=HeadSizes(values=(32, 64, 128)),
            packing=Packing.MLA_LATENT,
            pcp_without_mla=True,
        ),
        # DeepSeek V4.1's FlashMLA path (models/deepseek_v41/): its compressed attention cache's backend and its
        # indexer keys' (DeepseekV41IndexerBackend); 64-token kernel blocks on SM90, 128 elsewhere. Its SWA cache and
        # compressor rings run on backends of V4's names and declarations (DEEPSEEK_SPARSE_SWA, CompressorBackend).
        BackendInfo(
            "FLASHMLA_SPARSE_DSV41",
            "models/deepseek_v41/sparse_mla.py",
            (128,),
            head_sizes=HeadSizes(values=(512,)),
            kv_cache_dtypes=("auto", "fp8_ds_mla", "fp8"),
            packing=Packing.MLA_LATENT,
            is_mla=True,
            variants=(Variant(capability_majors=(9,), kernel_block_sizes=(64,), note="SM90"),),
        ),
        BackendInfo(
            "DEEPSEEK_V41_INDEXER",
            "v1/attention/backends/mla/indexer.py",
            (128,),
            layouts=(BLHNC, KVCacheLayout.BLNHC),
            head_sizes=HeadSizes(values=(32, 64, 128)),
            packing=Packing.MLA_LATENT,
            pcp_without_mla=True,
            variants=(Variant(capability_majors=(9,), kernel_block_sizes=(64,), note="SM90"),),
        ),
        BackendInfo(
            "CompressorBackend",
            "models/deepseek_v4/compressor.py",
            (MultipleOf(1),),
            head_sizes=HeadSizes(values=(512, 1024)),
            packing=Packing.MLA_LATENT,
        ),
        BackendInfo(
            "CACHE_ONLY_ATTN",
            "model_executor/models/extract_hidden_states.py",
            (MultipleOf(1),),
            kv_cache_dtypes=_DEFAULT_KV,
        ),
        # Inkling's short-conv state (InklingConvState.get_attn_backend): a builder only, no kernel, any block.
        BackendInfo(
            "INKLING_SCONV_SWA",
            "models/inkling/nvidia/sconv_swa_attn.py",
            (MultipleOf(1),),
            kv_cache_dtypes=_DEFAULT_KV,
        ),
        BackendInfo(
            "CPU_MLA",
            "v1/attention/backends/mla/cpu_mla.py",
            (16,),
            sliding_window_refusal="CPU MLA does not support alibi_slopes / sliding_window / logits_soft_cap.",
            head_sizes=HeadSizes(values=(576,)),
            kv_cache_dtypes=("auto",),
            packing=Packing.MLA_LATENT,
            is_mla=True,
        ),
        *(
            BackendInfo(
                name,
                "v1/attention/backends/" + module,
                (MultipleOf(1),),
                packing=Packing.STATE,
                is_ssm=True,
            )
            for name, module in (
                ("MAMBA2_ATTN", "mamba2_attn.py"),
                ("MAMBA1_ATTN", "mamba1_attn.py"),
                ("GDN_ATTN", "gdn_attn.py"),
                ("SHORT_CONV_ATTN", "short_conv_attn.py"),
                ("LINEAR_ATTN", "linear_attn.py"),
                # Qwen4-exp's PLE short conv names its own backend (Qwen4ExpPLELayer.get_attn_backend): a
                # ShortConvAttentionBackend subclass with its own metadata builder (n-gram context), the same page.
                ("PLE_SHORT_CONV_ATTN", "short_conv_attn.py"),
            )
        ),
        # Kimi K3's KDA layers name their own backend (KimiK3DeltaAttention.get_attn_backend): a
        # GDNAttentionBackend subclass with its own metadata builder, the same state page.
        BackendInfo(
            "KIMI_K3_KDA",
            "models/kimi_k3/nvidia/kda_metadata.py",
            (MultipleOf(1),),
            packing=Packing.STATE,
            is_ssm=True,
        ),
    )
}


def get_backend(name: str) -> BackendInfo:
    """Look a backend up by vLLM enum name; one-line error naming the valid ones."""
    try:
        return BACKENDS[name]
    except KeyError:
        raise ConfigError(
            f"unknown attention backend {name!r}; expected one of {', '.join(sorted(BACKENDS))}"
        ) from None


def customize_spec(backend: BackendInfo, spec: AttentionSpec) -> AttentionSpec:
    """The backend's ``customize_spec`` packing hook (the target release's)."""
    if backend.require_block_multiple_of_16 and spec.block_size != 1 and spec.block_size % 16:
        raise ConfigError(
            f"block size {spec.block_size} is not a multiple of 16, which {backend.name} requires"
        )
    es = spec.element_size
    if backend.packing is Packing.TWO_HEAD_SLOTS:
        if spec.head_size != spec.head_size_v:
            raise ConfigError(
                f"{backend.name} needs head_size == head_size_v, got {spec.head_size} and {spec.head_size_v}"
            )
        return replace(spec, num_head_slots=2, state_content_bytes=spec.num_kv_heads * spec.head_size * es)
    # vLLM's hooks read the spec's kv_quant_mode, not the --kv-cache-dtype string: a layer whose own spec sets no
    # quantization mode (Inkling's attention) keeps plain pages in any cache dtype.
    if spec.kv_quant_mode.startswith("NVFP4") and not backend.is_mla:
        # K heads first, then V heads; each slot holds fp4 data plus one fp8 scale per 16.
        return replace(
            spec,
            num_head_slots=2 * spec.num_kv_heads,
            state_content_bytes=spec.head_size // 2 + spec.head_size // 16,
        )
    if spec.kv_quant_mode.endswith("_PER_TOKEN_HEAD"):
        # Triton and MLACommon: one inline fp32 scale after each side (MLA has no V).
        hk, hv = spec.head_size, spec.head_size_v
        if spec.kv_quant_mode == "INT4_PER_TOKEN_HEAD":
            hk, hv = hk // 2, hv // 2
        return replace(spec, state_content_bytes=(hk + hv) * es + 8)
    if backend.block_stride_alignment is not None:
        return replace(spec, block_stride_alignment=backend.block_stride_alignment)
    return spec


def customize_attention_spec(
    backend: BackendInfo, spec: AttentionSpec, capability: tuple[int, int] = (9, 0)
) -> AttentionSpec:
    """``vllm/v1/worker/utils.customize_attention_spec``: packing plus stride alignment.

    When a backend supports only fixed int kernel sizes, the block stride must be a
    multiple of the largest one's page (``MultipleOf(max(sizes))``).
    """
    spec = customize_spec(backend, spec)
    sizes = backend.supported_kernel_block_sizes(spec, capability, gqa=_is_gqa(spec))
    if spec.block_stride_alignment is None and sizes and all(isinstance(s, int) for s in sizes):
        spec = replace(spec, block_stride_alignment=MultipleOf(max(sizes)))  # type: ignore[type-var]
    return spec


def _is_gqa(spec: AttentionSpec) -> bool:
    # The case does not carry query heads; every real model this table targets with
    # FlashInfer on SM100 is GQA, which is what the variant checks.
    return not spec.kind.is_mla


def check_backend_accepts(backend: BackendInfo, spec: AttentionSpec, layer: str) -> None:
    """The selector's validation: head size, cache dtype, MLA-ness (``validate_configuration``)."""
    if backend.is_ssm:
        raise ConfigError(f"layer {layer!r}: {backend.name} is a state-space backend, not an attention backend")
    if backend.is_mla != spec.kind.is_mla:
        want = "an MLA" if spec.kind.is_mla else "a non-MLA"
        raise ConfigError(f"layer {layer!r}: {backend.name} is not {want} backend")
    if not backend.head_sizes.accepts(spec.head_size):
        raise ConfigError(
            f"layer {layer!r}: head size {spec.head_size} is not supported by {backend.name}; "
            f"supported: {backend.head_sizes}"
        )
    if spec.cache_dtype not in backend.kv_cache_dtypes:
        raise ConfigError(
            f"layer {layer!r}: cache dtype {spec.cache_dtype!r} is not supported by {backend.name}; "
            f"supported: {', '.join(backend.kv_cache_dtypes)}"
        )
