"""Cases for the drivers of older vLLM releases: generation 1 (vLLM 0.19 to 0.28), stamped with
the release they are run against (``reference.releases`` keys its per-release facts on
``vllm_version``). ``tests/releases`` runs them in a release venv."""

from __future__ import annotations

from reference.config import CaseConfig, LayerConfig

GEN1_FAMILIES = ("dense", "swa_hybrid", "mla_draft", "mamba_hybrid", "gqa_draft", "chunked_local_hybrid", "sink")
"""The random sampler's model families (``suites.strategies.FAMILIES``) that generation-1 releases
already served. ``reference.gen1`` models dense, sliding-window, chunked-local, static-sink and MLA
attention with full-attention and MLA drafts, and Mamba hybrids (the release's block-size
negotiation, its state views), and the generation-1 driver builds them all. The later families
(R-SWA, Prefix-LM, V3.2's indexer, hidden states, GLM-5-next's tail ring, encoder-decoder cross
attention) are left out: their layers came after 0.28."""

_HEADS_BEFORE_TOKENS = frozenset({"LBHNC", "LHBNC", "BLHNC", "BHLNC"})


def gen1_sample_cases(vllm_version: str, seed: int, count: int) -> list[CaseConfig]:
    """The seeded random configs of a profile for a generation-1 release: ``count`` cases of
    ``GEN1_FAMILIES``, each as generation 1 has it: the generation-2 layout's token/head
    order as ``VLLM_KV_CACHE_LAYOUT`` (HND where heads come before tokens, else NHD), one DCP
    rank (generation 1's drivers and reference do not split the cache across DCP ranks), each
    layer on its declared backend (no ``--attention-backend``: the generation-1 driver builds the
    specs from the case, so a backend vLLM would select is not observed) and no connector (its
    layout preference is not driven there; generation 1's connectors are checked with
    ``kvconform check``)."""
    from suites.strategies import sample_cases

    out = []
    for case in sample_cases(seed, count, families=GEN1_FAMILIES, prefix="gen1-random", state_mixers=False):
        layout = None if case.layout is None else ("HND" if case.layout in _HEADS_BEFORE_TOKENS else "NHD")
        out.append(case.with_(generation=1, vllm_version=vllm_version, layout=layout, decode_context_parallel_size=1,
                              attention_backend=None, speculative_attention_backend=None, connector=None))
    return out


def gen1_cases(vllm_version: str) -> list[CaseConfig]:
    """Dense attention over the backends and layouts generation 1 has, at block sizes
    that split into kernel blocks (FlashInfer at 128) and that do not."""

    def case(name: str, backend: str, block_size: int, *, layout: str | None = None, heads: int = 8, head_size: int = 128,
             layers: int = 2, dtype: str = "bfloat16", kind: str = "full") -> CaseConfig:
        return CaseConfig(
            name=f"gen1-{name}",
            layers=tuple(LayerConfig(f"model.layers.{i}.self_attn.attn", kind=kind, backend=backend,
                                     num_kv_heads=1 if kind == "mla" else heads, head_size=head_size)
                         for i in range(layers)),
            block_size=block_size,
            num_blocks=10,
            layout=layout,
            model_dtype=dtype,
            generation=1,
            vllm_version=vllm_version,
        )

    def window_hybrid(name: str, backend: str, block_size: int, window_heads: int) -> CaseConfig:
        # Gemma-like: two full-attention layers, two sliding-window layers of window_heads heads.
        full = case(name, backend, block_size, heads=2, head_size=64)
        windows = tuple(LayerConfig(f"model.layers.{i}.self_attn.attn", kind="sliding_window", sliding_window=128,
                                    backend=backend, num_kv_heads=window_heads, head_size=64) for i in (2, 3))
        return full.with_(layers=full.layers + windows)

    def mla_eagle(name: str, block_size: int) -> CaseConfig:
        target = case(name, "FLASHMLA", block_size, kind="mla", head_size=576)
        draft = LayerConfig("model.layers.2.self_attn.attn", backend="FLASHINFER", num_kv_heads=8, head_size=128, is_draft=True)
        return target.with_(layers=target.layers + (draft,), num_blocks=4)

    return [
        case("flashinfer-b128", "FLASHINFER", 128),
        case("flashinfer-b128-hnd", "FLASHINFER", 128, layout="HND"),
        case("flashinfer-b16", "FLASHINFER", 16),
        case("fa-b16", "FLASH_ATTN", 16),
        case("fa-b128-hnd", "FLASH_ATTN", 128, layout="HND"),
        case("triton-b32", "TRITON_ATTN", 32, heads=4, head_size=64),
        # Triton's HND order arrived in 0.20.0 (#37940); Flex's kernel block sizes went from
        # multiples of 1 to multiples of 16 in 0.21.0 (a block of 8 then fails to start).
        case("triton-b32-hnd", "TRITON_ATTN", 32, layout="HND", heads=4, head_size=64),
        case("flex-b16-hnd", "FLEX_ATTENTION", 16, layout="HND", dtype="float16"),
        case("flex-b8", "FLEX_ATTENTION", 8, dtype="float16"),
        case("triton-mla-b64", "TRITON_MLA", 64, kind="mla", head_size=576),
        case("flashmla-b128", "FLASHMLA", 128, kind="mla", head_size=576),
        # An MLA target with a GQA (Eagle) draft: Mooncake's pre-#39596 registration check
        # reads the draft's heads as its block size (vLLM 0.19.x); at 128 the kernel split too.
        mla_eagle("mla-eagle-b64", 64),
        mla_eagle("mla-eagle-b128", 128),
        # Sliding windows: the window's own block from 0.25 (16 on Triton, scaled back to 64 by
        # page unification); with 8 window heads the full groups' blocks scale to 256 and their
        # block-table rows become narrower than the windows' (MRv2's padded rows before 0.23).
        window_hybrid("triton-swa-b64", "TRITON_ATTN", 64, 2),
        window_hybrid("fa-swa-wide-b64", "FLASH_ATTN", 64, 8),
    ]


def gen1_hybrid_cases(vllm_version: str) -> list[CaseConfig]:
    """Mamba hybrids whose state page is larger than the attention page at ``--block-size``, so the
    release's block-size negotiation raises the attention block and pads the state page
    (``reference.gen1.hybrid_block_size``): its alignment differs by release (0.19: 16, MLA 64;
    0.20 on: the backend's smallest kernel block or ``--block-size``; 0.27 on: MLA 128), and a
    release registers the states as a list of tensors (to 0.26) or one int8 page view (0.27 on).
    The layout run and the release history judge them; the generation-1 connector checks keep to
    ``gen1_cases`` (their adapters were built for attention views)."""

    def hybrid(name: str, backend: str, block_size: int, *, kind: str = "full", heads: int = 2,
               head_size: int = 64) -> CaseConfig:
        attention = tuple(LayerConfig(f"model.layers.{i}.self_attn.attn", kind=kind, backend=backend,
                                      num_kv_heads=1 if kind == "mla" else heads, head_size=head_size)
                          for i in (0, 2))
        # Mamba-2 state of a wide mixer: conv (3, 256) and SSM (16 heads, 64, 16), 35,840 bytes in bf16.
        mixers = tuple(LayerConfig(f"model.layers.{i}.mixer", kind="mamba", backend="MAMBA2_ATTN",
                                   mamba_shapes=((3, 256), (16, 64, 16))) for i in (1, 3))
        return CaseConfig(name=f"gen1-{name}", layers=(attention[0], mixers[0], attention[1], mixers[1]),
                          block_size=block_size, num_blocks=4, generation=1, vllm_version=vllm_version)

    return [
        # 512 bytes per token: 0.19 aligns to 16 (80 tokens), 0.20 on to --block-size 32 (96).
        hybrid("mamba-fa-b32", "FLASH_ATTN", 32),
        hybrid("mamba-flashinfer-b16", "FLASHINFER", 16),
        hybrid("mamba-triton-b16-hnd", "TRITON_ATTN", 16).with_(layout="HND"),
        # MLA (1,152 bytes per token): 0.19 aligns to 64, 0.20-0.26 to Triton-MLA's 16 (32), 0.27 on to 128.
        hybrid("mamba-triton-mla-b16", "TRITON_MLA", 16, kind="mla", head_size=576),
    ]
