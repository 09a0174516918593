"""Why a connector moved the wrong bytes: each finding of ``validate_registration`` is put
down to one of ``CAUSES`` with one line naming the fix, from what the reference says about
the layer (``LayerFacts``) and what the connector did.

A new cause: its name in ``CAUSES`` and a function in ``DESCRIPTOR_CAUSES`` (in the order
they are tried, most specific first), or a message function for a derived value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from reference import intervals

CAUSES = ("kernel_blocks", "layout_strides", "kv_packing", "page_padding", "page_stride", "heads_as_tokens",
          "missing_bytes", "no_descriptors", "out_of_pool", "derived_value", "round_trip", "register")
"""What a finding is put down to: logical vs kernel blocks, layout strides, K/V packing, page
padding, page size used as the block stride, heads counted as tokens, other missing/extra bytes,
no descriptors, addresses outside the pool, a wrong derived value (block_len, num_blocks,
kernel_block_size), a round-trip finding alone, a failed registration."""

SHOW = 3
"""Intervals shown per expected/observed value."""

_PACKING_WHERE = {
    "kv_in_c": "K then V in the last dim C of every (token, head)",
    "two_head_slots": "two head slots: H = 2 (slot 0 is K, slot 1 is V) and C holds every head of one token",
    "cpu_kv_planes": "per (block, head) a K plane of all the block's tokens, then a V plane",
    "mla_latent": "one latent vector per token, no separate V",
    "state": "raw recurrent state, no K or V",
}
"""``LayerInfo.kv_packing`` -> where K and V sit, in the words of a finding."""


def show(iv: list[tuple[int, int]], base: int) -> str:
    """Intervals as pool offsets, a few shown."""
    parts = [f"[{a - base}, {b - base})" for a, b in iv[:SHOW]]
    more = f" +{len(iv) - SHOW} more" if len(iv) > SHOW else ""
    return f"{intervals.total(iv)} bytes at pool offsets {' '.join(parts) or 'none'}{more}"


class LayerFacts:
    """What the reference says about one registered layer (``Derivation.layer_blocks``),
    with the addresses of the tensor the connector was handed."""

    def __init__(self, derivation, name: str, view_tensor, base: int) -> None:
        blocks = derivation.layer_blocks(name)
        self.name = name
        self.view = derivation.registered[name]
        self.base = base
        self.es = self.view.element_size
        self.ratio = blocks.kernel_blocks_per_block
        self.kernel_tokens = blocks.kernel_block_tokens
        self.logical_tokens = blocks.block_tokens
        self.page = blocks.page_bytes
        self.stride0 = blocks.kernel_block_stride_bytes
        self.data_ptr = view_tensor.data_ptr()
        self.heads = blocks.heads
        self.kernel_content = blocks.kernel_content_bytes
        self.kernel_page = blocks.kernel_page_bytes


# --- descriptors: which bytes of a block ---------------------------------------------------------


@dataclass(frozen=True)
class DescriptorMismatch:
    """A block whose transferred bytes (or K or V bytes) are not the reference's."""

    facts: LayerFacts
    """The layer's reference facts."""
    layout: str
    """The resolved layout name."""
    block: int
    """The logical block."""
    expected: list
    """The reference's merged absolute intervals."""
    observed: list
    """The connector's merged absolute intervals."""
    kind: str
    """``page`` (the whole block), ``k`` or ``v``."""
    packing: str = "kv_in_c"
    """The layer's ``LayerInfo.kv_packing``."""

    @property
    def lo(self) -> int | None:
        """The first observed address."""
        return self.observed[0][0] if self.observed else None

    @property
    def n_obs(self) -> int:
        return intervals.total(self.observed)

    @property
    def n_exp(self) -> int:
        return intervals.total(self.expected)

    @property
    def what(self) -> str:
        return "K bytes" if self.kind == "k" else "V bytes" if self.kind == "v" else "bytes"


def _no_descriptors(m: DescriptorMismatch) -> str | None:
    if m.observed:
        return None
    return f"no descriptors for logical block {m.block}: every registered layer (including aliased groups) must transfer its block"


def _kv_packing(m: DescriptorMismatch) -> str | None:
    # The page is right (checked first) but K and V were split as if K then V share the last dim.
    if m.kind not in ("k", "v") or m.packing == "kv_in_c":
        return None
    return (
        f"the block's page is right but its {m.what} are not: this layer's backend packs {_PACKING_WHERE.get(m.packing, m.packing)} "
        f"(LayerInfo.kv_packing = {m.packing!r}); split K from V by that packing, not by halving the last dim"
    )


def _page_padding(m: DescriptorMismatch) -> str | None:
    f, block = m.facts, m.block
    content_block = f.kernel_content * f.ratio  # the block's bytes without page padding
    if not (m.lo is not None and block > 0 and f.page > content_block and f.stride0 * f.ratio == f.page
            and m.lo == f.data_ptr + block * content_block):
        return None
    return (
        f"block {block} starts {block} x {content_block} bytes (the block's K/V bytes) into the layer, but this layer's "
        f"pages are padded to {f.page} bytes (page_size_bytes: the group shares one page size): "
        f"address blocks with stride(0)*element_size ({f.stride0}), which includes the padding"
    )


def _logical_as_kernel_block(m: DescriptorMismatch) -> str | None:
    f, block = m.facts, m.block
    if not (m.lo is not None and f.ratio > 1 and m.lo == f.data_ptr + block * f.stride0
            and (block > 0 or m.n_obs * f.ratio == m.n_exp)):
        return None
    return (
        f"logical block {block} was addressed as kernel block {block} (offset {block * f.stride0} into the layer); "
        f"vLLM registered {f.kernel_tokens}-token kernel blocks ({f.ratio} per {f.logical_tokens}-token logical block, "
        f"shape[0] = {f.view.shape[0]}): logical block b is kernel blocks [b*{f.ratio}, b*{f.ratio}+{f.ratio - 1}]"
    )


def _page_stride(m: DescriptorMismatch) -> str | None:
    f, block, layout = m.facts, m.block, m.layout
    if not (m.lo is not None and block > 0 and f.page != f.stride0 * f.ratio and m.lo == f.data_ptr + block * f.page):
        return None
    return (
        f"block {block} starts {block} x page ({f.page} bytes) into the layer, but under {layout} consecutive "
        f"blocks are {f.stride0 * f.ratio} bytes apart (stride(0)*element_size = {f.stride0}"
        + (", block-outermost: all layers' pages of a block sit together" if layout.startswith("B") else "")
        + "): address blocks with stride(0), never with the page size"
    )


def _heads_as_tokens(m: DescriptorMismatch) -> str | None:
    f = m.facts
    if not (f.heads != f.kernel_tokens and f.ratio * m.n_obs * f.kernel_tokens == m.n_exp * f.heads):
        return None
    return (
        f"{m.n_obs} {m.what} per block = shape[-3] ({f.heads}) tokens' worth: in 0.33.0's [B, H, N, C] view shape[-3] "
        f"is num_kv_heads; a block holds shape[2] = {f.kernel_tokens} tokens per kernel block ({f.logical_tokens} per logical block)"
    )


def _logical_length(m: DescriptorMismatch) -> str | None:
    f = m.facts
    if not (m.n_obs == m.n_exp * f.ratio and f.ratio > 1):
        return None
    return (
        f"{m.n_obs} {m.what} per block looks like the logical block ({f.logical_tokens} tokens) laid over kernel blocks of "
        f"{f.kernel_tokens} tokens: take block length and count from the registered view (stride(0), shape[0])"
    )


def _layout_strides(m: DescriptorMismatch) -> str | None:
    f, layout = m.facts, m.layout
    if m.n_obs != m.n_exp:
        return None
    order = {"LBHNC": "heads outer to tokens (H, N, C)", "LBNHC": "tokens outer to heads (N, H, C)"}.get(
        layout, f"the strides of {layout}"
    )
    return (
        f"right amount ({m.n_obs} {m.what}) at the wrong addresses: under {layout} a block is laid out with {order}; "
        f"view strides are {tuple(s * f.es for s in f.view.stride)} bytes: compute offsets from tensor.stride(), "
        "not from an assumed layout"
    )


def _missing_bytes(m: DescriptorMismatch) -> str:
    missing, extra = intervals.subtract(m.expected, m.observed), intervals.subtract(m.observed, m.expected)
    return (
        f"{intervals.total(missing)} {m.what} of the block are not transferred and {intervals.total(extra)} bytes of other data are: "
        f"block {m.block} of this layer is {show(m.expected, m.facts.base)}"
    )


DESCRIPTOR_CAUSES: tuple[tuple[str, Callable[[DescriptorMismatch], str | None]], ...] = (
    ("no_descriptors", _no_descriptors),
    ("kv_packing", _kv_packing),
    ("page_padding", _page_padding),
    ("kernel_blocks", _logical_as_kernel_block),
    ("page_stride", _page_stride),
    ("heads_as_tokens", _heads_as_tokens),
    ("kernel_blocks", _logical_length),
    ("layout_strides", _layout_strides),
)
"""The causes of a descriptor mismatch, tried in this order (the first that fits is
reported); none fitting: ``missing_bytes``."""


def descriptor_cause(f: LayerFacts, layout: str, block: int, expected: list, observed: list, kind: str,
                     packing: str = "kv_in_c") -> tuple[str, str]:
    """(the cause, one of ``CAUSES``; one line naming it and the fix) of a descriptor mismatch."""
    mismatch = DescriptorMismatch(f, layout, block, expected, observed, kind, packing)
    for cause, explain in DESCRIPTOR_CAUSES:
        why = explain(mismatch)
        if why is not None:
            return cause, why
    return "missing_bytes", _missing_bytes(mismatch)


def heads_message(f: LayerFacts, layout: str, block: int, h0: int, h1: int, expected: list, observed: list) -> str:
    """One line for a head slice whose bytes are not the reference's (cause ``layout_strides``)."""
    if intervals.total(observed) == intervals.total(expected):
        if layout in ("LBHNC", "BLHNC"):
            how = f"under {layout} each head's {f.kernel_tokens} tokens are contiguous (heads outer to tokens), so a head slice is one run per kernel block"
        elif layout in ("LBNHC", "BLNHC"):
            how = f"under {layout} tokens are outer to heads, so a head slice is one run per token"
        else:
            how = f"under {layout} heads sit {f.view.stride[1] * f.es} bytes apart"
        return (
            f"heads [{h0}, {h1}) of block {block} point at other heads' or tokens' bytes: {how}; "
            f"take head and token offsets from stride(1) and stride(2) ({f.view.stride[1] * f.es}, {f.view.stride[2] * f.es} bytes), "
            "never from an assumed NHD/HND order"
        )
    return f"heads [{h0}, {h1}) of block {block}: {intervals.total(observed)} bytes where the slice is {intervals.total(expected)}; derive head slices from the view's strides"


# --- derived values (cause ``derived_value``) ----------------------------------------------------


def kernel_block_size_message(kbs: int, expected: set[int], facts: Any) -> str:
    """One line for a ``kernel_block_size`` that is none of the ``expected`` tokens per
    registered block (``facts``: the layers' ``LayerFacts``)."""
    some = next(f for f in facts.values() if f.kernel_tokens in expected)
    if kbs == some.heads and some.heads != some.kernel_tokens:
        return (
            f"kernel_block_size {kbs} is shape[-3] of the registered view, which in 0.33.0's [B, H, N, C] view is "
            f"num_kv_heads ({some.heads}), not tokens: tokens per registered block are shape[2] ({some.kernel_tokens})"
        )
    if kbs == some.logical_tokens:
        return (
            f"kernel_block_size {kbs} is the logical block size; vLLM registered {some.kernel_tokens}-token kernel "
            f"blocks: use shape[2] (or shape[0] // num_blocks for the split ratio) of the registered view"
        )
    return f"kernel_block_size {kbs} is not the {sorted(expected)} tokens per registered block (shape[2] of the views)"


def block_len_is_right(bl: int, f: LayerFacts, layout: str) -> bool:
    """A registered block of the layer, with or without its page padding, or (block-outermost
    layouts) the whole packed row."""
    return bl in (f.kernel_page, f.kernel_content) or (layout.startswith("B") and bl == f.stride0)


def block_len_message(bl: int, f: LayerFacts) -> str:
    """One line for a ``block_len`` that is not one registered block of the layer."""
    name = f.name
    if f.ratio > 1 and bl in (f.page, f.kernel_content * f.ratio):
        return (
            f"block_len {bl} for layer {name} looks like the logical block ({f.logical_tokens} tokens); "
            f"vLLM registered {f.kernel_tokens}-token kernel blocks: use shape[0]/stride[0] of the registered view"
        )
    if f.heads != f.kernel_tokens and bl == f.kernel_content // f.kernel_tokens * f.heads:
        return (
            f"block_len {bl} for layer {name} counts shape[-3] ({f.heads} = num_kv_heads) as tokens; "
            f"a registered block holds shape[2] = {f.kernel_tokens} tokens: block_len is stride(0)*element_size for dense pages"
        )
    if bl == f.stride0 and f.stride0 != f.kernel_page:
        return (
            f"block_len {bl} for layer {name} is the block stride (stride(0)*element_size) of a "
            f"block-outermost/packed layout; one layer's block is {f.kernel_page} bytes of that row"
        )
    return f"block_len {bl} for layer {name}: one registered block of this layer is {f.kernel_page} bytes"


def num_blocks_message(nb: Any, f: LayerFacts, logical_blocks: int) -> str:
    """One line for a ``num_blocks`` that is not ``shape[0]`` of the layer's view."""
    if nb == logical_blocks and f.ratio > 1:
        return (
            f"num_blocks {nb} is the logical count; the view of {f.name} has {f.view.shape[0]} "
            f"{f.kernel_tokens}-token kernel blocks (shape[0]): register and address kernel blocks"
        )
    return f"num_blocks {nb} for layer {f.name}: the registered view has shape[0] = {f.view.shape[0]} blocks"


# --- registration --------------------------------------------------------------------------------


def raised_in(exc: BaseException) -> tuple[str, str]:
    """(who raised: ``vllm``, ``kvconform`` or ``connector``, and ``file:line: code`` of the raise)."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "connector", ""
    last = frames[-1]
    where = f"{last.filename.split('site-packages/')[-1]}:{last.lineno}: {(last.line or '').strip()}"
    path = last.filename.replace("\\", "/")
    if "/vllm/" in path:
        return "vllm", where
    if any(f"/{pkg}/" in path for pkg in ("gpu_impl", "conformance", "reference")):
        return "kvconform", where
    return "connector", where


def one_line(exc: BaseException) -> str:
    """``Type: first line of the message``, at most 300 characters."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"[:300]


__all__ = ["CAUSES", "DESCRIPTOR_CAUSES", "DescriptorMismatch", "LayerFacts", "block_len_is_right", "block_len_message",
           "descriptor_cause", "heads_message", "kernel_block_size_message", "num_blocks_message", "one_line", "raised_in",
           "show"]
