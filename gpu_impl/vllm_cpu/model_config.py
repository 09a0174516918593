"""The model config the drivers give vLLM: a case has no Hugging Face config on disk, so a stand-in
answers the few ``ModelConfig`` questions the driven code asks, from the case (one home: the
layout driver, the generation-1 driver and the drivers built on them use it)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from reference.config import DSV4_KINDS, LAYER_OWN_BACKENDS, dsv41_prefix

_NO_DEFAULT = object()


def _model_config_defaults() -> dict[str, Any]:
    """``ModelConfig``'s plain field defaults (fields with a factory are left out)."""
    global _MODEL_CONFIG_DEFAULTS
    if _MODEL_CONFIG_DEFAULTS is None:
        import dataclasses as dc

        from vllm.config import ModelConfig

        _MODEL_CONFIG_DEFAULTS = {
            f.name: f.default for f in dc.fields(ModelConfig) if f.default is not dc.MISSING and not hasattr(f.default, "default_factory")
        }
    return _MODEL_CONFIG_DEFAULTS


_MODEL_CONFIG_DEFAULTS: dict[str, Any] | None = None


def _deepseek_v4_text_config(case) -> SimpleNamespace:
    """What DeepSeek V4's metadata builders read off the model's config (``DeepseekSparseSWAMetadataBuilder``:
    the window and, through ``get_compress_ratios``, each decoder layer's compress ratio), from the case's caches:
    a decoder layer is the ``...layers.{i}.self_attn`` prefix of its SWA cache, its ratio that of its compressed
    attention cache (0: a sliding-window-only layer). The geometry is DeepSeek V4's (head 512, RoPE 64)."""
    windows = {l.sliding_window for l in case.layers if l.kind == "dsv4_swa"}
    ratios = {l.name: l.index_kpool for l in case.layers if l.kind == "dsv4_attention"}
    compress_ratios = [ratios.get(l.name.removesuffix(".swa_cache"), 0) for l in case.layers if l.kind == "dsv4_swa"]
    return SimpleNamespace(model_type="deepseek_v4", sliding_window=max(windows, default=128),
                           compress_ratios=compress_ratios, num_nextn_predict_layers=0, head_dim=512,
                           qk_rope_head_dim=64, index_head_dim=128, index_topk=512, vision_n_layers=0)


def _deepseek_v41_config(case):
    """vLLM's own ``DeepseekV41Config`` (transformers_utils/configs/deepseek_v41.py) for the case's decoder layers: each
    layer's compress ratio (that of its compressed cache; 0 for a layer owning only its SWA cache), its kv sources (the
    layers with a compressed cache) and index sources (those with indexer keys), the window of its SWA caches. The rest
    is V4.1's geometry (one latent head of 512 = 448 NoPE + 64 RoPE, which its compressor asserts; 128-wide index keys;
    64 query heads in 8 output groups), with small sizes for what only shapes weights (which stay on meta)."""
    from vllm.transformers_utils.configs.deepseek_v41 import DeepseekV41Config

    ratios: dict[int, int] = {}
    kv_sources, index_sources, windows = [], [], {128}
    for layer in case.layers:
        index = int(dsv41_prefix(layer).split(".")[-2])  # ...layers.{i}.attn (the case checks the name)
        ratios.setdefault(index, 0)
        if layer.kind == "dsv4_attention":
            ratios[index] = layer.index_kpool
            kv_sources.append(index)
        elif layer.kind == "dsv4_indexer":
            index_sources.append(index)
        elif layer.kind == "dsv4_swa":
            windows = {layer.sliding_window}
    num_layers = max(ratios) + 1
    text = dict(hidden_size=1024, num_attention_heads=64, o_groups=8, q_lora_rank=1024, o_lora_rank=1024, head_dim=512,
                qk_rope_head_dim=64, sliding_window=windows.pop(), rms_norm_eps=1e-6,
                max_position_embeddings=case.max_model_len, rope_theta=10000.0, compress_rope_theta=160000.0,
                rope_scaling={"rope_type": "default"}, index_topk=512, index_n_heads=64, index_head_dim=128,
                num_nextn_predict_layers=0, num_hidden_layers=num_layers,
                compress_ratios=[ratios.get(i, 0) for i in range(num_layers)], kv_source_layer_ids=kv_sources,
                index_source_layer_ids=index_sources)
    return DeepseekV41Config(text_config=text)


class ModelConfigStandIn:
    """The few ``ModelConfig`` answers the driven code reads (no HF config on disk).

    - ``dtype``: the model dtype ("auto" caches use it).
    - ``get_num_attention_heads`` / ``get_num_kv_heads``: FlashInfer's
      ``get_supported_kernel_block_sizes`` offers TRT-LLM page sizes only for GQA
      models on SM100. A case carries no query-head count; like the reference
      (which assumes GQA), the stand-in reports 4 query heads per KV head.
    - ``use_mla``: NIXL/Mooncake drop their LBHNC preference for MLA models.
    - ``hf_text_config`` (no ``attn_logit_softcapping``), ``is_mm_prefix_lm``,
      ``rswa_window``: FA4's hd256 fallback checks (``_fa4_hd256_fallback_reason``).
    - ``hf_config.sparse_attention_config``: MiniMax M3's indexer builder reads its index-query
      head count there (queries only, not the layout).
    - ``hf_text_config.index_topk`` for a case with DeepSeek V3.2 indexer caches: sparse MLA, as
      ``PCPManager.validate_config`` tells it.
    """

    supports_kv_cache_grouping = False
    is_mm_prefix_lm = False
    rswa_window = None
    # What VllmConfig._get_v1_model_runner_unsupported_features reads (asked under PCP): not a
    # diffusion model, no architecture of its own (negotiate_hybrid_block_size sets one for a
    # hybrid's model class).
    is_diffusion = False
    architecture: str | None = None

    def __init__(self, case, torch_dtype) -> None:
        targets = [l for l in case.layers if not l.is_draft and l.kind != "mamba"]
        # The model's attention geometry (its config's heads and head size, which FlashAttention's FA4 hd256 check
        # reads as the model's): the first layer of the model's own attention, not a side cache its layer class
        # registers first (an indexer's keys, a QSA ring, Inkling's short-conv state), unless it has nothing else.
        main = [l for l in targets if l.kind not in LAYER_OWN_BACKENDS]
        first = (main or targets)[0] if targets else None
        self.dtype = torch_dtype
        self.use_mla = any(l.kind in ("mla", "sliding_window_mla") for l in targets)
        self.max_model_len = case.max_model_len
        self.original_max_model_len = case.max_model_len
        self._kv_heads = 1 if first is None or self.use_mla else first.num_kv_heads
        self._head_size = first.head_size if first is not None else 128
        self.is_hybrid = any(l.kind == "mamba" for l in case.layers)
        self.is_attention_free = False
        self.hf_text_config = SimpleNamespace()
        if self.use_mla and first is not None:
            # The MLA geometry the layers are built with (runners._build_layer), which the MLA
            # builders of releases to 0.28 read off the model's text config.
            from gpu_impl.vllm_cpu.runners import MLA_NOPE_DIM, MLA_ROPE_DIM

            self.hf_text_config = SimpleNamespace(kv_lora_rank=first.head_size - MLA_ROPE_DIM,
                                                  qk_rope_head_dim=MLA_ROPE_DIM, qk_nope_head_dim=MLA_NOPE_DIM,
                                                  v_head_dim=MLA_NOPE_DIM)
            if any(l.kind == "mla_indexer" for l in targets):
                # A sparse-MLA model (DeepSeek V3.2's config carries index_topk 2048): MRv2's
                # PCPManager.validate_config tells sparse MLA from dense by this attribute alone.
                self.hf_text_config.index_topk = 2048
        self.hf_config = SimpleNamespace(model_type="kvconform-case")
        if any(l.kind == "minimax_indexer" for l in case.layers):
            # MiniMax M3's indexer metadata builder reads its index-query head count off the model's
            # sparse_attention_config: queries only (the cache keeps one key vector per token), so any
            # count the TP size divides; the case does not carry one.
            self.hf_config.sparse_attention_config = {"sparse_num_index_heads": 4 * max(case.tensor_parallel_size, 1)}
        if any(l.kind in DSV4_KINDS for l in case.layers):
            self.use_mla = True  # DeepSeek V4 is an MLA model (its caches hold latent records)
            self.hf_config = self.hf_text_config = _deepseek_v4_text_config(case)
        if any(l.family == "deepseek_v41" for l in case.layers):
            self.hf_config = self.hf_text_config = _deepseek_v41_config(case)
            self.model_type = "deepseek_v41"
        self.architectures: list[str] = []  # no model class (0.22's init_model_state looks for Whisper)
        if any(l.family == "step5" for l in case.layers):
            # Step5's DSA layers are a Step5 checkpoint's: the architecture VllmConfig's MRv1 validation refuses
            # (_get_v1_model_runner_unsupported_features).
            self.architecture = "Step5ForCausalLM"
        # The state layer whose page is largest: what a hybrid model class reports for its
        # mixers (one shape for every Mamba layer of a real model).
        states = [l for l in case.layers if l.kind == "mamba"]
        self._state_layer = max(states, key=_state_bytes) if states else None
        # A model of vLLM's own mixer layers: its config is the family's (what the mixer and the
        # family's model class read), its state the family model class's answer.
        from gpu_impl.vllm_cpu import mixers

        self.state_mixers = mixers.case_mixers(case)
        """The case's mixers (``mixers.case_mixers``): what its family's config and model class are made for."""
        if self.state_mixers:
            self.hf_config = self.hf_text_config = mixers.hf_config(self.state_mixers)
        self.is_encoder_decoder = any(l.kind == "cross" for l in case.layers)

    def __getattr__(self, name: str):
        # Everything the case does not decide reads as a default ModelConfig's field
        # (enable_prompt_embeds, logits_processors, ...); unknown names stay errors.
        default = _model_config_defaults().get(name, _NO_DEFAULT)
        if default is _NO_DEFAULT:
            raise AttributeError(f"{type(self).__name__} has no {name!r} (the case does not describe it)")
        return default

    def get_num_attention_heads(self, parallel_config=None) -> int:
        return 4 * self._kv_heads

    def get_num_kv_heads(self, parallel_config=None) -> int:
        return self._kv_heads

    def get_head_size(self) -> int:
        return self._head_size

    # What ModelState and the runner's input buffers read (sizes only: never computed with).
    uses_mrope = False
    uses_xdrope_dim = 0
    is_multimodal_model = False
    supports_multimodal_inputs = False

    def get_hidden_size(self) -> int:
        return 64

    def get_inputs_embeds_size(self) -> int:
        return 64

    def get_mamba_chunk_size(self) -> int:
        return 256  # Mamba-2's chunk size (its metadata builder sizes chunk buffers with it)

    def get_vocab_size(self) -> int:
        return 256  # sizes InputBatch's token buffers only

    def mixer_model_class(self) -> Any:
        """The model class of the case's mixer family (None for stand-in state layers)."""
        if not self.state_mixers:
            return None
        from gpu_impl.vllm_cpu import mixers

        return mixers.model_class(self.state_mixers)

    def state_shapes_and_dtypes(self) -> tuple[tuple[tuple[int, ...], ...], tuple[Any, ...]]:
        """The case's Mamba state (shapes, torch dtypes), as its model class reports them."""
        import torch

        layer = self._state_layer
        if layer is None:
            return (), ()
        dtypes = layer.mamba_dtypes or ("bfloat16",) * len(layer.mamba_shapes)
        return tuple(tuple(s) for s in layer.mamba_shapes), tuple(getattr(torch, d) for d in dtypes)


def negotiate_hybrid_block_size(vc: Any) -> None:
    """The release's own block-size negotiation of a hybrid (attention + Mamba) model, as engine
    start-up runs it once the layers exist: from 0.20 ``Platform.update_block_size_for_backend``
    (``_align_hybrid_block_size``: the first non-SSM layer's backend, the model class's state);
    0.19 ``HybridAttentionMambaModelConfig.verify_and_update_config``. Either may raise the
    attention block size, even a user-given one, and sets ``mamba_page_size_padded``."""
    from vllm.platforms.interface import Platform

    architecture = register_hybrid_model_class()
    if hasattr(vc.model_config.mixer_model_class(), "get_mamba_specs_from_config"):
        architecture = MULTI_STATE_HYBRID_ARCHITECTURE
    vc.model_config.architecture = architecture
    vc.model_config.architectures = [architecture]
    if hasattr(Platform, "_align_hybrid_block_size"):
        Platform.update_block_size_for_backend(vc)
    else:
        from vllm.model_executor.models.config import HybridAttentionMambaModelConfig

        HybridAttentionMambaModelConfig.verify_and_update_config(vc)


def _state_bytes(layer) -> int:
    import math

    import torch

    dtypes = layer.mamba_dtypes or ("bfloat16",) * len(layer.mamba_shapes)
    return sum(math.prod(s) * getattr(torch, d).itemsize for s, d in zip(layer.mamba_shapes, dtypes))


HYBRID_ARCHITECTURE = "KvconformCaseHybridForCausalLM"
"""The architecture name under which ``hybrid_model_class`` is registered with vLLM's ModelRegistry."""
MULTI_STATE_HYBRID_ARCHITECTURE = "KvconformCaseMultiStateHybridForCausalLM"
"""The same, for a model whose family class reports several state layouts (``get_mamba_specs_from_config``)."""


def register_hybrid_model_class() -> str:
    """Register, once per process, the model class a hybrid case's config names, and return its
    architecture. A release's block-size negotiation (``Platform._align_hybrid_block_size``,
    0.19's ``HybridAttentionMambaModelConfig``) resolves the model class through
    ``ModelRegistry`` and asks it for the Mamba state's shapes and dtypes: a model fact, which
    the stand-in answers from the case (``ModelConfigStandIn.state_shapes_and_dtypes``); the
    negotiation itself is the release's."""
    global _REGISTERED
    if not _REGISTERED:
        from torch import nn
        from vllm.model_executor.models import ModelRegistry

        class KvconformCaseHybridForCausalLM(nn.Module):
            """A hybrid (attention + Mamba) model as far as the block-size negotiation asks."""

            is_hybrid = True

            @classmethod
            def get_mamba_state_shape_from_config(cls, vllm_config):
                family = vllm_config.model_config.mixer_model_class()
                if family is not None:  # the family's own model class answers for its mixers
                    return family.get_mamba_state_shape_from_config(vllm_config)
                return vllm_config.model_config.state_shapes_and_dtypes()[0]

            @classmethod
            def get_mamba_state_dtype_from_config(cls, vllm_config):
                family = vllm_config.model_config.mixer_model_class()
                if family is not None:
                    return family.get_mamba_state_dtype_from_config(vllm_config)
                return vllm_config.model_config.state_shapes_and_dtypes()[1]

            def embed_input_ids(self, input_ids):  # the registry inspects for it; never called
                raise NotImplementedError

        class KvconformCaseMultiStateHybridForCausalLM(KvconformCaseHybridForCausalLM):
            """A hybrid model of two state layouts (Qwen4-exp's GDN and PLE states): the negotiation asks its
            ``get_mamba_specs_from_config`` (it checks for the method on the class) and takes the larger page."""

            @classmethod
            def get_mamba_specs_from_config(cls, vllm_config):
                return vllm_config.model_config.mixer_model_class().get_mamba_specs_from_config(vllm_config)

        ModelRegistry.register_model(HYBRID_ARCHITECTURE, KvconformCaseHybridForCausalLM)
        ModelRegistry.register_model(MULTI_STATE_HYBRID_ARCHITECTURE, KvconformCaseMultiStateHybridForCausalLM)
        _REGISTERED = True
    return HYBRID_ARCHITECTURE


_REGISTERED = False


__all__ = ["HYBRID_ARCHITECTURE", "MULTI_STATE_HYBRID_ARCHITECTURE", "ModelConfigStandIn", "negotiate_hybrid_block_size", "register_hybrid_model_class"]
