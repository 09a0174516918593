"""Hypothesis strategies that generate only valid cases (generation 2).

Kept small and shrink-friendly: the first choices are the simplest (one dense full
attention group, FLASH_ATTN, block 16), so a failure shrinks towards a readable case.
Imports hypothesis lazily at call time so the reference never depends on it.
"""

from __future__ import annotations

import random
from typing import Any, Callable, Sequence

from reference.config import CaseConfig, LayerConfig

LAYOUTS = ("LBNHC", "LBHNC", "LHBNC", "BLHNC", "BLNHC", "BHLNC")
# (backend, head sizes it accepts that keep cases small)
GQA_BACKENDS: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("FLASH_ATTN", (8, 16, 64, 128)),
    ("TRITON_ATTN", (32, 64, 128)),
    ("FLEX_ATTENTION", (8, 16, 64)),
    ("FLASHINFER", (64, 128)),
)
MLA_BACKENDS = ("TRITON_MLA", "FLASHMLA", "FLASHINFER_MLA")


def build_case(pick: Callable[[Sequence[Any]], Any], integer: Callable[[int, int], int], *, name: str = "random", max_layers: int = 4, max_blocks: int = 4) -> CaseConfig:
    """One valid case from two choice functions, so hypothesis and a seeded RNG share it.

    ``pick(options)`` returns one of ``options``; ``integer(lo, hi)`` an int in ``[lo, hi]``.
    Options are listed simplest first, so hypothesis shrinks towards readable cases.
    """
    family = pick(("dense", "swa_hybrid", "mla_draft", "mamba_hybrid", "gqa_draft"))
    # Non-powers of two too: multiples of 16 are valid for MultipleOf(16) backends, and
    # force a smaller kernel block (or a refusal) on fixed-size ones like FlashInfer.
    block_size = pick((16, 32, 64, 128, 256, 48, 96, 272))
    backend, heads = pick(GQA_BACKENDS)
    head_size = pick(heads)
    kv_heads = pick((1, 2, 4))
    cache_dtype = pick(("auto", "fp8") if backend != "FLEX_ATTENTION" else ("auto",))
    n = integer(1, max_layers)
    layers: list[LayerConfig] = [
        LayerConfig(f"model.layers.{i}.self_attn.attn", backend=backend, num_kv_heads=kv_heads, head_size=head_size, cache_dtype=cache_dtype)
        for i in range(n)
    ]
    if family == "mla_draft":
        mla_backend = pick(MLA_BACKENDS)
        layers = [LayerConfig(f"model.layers.{i}.self_attn.attn", kind="mla", backend=mla_backend, head_size=576) for i in range(n)]
        layers.append(LayerConfig("draft.layers.0.attn", backend=backend, num_kv_heads=kv_heads, head_size=head_size, is_draft=True))
    elif family == "gqa_draft":
        draft_backend, draft_heads = pick(GQA_BACKENDS)
        layers.append(
            LayerConfig("draft.layers.0.attn", backend=draft_backend, num_kv_heads=kv_heads, head_size=pick(draft_heads), is_draft=True)
        )
    elif family == "swa_hybrid":
        sw_heads = pick((1, 2, 4))
        window = pick((64, 512))
        layers += [
            LayerConfig(
                f"model.layers.{n + i}.self_attn.attn",
                kind="sliding_window",
                backend=backend,
                num_kv_heads=sw_heads,
                head_size=head_size,
                sliding_window=window,
            )
            for i in range(integer(1, max_layers))
        ]
    elif family == "mamba_hybrid":
        layers += [
            LayerConfig(f"model.layers.{n + i}.mixer", kind="mamba", backend="MAMBA2_ATTN", mamba_shapes=((2, 32), (4, 16, 8)))
            for i in range(integer(1, max_layers))
        ]
    layout = pick((None,) + LAYOUTS)
    return CaseConfig(
        name=f"{name}-{family}",
        layers=tuple(layers),
        block_size=block_size,
        num_blocks=integer(2, max_blocks),
        layout=layout,
        mamba_block_size=block_size if family == "mamba_hybrid" else None,
    )


def cases(*, max_layers: int = 4, max_blocks: int = 4) -> Any:
    """A hypothesis strategy of valid ``CaseConfig`` objects mixing the main model families."""
    from hypothesis import strategies as st

    @st.composite
    def build(draw: Any) -> CaseConfig:
        return build_case(
            lambda options: draw(st.sampled_from(options)),
            lambda lo, hi: draw(st.integers(lo, hi)),
            max_layers=max_layers,
            max_blocks=max_blocks,
        )

    return build()


def sample_cases(seed: int, count: int, **limits: int) -> list[CaseConfig]:
    """``count`` cases from a seeded RNG: the same list on every machine and xdist worker."""
    rng = random.Random(seed)
    return [build_case(rng.choice, rng.randint, name=f"random-s{seed}-{i}", **limits) for i in range(count)]
