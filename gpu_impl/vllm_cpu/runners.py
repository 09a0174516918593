"""Each model runner's own KV-cache initialisation, driven on a CPU-only machine.

``build_layers`` and ``runner_instance`` build what a loaded model leaves behind (the
case's layers in ``static_forward_context``, the drafter or speculator) for ``planning``
to run the runner's own ``get_kv_cache_spec`` and ``initialize_kv_cache`` (MRv1 ``gpu_model_runner.py``,
MRv2 ``gpu/model_runner.py``), down to ``register_kv_caches``. Runners are ``__new__``
stand-ins carrying the attributes those methods read, as vLLM's own unit tests build
them (the constructors need CUDA). Attention layers are real vLLM layers from their own
constructors; MLA and state layers are real classes with the attributes their spec and
binding read; drafts are built under each runner's own draft config, so a draft's
backend is observed, never supplied. Hardware stand-ins are in ``shims``; the KV cache is
allocated on ``meta``. Nothing here imports the reference beyond the case description.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
from types import SimpleNamespace
from typing import Any, Iterator

from gpu_impl.vllm_cpu import shims
from reference.config import DSV4_KINDS, dsv41_prefix

MAX_NUM_REQS = 4
"""The runners' ``max_num_reqs`` (``--max-num-seqs``): sizes block tables and builder scratch."""
MAX_NUM_TOKENS = 256
"""``max_num_batched_tokens``: sizes the slot-mapping buffers."""
MLA_ROPE_DIM = 64
"""An MLA case's head size is ``kv_lora_rank + rope``; the rope part, as DeepSeek-V3's."""
MLA_NOPE_DIM = 128
"""DeepSeek-V3's non-rope query/key and value head dims (the builders read them)."""
Q_HEADS_PER_KV_HEAD = 4
"""A case has no query-head count; every driver (and the model-config stand-in) uses 4."""


class RunnerUnavailable(Exception):
    """This runner's own code cannot be built for the case on CPU (the reason says why)."""


# --- the config each runner's draft path builds --------------------------------------------


@dataclasses.dataclass(frozen=True)
class _DraftBase:
    """The three sub-configs ``_create_draft_vllm_config`` / ``apply_draft_overrides``
    read and replace (``dataclasses.replace`` of a whole VllmConfig re-validates the
    model config, which this driver replaces by a stand-in)."""

    attention_config: Any = None
    cache_config: Any = None
    kernel_config: Any = None

    @classmethod
    def of(cls, vc) -> "_DraftBase":
        return cls(vc.attention_config, vc.cache_config, vc.kernel_config)


def _speculative_stand_in(case) -> SimpleNamespace:
    """The ``SpeculativeConfig`` fields the draft-config builders read (parsed as vLLM parses them)."""
    from vllm.config.speculative import SpeculativeConfig

    parse = getattr(SpeculativeConfig, "_parse_attention_backend", None)
    if parse is None:  # releases before the draft's own --attention-backend (0.19)
        if case.speculative_attention_backend is not None:
            raise RunnerUnavailable("this vLLM's SpeculativeConfig takes no attention backend for the draft")
        backend = None
    else:
        backend = parse(case.speculative_attention_backend)
    return SimpleNamespace(attention_backend=backend, moe_backend=None, kv_cache_dtype=None, enforce_eager=True)


def draft_sub_configs(case, runner: str, vc) -> _DraftBase:
    """The attention / cache / kernel config a runner's draft path loads the draft under."""
    base = _DraftBase.of(vc)
    spec = _speculative_stand_in(case)
    if runner == "mrv1":
        from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

        proposer = SimpleNamespace(speculative_config=spec, vllm_config=base)
        return SpecDecodeBaseProposer._create_draft_vllm_config(proposer)
    from vllm.config.speculative import SpeculativeConfig

    if hasattr(SpeculativeConfig, "apply_draft_overrides"):  # 0.31 on
        return SpeculativeConfig.apply_draft_overrides(spec, base)
    return _eagle_loader_draft_config(spec, base, vc)


@dataclasses.dataclass(frozen=True)
class _EagleLoaderBase(_DraftBase):
    """What 0.30's ``load_eagle_model`` reads of the VllmConfig besides the three sub-configs."""

    load_config: Any = None
    speculative_config: Any = None


class _DraftModelRequested(Exception):
    """``get_model`` was reached: the config the draft would be built under is known."""


def _eagle_loader_draft_config(spec: SimpleNamespace, base: _DraftBase, vc) -> _DraftBase:
    """MRv2 before 0.31 (no ``SpeculativeConfig.apply_draft_overrides``): its own
    ``gpu/spec_decode/eagle/utils.py: load_eagle_model`` overlays the speculative config on
    the VllmConfig, then calls ``get_model``; it is run up to that call, whose
    ``vllm_config`` is the draft's (no model is built: there are no weights here)."""
    from unittest import mock

    import vllm.v1.worker.gpu.spec_decode.eagle.utils as eagle_utils

    requested: dict[str, Any] = {}

    def get_model(*, vllm_config, **_kwargs):
        requested["vllm_config"] = vllm_config
        raise _DraftModelRequested

    speculative = SimpleNamespace(**vars(spec), draft_model_config=None)
    stand_in = _EagleLoaderBase(base.attention_config, base.cache_config, base.kernel_config, vc.load_config,
                                speculative)
    with mock.patch.object(eagle_utils, "get_model", get_model), shims.single_pipeline_stage():
        try:
            eagle_utils.load_eagle_model(None, stand_in)
        except _DraftModelRequested:
            pass
    if "vllm_config" not in requested:
        raise RunnerUnavailable("MRv2's load_eagle_model returned without building a draft model")
    seen = requested["vllm_config"]
    return _DraftBase(seen.attention_config, seen.cache_config, seen.kernel_config)


@contextlib.contextmanager
def _sub_configs(vc, subs: _DraftBase) -> Iterator[None]:
    """``vc`` carries ``subs``' sub-configs while the layers under them are built."""
    saved = _DraftBase.of(vc)
    names = [f.name for f in dataclasses.fields(_DraftBase)]
    for name in names:
        object.__setattr__(vc, name, getattr(subs, name))
    try:
        yield
    finally:
        for name in names:
            object.__setattr__(vc, name, getattr(saved, name))


# --- the model's layers ------------------------------------------------------------------------


def _torch_dtype(name: str):
    import torch

    return {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "half": torch.float16,
            "float16": torch.float16, "float": torch.float32, "float32": torch.float32}[name]


@contextlib.contextmanager
def _constructing(layer) -> Iterator[None]:
    """While a layer's constructor selects its backend: the platform's auto-selection
    answers the case's declared backend (vLLM caches selections per selector config,
    and the declared answer differs per layer)."""
    from vllm.v1.attention.selector import _cached_get_attn_backend

    with shims.declared_autoselection(layer.backend):
        _cached_get_attn_backend.cache_clear()
        yield


_IMPORT_FAILURES: dict[str, str] = {}
"""Modules that failed to import in this process, with why. A failed import leaves the package's
other submodules in ``sys.modules``, so a second attempt can succeed without the part that failed
(seen on 0.30.0 without torchvision): every later case gets the first answer."""


def _own_layer_class(layer, module: str, name: str):
    """A kind's own vLLM layer class, imported when a case has that kind: a vLLM without it (an
    older release, or a venv missing what the module imports, e.g. torchvision) makes only the
    cases with that kind unsupported, with the reason, not the whole driver."""
    if module not in _IMPORT_FAILURES:
        try:
            return getattr(importlib.import_module(module), name)
        except Exception as exc:  # noqa: BLE001 - any failure to import is "this vLLM cannot build it"
            _IMPORT_FAILURES[module] = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
    raise RunnerUnavailable(f"layer {layer.name!r}: kind {layer.kind!r} is built as {module}.{name}, "
                            f"which does not import here ({_IMPORT_FAILURES[module]})")


def _build_layer(layer, cache_config, vc):
    """One layer of the case, registered in ``static_forward_context`` under its name."""
    from torch import nn

    kind = layer.kind
    heads = Q_HEADS_PER_KV_HEAD * layer.num_kv_heads
    fc = vc.compilation_config.static_forward_context
    layer_cache = dataclasses.replace(cache_config, cache_dtype=layer.cache_dtype)
    if kind == "full" and layer.family == "minimax_m3":
        return _minimax_m3_sparse_attention(layer, layer_cache, vc)
    if kind == "full" and layer.family == "qwen4_exp":
        return _qwen4_exp_qsa_attention(layer, vc)
    if layer.family == "inkling":
        return _inkling_attention(layer, vc)
    if kind == "full" and layer.family == "step5":
        return _step5_dsa_attention(layer, layer_cache, vc)
    if layer.family == "deepseek_v41":
        return _deepseek_v41_attention(layer, vc)
    if kind in ("full", "sliding_window", "chunked_local", "cross", "sink_full", "rswa", "prefix_lm", "encoder_only"):
        from vllm.model_executor.layers.attention.attention import Attention

        common = dict(num_kv_heads=layer.num_kv_heads, cache_config=layer_cache, prefix=layer.name)
        scale = layer.head_size**-0.5
        with _constructing(layer):
            if kind == "chunked_local":
                from vllm.model_executor.layers.attention.chunked_local_attention import ChunkedLocalAttention

                return ChunkedLocalAttention(heads, layer.head_size, scale, layer.attention_chunk_size, **common)
            if kind == "cross":
                from vllm.model_executor.layers.attention.cross_attention import CrossAttention

                return CrossAttention(heads, layer.head_size, scale, **common)
            if kind == "encoder_only":
                from vllm.model_executor.layers.attention.encoder_only_attention import EncoderOnlyAttention

                return EncoderOnlyAttention(heads, layer.head_size, scale, **common)
            if kind == "sink_full":
                from vllm.model_executor.layers.attention.static_sink_attention import StaticSinkAttention

                return StaticSinkAttention(heads, layer.head_size, scale, layer.sink_len, **common)
            if kind == "rswa":
                RSWAAttention = _own_layer_class(layer, "vllm.model_executor.layers.attention.rswa_attention", "RSWAAttention")
                return RSWAAttention(heads, layer.head_size, scale, rswa_window=layer.rswa_window, **common)
            if kind == "prefix_lm":
                PrefillPrefixLMAttention = _own_layer_class(
                    layer, "vllm.model_executor.layers.attention.prefill_prefix_lm_attention", "PrefillPrefixLMAttention")
                return PrefillPrefixLMAttention(heads, layer.head_size, scale, **common)
            extra = {}
            if layer.head_size_v is not None and layer.head_size_v != layer.head_size:
                extra["head_size_v"] = layer.head_size_v
            return Attention(
                heads,
                layer.head_size,
                scale,
                per_layer_sliding_window=layer.sliding_window if kind == "sliding_window" else None,
                **common,
                **extra,
            )
    if kind == "mla" and layer.family == "kimi_k3":
        # Query heads are not part of the case (the latent cache has one head): 4 per TP rank, a count
        # the class's per-rank split (it asserts num_heads % tp == 0) accepts at any TP size.
        return _kimi_k3_mla(layer, layer_cache, Q_HEADS_PER_KV_HEAD * vc.parallel_config.tensor_parallel_size)
    if kind in ("mla", "sliding_window_mla"):
        from vllm.model_executor.layers.attention.mla_attention import MLAAttention

        with _constructing(layer):
            return MLAAttention(
                heads,
                layer.head_size**-0.5,
                qk_nope_head_dim=MLA_NOPE_DIM,
                qk_rope_head_dim=MLA_ROPE_DIM,
                v_head_dim=MLA_NOPE_DIM,
                q_lora_rank=None,
                kv_lora_rank=layer.head_size - MLA_ROPE_DIM,
                kv_b_proj=nn.Linear(1, 1),  # weights: never loaded, never used for the layout
                cache_config=layer_cache,
                prefix=layer.name,
                # Only where there is one: releases to 0.22 pass unknown keywords on to the impl,
                # which takes its own sliding_window too.
                **({"sliding_window": layer.sliding_window} if kind == "sliding_window_mla" else {}),
            )
    if kind == "mla_indexer" and layer.index_kpool is not None:
        import torch
        Glm5NextIndexerCache = _own_layer_class(layer, "vllm.models.glm5next.common.attention", "Glm5NextIndexerCache")
        # As GLM-5-next's Indexer builds it (models/glm5next/common/attention.py): uint8 (fp8 keys
        # + fp32 scales), one state per index_kpool tokens (its get_kv_cache_spec: tokens_per_state).
        return Glm5NextIndexerCache(head_dim=layer.head_size, dtype=torch.uint8, prefix=layer.name,
                                    cache_config=layer_cache, index_kpool=layer.index_kpool)
    if kind == "mla_indexer":
        import torch
        DeepseekV32IndexerCache = _own_layer_class(layer, "vllm.model_executor.models.deepseek_v2", "DeepseekV32IndexerCache")
        # As DeepSeek V3.2's Indexer builds it: uint8 (fp8 keys + fp32 scales), its own backend.
        return DeepseekV32IndexerCache(head_dim=layer.head_size, dtype=torch.uint8, prefix=layer.name,
                                       cache_config=layer_cache)
    if kind == "minimax_indexer":
        MiniMaxM3IndexerCache = _own_layer_class(layer, "vllm.models.minimax_m3.common.indexer", "MiniMaxM3IndexerCache")
        # As MiniMaxM3SparseAttention builds its indexer (models/minimax_m3/nvidia/model.py): the index cache's
        # dtype is --attention-config indexer_kv_dtype, bf16 when unset (vLLM's resolve_indexer_kv_dtype), not
        # the KV cache dtype; vllm_config_for sets it from the case's indexer layers.
        return MiniMaxM3IndexerCache(head_dim=layer.head_size, prefix=layer.name, cache_config=layer_cache,
                                     indexer_kv_dtype=vc.attention_config.resolve_indexer_kv_dtype("bf16"))
    if kind == "circular_buffer":
        import torch
        Glm5NextTailCache = _own_layer_class(layer, "vllm.models.glm5next.common.attention", "Glm5NextTailCache")
        # As GLM-5-next's Indexer builds its kpool tail (models/glm5next/common/attention.py): the
        # ring's size and dtype are the layer's own (get_kv_cache_spec), from index_kpool and drafts.
        return Glm5NextTailCache(head_dim=layer.head_size, dtype=torch.bfloat16, prefix=layer.name,
                                 cache_config=layer_cache, index_kpool=layer.index_kpool)
    if kind in ("qsa_compressed_key", "qsa_key_state"):
        import torch
        owner = "QSACompressedKeyCache" if kind == "qsa_compressed_key" else "QSAKeyStateCache"
        cls = _own_layer_class(layer, "vllm.models.qwen4_exp.common.qsa_cache", owner)
        # As Qwen4-exp's QSA layer builds its side caches (models/qwen4_exp/common/qsa_cache.py): bf16 keys of
        # the index head size, its compress_ratio; a text model keeps no MRoPE positions beside the raw keys.
        return cls(head_size=layer.head_size, dtype=torch.bfloat16, cache_config=layer_cache, prefix=layer.name,
                   vllm_config=vc, compress_ratio=layer.index_kpool)
    if kind in DSV4_KINDS:
        return _deepseek_v4_cache(layer, layer_cache, vc, fc)
    if kind == "hidden_state":
        CacheOnlyAttentionLayer = _own_layer_class(
            layer, "vllm.model_executor.models.extract_hidden_states", "CacheOnlyAttentionLayer")
        # As ExtractHiddenStatesModel builds it: one head per captured layer, head size = hidden size.
        return CacheOnlyAttentionLayer(layer.num_kv_heads, layer.head_size, cache_config=layer_cache, prefix=layer.name)
    if kind == "mamba" and layer.mixer is not None:
        from gpu_impl.vllm_cpu import mixers

        return mixers.build_layer(layer, vc, vc.model_config.hf_text_config,
                                  lambda module, name: _own_layer_class(layer, module, name))
    if kind == "mamba":
        return _state_space_layer(layer, fc)
    raise RunnerUnavailable(f"layer {layer.name!r}: kind {kind!r} has no layer builder")


def _minimax_m3_sparse_attention(layer, cache_config, vc):
    """MiniMax M3's own sparse attention layer (models/minimax_m3/nvidia/model.py ``MiniMaxM3SparseAttention``), as its
    decoder layer builds it: it picks its own backend (``select_main_backend_and_impl_cls``) and builds its lightning
    indexer, whose key cache it registers first (``{prefix}.attn.index_cache``), then its main cache
    (``{prefix}.attn``). Its config carries the case's geometry (KV heads over the TP ranks, head size, the index
    cache layer's width as ``sparse_index_dim``) and defaults for what the layout does not read (RoPE, top-k 16 of
    128-token sparse blocks); weights stay on meta."""
    from transformers import PretrainedConfig

    cls = _own_layer_class(layer, "vllm.models.minimax_m3.nvidia.model", "MiniMaxM3SparseAttention")
    tp = vc.parallel_config.tensor_parallel_size
    total_kv = layer.num_kv_heads * tp
    index_dim = _MINIMAX_INDEX_DIMS[layer.name]
    config = PretrainedConfig(
        hidden_size=256, num_attention_heads=Q_HEADS_PER_KV_HEAD * total_kv, num_key_value_heads=total_kv,
        head_dim=layer.head_size, rms_norm_eps=1e-6, max_position_embeddings=vc.model_config.max_model_len,
        rope_theta=1e4, partial_rotary_factor=0.5,
        sparse_attention_config={"sparse_num_index_heads": total_kv, "sparse_index_dim": index_dim,
                                 "sparse_topk_blocks": 16, "sparse_block_size": 128})
    return cls(config, layer_id=0, prefix=layer.name.removesuffix(".attn"), cache_config=cache_config)


def _qwen4_exp_qsa_attention(layer, vc):
    """Qwen4-exp's own QSA attention layer (models/qwen4_exp/nvidia/qsa.py ``Qwen4ExpQSAAttention``), as its decoder
    layer builds it: it picks its own backend, builds its QSA indexer, whose raw-key ring and compressed keys it
    registers first (``{prefix}.indexer.*``), then its main cache (``{prefix}.attn``). Its config carries the case's
    geometry (KV heads over the TP ranks, head size, the side caches' compress ratio and index head size) and defaults
    for what the layout does not read; weights stay on meta. Its impl checks that FlashAttention's compiled varlen
    kernel loads (``is_flash_attn_varlen_func_available``), which on CPU it cannot: answered as a GPU would."""
    importlib.import_module("vllm.models.qwen4_exp.nvidia.model")  # qsa.py imports back from it
    qsa = importlib.import_module("vllm.models.qwen4_exp.nvidia.qsa")
    config_cls = _own_layer_class(layer, "transformers", "Qwen4ExpTextConfig")
    tp = vc.parallel_config.tensor_parallel_size
    total_kv = layer.num_kv_heads * tp
    ratio, index_head = _QSA_INDEXERS[layer.name]
    config = config_cls()
    config.update(dict(hidden_size=256, num_attention_heads=Q_HEADS_PER_KV_HEAD * total_kv, num_key_value_heads=total_kv,
                       head_dim=layer.head_size, indexer_n_heads=16, indexer_kv_heads=1, indexer_head_dim=index_head,
                       indexer_budget=2048, indexer_compress_ratio=ratio))
    with shims.attributes_set(qsa, is_flash_attn_varlen_func_available=lambda: True):
        return qsa.Qwen4ExpQSAAttention(vllm_config=vc, config=config, layer_id=0,
                                        prefix=layer.name.removesuffix(".attn"))


def _inkling_attention(layer, vc):
    """Inkling's attention (models/inkling/nvidia/attention.py ``InklingAttention``, global or local), as its decoder
    layer (``InklingDecoderLayer``) builds it: first the layer's short-conv state owner (sconv_swa_attn.py
    ``InklingConvState``, registered as ``{prefix}.conv_state``), then the attention wired to it. The config carries
    the case's geometry: KV heads over the TP ranks, the head dim, the hidden size whose per-head share packs the conv
    state's head (``2 * head_dim + 2 * hidden_size / num_kv_heads``, the case's power of two exactly), the conv kernel
    (the conv state's window) and the local window; weights stay on meta."""
    attention = importlib.import_module("vllm.models.inkling.nvidia.attention")
    sconv = importlib.import_module("vllm.models.inkling.nvidia.sconv_swa_attn")
    config_cls = _own_layer_class(layer, "vllm.models.inkling.configs", "InklingModelConfig")
    conv = _INKLING_CONV_STATES[layer.name]
    total_kv = layer.num_kv_heads * vc.parallel_config.tensor_parallel_size
    hidden_size = (conv.head_size - 2 * layer.head_size) // 2 * total_kv
    local = layer.kind == "sliding_window"
    window = layer.sliding_window or 512
    config = config_cls(hidden_size=hidden_size, num_attention_heads=Q_HEADS_PER_KV_HEAD * total_kv,
                        num_key_value_heads=total_kv, head_dim=layer.head_size, sliding_window_size=window,
                        use_sconv=True, sconv_kernel_size=conv.sliding_window)
    prefix = layer.name.removesuffix(".attn")
    owner = sconv.InklingConvState(num_kv_heads=total_kv, head_dim=layer.head_size, hidden_size=hidden_size,
                                   kernel_size=conv.sliding_window, prefix=f"{prefix}.conv_state")
    return attention.InklingAttention(config, num_heads=Q_HEADS_PER_KV_HEAD * total_kv, num_kv_heads=total_kv,
                                      head_dim=layer.head_size, rel_extent=config.rel_extent, local_extent=window,
                                      is_local=local, prefix=layer.name, quant_config=None, conv_owner=owner)


_INKLING_CONV_STATES: dict[str, Any] = {}
"""The case's Inkling attention layers -> their decoder layer's short-conv state (its case layer; set by ``build_layers``)."""


def _step5_dsa_attention(layer, cache_config, vc):
    """Step5's own attention (models/step5/nvidia/model.py ``Step5Attention``) as ``Step5DecoderLayer`` builds a
    full-attention layer of a checkpoint with a ``sparse_config``: DSA, on its ``STEP5_DSA`` backend (vLLM's
    ``Attention`` as ``{prefix}.attn``), then its region summaries (``{prefix}.attn.sparse_summary_cache``) and the
    open region's ring (``{prefix}.attn.csa_tail_ring``). The sparse config is the checkpoint schema's, parsed by
    vLLM's ``get_step5_sparse_config``, with one indexer provider group per KV head and two index heads each (the
    geometry its constructor requires to agree with the attention's); 4 query heads per KV head, a head-wise gate
    (DSA layers require it); weights stay on meta."""
    cls = _own_layer_class(layer, "vllm.models.step5.nvidia.model", "Step5Attention")
    step5_config = importlib.import_module("vllm.models.step5.nvidia.config")
    tp = vc.parallel_config.tensor_parallel_size
    total_kv = layer.num_kv_heads * tp
    sparse = step5_config.get_step5_sparse_config(
        {"sparse_config": {"index_tp_size": total_kv, "sparse_indexer_num_heads": 2 * total_kv}})
    with shims.tensor_parallel_group(tp):
        module = cls(hidden_size=256, num_heads=Q_HEADS_PER_KV_HEAD * total_kv, num_kv_heads=total_kv,
                     head_dim=layer.head_size, max_position=vc.model_config.max_model_len, cache_config=cache_config,
                     prefix=layer.name.removesuffix(".attn"), use_head_wise_attn_gate=True, vllm_config=vc,
                     sparse_config=sparse)
    return module.attn  # the KV cache layer; its side caches are registered beside it


_QSA_INDEXERS: dict[str, tuple[int, int]] = {}
"""The case's Qwen4-exp QSA layers -> their side caches' (compress ratio, index head size) (set by ``build_layers``)."""


_MINIMAX_INDEX_DIMS: dict[str, int] = {}
"""The case's MiniMax M3 sparse layers -> their index cache's width (set by ``build_layers``)."""


def _kimi_k3_mla(layer, cache_config, heads: int):
    """Kimi K3's own MLA layer (models/kimi_k3/nvidia/mla.py ``MultiHeadLatentAttention``), as its decoder layer
    builds it: NoPE-only latent attention of the case's latent width (kv_lora_rank + RoPE 64), selecting its backend
    itself (the platform selector), registered under the layer's own name (``...self_attn``). Its config carries
    only what the constructor reads (``rms_norm_eps``; no RoPE); weights stay on meta."""
    cls = _own_layer_class(layer, "vllm.models.kimi_k3.nvidia.mla", "MultiHeadLatentAttention")
    config_cls = _own_layer_class(layer, "vllm.transformers_utils.configs.kimi_linear", "KimiLinearConfig")
    with _constructing(layer):
        return cls(config_cls(rms_norm_eps=1e-6), hidden_size=256, num_heads=heads, qk_nope_head_dim=MLA_NOPE_DIM,
                   qk_rope_head_dim=MLA_ROPE_DIM, v_head_dim=MLA_NOPE_DIM, q_lora_rank=None,
                   kv_lora_rank=layer.head_size - MLA_ROPE_DIM, use_output_gate=True, cache_config=cache_config,
                   prefix=layer.name)


def _deepseek_v4_cache(layer, cache_config, vc, fc):
    """One of DeepSeek V4's caches, as ``DeepseekV4FlashMLAAttention`` (models/deepseek_v4/nvidia/flashmla.py, the
    CUDA FlashMLA path) builds it: its SWA cache on the class's ``swa_backend_cls``, the C4 indexer's key cache and
    each ``DeepseekCompressor``'s fp32 state cache, with the geometry their builders pass. The attention layer itself
    (kind ``dsv4_attention``) needs the whole checkpoint config and CUDA events to construct, so its own
    ``get_kv_cache_spec`` and ``get_attn_backend`` run on an instance carrying only what they read: the compress
    ratio, head size and the cache dtype vLLM's ``_resolve_dsv4_kv_cache_dtype`` resolves for the class."""
    import torch

    kind = layer.kind
    if kind == "dsv4_indexer":
        cls = _own_layer_class(layer, "vllm.models.deepseek_v4.attention", "DeepseekV4IndexerCache")
        # DeepseekV4Indexer: uint8 keys of k_cache_head_dim bytes (fp8 keys + fp32 scales), its compress ratio.
        return cls(head_dim=layer.head_size, dtype=torch.uint8, prefix=layer.name, cache_config=cache_config,
                   compress_ratio=layer.index_kpool)
    if kind == "dsv4_compressor_state":
        cls = _own_layer_class(layer, "vllm.models.deepseek_v4.compressor", "CompressorStateCache")
        # DeepseekCompressor: state_dim = 2 * coff * head_dim (kv and score states), float32.
        return cls(state_dim=layer.head_size, dtype=torch.float32, compress_ratio=layer.index_kpool, prefix=layer.name)
    attention_cls = _own_layer_class(layer, "vllm.models.deepseek_v4.nvidia.flashmla", "DeepseekV4FlashMLAAttention")
    resolve = _own_layer_class(layer, "vllm.models.deepseek_v4.attention", "_resolve_dsv4_kv_cache_dtype")
    cache_dtype, torch_dtype = resolve(attention_cls.use_fp8_ds_mla_layout, cache_config.cache_dtype, cache_config)
    if kind == "dsv4_swa":
        cls = _own_layer_class(layer, "vllm.v1.attention.backends.mla.sparse_swa", "DeepseekV4SWACache")
        return cls(head_dim=layer.head_size, window_size=layer.sliding_window, dtype=torch_dtype, prefix=layer.name,
                   cache_config=cache_config, backend_cls=attention_cls.swa_backend_cls)
    # kind == "dsv4_attention": the instance DeepseekV4Attention.__init__ would leave, as far as its
    # get_kv_cache_spec / get_attn_backend read it.
    layer_obj = attention_cls.__new__(attention_cls)
    torch.nn.Module.__init__(layer_obj)
    layer_obj.prefix = layer.name
    layer_obj.compress_ratio = layer.index_kpool
    layer_obj.head_dim = layer.head_size
    layer_obj.kv_cache_dtype, layer_obj.kv_cache_torch_dtype = cache_dtype, torch_dtype
    layer_obj.kv_cache = torch.tensor([])
    if layer.name in fc:
        raise ValueError(f"Duplicate layer name: {layer.name}")
    fc[layer.name] = layer_obj
    return layer_obj


def _deepseek_v41_attention(layer, vc):
    """DeepSeek V4.1's attention for the decoder layer whose cache ``layer`` is, as ``DeepseekV4DecoderLayer`` builds it
    (models/deepseek_v41/nvidia/model.py): the class vLLM's ``_select_dsv4_attn_cls`` picks for the config (FlashMLA,
    which the case names), constructed with the model's shared top-k buffer and aux streams as ``DeepseekV4Model``
    makes them (no candidate buffer: the config names no candidate source). Its constructor registers the layer
    (``...layers.{i}.attn``) and the caches its role gives it, from the model's config (``ModelConfigStandIn``: vLLM's
    own ``DeepseekV41Config`` for the case): the indexer keys, the SWA cache, a ratio-2 compressor's ring. Weights stay
    on meta; the streams are stand-ins (a CUDA stream needs a driver; the layer only keeps them)."""
    import torch

    select = _own_layer_class(layer, "vllm.models.deepseek_v41.nvidia.model", "_select_dsv4_attn_cls")
    config = vc.model_config.hf_config
    prefix = dsv41_prefix(layer)
    topk_indices = torch.empty(vc.scheduler_config.max_num_batched_tokens, config.index_topk, dtype=torch.int32,
                               device="cuda")
    with shims.cuda_streams(), shims.tensor_parallel_group(vc.parallel_config.tensor_parallel_size):
        streams = [torch.cuda.Stream() for _ in range(3)]
        return select(vc)(vc, prefix=prefix, topk_indices_buffer=topk_indices, aux_stream_list=streams,
                          candidate_block_buffer=None)


def _state_space_layer(layer, fc):
    import torch
    from vllm.model_executor.layers.mamba.abstract import MambaBase
    from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum

    if layer.backend not in shims.MAMBA_BACKENDS:
        raise RunnerUnavailable(f"layer {layer.name!r}: {layer.backend} is not a state-space backend")
    shapes = tuple(tuple(s) for s in layer.mamba_shapes)
    dtypes = tuple(getattr(torch, d) for d in (layer.mamba_dtypes or ("bfloat16",) * len(shapes)))
    mamba_type = MambaAttentionBackendEnum[shims.MAMBA_BACKENDS[layer.backend]]

    class CaseStateLayer(MambaBase):
        """A state-space layer with the case's state shapes (MambaBase's own spec and binding)."""

        def get_state_shape(self):
            return shapes

        def get_state_dtype(self):
            return dtypes

        @property
        def mamba_type(self):
            return mamba_type

        @property
        def is_kv_cache_tp_replicated(self):
            return False

    obj = CaseStateLayer()
    obj.prefix = layer.name
    obj.kv_cache = ()
    fc[layer.name] = obj
    return obj


def _has_mixers(case) -> bool:
    """Layers built as a model's own classes, which read the tensor-parallel group: state mixers, and the
    layers of a model family's own class (Kimi K3's MLA asserts its heads split across the ranks)."""
    return any(getattr(layer, "mixer", None) is not None or getattr(layer, "family", None) is not None
               for layer in case.layers)


def mixer_environment(case):
    """While a case's own-class layers are built and asked for their specs: the tensor-parallel group they
    read (MambaMixer2's ``get_state_shape`` asks ``get_tensor_model_parallel_world_size()``)."""
    return shims.tensor_parallel_group(case.tensor_parallel_size) if _has_mixers(case) else contextlib.nullcontext()


def _pcp_size(case) -> int:
    return getattr(case, "prefill_context_parallel_size", 1)


def check_model_runner_support(case, runner: str, vc) -> None:
    """What refuses a configuration before the model is loaded, run as vLLM runs it: MRv1 at ``VllmConfig``
    validation (``_validate_v1_model_runner``: PCP, a Step5 model), MRv2 in its constructor
    (``pcp_manager.maybe_build_pcp_manager`` -> ``PCPManager.validate_config``). Only asked under PCP or for a model
    with an architecture of its own (Step5's): the cases set nothing else those validators read."""
    if runner == "mrv1":
        if _pcp_size(case) <= 1 and getattr(vc.model_config, "architecture", None) is None:
            return
        validate = getattr(vc, "_validate_v1_model_runner", None)
        if validate is None:
            raise RunnerUnavailable("this vLLM's VllmConfig has no _validate_v1_model_runner to ask about PCP or Step5")
        validate()
        return
    if _pcp_size(case) <= 1:
        return
    try:
        from vllm.v1.worker.gpu.pcp_manager import PCPManager
    except ImportError as exc:
        raise RunnerUnavailable(f"this vLLM's MRv2 has no PCPManager: {exc}") from None
    # The case's drafts are Eagle drafts (both runners build them through their Eagle paths).
    speculative = _pcp_speculative_stand_in() if any(l.is_draft for l in case.layers) else None
    with shims.attributes_set(vc, speculative_config=speculative):
        PCPManager.validate_config(vc, supports_mm_inputs=False)


def _pcp_speculative_stand_in() -> SimpleNamespace:
    """The ``SpeculativeConfig`` answers ``PCPManager.validate_config`` reads for an Eagle draft."""
    return SimpleNamespace(method="eagle", use_dspark=lambda: False, use_multi_module_mtp=lambda: False)


def _pcp_build_check(case) -> None:
    """Layers the drivers cannot build as the model would under PCP."""
    if _pcp_size(case) > 1 and case.decode_context_parallel_size > 1 and any(
            l.kind in ("mla", "sliding_window_mla") for l in case.layers):
        raise RunnerUnavailable(
            "PCP+DCP on sparse MLA needs DeepSeek V3.2's own attention class (models/deepseek_v32/attention.py, "
            "supports_pcp_dcp), which the drivers do not build; the generic MLAAttention refuses PCP+DCP")


def _family_owner(layer, by_name: dict[str, Any]):
    """The case layer whose family class also builds ``layer`` (MiniMax M3's sparse attention builds its index
    cache, ``{name}.index_cache``), or None."""
    if layer.kind == "minimax_indexer" and layer.name.endswith(".index_cache"):
        owner = by_name.get(layer.name.removesuffix(".index_cache"))
        if owner is not None and owner.family == "minimax_m3":
            return owner
    if layer.kind == "inkling_conv_state":
        owner = by_name.get(layer.name.removesuffix(".conv_state") + ".attn")
        if owner is not None and owner.family == "inkling":
            return owner
    if layer.family == "deepseek_v41":
        # Its decoder layer's attention builds every cache of the layer (the first listed builds them all).
        prefix = dsv41_prefix(layer)
        return next(l for l in by_name.values() if l.family == "deepseek_v41" and dsv41_prefix(l) == prefix)
    if layer.kind in ("qsa_key_state", "qsa_compressed_key") and ".indexer." in layer.name:
        owner = by_name.get(layer.name.rsplit(".indexer.", 1)[0] + ".attn")
        if owner is not None and owner.family == "qwen4_exp":
            return owner
    return None


def build_layers(case, runner: str, vc) -> dict[str, Any]:
    """The case's layers as the loaded model (and drafter) leave them, by name."""
    from vllm.utils.torch_utils import set_default_torch_dtype

    _pcp_build_check(case)
    fc = vc.compilation_config.static_forward_context
    fc.clear()
    built: dict[str, Any] = {}
    draft = draft_sub_configs(case, runner, vc) if any(l.is_draft for l in case.layers) else None
    dcp = shims.decode_context_parallel_group(case.decode_context_parallel_size)
    pcp = shims.prefill_context_parallel_group(_pcp_size(case))
    # Mixer classes read the tensor-parallel group when built and when asked for their state.
    # DeepSeek V4.1's attention asks which runner runs (bounded SWA replay is MRv2's): as a deployment selects it.
    runner_env = shims.model_runner_env(runner) if any(l.family == "deepseek_v41" for l in case.layers) else contextlib.nullcontext()
    with shims.cuda_on_meta(), dcp, pcp, mixer_environment(case), runner_env, \
            set_default_torch_dtype(_torch_dtype(case.model_dtype)):
        by_name = {layer.name: layer for layer in case.layers}
        _MINIMAX_INDEX_DIMS.clear()
        _MINIMAX_INDEX_DIMS.update({l.name: by_name[f"{l.name}.index_cache"].head_size
                                    for l in case.layers if l.family == "minimax_m3"})
        _INKLING_CONV_STATES.clear()
        _INKLING_CONV_STATES.update({l.name: by_name[l.name.removesuffix(".attn") + ".conv_state"]
                                     for l in case.layers if l.family == "inkling"})
        _QSA_INDEXERS.clear()
        for l in case.layers:
            if l.family == "qwen4_exp":
                ring = by_name[l.name.removesuffix(".attn") + ".indexer.raw_key_cache"]
                _QSA_INDEXERS[l.name] = (ring.index_kpool, ring.head_size)
        for layer in case.layers:
            subs = draft if layer.is_draft else _DraftBase.of(vc)
            owner = _family_owner(layer, by_name)
            if owner is not None and layer.name not in fc:
                # The family's class builds this layer as part of its owner (MiniMax M3's index cache).
                with _sub_configs(vc, subs):
                    _build_layer(owner, subs.cache_config, vc)
            if layer.name in fc:  # registered by its owner's class, built above
                obj = fc[layer.name]
            else:
                with _sub_configs(vc, subs):
                    obj = _build_layer(layer, subs.cache_config, vc)
            if layer.is_draft:
                # LLMBaseProposer.load_model / DraftModelSpeculator.load_model tag them.
                obj.is_draft_layer = True
            elif not hasattr(obj, "is_draft_layer"):
                obj.is_draft_layer = False
            built[layer.name] = obj
    return built


# --- runner stand-ins ----------------------------------------------------------------------------


def _runner_basics(case, vc, device) -> dict[str, Any]:
    """What both runners' ``__init__`` copy from the ``VllmConfig`` and the case first."""
    return dict(
        vllm_config=vc,
        model_config=vc.model_config,
        cache_config=vc.cache_config,
        compilation_config=vc.compilation_config,
        parallel_config=vc.parallel_config,
        scheduler_config=vc.scheduler_config,
        speculative_config=None,
        device=device,
        max_num_reqs=MAX_NUM_REQS,
        max_num_tokens=MAX_NUM_TOKENS,
        max_model_len=case.max_model_len,
    )


def _mrv1_runner(case, vc, device):
    import torch
    from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher
    from vllm.v1.spec_decode.eagle import EagleProposer
    from vllm.v1.worker.block_table import SlotMappingMode
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    drafts = {l.name for l in case.layers if l.is_draft}
    speculative = _mrv1_speculative_config(case) if drafts else None
    r = _stand_in(
        GPUModelRunner,
        **_runner_basics(case, vc, device),
        # GPUModelRunner.__init__: an encoder-decoder model sizes its block tables (and the
        # builders' kernel tables) for the scheduler's encoder budget too.
        max_encoder_len=(vc.scheduler_config.max_num_encoder_input_tokens if vc.model_config.is_encoder_decoder else 0),
        num_spec_tokens=len(drafts) and 1,
        uniform_decode_query_len=1 + (len(drafts) and 1),
        is_pooling_model=False,
        kv_cache_dtype=None,
        kv_caches=[],
        attn_groups=[],
        shared_kv_cache_layers={},
        kv_sharing_fast_prefill_eligible_layers=set(),
        runner_only_attn_layers=set(),
        cudagraph_dispatcher=CudagraphDispatcher(vc),
        reorder_batch_threshold=None,
        # GPUModelRunner.__init__'s placeholder InputBatch (rebuilt by
        # may_reinitialize_input_batch once the real block sizes are known).
        _init_block_sizes=[vc.cache_config.block_size],
        _init_kernel_block_sizes=[vc.cache_config.block_size],  # up to 0.31
        _init_max_num_blocks=[1],
        _init_slot_mapping_modes=[SlotMappingMode.TOKEN_TO_KV_SLOT],
        cp_kv_cache_interleave_size=vc.parallel_config.cp_kv_cache_interleave_size,
        jit_warmup_registry=_NullWarmup(),
        # Only what may_reinitialize_input_batch copies from the placeholder batch.
        input_batch=SimpleNamespace(logitsprocs=None, logitsprocs_need_output_token_ids=False),
    )
    if drafts:
        r.speculative_config = speculative
        r.drafter = _stand_in(
            EagleProposer,
            vllm_config=vc,
            speculative_config=speculative,
            device=device,
            _draft_attn_layer_names=set(drafts),
            cudagraph_dispatcher=CudagraphDispatcher(vc),
            draft_attn_groups=[],
            # What SpecDecodeBaseProposer.__init__ sets that a draft step reads
            # (_update_positions_dependent_metadata): the model length it clamps at and the
            # position and slot-mapping buffers, sized like its own (max_num_batched_tokens).
            max_model_len=vc.model_config.max_model_len,
            uses_mrope=False,
            positions=torch.zeros(MAX_NUM_TOKENS, dtype=torch.int64, device=device),
            _slot_mapping_buffer=torch.zeros(MAX_NUM_TOKENS, dtype=torch.int64, device=device),
        )
    return r


def _mrv2_runner(case, vc, device):
    from torch import nn
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner
    from vllm.v1.worker.gpu.model_states import init_model_state

    fc = vc.compilation_config.static_forward_context
    drafts = {l.name for l in case.layers if l.is_draft}
    # The loaded model: a module holding the case's layers (ModelState resolution looks
    # for cross-attention modules in it).
    model = nn.Module()
    model.layers = nn.ModuleList([fc[l.name] for l in case.layers if isinstance(fc.get(l.name), nn.Module)])
    if any(l.kind == "mamba" for l in case.layers):
        # A hybrid model's class answers which functions copy its Mamba state (align mode): the mixers' family's
        # own (Qwen4-exp's maps GDN and PLE states to theirs), else the Mamba2 model's
        # (vllm/model_executor/models/mamba2.py).
        from vllm.model_executor.models.mamba2 import Mamba2ForCausalLM

        family = vc.model_config.mixer_model_class()
        model.get_mamba_state_copy_funcs = getattr(family, "get_mamba_state_copy_funcs",
                                                   Mamba2ForCausalLM.get_mamba_state_copy_funcs)
    r = _stand_in(
        GPUModelRunner,
        **_runner_basics(case, vc, device),
        model=model,
        is_encoder_decoder=vc.model_config.is_encoder_decoder,
        # GPUModelRunner.__init__ up to 0.32 (0.33 keeps it on model_state).
        supports_mm_inputs=vc.model_config.supports_multimodal_inputs,
        vocab_size=vc.model_config.get_vocab_size(),
        dcp_size=vc.parallel_config.decode_context_parallel_size,
        dcp_rank=0,
        pcp_manager=_mrv2_pcp_manager(case, vc, device),
        batch_sharder=None,
        speculator=_mrv2_speculator(case, vc, device, drafts) if drafts else None,
        lora_capture_cases=[0],
        jit_warmup_registry=_NullWarmup(),
        kv_caches=[],
    )
    # What GPUModelRunner.__init__ of releases to 0.28 also sets (generation 1's MRv2
    # schedules), where the class does not answer it itself (0.28: a pcp_manager_cls property).
    for name, value in (("cp_interleave", vc.parallel_config.cp_kv_cache_interleave_size),
                        ("pcp_manager_cls", None), ("uniform_decode_query_len", 1 + (len(drafts) and 1))):
        if not hasattr(GPUModelRunner, name):
            setattr(r, name, value)
    from vllm.v1.worker.gpu.input_batch import InputBuffers
    from vllm.v1.worker.gpu.states import RequestState

    # GPUModelRunner.__init__'s request state and input buffers, sized like the runner's.
    import inspect

    offered = dict(
        max_num_reqs=MAX_NUM_REQS,
        max_model_len=case.max_model_len,
        max_num_batched_tokens=MAX_NUM_TOKENS,
        num_speculative_steps=1 if drafts else 0,
        vocab_size=r.vocab_size,
        device=device,
        num_prefill_lookahead=1,  # 0.29 on
        use_dense_all_token_ids=False,  # 0.32 on
    )
    takes = inspect.signature(RequestState).parameters
    r.req_states = RequestState(**{name: value for name, value in offered.items() if name in takes})
    r.input_buffers = InputBuffers(max_num_reqs=MAX_NUM_REQS, max_num_tokens=MAX_NUM_TOKENS, device=device)
    encoder_cache = None
    if r.is_encoder_decoder:
        # Cross-attention models take encoder inputs (Whisper's audio): the runner keeps
        # an encoder cache for them (GPUModelRunner.__init__: supports_mm_inputs).
        from vllm.v1.worker.gpu.mm.encoder_cache import EncoderCache

        encoder_cache = EncoderCache()
    r.encoder_cache = encoder_cache
    r.model_state = init_model_state(vc, model, encoder_cache, device)
    # One sampled token per step where the model state does not say (releases before 0.28).
    r.decode_query_len = (1 if drafts else 0) + getattr(r.model_state, "num_new_sampled_tokens_per_step", 1)
    return r


def _mrv2_pcp_manager(case, vc, device):
    """MRv2's own ``maybe_build_pcp_manager`` as its constructor calls it (None without PCP);
    ``initialize_kv_cache`` hands it the block tables."""
    if _pcp_size(case) <= 1:
        return None
    from vllm.v1.worker.gpu import pcp_manager as pcp

    with shims.prefill_context_parallel_group(_pcp_size(case)), \
            shims.decode_context_parallel_group(case.decode_context_parallel_size):
        return pcp.maybe_build_pcp_manager(vc, device, supports_mm_inputs=False)


def _mrv2_speculator(case, vc, device, drafts):
    from vllm.v1.worker.gpu.spec_decode.eagle.speculator import EagleSpeculator

    # What DraftModelSpeculator.__init__ sets from the config (its draft model config,
    # hidden size and vocabulary come from the draft checkpoint, which is not loaded).
    return _stand_in(
        EagleSpeculator,
        vllm_config=vc,
        device=device,
        draft_attn_layer_names=set(drafts),
        dcp_size=vc.parallel_config.decode_context_parallel_size,
        pcp_manager=None,
        speculative_config=_speculative_stand_in(case),
        num_speculative_steps=1,
        scheduler_config=vc.scheduler_config,
        max_num_reqs=MAX_NUM_REQS,
        max_num_tokens=MAX_NUM_TOKENS,
        enable_adaptive_verification=False,
    )


def _stand_in(cls, **attrs: Any):
    """``cls.__new__`` carrying ``attrs``: a runner as its ``__init__`` would leave the
    parts ``initialize_kv_cache`` reads (the constructors need CUDA streams)."""
    obj = cls.__new__(cls)
    for name, value in attrs.items():
        setattr(obj, name, value)
    return obj


class _NullWarmup:
    """``jit_warmup_registry``: JIT warm-up providers compile CUDA kernels; none are captured."""

    def activate(self):
        return contextlib.nullcontext()


def _mrv1_speculative_config(case):
    spec = _speculative_stand_in(case)
    spec.use_eagle = lambda: True
    spec.uses_draft_model = lambda: False
    spec.uses_extract_hidden_states = lambda: False
    return spec


# --- the KV transfer group ---------------------------------------------------------------------------


class RecordingConnector:
    """Installed as vLLM's KV transfer group: keeps what ``register_kv_caches`` receives."""

    def __init__(self) -> None:
        self.registered: dict[str, Any] | None = None
        self.calls = 0

    def register_kv_caches(self, kv_caches) -> None:
        self.calls += 1
        self.registered = dict(kv_caches)

    def set_host_xfer_buffer_ops(self, copy_operation) -> None:
        pass


@contextlib.contextmanager
def recording_transfer_group() -> Iterator[RecordingConnector]:
    import vllm.distributed.kv_transfer.kv_transfer_state as state

    recorder = RecordingConnector()
    saved = state._KV_CONNECTOR_AGENT
    state._KV_CONNECTOR_AGENT = recorder
    try:
        yield recorder
    finally:
        state._KV_CONNECTOR_AGENT = saved


# --- observation -----------------------------------------------------------------------------------


_STAGE_OF_FUNCTION = {
    "get_kv_cache_spec": "specs",
    "initialize_attn_backend": "attention_groups",
    "init_attn_backend": "attention_groups",
    "_check_and_update_cudagraph_mode": "attention_groups",
    "prepare_kernel_block_sizes": "kernel_block_sizes",
    "select_common_block_size": "kernel_block_sizes",
    "create_metadata_builders": "builders",
    "initialize_metadata_builders": "builders",
    "set_attn": "builders",
    "may_reinitialize_input_batch": "block_tables",
    "BlockTables": "block_tables",
    "allocate_kv_cache": "allocate",
    "create_kv_cache_views": "allocate",
    "map_kv_caches_to_kernel_blocks": "bind",
    "map_kv_cache_to_kernel_blocks": "bind",
    "bind_kv_cache": "bind",
    "bind_kv_cache_to_layers": "bind",
    "register_kv_caches": "register",
}


def failing_stage(exc: BaseException, default: str) -> str:
    """The pipeline stage of the innermost vLLM function in the traceback that names one."""
    import traceback

    stage = default
    for frame in traceback.extract_tb(exc.__traceback__):
        if "vllm" in frame.filename and frame.name in _STAGE_OF_FUNCTION:
            stage = _STAGE_OF_FUNCTION[frame.name]
    return stage


def runner_instance(case, runner: str, vc, device: str):
    """The ``runner`` ("mrv1"/"mrv2") stand-in for ``case`` on ``device``."""
    import torch

    build = _mrv1_runner if runner == "mrv1" else _mrv2_runner
    return build(case, vc, torch.device(device))


def attention_groups(runner: str, instance) -> tuple[list[Any], list[Any]]:
    """(the runner's own attention groups, the drafter's / speculator's), flattened."""
    # getattr: after a refusal the runner may not have reached the assignment.
    own = [g for groups in getattr(instance, "attn_groups", None) or [] for g in groups]
    if runner == "mrv1":
        drafter = getattr(instance, "drafter", None)
        return own, list(getattr(drafter, "draft_attn_groups", []) or [])
    # An encoder-only model's layers get their metadata builders from its model state
    # (EncoderOnlyModelState.encoder_attn_groups), not from a KV cache group.
    own += list(getattr(getattr(instance, "model_state", None), "encoder_attn_groups", None) or [])
    speculator = getattr(instance, "speculator", None)
    return own, [g for groups in (getattr(speculator, "attn_groups", None) or []) for g in groups]


def kernel_block_sizes(runner: str, instance) -> tuple[int, ...] | None:
    """The runner's kernel block sizes, or None before it chose them."""
    sizes = getattr(instance, "_kernel_block_sizes" if runner == "mrv1" else "kernel_block_sizes", None)
    return None if sizes is None else tuple(sizes)


def builder_block_sizes(groups) -> dict[str, int]:
    """Per attention layer: the block size of the spec its metadata builder was constructed with."""
    from vllm.v1.kv_cache_interface import AttentionSpec

    out: dict[str, int] = {}
    for group in groups:
        if not isinstance(group.kv_cache_spec, AttentionSpec):
            continue  # state-space builders keep the manager block (never split)
        builders = getattr(group, "metadata_builders", None) or []
        if not builders:
            continue
        spec = getattr(builders[0], "kv_cache_spec", None)
        size = getattr(spec, "block_size", None)
        if size is not None:
            out.update(dict.fromkeys(group.layer_names, int(size)))
    return out


def bound_caches(layers: dict[str, Any]) -> dict[str, tuple[Any, ...]]:
    """The tensors each layer computes with after ``bind_kv_cache`` (a tuple per layer)."""
    import torch

    out: dict[str, tuple[Any, ...]] = {}
    for name, layer in layers.items():
        cache = getattr(layer, "kv_cache", None)
        if isinstance(cache, torch.Tensor):
            tensors = (cache,) if cache.numel() or cache.dim() > 1 else ()
        elif isinstance(cache, (list, tuple)):
            tensors = tuple(t for t in cache if isinstance(t, torch.Tensor))
        else:
            tensors = ()
        if tensors:
            out[name] = tensors
    return out


def same_storage(a, b) -> bool:
    """Whether two tensors are views of one storage (works for ``meta`` tensors too)."""
    return a.untyped_storage()._cdata == b.untyped_storage()._cdata




@contextlib.contextmanager
def initialisation_environment(case) -> Iterator[None]:
    """What a runner's initialize_kv_cache reads from the process besides its config."""
    with shims.single_pipeline_stage(), shims.decode_context_parallel_group(case.decode_context_parallel_size), \
            shims.prefill_context_parallel_group(_pcp_size(case)), shims.tensor_parallel_group(case.tensor_parallel_size):
        yield


def allocation_on_meta(device: str = "meta"):
    """The ``kv_cache_allocation_context`` both runners accept: the pool lands on ``meta``
    (``device="cpu"``: in host memory, for a connector to read and write)."""
    return shims.cuda_on_meta(all_devices=True, target=device)


__all__ = ["MAX_NUM_REQS", "MAX_NUM_TOKENS", "RunnerUnavailable", "build_layers", "draft_sub_configs", "mixer_environment"]
