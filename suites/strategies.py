"""Hypothesis strategies that generate only valid cases (generation 2).

Kept small and shrink-friendly: the first choices are the simplest (one dense full
attention group, FLASH_ATTN, block 16), so a failure shrinks towards a readable case.
Imports hypothesis lazily at call time so the reference never depends on it.
"""

from __future__ import annotations

import random
from typing import Any, Callable, Sequence

from dataclasses import replace

from reference.config import LAYER_OWN_BACKENDS, STATE_MIXERS, CaseConfig, LayerConfig, StateMixer
from reference.errors import ConfigError
from reference.parallel import ModelHeads, check_parallel, per_rank_kv_heads

LAYOUTS = ("LBNHC", "LBHNC", "LHBNC", "BLHNC", "BLNHC", "BHLNC")
"""``reference.layout.LAYOUT_NAMES`` in the order the seeded sample draws them (kept so
every seed keeps drawing the same configs; tests/reference/test_strategies.py checks it
is the same set)."""
# (backend, head sizes it accepts that keep cases small)
GQA_BACKENDS: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("FLASH_ATTN", (8, 16, 64, 128)),
    ("TRITON_ATTN", (32, 64, 128)),
    ("FLEX_ATTENTION", (8, 16, 64)),
    ("FLASHINFER", (64, 128)),
)
MLA_BACKENDS = ("TRITON_MLA", "FLASHMLA", "FLASHINFER_MLA")


FAMILIES = (
    "dense",
    "swa_hybrid",
    "mla_draft",
    "mamba_hybrid",
    "gqa_draft",
    "chunked_local_hybrid",
    "sink",
    "encoder_decoder",
    "rswa",
    "prefix_lm",
    "mla_indexer",
    "hidden_state",
    "kpool_tail",
    "qsa",
    "encoder_only",
    "dsv4",
    "inkling",
    "step5",
    "dsv41",
)
"""Model families, simplest first: the group mixes the issue names, plus Llama-4-style
chunked local attention, static-sink attention, encoder-decoder cross attention, DeepSeek's
R-SWA attention (``RSWAAttention``, after a causal full layer half the time: vLLM's merge
then makes the group plain full attention) and Prefix-LM attention
(``PrefillPrefixLMAttention``, with a causal draft half the time) and DeepSeek V3.2's MLA
layers each with its indexer K cache (``DeepseekV32IndexerCache``), and a target (dense, or with
sliding windows) beside extract_hidden_states' ``CacheOnlyAttentionLayer``, and GLM-5-next's MLA layers each
with its indexer's kpool tail ring (``Glm5NextTailCache``, a ``CircularBufferSpec``), and Qwen4-exp's QSA layers
(attention with its compressed keys, ``QSACompressedKeyCache``, and its compressor ring, ``QSAKeyStateCache``), and
BERT-like encoder-only models (``EncoderOnlyAttention``: no KV cache), and DeepSeek V4's caches (per decoder layer
a sliding window only, CSA with its indexer or HCA: ``deepseek_v4_caches``), and Inkling's decoder layers (its own
attention classes, each after its short-conv state: ``inkling_layers``), and Step5's layers (sliding-window layers beside
DSA layers built as its own ``Step5Attention``, each with its region summaries and tail ring: ``step5_layers``), and
DeepSeek V4.1's decoder layers (its own attention class on FlashMLA, kv sources of compress ratio 1 or 2 with their
indexer keys and compressor rings, and layers owning only their SWA cache: ``deepseek_v41_caches``). A seeded
profile's configs
are a function of its seed and of this list: adding a family redraws them."""


def _parallel(pick: Callable[[Sequence[Any]], Any], family: str) -> tuple[int, int, int]:
    """(TP, DCP, per-rank KV heads) for a model with a drawn head geometry.

    Draws the model's totals (KV heads, query heads per KV head) and a TP/DCP size, then
    keeps only what vLLM accepts (``reference.parallel.check_parallel``): a refused DCP
    falls back to 1, a refused TP to 1. Sliding windows never get DCP (vLLM refuses
    them at admission; DeepSeek V4's only beside a CSA layer, whose indexer refuses DCP first),
    and encoder-decoder models keep TP 1 and DCP 1.
    """
    total_kv = pick((1, 2, 4, 8))
    q_per_kv = pick((1, 2, 4, 8))
    tp = pick((1, 2, 4, 8))
    dcp = pick((1, 2, 4))
    mla = family == "mla_draft"
    if family in ("swa_hybrid", "encoder_decoder", "hidden_state", "inkling", "step5"):  # hidden_state may draw windows
        dcp = 1
    if family == "inkling":
        tp = min(tp, total_kv)  # InklingConvState asserts tp_size <= num_kv_heads (no replicated KV heads)
    if family == "encoder_decoder":
        tp = 1
    heads = ModelHeads(total_kv_heads=total_kv, total_attention_heads=total_kv * q_per_kv, use_mla=mla)
    for candidate in ((tp, dcp), (tp, 1), (1, 1)):
        try:
            check_parallel(heads, *candidate)
        except ConfigError:
            continue
        tp, dcp = candidate
        break
    gqa = ModelHeads(total_kv_heads=total_kv, total_attention_heads=total_kv * q_per_kv)
    return tp, dcp, per_rank_kv_heads(gqa, tp)


def _supported_layouts(layers: Sequence[LayerConfig], capability: tuple[int, int]) -> tuple[str, ...]:
    """Layout names every backend of ``layers`` accepts, best first (empty: none in common)."""
    from reference.backends import get_backend
    from reference.errors import StartupError
    from reference.layout import supported_layouts

    declared = [(name, get_backend(name).supported_layouts(capability)) for name in dict.fromkeys(l.backend for l in layers)]
    try:
        return tuple(layout.name for layout in supported_layouts(declared))
    except StartupError:
        return ()


def _with_mixers(layers: list[LayerConfig], kind: str, pick: Callable[[Sequence[Any]], Any], tp: int) -> list[LayerConfig]:
    """The state layers rebuilt as ``kind``'s mixer class (model-wide heads: vLLM splits them by ``tp``)."""
    if kind == "stand-in":
        return layers
    heads = 8
    if kind == "mamba2":
        # One group is replicated to every head shard; two need a TP size that divides them.
        mixer = StateMixer(kind, num_heads=heads, head_dim=16, n_groups=pick((1, 2)) if tp <= 2 else 1,
                           state_size=pick((8, 16)), conv_kernel=pick((4, 2)))
    elif kind in ("gated_delta_net", "qwen4_exp_ple"):
        mixer = StateMixer("gated_delta_net", num_heads=heads, head_dim=16, num_k_heads=pick((8, 16)), head_k_dim=8)
    else:
        mixer = StateMixer(kind, num_heads=heads, head_dim=pick((8, 16)), conv_kernel=pick((4, 3)))
    rebuilt = []
    for layer in layers:
        if layer.kind != "mamba":
            rebuilt.append(layer)
            continue
        rebuilt.append(replace(layer, backend=STATE_MIXERS[mixer.kind][0], mamba_shapes=(), mamba_dtypes=(), mixer=mixer))
        if kind == "qwen4_exp_ple" and not any(l.mixer and l.mixer.kind == kind for l in rebuilt):
            # Qwen4-exp: Gated DeltaNet layers, the first with its decoder layer's PLE short conv beside it.
            ple = StateMixer(kind, hidden_size=pick((64, 256, 512)), hc_count=pick((4, 2)), ngram_size=pick((3, 2, 4)),
                             conv_kernel=pick((4, 3)))
            rebuilt.append(LayerConfig(f"{layer.name}.ple", kind="mamba", backend=STATE_MIXERS[kind][0], mixer=ple))
    return rebuilt


def build_case(pick: Callable[[Sequence[Any]], Any], integer: Callable[[int, int], int], *, name: str = "random", max_layers: int = 4, max_blocks: int = 4,
               families: Sequence[str] = FAMILIES, state_mixers: bool = True) -> CaseConfig:
    """One valid case from two choice functions, so hypothesis and a seeded RNG share it.

    ``families``: the model families to draw from (default every one; a release that lacks
    some draws from fewer, e.g. ``suites.release_cases.GEN1_FAMILIES``). ``state_mixers=False``
    keeps every state layer a stand-in and draws nothing for it (generation 1 drives no mixer
    class; its sample stays what it was before mixers existed).

    ``pick(options)`` returns one of ``options``; ``integer(lo, hi)`` an int in ``[lo, hi]``.
    Options are listed simplest first, so hypothesis shrinks towards readable cases.
    """
    family = pick(families)
    # Non-powers of two too: multiples of 16 are valid for MultipleOf(16) backends, and
    # force a smaller kernel block (or a refusal) on fixed-size ones like FlashInfer.
    block_size = pick((16, 32, 64, 128, 256, 48, 96, 272))
    backend, heads = pick(GQA_BACKENDS)
    head_size = pick(heads)
    tp, dcp, kv_heads = _parallel(pick, family)
    cache_dtype = pick(("auto", "fp8") if backend != "FLEX_ATTENTION" else ("auto",))
    n = integer(1, max_layers)

    def attention(name: str, kind: str = "full", **extra: Any) -> LayerConfig:
        """A target attention layer with the drawn backend and geometry (``extra`` overrides)."""
        geometry: dict[str, Any] = dict(backend=backend, num_kv_heads=kv_heads, head_size=head_size, cache_dtype=cache_dtype)
        geometry.update(extra)
        return LayerConfig(name, kind=kind, **geometry)

    def extra_layers() -> range:
        return range(n, n + integer(1, max_layers))

    layers = [attention(f"model.layers.{i}.self_attn.attn") for i in range(n)]
    if family == "mla_draft":
        mla_backend = pick(MLA_BACKENDS)
        layers = [LayerConfig(f"model.layers.{i}.self_attn.attn", kind="mla", backend=mla_backend, head_size=576) for i in range(n)]
        layers.append(attention("draft.layers.0.attn", cache_dtype="auto", is_draft=True))
    elif family == "gqa_draft":
        draft_backend, draft_heads = pick(GQA_BACKENDS)
        layers.append(
            LayerConfig("draft.layers.0.attn", backend=draft_backend, num_kv_heads=kv_heads, head_size=pick(draft_heads), is_draft=True)
        )
    elif family == "swa_hybrid":
        sw_heads = pick((1, 2, 4))
        window = pick((64, 512))
        layers += [
            attention(f"model.layers.{i}.self_attn.attn", "sliding_window", num_kv_heads=sw_heads, cache_dtype="auto", sliding_window=window)
            for i in extra_layers()
        ]
    elif family == "mamba_hybrid":
        # mamba2_state_shape at this TP: conv channels and heads split across ranks.
        conv, state_heads = 64 // tp, 8 // tp
        layers += [
            LayerConfig(f"model.layers.{i}.mixer", kind="mamba", backend="MAMBA2_ATTN", mamba_shapes=((3, conv), (state_heads, 16, 8)))
            for i in extra_layers()
        ]
    elif family == "chunked_local_hybrid":
        chunk = pick((256, 8192))
        layers += [attention(f"model.layers.{i}.self_attn.attn", "chunked_local", attention_chunk_size=chunk) for i in extra_layers()]
    elif family == "sink":
        sink_len = pick((16, 128))
        layers = [attention(f"model.layers.{i}.self_attn.attn", "sink_full", sink_len=sink_len) for i in range(n)]
    elif family == "rswa":
        window = pick((256, 4096))
        first_full = pick((False, True))
        layers = [
            attention(f"model.layers.{i}.self_attn.attn") if first_full and i == 0
            else attention(f"model.layers.{i}.self_attn.attn", "rswa", rswa_window=window)
            for i in range(n)
        ]
    elif family == "prefix_lm":
        layers = [attention(f"model.layers.{i}.self_attn.attn", "prefix_lm") for i in range(n)]
        if pick((False, True)):
            layers.append(attention("draft.layers.0.attn", cache_dtype="auto", is_draft=True))
    elif family == "mla_indexer":
        from suites.named_cases import mla_with_indexer_caches

        layers = list(mla_with_indexer_caches(n, pick(MLA_BACKENDS)))
    elif family == "kpool_tail":
        from suites.named_cases import mla_with_kpool_tails

        # Kpools of 4 and 8 divide every drawn block size but 272; 48 divides 48 and 96 only.
        layers = list(mla_with_kpool_tails(n, pick(MLA_BACKENDS), pick((4, 8, 48))))
    elif family == "qsa":
        # Compress ratios 4, 8 and 16 divide every drawn block size (272 = 16 x 17).
        from suites.named_cases import attention_with_qsa_caches

        ratio, index_head = pick((4, 8, 16)), pick((64, 128))
        layers = list(attention_with_qsa_caches(n, compress_ratio=ratio, index_head_size=index_head, attention=attention))
    elif family == "dsv4":
        # DeepSeek V4's caches in the fp8_ds_mla format (their own backends, whatever was drawn above), a layer
        # pattern of sliding-window-only, CSA and HCA layers; half the draws at the one block size its packed
        # 256-token kernel blocks take.
        from suites.named_cases import deepseek_v4_caches

        ratios = tuple(pick((4, 128, 0)) for _ in range(n))
        layers = list(deepseek_v4_caches(ratios, sliding_window=pick((128, 64))))
        if 4 not in ratios:
            # Its SWA caches under DCP are refused at admission (not modeled); only a CSA layer's indexer builder
            # refuses DCP first (0.33).
            dcp = 1
        block_size = pick((256, block_size))
    elif family == "dsv41":
        # DeepSeek V4.1's decoder layers: compress ratio 1 or 2 (kv sources, an index source or not) or a layer owning
        # only its SWA cache; the first kv source is an index source (V4.1's topology needs one at or below every kv
        # source). Most draws at a block size its kernels take (64 on SM90, 128 on SM10x), the rest refused alike.
        from suites.named_cases import deepseek_v41_caches

        decoder_layers = [(pick((1, 2, 0)), pick((True, False))) for _ in range(n)]
        first_source = next((i for i, (ratio, _) in enumerate(decoder_layers) if ratio), None)
        if first_source is not None:
            decoder_layers[first_source] = (decoder_layers[first_source][0], True)
        layers = list(deepseek_v41_caches(decoder_layers, sliding_window=pick((128, 64))))
        block_size = pick((64, 128, block_size))
    elif family == "inkling":
        # Inkling's decoder layers (its own classes, on FlashAttention and its short-conv builder): global or local
        # attention, each after its short-conv state; the packed conv head the power of two its streams pad to.
        from suites.named_cases import inkling_layers

        inkling_head = pick((64, 128))
        layers = list(inkling_layers(tuple(pick((False, True)) for _ in range(n)), num_kv_heads=kv_heads,
                                     head_size=inkling_head, conv_head_size=pick((4, 8)) * inkling_head,
                                     sconv_kernel_size=pick((4, 8)), sliding_window=pick((64, 512))))
        # The drawn cache dtype on the attention (its spec keeps plain pages in any); the conv state stores bf16.
        layers = [replace(l, cache_dtype=cache_dtype) if l.kind != "inkling_conv_state" else l for l in layers]
    elif family == "step5":
        # Step5's layers: sliding-window layers on FlashAttention and DSA layers (its own class on STEP5_DSA, head size
        # 192; 128 is refused by the impl), each DSA layer with its summaries and ring; at least one DSA layer.
        from suites.named_cases import step5_layers

        dsa = [pick((True, False)) for _ in range(n)]
        dsa[-1] = True
        layers = list(step5_layers(tuple(dsa), num_kv_heads=kv_heads, head_size=pick((192, 192, 192, 128)),
                                   cache_dtype=cache_dtype, sliding_window=pick((128, 512))))
    elif family == "encoder_only":
        # Every layer encoder-only (no KV cache); an unquantized cache (the layers keep none to quantize).
        layers = [attention(f"model.encoder.layer.{i}.attention.self.attn", "encoder_only", cache_dtype="auto")
                  for i in range(n)]
        if state_mixers and pick((False, True)):
            # ColQwen3.5's style: Gated DeltaNet layers before the encoder-only ones (their states the only KV cache).
            gdn = StateMixer("gated_delta_net", num_heads=8, head_dim=16, num_k_heads=pick((8, 16)), head_k_dim=8)
            layers = [LayerConfig(f"model.layers.{i}.linear_attn", kind="mamba", backend=STATE_MIXERS[gdn.kind][0], mixer=gdn)
                      for i in range(integer(1, 2))] + layers
    elif family == "hidden_state":
        if pick((False, True)):
            layers += [
                attention(f"model.layers.{i}.self_attn.attn", "sliding_window", cache_dtype="auto", sliding_window=64)
                for i in extra_layers()
            ]
        layers.append(LayerConfig(f"model.cache_only_layers.{len(layers)}", kind="hidden_state",
                                  backend=LAYER_OWN_BACKENDS["hidden_state"][0],
                                  num_kv_heads=pick((1, 3)), head_size=pick((512, 2048, 4096))))
    elif family == "encoder_decoder":
        layers = [
            attention(f"model.decoder.layers.{i}.{sub}.attn", kind)
            for i in range(n)
            for sub, kind in (("self_attn", "full"), ("encoder_attn", "cross"))
        ]
    capability = pick(((9, 0), (10, 0)))  # SM90, or SM100 (TRT-LLM sizes, FA4 pages)
    # Half the draws pick among the layouts every drawn backend supports (tensors get
    # built), half among all six (vLLM must then refuse the unsupported ones alike).
    supported = _supported_layouts(layers, capability)
    layout = pick((None,) + (supported if pick(("supported", "any")) == "supported" and supported else LAYOUTS))
    num_blocks = integer(2, max_blocks)
    # Engine options, drawn last so earlier draws (and shrinking) are unaffected:
    model_dtype = pick(("bfloat16", "float16"))
    # Sized by memory instead of num_gpu_blocks_override (tight budgets are refused alike).
    memory = pick((None, 8 << 20, 64 << 20))
    # --attention-backend given explicitly: MRv2 drafts inherit it, MRv1 drafts do not (D1).
    # Only where the target's backend accepts the draft's head size (else vLLM refuses MRv2).
    draft_fits = family == "gqa_draft" and layers[-1].head_size in heads
    attention_backend = backend if draft_fits and pick((False, True)) else None
    # A KV connector's layout preference (not under DCP: vLLM validates that elsewhere).
    connector = pick((None, "nixl", "mooncake", "offloading")) if dcp == 1 else None
    # --disable-hybrid-kv-cache-manager: local-attention layers allocated as full attention
    # (vLLM's default for chunked local attention). State and cross-attention layers cannot
    # be promoted (vLLM refuses; the named case mamba-hybrid-hma-off checks that), so only
    # the attention families draw it.
    disable_hma = pick((False, True)) if family not in ("mamba_hybrid", "encoder_decoder") else False
    if family == "inkling":
        # Drawn and then undone, so no later draw moves: its conv-state class asserts a bf16 model (the named case
        # inkling-sconv-fp16-refused checks that refusal).
        model_dtype = "bfloat16"
    if family == "step5":
        # Drawn and then undone: the DSA impl refuses a float16 model, and a tail ring cannot be promoted with the
        # hybrid manager off (both predicted; a Step5 model runs bf16 with the hybrid manager).
        model_dtype, disable_hma = "bfloat16", False
        if connector not in (None, "nixl"):
            connector = None  # only NIXL (CUDA buffers) and MooncakeStore move its summaries; the others refuse
    if family == "dsv41":
        # Set last (no draw moves): V4.1 cases name FlashMLA (the path the reference models; by default SM100 picks
        # FlashMLA mega attention).
        from reference.config import DSV41_ATTENTION_BACKEND

        attention_backend = DSV41_ATTENTION_BACKEND
        kernel_block = 64 if capability[0] == 9 else 128  # FlashMLA's and the indexer's on this GPU
        sources = [i for i, l in enumerate(layers) if l.kind == "dsv4_attention"]
        if block_size != kernel_block and sources and all(layers[i].index_kpool == 2 for i in sources):
            # Only ratio-2 caches at a block above the kernel block: vLLM maps them onto kernel blocks through a
            # strided view, which the reference does not model yet; a ratio-1 source makes vLLM refuse it instead.
            from reference.config import dsv41_prefix

            prefix = layers[sources[0]].name  # its compressed cache is the prefix itself; it keeps no ring at ratio 1
            layers = [replace(l, index_kpool=1) if dsv41_prefix(l) == prefix and l.kind in ("dsv4_attention", "dsv4_indexer")
                      else l for l in layers
                      if not (dsv41_prefix(l) == prefix and l.kind == "dsv4_compressor_state")]
    if family == "mamba_hybrid" and state_mixers:
        # Drawn last (no other draw moves): the state layers as a MambaBase stand-in with the shapes
        # above, or as one of vLLM's own mixer classes, which computes its state from its geometry.
        layers = _with_mixers(layers, pick(("stand-in", *STATE_MIXERS)), pick, tp)
    return CaseConfig(
        name=f"{name}-{family}",
        layers=tuple(layers),
        block_size=block_size,
        model_dtype=model_dtype,
        num_blocks=num_blocks if memory is None else None,
        kv_cache_memory_bytes=memory,
        layout=layout,
        connector=connector,
        capability=capability,
        attention_backend=attention_backend,
        mamba_block_size=block_size if family == "mamba_hybrid" else None,
        tensor_parallel_size=tp,
        decode_context_parallel_size=dcp,
        disable_hybrid_kv_cache_manager=disable_hma,
    )


def cases(*, max_layers: int = 4, max_blocks: int = 4, families: Sequence[str] = FAMILIES) -> Any:
    """A hypothesis strategy of valid ``CaseConfig`` objects mixing the main model families
    (``families``: the ones to draw from, every one by default)."""
    from hypothesis import strategies as st

    @st.composite
    def build(draw: Any) -> CaseConfig:
        return build_case(
            lambda options: draw(st.sampled_from(options)),
            lambda lo, hi: draw(st.integers(lo, hi)),
            max_layers=max_layers,
            max_blocks=max_blocks,
            families=families,
        )

    return build()


def sample_cases(seed: int, count: int, *, families: Sequence[str] = FAMILIES, prefix: str = "random",
                 state_mixers: bool = True, **limits: int) -> list[CaseConfig]:
    """``count`` cases from a seeded RNG: the same list on every machine and xdist worker."""
    rng = random.Random(seed)
    return [build_case(rng.choice, rng.randint, name=f"{prefix}-s{seed}-{i}", families=families,
                       state_mixers=state_mixers, **limits)
            for i in range(count)]


def schedules(widths: Sequence[int], max_num_reqs: int, pool: int = 48, max_ops: int = 30) -> Any:
    """Valid random block-table request schedules, and what each should leave behind.

    A strategy of ``(ops, blocks, rows)``: the ops (arrivals, appends, removals,
    preemption and resumption, MRv1 condensing moves and reorder swaps) of
    ``reference.block_tables``, every live request's logical block ids per group, and its
    MRv1 row, tracked independently with ``InputBatch``'s rule (a new request takes the
    lowest free row). Rows never overflow ``widths``.
    """
    from hypothesis import strategies as st

    from reference.block_tables import Add, Append, Move, Preempt, Remove, Swap

    @st.composite
    def build(draw: Any) -> tuple[list[Any], dict[str, tuple[tuple[int, ...], ...]], dict[str, int]]:
        ops: list[Any] = []
        blocks: dict[str, list[list[int]]] = {}
        rows: dict[str, int] = {}
        preempted: list[str] = []
        for _ in range(draw(st.integers(0, max_ops))):
            free = [r for r in range(max_num_reqs) if r not in rows.values()]
            kinds = ["swap"]
            if free:
                kinds += ["add", "add"] + (["resume"] if preempted else [])
            if blocks:
                kinds += ["append", "append", "remove", "preempt"] + (["move"] if free else [])
            kind = draw(st.sampled_from(kinds))
            if kind in ("add", "resume"):
                req = preempted.pop(draw(st.integers(0, len(preempted) - 1))) if kind == "resume" else f"r{len(ops)}"
                ids = [draw(st.lists(st.integers(0, pool - 1), max_size=w)) for w in widths]
                ops.append(Add(req, ids))
                blocks[req], rows[req] = [list(x) for x in ids], free[0]
            elif kind == "append":
                req = draw(st.sampled_from(sorted(blocks)))
                ids = [draw(st.lists(st.integers(0, pool - 1), max_size=w - len(have))) for w, have in zip(widths, blocks[req])]
                ops.append(Append(req, ids))
                for have, new in zip(blocks[req], ids):
                    have.extend(new)
            elif kind in ("remove", "preempt"):
                req = draw(st.sampled_from(sorted(blocks)))
                ops.append(Remove(req) if kind == "remove" else Preempt(req))
                del blocks[req], rows[req]
                if kind == "preempt":
                    preempted.append(req)
            elif kind == "move":
                req = draw(st.sampled_from(sorted(blocks)))
                dst = draw(st.sampled_from(free))
                ops.append(Move(rows[req], dst))
                rows[req] = dst
            else:
                a, b = draw(st.integers(0, max_num_reqs - 1)), draw(st.integers(0, max_num_reqs - 1))
                ops.append(Swap(a, b))
                owner = {row: req for req, row in rows.items()}
                if a in owner:
                    rows[owner[a]] = b
                if b in owner:
                    rows[owner[b]] = a
        return ops, {r: tuple(tuple(x) for x in b) for r, b in blocks.items()}, rows

    return build()
