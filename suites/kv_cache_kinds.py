"""Every KV cache spec class and every layer class with its own ``get_kv_cache_spec`` that vLLM
0.33.0 ships, and how kvconform covers each: the case kind that expresses it, a named case,
whether the drivers run it through vLLM's own class, and whether it gets request schedules.

One table, rendered into ``docs/kv-cache-kinds.md`` (``python -m suites.kv_cache_kinds --write``;
``tests/reference/test_kv_cache_kinds.py`` holds the page to it and every row to the cases it
names). ``tests/vllm/test_kv_cache_kinds_vs_vllm.py`` reads the installed vLLM's source and
fails on a class this table does not list, or lists and vLLM no longer has.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

INVENTORY_RELEASE = "0.33.0"
"""The vLLM release the table was read from."""

DOC_PATH = Path(__file__).resolve().parents[1] / "docs" / "kv-cache-kinds.md"

DRIVEN = ("yes", "stand-in", "no")


@dataclass(frozen=True)
class Coverage:
    """One vLLM class and what kvconform does with it."""

    path: str
    """Where vLLM defines it, relative to the ``vllm`` package (``models/deepseek_v4/attention.py``)."""
    name: str
    """The class name (several families reuse one, per platform directory)."""
    role: str
    """``spec`` (a ``KVCacheSpec`` class of ``v1/kv_cache_interface.py``) or ``layer`` (defines
    ``get_kv_cache_spec``)."""
    reports: str
    """For a layer: the spec class(es) its ``get_kv_cache_spec`` builds; for a spec: what it holds."""
    case_kind: str | None = None
    """The ``LayerConfig.kind`` that expresses it (None: no case can yet)."""
    named_case: str | None = None
    """A named case with a layer of that kind (``suites/named_cases.py``)."""
    driven: str = "no"
    """``yes``: vLLM's own class runs; ``stand-in``: vLLM's own method on an object carrying only
    what it reads; ``no``: not driven (``why`` says what and why)."""
    schedules: bool = False
    """Request schedules run through both runners' block tables for its groups."""
    why: str = ""
    """What is missing, or how it is driven, in one line."""


_NOT_YET = "not modeled yet (issue 24)"


def _spec(name: str, holds: str, kind: str | None = None, case: str | None = None, driven: str = "no",
          schedules: bool = False, why: str = "") -> Coverage:
    return Coverage("v1/kv_cache_interface.py", name, "spec", holds, kind, case, driven, schedules, why)


def _layer(path: str, name: str, reports: str, kind: str | None = None, case: str | None = None,
           driven: str = "no", schedules: bool = False, why: str = "") -> Coverage:
    return Coverage(path, name, "layer", reports, kind, case, driven, schedules, why)


_DSV41 = ("family deepseek_v41 on DeepSeek V4's kinds: vLLM's own DeepseekV4Attention, as its decoder layer builds it "
          "(the class _select_dsv4_attn_cls picks for FlashMLA, which V4.1 cases name: by default SM100 picks mega "
          "attention's NVFP4 cache, not modeled), from vLLM's DeepseekV41Config for the case's layers, registering the "
          "caches its role gives it (kv source, index source, or a layer owning only its SWA cache). Records per "
          "capability: V4's 584 bytes in 576-byte pages on SM90, the MXFP8 528 in 512-byte pages on SM10x "
          "(_use_v41_mxfp8_kv_record). fp8_ds_mla only; layers that read another's compressed cache (consumers) own only "
          "their SWA cache, as sliding-window layers do")
_ROCM = ("not driven: the drivers stand in for an NVIDIA GPU only (a CUDA platform of a chosen capability, "
         "shims.fake_capability) and the reference knows no ROCm backend (ROCM_ATTN's family, AITER's), so a ROCm build's "
         "selection and kernels have nothing to run on or be judged by; a ROCm platform stand-in is not built yet "
         "(issue 24)")
_HISPARSE = ("HiSparse runs only on CUDA (VllmConfig refuses it elsewhere: 'HiSparse currently requires NVIDIA CUDA'), "
             "on MRv2 with the hybrid manager; v1/hisparse/layout.py derives these specs from the sparse-MLA and indexer "
             "specs and replaces the grouping with its own packing, which the reference does not model; " + _NOT_YET)

INVENTORY: tuple[Coverage, ...] = (
    # --- the spec classes ---------------------------------------------------------------------
    _spec("KVCacheSpec", "the base class: block size, DCP sharding, stride alignment",
          why="abstract: every case's spec is one of its subclasses"),
    _spec("AttentionSpec", "the [B, H, N, C] page of attention layers",
          why="abstract: every attention case's spec is one of its subclasses"),
    _spec("FullAttentionSpec", "full attention (and promoted local layers, non_causal Prefix-LM)", "full",
          "dense-fa-b128-lbhnc", "yes", True),
    _spec("MLAAttentionSpec", "one latent vector per token", "mla", "mla-flashmla-b64", "yes", True,
          "topk_buffer_width left at its default; DeepSeek V4's fields (alignment, state_content_bytes, "
          "tokens_per_state) through kinds dsv4_attention and dsv4_indexer (dsv4-caches-b256)"),
    _spec("SlidingWindowSpec", "a sliding window's blocks", "sliding_window", "swa-hybrid-padded", "yes", True),
    _spec("SlidingWindowMLASpec", "MLA with a sliding window", "sliding_window_mla", "swa-mla-refused-b64", "yes",
          False, "every dense MLA impl refuses a sliding window (the refusal is the verdict); its users are DeepSeek "
          "V4's SWA cache and compressor states (kinds dsv4_swa, dsv4_compressor_state: dsv4-caches-b256, with "
          "schedules)"),
    _spec("ChunkedLocalAttentionSpec", "Llama-4 chunked local attention", "chunked_local", "chunked-local-hybrid-b64",
          "yes", True),
    _spec("SinkFullAttentionSpec", "full attention with static sink tokens", "sink_full", "sink-fa-b16", "yes", True),
    _spec("CrossAttentionSpec", "encoder-decoder cross attention", "cross", "enc-dec-cross-b16", "yes", True,
          "schedules give each request an encoder input (its blocks allocated once, every row sized for the "
          "2048-token encoder budget too); the cross builder's own slots at a request's first step are judged. "
          "Under DCP not modeled yet (its slot mapping is not DCP-aware)"),
    _spec("EncoderOnlyAttentionSpec", "encoder-only attention (no paged KV)", "encoder_only", "bert-encoder-only-b16",
          "yes", False,
          "no KV cache: the runners build this spec themselves for the layers' metadata builders (MRv1's "
          "may_add_encoder_only_layers_to_kv_cache_config, MRv2's EncoderOnlyModelState), whose block size is "
          "checked; no block table to schedule. Also beside KV-cache layers: decoder attention "
          "(encoder-only-beside-kv-b16) and ColQwen3.5's Gated DeltaNet layers (colqwen-like-gdn-encoder-only), "
          "the builders over the block size engine start-up left"),
    _spec("RSWASpec", "R-SWA: prefill kept, a window of generated tokens", "rswa", "rswa-flashinfer-b128-k64",
          "yes", True),
    _spec("HiddenStateCacheSpec", "extract_hidden_states' cache-only layers", "hidden_state",
          "hidden-states-swa-hybrid", "yes", True),
    _spec("CircularBufferSpec", "one ring block per request, no slot mapping", "circular_buffer", "kpool-tail-b64",
          "yes", True, "built by GLM-5-next's Glm5NextTailCache, Qwen4-exp's QSAKeyStateCache (kind qsa_key_state) and "
          "Step5's Step5CSATailRing (kind step5_csa_ring) and DeepSeek V4.1's compressor (kind dsv4_compressor_state with "
          "family deepseek_v41). The rings count no drafts (the drivers build layers without a speculative config)"),
    _spec("MambaSpec", "state-space layers' state (one block per request, or per mamba_block_size)", "mamba",
          "mamba-hybrid", "yes", True),
    _spec("HiSparseHotSpec", "HiSparse's per-request hot cache (no views, no slot mapping)", why=_HISPARSE),
    _spec("HiSparseResidentSpec", "HiSparse's reclaimable resident pages (no views)", why=_HISPARSE),
    _spec("UniformTypeKVCacheSpecs", "several same-type specs in one group", "full", "tiny-mixed-heads-lbnhc",
          "yes", True, "a group spec: arises from mixed layers (also rswa-after-full's reverse order)"),
    # --- the generic layers (model_executor/layers) --------------------------------------------
    _layer("model_executor/layers/attention_layer_base.py", "AttentionLayerBase", "nothing (abstract)",
           why="abstract: every layer below subclasses it"),
    _layer("model_executor/layers/attention/attention.py", "Attention", "FullAttentionSpec, SlidingWindowSpec",
           "full", "dense-fa-b128-lbhnc", "yes", True, "sliding_window too (swa-hybrid-padded)"),
    _layer("model_executor/layers/attention/mla_attention.py", "MLAAttention", "MLAAttentionSpec, SlidingWindowMLASpec",
           "mla", "mla-gqa-draft-b64", "yes", True, "built with no indexer and dense backends (the sparse-MLA backends' "
           "own spec fields, topk_buffer_width: " + _NOT_YET + "); the indexer cache is its own layer below"),
    _layer("model_executor/layers/attention/chunked_local_attention.py", "ChunkedLocalAttention",
           "ChunkedLocalAttentionSpec", "chunked_local", "chunked-local-hma-off", "yes", True),
    _layer("model_executor/layers/attention/cross_attention.py", "CrossAttention", "CrossAttentionSpec", "cross",
           "enc-dec-cross-b16", "yes", True, "its CrossAttentionBuilder.build and _get_cross_slot_mapping run on each "
           "step (the backend's own build stood in): the encoder K/V slots, from the runner's own encoder seq lens"),
    _layer("model_executor/layers/attention/encoder_only_attention.py", "EncoderOnlyAttention", "None (no KV cache)",
           "encoder_only", "bert-encoder-only-b16", "yes", False,
           "an attention-free model: no group, no tensor, one block of nothing; FlashInfer and the MLA backends "
           "refuse the attention type (bert-encoder-only-flashinfer-refused)"),
    _layer("model_executor/layers/attention/static_sink_attention.py", "StaticSinkAttention", "SinkFullAttentionSpec",
           "sink_full", "sink-fa-b16", "yes", True),
    _layer("model_executor/layers/attention/rswa_attention.py", "RSWAAttention", "RSWASpec", "rswa",
           "rswa-flashinfer-b128-k64", "yes", True),
    _layer("model_executor/layers/attention/prefill_prefix_lm_attention.py", "PrefillPrefixLMAttention",
           "FullAttentionSpec (non_causal)", "prefix_lm", "prefix-lm-fa-b16", "yes", True),
    _layer("model_executor/layers/mamba/abstract.py", "MambaBase", "MambaSpec", "mamba", "mamba-hybrid", "stand-in",
           True, "MambaBase's own get_kv_cache_spec and binding on a subclass carrying the case's state shapes"),
    _layer("model_executor/layers/mamba/mamba_mixer2.py", "MambaMixer2", "MambaSpec (via MambaBase)", "mamba",
           "mamba2-mixer-hybrid", "yes", True, "mixer kind mamba2: built as Nemotron-H builds it; also at TP 2 with one "
           "group (mamba2-mixer-tp2-one-group: the replicated head-shard groups)"),
    _layer("model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py", "QwenGatedDeltaNetAttention",
           "MambaSpec (via GatedDeltaNetAttention)", "mamba", "qwen3-next-gdn-hybrid", "yes", True,
           "mixer kind gated_delta_net: built from a Qwen3NextConfig carrying the mixer's geometry"),
    _layer("model_executor/models/deepseek_v2.py", "DeepseekV32IndexerCache", "MLAAttentionSpec (indexer role)",
           "mla_indexer", "dsv32-indexer-b64", "yes", True,
           "DeepSeek V3.2's sparse-MLA indexer K cache, on its own DEEPSEEK_V32_INDEXER backend; "
           "also the zoo's deepseek-v3.2"),
    _layer("model_executor/models/extract_hidden_states.py", "CacheOnlyAttentionLayer", "HiddenStateCacheSpec",
           "hidden_state", "hidden-states-dense-b16", "yes", True,
           "built as a target layer (the extract_hidden_states proposer is not driven)"),
    _layer("model_executor/models/whisper_causal.py", "WhisperCausalAttentionWithBlockPooling",
           "FullAttentionSpec (tokens_per_state < 1)",
           why="block pooling: tokens_per_state = Fraction(1, block_pool_size), so a block of B tokens holds B x "
           "block_pool_size states, a window is counted in pooled units, and its own builder expands the slot mappings "
           "and block tables it hands the kernel; the reference's page, kernel-block and slot arithmetic is integral; "
           + _NOT_YET),
    _layer("v1/attention/backends/mla/sparse_swa.py", "DeepseekV4SWACache", "SlidingWindowMLASpec", "dsv4_swa",
           "dsv4-caches-b256", "yes", True,
           "built as DeepseekV4FlashMLAAttention builds it: 584-byte fp8_ds_mla records in 64-token blocks of its own, "
           "on the class's swa_backend_cls; V4.1's attention builds it in 32-token blocks, with MRv2's bounded replay "
           "(kept out of prefix caching; expectation dsv41-bounded-swa-replay-on-mrv2-only) and on SM10x whole-record "
           "block strides (dsv41-mxfp8-sm100-b128)"),
    # --- the model families of vllm/models -------------------------------------------------------
    _layer("models/deepseek_v4/attention.py", "DeepseekV4Attention", "MLAAttentionSpec (one record per compress ratio)",
           "dsv4_attention", "dsv4-caches-b256", "stand-in", True,
           "its own get_kv_cache_spec and get_attn_backend (DeepseekV4FlashMLAAttention, FLASHMLA_SPARSE_DSV4) on an "
           "instance carrying only what they read (compress ratio, head size, the cache dtype vLLM's "
           "_resolve_dsv4_kv_cache_dtype gives the class): constructing the layer needs the checkpoint's whole config "
           "and CUDA events. fp8_ds_mla only (the FlashInfer path's plain bf16 rows are not modeled)"),
    _layer("models/deepseek_v4/attention.py", "DeepseekV4IndexerCache", "MLAAttentionSpec (4 tokens per state)",
           "dsv4_indexer", "dsv4-caches-b256", "yes", True,
           "the C4 layers' index keys on DEEPSEEK_V4_INDEXER (256-token kernel blocks, block-outermost layouts only); "
           "its builder refuses DCP (dsv4-dcp2-refused)"),
    _layer("models/deepseek_v4/compressor.py", "CompressorStateCache", "SlidingWindowMLASpec (fp32 states)",
           "dsv4_compressor_state", "dsv4-caches-b256", "yes", True,
           "4-token blocks and a window of 8 for ratio 4, 8-token blocks and a window of 128 for ratio 128, on "
           "CompressorBackend"),
    _layer("models/deepseek_v41/attention.py", "DeepseekV4Attention", "MLAAttentionSpec (kv sources; None otherwise)",
           "dsv4_attention", "dsv41-caches-b64", "yes", True,
           "a kv source's compressed cache, one record per compress ratio (1 or 2) on FLASHMLA_SPARSE_DSV41 (64-token "
           "kernel blocks on SM90, 128 elsewhere). " + _DSV41),
    _layer("models/deepseek_v41/attention.py", "DeepseekV4IndexerCache", "MLAAttentionSpec (tokens_per_state = ratio)",
           "dsv4_indexer", "dsv41-caches-b64", "yes", True,
           "a kv and index source's keys (132 bytes a state at its ratio) on DEEPSEEK_V41_INDEXER, in its attention's page "
           "alignment (the sparse-logits path's block-stride alignment is off by default and not modeled)"),
    _layer("models/deepseek_v41/compressor.py", "CompressorStateCache", "CircularBufferSpec", "dsv4_compressor_state",
           "dsv41-caches-b64", "yes", True,
           "a ratio-2 kv source's ring of fp32 [kv, score] rows: max(8, the next power of two of drafts + 2) rows; MRv1 "
           "computes a slot mapping for it anyway (expectation mrv1-dsv41-compressor-ring-slot-mapping-reads-past-row)"),
    _layer("models/dots3_note/nvidia/model.py", "Dots3NotePaddedMLAAttention", "MLAAttentionSpec (via MLAAttention)",
           why="dots3's sparse MLA on its Dots3NotePaddedSparseBackend, its spec's head size replaced by the physical "
           "head size of NOTE's sliding-window rows; it is built inside Dots3NoteFullAttention (a DeepseekV2MLAAttention "
           "with its indexer), which takes the checkpoint's whole config; " + _NOT_YET),
    _layer("models/glm5next/common/attention.py", "Glm5NextIndexerCache",
           "MLAAttentionSpec (via DeepseekV32IndexerCache, tokens_per_state = index_kpool)", "mla_indexer",
           "glm5next-caches-b128", "yes", True,
           "kind mla_indexer with index_kpool: one 132-byte state per kpool tokens; its Glm5NextIndexerBackend "
           "(named DEEPSEEK_V32_INDEXER) takes 32- or 64-state kernel pages (only 64 on SM120)"),
    _layer("models/glm5next/common/attention.py", "Glm5NextTailCache", "CircularBufferSpec", "circular_buffer",
           "kpool-tail-b64", "yes", True, "GLM-5-next's kpool tail ring on its own KPOOL_TAIL backend (BLHNC only); "
           "MRv1 computes a slot mapping for it anyway (expectation mrv1-ring-slot-mapping-reads-past-row)"),
    _layer("models/glm5next/common/kda.py", "Glm5NextLinearAttention", "MambaSpec (KDA state)", "mamba",
           "glm5next-kda-hybrid", "yes", True, "mixer kind glm5next_kda: built from a Glm5NextTextConfig; a float16 "
           "recurrent state is refused as vLLM refuses it (kda-fp16-state-refused)"),
    _layer("models/inkling/amd/attention.py", "InklingAttention", "FullAttentionSpec, SlidingWindowSpec",
           why="the ROCm build of Inkling's attention (its NVIDIA class below is driven; the same get_kv_cache_spec); " + _ROCM),
    _layer("models/inkling/amd/sconv_swa_attn.py", "InklingConvState", "SlidingWindowSpec",
           why="the ROCm build of Inkling's short-conv state (its NVIDIA class below is driven; the same spec); " + _ROCM),
    _layer("models/inkling/nvidia/attention.py", "InklingAttention", "FullAttentionSpec, SlidingWindowSpec", "full",
           "inkling-sconv-b16", "yes", True,
           "kind full or sliding_window with family inkling: built as InklingDecoderLayer builds it, wired to its "
           "short-conv state, on FlashAttention (the class names it); a local layer's window at --block-size (no "
           "block of its own, unlike the generic Attention). Its spec sets no kv_quant_mode: a quantized cache keeps plain "
           "pages, no scales (inkling-sconv-fp8-b16)"),
    _layer("models/inkling/nvidia/sconv_swa_attn.py", "InklingConvState", "SlidingWindowSpec", "inkling_conv_state",
           "inkling-sconv-b16", "yes", True,
           "the decoder layer's short-conv state: K, V and two hidden chunks per KV head packed into a power of two, "
           "its window and block the conv kernel's, on its INKLING_SCONV_SWA builder; a float16 model is refused as "
           "its constructor asserts (inkling-sconv-fp16-refused); with --disable-hybrid-kv-cache-manager, promoted to full "
           "attention, as vLLM refuses it: two windows in one group (inkling-hma-off-windows-refused) or its builder's "
           "assertion (inkling-hma-off-builder-refused)"),
    _layer("models/kimi_k3/amd/kda.py", "KimiK3DeltaAttention", "MambaSpec (KDA state)",
           why="the ROCm build of Kimi K3's KDA layer (its NVIDIA class below is driven); " + _ROCM),
    _layer("models/kimi_k3/nvidia/kda.py", "KimiK3DeltaAttention", "MambaSpec (KDA state)", "mamba",
           "kimi-k3-kda-hybrid", "yes", True, "mixer kind kimi_k3_kda: built from a KimiLinearConfig, on its own "
           "KIMI_K3_KDA backend"),
    _layer("models/kimi_k3/nvidia/mla.py", "MultiHeadLatentAttention", "MLAAttentionSpec", "mla",
           "kimi-k3-mla-own-class-b64", "yes", True,
           "kind mla with family kimi_k3: Kimi K3's own latent attention (registered as ...self_attn, its backend "
           "selected by the layer); also the zoo's kimi-k3; it refuses prefill context parallelism "
           "(kimi-k3-mla-pcp2-refused)"),
    _layer("models/minimax_m3/amd/model.py", "MiniMaxM3SparseAttention", "FullAttentionSpec",
           why="the ROCm build of MiniMax M3's sparse attention (AITER sparse PA; its NVIDIA class below is driven); " + _ROCM),
    _layer("models/minimax_m3/common/indexer.py", "MiniMaxM3IndexerCache", "MLAAttentionSpec (indexer)",
           "minimax_indexer", "minimax-m3-indexer-b128", "yes", True,
           "MiniMax M3's key-only lightning-indexer cache (bf16, or fp8 e4m3) on its own MINIMAX_M3_SPARSE_INDEXER "
           "backend (128-token kernel pages), its dtype --attention-config indexer_kv_dtype; built by its owner "
           "MiniMaxM3SparseAttention (minimax-m3-sparse-own-class-b128) or alone beside a generic Attention "
           "(minimax-m3-indexer-b128)"),
    _layer("models/minimax_m3/nvidia/model.py", "MiniMaxM3SparseAttention", "FullAttentionSpec", "full",
           "minimax-m3-sparse-own-class-b128", "yes", True,
           "kind full with family minimax_m3: MiniMax M3's sparse layer, which picks its own MINIMAX_M3_SPARSE Triton "
           "backend (128-token kernel blocks) and registers its indexer's key cache first; also the zoo's minimax-m3. "
           "SM100's MSA backend is not modeled (the layer picks it only where current_platform.is_cuda()); an fp8 "
           "index cache is unsupported on CPU (the indexer asks for CUDA fp8)"),
    _layer("models/qwen4_exp/amd/qsa.py", "Qwen4ExpQSAAttention", "FullAttentionSpec",
           why="the ROCm build of Qwen4-exp's QSA attention (its NVIDIA class below is driven); " + _ROCM),
    _layer("models/qwen4_exp/common/qsa_cache.py", "QSAKeyStateCache", "CircularBufferSpec", "qsa_key_state",
           "qwen4-qsa-caches-b64", "yes", True,
           "Qwen4-exp's QSA compressor ring (compress_ratio raw bf16 keys, drafts rounded up to whole groups) on its "
           "QWEN4_EXP_EXP_QSA_STATE backend; MRv1 computes a slot mapping for it anyway "
           "(expectation mrv1-qsa-ring-slot-mapping-reads-past-row)"),
    _layer("models/qwen4_exp/common/qsa_cache.py", "QSACompressedKeyCache", "MLAAttentionSpec (tokens_per_state)",
           "qsa_compressed_key", "qwen4-qsa-caches-b64", "yes", True,
           "one compressed bf16 key per compress_ratio tokens; a ratio not dividing the block is refused by its "
           "constructor (qwen4-qsa-ratio-refused-b16)"),
    _layer("models/qwen4_exp/nvidia/ple_layer.py", "Qwen4ExpPLELayer", "MambaSpec (via MambaBase)", "mamba",
           "qwen4-exp-gdn-ple-b64", "yes", True,
           "mixer kind qwen4_exp_ple beside gated_delta_net (a Qwen4-exp model's two state layouts): built as "
           "Qwen4ExpDecoderLayer builds it ({prefix}.ple) from a Qwen4ExpTextConfig carrying both geometries, on its "
           "own PLE_SHORT_CONV_ATTN backend; one conv state of (ple_conv_kernel_size - 1) x ngram_size inputs over "
           "hidden_size x hc_count channels, whole on every TP rank (tp_replicated: qwen4-exp-gdn-ple-tp2). The block-size "
           "negotiation asks Qwen4ExpForCausalLM.get_mamba_specs_from_config and takes the larger page"),
    _layer("models/qwen4_exp/nvidia/qsa.py", "Qwen4ExpQSAAttention", "FullAttentionSpec", "full",
           "qwen4-qsa-own-class-b64", "yes", True,
           "kind full with family qwen4_exp: Qwen4-exp's QSA layer, which picks its own QWEN4_EXP_QSA_TRITON backend "
           "(16-token multiples) and builds its indexer's raw-key ring and compressed keys first; its refusals (BF16 "
           "only, bf16/fp8 main cache, no context parallelism) are predicted (qwen4-qsa-own-class-fp16-refused). Its "
           "impl's FlashAttention availability check is answered as a GPU would (the compiled kernel cannot load on CPU)"),
    _layer("models/step5/nvidia/csa_tail_ring.py", "Step5CSATailRing", "CircularBufferSpec", "step5_csa_ring",
           "step5-dsa-b64", "yes", True,
           "Step5's ring of the open CSA region's raw indexer rows, built by its DSA layer (kind full with family step5: "
           "Step5Attention as Step5DecoderLayer builds a full-attention layer of a sparse checkpoint, vLLM's Attention "
           "on its STEP5_DSA backend: head size 192, BLNHC only, 8-token pages tiling the block stride) after its "
           "main cache: one main KV page of 1 KiB rows at the main block size, a 1 KiB stride alignment; fewer than 7 "
           "rows are refused ('increase --block-size': step5-dsa-fp8-ring-refused). The layer's constructor and impl "
           "refusals (SM90/SM100/SM103, head size, no DCP, bf16 or E4M3 caches, bf16 activations, the KV connector) are "
           "predicted (step5-dsa-head128-refused); MRv1 refuses a Step5 model outright "
           "(VllmConfig._get_v1_model_runner_unsupported_features), so its schedules are MRv2's"),
    _layer("models/step5/nvidia/sparse_summary_cache.py", "Step5SparseSummaryCacheLayer", "FullAttentionSpec",
           "step5_summary", "step5-dsa-b64", "yes", True,
           "Step5's CSA region summaries, built by its DSA layer right after its main cache: one 256-byte FP8 summary "
           "per 8 tokens (tokens_per_state 8, uint8, no V) at --block-size, in its DSA layer's group (packed beside "
           "the main pages in each block); a block size 8 does not divide is refused"),
)


def _cell(text: str | None) -> str:
    return (text or "").replace("|", "\\|")


def render() -> str:
    """The Markdown page: one table of specs, one of layers, and the counts."""
    driven = [c for c in INVENTORY if c.driven != "no"]
    lines = [
        "# KV cache kinds: what vLLM 0.33.0 ships and what kvconform drives",
        "",
        f"Generated from `suites/kv_cache_kinds.py` (`python -m suites.kv_cache_kinds --write`), read off vLLM "
        f"{INVENTORY_RELEASE}. `tests/vllm/test_kv_cache_kinds_vs_vllm.py` fails on a class of the installed vLLM "
        "that is not listed here. *Driven*: `yes` runs vLLM's own class (layers built as the model builds them, on "
        "the meta device), `stand-in` runs vLLM's own method on an object carrying only what it reads, `no` is not "
        "driven. *Schedules*: seeded request schedules through both runners' block tables.",
        "",
        f"{len(driven)} of {len(INVENTORY)} classes are driven.",
        "",
    ]
    for role, title in (("spec", "Spec classes (`vllm/v1/kv_cache_interface.py`)"),
                        ("layer", "Layer classes with their own `get_kv_cache_spec`")):
        lines += [f"## {title}", "", "| class | where | reports | case kind | named case | driven | schedules | notes |",
                  "|---|---|---|---|---|---|---|---|"]
        for c in INVENTORY:
            if c.role != role:
                continue
            lines.append(
                f"| `{c.name}` | `{c.path}` | {_cell(c.reports)} | {f'`{c.case_kind}`' if c.case_kind else ''} | "
                f"{f'`{c.named_case}`' if c.named_case else ''} | {c.driven} | {'yes' if c.schedules else 'no'} | {_cell(c.why)} |"
            )
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--write"]:
        DOC_PATH.write_text(render() + "\n")
        print(f"wrote {DOC_PATH}")
        return 0
    if args:
        print(f"usage: python -m suites.kv_cache_kinds [--write]; got {' '.join(args)!r}", file=sys.stderr)
        return 4
    print(render())
    return 0


if __name__ == "__main__":  # pragma: no cover - the regeneration command
    raise SystemExit(main())


__all__ = ["Coverage", "DOC_PATH", "DRIVEN", "INVENTORY", "INVENTORY_RELEASE", "render"]
