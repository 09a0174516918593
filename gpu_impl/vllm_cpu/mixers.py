"""State layers built as vLLM's own mixer classes (``reference.config.STATE_MIXERS``): where each
class lives, the model class that reports its state to the block-size negotiation, and the Hugging
Face config both are built from (the mixer's geometry, nothing else the state depends on)."""

from __future__ import annotations

import functools
import importlib
from typing import Any, Callable

LAYER_CLASSES = {
    "mamba2": ("vllm.model_executor.layers.mamba.mamba_mixer2", "MambaMixer2"),
    "gated_delta_net": ("vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn", "QwenGatedDeltaNetAttention"),
    "kimi_k3_kda": ("vllm.models.kimi_k3.nvidia.kda", "KimiK3DeltaAttention"),
    "glm5next_kda": ("vllm.models.glm5next.common.kda", "Glm5NextLinearAttention"),
}
"""Where each mixer kind's layer class lives (``reference.config.STATE_MIXERS`` names the class)."""

MODEL_CLASSES = {
    "mamba2": ("vllm.model_executor.models.nemotron_h", "NemotronHForCausalLM"),
    "gated_delta_net": ("vllm.model_executor.models.qwen3_next", "Qwen3NextForCausalLM"),
    "kimi_k3_kda": ("vllm.models.kimi_k3.nvidia.model", "KimiLinearForCausalLM"),
    "glm5next_kda": ("vllm.models.glm5next.common.model", "Glm5NextForCausalLM"),
}
"""The model class of each mixer's family: its ``get_mamba_state_shape_from_config`` /
``get_mamba_state_dtype_from_config`` are what ``Platform._align_hybrid_block_size`` asks."""

HIDDEN_SIZE = 1024
"""The model's hidden size a mixer is built with: only its projections' input width (never
allocated: the meta device), not part of any state."""


@functools.lru_cache(maxsize=16)
def hf_config(mixer: Any) -> Any:
    """The family's Hugging Face text config carrying the mixer's geometry (what its layer class and
    its model class read). One per mixer, as a model has one config for all its layers: a zoo model's
    dozens of state layers and its model config share it."""
    common = dict(hidden_size=HIDDEN_SIZE, rms_norm_eps=1e-6, hidden_act="silu")
    if mixer.kind == "mamba2":
        from transformers import NemotronHConfig

        return NemotronHConfig(mamba_num_heads=mixer.num_heads, mamba_head_dim=mixer.head_dim, n_groups=mixer.n_groups,
                               ssm_state_size=mixer.state_size, conv_kernel=mixer.conv_kernel, **common)
    if mixer.kind == "gated_delta_net":
        from transformers import Qwen3NextConfig

        return Qwen3NextConfig(linear_num_key_heads=mixer.num_k_heads, linear_num_value_heads=mixer.num_heads,
                               linear_key_head_dim=mixer.head_k_dim, linear_value_head_dim=mixer.head_dim,
                               linear_conv_kernel_dim=mixer.conv_kernel, **common)
    if mixer.kind == "kimi_k3_kda":
        from vllm.transformers_utils.configs.kimi_linear import KimiLinearConfig

        return KimiLinearConfig(linear_attn_config={
            "head_dim": mixer.head_dim, "num_heads": mixer.num_heads, "short_conv_kernel_size": mixer.conv_kernel,
            "kda_layers": [1], "full_attn_layers": [], "use_full_rank_gate": True}, **common)
    from transformers import Glm5NextTextConfig

    return Glm5NextTextConfig(linear_head_dim=mixer.head_dim, linear_num_heads=mixer.num_heads,
                              linear_conv_kernel_dim=mixer.conv_kernel, **common)


def model_class(mixer: Any) -> Any:
    module, name = MODEL_CLASSES[mixer.kind]
    return getattr(importlib.import_module(module), name)


def build_layer(layer: Any, vc: Any, own_class: Callable[[str, str], Any]) -> Any:
    """The layer as its model builds it: vLLM's own mixer class from the family's config (it
    registers itself in ``static_forward_context``); ``own_class(module, name)`` imports the class
    or says why this vLLM cannot."""
    mixer = layer.mixer
    cls = own_class(*LAYER_CLASSES[mixer.kind])
    config = hf_config(mixer)
    if mixer.kind == "mamba2":
        # As NemotronHMambaDecoderLayer builds it (model_executor/models/nemotron_h.py).
        return cls(hidden_size=config.hidden_size, ssm_state_size=config.ssm_state_size,
                   conv_kernel_size=config.conv_kernel, intermediate_size=config.mamba_num_heads * config.mamba_head_dim,
                   use_conv_bias=True, use_bias=False, n_groups=config.n_groups, num_heads=config.mamba_num_heads,
                   head_dim=config.mamba_head_dim, model_config=vc.model_config, cache_config=vc.cache_config,
                   prefix=layer.name)
    return cls(config, vc, prefix=layer.name)


__all__ = ["HIDDEN_SIZE", "LAYER_CLASSES", "MODEL_CLASSES", "build_layer", "hf_config", "model_class"]
