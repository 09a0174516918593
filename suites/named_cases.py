"""Named cases: hand-picked configurations, each a known-interesting corner of the layout.

Used by the reference goldens, the CLI (``kvconform explain <name>``) and the drivers.
Names are stable: they appear in reports and replay commands.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from reference.config import (DSV4_CACHE_DTYPE, DSV41_ATTENTION_BACKEND, DSV41_CACHES, LAYER_OWN_BACKENDS, STATE_MIXERS, STEP5_SIDE_CACHES, CaseConfig, LayerConfig, StateMixer, indexer_k_cache_bytes,
                              uniform_layers)
from reference.errors import ConfigError
from reference.layout import LAYOUT_NAMES as _LAYOUTS


def _qwen3_like(n: int = 2, **layer: object) -> tuple[LayerConfig, ...]:
    geometry = dict(num_kv_heads=8, head_size=128)
    geometry.update(layer)
    return uniform_layers(n, **geometry)  # type: ignore[arg-type]


def _mla_with_gqa_draft(draft_backend: str = "FLASH_ATTN") -> tuple[LayerConfig, ...]:
    return uniform_layers(2, kind="mla", backend="FLASHMLA", head_size=576) + (
        LayerConfig("draft.layers.2.attn", backend=draft_backend, num_kv_heads=8, head_size=128, is_draft=True),
    )


def mla_with_indexer_caches(n: int, mla_backend: str) -> tuple[LayerConfig, ...]:
    """DeepSeek V3.2's layers: per layer an MLA latent cache and its indexer's K cache, named as
    ``DeepseekV2DecoderLayer`` registers them (also the sampler's ``mla_indexer`` family)."""
    return tuple(
        layer
        for i in range(n)
        for layer in (
            LayerConfig(f"model.layers.{i}.self_attn.attn", kind="mla", backend=mla_backend, head_size=576),
            LayerConfig(f"model.layers.{i}.self_attn.indexer.k_cache", kind="mla_indexer",
                        backend=LAYER_OWN_BACKENDS["mla_indexer"][0], head_size=indexer_k_cache_bytes(128)),
        )
    )


def mla_with_kpool_tails(n: int, mla_backend: str, index_kpool: int = 4, *,
                         pooled_indexer: bool = False) -> tuple[LayerConfig, ...]:
    """GLM-5-next's layers: per layer an MLA latent cache and its indexer's kpool tail ring
    (``Glm5NextTailCache``, a ``CircularBufferSpec``), named as the model registers them (also the
    sampler's ``kpool_tail`` family); ``pooled_indexer`` adds the indexer's compressed K cache between
    them (``Glm5NextIndexerCache``: kind ``mla_indexer`` with ``index_kpool``, one state per kpool
    tokens, as models/glm5next/common/attention.py's Indexer builds it)."""
    return tuple(
        layer
        for i in range(n)
        for layer in (
            LayerConfig(f"model.layers.{i}.self_attn.attn", kind="mla", backend=mla_backend, head_size=576),
            *((LayerConfig(f"model.layers.{i}.self_attn.indexer.k_cache", kind="mla_indexer",
                           backend=LAYER_OWN_BACKENDS["mla_indexer"][0], head_size=indexer_k_cache_bytes(128),
                           index_kpool=index_kpool),) if pooled_indexer else ()),
            LayerConfig(f"model.layers.{i}.self_attn.indexer.tail_cache", kind="circular_buffer",
                        backend=LAYER_OWN_BACKENDS["circular_buffer"][0], head_size=128, index_kpool=index_kpool),
        )
    )


def attention_with_qsa_caches(n: int, backend: str = "FLASH_ATTN", *, compress_ratio: int = 4,
                              index_head_size: int = 128, attention: Callable[[str], LayerConfig] | None = None
                              ) -> tuple[LayerConfig, ...]:
    """Qwen4-exp's QSA layers as far as they are modeled: per layer a GQA attention cache (built as vLLM's
    Attention: Qwen4ExpQSAAttention's own impl is not driven) and its two side caches, the compressed keys
    (``QSACompressedKeyCache``) and the compressor's ring of raw keys (``QSAKeyStateCache``). ``attention``
    builds the attention layer by name (default: ``backend``, 2 KV heads of 128)."""
    if attention is None:
        def attention(name: str) -> LayerConfig:
            return LayerConfig(name, backend=backend, num_kv_heads=2, head_size=128)
    return tuple(
        layer
        for i in range(n)
        for layer in (
            attention(f"model.layers.{i}.self_attn.attn"),
            LayerConfig(f"model.layers.{i}.self_attn.qsa.compressed_key_cache", kind="qsa_compressed_key",
                        backend=LAYER_OWN_BACKENDS["qsa_compressed_key"][0], head_size=index_head_size,
                        index_kpool=compress_ratio),
            LayerConfig(f"model.layers.{i}.self_attn.qsa.key_state_cache", kind="qsa_key_state",
                        backend=LAYER_OWN_BACKENDS["qsa_key_state"][0], head_size=index_head_size,
                        index_kpool=compress_ratio),
        )
    )


def deepseek_v4_caches(compress_ratios: Sequence[int], *, sliding_window: int = 128, head_dim: int = 512,
                       index_head_dim: int = 128, prefix: str = "model.layers") -> tuple[LayerConfig, ...]:
    """DeepSeek V4's caches, one decoder layer per compress ratio (0: sliding window only, 4: CSA, 128: HCA), named
    and ordered as ``DeepseekV4Attention.__init__`` registers them: the C4 indexer's key cache and its compressor's
    state, the SWA cache, the compressed attention cache, the attention compressor's state (also the zoo's and the
    sampler's ``dsv4`` family). A compressor keeps ``2 * coff * head_dim`` fp32 floats per state (kv and score;
    ``coff`` 2 for the overlapping ratio 4)."""
    def cache(name: str, kind: str, head_size: int, **extra: int) -> LayerConfig:
        return LayerConfig(name, kind=kind, backend=LAYER_OWN_BACKENDS[kind][0], num_kv_heads=1, head_size=head_size,
                           cache_dtype=DSV4_CACHE_DTYPE, **extra)

    layers: list[LayerConfig] = []
    for i, ratio in enumerate(compress_ratios):
        attn = f"{prefix}.{i}.self_attn"
        coff = 1 + (ratio == 4)
        if ratio == 4:
            layers += [cache(f"{attn}.indexer.k_cache", "dsv4_indexer", indexer_k_cache_bytes(index_head_dim), index_kpool=4),
                       cache(f"{attn}.indexer.compressor.state_cache", "dsv4_compressor_state", 2 * coff * index_head_dim,
                             index_kpool=4)]
        layers.append(cache(f"{attn}.swa_cache", "dsv4_swa", head_dim, sliding_window=sliding_window))
        if ratio:
            layers += [cache(attn, "dsv4_attention", head_dim, index_kpool=ratio),
                       cache(f"{attn}.compressor.state_cache", "dsv4_compressor_state", 2 * coff * head_dim, index_kpool=ratio)]
    return tuple(layers)


def deepseek_v41_caches(decoder_layers: Sequence[tuple[int, bool]], *, sliding_window: int = 128,
                        prefix: str = "model.layers") -> tuple[LayerConfig, ...]:
    """DeepSeek V4.1's caches (family ``deepseek_v41``), one decoder layer per ``(compress ratio, index source)``, named
    and ordered as its ``DeepseekV4Attention`` registers them (``DSV41_CACHES``): ratio 0 is a layer owning only its SWA
    cache (a sliding-window layer, or a consumer of an earlier kv source's compressed cache); ratio 1 or 2 a kv source,
    which owns the compressed cache, its indexer keys when it is an index source, and a ratio-2 compressor's ring
    (also the zoo's and the sampler's ``dsv41`` family). Its cases name FlashMLA (``DSV41_ATTENTION_BACKEND``)."""
    layers: list[LayerConfig] = []
    for i, (ratio, index_source) in enumerate(decoder_layers):
        attn = f"{prefix}.{i}.attn"
        for kind, (suffix, backend, head_size) in DSV41_CACHES.items():
            if kind != "dsv4_swa" and (not ratio or (kind == "dsv4_indexer" and not index_source)
                                       or (kind == "dsv4_compressor_state" and ratio != 2)):
                continue
            layers.append(LayerConfig(attn + suffix, kind=kind, backend=backend, num_kv_heads=1, head_size=head_size,
                                      cache_dtype=DSV4_CACHE_DTYPE, family="deepseek_v41",
                                      sliding_window=sliding_window if kind == "dsv4_swa" else None,
                                      index_kpool=None if kind == "dsv4_swa" else ratio))
    return tuple(layers)


_DSV41_PATTERN = ((1, True), (0, False), (2, True), (2, False), (0, False))
"""A small DeepSeek V4.1: a ratio-1 kv and index source, a layer owning only its SWA cache, a ratio-2 kv and index
source, a ratio-2 kv source reading the index above it, another SWA-only layer."""


def qwen4_exp_qsa_layers(n: int, *, compress_ratio: int = 4, index_head_size: int = 128, num_kv_heads: int = 2,
                         head_size: int = 256, cache_dtype: str = "auto") -> tuple[LayerConfig, ...]:
    """Qwen4-exp's QSA layers built as its own ``Qwen4ExpQSAAttention`` (family ``qwen4_exp``): per layer its indexer's
    raw-key ring and compressed keys, registered first, then the main GQA cache on the layer's own
    QWEN4_EXP_QSA_TRITON backend, named as the class registers them."""
    return tuple(
        layer
        for i in range(n)
        for layer in (
            LayerConfig(f"model.layers.{i}.self_attn.indexer.raw_key_cache", kind="qsa_key_state",
                        backend=LAYER_OWN_BACKENDS["qsa_key_state"][0], head_size=index_head_size, index_kpool=compress_ratio),
            LayerConfig(f"model.layers.{i}.self_attn.indexer.compressed_key_cache", kind="qsa_compressed_key",
                        backend=LAYER_OWN_BACKENDS["qsa_compressed_key"][0], head_size=index_head_size,
                        index_kpool=compress_ratio),
            LayerConfig(f"model.layers.{i}.self_attn.attn", backend="QWEN4_EXP_QSA_TRITON", num_kv_heads=num_kv_heads,
                        head_size=head_size, cache_dtype=cache_dtype, family="qwen4_exp"),
        )
    )


def inkling_layers(local: Sequence[bool], *, num_kv_heads: int = 4, head_size: int = 128, conv_head_size: int = 1024,
                   sconv_kernel_size: int = 4, sliding_window: int = 512) -> tuple[LayerConfig, ...]:
    """Inkling's decoder layers (``models/inkling/nvidia/model.py``), one per entry of ``local``: its short-conv state
    (``InklingConvState``, kind ``inkling_conv_state``: K, V and two hidden chunks per KV head packed into
    ``conv_head_size``, a window and block of ``sconv_kernel_size`` tokens) registered first, then its attention
    (family ``inkling``, global or with a ``sliding_window`` local window), named as the decoder layer names them.
    Inkling's defaults: 4 KV heads of 128 and a 1,536 hidden size (2 x 128 + 2 x 384 = 1,024)."""
    return tuple(
        layer
        for i, is_local in enumerate(local)
        for layer in (
            LayerConfig(f"model.layers.{i}.conv_state", kind="inkling_conv_state",
                        backend=LAYER_OWN_BACKENDS["inkling_conv_state"][0], num_kv_heads=num_kv_heads,
                        head_size=conv_head_size, sliding_window=sconv_kernel_size),
            LayerConfig(f"model.layers.{i}.attn", kind="sliding_window" if is_local else "full", backend="FLASH_ATTN",
                        num_kv_heads=num_kv_heads, head_size=head_size, family="inkling",
                        sliding_window=sliding_window if is_local else None),
        )
    )


def attention_with_minimax_indexers(n: int, backend: str, *, index_cache_dtype: str = "auto") -> tuple[LayerConfig, ...]:
    """MiniMax M3's layers as far as they are modeled: per layer a GQA attention cache (built as vLLM's
    Attention: MiniMaxM3SparseAttention's own block-sparse impl is not driven) and its lightning
    indexer's key-only side cache (``MiniMaxM3IndexerCache``, kind ``minimax_indexer``), named as
    ``MiniMaxM3Indexer(prefix=layer_name)`` registers it (``{layer_name}.index_cache``)."""
    return tuple(
        layer
        for i in range(n)
        for layer in (
            LayerConfig(f"model.layers.{i}.self_attn.attn", backend=backend, num_kv_heads=4, head_size=128),
            LayerConfig(f"model.layers.{i}.self_attn.attn.index_cache", kind="minimax_indexer",
                        backend=LAYER_OWN_BACKENDS["minimax_indexer"][0], head_size=128, cache_dtype=index_cache_dtype),
        )
    )


def minimax_m3_sparse_layers(n: int, *, num_kv_heads: int = 4, index_dim: int = 128,
                             index_cache_dtype: str = "auto") -> tuple[LayerConfig, ...]:
    """MiniMax M3's sparse layers built as its own ``MiniMaxM3SparseAttention`` (family ``minimax_m3``): per layer
    the lightning indexer's key cache, registered first, then the main GQA cache on the layer's own
    MINIMAX_M3_SPARSE backend, named as the class registers them."""
    return tuple(
        layer
        for i in range(n)
        for layer in (
            LayerConfig(f"model.layers.{i}.self_attn.attn.index_cache", kind="minimax_indexer",
                        backend=LAYER_OWN_BACKENDS["minimax_indexer"][0], head_size=index_dim, cache_dtype=index_cache_dtype),
            LayerConfig(f"model.layers.{i}.self_attn.attn", backend="MINIMAX_M3_SPARSE", num_kv_heads=num_kv_heads,
                        head_size=128, family="minimax_m3"),
        )
    )


def step5_layers(dsa: Sequence[bool], *, num_kv_heads: int = 2, head_size: int = 192, cache_dtype: str = "auto",
                 sliding_window: int = 512) -> tuple[LayerConfig, ...]:
    """Step5's attention layers (``models/step5/nvidia/model.py``), one per entry of ``dsa``: a DSA layer (a
    full-attention layer of a checkpoint with a ``sparse_config``) is built as its own ``Step5Attention`` (family
    ``step5``): vLLM's ``Attention`` on ``STEP5_DSA``, then its region summaries and the open region's ring, named as
    the class registers them; any other layer is a sliding-window layer on FlashAttention (Step5's split-KV subclass
    keeps the ``FLASH_ATTN`` name and page), of the same geometry."""
    layers: list[LayerConfig] = []
    for i, is_dsa in enumerate(dsa):
        name = f"model.layers.{i}.self_attn.attn"
        if not is_dsa:
            layers.append(LayerConfig(name, kind="sliding_window", num_kv_heads=num_kv_heads, head_size=head_size,
                                      cache_dtype=cache_dtype, sliding_window=sliding_window))
            continue
        layers.append(LayerConfig(name, backend="STEP5_DSA", num_kv_heads=num_kv_heads, head_size=head_size,
                                  cache_dtype=cache_dtype, family="step5"))
        for kind, (suffix, side_head_size, _what) in STEP5_SIDE_CACHES.items():
            layers.append(LayerConfig(name + suffix, kind=kind, backend=LAYER_OWN_BACKENDS[kind][0], num_kv_heads=1,
                                      head_size=side_head_size))
    return tuple(layers)


def _attention_and_mamba(*, num_kv_heads: int, mamba_layers: int, mamba_shapes: tuple[tuple[int, ...], ...]) -> tuple[LayerConfig, ...]:
    """Two attention layers (head size 64) then ``mamba_layers`` Mamba-2 mixers."""
    mixers = tuple(
        LayerConfig(f"model.layers.{i}.mixer", kind="mamba", backend="MAMBA2_ATTN", mamba_shapes=mamba_shapes)
        for i in range(2, 2 + mamba_layers)
    )
    return uniform_layers(2, num_kv_heads=num_kv_heads, head_size=64) + mixers


def _attention_and_mixers(mixer: StateMixer, *, num_kv_heads: int = 2, mixers: int = 2) -> tuple[LayerConfig, ...]:
    """Two attention layers (head size 64) then ``mixers`` state layers built as vLLM's own ``mixer`` class."""
    backend = STATE_MIXERS[mixer.kind][0]
    states = tuple(LayerConfig(f"model.layers.{i}.linear_attn", kind="mamba", backend=backend, mixer=mixer)
                   for i in range(2, 2 + mixers))
    return uniform_layers(2, num_kv_heads=num_kv_heads, head_size=64) + states


_SMALL_GDN = StateMixer("gated_delta_net", num_heads=4, head_dim=32, num_k_heads=2, head_k_dim=32)
"""A small Gated DeltaNet geometry (conv (3, 256) + recurrent (4, 32, 32)): Qwen4-exp's and ColQwen3.5's cases."""


def _qwen4_exp_gdn_ple_and_qsa(*, num_kv_heads: int = 2) -> tuple[LayerConfig, ...]:
    """Qwen4-exp's decoder layers as far as its caches go: two Gated DeltaNet layers, the first of which (a
    ``ple_layer_ids`` layer) also has its PLE short conv (``{prefix}.ple``, Qwen4ExpPLELayer, at the checkpoint's
    hidden size 2048, 4 streams, kernel 4, n-gram 3), then a QSA attention layer with its side caches."""
    gdn = _SMALL_GDN
    ple = StateMixer("qwen4_exp_ple", hidden_size=2048, hc_count=4, ngram_size=3)
    states = (
        LayerConfig("model.layers.0.linear_attn", kind="mamba", backend="GDN_ATTN", mixer=gdn),
        LayerConfig("model.layers.0.ple", kind="mamba", backend="PLE_SHORT_CONV_ATTN", mixer=ple),
        LayerConfig("model.layers.1.linear_attn", kind="mamba", backend="GDN_ATTN", mixer=gdn),
    )
    qsa = tuple(replace(l, name=l.name.replace("model.layers.0.", "model.layers.2."))
                for l in qwen4_exp_qsa_layers(1, num_kv_heads=num_kv_heads))
    return states + qsa


def _kimi_k3_like_mla_hybrid() -> tuple[LayerConfig, ...]:
    """Kimi K3's shape: two MLA layers, then two KDA mixers on their own backend."""
    return (tuple(LayerConfig(f"model.layers.{i}.self_attn.attn", kind="mla", backend="FLASHMLA", head_size=576)
                  for i in range(2))
            + tuple(LayerConfig(f"model.layers.{i}.self_attn", kind="mamba", backend="KIMI_K3_KDA",
                                mixer=StateMixer("kimi_k3_kda", num_heads=4, head_dim=32)) for i in range(2, 4)))


def _colqwen_like() -> tuple[LayerConfig, ...]:
    """ColQwen3.5's layer style: Gated DeltaNet state layers and encoder-only (bidirectional) attention, no KV
    cache of attention."""
    gdn = _SMALL_GDN
    return (
        LayerConfig("model.layers.0.linear_attn", kind="mamba", backend="GDN_ATTN", mixer=gdn),
        LayerConfig("model.layers.1.linear_attn", kind="mamba", backend="GDN_ATTN", mixer=gdn),
        LayerConfig("model.layers.2.self_attn.attn", kind="encoder_only", num_kv_heads=2, head_size=64),
    )


def _bert_like(backend: str, n: int = 2) -> tuple[LayerConfig, ...]:
    """A BERT-like pooling model's layers: EncoderOnlyAttention, 12 heads of 64, no KV cache."""
    return tuple(LayerConfig(f"model.encoder.layer.{i}.attention.self.attn", kind="encoder_only", backend=backend,
                             num_kv_heads=12, head_size=64) for i in range(n))


def _tiny(n: int, *, num_kv_heads: int = 2, **layer: object) -> tuple[LayerConfig, ...]:
    return uniform_layers(n, num_kv_heads=num_kv_heads, head_size=8, backend="FLASH_ATTN", **layer)  # type: ignore[arg-type]


def _build() -> dict[str, CaseConfig]:
    cases: list[CaseConfig] = []
    for layout in _LAYOUTS:
        cases.append(
            CaseConfig(
                f"dense-fa-b128-{layout.lower()}",
                _qwen3_like(),
                block_size=128,
                num_blocks=4,
                layout=layout,
                note="Two Qwen3-like layers, 8 KV heads x 128, bf16 (research: worked example A).",
            )
        )
    cases += [
        CaseConfig(
            "flashinfer-b128-k64",
            _qwen3_like(backend="FLASHINFER"),
            block_size=128,
            num_blocks=4,
            layout="LBNHC",
            note="FlashInfer supports 16/32/64, so 128-token blocks are viewed as 64-token kernel blocks (#42846).",
        ),
        CaseConfig(
            "flashinfer-b128-k64-hnd",
            _qwen3_like(backend="FLASHINFER"),
            block_size=128,
            num_blocks=4,
            layout="LBHNC",
        ),
        CaseConfig(
            "flashinfer-b128-k64-lhbnc",
            _qwen3_like(backend="FLASHINFER"),
            block_size=128,
            num_blocks=4,
            layout="LHBNC",
            note="LHBNC's block stride is not a dense page: vLLM refuses to split.",
        ),
        CaseConfig(
            "flashinfer-b128-blhnc-packed",
            _qwen3_like(backend="FLASHINFER"),
            block_size=128,
            num_blocks=4,
            layout="BLHNC",
            note="Packed block-outermost group: no split in prepare_kernel_block_sizes, then FlashInfer's builder fails.",
        ),
        CaseConfig(
            "flashinfer-b16",
            _qwen3_like(backend="FLASHINFER"),
            block_size=16,
            num_blocks=8,
        ),
        CaseConfig(
            "flashinfer-sm100-b128",
            _qwen3_like(backend="FLASHINFER"),
            block_size=128,
            num_blocks=4,
            capability=(10, 0),
            note="On SM100 FlashInfer (TRT-LLM) accepts 128-token kernel blocks and declares LBHNC/BLHNC.",
        ),
        CaseConfig(
            "tiny-uniform-lbnhc",
            _tiny(2),
            block_size=16,
            num_blocks=None,
            kv_cache_memory_bytes=20485,
            layout="LBNHC",
            note="Research: uniform placement, 2 layers H=2 D=8 bf16, 20485 bytes -> 10 blocks.",
        ),
        CaseConfig("tiny-uniform-blhnc", _tiny(2), block_size=16, num_blocks=10, layout="BLHNC"),
        CaseConfig("tiny-uniform-lhbnc", _tiny(2), block_size=16, num_blocks=10, layout="LHBNC"),
        CaseConfig(
            "tiny-mixed-heads-lbnhc",
            (
                LayerConfig("model.layers.0.attn", backend="FLASH_ATTN", num_kv_heads=2, head_size=8),
                LayerConfig("model.layers.1.attn", backend="FLASH_ATTN", num_kv_heads=4, head_size=8),
            ),
            block_size=16,
            num_blocks=10,
            layout="LBNHC",
            note="Research: one UniformType group of mixed head counts.",
        ),
        CaseConfig(
            "tiny-mixed-heads-blhnc",
            (
                LayerConfig("model.layers.0.attn", backend="FLASH_ATTN", num_kv_heads=2, head_size=8),
                LayerConfig("model.layers.1.attn", backend="FLASH_ATTN", num_kv_heads=4, head_size=8),
            ),
            block_size=16,
            num_blocks=10,
            layout="BLHNC",
        ),
        CaseConfig(
            "mla-gqa-draft-b64",
            _mla_with_gqa_draft(),
            block_size=64,
            num_blocks=4,
            layout="LBNHC",
            note="Research: worked example B; MLA target and GQA Eagle draft share one UniformType group.",
        ),
        CaseConfig("mla-gqa-draft-b64-blhnc", _mla_with_gqa_draft(), block_size=64, num_blocks=4, layout="BLHNC"),
        CaseConfig(
            "mla-gqa-draft-b128-k64",
            _mla_with_gqa_draft(),
            block_size=128,
            num_blocks=4,
            layout="LBNHC",
            note="FLASHMLA needs 64-token kernel blocks; the draft shares the split (the Mooncake shape[-3] bug class).",
        ),
        CaseConfig(
            "mla-flashinfer-draft-mooncake",
            _mla_with_gqa_draft("FLASHINFER"),
            block_size=128,
            num_blocks=4,
            connector="mooncake",
            note="Mixed MLA + Eagle registered through Mooncake.",
        ),
        CaseConfig(
            "swa-hybrid-scaled",
            _tiny(2) + _tiny(2, num_kv_heads=1, kind="sliding_window", sliding_window=64, start=2),
            block_size=32,
            num_blocks=8,
            note="Research: FA page 2048 and SW page 1024 -> the SW block size doubles to 64.",
        ),
        CaseConfig(
            "swa-hybrid-padded",
            _tiny(2) + _tiny(2, num_kv_heads=3, kind="sliding_window", sliding_window=64, start=2),
            block_size=32,
            num_blocks=8,
            note="Research: FA page 2048 and SW page 3072 -> the full-attention pages are padded to 3072.",
        ),
        CaseConfig(
            "mamba-hybrid",
            _attention_and_mamba(num_kv_heads=2, mamba_layers=2, mamba_shapes=((2, 64), (4, 32, 16))),
            block_size=16,
            num_blocks=16,
            note="Attention page 8192, Mamba state 4352 bytes padded to 8192.",
        ),
        # State layers built as vLLM's own mixer classes (the state is the class's own arithmetic).
        CaseConfig(
            "mamba2-mixer-hybrid",
            _attention_and_mixers(StateMixer("mamba2", num_heads=8, head_dim=16, n_groups=2, state_size=16)),
            block_size=32,
            num_blocks=16,
            note="MambaMixer2 (Nemotron-H's mixer): conv (3, 192) + SSM (8, 16, 16) bf16 = 5248 bytes, padded to the "
            "16384-byte attention page.",
        ),
        CaseConfig(
            "mamba2-mixer-tp2-one-group",
            _attention_and_mixers(StateMixer("mamba2", num_heads=8, head_dim=16, n_groups=1, state_size=16), num_kv_heads=1),
            block_size=32,
            num_blocks=16,
            tensor_parallel_size=2,
            note="One B/C group at TP 2: MambaMixer2 replicates it per head shard (extra_groups_for_head_shards), "
            "so each rank's conv state is (3, 96), not (3, 80).",
        ),
        CaseConfig(
            "qwen3-next-gdn-hybrid",
            _attention_and_mixers(StateMixer("gated_delta_net", num_heads=4, head_dim=32, num_k_heads=2, head_k_dim=32)),
            block_size=64,
            num_blocks=16,
            note="QwenGatedDeltaNetAttention (Qwen3-Next): conv (3, 256) + recurrent (4, 32, 32) bf16 = 9728 bytes, "
            "padded to the 32768-byte attention page.",
        ),
        CaseConfig(
            "kimi-k3-kda-hybrid",
            _attention_and_mixers(StateMixer("kimi_k3_kda", num_heads=4, head_dim=32)),
            block_size=64,
            num_blocks=16,
            note="KimiK3DeltaAttention on its own KIMI_K3_KDA backend: conv (3, 384) bf16 + recurrent (4, 32, 32) "
            "float32 (KDA's 'auto') = 18688 bytes, padded to the 32768-byte attention page.",
        ),
        CaseConfig(
            "kimi-k3-mla-own-class-b64",
            tuple(LayerConfig(f"language_model.model.layers.{i}.self_attn", kind="mla", backend="FLASHMLA", head_size=576,
                              family="kimi_k3") for i in range(2)),
            block_size=64,
            num_blocks=16,
            note="Kimi K3's MLA layers built as its own MultiHeadLatentAttention (its backend selected by the layer, "
            "registered as ...self_attn): the same MLAAttentionSpec as vLLM's generic MLAAttention.",
        ),
        CaseConfig(
            "kimi-k3-mla-pcp2-refused",
            tuple(LayerConfig(f"language_model.model.layers.{i}.self_attn", kind="mla", backend="FLASHMLA", head_size=576,
                              family="kimi_k3") for i in range(2)),
            block_size=64,
            num_blocks=16,
            prefill_context_parallel_size=2,
            note="Kimi K3's own MLA class under prefill context parallelism: MRv2 accepts PCP for an MLA model, then "
            "the layer's constructor asserts it is off; MRv1 refuses PCP outright.",
        ),
        CaseConfig(
            "minimax-m3-sparse-own-class-b128",
            minimax_m3_sparse_layers(2),
            block_size=128,
            num_blocks=16,
            note="MiniMax M3's sparse layers built as its own MiniMaxM3SparseAttention: the layer picks its Triton "
            "block-sparse backend (128-token kernel blocks) and registers its indexer's key cache before its GQA cache.",
        ),
        CaseConfig(
            "minimax-m3-sparse-b64-refused",
            minimax_m3_sparse_layers(1),
            block_size=64,
            num_blocks=16,
            note="MiniMax M3's own sparse attention at --block-size 64: its backend takes only 128-token kernel blocks.",
        ),
        CaseConfig(
            "qwen4-qsa-own-class-b64",
            qwen4_exp_qsa_layers(2),
            block_size=64,
            num_blocks=16,
            note="Qwen4-exp's QSA layers built as its own Qwen4ExpQSAAttention: its indexer's 4-token raw-key ring and "
            "compressed keys (one per 4 tokens), then the 2 x 256 GQA cache on the layer's own QWEN4_EXP_QSA_TRITON "
            "backend (16-token multiples).",
        ),
        CaseConfig(
            "qwen4-qsa-own-class-fp16-refused",
            qwen4_exp_qsa_layers(1),
            block_size=64,
            num_blocks=16,
            model_dtype="float16",
            note="Qwen4-exp's QSA attention with a float16 model: its constructor refuses (BF16 only), before it "
            "builds its indexer.",
        ),
        CaseConfig(
            "inkling-sconv-b16",
            inkling_layers((False, True)),
            block_size=16,
            num_blocks=16,
            note="Inkling's own layers (models/inkling/nvidia): per decoder layer its InklingConvState (the 4-token "
            "short-conv window of K, V and two hidden chunks, 4 x 1,024 bf16 = 8 KiB a token, in 4-token blocks on its "
            "INKLING_SCONV_SWA builder) then its InklingAttention, global then local (a 512-token window at --block-size), "
            "on FlashAttention: one 32 KiB page for all, the conv states' blocks as long as their windows.",
        ),
        CaseConfig(
            "inkling-sconv-fp8-b16",
            tuple(replace(l, cache_dtype="fp8") if l.kind != "inkling_conv_state" else l for l in inkling_layers((False, True))),
            block_size=16,
            num_blocks=16,
            note="inkling-sconv-b16 with an fp8 cache on its attention: InklingAttention's spec sets no kv_quant_mode, so "
            "its pages are plain fp8 K and V, no scales: 16 KiB a 16-token block, half the bf16 conv states' 32 KiB "
            "4-token page, so the page unifier doubles the attention blocks to 32 tokens.",
        ),
        CaseConfig(
            "inkling-hma-off-windows-refused",
            inkling_layers((False, True)),
            block_size=16,
            num_blocks=16,
            disable_hybrid_kv_cache_manager=True,
            note="inkling-sconv-b16 with --disable-hybrid-kv-cache-manager: the conv states (4-token windows) and the "
            "local layer (512) are promoted to full attention beside the global one, and FullAttentionSpec.merge refuses "
            "two window sizes in one group (ValueError), before it would compare their different heads.",
        ),
        CaseConfig(
            "inkling-hma-off-builder-refused",
            inkling_layers((False, False)),
            block_size=16,
            num_blocks=16,
            disable_hybrid_kv_cache_manager=True,
            note="Global Inkling layers only, with --disable-hybrid-kv-cache-manager: the conv states are promoted to full "
            "attention (one 4-token window: the merge passes), and their INKLING_SCONV_SWA builder asserts it is given a "
            "SlidingWindowSpec (a bare AssertionError).",
        ),
        CaseConfig(
            "inkling-sconv-fp16-refused",
            inkling_layers((False,)),
            block_size=16,
            num_blocks=16,
            model_dtype="float16",
            note="Inkling with a float16 model: InklingConvState's constructor asserts bfloat16.",
        ),
        CaseConfig(
            "step5-dsa-b64",
            step5_layers((False, True, False, True)),
            block_size=64,
            num_blocks=16,
            note="Step5's layer mix: sliding-window layers on FlashAttention between DSA layers built as its own "
            "Step5Attention (2 x 192 GQA on STEP5_DSA, 98304 bytes a 64-token block, 8-token pages tiling the block "
            "stride), each with its region summaries (one 256-byte FP8 row per 8 tokens, 2048 bytes, in its group) and "
            "its ring (one main page: 96 rows of 1 KiB). BLNHC only (the DSA backend packs the summaries beside the KV "
            "in each block), so each block stride is rounded up to a 12288-byte multiple. MRv1 refuses a Step5 model.",
        ),
        CaseConfig(
            "step5-dsa-fp8-ring-refused",
            step5_layers((True,), num_kv_heads=1, cache_dtype="fp8"),
            block_size=16,
            num_blocks=16,
            note="A one-head fp8 DSA layer at --block-size 16: its 6144-byte main page holds 6 ring rows, fewer than the 7 "
            "a closing region replays, so Step5CSATailRing refuses ('increase --block-size').",
        ),
        CaseConfig(
            "step5-dsa-head128-refused",
            step5_layers((True,), head_size=128),
            block_size=64,
            num_blocks=16,
            note="A 128-wide DSA layer: Step5Attention accepts head size 128 or 192, its impl's kernels only 192.",
        ),
        CaseConfig(
            "glm5next-kda-hybrid",
            _attention_and_mixers(StateMixer("glm5next_kda", num_heads=4, head_dim=32)),
            block_size=64,
            num_blocks=16,
            mamba_ssm_cache_dtype="bfloat16",
            note="Glm5NextLinearAttention with --mamba-ssm-cache-dtype bfloat16: conv (3, 384) + recurrent (4, 32, 32) "
            "bf16 = 10496 bytes.",
        ),
        CaseConfig(
            "qwen4-exp-gdn-ple-b64",
            _qwen4_exp_gdn_ple_and_qsa(),
            block_size=64,
            num_blocks=16,
            note="Qwen4-exp's layer mix: Gated DeltaNet layers (conv (3, 256) + recurrent (4, 32, 32) = 9728 bytes), the "
            "first with its PLE short conv at the checkpoint's geometry (9 inputs, 3 dilated by the n-gram size 3, over "
            "2048 x 4 hyper-connection channels = 147456 bytes), and a QSA attention layer (2 x 256 GQA, 131072 bytes "
            "a 64-token block) with its indexer's ring and compressed keys. The model class reports both states "
            "(get_mamba_specs_from_config); the PLE's outgrows the attention page, so the block becomes 128 and both "
            "states are padded to 262144 bytes.",
        ),
        CaseConfig(
            "qwen4-exp-gdn-ple-tp2",
            _qwen4_exp_gdn_ple_and_qsa(num_kv_heads=1),
            block_size=64,
            num_blocks=16,
            tensor_parallel_size=2,
            note="At TP 2 the GDN state halves (conv (3, 128) + recurrent (2, 32, 32) = 4864 bytes) while the PLE conv "
            "state stays whole on every rank (is_kv_cache_tp_replicated: 147456 bytes), so the one-head attention "
            "block goes from 64 to 192 tokens (three 64-token alignments) and both states are padded to 196608 bytes.",
        ),
        CaseConfig(
            "gdn-state-raises-block-size",
            uniform_layers(1, num_kv_heads=2, head_size=256)
            + (LayerConfig("model.layers.1.linear_attn", kind="mamba", backend="GDN_ATTN",
                           mixer=StateMixer("gated_delta_net", num_heads=32, head_dim=128, num_k_heads=16, head_k_dim=128)),),
            block_size=16,
            num_blocks=8,
            note="Qwen3-Next's GDN state (1097728 bytes) outgrows the 16-token attention page (32768 bytes): "
            "update_block_size_for_backend raises the block to 544 tokens (34 FlashAttention kernel blocks of 16) "
            "and pads the state to the 1114112-byte attention page.",
        ),
        CaseConfig(
            "kimi-k3-kda-mla-b64",
            _kimi_k3_like_mla_hybrid(),
            block_size=64,
            num_blocks=8,
            note="Kimi K3's shape (MLA + KDA): an MLA hybrid's block is aligned to 128 tokens "
            "(_align_hybrid_block_size, for TRT-LLM/FlashInfer MLA's split kernel blocks), so --block-size 64 "
            "becomes 128 although the 18688-byte KDA state fits a 64-token MLA page.",
        ),
        CaseConfig(
            "kda-fp16-state-refused",
            _attention_and_mixers(StateMixer("glm5next_kda", num_heads=4, head_dim=32), mixers=1),
            block_size=64,
            num_blocks=16,
            mamba_ssm_cache_dtype="float16",
            note="KDA keeps its recurrent state in float32 or bfloat16 only: vLLM refuses float16 "
            "(MambaStateDtypeCalculator.kda_state_dtype).",
        ),
        CaseConfig(
            "mla-gqa-draft-dcp2",
            _mla_with_gqa_draft(),
            block_size=64,
            num_blocks=4,
            tensor_parallel_size=4,
            decode_context_parallel_size=2,
            note="DeepSeek-like MLA + Eagle draft at TP 4 / DCP 2: the same pages; a block spans 128 tokens.",
        ),
        CaseConfig(
            "bert-encoder-only-b16",
            _bert_like("FLASH_ATTN"),
            block_size=16,
            num_blocks=8,
            note="A BERT-like pooling model: EncoderOnlyAttention layers keep no KV cache (no group, no tensor); their "
            "metadata builders are MRv1's appended EncoderOnlyAttentionSpec group and MRv2's EncoderOnlyModelState.",
        ),
        CaseConfig(
            "encoder-only-beside-kv-b16",
            uniform_layers(2, num_kv_heads=2, head_size=64) + _bert_like("FLASH_ATTN"),
            block_size=16,
            num_blocks=16,
            note="Encoder-only layers beside decoder layers with a KV cache: only the decoder layers get groups and "
            "tensors; the encoder-only layers' metadata builders still exist, over --block-size (MRv1 appends their "
            "EncoderOnlyAttentionSpec group to its own copy of the config, MRv2 builds them in EncoderOnlyModelState).",
        ),
        CaseConfig(
            "colqwen-like-gdn-encoder-only",
            _colqwen_like(),
            block_size=16,
            num_blocks=16,
            note="ColQwen3.5's shape (Attention.get_kv_cache_spec's comment): Gated DeltaNet layers interleaved with "
            "encoder-only attention. The GDN states are the only KV cache; the block-size negotiation still reasons "
            "with the attention page of the model's heads (2 x 64 bf16 K and V, 512 bytes a token), so --block-size 16 "
            "is raised to 32 for the 9728-byte state (padded to 16384), and the encoder-only builders run over "
            "32-token blocks.",
        ),
        CaseConfig(
            "bert-encoder-only-flashinfer-refused",
            _bert_like("FLASHINFER"),
            block_size=16,
            num_blocks=8,
            note="FlashInfer does not support encoder-only attention (supports_attn_type): the platform never selects it.",
        ),
        CaseConfig(
            "qwen4-qsa-caches-b64",
            attention_with_qsa_caches(2, "FLASH_ATTN"),
            block_size=64,
            num_blocks=16,
            layout="BLHNC",
            note="Qwen4-exp's QSA layers: GQA attention with a compressed key per 4 tokens (an MLAAttentionSpec, "
            "tokens_per_state 4) and a 4-token ring of raw keys per request (a CircularBufferSpec), bf16 keys of 128.",
        ),
        CaseConfig(
            "dsv4-caches-b256",
            deepseek_v4_caches((0, 4, 128)),
            block_size=256,
            num_blocks=8,
            note="DeepSeek V4's caches, one decoder layer each of sliding window only, CSA (compress ratio 4, with the "
            "indexer) and HCA (128), fp8_ds_mla: nine caches of five block sizes (64-token SWA, 256-token compressed "
            "attention and indexer, 4- and 8-token fp32 compressor states) packed side by side in one BLHNC block.",
        ),
        CaseConfig(
            "dsv4-flash-pattern-b256",
            deepseek_v4_caches((0, 0, 4, 128, 4, 128)),
            block_size=256,
            num_blocks=8,
            note="DeepSeek-V4-Flash's layer pattern (two sliding-window layers, then CSA and HCA alternating): the "
            "packing splits the balanced buckets into groups of whole pattern repeats (_approximate_gcd).",
        ),
        CaseConfig(
            "dsv4-b512-refused",
            deepseek_v4_caches((0, 4, 128)),
            block_size=512,
            num_blocks=8,
            note="DeepSeek V4 at --block-size 512: the indexer and FlashMLA need 256-token kernel blocks, which a "
            "packed (block-outermost) 512-token block cannot be split into; vLLM refuses.",
        ),
        CaseConfig(
            "dsv4-zero-page-b48",
            deepseek_v4_caches((0, 4, 128)),
            block_size=48,
            num_blocks=8,
            note="DeepSeek V4 at --block-size 48: the HCA cache's 16-token kernel-block alignment holds no 128-token "
            "state, a page of 0 bytes, and vLLM's planning divides by it (ZeroDivisionError: "
            "docs/findings/dsv4-zero-byte-stride-alignment.md); the reference refuses it with what is wrong.",
        ),
        CaseConfig(
            "dsv4-b128-refused",
            deepseek_v4_caches((0, 4, 128)),
            block_size=128,
            num_blocks=8,
            note="DeepSeek V4 at --block-size 128: no kernel block size divides it for the 256-token indexer.",
        ),
        CaseConfig(
            "dsv4-lbhnc-refused",
            deepseek_v4_caches((0, 4, 128)),
            block_size=256,
            num_blocks=8,
            layout="LBHNC",
            note="DeepSeek V4 under VLLM_KV_CACHE_LAYOUT=LBHNC: its caches' pages differ, and the indexer takes only "
            "block-outermost layouts; vLLM refuses the layout.",
        ),
        CaseConfig(
            "dsv4-dcp2-refused",
            deepseek_v4_caches((0, 4, 128)),
            block_size=256,
            num_blocks=8,
            tensor_parallel_size=2,
            decode_context_parallel_size=2,
            note="DeepSeek V4 under DCP 2: the C4 indexer's metadata builder refuses (each compressed state must live "
            "on one rank; DeepSeek V4 is not supported).",
        ),
        CaseConfig(
            "dsv4-hma-off",
            deepseek_v4_caches((0, 4, 128)),
            block_size=256,
            num_blocks=8,
            disable_hybrid_kv_cache_manager=True,
            note="DeepSeek V4 with the hybrid KV cache manager off: vLLM's promotion of the sliding-window MLA caches "
            "to full attention passes bounded_replay to MLAAttentionSpec and raises TypeError "
            "(docs/findings/swa-mla-promotion-bounded-replay.md; expectation swa-mla-promotion-passes-bounded-replay).",
        ),
        CaseConfig(
            "dsv41-caches-b64",
            deepseek_v41_caches(_DSV41_PATTERN),
            block_size=64,
            num_blocks=8,
            attention_backend=DSV41_ATTENTION_BACKEND,
            note="DeepSeek V4.1's decoder layers built as its own DeepseekV4Attention on FlashMLA (SM90): kv sources of "
            "compress ratio 1 and 2, with and without indexer keys, and layers owning only their SWA cache; V4's "
            "584-byte records in 576-byte pages, 32-token SWA blocks, a ratio-2 compressor's 8-row fp32 ring. MRv2 "
            "keeps the SWA window out of prefix caching (bounded replay), MRv1 does not.",
        ),
        CaseConfig(
            "dsv41-mxfp8-sm100-b128",
            deepseek_v41_caches(_DSV41_PATTERN),
            block_size=128,
            num_blocks=8,
            attention_backend=DSV41_ATTENTION_BACKEND,
            capability=(10, 0),
            note="DeepSeek V4.1 on SM100: FlashMLA decodes V4.1's MXFP8 record (528 bytes, 512-byte pages), 128-token "
            "kernel blocks, and the SWA caches' block stride is a multiple of a whole record (block_stride_alignment "
            "528), which the packed block rounds up to.",
        ),
        CaseConfig(
            "dsv41-b128-sm90-refused",
            deepseek_v41_caches(_DSV41_PATTERN),
            block_size=128,
            num_blocks=8,
            attention_backend=DSV41_ATTENTION_BACKEND,
            note="DeepSeek V4.1 at --block-size 128 on SM90: FlashMLA and the indexer take 64-token kernel blocks there, "
            "which a packed block of mixed pages cannot be split into; vLLM refuses (its own default on SM90 is 64).",
        ),
        CaseConfig(
            "qwen4-qsa-ratio-refused-b16",
            attention_with_qsa_caches(1, "FLASH_ATTN", compress_ratio=32),
            block_size=16,
            num_blocks=16,
            layout="BLHNC",
            note="A compress ratio of 32 does not divide --block-size 16: the QSA caches' constructor refuses it.",
        ),
        CaseConfig(
            "pcp2-mla-flashmla-b64",
            uniform_layers(2, kind="mla", backend="FLASHMLA", head_size=576),
            block_size=64,
            num_blocks=8,
            prefill_context_parallel_size=2,
            note="MLA at PCP 2: the ranks replicate the cache (the pages of mla-flashmla-b64); MRv2 runs it through "
            "its PCPManager, MRv1 refuses PCP (VllmConfig._validate_v1_model_runner).",
        ),
        CaseConfig(
            "pcp2-dcp2-sparse-mla-b64",
            mla_with_indexer_caches(2, "FLASHMLA"),
            block_size=64,
            num_blocks=8,
            tensor_parallel_size=2,
            decode_context_parallel_size=2,
            prefill_context_parallel_size=2,
            note="DeepSeek V3.2-style sparse MLA at TP 2, PCP 2 with DCP spanning the PCP axis (DCP 2): the only "
            "PCP+DCP MRv2 takes; the drivers cannot build DeepSeek V3.2's own attention class, which supports it.",
        ),
        CaseConfig(
            "pcp2-dcp2-dense-mla-refused",
            uniform_layers(2, kind="mla", backend="FLASHMLA", head_size=576),
            block_size=64,
            num_blocks=8,
            decode_context_parallel_size=2,
            prefill_context_parallel_size=2,
            note="Dense MLA with PCP and DCP: MRv2 refuses it (PCPManager.validate_config: the ranks' DCP "
            "gathers diverge, vllm-project/vllm#53573).",
        ),
        CaseConfig(
            "pcp2-gqa-refused",
            _qwen3_like(),
            block_size=16,
            num_blocks=16,
            prefill_context_parallel_size=2,
            note="PCP on a GQA model: MRv2 runs PCP for MLA models only, MRv1 not at all.",
        ),
        CaseConfig(
            "pcp2-kda-mla-hybrid-refused",
            _kimi_k3_like_mla_hybrid(),
            block_size=64,
            num_blocks=16,
            prefill_context_parallel_size=2,
            note="Kimi K3's MLA + KDA at PCP 2: MRv2 validates the MLA model, then check_attention_cp_compatibility "
            "refuses the KDA layers' backend (no PCP support in state backends).",
        ),
        CaseConfig(
            "gqa-tp8-dcp4-flashinfer-b128",
            _qwen3_like(backend="FLASHINFER", num_kv_heads=1),
            block_size=128,
            num_blocks=4,
            tensor_parallel_size=8,
            decode_context_parallel_size=4,
            note="2 KV heads at TP 8 (replicated, 1 per rank) with DCP 4: kernel 64, a block spans 512 tokens.",
        ),
        CaseConfig(
            "mamba-hybrid-dcp2",
            # The Mamba-2 state of the case above at TP 2 (channels and heads halved).
            _attention_and_mamba(num_kv_heads=1, mamba_layers=1, mamba_shapes=((2, 32), (2, 32, 16))),
            block_size=16,
            num_blocks=16,
            tensor_parallel_size=2,
            decode_context_parallel_size=2,
            note="Attention blocks are DCP-sharded (32-token span), Mamba state is replicated (not scaled).",
        ),
        CaseConfig(
            "chunked-local-hma-off",
            _qwen3_like(1) + uniform_layers(3, start=1, kind="chunked_local", attention_chunk_size=8192, num_kv_heads=8, head_size=128),
            block_size=64,
            num_blocks=4,
            disable_hybrid_kv_cache_manager=True,
            note="Llama-4-like: 3 chunked-local layers per full one. vLLM disables the hybrid manager for "
            "chunked local attention by default, so all four layers share one full-attention group.",
        ),
        CaseConfig(
            "swa-hybrid-hma-off",
            _tiny(2) + _tiny(2, num_kv_heads=3, kind="sliding_window", sliding_window=64, start=2),
            block_size=32,
            num_blocks=8,
            disable_hybrid_kv_cache_manager=True,
            note="The padded SWA hybrid with --disable-hybrid-kv-cache-manager: windows promoted to full "
            "attention, one uniform-type group without page padding.",
        ),
        CaseConfig(
            "mamba-hybrid-hma-off",
            _attention_and_mamba(num_kv_heads=2, mamba_layers=2, mamba_shapes=((2, 64), (4, 32, 16))),
            block_size=16,
            num_blocks=16,
            disable_hybrid_kv_cache_manager=True,
            note="State layers need the hybrid manager: with it off, vLLM refuses to start "
            "(the specs cannot be promoted to one type).",
        ),
        CaseConfig("fp8-fa-b16", _qwen3_like(cache_dtype="fp8"), block_size=16, num_blocks=8),
        CaseConfig("b12x-two-slots", _qwen3_like(backend="B12X"), block_size=64, num_blocks=4, model_dtype="bfloat16"),
        CaseConfig("cpu-attn-b32", _qwen3_like(backend="CPU_ATTN"), block_size=32, num_blocks=4),
        CaseConfig("nixl-dense-fa", _qwen3_like(), block_size=16, num_blocks=8, connector="nixl"),
        # Where connectors break (issue 13): every built-in connector runs over these too.
        CaseConfig("fp8-fa-b16-lhbnc", _qwen3_like(cache_dtype="fp8"), block_size=16, num_blocks=8, layout="LHBNC",
                   note="fp8 (1-byte) pages under the head-outermost layout: per-head segments of one byte per element."),
        CaseConfig("fp8-fa-b16-bhlnc", _qwen3_like(cache_dtype="fp8"), block_size=16, num_blocks=8, layout="BHLNC",
                   note="fp8 pages block-outermost with heads outer to layers: a layer's block is per-head runs inside a row."),
        CaseConfig(
            "swa-hybrid-blhnc",
            _tiny(2) + _tiny(2, num_kv_heads=3, kind="sliding_window", sliding_window=64, start=2),
            block_size=32,
            num_blocks=8,
            layout="BLHNC",
            note="Padded full-attention and sliding-window pages, block-outermost: one row per block holds both groups.",
        ),
        CaseConfig(
            "mamba-hybrid-blhnc",
            _attention_and_mamba(num_kv_heads=2, mamba_layers=2, mamba_shapes=((2, 64), (4, 32, 16))),
            block_size=16,
            num_blocks=16,
            layout="BLHNC",
            note="Attention and padded Mamba state block-outermost: a block's row interleaves attention pages and state.",
        ),
        CaseConfig(
            "mamba-hybrid-align",
            _attention_and_mamba(num_kv_heads=2, mamba_layers=2, mamba_shapes=((2, 64), (4, 32, 16))),
            block_size=16,
            num_blocks=16,
            mamba_block_size=16,
            mamba_cache_mode="align",
            note="Mamba prefix caching (--mamba-cache-mode align): a state block per 16 tokens, padded to the attention page.",
        ),
        CaseConfig(
            "mamba2-hybrid-conv-split",
            _attention_and_mamba(num_kv_heads=2, mamba_layers=2, mamba_shapes=((160, 3), (4, 32, 16))),
            block_size=16,
            num_blocks=16,
            note="Mamba2 state as a real mixer has it: conv state (conv_dim 160 = x 128 + 2 x B/C 16, 3 rows) "
            "and SSM state (4 heads x 32 x 16), which NIXL/MoRIIO's conv split decomposes (DS layout).",
        ),
        CaseConfig("flashinfer-b128-k64-one-layer", _qwen3_like(1, backend="FLASHINFER"), block_size=128, num_blocks=4,
                   note="A single FlashInfer layer at block 128 split into 64-token kernel blocks: the one-region kernel split."),
        CaseConfig("rocm-attn-b16", _qwen3_like(backend="ROCM_ATTN"), block_size=16, num_blocks=8,
                   note="ROCM_ATTN's default layout: K and V in two head slots, every head of a token in the last dim."),
        CaseConfig("rocm-aiter-fa-b16", _qwen3_like(backend="ROCM_AITER_FA"), block_size=16, num_blocks=8,
                   note="ROCM_AITER_FA prefers the head-major LBHNC layout (get_required_kv_cache_layout), K then V in the last dim."),
        # KV cache kinds of vLLM 0.33 beyond the generic layers (issue 24; docs/kv-cache-kinds.md).
        CaseConfig(
            "rswa-flashinfer-b128-k64",
            _qwen3_like(4, kind="rswa", rswa_window=1024, backend="FLASHINFER", num_kv_heads=4),
            block_size=128,
            num_blocks=4,
            note="DeepSeek-V2-style R-SWA (RSWAAttention: prefill kept, 1024 generated tokens): its own "
            "RSWASpec group, 128-token blocks viewed as FlashInfer's 64-token kernel blocks.",
        ),
        CaseConfig(
            "rswa-after-full",
            _qwen3_like(1) + uniform_layers(2, start=1, kind="rswa", rswa_window=256, num_kv_heads=8, head_size=128),
            block_size=16,
            num_blocks=8,
            note="A causal full layer first, then R-SWA layers of the same geometry: is_kv_cache_spec_uniform "
            "calls the first spec's FullAttentionSpec.merge, which admits any FullAttentionSpec subclass, so "
            "the model gets one plain FullAttentionSpec group and the R-SWA layers no RSWAManager "
            "(vllm/v1/kv_cache_interface.py; R-SWA first gives a UniformTypeKVCacheSpecs group instead).",
        ),
        CaseConfig(
            "prefix-lm-fa-b16",
            _qwen3_like(4, kind="prefix_lm"),
            block_size=16,
            num_blocks=8,
            note="PaliGemma-style Prefix-LM (PrefillPrefixLMAttention): a non-causal FullAttentionSpec, "
            "laid out as a causal one, on the encoder-only backend wrapper of FLASH_ATTN.",
        ),
        CaseConfig(
            "prefix-lm+draft-b16",
            _qwen3_like(2, kind="prefix_lm")
            + (LayerConfig("draft.layers.2.attn", num_kv_heads=8, head_size=128, is_draft=True),),
            block_size=16,
            num_blocks=8,
            note="A Prefix-LM target with a causal Eagle draft of the same geometry: one group whose merged "
            "spec is non-causal (FullAttentionSpec.merge takes any layer's non_causal).",
        ),
        CaseConfig(
            "mla-flashmla-b64",
            uniform_layers(2, kind="mla", backend="FLASHMLA", head_size=576),
            block_size=64,
            num_blocks=8,
            note="DeepSeek-V3-style MLA alone (no draft): one MLAAttentionSpec group of 576-byte latents x 2.",
        ),
        CaseConfig(
            "chunked-local-hybrid-b64",
            _qwen3_like(1) + uniform_layers(3, start=1, kind="chunked_local", attention_chunk_size=8192, num_kv_heads=8, head_size=128),
            block_size=64,
            num_blocks=8,
            note="chunked-local-hma-off with the hybrid manager on: a ChunkedLocalAttentionSpec group beside the full one.",
        ),
        CaseConfig(
            "dsv32-indexer-b64",
            mla_with_indexer_caches(2, "FLASHMLA"),
            block_size=64,
            num_blocks=8,
            note="DeepSeek V3.2: per layer an MLA latent cache and its sparse-attention indexer's K cache "
            "(DeepseekV32IndexerCache: 128 fp8 bytes + one fp32 scale = 132 uint8 per token, indexer role), "
            "one uniform-type group. The MLA layers run dense FLASHMLA here (the sparse backend's own "
            "spec fields are not modeled).",
        ),
        CaseConfig(
            "dsv32-indexer-b128-k64",
            mla_with_indexer_caches(2, "FLASHMLA"),
            block_size=128,
            num_blocks=4,
            note="dsv32-indexer-b64 at block 128: the indexer's and FlashMLA's 64-token kernel blocks split every block in two.",
        ),
        CaseConfig(
            "kpool-tail-b64",
            mla_with_kpool_tails(2, "FLASHMLA"),
            block_size=64,
            num_blocks=8,
            note="GLM-5-next's kpool tail: per layer an MLA latent cache and a Glm5NextTailCache ring "
            "(CircularBufferSpec: 4 tokens x [raw K, gate score] x 128 bf16, one block per request, no slot "
            "mapping, not DCP-sharded). KPOOL_TAIL accepts only BLHNC, so the two groups share block-outermost "
            "blocks; the ring is not prefix-cacheable, so the cache block size stays 64.",
        ),
        CaseConfig(
            "kpool-tail-b128-k64-refused",
            mla_with_kpool_tails(2, "FLASHMLA", index_kpool=8),
            block_size=128,
            num_blocks=4,
            note="kpool-tail-b64 at block 128 with an 8-token kpool: KPOOL_TAIL accepts only BLHNC, and FlashMLA's "
            "64-token kernel blocks cannot be cut out of block-outermost packed 128-token blocks, so vLLM refuses "
            "(AttentionGroup.map_kv_cache_to_kernel_blocks).",
        ),
        CaseConfig(
            "kpool-tail-triton-b128",
            mla_with_kpool_tails(2, "TRITON_MLA", index_kpool=8),
            block_size=128,
            num_blocks=4,
            note="The same model on TRITON_MLA (any multiple of 16): no kernel split, an 8-token ring beside "
            "128-token MLA blocks.",
        ),
        CaseConfig(
            "glm5next-caches-b128",
            mla_with_kpool_tails(2, "TRITON_MLA", index_kpool=4, pooled_indexer=True),
            block_size=128,
            num_blocks=4,
            note="GLM-5-next's three caches per layer: MLA, the indexer's compressed K cache (Glm5NextIndexerCache: "
            "an indexer MLAAttentionSpec with tokens_per_state = the 4-token kpool, so a 128-token block holds 32 "
            "states of 132 bytes) and the kpool tail ring. Its backend (Glm5NextIndexerBackend) takes 32- or "
            "64-state kernel pages, 128 or 256 tokens here: the block is not split.",
        ),
        CaseConfig(
            "glm5next-caches-b64-refused",
            mla_with_kpool_tails(2, "TRITON_MLA", index_kpool=4, pooled_indexer=True),
            block_size=64,
            num_blocks=8,
            note="glm5next-caches-b128 at block 64: the pooled indexer's smallest kernel page is 32 states of 4 "
            "tokens, 128 tokens, which a 64-token block cannot hold (No common block size).",
        ),
        CaseConfig(
            "glm5next-caches-b256-sm120",
            mla_with_kpool_tails(2, "TRITON_MLA", index_kpool=4, pooled_indexer=True),
            block_size=256,
            num_blocks=4,
            capability=(12, 0),
            note="On SM120 DeepGEMM's paged-MQA kernels take only 64-state pages (utils/deep_gemm.py: "
            "get_paged_mqa_page_sizes), 256 tokens at a 4-token kpool: block 256 fits, block 128 would not.",
        ),
        CaseConfig(
            "minimax-m3-indexer-b128",
            attention_with_minimax_indexers(2, "FLASH_ATTN"),
            block_size=128,
            num_blocks=4,
            note="MiniMax M3: per layer a GQA attention cache and its lightning indexer's key-only side cache "
            "(MiniMaxM3IndexerCache: an indexer MLAAttentionSpec, one bf16 vector of 128 per token) on its own "
            "MINIMAX_M3_SPARSE_INDEXER backend, whose kernels page 128 tokens. An MLAAttentionSpec is a "
            "FullAttentionSpec, so all four layers form one uniform-type group whose block holds both pages.",
        ),
        CaseConfig(
            "minimax-m3-indexer-b64-refused",
            attention_with_minimax_indexers(2, "FLASH_ATTN"),
            block_size=64,
            num_blocks=8,
            note="minimax-m3-indexer-b128 at block 64: the indexer backend's only kernel page is 128 tokens.",
        ),
        CaseConfig(
            "minimax-m3-indexer-fp8-b256",
            attention_with_minimax_indexers(2, "FLASH_ATTN", index_cache_dtype="fp8"),
            block_size=256,
            num_blocks=4,
            note="An fp8 index cache (indexer_kv_dtype fp8: float8_e4m3fn, one byte per element) beside bf16 "
            "FlashAttention layers at block 256: the indexer's 128-token kernel pages split every block in two, "
            "for both backends of the group.",
        ),
        CaseConfig(
            "minimax-m3-indexer-flashinfer-refused",
            attention_with_minimax_indexers(2, "FLASHINFER"),
            block_size=128,
            num_blocks=4,
            note="Beside FlashInfer (16, 32 or 64-token kernel pages) the indexer's only 128-token page leaves no "
            "common kernel block size: vLLM refuses (No common block size).",
        ),
        CaseConfig(
            "kpool-tail-ring-refused",
            mla_with_kpool_tails(2, "FLASHMLA", index_kpool=48),
            block_size=64,
            num_blocks=8,
            note="A 48-token kpool: Glm5NextTailCache asserts the ring divides the block size (64 % 48), so vLLM "
            "refuses at get_kv_cache_spec.",
        ),
        CaseConfig(
            "hidden-states-dense-b16",
            _qwen3_like(2, head_size=64)
            + (LayerConfig("model.cache_only_layers.2", kind="hidden_state", backend=LAYER_OWN_BACKENDS["hidden_state"][0],
                           num_kv_heads=3, head_size=1024),),
            block_size=16,
            num_blocks=8,
            note="extract_hidden_states: a CacheOnlyAttentionLayer storing 3 captured layers' hidden states "
            "(1024 wide) beside the target's layers, one uniform-type group (HiddenStateCacheSpec is an "
            "MLAAttentionSpec, so a FullAttentionSpec subclass). Built as a target layer: the "
            "extract_hidden_states proposer is not driven.",
        ),
        CaseConfig(
            "hidden-states-swa-hybrid",
            uniform_layers(1, num_kv_heads=1, head_size=64)
            + uniform_layers(1, start=1, kind="sliding_window", sliding_window=64, num_kv_heads=1, head_size=64)
            + (LayerConfig("model.cache_only_layers.2", kind="hidden_state", backend=LAYER_OWN_BACKENDS["hidden_state"][0],
                           num_kv_heads=3, head_size=4096),),
            block_size=16,
            num_blocks=8,
            note="A hybrid target: the hidden-state layer is planned apart; one token of it (24 KiB) outgrows the "
            "4 KiB common page, so every group's block size is scaled 6x (_ensure_min_page_size) and the "
            "hidden-state group gets 1-token blocks padded to the page.",
        ),
        CaseConfig(
            "sink-fa-b16",
            _qwen3_like(2, kind="sink_full", sink_len=128, head_size=64),
            block_size=16,
            num_blocks=8,
            note="Static attention sinks (StaticSinkAttention, SinkFullAttentionSpec): 128 sink tokens.",
        ),
        CaseConfig(
            "enc-dec-cross-b16",
            tuple(
                LayerConfig(f"model.decoder.layers.{i}.{sub}.attn", kind=kind, num_kv_heads=8, head_size=64)
                for i in range(2)
                for sub, kind in (("self_attn", "full"), ("encoder_attn", "cross"))
            ),
            block_size=16,
            num_blocks=8,
            note="Whisper-style decoder: self-attention and CrossAttention (CrossAttentionSpec) groups.",
        ),
        CaseConfig(
            "swa-mla-refused-b64",
            uniform_layers(1, kind="mla", backend="TRITON_MLA", head_size=576)
            + uniform_layers(1, start=1, kind="sliding_window_mla", sliding_window=128, backend="TRITON_MLA", head_size=576),
            block_size=64,
            num_blocks=8,
            note="An MLA layer with a sliding window (SlidingWindowMLASpec) through MLAAttention: every dense "
            "MLA impl's constructor refuses a sliding window; only DeepSeek V4's own SWA cache uses the spec.",
        ),
        CaseConfig(
            "gqa+draft-attention-backend-b128",
            _qwen3_like(backend="TRITON_ATTN")
            + (LayerConfig("draft.layers.2.attn", backend="FLASHINFER", num_kv_heads=8, head_size=128, is_draft=True),),
            block_size=128,
            num_blocks=4,
            attention_backend="TRITON_ATTN",
            note="--attention-backend TRITON_ATTN: MRv2's draft keeps it, MRv1's auto-selects FlashInfer (D1).",
        ),
        CaseConfig(
            "gqa+draft-attention-backend-blhnc-b48",
            _qwen3_like(backend="TRITON_ATTN")
            + (LayerConfig("draft.layers.2.attn", backend="FLASHINFER", num_kv_heads=8, head_size=128, is_draft=True),),
            block_size=48,
            num_blocks=4,
            layout="BLHNC",
            attention_backend="TRITON_ATTN",
            note="D1 as a refusal: MRv1's auto-selected FlashInfer draft needs 16-token kernel blocks, which "
            "packed (block-outermost) 48-token blocks cannot be split into; MRv2's Triton draft starts.",
        ),
        CaseConfig(
            "gqa+flex-draft-b48",
            _qwen3_like(backend="FLASHINFER")
            + (LayerConfig("draft.layers.2.attn", backend="FLEX_ATTENTION", num_kv_heads=8, head_size=128, is_draft=True),),
            block_size=48,
            num_blocks=4,
            note="MRv2's speculator gives the FlexAttention draft 48-token blocks (chosen over the draft alone), "
            "which Flex's builder refuses (not a power of 2); MRv1's drafter gets the runner's 16 and starts.",
        ),
    ]
    return {c.name: c for c in cases}


CASES: dict[str, CaseConfig] = _build()


def get_case(name: str) -> CaseConfig:
    try:
        return CASES[name]
    except KeyError:
        close = [n for n in CASES if name.split("-")[0] in n][:5]
        hint = f" (similar: {', '.join(close)})" if close else ""
        raise ConfigError(f"unknown case {name!r}; run `kvconform list` for the {len(CASES)} named cases{hint}") from None
