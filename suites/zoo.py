"""A model zoo: real Hugging Face ``config.json`` files turned into reference cases.

``suites/zoo/*.json`` are the config files of real architectures, as published on the
Hub (no weights; nothing is downloaded). ``load_zoo()`` reads them and ``to_case()``
turns one into a ``reference.config.CaseConfig`` the way the target release's model code
would build its attention layers from it on one rank (``tensor_parallel_size``, default 1):

- layer names as vLLM registers them (``model.layers.{i}.self_attn.attn``, Qwen3-Next's
  ``model.layers.{i}.linear_attn``, Whisper's ``.decoder.layers.{i}.encoder_attn.attn``, leading dot included);
- which layers slide, following ``vllm/engine/arg_utils.py: create_engine_config``
  (``CacheConfig.sliding_window`` is the model-wide window only when the config has no
  ``layer_types`` or all of them slide) and the per-model code (``per_layer_sliding_window``);
  ``layer_types`` defaults are transformers' (Gemma 3: 5 local then 1 global; Gemma 2 and
  GPT-OSS: alternating, local first; Qwen2/3: ``use_sliding_window`` and ``max_window_layers``);
- MLA (DeepSeek-V3, V3.2): one 576-wide latent head (``kv_lora_rank + qk_rope_head_dim``); V3.2 adds
  each layer's sparse-attention indexer K cache (``DeepseekV32IndexerCache``);
- Mamba-like state layers: the family's mixer (``StateMixer``: Qwen3-Next's Gated DeltaNet, Nemotron-H's
  Mamba-2) with the config's geometry, built by the drivers as vLLM's own class, its state predicted
  by ``reference.state_mixers``;
- speculative drafts (DeepSeek MTP, an Eagle3 head) as ``is_draft`` layers named after the
  target's last layer (``mtp_start_layer_idx`` / ``start_layer_id = num_hidden_layers``).

Whatever is approximated is recorded in ``ZooModel.approximations``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

from reference.backends import get_backend
from reference.config import FAMILY_BACKENDS, LAYER_OWN_BACKENDS, STATE_MIXERS, CaseConfig, LayerConfig, StateMixer, indexer_k_cache_bytes
from reference.errors import ConfigError, NotModeledError
from reference.parallel import ModelHeads, check_parallel, per_rank_kv_heads

ZOO_DIR = Path(__file__).with_name("zoo")

# Draft heads and the target each one speculates for (file stems).
DRAFT_TARGETS = {"eagle3-llama3.1-8b": "llama3-8b", "eagle3-deepseek-v3": "deepseek-v3"}

# Where a file is not the Hub's config.json byte for byte (no network here: each came from a copy
# found in public repositories), what it is, by file stem.
PROVENANCE: dict[str, str] = {
    "gemma4-e2b": (
        "config.json reconstructed, not fetched (no network here): transformers 5.20.2's Gemma4Config "
        "defaults, which its docstring gives as similar to google/gemma-4-e2b-it; the vision and audio "
        "configs left out"),
    "gemma4-31b-it": (
        "google/gemma-4-31B-it's config as transformers 5.7 prints it (Gemma4Config repr, keys sorted), "
        "not the raw file: its text_config is the Hub's, its vision_config carries loader-added keys"),
    "deepseek-v3.2": "deepseek-ai/DeepSeek-V3.2's config.json, from a repository vendoring Hub configs",
    "kimi-k3": (
        "moonshotai/Kimi-K3's config.json, transcribed from a published dump (7006 bytes, the official "
        "file's size)"),
    "minimax-m3": "MiniMaxAI/MiniMax-M3's config.json, two independent copies agreeing",
    "qwen3.6-35b-a3b": (
        "Qwen/Qwen3.6-35B-A3B's config.json, from a repository vendoring Hub configs; the nearest public config "
        "to Qwen4-exp (whose own is not public): the same Gated DeltaNet + full attention 3:1 layer style"),
    "deepseek-v4-flash": (
        "deepseek-ai/DeepSeek-V4-Flash-0731's config.json (revision 7872f01b), as a public repository embeds it with its "
        "size (1,888 bytes) and sha256, which this copy matches; the dated re-release of DeepSeek-V4-Flash, whose "
        "decoder layers 0-42 have the same compression pattern (it adds DSpark draft-head keys)"),
    "eagle3-deepseek-v3": (
        "the Eagle3 draft config SpecForge trains for DeepSeek-V3 (sgl-project/SpecForge "
        "configs/deepseek-v3-671b-eagle3.json), not a particular Hub repository's"),
}

# An attention backend's MLA sibling, for MLA models given a plain backend name.
MLA_BACKEND_FOR = {
    "FLASH_ATTN": "FLASH_ATTN_MLA",
    "FLASHINFER": "FLASHINFER_MLA",
    "TRITON_ATTN": "TRITON_MLA",
    "CPU_ATTN": "CPU_MLA",
}

_DECODER_ONLY = {
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "granite",
    "phi3",
    "gemma2",
    "gemma3",
    "gemma3_text",
    "gemma4",
    "gemma4_text",
    "gpt_oss",
}
_GDN_HYBRIDS = {"qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"}
"""Qwen's Gated DeltaNet hybrids: Qwen3-Next and Qwen3.5/3.6 (``QwenGatedDeltaNetAttention`` + full attention)."""
_SUPPORTED = _DECODER_ONLY | _GDN_HYBRIDS | {"deepseek_v3", "deepseek_v32", "deepseek_v4", "nemotron_h", "whisper",
                                            "kimi_linear", "minimax_m3_vl"}
_DEEPSEEK_MLA = {"deepseek_v3", "deepseek_v32"}
_MLA_MODELS = _DEEPSEEK_MLA | {"kimi_linear", "deepseek_v4"}
OWN_BLOCK_SIZE = {"deepseek_v4": 256}
"""Models served at one block size whatever is asked (``to_case(block_size=...)`` is replaced by it): DeepSeek V4's
packed caches take only --block-size 256 (its FlashMLA and indexer kernels' block; 128 finds no kernel block, 512
cannot be split in a packed block); the named cases dsv4-b128-refused and dsv4-b512-refused hold the refusals."""

# vLLM's _get_and_verify_dtype: float32 checkpoints are served in the platform's half
# dtype (bfloat16 on SM80+) unless --dtype says otherwise.
_MODEL_DTYPE = {"float32": "bfloat16", "float16": "float16", "bfloat16": "bfloat16", None: "bfloat16"}


@dataclass(frozen=True)
class ZooModel:
    """One architecture of the zoo: its HF config (and draft config) plus what is approximated."""

    name: str
    """The file stem (``llama3-8b``); a draft pair is ``<target>+<draft>``."""
    path: Path
    config: Mapping[str, Any]
    draft_config: Mapping[str, Any] | None = None
    draft_path: Path | None = None
    approximations: tuple[str, ...] = ()

    @property
    def text_config(self) -> Mapping[str, Any]:
        """``hf_text_config``: the nested ``text_config`` of multimodal wrappers."""
        return self.config.get("text_config") or self.config

    @property
    def model_type(self) -> str:
        return self.text_config.get("model_type") or self.config["model_type"]

    @property
    def architecture(self) -> str:
        return self.config["architectures"][0]

    @property
    def model_dtype(self) -> str:
        # transformers 5 writes "dtype" where older releases wrote "torch_dtype".
        dtype = (self.config.get("torch_dtype") or self.text_config.get("torch_dtype") or self.config.get("dtype")
                 or self.text_config.get("dtype"))
        return _MODEL_DTYPE.get(dtype, "bfloat16")

    @property
    def is_mla(self) -> bool:
        return self.model_type in _MLA_MODELS


def _read(path: Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    if not isinstance(data, dict) or "architectures" not in data or "model_type" not in data:
        raise ConfigError(f"{path}: not a Hugging Face config.json (needs 'architectures' and 'model_type')")
    return data


def _approximations(model_type: str, cfg: Mapping[str, Any], draft: Mapping[str, Any] | None) -> tuple[str, ...]:
    notes: list[str] = []
    if model_type == "deepseek_v3":
        notes.append(
            "MLA latent cache modeled as one 576-wide head (kv_lora_rank 512 + qk_rope_head_dim 64); "
            "the MTP layer is a draft of the same MLA kind under the target's backend"
        )
        notes.append("no sparse indexer (DeepSeek-V3.2's DSA is not part of V3)")
    if model_type == "deepseek_v32":
        notes.append(
            "MLA latent cache modeled as one 576-wide head under a dense MLA backend (the sparse-MLA "
            "backends and their spec fields, topk_buffer_width, are not modeled); each layer's indexer "
            "K cache is the mla_indexer kind (DeepseekV32IndexerCache, 132 uint8 per token)"
        )
    if model_type == "deepseek_v4":
        notes.append(
            "DeepSeek V4's caches per decoder layer, from compress_ratios (or layer_types and compress_rates) cut to "
            "num_hidden_layers: a 64-token SWA cache on every layer; on compressed layers the compressed attention cache "
            "and its compressor's fp32 state; on ratio-4 layers the indexer's key cache and its compressor's state "
            "(suites.named_cases.deepseek_v4_caches), in the fp8_ds_mla format of the FlashMLA path (the backend asked for "
            "is not used: each cache names its own), at --block-size 256 (OWN_BLOCK_SIZE); the MTP layer is not loaded "
            "(no draft)"
        )
    if model_type == "gpt_oss":
        notes.append(
            "attention sinks change compute only (Attention(..., sinks=...) keeps the plain "
            "FullAttentionSpec/SlidingWindowSpec); whether the chosen backend supports sinks is not checked"
        )
        notes.append("MXFP4 MoE weights do not touch the KV cache")
    if model_type == "gemma2":
        notes.append("attn_logit_softcapping 50.0 narrows vLLM's backend choice; the backend is taken as given")
        notes.append("config torch_dtype float32 is served as bfloat16 (vLLM's float32 downcast)")
    if model_type in ("gemma3", "gemma3_text"):
        notes.append(
            "only the text decoder (text_config), named language_model.model.layers.{i}.self_attn.attn "
            "as Gemma3ForConditionalGeneration registers it; the SigLIP vision tower has no KV cache"
        )
    if model_type in ("gemma4", "gemma4_text"):
        notes.append(
            "only the text decoder (text_config), named language_model.model.layers.{i}.self_attn.attn "
            "as Gemma4ForConditionalGeneration registers it; the vision and audio towers have no KV cache"
        )
        notes.append(
            "attention_k_eq_v reuses K as V in compute only: Gemma4Attention's Attention keeps both K and V "
            "slots, so the spec is the plain FullAttentionSpec/SlidingWindowSpec"
        )
    if model_type == "qwen3_next":
        notes.append(
            "Gated DeltaNet layers as QwenGatedDeltaNetAttention mixers on GDN_ATTN, conv state in the default "
            "'SD' layout, mamba_cache_dtype/mamba_ssm_cache_dtype 'auto' (model dtype), no speculative slots"
        )
    if model_type in ("qwen3_5_text", "qwen3_5_moe_text"):
        notes.append(
            "only the text decoder (text_config), named language_model.model.layers.{i}.(linear_attn|self_attn.attn); "
            "Gated DeltaNet layers as QwenGatedDeltaNetAttention mixers on GDN_ATTN (conv state in the default 'SD' "
            "layout, no speculative slots), the SSM state in the config's mamba_ssm_dtype "
            "(Qwen3_5ForConditionalGenerationConfig.verify_and_update_config); the MTP layer is not modeled as a draft"
        )
    if model_type == "nemotron_h":
        notes.append(
            "Mamba2 layers as MambaMixer2 mixers on MAMBA2_ATTN (conv state in the default 'SD' layout, no "
            "speculative slots, no ReplaySSM ring); the SSM state is float32: "
            "NemotronHForCausalLMConfig.update_mamba_ssm_cache_dtype defaults 'auto' to float32"
        )
        notes.append("MLP ('-') layers have no cache")
    if model_type == "whisper":
        notes.append("encoder self-attention is encoder-only (no KV cache spec) and is left out")
        notes.append("decoder cross-attention layers are kind 'cross' (CrossAttentionSpec)")
        notes.append(
            "layer names start with '.' like vLLM's (whisper.py: WhisperModel(prefix=prefix) with prefix '' "
            "then f'{prefix}.decoder')"
        )
    if model_type == "phi3" and cfg.get("sliding_window"):
        notes.append(
            f"no layer_types: CacheConfig.sliding_window={cfg['sliding_window']} applies to every layer "
            "(vllm/engine/arg_utils.py create_engine_config)"
        )
    if model_type == "kimi_linear":
        notes.append(
            "only the text decoder (text_config), named language_model.model.layers.{i}.self_attn as "
            "KimiK3ForConditionalGeneration registers it; KDA layers (linear_attn_config.kda_layers, 1-based) are "
            "KimiK3DeltaAttention mixers on KIMI_K3_KDA, the others MLA"
        )
        notes.append(
            "Kimi K3's own MultiHeadLatentAttention (NoPE MLA, 576-wide latent) is built as vLLM's MLAAttention: "
            "the same MLAAttentionSpec page (its max_tp_shards and non-causal decode flags are not modeled)"
        )
    if model_type == "minimax_m3_vl":
        notes.append(
            "only the text decoder (text_config), named language_model.model.layers.{i}.self_attn.attn; layers with "
            "sparse_attention_freq set also keep the lightning indexer's key cache (MiniMaxM3IndexerCache, "
            "kind minimax_indexer, sparse_index_dim wide)"
        )
        notes.append(
            "sparse layers are built as MiniMaxM3SparseAttention (family minimax_m3, on the MINIMAX_M3_SPARSE backend it "
            "picks: the backend asked for serves the dense layers only); the MTP modules are not modeled as drafts"
        )
    if draft is not None:
        notes.append(
            "Eagle3 draft: one decoder layer named model.layers.{num_hidden_layers + i}.self_attn.attn "
            "under the target's backend (beside an MLA target: the plain sibling of the given backend, else "
            "FLASH_ATTN); its own torch_dtype is replaced by the target's (SpeculativeConfig); an MLA target's "
            "MTP layers are not loaded"
        )
    return tuple(notes)


def load_zoo(directory: Path | str | None = None) -> dict[str, ZooModel]:
    """Every zoo architecture by name; a draft file adds a ``<target>+<draft>`` entry."""
    root = Path(directory) if directory is not None else ZOO_DIR
    files = {p.stem: p for p in sorted(root.glob("*.json"))}
    if not files:
        raise ConfigError(f"no *.json config files in {root}")
    zoo: dict[str, ZooModel] = {}
    for stem, path in files.items():
        cfg = _read(path)
        if stem in DRAFT_TARGETS:
            target = DRAFT_TARGETS[stem]
            if target not in files:
                raise ConfigError(f"{path}: draft for {target!r}, which is not in the zoo")
            tcfg = _read(files[target])
            name = f"{target}+{stem}"
            zoo[name] = _model(name, files[target], tcfg, draft=cfg, draft_path=path)
            continue
        zoo[stem] = _model(stem, path, cfg)
    return zoo


def _model(name: str, path: Path, cfg: dict[str, Any], *, draft: dict | None = None, draft_path: Path | None = None) -> ZooModel:
    text = cfg.get("text_config") or cfg
    model_type = text.get("model_type") or cfg["model_type"]
    if model_type not in _SUPPORTED:
        raise ConfigError(f"{path}: model_type {model_type!r} is not one the zoo converts ({', '.join(sorted(_SUPPORTED))})")
    return ZooModel(
        name=name,
        path=path,
        config=cfg,
        draft_config=draft,
        draft_path=draft_path,
        approximations=_approximations(model_type, text, draft) + tuple(
            PROVENANCE[p.stem] for p in (path, draft_path) if p is not None and p.stem in PROVENANCE),
    )


# --- the conversion ---------------------------------------------------------------------


def layer_types(text: Mapping[str, Any], model_type: str | None = None) -> list[str] | None:
    """``hf_text_config.layer_types`` as transformers fills it in (None: the config has none)."""
    model_type = model_type or text.get("model_type")
    n = text["num_hidden_layers"]
    explicit = text.get("layer_types")
    if explicit is not None:
        if len(explicit) != n:
            raise ConfigError(f"layer_types has {len(explicit)} entries for {n} layers")
        return list(explicit)
    if model_type in ("gemma3", "gemma3_text"):
        pattern = text.get("sliding_window_pattern", 6)
        return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
    if model_type in ("gemma2", "gpt_oss"):
        return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
    if model_type in ("qwen2", "qwen3"):
        window = _sliding_window(text, model_type)
        start = text.get("max_window_layers", n)
        return ["sliding_attention" if window is not None and i >= start else "full_attention" for i in range(n)]
    if model_type in _GDN_HYBRIDS:
        interval = text.get("full_attention_interval", 4)
        return ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(n)]
    return None


def _sliding_window(text: Mapping[str, Any], model_type: str) -> int | None:
    """``hf_text_config.sliding_window`` after transformers (Qwen: only with use_sliding_window)."""
    window = text.get("sliding_window")
    if model_type in ("qwen2", "qwen3", "qwen3_moe", "qwen3_next") and not text.get("use_sliding_window", False):
        return None
    return window or None  # ModelConfig: a window of 0 disables sliding


def sliding_windows(text: Mapping[str, Any], model_type: str) -> list[int | None]:
    """Per decoder layer, the sliding window its Attention gets (None: full)."""
    n = text["num_hidden_layers"]
    window = _sliding_window(text, model_type)
    types = layer_types(text, model_type)
    if types is None or all(t == "sliding_attention" for t in types):
        # create_engine_config: CacheConfig.sliding_window is the model-wide window, which
        # every Attention without a per-layer window falls back to.
        return [window] * n
    if model_type == "gpt_oss":
        # OAIAttention._build_attention: layer_idx % 2 == 0 slides (whatever layer_types says).
        return [window if i % 2 == 0 else None for i in range(n)]
    return [window if t == "sliding_attention" else None for t in types]


def _head_dim(text: Mapping[str, Any], heads_key: str = "num_attention_heads", hidden_key: str = "hidden_size") -> int:
    return text.get("head_dim") or text[hidden_key] // text[heads_key]


def layer_geometry(text: Mapping[str, Any], model_type: str, index: int) -> tuple[int, int]:
    """(total KV heads, head size) of decoder layer ``index`` as the model code reads them.

    Gemma 4 (``Gemma4DecoderLayer``: ``config.per_layer_config[layer_idx]``) gives its
    full-attention layers their own head size and, with ``attention_k_eq_v``, their own KV
    heads: an explicit ``per_layer_config`` (what transformers writes), else what
    ``Gemma4TextConfig.__post_init__`` fills in from ``global_head_dim`` (default 512) and
    ``num_global_key_value_heads``. Every other model: one geometry for all layers.
    """
    kv_heads = text.get("num_key_value_heads") or text["num_attention_heads"]
    head_size = _head_dim(text)
    if model_type not in ("gemma4", "gemma4_text"):
        return kv_heads, head_size
    overrides = text.get("per_layer_config")
    if overrides is None:
        types = layer_types(text, model_type) or []
        override: dict[str, Any] = {"head_dim": text.get("global_head_dim", 512)}
        if text.get("attention_k_eq_v", True) and text.get("num_global_key_value_heads") is not None:
            override["num_key_value_heads"] = text["num_global_key_value_heads"]
        overrides = {i: override for i, t in enumerate(types) if t == "full_attention"}
    # JSON keys are strings ("05", as transformers writes them), in-memory ones ints.
    own = {int(k): v for k, v in overrides.items()}.get(index, {})
    return own.get("num_key_value_heads", kv_heads), own.get("head_dim", head_size)


def _attention_backend(backend: str, *, mla: bool) -> str:
    info = get_backend(backend)
    if mla:
        if info.is_mla:
            return backend
        if backend in MLA_BACKEND_FOR:
            return MLA_BACKEND_FOR[backend]
        raise ConfigError(f"backend {backend} has no MLA sibling; pass an MLA backend ({', '.join(MLA_BACKEND_FOR.values())})")
    if info.is_mla or info.is_ssm:
        raise ConfigError(f"backend {backend} cannot run this model's (non-MLA) attention layers")
    return backend


def kimi_kda_layers(text: Mapping[str, Any]) -> set[int]:
    """Kimi K3's KDA layers, 0-based (``KimiLinearConfig.is_kda_layer``: ``layer_idx + 1`` in
    ``linear_attn_config.kda_layers``)."""
    linear = text.get("linear_attn_config") or {}
    return {i - 1 for i in linear.get("kda_layers", ())}


def deepseek_v4_compress_ratios(text: Mapping[str, Any]) -> list[int]:
    """Each decoder layer's compress ratio (0: sliding window only), as vLLM's ``get_compress_ratios`` reads a V4
    config (``compress_ratios``, else ``compress_rates`` of each ``layer_types`` entry), cut to the decoder layers
    (``DeepseekV4Attention``: layers past num_hidden_layers are MTP layers)."""
    ratios = text.get("compress_ratios")
    if ratios is None:
        rates = text.get("compress_rates") or {}
        ratios = [rates.get(t, 0) for t in text["layer_types"]]
    n = text["num_hidden_layers"]
    if len(ratios) < n:
        raise ConfigError(f"compress_ratios has {len(ratios)} entries; expected at least num_hidden_layers {n}")
    return [int(r) for r in ratios[:n]]


def minimax_sparse_layers(text: Mapping[str, Any]) -> set[int]:
    """MiniMax M3's layers with a sparse index branch (``_sparse_attention_layer_ids``)."""
    freq = (text.get("sparse_attention_config") or {}).get("sparse_attention_freq") or ()
    return {i for i, f in enumerate(freq) if f != 0}


def _draft_backend(backend: str) -> str:
    """A GQA draft's backend beside an MLA target: the plain sibling of the given backend, else
    FLASH_ATTN (vLLM auto-selects the draft's; FLASH_ATTN is SM90's first choice)."""
    if not get_backend(backend).is_mla:
        return _attention_backend(backend, mla=False)
    plain = {mla: base for base, mla in MLA_BACKEND_FOR.items()}
    return plain.get(backend, "FLASH_ATTN")


def _state_mixer(text: Mapping[str, Any], model_type: str) -> StateMixer:
    """The family's state layer as vLLM's own mixer class builds it from this config (its state is
    the class's, predicted by ``reference.state_mixers``)."""
    if model_type in _GDN_HYBRIDS:
        # Qwen3NextGatedDeltaNet / Qwen3_5DecoderLayer -> QwenGatedDeltaNetAttention (model_executor/models/
        # qwen3_next.py, qwen3_5.py)
        return StateMixer("gated_delta_net", num_heads=text["linear_num_value_heads"],
                          head_dim=text["linear_value_head_dim"], num_k_heads=text["linear_num_key_heads"],
                          head_k_dim=text["linear_key_head_dim"], conv_kernel=text["linear_conv_kernel_dim"])
    if model_type == "nemotron_h":
        # NemotronHMambaDecoderLayer -> MambaMixer2 (model_executor/models/nemotron_h.py)
        return StateMixer("mamba2", num_heads=text["mamba_num_heads"], head_dim=text["mamba_head_dim"],
                          n_groups=text["n_groups"], state_size=text["ssm_state_size"], conv_kernel=text["conv_kernel"])
    if model_type == "kimi_linear":
        # KimiDecoderLayer -> KimiK3DeltaAttention (models/kimi_k3/nvidia/model.py, use_full_rank_gate)
        linear = text["linear_attn_config"]
        return StateMixer("kimi_k3_kda", num_heads=linear["num_heads"], head_dim=linear["head_dim"],
                          conv_kernel=linear.get("short_conv_kernel_size", 4))
    raise ConfigError(f"no state layers for model_type {model_type!r}")


def _mamba_layer(name: str, text: Mapping[str, Any], model_type: str) -> LayerConfig:
    mixer = _state_mixer(text, model_type)
    return LayerConfig(name, kind="mamba", backend=STATE_MIXERS[mixer.kind][0], mixer=mixer)


def _mamba_ssm_cache_dtype(model: "ZooModel") -> str:
    """``--mamba-ssm-cache-dtype`` as the model's config leaves it: NemotronHForCausalLMConfig's
    ``update_mamba_ssm_cache_dtype`` makes 'auto' float32 (its config's ``mamba_ssm_cache_dtype``)."""
    if model.model_type == "nemotron_h":
        return model.text_config.get("mamba_ssm_cache_dtype", "float32")
    if model.model_type in ("qwen3_5_text", "qwen3_5_moe_text"):
        # Qwen3_5ForConditionalGenerationConfig.verify_and_update_config: 'auto' -> the config's mamba_ssm_dtype.
        return model.text_config.get("mamba_ssm_dtype") or "auto"
    return "auto"


def model_heads(model: ZooModel) -> ModelHeads:
    """The target's head totals, as vLLM's ``ModelArchitectureConfig`` reads them."""
    text = model.text_config
    if model.model_type == "whisper":
        q = text["decoder_attention_heads"]
        return ModelHeads(total_kv_heads=q, total_attention_heads=q)
    q = text["num_attention_heads"]
    return ModelHeads(total_kv_heads=text.get("num_key_value_heads") or q, total_attention_heads=q, use_mla=model.is_mla)


def _layers(model: ZooModel, backend: str, cache_dtype: str, tp: int = 1) -> list[LayerConfig]:
    text = model.text_config
    mt = model.model_type
    n = text.get("num_hidden_layers")
    layers: list[LayerConfig] = []
    kv_per_rank = per_rank_kv_heads(model_heads(model), tp)

    def attention(name: str, attn: str, window: int | None = None, index: int | None = None) -> LayerConfig:
        """A text-model attention layer at this rank's KV heads (sliding where it has a window);
        ``index``: a decoder layer whose geometry may be its own (``layer_geometry``)."""
        kv_heads, head_size = kv_per_rank, _head_dim(text)
        if index is not None:
            total_kv, head_size = layer_geometry(text, mt, index)
            kv_heads = per_rank_kv_heads(ModelHeads(total_kv, text["num_attention_heads"]), tp)
        return LayerConfig(
            name,
            kind="sliding_window" if window else "full",
            backend=attn,
            num_kv_heads=kv_heads,
            head_size=head_size,
            cache_dtype=cache_dtype,
            sliding_window=window,
        )

    if mt in _DECODER_ONLY:
        attn = _attention_backend(backend, mla=False)
        # Multimodal wrappers build the text model under "language_model" (gemma3_mm.py:
        # init_vllm_registered_model(prefix="language_model") -> Gemma3ForCausalLM's "model").
        prefix = "language_model.model" if "text_config" in model.config else "model"
        if text.get("num_kv_shared_layers"):
            # Gemma4Attention: the last num_kv_shared_layers layers read an earlier layer's cache
            # (Attention(kv_sharing_target_layer_name=...)), which the reference does not model.
            raise NotModeledError(
                f"num_kv_shared_layers {text['num_kv_shared_layers']}: layers sharing another layer's KV cache "
                "(kv_sharing_target_layer_name) are not modeled yet")
        for i, window in enumerate(sliding_windows(text, mt)):
            layers.append(attention(f"{prefix}.layers.{i}.self_attn.attn", attn, window, index=i))
    elif mt in _DEEPSEEK_MLA:
        mla = _attention_backend(backend, mla=True)
        width = text["kv_lora_rank"] + text["qk_rope_head_dim"]
        # The MTP layers are a draft only when MTP drafts: beside an Eagle3 head they are not loaded.
        total = n + (text.get("num_nextn_predict_layers", 0) if model.draft_config is None else 0)
        for i in range(total):
            layers.append(
                LayerConfig(
                    f"model.layers.{i}.self_attn.attn",
                    kind="mla",
                    backend=mla,
                    num_kv_heads=1,
                    head_size=width,
                    cache_dtype=cache_dtype,
                    is_draft=i >= n,
                )
            )
            if mt == "deepseek_v32":
                # DeepseekV2DecoderLayer builds an Indexer on every layer (index_topk_freq 1),
                # the MTP layer's too.
                layers.append(
                    LayerConfig(
                        f"model.layers.{i}.self_attn.indexer.k_cache",
                        kind="mla_indexer",
                        backend=LAYER_OWN_BACKENDS["mla_indexer"][0],
                        num_kv_heads=1,
                        head_size=indexer_k_cache_bytes(text["index_head_dim"]),
                        is_draft=i >= n,
                    )
                )
    elif mt == "deepseek_v4":
        from suites.named_cases import deepseek_v4_caches

        layers.extend(deepseek_v4_caches(deepseek_v4_compress_ratios(text), sliding_window=text["sliding_window"],
                                         head_dim=text["head_dim"], index_head_dim=text["index_head_dim"]))
    elif mt == "kimi_linear":
        mla = _attention_backend(backend, mla=True)
        kda = kimi_kda_layers(text)
        if not (text.get("linear_attn_config") or {}).get("use_full_rank_gate", False):
            raise NotModeledError("Kimi-Linear's KimiLinearGatedDeltaNetAttention (no use_full_rank_gate) is not modeled; "
                                  "Kimi K3's full-rank-gate KDA is")
        for i in range(n):
            name = f"language_model.model.layers.{i}.self_attn"
            if i in kda:
                layers.append(_mamba_layer(name, text, mt))
            else:
                layers.append(LayerConfig(name, kind="mla", backend=mla, num_kv_heads=1,
                                          head_size=text["kv_lora_rank"] + text["qk_rope_head_dim"],
                                          cache_dtype=cache_dtype,
                                          # Kimi K3's own MultiHeadLatentAttention; Kimi-Linear's is refused above.
                                          family="kimi_k3"))
    elif mt == "minimax_m3_vl":
        attn = _attention_backend(backend, mla=False)
        sparse = minimax_sparse_layers(text)
        index_dim = (text.get("sparse_attention_config") or {}).get("sparse_index_dim")
        for i in range(n):
            name = f"language_model.model.layers.{i}.self_attn.attn"
            if i in sparse:
                # MiniMaxM3SparseAttention (family minimax_m3): its indexer's key cache, registered first, then its
                # main cache on the backend it picks itself.
                layers.append(LayerConfig(f"{name}.index_cache", kind="minimax_indexer",
                                          backend=LAYER_OWN_BACKENDS["minimax_indexer"][0], head_size=index_dim))
                layers.append(replace(attention(name, attn), backend=FAMILY_BACKENDS["minimax_m3"], family="minimax_m3"))
            else:
                layers.append(attention(name, attn))
    elif mt in _GDN_HYBRIDS:
        attn = _attention_backend(backend, mla=False)
        prefix = "language_model.model" if "text_config" in model.config else "model"
        for i, t in enumerate(layer_types(text, mt)):
            if t == "full_attention":
                layers.append(attention(f"{prefix}.layers.{i}.self_attn.attn", attn))
            else:
                layers.append(_mamba_layer(f"{prefix}.layers.{i}.linear_attn", text, mt))
    elif mt == "nemotron_h":
        attn = _attention_backend(backend, mla=False)
        for i, t in enumerate(text["hybrid_override_pattern"]):
            if t == "*":
                layers.append(attention(f"model.layers.{i}.mixer.attn", attn, text.get("sliding_window")))
            elif t == "M":
                layers.append(_mamba_layer(f"model.layers.{i}.mixer", text, mt))
            elif t not in "-E":
                raise ConfigError(f"hybrid_override_pattern: unknown layer type {t!r} at layer {i}")
    elif mt == "whisper":
        attn = _attention_backend(backend, mla=False)
        heads = text["decoder_attention_heads"]
        hd = text["d_model"] // heads
        for i in range(text["decoder_layers"]):
            for sub, kind in (("self_attn", "full"), ("encoder_attn", "cross")):
                layers.append(
                    LayerConfig(
                        # WhisperForConditionalGeneration builds WhisperModel(prefix=prefix)
                        # with the top-level prefix "" and names it f"{prefix}.decoder": vLLM's
                        # layer names start with a dot.
                        f".decoder.layers.{i}.{sub}.attn",
                        kind=kind,
                        backend=attn,
                        num_kv_heads=kv_per_rank,
                        head_size=hd,
                        cache_dtype=cache_dtype,
                    )
                )
    else:  # pragma: no cover - load_zoo refuses it
        raise ConfigError(f"model_type {mt!r} is not converted")
    if model.draft_config is not None:
        draft = model.draft_config
        attn = _draft_backend(backend) if model.is_mla else _attention_backend(backend, mla=False)
        start = n  # llama_eagle3: start_layer_id = target num_hidden_layers
        for j in range(draft["num_hidden_layers"]):
            layers.append(
                LayerConfig(
                    f"model.layers.{start + j}.self_attn.attn",
                    backend=attn,
                    # The draft runs at the target's TP (draft_tensor_parallel_size's default).
                    num_kv_heads=per_rank_kv_heads(
                        ModelHeads(draft.get("num_key_value_heads") or draft["num_attention_heads"], draft["num_attention_heads"]),
                        tp,
                    ),
                    head_size=_head_dim(draft),
                    cache_dtype=cache_dtype,
                    is_draft=True,
                )
            )
    return layers


def hybrid_block_size(model: ZooModel, backend: str, block_size: int = 16) -> int:
    """The block size vLLM serves a hybrid (attention + state) model with: the reference's
    ``hybrid_block_size`` for the model's case (``update_block_size_for_backend``)."""
    from reference.derive import hybrid_block_size as negotiated

    return negotiated(to_case(model, block_size=block_size, backend=backend))[0]


def to_case(
    model: ZooModel,
    *,
    block_size: int,
    backend: str,
    layout: str | None = None,
    num_blocks: int | None = 16,
    cache_dtype: str = "auto",
    capability: tuple[int, int] = (9, 0),
    max_model_len: int = 4096,
    tensor_parallel_size: int = 1,
    decode_context_parallel_size: int = 1,
) -> CaseConfig:
    """The reference case vLLM would plan for ``model`` served with these options.

    ``backend`` is the attention backend (``--attention-backend``-like, but per layer); an
    MLA model given a plain backend runs its MLA sibling (``MLA_BACKEND_FOR``), and state
    layers always run their own state backend. Heads and state shapes are one TP rank's;
    a TP/DCP combination vLLM refuses raises ``ConfigError`` with vLLM's text.
    """
    check_parallel(model_heads(model), tensor_parallel_size, decode_context_parallel_size)
    block_size = OWN_BLOCK_SIZE.get(model.model_type, block_size)
    layers = _layers(model, backend, cache_dtype, tensor_parallel_size)
    name = f"zoo-{model.name}-{backend.lower()}-b{block_size}" + (f"-{layout.lower()}" if layout else "")
    if cache_dtype != "auto":
        name += f"-{cache_dtype}"
    if capability != (9, 0):
        name += f"-sm{capability[0]}{capability[1]}"
    if tensor_parallel_size > 1:
        name += f"-tp{tensor_parallel_size}"
    if decode_context_parallel_size > 1:
        name += f"-dcp{decode_context_parallel_size}"
    return CaseConfig(
        name,
        tuple(layers),
        block_size=block_size,
        model_dtype=model.model_dtype,
        num_blocks=num_blocks,
        layout=layout,
        capability=capability,
        max_model_len=max_model_len,
        tensor_parallel_size=tensor_parallel_size,
        decode_context_parallel_size=decode_context_parallel_size,
        mamba_ssm_cache_dtype=_mamba_ssm_cache_dtype(model),
        note=f"{model.architecture} from {model.path.name}; approximations: " + "; ".join(model.approximations),
    )


__all__ = [
    "DRAFT_TARGETS",
    "PROVENANCE",
    "OWN_BLOCK_SIZE",
    "deepseek_v4_compress_ratios",
    "kimi_kda_layers",
    "minimax_sparse_layers",
    "MLA_BACKEND_FOR",
    "ZOO_DIR",
    "ZooModel",
    "model_heads",
    "hybrid_block_size",
    "layer_geometry",
    "layer_types",
    "sliding_windows",
    "load_zoo",
    "to_case",
]
