"""The physical KV cache layout: one permutation of ``[L, B, H, N, C]`` for the whole model.

Mirrors ``vllm/v1/kv_cache_layout.py`` (``KVCacheLayout``, ``compute_layout_strides``)
and the layout resolution of ``vllm/v1/attention/backends/utils.py``
(``get_supported_kv_cache_layouts``, ``resolve_kv_cache_layout``), the target release.
"""

from __future__ import annotations

import enum
from typing import Callable, Iterable, Sequence

from reference.errors import ConfigError, StartupError

L, B, H, N, C = range(5)
AXIS_NAMES = "LBHNC"


class KVCacheLayout(enum.Enum):
    """Physical order of the logical axes, outermost first (vLLM ``KVCacheLayout``)."""

    LBHNC = (L, B, H, N, C)
    LBNHC = (L, B, N, H, C)
    LHBNC = (L, H, B, N, C)
    BLHNC = (B, L, H, N, C)
    BLNHC = (B, L, N, H, C)
    BHLNC = (B, H, L, N, C)

    @property
    def perm(self) -> tuple[int, ...]:
        return self.value

    @property
    def is_layer_compact(self) -> bool:
        """L is the outermost axis."""
        return self.value[0] == L

    @property
    def is_block_outermost(self) -> bool:
        return self.value[0] == B

    @property
    def is_block_compact(self) -> bool:
        """{L, B} are the two outermost axes: a block's page is one contiguous run."""
        return set(self.value[:2]) == {L, B}

    @property
    def is_block_contiguous(self) -> bool:
        return self.value[2:] == (H, N, C)

    @property
    def layer_view_order(self) -> tuple[int, ...]:
        """The per-layer ``[B, H, N, C]`` permutation (vLLM's ``layer_view_order``)."""
        return tuple(a - 1 for a in self.value if a != L)

    @property
    def flashinfer_name(self) -> str | None:
        """FlashInfer's "NHD"/"HND" string (``get_flashinfer_layout_string``); None for LHBNC."""
        if self is KVCacheLayout.LHBNC:
            return None
        return "NHD" if self.value.index(N) < self.value.index(H) else "HND"


# Enum (declaration) order, used by the intersection in get_supported_kv_cache_layouts.
ENUM_ORDER = (
    KVCacheLayout.LBHNC,
    KVCacheLayout.LBNHC,
    KVCacheLayout.LHBNC,
    KVCacheLayout.BLHNC,
    KVCacheLayout.BLNHC,
    KVCacheLayout.BHLNC,
)
# The preference used when no backend declares layouts.
DEFAULT_PREFERENCE = (
    KVCacheLayout.LBNHC,
    KVCacheLayout.LBHNC,
    KVCacheLayout.BLNHC,
    KVCacheLayout.BLHNC,
    KVCacheLayout.BHLNC,
    KVCacheLayout.LHBNC,
)
_GEN1_NAMES = {"NHD": KVCacheLayout.LBNHC, "HND": KVCacheLayout.LBHNC}

LAYOUT_NAMES: tuple[str, ...] = tuple(m.name for m in KVCacheLayout)
"""Every ``KVCacheLayout`` name, in vLLM's order: the one list of layout names."""
LAYOUT_ALIASES: dict[str, str] = {alias: layout.name for alias, layout in _GEN1_NAMES.items()}
"""FlashInfer-era names ``VLLM_KV_CACHE_LAYOUT`` still accepts, and the layout each means."""


def layout_from_name(name: str) -> KVCacheLayout:
    """``"NHD"`` / ``"LBNHC"`` -> ``KVCacheLayout``; one-line error for anything else."""
    if name in _GEN1_NAMES:
        return _GEN1_NAMES[name]
    try:
        return KVCacheLayout[name]
    except KeyError:
        valid = ", ".join([m.name for m in KVCacheLayout] + list(_GEN1_NAMES))
        raise ConfigError(f"KV cache layout {name!r} is not one of {valid}") from None


def compute_layout_strides(
    shape: Sequence[int],
    layout: KVCacheLayout,
    fixed_strides: Sequence[int | None] = (None,) * 5,
    page_size_padded: int | None = None,
) -> tuple[int, ...]:
    """Byte strides of the logical ``[L, B, H, N, C]`` axes, C in bytes (stride 1).

    Walks the physical order innermost first; each axis takes its fixed stride or the
    running product. A padded page raises the running stride at the innermost axis of
    the L/B page grid, as ``compute_layout_strides`` does.
    """
    order = layout.perm
    strides = [0] * 5
    running = 1
    grid_inner = max(order.index(L), order.index(B))
    for pos in range(4, -1, -1):
        axis = order[pos]
        if page_size_padded is not None and pos == grid_inner:
            running = max(running, page_size_padded)
        stride = fixed_strides[axis] if fixed_strides[axis] is not None else running
        strides[axis] = stride
        running = stride * shape[axis]
    return tuple(strides)


def supported_layouts(per_backend: Iterable[tuple[str, tuple[KVCacheLayout, ...] | None]]) -> tuple[KVCacheLayout, ...]:
    """Candidates every backend accepts, best first (``get_supported_kv_cache_layouts``)."""
    declared = [(name, lays) for name, lays in per_backend if lays is not None]
    if not declared:
        return DEFAULT_PREFERENCE
    lists = [lays for _, lays in declared]
    if all(lays == lists[0] for lays in lists):
        return lists[0]
    priority = {lay: sum(1 for lays in lists if lays[0] is lay) for lay in ENUM_ORDER}
    common = [lay for lay in ENUM_ORDER if all(lay in lays for lays in lists)]
    common.sort(key=lambda lay: -priority[lay])
    if not common:
        detail = "; ".join(f"{n}: {[l.name for l in lays]}" for n, lays in declared)
        raise StartupError(
            f"No KV cache layout satisfies every supported set: {detail}",
            where="vllm.v1.attention.backends.utils.get_supported_kv_cache_layouts",
        )
    return tuple(common)


def _only(candidates: Sequence[KVCacheLayout], keep: Callable[[KVCacheLayout], bool], where: str,
          refusal: str) -> tuple[KVCacheLayout, ...]:
    """The candidates ``keep`` accepts; StartupError(``refusal``) when none is left."""
    kept = tuple(c for c in candidates if keep(c))
    if not kept:
        raise StartupError(refusal, where=where)
    return kept


def resolve_layout(
    candidates: tuple[KVCacheLayout, ...],
    *,
    mixed_hnc: bool,
    env_layout: str | None,
    connector_layout: KVCacheLayout | None,
    mixed_dcp_and_pages: bool = False,
) -> KVCacheLayout:
    """Pick the model's layout (``resolve_kv_cache_layout`` in the engine core)."""
    where = "vllm.v1.attention.backends.utils.resolve_kv_cache_layout"
    if mixed_hnc:
        candidates = _only(
            candidates, lambda c: c.is_block_compact, where,
            "Specs with mixed HNC shapes need a block-compact layout, but no supported layout is block-compact",
        )
    if mixed_dcp_and_pages:
        candidates = _only(
            candidates, lambda c: c.is_block_outermost, where,
            "DCP with a replicated draft and mixed KV page sizes requires a block-outer KV cache layout",
        )
    if env_layout is not None:
        chosen = layout_from_name(env_layout)
        if chosen not in candidates:
            raise StartupError(
                f"VLLM_KV_CACHE_LAYOUT={env_layout} does not satisfy every supported set; "
                f"valid layouts: {[c.name for c in candidates]}",
                where=where,
            )
        return chosen
    if connector_layout is not None and connector_layout in candidates:
        return connector_layout
    return candidates[0]
