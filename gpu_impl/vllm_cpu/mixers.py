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
    "qwen4_exp_ple": ("vllm.models.qwen4_exp.nvidia.ple_layer", "Qwen4ExpPLELayer"),
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

PAIR_MODEL_CLASSES = {
    frozenset({"gated_delta_net", "qwen4_exp_ple"}): ("vllm.models.qwen4_exp.nvidia.model", "Qwen4ExpForCausalLM"),
}
"""The model class of two mixer kinds one model has side by side (``reference.config.MIXER_PAIRS``): Qwen4-exp's,
whose ``get_mamba_specs_from_config`` reports both states (the negotiation takes the larger page)."""

HIDDEN_SIZE = 1024
"""The model's hidden size a mixer is built with: only its projections' input width (never
allocated: the meta device), not part of any state."""


def case_mixers(case: Any) -> tuple[Any, ...]:
    """The case's distinct mixers, by kind (one, or the two of a Qwen4-exp model; none for stand-ins)."""
    found = {layer.mixer for layer in case.layers if getattr(layer, "mixer", None) is not None}
    return tuple(sorted(found, key=lambda m: m.kind))


@functools.lru_cache(maxsize=16)
def hf_config(mixers: tuple[Any, ...]) -> Any:
    """The family's Hugging Face text config carrying the mixers' geometry (what their layer classes and
    the model class read). One per model, as a model has one config for all its layers: a zoo model's
    dozens of state layers and its model config share it."""
    if len(mixers) == 2:
        return _qwen4_exp_config(*mixers)
    (mixer,) = mixers
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


def _qwen4_exp_config(gdn: Any, ple: Any) -> Any:
    """Qwen4-exp's text config (``Qwen4ExpTextConfig``) with its Gated DeltaNet's geometry and its PLE short
    conv's: the hidden size, hyper-connection streams, PLE kernel and n-gram size (what the PLE state is made
    of); every other field is the class's default (the 40-layer model's), which the layout does not read."""
    from transformers import Qwen4ExpTextConfig

    assert gdn.kind == "gated_delta_net" and ple.kind == "qwen4_exp_ple", (gdn, ple)
    return Qwen4ExpTextConfig(linear_num_key_heads=gdn.num_k_heads, linear_num_value_heads=gdn.num_heads,
                              linear_key_head_dim=gdn.head_k_dim, linear_value_head_dim=gdn.head_dim,
                              linear_conv_kernel_dim=gdn.conv_kernel, hidden_size=ple.hidden_size,
                              hc_count=ple.hc_count, ple_conv_kernel_size=ple.conv_kernel, ngram_size=ple.ngram_size,
                              # The class's default is None, which QwenGatedDeltaNetAttention refuses; a checkpoint
                              # names its gate's activation (not part of any state): vLLM's default when unnamed.
                              output_gate_type="silu",
                              # The PLE layer's n-gram embedding reads the tokenizer's EOS id (it resets n-grams
                              # at EOS); the class leaves it None. Any id: no state depends on it.
                              eos_token_id=0,
                              # Its n-gram embedding splits ple_embed_dim over (ngram_size - 1) x heads_per_ngram
                              # heads (ValueError otherwise) and holds ngram_vocab_size_base rows a head: widths
                              # and vocabularies, never part of a state, so small ones that split (8 wide, one head
                              # an n-gram, 1024 rows) in place of the checkpoint's (2048 wide, 20M rows a head).
                              ple_embed_dim=8 * max(ple.ngram_size - 1, 1), heads_per_ngram=1,
                              ngram_vocab_size_base=1024, vocab_size=1024)


def model_class_location(mixers: tuple[Any, ...]) -> tuple[str, str]:
    """``(module, name)`` of the model class of the case's mixers: their family's, or the pair's."""
    if len(mixers) == 2:
        return PAIR_MODEL_CLASSES[frozenset(m.kind for m in mixers)]
    return MODEL_CLASSES[mixers[0].kind]


def model_class(mixers: tuple[Any, ...]) -> Any:
    """The model class of the case's mixers (``build_layer`` has imported it, or said why it cannot)."""
    module, name = model_class_location(mixers)
    return getattr(importlib.import_module(module), name)


def build_layer(layer: Any, vc: Any, config: Any, own_class: Callable[[str, str], Any]) -> Any:
    """The layer as its model builds it: vLLM's own mixer class from the model's config (``hf_config``,
    which carries every mixer of the model; the layer registers itself in ``static_forward_context``);
    ``own_class(module, name)`` imports the class or says why this vLLM cannot."""
    mixer = layer.mixer
    cls = own_class(*LAYER_CLASSES[mixer.kind])
    # The model class answers the block-size negotiation once the layers exist: one that does not import here
    # (0.30's Qwen4-exp model module needs torchvision) leaves the case unsupported, as its layer class would.
    own_class(*model_class_location(vc.model_config.state_mixers))
    if mixer.kind == "mamba2":
        # As NemotronHMambaDecoderLayer builds it (model_executor/models/nemotron_h.py).
        return cls(hidden_size=config.hidden_size, ssm_state_size=config.ssm_state_size,
                   conv_kernel_size=config.conv_kernel, intermediate_size=config.mamba_num_heads * config.mamba_head_dim,
                   use_conv_bias=True, use_bias=False, n_groups=config.n_groups, num_heads=config.mamba_num_heads,
                   head_dim=config.mamba_head_dim, model_config=vc.model_config, cache_config=vc.cache_config,
                   prefix=layer.name)
    if mixer.kind == "qwen4_exp_ple":
        # As Qwen4ExpDecoderLayer builds it for a layer of ple_layer_ids ({prefix}.ple); its dense index only
        # names its n-gram embedding's rows (on meta), not its state.
        return cls(config, vllm_config=vc, layer_idx=0, ple_dense_layer_id=0, prefix=layer.name)
    return cls(config, vc, prefix=layer.name)


__all__ = ["HIDDEN_SIZE", "LAYER_CLASSES", "MODEL_CLASSES", "PAIR_MODEL_CLASSES", "build_layer", "case_mixers", "hf_config", "model_class", "model_class_location"]
