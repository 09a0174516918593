"""A conformance case: the model's layers and the engine options that shape its KV cache.

A case is plain data (JSON round-trips exactly), so every failure can print it and
replay it. Validation happens here, with one-line errors that name the bad value.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Mapping, Sequence

from reference.dtypes import CACHE_DTYPES, canonical_model_dtype
from reference.errors import ConfigError
from reference.releases import TARGET_RELEASE

LAYER_KINDS = (
    "full",
    "sliding_window",
    "chunked_local",
    "sink_full",
    "mla",
    "sliding_window_mla",
    "cross",
    "mamba",
    "rswa",
    "prefix_lm",
    "mla_indexer",
    "hidden_state",
    "circular_buffer",
    "minimax_indexer",
    "qsa_compressed_key",
    "qsa_key_state",
    "encoder_only",
    "dsv4_attention",
    "dsv4_swa",
    "dsv4_indexer",
    "dsv4_compressor_state",
    "inkling_conv_state",
    "step5_summary",
    "step5_csa_ring",
)
"""Every case layer kind, each with the vLLM layer class it is built as (``docs/kv-cache-kinds.md``):
``rswa`` is ``RSWAAttention`` (``RSWASpec``: prefill kept, a decode window of ``rswa_window``
tokens), ``prefix_lm`` is ``PrefillPrefixLMAttention`` (a non-causal ``FullAttentionSpec``),
``mla_indexer`` is DeepSeek V3.2's ``DeepseekV32IndexerCache`` (an ``MLAAttentionSpec`` in the
indexer role: ``head_size`` bytes of uint8 per token, fp8 keys and their fp32 scales), or with
``index_kpool`` GLM-5-next's ``Glm5NextIndexerCache`` (the same spec storing one state per
``index_kpool`` tokens: ``tokens_per_state``),
``hidden_state`` is ``extract_hidden_states``' ``CacheOnlyAttentionLayer`` (``HiddenStateCacheSpec``:
``num_kv_heads`` captured layers of ``head_size`` = the hidden size, in the model dtype),
``circular_buffer`` is GLM-5-next's ``Glm5NextTailCache`` (``CircularBufferSpec``: one ring block per
request of ``index_kpool`` x next_power_of_2(ceil((index_kpool + drafts) / index_kpool)) tokens, raw bf16
key and gate score of ``head_size`` each, no slot mapping), ``minimax_indexer`` is MiniMax M3's
``MiniMaxM3IndexerCache`` (an ``MLAAttentionSpec`` in the indexer role: one key-only index vector of
``head_size`` per token, bf16 or, with an fp8 cache dtype, fp8 e4m3, on its own
``MINIMAX_M3_SPARSE_INDEXER`` backend), ``qsa_compressed_key`` and ``qsa_key_state`` are Qwen4-exp's QSA side
caches on their ``QWEN4_EXP_EXP_QSA_STATE`` backend: ``QSACompressedKeyCache`` (an ``MLAAttentionSpec`` of one
bf16 key of ``head_size`` per ``index_kpool`` tokens: the compress ratio) and ``QSAKeyStateCache`` (a
``CircularBufferSpec``: one ring block per request of ``index_kpool`` raw bf16 keys, plus the drafts rounded up
to whole groups); ``step5_summary`` and ``step5_csa_ring`` are Step5's CSA side caches (``STEP5_SIDE_CACHES``)."""

STEP5_SIDE_CACHES: dict[str, tuple[str, int, str]] = {
    "step5_summary": (".sparse_summary_cache", 256, "one 256-byte FP8 summary per eight tokens"),
    "step5_csa_ring": (".csa_tail_ring", 512, "1 KiB rows of bf16 [index_k | index_z]"),
}
"""Step5's CSA side caches, built by its DSA layer after its ``Attention`` -> (name suffix after ``{prefix}.attn``, the
head size the class hard-codes, what it stores): ``step5_summary`` is ``Step5SparseSummaryCacheLayer`` (a
``FullAttentionSpec`` of one 256-byte uint8 summary per 8 tokens, ``tokens_per_state`` 8, no V, in its DSA layer's
group), ``step5_csa_ring`` is ``Step5CSATailRing`` (a ``CircularBufferSpec`` of one page of its DSA layer's main KV cache,
as 1 KiB rows: ``head_size`` here is the row's 512 bf16 elements; at --block-size tokens and a 1 KiB block-stride
alignment)."""

QSA_KINDS = ("qsa_compressed_key", "qsa_key_state")
"""Qwen4-exp's QSA side caches (``models/qwen4_exp/common/qsa_cache.py``)."""

DSV4_KINDS = ("dsv4_attention", "dsv4_swa", "dsv4_indexer", "dsv4_compressor_state")
"""DeepSeek V4's caches, up to five per decoder layer (``models/deepseek_v4/``), in the fp8_ds_mla format its
FlashMLA path serves (UE8M0 block-scaled fp8 packed as uint8):
``dsv4_attention`` is ``DeepseekV4Attention``'s compressed cache (an ``MLAAttentionSpec`` of one 584-byte record
per ``index_kpool`` tokens, the layer's compress ratio 4 or 128, page aligned to 576 bytes, ``--block-size`` tokens);
``dsv4_swa`` its ``DeepseekV4SWACache`` (a ``SlidingWindowMLASpec`` of ``sliding_window`` tokens, 584-byte records,
64-token blocks of its own); ``dsv4_indexer`` the C4 layers' ``DeepseekV4IndexerCache`` (``head_size`` bytes of uint8
per 4 tokens, fp8 keys and fp32 scales, aligned to 576); ``dsv4_compressor_state`` a ``DeepseekCompressor``'s
``CompressorStateCache`` (fp32 states of ``head_size`` floats, a ``SlidingWindowMLASpec`` of its own block: 4 tokens
for ratio 4, 8 for ratio 128, a window of 8 or 128). Each is built as vLLM's own class on its own backend."""

LAYER_FAMILIES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "kimi_k3": ("vllm.models.kimi_k3.nvidia.mla", "MultiHeadLatentAttention", ("mla",)),
    "minimax_m3": ("vllm.models.minimax_m3.nvidia.model", "MiniMaxM3SparseAttention", ("full",)),
    "qwen4_exp": ("vllm.models.qwen4_exp.nvidia.qsa", "Qwen4ExpQSAAttention", ("full",)),
    "inkling": ("vllm.models.inkling.nvidia.attention", "InklingAttention", ("full", "sliding_window")),
    "step5": ("vllm.models.step5.nvidia.model", "Step5Attention", ("full",)),
    "deepseek_v41": ("vllm.models.deepseek_v41.nvidia.flashmla", "DeepseekV4FlashMLAAttention", DSV4_KINDS),
}
"""A layer's ``family``: the model family whose own layer class builds a layer of a generic kind (its spec is the
kind's; the class owns its construction and checks) -> (module, class, the kinds it builds). None: vLLM's generic
layer class of the kind. ``minimax_m3``'s class also builds its lightning indexer's key cache: the case lists that
``minimax_indexer`` layer, named ``{name}.index_cache``, right before it (the order vLLM registers them in);
``qwen4_exp``'s (Qwen4-exp's QSA attention) builds its indexer's two side caches: the case lists its
``qsa_key_state`` ``{prefix}.indexer.raw_key_cache`` and ``qsa_compressed_key`` ``{prefix}.indexer.compressed_key_cache``
right before it, ``{prefix}.attn``; ``inkling``'s (Inkling's attention, global or local) is built after its decoder
layer's short-conv state (``InklingConvState``): the case lists that ``inkling_conv_state`` layer
``{prefix}.conv_state`` right before ``{prefix}.attn``; ``step5``'s (Step5's DSA layers: its full-attention layers
when the checkpoint has a ``sparse_config``) builds vLLM's ``Attention`` on ``STEP5_DSA`` as ``{prefix}.attn``, then its
CSA side caches: the case lists its ``step5_summary`` ``{prefix}.attn.sparse_summary_cache`` and ``step5_csa_ring``
``{prefix}.attn.csa_tail_ring`` right after it; ``deepseek_v41`` (DeepSeek V4.1's attention on FlashMLA, every one of
its caches, ``DSV41_CACHES``) builds a decoder layer's caches itself: the case lists them as V4.1 registers them."""

FAMILY_BACKENDS = {"minimax_m3": "MINIMAX_M3_SPARSE", "qwen4_exp": "QWEN4_EXP_QSA_TRITON", "inkling": "FLASH_ATTN",
                   "step5": "STEP5_DSA"}
"""Families whose class picks its own backend (no selector): the backend such a layer runs on."""

DSV4_CACHE_DTYPE = "fp8_ds_mla"
"""The one cache dtype DeepSeek V4's kinds take: FlashMLA's layout (``_resolve_dsv4_kv_cache_dtype`` turns
``auto`` and ``fp8`` into it; the plain bf16 rows of the FlashInfer path are not modeled)."""

DSV4_COMPRESS_RATIOS = (4, 128)
"""``CompressorStateCache`` asserts ``compress_ratio in [4, 128]``; a C4 layer also has the indexer."""

DSV41_COMPRESS_RATIOS = (1, 2)
"""DeepSeek V4.1's compressed layers (``DeepseekV4Attention.__init__`` refuses any ratio but 0, 1 and 2; 0 is a
sliding-window layer, which owns only its SWA cache)."""

DSV41_CACHES: dict[str, tuple[str, str, int]] = {
    "dsv4_attention": ("", "FLASHMLA_SPARSE_DSV41", 512),
    "dsv4_indexer": (".indexer.k_cache", "DEEPSEEK_V41_INDEXER", 132),
    "dsv4_swa": (".swa_cache", "DEEPSEEK_SPARSE_SWA", 512),
    "dsv4_compressor_state": (".compressor.state_cache", "CompressorBackend", 1024),
}
"""DeepSeek V4.1's caches (family ``deepseek_v41`` on DeepSeek V4's kinds), in the order one decoder layer's
``DeepseekV4Attention`` (``models/deepseek_v41/attention.py``, on FlashMLA: ``DeepseekV4FlashMLAAttention``) registers
them -> (name suffix after its prefix ``...layers.{i}.attn``, the backend its class names, the head size V4.1's geometry
gives it). A kv-source layer owns the compressed cache (``dsv4_attention``, ``index_kpool`` its compress ratio 1 or
2); one that is also an index source owns the indexer's key cache (132 bytes of fp8 keys and fp32 scales per state, at
the layer's ratio); every layer has its SWA cache (32-token blocks); a ratio-2 source has its compressor's ring of fp32
[kv, score] rows (a ``CircularBufferSpec``). Layers that read another layer's compressed cache (consumers) own only
their SWA cache, as sliding-window layers do: a case lists them as sliding-window layers."""
DSV41_ATTENTION_BACKEND = "FLASHMLA_SPARSE_DSV41"
"""The ``--attention-backend`` a DeepSeek V4.1 case names: ``_select_dsv4_attn_cls`` (models/deepseek_v41/nvidia/model.py)
picks FlashMLA mega attention by default on SM100 (its NVFP4 compressed cache, not modeled) and FlashInfer's plain
rows on SM120; FlashMLA is the path the reference models."""

MINIMAX_INDEXER_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")
"""A ``minimax_indexer`` layer's ``cache_dtype`` is the engine's ``--attention-config indexer_kv_dtype`` (the index
cache's own dtype, independent of ``--kv-cache-dtype``): ``auto`` is its bf16 cache, an fp8 name its ``fp8``
(``torch.float8_e4m3fn``); ``MiniMaxM3IndexerCache`` raises for any other."""

LAYER_OWN_BACKENDS: dict[str, tuple[str, str]] = {
    "mla_indexer": ("DEEPSEEK_V32_INDEXER", "DeepseekV32IndexerCache"),
    "hidden_state": ("CACHE_ONLY_ATTN", "CacheOnlyAttentionLayer"),
    "circular_buffer": ("KPOOL_TAIL", "Glm5NextTailCache"),
    "minimax_indexer": ("MINIMAX_M3_SPARSE_INDEXER", "MiniMaxM3IndexerCache"),
    "qsa_compressed_key": ("QWEN4_EXP_EXP_QSA_STATE", "QSACompressedKeyCache"),
    "qsa_key_state": ("QWEN4_EXP_EXP_QSA_STATE", "QSAKeyStateCache"),
    "dsv4_attention": ("FLASHMLA_SPARSE_DSV4", "DeepseekV4Attention"),
    "dsv4_swa": ("DEEPSEEK_SPARSE_SWA", "DeepseekV4SWACache"),
    "dsv4_indexer": ("DEEPSEEK_V4_INDEXER", "DeepseekV4IndexerCache"),
    "dsv4_compressor_state": ("CompressorBackend", "CompressorStateCache"),
    "inkling_conv_state": ("INKLING_SCONV_SWA", "InklingConvState"),
    "step5_summary": ("STEP5_CSA_SUMMARY", "Step5SparseSummaryCacheLayer"),
    "step5_csa_ring": ("STEP5_CSA_TAIL_RING", "Step5CSATailRing"),
}
"""Kinds whose layer class names its backend itself (``get_attn_backend``, no selection and no
selector validation): kind -> (backend, layer class)."""
_DSV41_PREFIX = re.compile(r"(?:[A-Za-z_]\w*\.)*\d+\.attn")
"""A DeepSeek V4.1 decoder layer's attention prefix: one layer index (vLLM's ``extract_layer_index``), then ``.attn``."""


def own_backend(layer: "LayerConfig") -> tuple[str, str]:
    """(backend, layer class) of a kind whose class names its backend: DeepSeek V4.1's caches on their own."""
    if layer.family == "deepseek_v41" and layer.kind in DSV41_CACHES:
        return DSV41_CACHES[layer.kind][1], LAYER_OWN_BACKENDS[layer.kind][1]
    return LAYER_OWN_BACKENDS[layer.kind]


def dsv41_prefix(layer: "LayerConfig") -> str:
    """The decoder layer's attention prefix ``...layers.{i}.attn`` of a DeepSeek V4.1 cache."""
    return layer.name.removesuffix(DSV41_CACHES[layer.kind][0])


HIDDEN_STATE_CACHE_DTYPES = ("auto", "bfloat16", "float16")
"""What ``CacheOnlyAttentionLayer.__init__`` accepts (it asserts: no quantized cache; its only
builder, ``ExtractHiddenStatesModel``, replaces a quantized ``--kv-cache-dtype`` with ``auto``)."""


def indexer_k_cache_bytes(index_head_dim: int) -> int:
    """Bytes per token of DeepSeek V3.2's indexer K cache (``Indexer``: fp8 keys plus one fp32
    scale per 128, ``head_dim + head_dim // quant_block_size * 4`` of uint8): 132 for 128."""
    return index_head_dim + index_head_dim // 128 * 4
STATE_MIXERS: dict[str, tuple[str, str]] = {
    "mamba2": ("MAMBA2_ATTN", "MambaMixer2"),
    "gated_delta_net": ("GDN_ATTN", "QwenGatedDeltaNetAttention"),
    "kimi_k3_kda": ("KIMI_K3_KDA", "KimiK3DeltaAttention"),
    "glm5next_kda": ("GDN_ATTN", "Glm5NextLinearAttention"),
    "qwen4_exp_ple": ("PLE_SHORT_CONV_ATTN", "Qwen4ExpPLELayer"),
}
"""State layers built as vLLM's own class from the mixer's geometry (``LayerConfig.mixer``):
mixer kind -> (the backend its class names, the class). ``MambaMixer2`` is
``model_executor/layers/mamba/mamba_mixer2.py`` (Mamba-2, Nemotron-H), ``QwenGatedDeltaNetAttention``
``model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py`` (Qwen3-Next, Qwen3.5), ``KimiK3DeltaAttention``
``models/kimi_k3/nvidia/kda.py`` and ``Glm5NextLinearAttention`` ``models/glm5next/common/kda.py`` (KDA),
``Qwen4ExpPLELayer`` ``models/qwen4_exp/nvidia/ple_layer.py`` (Qwen4-exp's per-layer-embedding short conv, which
a Qwen4-exp model has beside its Gated DeltaNet layers: ``MIXER_PAIRS``)."""
MIXER_FIELDS: dict[str, tuple[str, ...]] = {
    "mamba2": ("num_heads", "head_dim", "n_groups", "state_size", "conv_kernel"),
    "gated_delta_net": ("num_heads", "head_dim", "num_k_heads", "head_k_dim", "conv_kernel"),
    "kimi_k3_kda": ("num_heads", "head_dim", "conv_kernel"),
    "glm5next_kda": ("num_heads", "head_dim", "conv_kernel"),
    "qwen4_exp_ple": ("hidden_size", "hc_count", "ngram_size", "conv_kernel"),
}
"""The geometry each mixer kind is built from (every other ``StateMixer`` field stays unset)."""
MIXER_PAIRS: dict[frozenset[str], str] = {
    frozenset({"gated_delta_net", "qwen4_exp_ple"}): "Qwen4ExpForCausalLM",
}
"""Mixer kinds one model has side by side, and its model class: Qwen4-exp's Gated DeltaNet layers and the
PLE short convs of its ``ple_layer_ids`` (``get_mamba_specs_from_config`` reports both states to the
block-size negotiation, which takes the larger page). Any other model's state layers are one mixer."""
MIXER_ALONE_REFUSED = {"qwen4_exp_ple": "gated_delta_net"}
"""A mixer kind that exists only beside another (its model class reports the other's state too)."""
MAMBA_DTYPES = ("auto", "float32", "float16", "bfloat16")
"""``--mamba-cache-dtype`` / ``--mamba-ssm-cache-dtype`` values (vllm/config/cache.py ``MambaDType``)."""
MAX_MIXER_DIM = 1 << 16
CONNECTORS = ("nixl", "mooncake", "offloading", "lmcache")
MAMBA_CACHE_MODES = ("none", "align")
"""``CacheConfig.mamba_cache_mode`` values (vllm/config/cache.py ``MambaCacheMode``)."""
RUNNERS = ("mrv1", "mrv2")

MAX_TOKENS = 1 << 24
"""Upper bound of every token count (block sizes, lengths, windows): 16M tokens, beyond any
served model, so no command's memory grows with an absurd value."""
MAX_HEADS = 1 << 12
MAX_PARALLEL = 1 << 12
"""The largest TP, DCP or PCP size a case may name."""
MAX_HEAD_SIZE = 1 << 14
MAX_BLOCKS = 1 << 24
MAX_BYTES = 1 << 46
"""64 TiB of KV cache memory."""
MAX_STATE_ELEMENTS = 1 << 32


# --- one validator per kind of value (each error names the value and what was expected) --------


def _int(owner: str, name: str, value: Any, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        expected = "a positive integer" if low == 1 else f"an integer >= {low}"
        raise ConfigError(f"{owner}{name} {value!r} must be {expected} (at most {high})")
    if value > high:
        raise ConfigError(f"{owner}{name} {value!r} must be an integer from {low} to {high}")


def _optional_int(owner: str, name: str, value: Any, low: int, high: int) -> None:
    if value is not None:
        _int(owner, name, value, low, high)


def _text(owner: str, name: str, value: Any) -> None:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{owner}{name} {value!r} must be a non-empty string")


def _flag(owner: str, name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"{owner}{name} {value!r} must be true or false")


@dataclass(frozen=True)
class StateMixer:
    """The geometry of a state layer built as vLLM's own mixer class (``STATE_MIXERS``): model-wide
    sizes, as the model's config gives them; vLLM divides heads by the tensor-parallel size."""

    kind: str
    """One of ``STATE_MIXERS``."""
    num_heads: int | None = None
    """Mamba-2 heads (``mamba_num_heads``), GDN value heads (``linear_num_value_heads``) or KDA heads."""
    head_dim: int | None = None
    """Mamba-2 head dim, GDN value head dim (``linear_value_head_dim``) or KDA head dim."""
    conv_kernel: int = 4
    """The short convolution's kernel width (``conv_kernel`` / ``linear_conv_kernel_dim`` /
    ``ple_conv_kernel_size``); its state keeps ``conv_kernel - 1`` inputs (PLE: times ``ngram_size``)."""
    num_k_heads: int | None = None
    """GDN only: key heads (``linear_num_key_heads``)."""
    head_k_dim: int | None = None
    """GDN only: key head dim (``linear_key_head_dim``)."""
    n_groups: int | None = None
    """Mamba-2 only: B/C groups (``n_groups``)."""
    state_size: int | None = None
    """Mamba-2 only: the SSM state size (``ssm_state_size``)."""
    hidden_size: int | None = None
    """PLE only: the model's hidden size (``hidden_size``); the conv runs over ``hidden_size * hc_count``
    channels, on every TP rank whole (the state is TP-replicated)."""
    hc_count: int | None = None
    """PLE only: the hyper-connection streams (``hc_count``)."""
    ngram_size: int | None = None
    """PLE only: the conv's dilation (``ngram_size``): its state keeps ``(conv_kernel - 1) * ngram_size``
    inputs."""

    def __post_init__(self) -> None:
        owner = "mixer "
        if self.kind not in STATE_MIXERS:
            raise ConfigError(f"mixer kind {self.kind!r} is not one of {', '.join(STATE_MIXERS)}")
        wanted = MIXER_FIELDS[self.kind]
        for name in ("num_heads", "head_dim", "conv_kernel", "num_k_heads", "head_k_dim", "n_groups", "state_size",
                     "hidden_size", "hc_count", "ngram_size"):
            value = getattr(self, name)
            if name in wanted:
                if value is None:
                    raise ConfigError(f"mixer {self.kind!r} needs {name} (it is built from {', '.join(wanted)})")
                _int(owner, name, value, 2 if name == "conv_kernel" else 1, MAX_MIXER_DIM)
            elif value is not None:
                raise ConfigError(f"mixer {self.kind!r}: {name} {value!r} is not one of its fields ({', '.join(wanted)})")
        if self.kind == "qwen4_exp_ple" and self.hidden_size * self.hc_count > MAX_MIXER_DIM:
            # The conv runs over hidden_size x hc_count channels (the state's width, and the width of the
            # layer's weights the drivers build): bounded as every mixer dimension is.
            raise ConfigError(f"mixer 'qwen4_exp_ple': hidden_size {self.hidden_size} x hc_count {self.hc_count} = "
                              f"{self.hidden_size * self.hc_count} channels; expected at most {MAX_MIXER_DIM}")
        if self.kind == "qwen4_exp_ple" and (self.conv_kernel - 1) * self.ngram_size * self.hidden_size * self.hc_count > MAX_STATE_ELEMENTS:
            raise ConfigError(f"mixer 'qwen4_exp_ple': its conv state ((conv_kernel - 1) x ngram_size = "
                              f"{(self.conv_kernel - 1) * self.ngram_size} inputs of {self.hidden_size * self.hc_count}) "
                              f"has more than {MAX_STATE_ELEMENTS} elements")
        if self.kind == "mamba2" and self.num_heads % self.n_groups:
            raise ConfigError(f"mixer 'mamba2': num_heads {self.num_heads} must be a multiple of n_groups {self.n_groups} "
                              f"(each Mamba-2 head reads one group's B and C)")

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, data: Any, owner: str) -> "StateMixer":
        if isinstance(data, StateMixer):
            return data
        if not isinstance(data, Mapping):
            raise ConfigError(f"{owner}mixer {data!r} must be an object with a 'kind' and its geometry")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"{owner}mixer: unknown field(s) {unknown}; expected some of {sorted(known)}")
        if "kind" not in data:
            raise ConfigError(f"{owner}mixer {dict(data)!r} needs a 'kind' (one of {', '.join(STATE_MIXERS)})")
        wanted = MIXER_FIELDS.get(data["kind"], ())
        missing = [name for name in wanted if name not in data and name != "conv_kernel"]
        if missing:
            raise ConfigError(f"{owner}mixer {data['kind']!r} needs {', '.join(missing)} (it is built from {', '.join(wanted)})")
        try:
            return cls(**data)
        except TypeError as exc:
            raise ConfigError(f"{owner}mixer: {exc}") from None


@dataclass(frozen=True)
class LayerConfig:
    """One layer with a KV cache: its kind, backend and head geometry."""

    name: str
    kind: str = "full"
    backend: str = "FLASH_ATTN"
    num_kv_heads: int = 8
    head_size: int = 128
    head_size_v: int | None = None
    cache_dtype: str = "auto"
    sliding_window: int | None = None
    attention_chunk_size: int | None = None
    sink_len: int | None = None
    rswa_window: int | None = None
    """``RSWAAttention(rswa_window=...)``: the generated tokens an R-SWA layer keeps (kind ``rswa``)."""
    index_kpool: int | None = None
    """Tokens per compressed key pool, > 1: ``Glm5NextTailCache(index_kpool=...)`` (kind ``circular_buffer``,
    required) or ``Glm5NextIndexerCache(index_kpool=...)`` (kind ``mla_indexer``: the pooled indexer cache); for
    Qwen4-exp's QSA caches (kinds ``qsa_compressed_key``, ``qsa_key_state``, required) the ``compress_ratio``."""
    mamba_shapes: tuple[tuple[int, ...], ...] = ()
    """A ``mamba`` layer built as a ``MambaBase`` stand-in: its state shapes (per TP rank)."""
    mamba_dtypes: tuple[str, ...] = ()
    mixer: StateMixer | None = None
    """A ``mamba`` layer built as vLLM's own mixer class from this geometry (no ``mamba_shapes``:
    the class computes its state, the reference predicts it, ``reference.state_mixers``)."""
    is_draft: bool = False
    family: str | None = None
    """The model family whose own layer class builds this layer (``LAYER_FAMILIES``: ``kimi_k3`` is Kimi K3's
    ``MultiHeadLatentAttention`` for an ``mla`` layer); None: vLLM's generic class of the kind."""

    def __post_init__(self) -> None:
        _text("", "layer name", self.name)
        owner = f"layer {self.name!r}: "
        if self.kind not in LAYER_KINDS:
            raise ConfigError(f"layer {self.name!r}: kind {self.kind!r} is not one of {', '.join(LAYER_KINDS)}")
        if self.cache_dtype not in CACHE_DTYPES:
            raise ConfigError(
                f"layer {self.name!r}: cache dtype {self.cache_dtype!r} is not one of {', '.join(CACHE_DTYPES)}"
            )
        _int(owner, "num_kv_heads", self.num_kv_heads, 1, MAX_HEADS)
        _int(owner, "head_size", self.head_size, 1, MAX_HEAD_SIZE)
        _optional_int(owner, "head_size_v", self.head_size_v, 1, MAX_HEAD_SIZE)
        for attr in ("sliding_window", "attention_chunk_size", "rswa_window", "index_kpool"):
            _optional_int(owner, attr, getattr(self, attr), 1, MAX_TOKENS)
        _optional_int(owner, "sink_len", self.sink_len, 0, MAX_TOKENS)
        _flag(owner, "is_draft", self.is_draft)
        _text(owner, "backend", self.backend)
        if not isinstance(self.mamba_shapes, tuple) or not all(
            isinstance(shape, tuple) and shape and all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape)
            for shape in self.mamba_shapes
        ):
            raise ConfigError(f"{owner}mamba_shapes {self.mamba_shapes!r} must be lists of positive integers")
        for shape in self.mamba_shapes:
            elements = 1
            for d in shape:
                elements *= d
            if elements > MAX_STATE_ELEMENTS:
                raise ConfigError(f"{owner}mamba shape {list(shape)} has {elements} elements; expected at most {MAX_STATE_ELEMENTS}")
        if not all(isinstance(d, str) for d in self.mamba_dtypes) or (
            self.mamba_dtypes and len(self.mamba_dtypes) != len(self.mamba_shapes)
        ):
            raise ConfigError(f"{owner}mamba_dtypes {list(self.mamba_dtypes)!r} must be one dtype name per mamba shape")
        if self.kind in ("sliding_window", "sliding_window_mla") and not self.sliding_window:
            raise ConfigError(f"layer {self.name!r}: kind {self.kind!r} needs sliding_window > 0")
        if self.kind == "chunked_local" and not self.attention_chunk_size:
            raise ConfigError(f"layer {self.name!r}: kind 'chunked_local' needs attention_chunk_size > 0")
        if self.kind == "rswa" and not self.rswa_window:
            raise ConfigError(f"layer {self.name!r}: kind 'rswa' needs rswa_window > 0")
        if self.rswa_window is not None and self.kind != "rswa":
            raise ConfigError(f"layer {self.name!r}: rswa_window {self.rswa_window!r} is only for kind 'rswa', not {self.kind!r}")
        if self.kind == "circular_buffer" and (self.index_kpool or 0) < 2:
            raise ConfigError(f"layer {self.name!r}: kind 'circular_buffer' needs index_kpool >= 2 "
                              f"(Glm5NextTailCache asserts index_kpool > 1), got {self.index_kpool!r}")
        ratio_kinds = ("circular_buffer", "mla_indexer", *QSA_KINDS, "dsv4_attention", "dsv4_indexer", "dsv4_compressor_state")
        if self.index_kpool is not None and self.kind not in ratio_kinds:
            raise ConfigError(f"layer {self.name!r}: index_kpool {self.index_kpool!r} is only for kinds "
                              f"{', '.join(repr(k) for k in ratio_kinds)}, not {self.kind!r}")
        if self.kind in DSV4_KINDS:
            self._check_dsv4()
        if self.family is not None:
            if self.family not in LAYER_FAMILIES:
                raise ConfigError(f"{owner}family {self.family!r} is not one of {', '.join(LAYER_FAMILIES)}")
            _module, layer_class, kinds = LAYER_FAMILIES[self.family]
            if self.kind not in kinds:
                raise ConfigError(f"{owner}family {self.family!r} builds kind(s) {', '.join(kinds)} ({layer_class}), "
                                  f"not {self.kind!r}")
            if self.is_draft:
                raise ConfigError(f"{owner}family {self.family!r}: a draft layer is built by the drafter, not the family's "
                                  f"class; leave family unset")
            own = FAMILY_BACKENDS.get(self.family)
            if own is not None and self.backend != own:
                raise ConfigError(f"{owner}family {self.family!r} runs on {own} ({layer_class} picks it), not {self.backend!r}")
        if self.kind == "inkling_conv_state":
            self._check_inkling_conv_state()
        if self.kind in STEP5_SIDE_CACHES:
            self._check_step5_side_cache()
        if self.kind in QSA_KINDS and self.index_kpool is None:
            raise ConfigError(f"layer {self.name!r}: kind {self.kind!r} needs index_kpool (the QSA compress_ratio, >= 1)")
        if self.kind in QSA_KINDS and self.cache_dtype != "auto":
            raise ConfigError(f"layer {self.name!r}: kind {self.kind!r} stores bf16 keys (the QSA side caches' dtype); "
                              f"cache_dtype {self.cache_dtype!r} must be 'auto'")
        if self.kind == "mla_indexer" and self.index_kpool is not None and self.index_kpool < 2:
            raise ConfigError(f"layer {self.name!r}: kind 'mla_indexer' with index_kpool needs index_kpool >= 2 "
                              f"(Glm5NextIndexerCache asserts index_kpool > 1), got {self.index_kpool!r}")
        if self.kind == "circular_buffer" and self.cache_dtype != "auto":
            raise ConfigError(f"layer {self.name!r}: kind 'circular_buffer' stores bf16 whatever the cache dtype "
                              f"(Glm5NextTailCache); cache_dtype {self.cache_dtype!r} must be 'auto'")
        if self.kind in LAYER_OWN_BACKENDS and self.backend != own_backend(self)[0]:
            backend, layer_class = own_backend(self)
            raise ConfigError(f"layer {self.name!r}: kind {self.kind!r} runs on {backend} "
                              f"({layer_class} names it), not {self.backend!r}")
        if self.kind == "minimax_indexer" and self.cache_dtype not in MINIMAX_INDEXER_CACHE_DTYPES:
            raise ConfigError(f"layer {self.name!r}: kind 'minimax_indexer' cache_dtype {self.cache_dtype!r} must be one of "
                              f"{', '.join(MINIMAX_INDEXER_CACHE_DTYPES)} (MiniMaxM3IndexerCache stores bf16 or fp8 e4m3)")
        if self.kind == "mla_indexer" and self.cache_dtype != "auto":
            raise ConfigError(f"layer {self.name!r}: kind 'mla_indexer' stores uint8 whatever the cache dtype "
                              f"(fp8 keys and fp32 scales); cache_dtype {self.cache_dtype!r} must be 'auto'")
        if self.kind == "hidden_state" and self.cache_dtype not in HIDDEN_STATE_CACHE_DTYPES:
            raise ConfigError(f"layer {self.name!r}: kind 'hidden_state' cache_dtype {self.cache_dtype!r} must be one of "
                              f"{', '.join(HIDDEN_STATE_CACHE_DTYPES)} (ExtractHiddenStatesModel gives CacheOnlyAttentionLayer 'auto' for a quantized one)")
        if self.mixer is not None:
            if not isinstance(self.mixer, StateMixer):
                raise ConfigError(f"{owner}mixer {self.mixer!r} must be a mixer object")
            if self.kind != "mamba":
                raise ConfigError(f"layer {self.name!r}: a mixer is only for kind 'mamba', not {self.kind!r}")
            if self.mamba_shapes or self.mamba_dtypes:
                raise ConfigError(f"layer {self.name!r}: a {self.mixer.kind!r} mixer computes its own state; drop "
                                  f"mamba_shapes/mamba_dtypes (set the case's mamba_cache_dtype / mamba_ssm_cache_dtype)")
            backend, layer_class = STATE_MIXERS[self.mixer.kind]
            if self.backend != backend:
                raise ConfigError(f"layer {self.name!r}: mixer {self.mixer.kind!r} runs on {backend} "
                                  f"({layer_class} names it), not {self.backend!r}")
        elif self.kind == "mamba" and not self.mamba_shapes:
            raise ConfigError(f"layer {self.name!r}: kind 'mamba' needs mamba_shapes or a mixer")


    def _check_inkling_conv_state(self) -> None:
        """What ``InklingConvState`` builds (``models/inkling/nvidia/sconv_swa_attn.py``): a ``SlidingWindowSpec`` of
        ``sliding_window`` = the short conv's kernel size tokens in blocks of as many, its four streams (K, V and the
        attention and MLP outputs' hidden chunks) packed into a power-of-two ``head_size``, no V, the model dtype."""
        owner = f"layer {self.name!r}: kind 'inkling_conv_state'"
        if not self.sliding_window:
            raise ConfigError(f"{owner} needs sliding_window: the short conv's kernel size (sconv_kernel_size)")
        if self.head_size & (self.head_size - 1):
            raise ConfigError(f"{owner} head_size {self.head_size} must be a power of two (InklingConvState pads its "
                              f"packed 2 * head_dim + 2 * hidden_size / num_kv_heads to one)")
        if self.cache_dtype != "auto" or self.head_size_v is not None:
            raise ConfigError(f"{owner} stores its streams in the model dtype with no V: cache_dtype {self.cache_dtype!r} "
                              f"must be 'auto' and head_size_v unset")
        if self.is_draft or self.family is not None:
            raise ConfigError(f"{owner} is built by an Inkling decoder layer, not a drafter or another family")

    def _check_step5_side_cache(self) -> None:
        """What Step5's CSA side caches hard-code (``models/step5/nvidia/``): the summaries are one 256-byte FP8 row per
        eight tokens (the sparse config's ``proxy_dim``, which it requires to be 256), the ring's rows one bf16
        ``[index_k | index_z]`` of 2 x 256; one head each, no V, their own dtype whatever the cache's."""
        owner = f"layer {self.name!r}: kind {self.kind!r}"
        _suffix, head_size, what = STEP5_SIDE_CACHES[self.kind]
        if self.num_kv_heads != 1 or self.head_size != head_size or self.head_size_v is not None:
            raise ConfigError(f"{owner} stores {what}: num_kv_heads {self.num_kv_heads!r} must be 1, head_size "
                              f"{self.head_size!r} must be {head_size} and head_size_v unset")
        if self.cache_dtype != "auto" or self.sliding_window is not None or self.index_kpool is not None:
            raise ConfigError(f"{owner} keeps its own dtype and blocks: cache_dtype {self.cache_dtype!r} must be 'auto', "
                              f"sliding_window and index_kpool unset")
        if self.is_draft or self.family is not None:
            raise ConfigError(f"{owner} is built by a Step5 DSA layer, not a drafter or another family")

    def _check_dsv41(self, owner: str) -> None:
        """What DeepSeek V4.1's classes build (``models/deepseek_v41/``): V4's geometry (one latent head of 512, 448 NoPE
        and 64 RoPE, which its compressor asserts; 128-wide index keys), compress ratios 1 and 2, the fp8_ds_mla
        format (FlashMLA's; its MXFP8 record on SM100 follows from the capability, not the dtype)."""
        suffix, _backend, head_size = DSV41_CACHES[self.kind]
        if self.cache_dtype != DSV4_CACHE_DTYPE:
            raise ConfigError(f"{owner} (DeepSeek V4.1) is modeled in the {DSV4_CACHE_DTYPE} format only (FlashMLA's); "
                              f"cache_dtype {self.cache_dtype!r} must be {DSV4_CACHE_DTYPE!r}")
        if self.num_kv_heads != 1 or self.head_size != head_size or self.head_size_v is not None:
            raise ConfigError(f"{owner} (DeepSeek V4.1) stores one latent state per position: num_kv_heads "
                              f"{self.num_kv_heads!r} must be 1, head_size {self.head_size!r} must be {head_size}, "
                              f"head_size_v unset")
        if (self.kind == "dsv4_swa") != (self.sliding_window is not None) or (self.sliding_window is not None
                                                                             and self.sliding_window < 1):
            raise ConfigError(f"{owner} (DeepSeek V4.1): sliding_window {self.sliding_window!r} must be the model's "
                              f"window on its SWA cache and unset on its other caches")
        if self.kind == "dsv4_compressor_state" and self.index_kpool != 2:
            raise ConfigError(f"{owner} (DeepSeek V4.1) is the ring of a ratio-2 compressor: index_kpool "
                              f"{self.index_kpool!r} must be 2 (a ratio-1 layer keeps no ring)")
        if self.kind in ("dsv4_attention", "dsv4_indexer") and self.index_kpool not in DSV41_COMPRESS_RATIOS:
            raise ConfigError(f"{owner} (DeepSeek V4.1) needs index_kpool, the layer's compress ratio, one of "
                              f"{', '.join(map(str, DSV41_COMPRESS_RATIOS))}; got {self.index_kpool!r}")
        if not self.name.endswith(suffix) or not _DSV41_PREFIX.fullmatch(self.name.removesuffix(suffix)):
            raise ConfigError(f"{owner} (DeepSeek V4.1) is named as its decoder layer registers it, "
                              f"'{{...}}.layers.{{i}}.attn{suffix}' (one layer index in the name)")

    def _check_dsv4(self) -> None:
        """What DeepSeek V4's cache classes assert or accept (``models/deepseek_v4/``)."""
        owner = f"layer {self.name!r}: kind {self.kind!r}"
        if self.family == "deepseek_v41":
            self._check_dsv41(owner)
            return
        if self.cache_dtype != DSV4_CACHE_DTYPE:
            raise ConfigError(f"{owner} is modeled in the {DSV4_CACHE_DTYPE} format only (FlashMLA's); "
                              f"cache_dtype {self.cache_dtype!r} must be {DSV4_CACHE_DTYPE!r}")
        if self.num_kv_heads != 1:
            raise ConfigError(f"{owner} stores one latent vector per state; num_kv_heads {self.num_kv_heads!r} must be 1")
        if self.kind == "dsv4_swa" and not self.sliding_window:
            raise ConfigError(f"{owner} needs sliding_window > 0 (the model's window)")
        if self.kind != "dsv4_swa" and self.sliding_window is not None:
            raise ConfigError(f"{owner} takes no sliding_window (its window, if any, follows from index_kpool)")
        if self.kind == "dsv4_indexer" and self.index_kpool != 4:
            raise ConfigError(f"{owner} belongs to the C4 layers only; index_kpool {self.index_kpool!r} must be 4")
        if self.kind in ("dsv4_attention", "dsv4_compressor_state") and self.index_kpool not in DSV4_COMPRESS_RATIOS:
            raise ConfigError(f"{owner} needs index_kpool, the compress ratio, one of "
                              f"{', '.join(map(str, DSV4_COMPRESS_RATIOS))}; got {self.index_kpool!r}")


@dataclass(frozen=True)
class CaseConfig:
    """Everything the reference needs to derive one model's KV cache layout."""

    name: str
    layers: tuple[LayerConfig, ...]
    block_size: int = 16
    """``--block-size``: the scheduler's logical block size in tokens."""
    model_dtype: str = "bfloat16"
    num_blocks: int | None = 16
    """``num_gpu_blocks_override``; None sizes the pool from ``kv_cache_memory_bytes``."""
    kv_cache_memory_bytes: int | None = None
    layout: str | None = None
    """``VLLM_KV_CACHE_LAYOUT`` (a KVCacheLayout name, or NHD/HND)."""
    connector: str | None = None
    capability: tuple[int, int] = (9, 0)
    """Compute capability the backends are asked about (SM90 = (9, 0))."""
    attention_backend: str | None = None
    """``--attention-backend``, when given explicitly (MRv2 drafts inherit it)."""
    speculative_attention_backend: str | None = None
    max_model_len: int = 4096
    tensor_parallel_size: int = 1
    """``--tensor-parallel-size``. Layers carry per-rank heads already (see
    ``reference.parallel.per_rank_kv_heads``); recorded so a case replays as served."""
    decode_context_parallel_size: int = 1
    """``--decode-context-parallel-size``: a sharded attention block spans ``block_size * dcp`` tokens."""
    prefill_context_parallel_size: int = 1
    """``--prefill-context-parallel-size``: PCP changes no layout (its ranks replicate the cache, or
    shard it through a DCP group spanning them); only MRv2 runs it, for MLA models
    (``reference.parallel.prefill_context_parallel_refusal``)."""
    disable_hybrid_kv_cache_manager: bool = False
    """``--disable-hybrid-kv-cache-manager`` (vLLM's default for chunked local attention and for
    connectors without HMA support): local-attention layers are allocated as full attention."""
    mamba_block_size: int | None = None
    mamba_cache_dtype: str = "auto"
    """``--mamba-cache-dtype``: the dtype of a mixer layer's states (``auto``: the model dtype)."""
    mamba_ssm_cache_dtype: str = "auto"
    """``--mamba-ssm-cache-dtype``: a mixer's SSM / recurrent state (``auto``: as the conv state for
    Mamba-2 and GDN, float32 for KDA)."""
    mamba_cache_mode: str = "none"
    """``--mamba-cache-mode``: ``none`` keeps one state block per request; ``align`` (prefix
    caching of Mamba state) keeps a state block per ``mamba_block_size`` tokens."""
    generation: int = 2
    """1: vLLM 0.19 to 0.28 (per-backend shapes, see reference.gen1); 2: 0.30 and later (KVCacheLayout)."""
    vllm_version: str = TARGET_RELEASE
    """The release the case is judged by (``reference.releases``)."""
    note: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        _text("", "case name", self.name)
        if not self.layers:
            raise ConfigError(f"case {self.name!r} has no layers")
        names = [layer.name for layer in self.layers]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise ConfigError(f"case {self.name!r}: duplicate layer names {dup}")
        _int("", "block size", self.block_size, 1, MAX_TOKENS)
        _int("", "max_model_len", self.max_model_len, 1, MAX_TOKENS)
        _optional_int("", "mamba_block_size", self.mamba_block_size, 1, MAX_TOKENS)
        _optional_int("", "kv_cache_memory_bytes", self.kv_cache_memory_bytes, 1, MAX_BYTES)
        _text("", "vllm_version", self.vllm_version)
        if not isinstance(self.note, str):
            raise ConfigError(f"note {self.note!r} must be a string")
        canonical_model_dtype(self.model_dtype)
        if self.num_blocks is None and self.kv_cache_memory_bytes is None:
            raise ConfigError("set num_blocks or kv_cache_memory_bytes (both are None)")
        _optional_int("", "num_blocks", self.num_blocks, 1, MAX_BLOCKS)
        if self.connector is not None and self.connector not in CONNECTORS:
            raise ConfigError(f"connector {self.connector!r} is not one of {', '.join(CONNECTORS)}")
        from reference.parallel import check_tp_dcp

        for attr in ("tensor_parallel_size", "decode_context_parallel_size", "prefill_context_parallel_size"):
            _int("", attr, getattr(self, attr), 1, MAX_PARALLEL)
        check_tp_dcp(self.tensor_parallel_size, self.decode_context_parallel_size, self.prefill_context_parallel_size)
        if not isinstance(self.disable_hybrid_kv_cache_manager, bool):
            raise ConfigError(
                f"disable_hybrid_kv_cache_manager {self.disable_hybrid_kv_cache_manager!r} must be true or false"
            )
        if self.mamba_cache_mode not in MAMBA_CACHE_MODES:
            raise ConfigError(f"mamba_cache_mode {self.mamba_cache_mode!r} is not one of {', '.join(MAMBA_CACHE_MODES)}")
        if self.generation not in (1, 2):
            raise ConfigError(f"generation {self.generation!r} must be 1 (vLLM < 0.29) or 2 (vLLM >= 0.29)")
        for attr in ("mamba_cache_dtype", "mamba_ssm_cache_dtype"):
            if getattr(self, attr) not in MAMBA_DTYPES:
                raise ConfigError(f"{attr} {getattr(self, attr)!r} is not one of {', '.join(MAMBA_DTYPES)}")
        for index, layer in enumerate(self.layers):
            if layer.mixer is not None:
                _check_mixer_case(self, layer)
            if layer.family == "qwen4_exp":
                _check_qsa_owner(self, index, layer)
            if layer.kind == "inkling_conv_state":
                _check_inkling_owner(self, index, layer)
            if layer.family == "inkling":
                _check_inkling_attention(self, index, layer)
            if layer.family == "step5" or layer.kind in STEP5_SIDE_CACHES:
                _check_step5_layer(self, index, layer)
            if layer.family == "minimax_m3":
                if not layer.name.endswith(".attn"):
                    raise ConfigError(f"layer {layer.name!r}: family 'minimax_m3' registers its main cache as "
                                      f"'{{prefix}}.attn'; name the layer so")
                before = self.layers[index - 1] if index else None
                if before is None or before.name != f"{layer.name}.index_cache" or before.kind != "minimax_indexer":
                    raise ConfigError(f"layer {layer.name!r}: family 'minimax_m3' (MiniMaxM3SparseAttention) builds its "
                                      f"indexer's key cache too: list a 'minimax_indexer' layer named "
                                      f"{layer.name + '.index_cache'!r} right before it (vLLM registers it first)")
        if any(layer.family == "deepseek_v41" for layer in self.layers):
            _check_dsv41_model(self)
        _check_one_model_of_mixers(self)

    # --- JSON ------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        defaults = LayerConfig(name="_")
        data["layers"] = [
            {k: (layer.mixer.to_dict() if k == "mixer" else v) for k, v in asdict(layer).items()
             if k == "name" or v != getattr(defaults, k)}
            for layer in self.layers
        ]
        data["capability"] = list(self.capability)
        # Fields added after reports were published stay out at their default, so a case's JSON
        # (its replay line, a report's config) is what it was before they existed.
        for late, default in (("mamba_cache_dtype", "auto"), ("mamba_ssm_cache_dtype", "auto"),
                              ("prefill_context_parallel_size", 1)):
            if data[late] == default:
                del data[late]
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "CaseConfig":
        if not isinstance(data, Mapping):
            raise ConfigError(f"a case must be a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown case field(s) {unknown}; expected some of {sorted(known)}")
        if "name" not in data or "layers" not in data:
            raise ConfigError("a case needs 'name' and 'layers'")
        layer_fields = {f.name for f in fields(LayerConfig)}
        if not isinstance(data["layers"], (list, tuple)):
            raise ConfigError(f"layers {data['layers']!r} must be a list of layer objects")
        layers = []
        for i, raw in enumerate(data["layers"]):
            if not isinstance(raw, Mapping):
                raise ConfigError(f"layers[{i}] must be a JSON object, got {raw!r}")
            bad = sorted(set(raw) - layer_fields)
            if bad:
                raise ConfigError(f"layers[{i}]: unknown field(s) {bad}; expected some of {sorted(layer_fields)}")
            raw = dict(raw)
            if "mamba_shapes" in raw:
                shapes = raw["mamba_shapes"]
                if not isinstance(shapes, (list, tuple)) or not all(isinstance(s, (list, tuple)) for s in shapes):
                    raise ConfigError(f"layers[{i}]: mamba_shapes {shapes!r} must be a list of lists of positive integers")
                raw["mamba_shapes"] = tuple(tuple(s) for s in shapes)
            if "mamba_dtypes" in raw:
                if not isinstance(raw["mamba_dtypes"], (list, tuple)):
                    raise ConfigError(f"layers[{i}]: mamba_dtypes {raw['mamba_dtypes']!r} must be a list of dtype names")
                raw["mamba_dtypes"] = tuple(raw["mamba_dtypes"])
            if raw.get("mixer") is not None:
                raw["mixer"] = StateMixer.from_dict(raw["mixer"], f"layers[{i}]: ")
            try:
                layers.append(LayerConfig(**raw))
            except TypeError as exc:
                raise ConfigError(f"layers[{i}]: {exc}") from None
        rest = {k: v for k, v in data.items() if k != "layers"}
        if "capability" in rest:
            cap = rest["capability"]
            if not (isinstance(cap, (list, tuple)) and len(cap) == 2
                    and all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= 99 for x in cap)):
                raise ConfigError(f"capability {cap!r} must be [major, minor]")
            rest["capability"] = tuple(cap)
        return cls(layers=tuple(layers), **rest)

    @classmethod
    def from_json(cls, text: str) -> "CaseConfig":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"malformed case JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
        except RecursionError:
            raise ConfigError("case JSON nested too deep to be a case (a case is an object of fields and layers)") from None
        return cls.from_dict(data)

    def with_(self, **changes: Any) -> "CaseConfig":
        return replace(self, **changes)


def _check_qsa_owner(case: "CaseConfig", index: int, layer: LayerConfig) -> None:
    """A ``qwen4_exp`` layer (``Qwen4ExpQSAAttention``) registers its indexer's raw-key ring and compressed keys first,
    then its main cache: the case lists them in that order, named as the class names them, of one compress ratio."""
    prefix = layer.name.removesuffix(".attn")
    expected = ((f"{prefix}.indexer.raw_key_cache", "qsa_key_state"),
                (f"{prefix}.indexer.compressed_key_cache", "qsa_compressed_key"))
    before = case.layers[max(index - 2, 0):index]
    if not layer.name.endswith(".attn") or [(l.name, l.kind) for l in before] != list(expected):
        raise ConfigError(f"layer {layer.name!r}: family 'qwen4_exp' (Qwen4ExpQSAAttention) is named '{{prefix}}.attn' and "
                          f"builds its indexer's side caches first: list {expected[0][1]!r} {expected[0][0]!r} and "
                          f"{expected[1][1]!r} {expected[1][0]!r} right before it")
    if before[0].index_kpool != before[1].index_kpool or before[0].head_size != before[1].head_size:
        raise ConfigError(f"layer {layer.name!r}: its indexer's side caches share one compress ratio and index head size "
                          f"(QSAIndexer), got {before[0].index_kpool}/{before[1].index_kpool} and "
                          f"{before[0].head_size}/{before[1].head_size}")


def _check_inkling_owner(case: "CaseConfig", index: int, layer: LayerConfig) -> None:
    """An ``inkling_conv_state`` layer ``{prefix}.conv_state`` is built by its Inkling decoder layer right before that
    layer's attention, ``{prefix}.attn`` (family ``inkling``), with the attention's KV heads; its packed head holds the
    attention's K and V (``2 * head_dim``) and at least one hidden channel per stream."""
    prefix = layer.name.removesuffix(".conv_state")
    after = case.layers[index + 1] if index + 1 < len(case.layers) else None
    if (not layer.name.endswith(".conv_state") or after is None or after.name != f"{prefix}.attn"
            or after.family != "inkling"):
        raise ConfigError(f"layer {layer.name!r}: kind 'inkling_conv_state' is named '{{prefix}}.conv_state' and built by "
                          f"its Inkling decoder layer: list a family 'inkling' layer {prefix + '.attn'!r} right after it")
    if after.num_kv_heads != layer.num_kv_heads:
        raise ConfigError(f"layer {layer.name!r}: InklingConvState has its attention's KV heads "
                          f"({after.num_kv_heads}), not {layer.num_kv_heads}")
    if layer.head_size < 2 * after.head_size + 2:
        raise ConfigError(f"layer {layer.name!r}: head_size {layer.head_size} must be the power of two InklingConvState "
                          f"pads 2 * {after.head_size} (K and V) + 2 * hidden_size / num_kv_heads to")
    if (layer.head_size - 2 * after.head_size) % 2:
        raise ConfigError(f"layer {layer.name!r}: head_size {layer.head_size} leaves an odd hidden width beside "
                          f"2 * {after.head_size}")


def _check_inkling_attention(case: "CaseConfig", index: int, layer: LayerConfig) -> None:
    """An ``inkling`` layer (``InklingAttention``) is ``{prefix}.attn``, wired to its decoder layer's short-conv state,
    which the case lists right before it (``_check_inkling_owner`` checks the pair from the state's side)."""
    before = case.layers[index - 1] if index else None
    prefix = layer.name.removesuffix(".attn")
    if (not layer.name.endswith(".attn") or before is None or before.name != f"{prefix}.conv_state"
            or before.kind != "inkling_conv_state"):
        raise ConfigError(f"layer {layer.name!r}: family 'inkling' (InklingAttention) is named '{{prefix}}.attn' "
                          f"and wired to its decoder layer's short-conv state: list an 'inkling_conv_state' "
                          f"layer {prefix + '.conv_state'!r} right before it")


def _check_step5_layer(case: "CaseConfig", index: int, layer: LayerConfig) -> None:
    """A ``step5`` layer (``Step5Attention`` with DSA) is ``{prefix}.attn`` and builds its summary cache and tail ring
    right after its ``Attention``: the case lists them in that order, named as the class names them. A side cache
    belongs to the ``step5`` layer listed before it."""
    if layer.family == "step5":
        expected = [(f"{layer.name}{suffix}", kind) for kind, (suffix, _h, _w) in STEP5_SIDE_CACHES.items()]
        after = [(l.name, l.kind) for l in case.layers[index + 1:index + 3]]
        if not layer.name.endswith(".attn") or after != expected:
            raise ConfigError(f"layer {layer.name!r}: family 'step5' (Step5Attention with DSA) is named '{{prefix}}.attn' "
                              f"and builds its CSA side caches after it: list {expected[0][1]!r} {expected[0][0]!r} "
                              f"and {expected[1][1]!r} {expected[1][0]!r} right after it")
        return
    suffix = STEP5_SIDE_CACHES[layer.kind][0]
    owner_name = step5_owner_name(layer)
    if not layer.name.endswith(suffix) or not any(l.name == owner_name and l.family == "step5" for l in case.layers[:index]):
        raise ConfigError(f"layer {layer.name!r}: kind {layer.kind!r} is built by a Step5 DSA layer: name it "
                          f"'{{prefix}}.attn{suffix}' after a family 'step5' layer '{{prefix}}.attn'")


def _check_dsv41_model(case: "CaseConfig") -> None:
    """A DeepSeek V4.1 case is one V4.1 model: its decoder layers' caches only, listed as each ``DeepseekV4Attention``
    registers them (``DSV41_CACHES`` order, layer by layer), with the topology its config can describe (every kv source
    with an index source at or below it, which ``DeepseekV4Attention.__init__`` looks up), on FlashMLA."""
    others = [l.name for l in case.layers if l.family != "deepseek_v41"]
    if others:
        raise ConfigError(f"case {case.name!r}: a DeepSeek V4.1 case lists only its decoder layers' caches (family "
                          f"'deepseek_v41'); layer {others[0]!r} is not one")
    if case.attention_backend != DSV41_ATTENTION_BACKEND:
        raise ConfigError(f"case {case.name!r}: attention_backend {case.attention_backend!r} must be "
                          f"{DSV41_ATTENTION_BACKEND!r} for DeepSeek V4.1 (without it SM100 picks FlashMLA mega "
                          f"attention and SM120 FlashInfer, which the reference does not model)")
    windows = {l.sliding_window for l in case.layers if l.kind == "dsv4_swa"}
    if len(windows) > 1:
        raise ConfigError(f"case {case.name!r}: DeepSeek V4.1's SWA caches share the model's one sliding_window, "
                          f"got {sorted(windows)}")
    order = list(DSV41_CACHES)
    decoder_layers: dict[str, list[LayerConfig]] = {}
    previous = None
    for layer in case.layers:
        prefix = dsv41_prefix(layer)
        if prefix in decoder_layers and prefix != previous:
            raise ConfigError(f"layer {layer.name!r}: list a DeepSeek V4.1 decoder layer's caches together")
        decoder_layers.setdefault(prefix, []).append(layer)
        previous = prefix
    last_index = -1
    index_sources: list[int] = []
    for prefix, layers in decoder_layers.items():
        index = int(prefix.split(".")[-2])
        if index <= last_index:
            raise ConfigError(f"layer {prefix!r}: DeepSeek V4.1 builds its decoder layers in order; list layer {index} "
                              f"after layer {last_index}")
        last_index = index
        kinds = [l.kind for l in layers]
        by_kind = {l.kind: l for l in layers}
        attention = by_kind.get("dsv4_attention")
        ratio = attention.index_kpool if attention is not None else 0
        if attention is None and set(kinds) - {"dsv4_swa"}:
            raise ConfigError(f"layer {prefix!r}: DeepSeek V4.1's indexer keys and compressor rings belong to a kv source; "
                              f"list its compressed cache ('dsv4_attention' {prefix!r}) first")
        expected = [k for k in order if k == "dsv4_swa" or (attention is not None and (
            k == "dsv4_attention" or (k == "dsv4_indexer" and "dsv4_indexer" in by_kind)
            or (k == "dsv4_compressor_state" and ratio == 2)))]
        if kinds != expected:
            raise ConfigError(f"layer {prefix!r}: a DeepSeek V4.1 decoder layer of compress ratio {ratio} registers "
                              f"{', '.join(repr(prefix + DSV41_CACHES[k][0]) for k in expected)} in that order "
                              f"(the kv-source's compressed cache, its indexer keys if an index source, its SWA cache, "
                              f"a ratio-2 compressor's ring); got {', '.join(repr(l.name) for l in layers)}")
        indexer = by_kind.get("dsv4_indexer")
        if indexer is not None and indexer.index_kpool != ratio:
            raise ConfigError(f"layer {indexer.name!r}: the indexer keys are kept at their layer's compress ratio "
                              f"{ratio}, not {indexer.index_kpool}")
        if indexer is not None:
            index_sources.append(index)
        if attention is not None and not index_sources:
            raise ConfigError(f"layer {attention.name!r}: a DeepSeek V4.1 kv source reads the index of the latest index "
                              f"source at or below it; list its indexer keys ('dsv4_indexer' "
                              f"{prefix + DSV41_CACHES['dsv4_indexer'][0]!r}) or an index source before it")


def step5_owner_name(layer: LayerConfig) -> str:
    """The name of the Step5 DSA layer (``{prefix}.attn``) that builds the side cache ``layer``."""
    return layer.name.removesuffix(STEP5_SIDE_CACHES[layer.kind][0])


def _check_one_model_of_mixers(case: "CaseConfig") -> None:
    """A model class reports its state to the block-size negotiation (``get_mamba_state_shape_from_config``,
    Qwen4-exp's ``get_mamba_specs_from_config``): a model's state layers are one mixer (one geometry), the
    two of a ``MIXER_PAIRS`` model, or stand-ins."""
    mixers = {layer.mixer for layer in case.layers if layer.kind == "mamba"}
    kinds = sorted(m.kind if m else "stand-in" for m in mixers)
    if len(mixers) > 1 and not (None not in mixers and len({m.kind for m in mixers}) == len(mixers) == 2
                                and frozenset(kinds) in MIXER_PAIRS):
        pairs = "; ".join(" + ".join(sorted(pair)) + f" ({cls})" for pair, cls in MIXER_PAIRS.items())
        raise ConfigError(f"case {case.name!r}: its state layers are built as {kinds}; a model's state layers "
                          f"share one mixer (its model class reports one state), or are one of the pairs {pairs}")
    for alone, partner in MIXER_ALONE_REFUSED.items():
        if kinds == [alone]:
            raise ConfigError(f"case {case.name!r}: a {alone!r} mixer needs {partner!r} mixer layers beside it "
                              f"(its model, {MIXER_PAIRS[frozenset({alone, partner})]}, reports both states)")


def _check_mixer_case(case: "CaseConfig", layer: LayerConfig) -> None:
    """A mixer layer is a generation-2 case's (no mixer class is driven on the releases before), and
    GDN's and KDA's heads split across the TP ranks (their classes assert it, with no message).
    MambaMixer2's own refusals say why, and the reference predicts them
    (``reference.state_mixers.construction_refusal``)."""
    if case.generation != 2:
        raise ConfigError(f"layer {layer.name!r}: a mixer layer needs generation 2 (vLLM >= 0.29); generation-1 "
                          f"cases give mamba_shapes")
    mixer, tp = layer.mixer, case.tensor_parallel_size
    assert mixer is not None
    if mixer.kind in ("gated_delta_net", "kimi_k3_kda", "glm5next_kda") and mixer.num_heads % tp:
        # GDN's sharded projections and KDA's head split assert it, without a message to predict.
        raise ConfigError(f"layer {layer.name!r}: mixer num_heads {mixer.num_heads} is not divisible by "
                          f"tensor_parallel_size {tp}")


def uniform_layers(
    n: int,
    *,
    prefix: str = "model.layers",
    start: int = 0,
    **layer: Any,
) -> tuple[LayerConfig, ...]:
    """``n`` identical layers named like vLLM's (``model.layers.{i}.self_attn.attn``)."""
    return tuple(LayerConfig(name=f"{prefix}.{i}.self_attn.attn", **layer) for i in range(start, start + n))


# --- request schedules: the case description of a block-table scenario ---------------------
# A scenario is input like a case: KV cache groups, DCP world/rank/interleave and steps of
# scheduler decisions. The drivers run it through vLLM's block tables and the reference
# (reference.block_tables.scenarios) predicts what they hold; here it is only described,
# validated and given its defaults, so both sides read the same explicit data.

Scenario = dict[str, Any]

# Per group kind, what the runners derive from the KV cache spec (research note §2.1/2.2):
# MRv1 SlotMappingMode is NONE iff Mamba; MRv2 slot_mapping_enabled is
# spec.uses_slot_mapping (False only for CircularBufferSpec/HiSparse; Mamba inherits True);
# block_table_token_alignment is None for Mamba and circular-buffer specs; dcp_sharded is
# True for AttentionSpec and False for the base KVCacheSpec (Mamba).
GROUP_KINDS: dict[str, dict[str, Any]] = {
    "attention": {"mrv1_slot_mapping": "token", "mrv2_slot_mapping": True, "token_alignment": 128, "dcp_sharded": True},
    "mamba": {"mrv1_slot_mapping": "none", "mrv2_slot_mapping": True, "token_alignment": None, "dcp_sharded": False},
    "circular": {"mrv1_slot_mapping": "token", "mrv2_slot_mapping": False, "token_alignment": None,
                 "dcp_sharded": True},
    # CrossAttentionSpec: an attention table whose blocks hold a request's encoder tokens,
    # allocated once when its encoder inputs are scheduled (CrossAttentionManager).
    "cross": {"mrv1_slot_mapping": "token", "mrv2_slot_mapping": True, "token_alignment": 128, "dcp_sharded": True},
}

MAX_ENCODER_LEN = 1 << 20
"""The longest encoder input a scenario may give a request (``encoder_lens``)."""

OP_ARITY = {"add": 3, "append": 3, "remove": 2, "preempt": 2, "move": 3, "swap": 3}


class ScenarioError(ValueError):
    """A scenario the driver cannot run (malformed, or an MRv1 batch that is not dense)."""


# --------------------------------------------------------------------------- scenarios


def normalize_scenario(scenario: Mapping[str, Any]) -> Scenario:
    """Fill every default so both the driver and a reference see the same explicit data.

    Shape::

        {"name": str, "max_num_reqs": int, "max_num_batched_tokens": int,
         "dcp": [world_size, rank, interleave],                       # default [1, 0, 1]
         "groups": [{"kind": "attention"|"mamba"|"circular", "block_size": B,
                     "max_num_blocks": n,            # before get_block_table_width
                     "kernel_block_size": K|None, "kernel_block_stride": 0,
                     "sliding_window_reach": 0,      # MRv2 gather nulling (D8)
                     # overridable kind defaults: mrv1_slot_mapping ("token"|"none"),
                     # mrv2_slot_mapping (bool), token_alignment (MRv2 width), dcp_sharded
                     }, ...],
         "steps": [{"ops": [["add", req, [[ids] per group]], ["append", req, [[ids]...]],
                            ["remove", req], ["preempt", req], ["move", src, dst],
                            ["swap", a, b]],
                    "batch": [[req, [positions]], ...],  # MRv1 rows 0..n-1 in order
                    "num_reqs_padded": int,              # default len(batch)
                    "dummy_tokens": [int, ...],          # MRv2 idx_mapping=-1 requests
                    "num_tokens_padded": int}, ...],     # default all tokens
         "draft": {"group": g, "steps": S,               # optional: after every forward,
                   "max_model_len": L},                  # S draft steps of the draft group g
         "kernel_ids": {"mrv1": [R, ...] | None,         # default None: per runner, the kernel ids
                        "mrv2": [R, ...] | None},        # its tables store per block id, per group
                                                         # (vLLM < 0.32); None: the scheduler's ids
         "mrv1_move_clears_source": bool,                # default true; false: vLLM < 0.27 (#49757)
         "mrv2_frees_in_id_order": bool,                 # default true; false: vLLM < 0.29 (set order:
                                                         # which slot a request takes is not compared)
         "widths_token_aligned": bool,                   # default true; false: vLLM < 0.27 (no
                                                         # get_block_table_width: rows unaligned)
         "mrv1_widths_block_aligned": bool,              # default false; true: vLLM 0.21-0.26 (MRv1
                                                         # rows to a multiple of 128 // B blocks)
         "encoder_lens": {req: n, ...}}                  # default {}: each request's encoder input
                                                         # tokens (required for every request when a
                                                         # group is "cross": its blocks hold them)
    """
    if not isinstance(scenario, Mapping):
        raise ScenarioError(f"scenario {scenario!r} is not a JSON object")
    sc = copy.deepcopy(dict(scenario))
    sc.setdefault("name", "scenario")
    for key in ("max_num_reqs", "max_num_batched_tokens", "groups", "steps"):
        if key not in sc:
            raise ScenarioError(f"scenario {sc['name']!r} has no {key!r}")
    sc["dcp"] = list(sc.get("dcp", [1, 0, 1]))
    if len(sc["dcp"]) != 3:
        raise ScenarioError(f"dcp {sc['dcp']!r} is not [world_size, rank, interleave]")
    sc["groups"] = [_normalize_group(g, i) for i, g in enumerate(sc["groups"])]
    sc["steps"] = [_normalize_step(s, len(sc["groups"])) for s in sc["steps"]]
    sc["draft"] = _normalize_draft(sc.get("draft"), sc["groups"])
    sc["kernel_ids"] = _normalize_kernel_ids(sc.get("kernel_ids"), len(sc["groups"]))
    sc["encoder_lens"] = _normalize_encoder_lens(sc.get("encoder_lens"), sc)
    sc.setdefault("mrv1_widths_block_aligned", False)
    for flag in ("mrv1_move_clears_source", "mrv2_frees_in_id_order", "widths_token_aligned", "mrv1_widths_block_aligned"):
        sc.setdefault(flag, True)
        if not isinstance(sc[flag], bool):
            raise ScenarioError(f"{flag} {sc[flag]!r} is not true or false")
    return sc


SCENARIO_RUNNERS = ("mrv1", "mrv2")


def _normalize_encoder_lens(value: Any, sc: Mapping[str, Any]) -> dict[str, int]:
    """Each request's encoder input tokens (what its cross-attention blocks hold): a positive
    integer per request id, one for every added request when a group is ``cross``."""
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        raise ScenarioError(f"encoder_lens {value!r} is not an object mapping request ids to encoder lengths")
    out: dict[str, int] = {}
    for req, n in value.items():
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_ENCODER_LEN:
            raise ScenarioError(f"encoder_lens[{req!r}] {n!r} is not an integer in [1, {MAX_ENCODER_LEN}]")
        out[str(req)] = n
    if any(g["kind"] == "cross" for g in sc["groups"]):
        for step in sc["steps"]:
            for op in step["ops"]:
                if op[0] == "add" and op[1] not in out:
                    raise ScenarioError(f"request {op[1]!r} has no encoder_lens entry; expected one for every request "
                                        f"of a scenario with a cross-attention group")
    return out


def _normalize_kernel_ids(value: Any, num_groups: int) -> dict[str, list[int] | None]:
    """Per runner, None when its block tables store the scheduler's block ids, or per group
    how many kernel block ids they store for each (``b`` as ``b*R .. b*R+R-1``: vLLM before
    0.32, whose builders then take the tables as they are)."""
    if value is None:
        return {runner: None for runner in SCENARIO_RUNNERS}
    if not isinstance(value, Mapping) or set(value) - set(SCENARIO_RUNNERS):
        raise ScenarioError(f"kernel_ids {value!r} is not an object keyed by 'mrv1' / 'mrv2'")
    out: dict[str, list[int] | None] = {}
    for runner in SCENARIO_RUNNERS:
        ratios = value.get(runner)
        if ratios is not None and (not isinstance(ratios, (list, tuple)) or len(ratios) != num_groups or not all(
                isinstance(r, int) and not isinstance(r, bool) and r >= 1 for r in ratios)):
            raise ScenarioError(f"kernel_ids[{runner!r}] {ratios!r} is not null or one positive integer per group "
                                f"({num_groups})")
        out[runner] = None if ratios is None else list(ratios)
    return out


MAX_DRAFT_STEPS = 8
"""Draft steps per forward a scenario may ask for (``num_speculative_tokens - 1``)."""


def _normalize_draft(draft: Any, groups: Sequence[Mapping[str, Any]]) -> dict[str, int] | None:
    """The draft steps after each forward: the drafter's KV cache group, how many steps
    (``num_speculative_tokens - 1``; the first draft token comes from the target's forward)
    and the model length the drafter clamps at."""
    if draft is None:
        return None
    if not isinstance(draft, Mapping):
        raise ScenarioError(f"draft {draft!r} is not an object with 'group', 'steps' and 'max_model_len'")
    out = {}
    for key, low, high in (("group", 0, len(groups) - 1), ("steps", 1, MAX_DRAFT_STEPS), ("max_model_len", 1, 1 << 24)):
        value = draft.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ScenarioError(f"draft {key} {value!r} is not an integer in [{low}, {high}]")
        out[key] = value
    if groups[out["group"]]["kind"] != "attention":
        raise ScenarioError(f"draft group {out['group']} is a {groups[out['group']]['kind']!r} group, not attention")
    return out


def _normalize_group(group: Mapping[str, Any], index: int) -> dict[str, Any]:
    g = dict(group)
    kind = g.setdefault("kind", "attention")
    if kind not in GROUP_KINDS:
        raise ScenarioError(f"group {index} kind {kind!r} is not one of {sorted(GROUP_KINDS)}")
    for key, value in GROUP_KINDS[kind].items():
        g.setdefault(key, value)
    for key in ("block_size", "max_num_blocks"):
        if key not in g:
            raise ScenarioError(f"group {index} has no {key!r}")
    g.setdefault("kernel_block_size", None)
    g.setdefault("kernel_block_stride", 0)
    g.setdefault("sliding_window_reach", 0)
    if g["mrv1_slot_mapping"] not in ("token", "none"):
        raise ScenarioError(f"group {index} mrv1_slot_mapping {g['mrv1_slot_mapping']!r} is not 'token' or 'none'")
    k = g["kernel_block_size"]
    if k is not None and (k <= 0 or g["block_size"] % k):
        raise ScenarioError(f"group {index} kernel block size {k} does not divide block size {g['block_size']}")
    return g


def _normalize_step(step: Mapping[str, Any], num_groups: int) -> dict[str, Any]:
    s = dict(step)
    s["ops"] = [list(op) for op in s.get("ops", [])]
    for op in s["ops"]:
        if not op or op[0] not in OP_ARITY or len(op) != OP_ARITY[op[0]]:
            raise ScenarioError(f"op {op!r} is not one of {sorted(OP_ARITY)} with its arguments")
        if op[0] not in ("move", "swap"):
            op[1] = str(op[1])  # request ids are JSON object keys in the result
        if op[0] in ("add", "append") and len(op[2]) != num_groups:
            raise ScenarioError(f"op {op!r} has block ids for {len(op[2])} groups; expected {num_groups}")
    s["batch"] = [[str(req), list(pos)] for req, pos in s.get("batch", [])]
    s.setdefault("num_reqs_padded", len(s["batch"]))
    s["dummy_tokens"] = list(s.get("dummy_tokens", []))
    num_tokens = sum(len(pos) for _, pos in s["batch"]) + sum(s["dummy_tokens"])
    s.setdefault("num_tokens_padded", num_tokens)
    if s["num_reqs_padded"] < len(s["batch"]) or s["num_tokens_padded"] < num_tokens:
        raise ScenarioError(f"step pads below its real size: {s!r}")
    return s


def step_token_layout(step: Mapping[str, Any]) -> tuple[list[int], list[int], list[int], list[int]]:
    """``(query_start_loc, positions)`` of the real requests, then of real + dummy requests."""
    qsl, positions = [0], []
    for _, pos in step["batch"]:
        positions.extend(pos)
        qsl.append(len(positions))
    qsl_all, positions_all = list(qsl), list(positions)
    for n in step["dummy_tokens"]:
        positions_all.extend([0] * n)  # dummy requests own no blocks: any position
        qsl_all.append(len(positions_all))
    return qsl, positions, qsl_all, positions_all


def last_positions(step: Mapping[str, Any]) -> list[int]:
    """Per batch request, in batch order, its last scheduled position: where the token a
    draft step follows was sampled."""
    return [pos[-1] if pos else 0 for _, pos in step["batch"]]


def first_positions(step: Mapping[str, Any]) -> dict[Any, int]:
    """``num_computed_tokens`` per batch request: its first scheduled position."""
    return {req: (pos[0] if pos else 0) for req, pos in step["batch"]}
