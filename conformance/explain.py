"""Render a reference derivation for a person: groups, kernel blocks, views, one block's bytes."""

from __future__ import annotations

from reference.backends import VLLM_VERSION
from reference.derive import Derivation
from reference.kernel_blocks import expand_block_id
from reference.views import Region


def _region(region: Region) -> str:
    lo, hi = region.span()
    if not region.dims:
        return f"[{lo:,}, {hi:,})  one run of {region.run:,} B"
    dims = " x ".join(f"{count} (stride {stride:,})" for stride, count in region.dims)
    return f"{region.count:,} runs of {region.run:,} B = {region.nbytes:,} B within [{lo:,}, {hi:,}); runs: {dims}"


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


def explain(d: Derivation, block_id: int = 1, max_blocks_shown: int = 4) -> str:
    """A multi-line, plain-text explanation of one derivation."""
    case = d.case
    block_id = min(block_id, d.num_blocks - 1)
    lines = [
        f"case {case.name}  (reference for vLLM {VLLM_VERSION}, runner {d.runner})",
    ]
    if case.note:
        lines.append(f"  {case.note}")
    fi = d.layout.flashinfer_name
    lines += [
        f"  layout {d.layout.name}" + (f" (FlashInfer {fi})" if fi else "")
        + f"; pool {d.plan.size:,} B = {d.num_blocks} blocks x {d.plan.bytes_per_block:,} B per block id",
        f"  cache block size {d.cache_block_size}; a NIXL/Mooncake connector derives kernel block size "
        f"{d.connector_kernel_block_size if d.connector_kernel_block_size is not None else '(none: no common size)'}",
        "",
    ]
    for gid, group in enumerate(d.groups):
        kbs = d.kernel_block_sizes[gid]
        ratio = d.block_ratio(gid)
        lines.append(
            f"  group {gid}: {len(group.layer_names)} layer(s), {group.spec.describe()}, "
            f"kernel block size {kbs}" + (f" (each logical block = {ratio} kernel blocks)" if ratio > 1 else "")
        )
        if ratio > 1:
            shown = ", ".join(
                f"{b} -> {expand_block_id(b, ratio)}" for b in range(min(d.num_blocks, max_blocks_shown))
            )
            lines.append(f"    logical -> kernel block ids: {shown}" + (", ..." if d.num_blocks > max_blocks_shown else ""))
    lines.append("")
    if not d.registered:
        # An attention-free model (every layer encoder-only): nothing is registered.
        lines.append(f"  no KV cache: {len(d.layer_backends)} layer(s) keep none (encoder-only); their metadata "
                     f"builders use block size {d.cache_block_size}")
        return "\n".join(lines)
    rows = [["layer", "backend", "group", "shape", "stride (elements)", "dtype", "byte offset"]]
    for name, view in d.registered.items():
        rows.append(
            [name, d.layer_backends[name], str(view.group_id), str(view.shape), str(view.stride), view.dtype, f"{view.byte_offset:,}"]
        )
    lines += _table(rows)
    lines += _block_lines(d, block_id, "byte addresses in the pool")
    return "\n".join(lines)


def _block_lines(d, block_id: int, addresses: str) -> list[str]:
    """Where one logical block of the first registered layer lives: page, K and V."""
    first = next(iter(d.registered))
    block = d.block_bytes(first, block_id)
    lines = [
        "",
        f"  where logical block {block_id} of {first} lives ({addresses}):",
        f"    page  {_region(block.page)}",
        f"    K     {_region(block.k)}",
    ]
    if block.v is not None:
        lines.append(f"    V     {_region(block.v)}")
    return lines


def explain_gen1(d, block_id: int = 1) -> str:
    """``explain`` for a generation-1 derivation (``reference.gen1.Gen1Derivation``)."""
    case = d.case
    block_id = min(block_id, d.num_blocks - 1)
    lines = [f"case {case.name}  (reference.gen1 for vLLM {case.vllm_version}, generation 1, runner {d.runner})"]
    if case.note:
        lines.append(f"  {case.note}")
    lines += [
        f"  layout {d.layout} (get_kv_cache_layout); {d.num_blocks} blocks; "
        f"{len(d.kv_cache_tensors)} raw tensor(s), each its own allocation",
        "",
    ]
    for gid, group in enumerate(d.groups):
        kbs, ratio = d.kernel_block_sizes[gid], d.block_ratio(gid)
        lines.append(
            f"  group {gid}: {len(group.layer_names)} layer(s), block size {group.spec.block_size}, views reshaped with "
            f"{kbs}-token blocks" + (f" (each logical block = {ratio} kernel blocks)" if ratio > 1 else "")
        )
    lines.append("")
    rows = [["layer", "backend", "shape", "stride (elements)", "dtype", "tensor"]]
    for name, view in d.registered.items():
        rows.append([name, d.layer_backends[d.layer_of(name)], str(view.shape), str(view.stride), view.dtype, str(d.tensor_index(name))])
    lines += _table(rows)
    lines += _block_lines(d, block_id, "virtual byte addresses: tensor i starts after tensors < i")
    return "\n".join(lines)
