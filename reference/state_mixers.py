"""The state of a layer built as one of vLLM's own mixer classes (``LayerConfig.mixer``): the shapes
and dtypes of its conv and SSM/recurrent states, per tensor-parallel rank, as vLLM 0.33.0 computes
them (``model_executor/layers/mamba/mamba_utils.py``: ``MambaStateShapeCalculator`` and
``MambaStateDtypeCalculator``, called by each class's ``get_state_shape`` / ``get_state_dtype``).

The conv state is ``(state_len, dim)`` (vLLM's default ``SD`` layout, ``VLLM_SSM_CONV_STATE_LAYOUT``
unset) and keeps ``conv_kernel - 1`` inputs: the drivers build layers without a speculative config, so
no draft tokens widen it (``num_spec`` 0), as no speculative blocks are counted for a state group.
"""

from __future__ import annotations

from reference.config import CaseConfig, LayerConfig, StateMixer
from reference.dtypes import canonical_model_dtype
from reference.errors import ConfigError

DEFAULT_STATE_DTYPE = "bfloat16"
"""A stand-in state layer's dtype when its case names none (``mamba_dtypes`` empty)."""


def _divide(numerator: int, denominator: int, what: str) -> int:
    # vLLM's divide() asserts; the case validation refuses a TP size that does not divide the
    # heads, so this only guards the arithmetic.
    if numerator % denominator:
        raise ConfigError(f"mixer {what} {numerator} is not divisible by tensor_parallel_size {denominator}")
    return numerator // denominator


def _extra_groups(n_groups: int, tp: int) -> int:
    """Groups replicated so that every head shard has its group (``extra_groups_for_head_shards``)."""
    return 0 if n_groups % tp == 0 else tp - n_groups


def state_shapes(mixer: StateMixer, tp: int) -> tuple[tuple[int, ...], ...]:
    """Per TP rank: ``(conv_state, ssm_state)``; a PLE short conv's ``(conv_state,)``."""
    state_len = mixer.conv_kernel - 1
    if mixer.kind == "mamba2":
        assert mixer.n_groups is not None and mixer.state_size is not None
        groups = mixer.n_groups + _extra_groups(mixer.n_groups, tp)
        conv_dim = mixer.num_heads * mixer.head_dim + 2 * groups * mixer.state_size
        return ((state_len, _divide(conv_dim, tp, "conv dim")),
                (_divide(mixer.num_heads, tp, "num_heads"), mixer.head_dim, mixer.state_size))
    if mixer.kind == "gated_delta_net":
        assert mixer.num_k_heads is not None and mixer.head_k_dim is not None
        conv_dim = 2 * mixer.num_k_heads * mixer.head_k_dim + mixer.num_heads * mixer.head_dim
        # The recurrent state is (value heads, value dim, key dim).
        return ((state_len, _divide(conv_dim, tp, "conv dim")),
                (_divide(mixer.num_heads, tp, "num_heads"), mixer.head_dim, mixer.head_k_dim))
    if mixer.kind == "qwen4_exp_ple":
        # One conv state over every hyper-connection stream of the hidden size, dilated by the n-gram size,
        # whole on every TP rank (short_conv_state_shape with tp_world_size=1): no SSM state.
        assert mixer.hidden_size is not None and mixer.hc_count is not None and mixer.ngram_size is not None
        return ((state_len * mixer.ngram_size, mixer.hidden_size * mixer.hc_count),)
    if mixer.kind in ("kimi_k3_kda", "glm5next_kda"):
        # KDA: q, k and v each num_heads x head_dim through the conv; a square recurrent state per head.
        conv_dim = 3 * mixer.num_heads * mixer.head_dim
        return ((state_len, _divide(conv_dim, tp, "conv dim")),
                (_divide(mixer.num_heads, tp, "num_heads"), mixer.head_dim, mixer.head_dim))
    raise ConfigError(f"mixer kind {mixer.kind!r} has no state model")


def state_dtypes(mixer: StateMixer, model_dtype: str, mamba_cache_dtype: str, mamba_ssm_cache_dtype: str) -> tuple[str, ...]:
    """``(conv_state, ssm_state)`` dtype names (PLE: the conv state's alone): the conv state is
    ``--mamba-cache-dtype`` (``auto``: the model dtype); the SSM state ``--mamba-ssm-cache-dtype``, whose ``auto`` is the conv dtype for
    Mamba-2 and GDN and float32 for KDA (``kda_state_dtype``, which refuses float16)."""
    conv = canonical_model_dtype(model_dtype) if mamba_cache_dtype == "auto" else mamba_cache_dtype
    if mixer.kind == "qwen4_exp_ple":
        return (conv,)  # short_conv_state_dtype: the conv state alone
    if mixer.kind in ("kimi_k3_kda", "glm5next_kda"):
        if mamba_ssm_cache_dtype == "auto":
            return conv, "float32"
        return conv, mamba_ssm_cache_dtype
    return conv, (conv if mamba_ssm_cache_dtype == "auto" else mamba_ssm_cache_dtype)


def layer_state(case: CaseConfig, layer: LayerConfig) -> tuple[tuple[tuple[int, ...], ...], tuple[str, ...]]:
    """A state layer's ``(shapes, dtypes)``: a mixer's own, or the stand-in's as the case gives them."""
    if layer.mixer is not None:
        return (state_shapes(layer.mixer, case.tensor_parallel_size),
                state_dtypes(layer.mixer, case.model_dtype, case.mamba_cache_dtype, case.mamba_ssm_cache_dtype))
    return layer.mamba_shapes, layer.mamba_dtypes or (DEFAULT_STATE_DTYPE,) * len(layer.mamba_shapes)


def state_is_tp_replicated(layer: LayerConfig) -> bool:
    """Whether every TP rank holds the layer's whole state (``MambaBase.is_kv_cache_tp_replicated``): Qwen4-exp's
    PLE short conv (its projections are not TP-split); every other state is sharded by heads."""
    return layer.mixer is not None and layer.mixer.kind == "qwen4_exp_ple"


def construction_refusal(case: CaseConfig, layer: LayerConfig) -> tuple[str, str] | None:
    """``(message, where)`` of what the mixer's class raises for this case, or None:
    ``MambaMixer2.__init__`` asserts the TP size divides its heads, and its groups unless there is one;
    ``kda_state_dtype`` refuses a float16 recurrent state (ValueError); Qwen4-exp's PLE n-gram embedding an
    n-gram size below 2."""
    mixer, tp = layer.mixer, case.tensor_parallel_size
    if mixer is None:
        return None
    if mixer.kind == "mamba2":
        assert mixer.n_groups is not None
        if mixer.num_heads % tp:
            return "Tensor parallel world size must divide num heads.", "MambaMixer2.__init__"
        if mixer.n_groups % tp and mixer.n_groups != 1:
            return ("If tensor parallel world size does not divide num_groups, then num_groups must equal 1.",
                    "MambaMixer2.__init__")
    if mixer.kind == "qwen4_exp_ple" and mixer.ngram_size is not None and mixer.ngram_size < 2:
        return f"ngram_size must be >= 2, got {mixer.ngram_size}", "Qwen4ExpNGramEmbedding.__init__"
    if mixer.kind in ("kimi_k3_kda", "glm5next_kda") and case.mamba_ssm_cache_dtype not in ("auto", "float32", "bfloat16"):
        return (f"KDA recurrent state supports only auto, float32, and bfloat16; got {case.mamba_ssm_cache_dtype}",
                "MambaStateDtypeCalculator.kda_state_dtype")
    return None
