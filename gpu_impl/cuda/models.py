"""Tiny ``config.json`` writers for the GPU path: dummy-weight models vLLM can start in seconds.

Every model here is loaded with ``load_format="dummy"`` and ``skip_tokenizer_init=True``,
so a directory holding only ``config.json`` is a complete model. The geometry of the
attention layers is what matters (it shapes the KV cache); everything else is as small
as the architecture allows.

- ``qwen3_config``: a dense Qwen3 (GQA, ``model.layers.{i}.self_attn.attn``);
- ``deepseek_v3_config``: a DeepSeek-V3-like MLA model (kv_lora_rank 512 +
  qk_rope_head_dim 64 = a 576-wide latent cache), all layers dense (no MoE layer is built);
- ``eagle_draft_config``: a one-layer Llama draft for ``method="eagle"`` (vLLM maps it to
  ``EagleLlamaForCausalLM``) or ``"eagle3"`` (``Eagle3LlamaForCausalLM``); vLLM names its
  attention ``model.layers.{N}.self_attn.attn`` with N = the target's layer count.

Pure Python: no vLLM, no torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

VOCAB = 1024
HIDDEN = 256
DRAFT_METHODS = ("eagle", "eagle3")


def qwen3_config(
    num_layers: int = 2,
    *,
    num_kv_heads: int = 8,
    head_dim: int = 128,
    num_heads: int | None = None,
    hidden_size: int = HIDDEN,
    vocab_size: int = VOCAB,
    max_position_embeddings: int = 4096,
    dtype: str = "bfloat16",
) -> dict[str, Any]:
    """A tiny Qwen3 whose attention layers have ``num_kv_heads`` x ``head_dim`` KV heads."""
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": 2 * hidden_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads or 2 * num_kv_heads,
        "num_key_value_heads": num_kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": True,
        "use_sliding_window": False,
        "torch_dtype": dtype,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }


def deepseek_v3_config(
    num_layers: int = 2,
    *,
    kv_lora_rank: int = 512,
    qk_rope_head_dim: int = 64,
    qk_nope_head_dim: int = 128,
    v_head_dim: int = 128,
    num_heads: int = 16,
    q_lora_rank: int | None = 256,
    hidden_size: int = HIDDEN,
    vocab_size: int = VOCAB,
    max_position_embeddings: int = 4096,
    dtype: str = "bfloat16",
) -> dict[str, Any]:
    """A tiny DeepSeek-V3: MLA attention (latent ``kv_lora_rank + qk_rope_head_dim`` wide).

    ``first_k_dense_replace = num_layers`` keeps every layer dense, so no fused-MoE
    kernel is built; the MoE fields are present because DeepSeek-V3 configs always
    carry them. The attention dims are DeepSeek-V3's (16 heads is what one rank of a
    TP=8 deployment runs), only the widths around them are small.
    """
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": 2 * hidden_size,
        "moe_intermediate_size": 64,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_heads,
        "n_shared_experts": 1,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "n_group": 1,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
        "first_k_dense_replace": num_layers,
        "moe_layer_freq": 1,
        "q_lora_rank": q_lora_rank,
        "kv_lora_rank": kv_lora_rank,
        "qk_nope_head_dim": qk_nope_head_dim,
        "qk_rope_head_dim": qk_rope_head_dim,
        "v_head_dim": v_head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "torch_dtype": dtype,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }


def mla_head_size(config: dict[str, Any]) -> int:
    """Width of the MLA latent cache entry (``MLAAttention.head_size``)."""
    return int(config["kv_lora_rank"]) + int(config["qk_rope_head_dim"])


def eagle_draft_config(target: dict[str, Any], method: str = "eagle3") -> dict[str, Any]:
    """A one-layer Llama draft matching a Qwen3/Llama ``target`` config.

    ``method="eagle3"`` also sets ``eagle_aux_hidden_state_layer_ids`` (read from the
    draft's top level by both model runners): vLLM's default ``(2, L // 2, L - 3)``
    names a layer a 2-layer target does not have, and the draft's ``fc`` expects as
    many hidden states as ids. The ids are the target's hidden-state capture points
    ``0..L`` (0 = the embeddings), three of them.
    """
    if method not in DRAFT_METHODS:
        raise ValueError(f"draft method {method!r} is not one of {', '.join(DRAFT_METHODS)}")
    num_target_layers = int(target["num_hidden_layers"])
    draft = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": target["vocab_size"],
        "hidden_size": target["hidden_size"],
        "intermediate_size": target.get("intermediate_size", 2 * target["hidden_size"]),
        "num_hidden_layers": 1,
        "num_attention_heads": target["num_attention_heads"],
        "num_key_value_heads": target["num_key_value_heads"],
        "head_dim": target["head_dim"],
        "hidden_act": "silu",
        "max_position_embeddings": target["max_position_embeddings"],
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": target.get("torch_dtype", "bfloat16"),
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    if method == "eagle3":
        if num_target_layers < 2:
            raise ValueError("an eagle3 draft needs three distinct capture points: a target of >= 2 layers")
        draft["eagle_aux_hidden_state_layer_ids"] = sorted({0, num_target_layers // 2, num_target_layers})
        draft["target_hidden_size"] = target["hidden_size"]
        draft["draft_vocab_size"] = target["vocab_size"]
    return draft


def draft_layer_name(target: dict[str, Any], index: int = 0) -> str:
    """What vLLM names draft layer ``index`` (the drafts start after the target's layers)."""
    return f"model.layers.{int(target['num_hidden_layers']) + index}.self_attn.attn"


def target_layer_name(index: int) -> str:
    """Qwen3/Llama/DeepSeek decoders all name their attention ``model.layers.{i}.self_attn.attn``."""
    return f"model.layers.{index}.self_attn.attn"


def write_model_dir(path: str | Path, config: dict[str, Any]) -> Path:
    """Write ``config.json`` (the whole model, for dummy weights) and return the directory."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=1, sort_keys=True))
    return path


__all__ = [
    "DRAFT_METHODS",
    "deepseek_v3_config",
    "draft_layer_name",
    "eagle_draft_config",
    "mla_head_size",
    "qwen3_config",
    "target_layer_name",
    "write_model_dir",
]
