"""``kvconform explain --html``: a standalone page picturing where every layer's kernel blocks,
and one logical block's K and V, sit in the pool.

One row per registered layer over the pool's byte axis (plain SVG in HTML: no scripts, no
external resources), then the text ``kvconform explain`` prints.
"""

from __future__ import annotations

import html
from pathlib import Path

from conformance.explain import explain
from reference.derive import Derivation
from reference.kernel_blocks import expand_block_id
from reference.views import Region

_WIDTH = 1000
_LABEL = 260
_ROW = 26
_NOTE = 190
"""Room on the right for the kernel-block note."""
_MAX_RECTS = 4000
"""Past this many runs per region only its span is drawn (LBNHC K runs are per token)."""
_MAX_PAGES = 256
"""Past this many blocks per layer the pages are drawn as one span (a picture is about
600 px wide: more pages are not visible, and drawing them would grow with the pool)."""


def _rects(region: Region, scale: float, y: int, height: int, css: str) -> list[str]:
    if region.count > _MAX_RECTS:
        lo, hi = region.span()
        return [_rect(lo, hi, scale, y, height, css + " span")]
    return [_rect(start, stop, scale, y, height, css) for start, stop in region.runs()]


def _rect(start: int, stop: int, scale: float, y: int, height: int, css: str) -> str:
    x = _LABEL + start * scale
    w = max((stop - start) * scale, 0.6)
    return f'<rect class="{css}" x="{x:.2f}" y="{y}" width="{w:.2f}" height="{height}"/>'


def block_picture(d: Derivation, block_id: int = 1, max_layers: int = 12) -> str:
    """An SVG of the pool for ``d``, highlighting logical block ``block_id``."""
    block_id = min(block_id, d.num_blocks - 1)
    layers = list(d.registered)[:max_layers]
    scale = (_WIDTH - _LABEL - _NOTE) / max(d.plan.size, 1)
    height = 40 + _ROW * len(layers) + 30
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{height}" role="img" '
        f'aria-label="pool layout of {html.escape(d.case.name)}">',
        f'<text x="{_LABEL}" y="16" class="axis">byte 0</text>',
        f'<text x="{_WIDTH - _NOTE}" y="16" class="axis end">{d.plan.size:,} B</text>',
    ]
    for row, name in enumerate(layers):
        y = 30 + row * _ROW
        view = d.registered[name]
        ratio = d.block_ratio(view.group_id)
        parts.append(f'<text x="{_LABEL - 8}" y="{y + 15}" class="name end">{html.escape(name)} (g{view.group_id})</text>')
        if d.num_blocks > _MAX_PAGES:
            first, last = d.block_bytes(name, 0).page.span(), d.block_bytes(name, d.num_blocks - 1).page.span()
            parts.append(_rect(min(first[0], last[0]), max(first[1], last[1]), scale, y, 20, "page span"))
        else:
            for b in range(d.num_blocks):
                page = d.block_bytes(name, b).page
                for start, stop in page.runs() if page.count <= 64 else [page.span()]:
                    parts.append(_rect(start, stop, scale, y, 20, "page"))
        block = d.block_bytes(name, block_id)
        # K in the upper half, V in the lower: they interleave finer than a pixel under
        # most layouts, and stacked they stay visible.
        parts += _rects(block.k, scale, y + 1, 9 if block.v is not None else 18, "k")
        if block.v is not None:
            parts += _rects(block.v, scale, y + 10, 9, "v")
        if ratio > 1:
            parts.append(
                f'<text x="{_WIDTH - 5}" y="{y + 15}" class="note end">block {block_id} = kernel blocks {expand_block_id(block_id, ratio)}</text>'
            )
    y = 40 + _ROW * len(layers)
    parts += [
        f'<rect class="page" x="{_LABEL}" y="{y}" width="14" height="12"/><text x="{_LABEL + 20}" y="{y + 11}" class="axis">kernel-block pages</text>',
        f'<rect class="k" x="{_LABEL + 170}" y="{y}" width="14" height="12"/><text x="{_LABEL + 190}" y="{y + 11}" class="axis">K of logical block {block_id}</text>',
        f'<rect class="v" x="{_LABEL + 360}" y="{y}" width="14" height="12"/><text x="{_LABEL + 380}" y="{y + 11}" class="axis">V of logical block {block_id}</text>',
        "</svg>",
    ]
    if len(d.registered) > max_layers:
        parts.insert(-1, f'<text x="10" y="{height - 4}" class="axis">(first {max_layers} of {len(d.registered)} layers)</text>')
    return "\n".join(parts)


_CSS = """
body { font-family: system-ui, sans-serif; margin: 2rem; color: #1f2328; }
pre { background: #f6f8fa; padding: 1rem; overflow-x: auto; font-size: 12px; }
svg text { font-size: 12px; fill: #1f2328; }
svg text.end { text-anchor: end; }
svg text.axis, svg text.note { fill: #57606a; }
svg rect.page { fill: #d0d7de; stroke: #ffffff; stroke-width: 0.5; }
svg rect.k { fill: #0969da; }
svg rect.v { fill: #e16f24; }
svg rect.span { opacity: 0.55; }
"""


def explain_html(d: Derivation, block_id: int = 1) -> str:
    """A standalone page: the picture, then the same text ``kvconform explain`` prints."""
    title = f"kvconform explain: {d.case.name} ({d.runner})"
    return (
        f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{html.escape(title)}</title>"
        f"<style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1>"
        f"{block_picture(d, block_id)}<pre>{html.escape(explain(d, block_id=block_id))}</pre></body></html>\n"
    )


def write_explain_html(d: Derivation, path: str, block_id: int = 1) -> None:
    Path(path).write_text(explain_html(d, block_id))
