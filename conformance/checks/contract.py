"""The contract: what every vLLM must satisfy, whatever its release, read off one observation alone.

No reference derivation and no release fact is used here: each check holds an observation
to itself (its registered views against their storage, its kernel block sizes against its
views, its pages against the spec objects vLLM itself built). A vLLM the reference has no
facts for (an unreleased build, 0.29 to 0.31) is judged by these checks and by
``mrv1_mrv2_mismatch`` (``conformance.checks.runners``); ``kvconform run --contract-only``
judges by them alone. Sharing by design is the one rule taken from the model of vLLM's
allocator rather than from the observation: layers of different KV cache groups share the
pool's pages (hybrid groups overlay one another), so their bytes may coincide, but only for
the same logical block id; two layers of one group, or two blocks, never share a byte.

A fact a driver does not observe (``None``) is not checked; a view too irregular to lay out
in bounded memory is named in ``not_checked`` of its divergence-free outcome, never guessed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from conformance.divergence import Collector, Kind

KINDS = (
    Kind("view_bounds",
         "a registered view reaches outside its storage (negative strides, or bytes past the "
         "storage's end): contract."),
    Kind("kernel_blocks",
         "a registered view has no dimension of num_blocks x (block size / kernel block size) kernel "
         "blocks, a layer's metadata builder was given another kernel block size than its group's "
         "views are split into, or one its backend does not declare it supports: contract."),
    Kind("view_dtype",
         "a registered view holds another dtype than vLLM's own spec object for that layer "
         "declares: contract."),
    Kind("view_order",
         "a registered attention view's strides do not order its dimensions as the resolved layout's "
         "name says (``LBNHC``: blocks, then tokens, then heads, then content; layers outermost): contract."),
    Kind("pool_bytes",
         "the pool's bytes per block times its blocks is not the bytes of its allocations: contract."),
    Kind("page_bytes",
         "one logical block of a registered view holds another number of bytes than vLLM's own spec "
         "object for that layer reports (``real_page_size_bytes``): contract."),
    Kind("block_overlap",
         "the bytes of two different (layer, logical block) pairs overlap, other than layers of "
         "different KV cache groups on the same block id (hybrid groups share pages by design): contract."),
    Kind("allocation_size",
         "an allocation holds more or fewer bytes than its blocks: num_blocks x the padded pages "
         "(``page_size_bytes``) of the layers of one group that live in it (the largest group), each block's "
         "stride a multiple of the alignment every layer's spec declares (``get_block_stride_alignment``, 0.32 "
         "on: the block stride of a block-outermost allocation, each layer's page otherwise), no larger: "
         "contract."),
    Kind("bound_storage",
         "a layer computes with a cache that is not a view of the storage registered for it (a "
         "connector would move other bytes than the kernels use); only observations of the "
         "runner's own ``initialize_kv_cache`` carry it: contract."),
    Kind("kernel_table",
         "in a request schedule run through the runner's own block tables, a row of the tables an "
         "attention group hands its kernels is not the row's logical block ids expanded by that "
         "group's own ratio (block size / the kernel block size its builder was given): contract."),
    Kind("slot_address",
         "in the same schedules, a token's slot is not its own block and offset: block id "
         "``ids[p // B]`` of the row the runner holds for its request, offset ``p % B`` (under DCP, "
         "the token's virtual block and local offset on its rank, PAD on the others), including the "
         "tokens of the draft steps the MRv1 drafter and the MRv2 speculator address themselves, and a "
         "request's encoder tokens, which a cross-attention builder writes at its first step to its own "
         "cross-attention blocks at offsets 0, 1, ...: contract."),
    Kind("bound_view",
         "a layer computes with bytes outside the view registered for it, or with the same shape "
         "but other strides, offset or dtype (a connector and the kernels would disagree on where a "
         "token lives): contract."),
)

CONTRACT_KINDS = tuple(kind.name for kind in KINDS) + ("mrv1_mrv2_mismatch",)
SCHEDULE_KINDS = ("kernel_table", "slot_address")
"""The contract's kinds that only request schedules run through the runners can show."""
"""Every kind judged without the reference's facts: this family's and the runner comparison."""

MAX_INTERVALS = 400_000
"""Byte runs examined per observation at most: the overlap check's memory bound."""

ITEMSIZE = {
    "bool": 1, "uint8": 1, "int8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1,
    "float8_e5m2fnuz": 1, "float8_e8m0fnu": 1, "float4_e2m1fn_x2": 1,
    "int16": 2, "uint16": 2, "float16": 2, "bfloat16": 2,
    "int32": 4, "uint32": 4, "float32": 4,
    "int64": 8, "uint64": 8, "float64": 8,
}
"""Bytes per element of each torch dtype a KV cache view can have (torch's, not vLLM's)."""


@dataclass(frozen=True)
class _Layer:
    name: str
    group: int
    ratio: int
    """Kernel blocks per logical block."""
    kernel_blocks: int


def _itemsize(dtype: str) -> int | None:
    return ITEMSIZE.get(str(dtype).removeprefix("torch."))


def _extent(shape: Sequence[int], stride: Sequence[int]) -> int:
    """Elements from the first to one past the last element a view can address."""
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((n - 1) * st for n, st in zip(shape, stride))


def _runs(shape: Sequence[int], stride: Sequence[int], limit: int) -> list[tuple[int, int]] | None:
    """The contiguous element runs ``(start, end)`` of a view relative to its offset, merged
    innermost first; None when there would be more than ``limit`` runs."""
    dims = sorted(((st, n) for n, st in zip(shape, stride) if n != 1), key=lambda d: d[0])
    run = 1
    while dims and dims[0][0] == run:
        run *= dims.pop(0)[1]
    count = 1
    for _, n in dims:
        count *= n
        if count > limit:
            return None
    starts = [0]
    for st, n in dims:
        starts = [s + i * st for s in starts for i in range(n)]
    return sorted((s, s + run) for s in starts)


def _layers(observation: Any) -> dict[str, _Layer]:
    """Per layer of an observed group: its group, kernel-block ratio and number of kernel blocks."""
    out: dict[str, _Layer] = {}
    sizes = observation.kernel_block_sizes
    num_blocks = observation.num_blocks
    if not sizes or num_blocks is None:
        return out
    for gid, group in enumerate(observation.groups):
        if gid >= len(sizes) or not sizes[gid] or group.block_size % sizes[gid]:
            continue
        ratio = group.block_size // sizes[gid]
        for name in group.layer_names:
            out[name] = _Layer(name, gid, ratio, num_blocks * ratio)
    return out


def _block_dim(view: Any, kernel_blocks: int) -> int | None:
    """The dimension that counts the view's kernel blocks: of that size, the largest stride."""
    dims = [d for d, n in enumerate(view.shape) if n == kernel_blocks]
    return max(dims, key=lambda d: view.stride[d]) if dims else None


def judge_contract(c: Collector, case: Any, observation: Any) -> None:
    """Every contract check of one observation (``c`` collects as ``basis="contract"``)."""
    registered: Mapping[str, Any] = getattr(observation, "registered", None) or {}
    for name, view in registered.items():
        _check_bounds(c, name, view)
    layers = _layers(observation)
    blocks = {}
    for name, view in registered.items():
        layer = layers.get(name)
        if layer is None:
            continue
        dim = _block_dim(view, layer.kernel_blocks)
        if dim is None:
            c.cmp("kernel_blocks", f"{name}.shape: a dimension of {layer.kernel_blocks} kernel blocks",
                  layer.kernel_blocks, tuple(view.shape))
            continue
        blocks[name] = dim
    _check_builders(c, case, observation, layers)
    _check_dtypes(c, observation)
    _check_order(c, observation, layers, blocks)
    _check_pool(c, observation)
    _check_pages(c, observation, layers, blocks)
    _check_overlap(c, observation, layers, blocks)
    _check_allocations(c, observation, layers)
    _check_bound(c, observation)


def _check_bounds(c: Collector, name: str, view: Any) -> None:
    size = _itemsize(view.dtype)
    if size is None:
        return
    if any(st < 0 for st in view.stride) or view.storage_offset < 0:
        c.cmp("view_bounds", f"{name}: strides and offset", "non-negative", (tuple(view.stride), view.storage_offset))
        return
    end = (view.storage_offset + _extent(view.shape, view.stride)) * size
    nbytes = getattr(view, "storage_nbytes", None)
    if nbytes is not None and end > nbytes:
        c.cmp("view_bounds", f"{name}: last byte addressed", f"<= {nbytes} (the storage's size)", end)


def _supports(declared: Iterable[int | str], size: int) -> bool:
    return any(size == d if isinstance(d, int) else size % int(str(d)[1:] or 1) == 0 for d in declared)


def _mapped_to_kernel_blocks(observation: Any, name: str, group_size: int, builder_size: int) -> bool:
    """Whether ``name`` computes with its registered blocks split into the builder's kernel blocks: every cache it is
    bound to holds ``group_size / builder_size`` times fewer rows per block than its registered view (vLLM 0.33's
    ``AttentionGroup.map_kv_cache_to_kernel_blocks`` for a packed compressed cache: a strided view of kernel pages,
    the registered view kept in manager blocks for connectors)."""
    reg = observation.registered.get(name)
    bound = (getattr(observation, "bound_views", None) or {}).get(name) or ()
    if reg is None or not bound or builder_size <= 0 or group_size % builder_size or len(reg.shape) != 4:
        return False
    rows = reg.shape[2] * builder_size // group_size
    # A layer may bind its view without the one head (DeepSeek's caches squeeze [B, 1, N, C] to [B, N, C]).
    return all(len(v.shape) >= 3 and v.shape[-2] == rows < reg.shape[2] for v in bound)


def _check_builders(c: Collector, case: Any, observation: Any, layers: Mapping[str, _Layer]) -> None:
    builders = getattr(observation, "builder_kernel_block_sizes", None) or {}
    sizes = observation.kernel_block_sizes or ()
    runs_at: dict[str, int] = {}
    """The kernel block size each layer's kernels run at: its group's, or its builder's for a mapped cache."""
    for name, given in sorted(builders.items()):
        layer = layers.get(name)
        if layer is None or layer.group >= len(sizes):
            continue
        if given != sizes[layer.group] and _mapped_to_kernel_blocks(observation, name, sizes[layer.group], given):
            runs_at[name] = given
            continue
        c.cmp("kernel_blocks", f"{name}: builder kernel block size (group {layer.group}'s views)",
              sizes[layer.group], given)
    declared = getattr(observation, "supported_kernel_block_sizes", None) or {}
    for name, layer in sorted(layers.items()):
        if name not in declared or layer.group >= len(sizes):
            continue
        size = runs_at.get(name, sizes[layer.group])
        if not _supports(declared[name], size):
            c.cmp("kernel_blocks", f"{name}: kernel block size (its backend declares {list(declared[name])})",
                  "a declared size", size)


def _check_dtypes(c: Collector, observation: Any) -> None:
    declared = getattr(observation, "spec_dtypes", None) or {}
    for name, view in observation.registered.items():
        if name in declared:
            c.cmp("view_dtype", f"{name}.dtype (its spec's)", declared[name], str(view.dtype).removeprefix("torch."))


LAYOUT_LETTERS = "BHNC"
"""A generation-2 attention view's logical dimensions: (blocks, heads, tokens, content)."""


def _check_order(c: Collector, observation: Any, layers: Mapping[str, _Layer], blocks: Mapping[str, int]) -> None:
    name_of_layout = observation.layout
    if not isinstance(name_of_layout, str) or sorted(name_of_layout.replace("L", "")) != sorted(LAYOUT_LETTERS):
        return
    physical = name_of_layout.replace("L", "")
    declared = getattr(observation, "spec_dtypes", None) or {}
    for name, dim in blocks.items():
        view = observation.registered[name]
        if name not in declared or len(view.shape) != 4 or dim != 0:
            continue  # not a (B, H, N, C) attention view
        stride = dict(zip(LAYOUT_LETTERS, view.stride))
        size = dict(zip(LAYOUT_LETTERS, view.shape))
        order = [letter for letter in physical if size[letter] > 1]
        strides = [stride[letter] for letter in order]
        c.cmp("view_order", f"{name}.stride (layout {name_of_layout}: {' > '.join(order)})",
              sorted(strides, reverse=True), strides)


def _check_pool(c: Collector, observation: Any) -> None:
    if observation.bytes_per_block is None or observation.num_blocks is None or not observation.tensors:
        return
    storage_of = getattr(observation, "storage_of", None)
    if storage_of:
        sizes = {n: observation.registered[name].storage_nbytes for name, n in storage_of.items()}
        total = sum(sizes.values())
    else:
        return
    c.cmp("pool_bytes", "bytes_per_block x num_blocks (the allocations' bytes)",
          total, observation.bytes_per_block * observation.num_blocks)


def _subview(view: Any, dim: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    shape = tuple(n for d, n in enumerate(view.shape) if d != dim)
    stride = tuple(s for d, s in enumerate(view.stride) if d != dim)
    return shape, stride


def _check_pages(c: Collector, observation: Any, layers: Mapping[str, _Layer], blocks: Mapping[str, int]) -> None:
    pages = getattr(observation, "page_bytes", None)
    if not pages:
        return
    for name, dim in blocks.items():
        view, layer = observation.registered[name], layers[name]
        size = _itemsize(view.dtype)
        if name not in pages or size is None:
            continue
        shape, _ = _subview(view, dim)
        elements = 1
        for n in shape:
            elements *= n
        c.cmp("page_bytes", f"{name}: bytes per logical block", pages[name][0], layer.ratio * elements * size)


def _check_overlap(c: Collector, observation: Any, layers: Mapping[str, _Layer], blocks: Mapping[str, int]) -> None:
    storage_of = getattr(observation, "storage_of", None)
    if not storage_of:
        return
    intervals: list[tuple[int, int, str, int]] = []
    budget = MAX_INTERVALS
    for name, dim in blocks.items():
        view, layer = observation.registered[name], layers[name]
        size = _itemsize(view.dtype)
        if size is None or name not in storage_of:
            continue
        shape, stride = _subview(view, dim)
        runs = _runs(shape, stride, budget)
        if runs is None or len(runs) * layer.kernel_blocks > budget:
            return  # too irregular to lay out in bounded memory: not checked
        budget -= len(runs) * layer.kernel_blocks
        base = storage_of[name] << 60  # keep storages apart on one axis
        for j in range(layer.kernel_blocks):
            first = view.storage_offset + j * view.stride[dim]
            logical = j // layer.ratio
            for start, end in runs:
                intervals.append((base + (first + start) * size, base + (first + end) * size, name, logical))
    intervals.sort()
    reported: set[tuple[str, str]] = set()
    reach: tuple[int, str, int] | None = None  # the interval reaching furthest so far
    for start, end, name, logical in intervals:
        if reach is not None and start < reach[0]:
            _, other, other_block = reach
            if not _shared_by_design(layers, name, logical, other, other_block):
                pair = tuple(sorted((f"{name}[{logical}]", f"{other}[{other_block}]")))
                if pair not in reported and len(reported) < 8:
                    reported.add(pair)  # type: ignore[arg-type]
                    c.cmp("block_overlap", f"{pair[0]} and {pair[1]}", "no shared byte", f"share bytes from {start & ((1 << 60) - 1)}")
        if reach is None or end > reach[0]:
            reach = (end, name, logical)


def _shared_by_design(layers: Mapping[str, _Layer], a: str, block_a: int, b: str, block_b: int) -> bool:
    """Hybrid groups overlay one another's pages: the same block id of layers in different groups."""
    return layers[a].group != layers[b].group and block_a == block_b


def _check_allocations(c: Collector, observation: Any, layers: Mapping[str, _Layer]) -> None:
    storage_of = getattr(observation, "storage_of", None)
    pages = getattr(observation, "page_bytes", None)
    if not storage_of or not pages or observation.num_blocks is None:
        return
    alignments = getattr(observation, "stride_alignments", None) or {}
    layout = getattr(observation, "layout", None) or ""
    block_outermost = layout.startswith("B")  # BLNHC, BLHNC: a block holds every layer's page of that block id
    per_storage: dict[int, dict[int, int]] = {}
    storage_alignment: dict[int, int] = {}
    sizes: dict[int, int] = {}
    for name, number in storage_of.items():
        layer = layers.get(name)
        if layer is None or name not in pages:
            return  # a layer outside every group: nothing to hold the allocation to
        align = alignments.get(name, 1) or 1
        page = pages[name][1] if block_outermost else _round_up(pages[name][1], align)
        groups = per_storage.setdefault(number, {})
        groups[layer.group] = groups.get(layer.group, 0) + page
        storage_alignment[number] = math.lcm(storage_alignment.get(number, 1), align)
        sizes[number] = observation.registered[name].storage_nbytes
    for number, groups in sorted(per_storage.items()):
        names = sorted(n for n, s in storage_of.items() if s == number)
        block = max(groups.values())
        if block_outermost:
            block = _round_up(block, storage_alignment[number])
        expected = observation.num_blocks * block
        c.cmp("allocation_size", f"allocation of {names[0]}{' +' if len(names) > 1 else ''}: bytes", expected, sizes[number])


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _check_bound(c: Collector, observation: Any) -> None:
    outside = tuple(getattr(observation, "bound_outside_registered", ()) or ())
    c.cmp("bound_storage", "layers bound outside their registered storage", (), outside)
    bound = getattr(observation, "bound_views", None) or {}
    for name, views in sorted(bound.items()):
        reg = observation.registered.get(name)
        size = None if reg is None else _itemsize(reg.dtype)
        if reg is None or size is None:
            continue
        lo, hi = reg.storage_offset * size, (reg.storage_offset + _extent(reg.shape, reg.stride)) * size
        for k, view in enumerate(views):
            vsize = _itemsize(view.dtype)
            if vsize is None:
                continue
            if tuple(view.shape) == tuple(reg.shape):
                c.cmp("bound_view", f"{name}: bound cache {k} (stride, offset, dtype)",
                      (tuple(reg.stride), reg.storage_offset, reg.dtype), (tuple(view.stride), view.storage_offset, view.dtype))
                continue
            v_lo = view.storage_offset * vsize
            v_hi = (view.storage_offset + _extent(view.shape, view.stride)) * vsize
            if v_lo < lo or v_hi > hi:
                c.cmp("bound_view", f"{name}: bound cache {k} bytes", f"within [{lo}, {hi})", f"[{v_lo}, {v_hi})")


PAD_SLOT = -1
"""The slot of a token no rank of this runner stores (vLLM's ``PAD_SLOT_ID``)."""
MAX_REPORTED_PER_SCHEDULE = 6
"""Divergences reported per schedule at most: one wrong id repeats in every later step."""


def _expand(ids: Sequence[int], ratio: int) -> list[int]:
    return [b * ratio + i for b in ids for i in range(ratio)]


def _own_slot(ids: Sequence[int], position: int, block: int, dcp: Sequence[int], ids_per_block: int = 1) -> int | None:
    """The slot of the token at ``position`` by the rows' own ids: ``None`` when the row holds
    no block for it. DCP ``(world, rank, interleave)``: tokens go round the ranks in runs of
    ``interleave`` within a virtual block of ``block * world`` tokens
    (vllm/v1/worker/block_table.py: BlockTable.compute_slot_mapping). A row that stores
    ``ids_per_block`` ids per block (its kernel blocks, vLLM before 0.32) holds the token's
    local offset ``o`` in id ``o // (block / ids_per_block)`` of its block's run."""
    world, rank, interleave = (list(dcp) + [1, 0, 1])[:3] if dcp else (1, 0, 1)
    world, interleave = max(1, int(world)), max(1, int(interleave))
    column, offset = divmod(position, block * world)
    if (offset // interleave) % world != rank:
        return PAD_SLOT
    local = (offset // (world * interleave)) * interleave + offset % interleave
    unit = block // ids_per_block
    column = column * ids_per_block + local // unit
    if column >= len(ids):
        return None
    return ids[column] * unit + local % unit


def judge_schedules(c: Collector, scenarios: Sequence[Mapping[str, Any]], observation: Any) -> None:
    """The schedules' tables and slots against the runner's own rows, step by step."""
    observed = tuple(getattr(observation, "schedules", ()) or ())
    groups = observation.groups
    sizes = observation.kernel_block_sizes or ()  # the groups' views' kernel split
    for scenario, got in zip(scenarios, observed):
        if "steps" not in got or got.get("error"):
            continue
        before = len(c.out)
        kinds = [g.get("kind", "attention") for g in scenario.get("groups", ())]
        # What a row stores per block id, as the runner's own tables say (kernel ids before 0.32).
        per_block = list(got.get("ids_per_block") or ())
        per_block += [1] * (len(groups) - len(per_block))
        dcp = scenario.get("dcp") or (1, 0, 1)
        world = max(1, int(dcp[0])) if dcp else 1
        for k, (step, seen) in enumerate(zip(scenario["steps"], got["steps"])):
            if len(c.out) - before >= MAX_REPORTED_PER_SCHEDULE:
                break
            where = f"schedule {scenario['name']} step {k}"
            blocks = seen.get("blocks") or {}
            for entry in seen.get("kernel_tables", ()):
                g = entry["group"]
                kernel = sizes[g] if g < len(sizes) else None
                if g >= len(groups) or not kernel or groups[g].block_size % kernel:
                    continue
                if (groups[g].block_size // kernel) % per_block[g]:
                    continue
                # Rows of kernel ids are handed to attention as they are (a ratio of 1).
                ratio = groups[g].block_size // kernel // per_block[g]
                span = groups[g].block_size * world // per_block[g]
                # Attention reads row i for the i-th request of the batch (MRv1: its persistent
                # rows, in batch order; MRv2: the rows it gathers for the batch).
                for row, (req, positions) in enumerate(step["batch"]):
                    ids = blocks.get(req)
                    if ids is None or g >= len(ids) or row >= len(entry["rows"]) or not positions:
                        continue
                    got = list(entry["rows"][row][: len(ids[g]) * ratio])
                    first_written = min(positions) // span
                    wrong = [j for j, b in enumerate(ids[g])
                             if got[j * ratio:(j + 1) * ratio] != _expand([b], ratio)
                             # A block wholly before the step's tokens may be the null block: the
                             # kernels never read it (a sliding window's reach).
                             and not (j < first_written and got[j * ratio:(j + 1) * ratio] == _expand([0], ratio))]
                    if wrong:
                        c.cmp("kernel_table",
                              f"{where} kernel_tables[g={g}, {entry['layers'][0]}] row {row} (request {req}) column {wrong[0]}",
                              _expand([ids[g][wrong[0]]], ratio), got[wrong[0] * ratio:(wrong[0] + 1) * ratio])
            for g, slots in enumerate(seen.get("slot_mappings", ())):
                if g >= len(groups) or g >= len(kinds) or kinds[g] != "attention":
                    continue
                t = 0
                for req, positions in step["batch"]:
                    ids = (blocks.get(req) or [None] * (g + 1))[g] if g < len(blocks.get(req) or ()) else None
                    for p in positions:
                        if ids is None or t >= len(slots):
                            break
                        want = _own_slot(ids, p, groups[g].block_size, dcp, per_block[g])
                        if want is None:
                            c.cmp("slot_address", f"{where} slot_mappings[g={g}] token {t} (request {req}, position {p})",
                                  "a block of the request's row", "no block in the row")
                        elif slots[t] != want:
                            c.cmp("slot_address", f"{where} slot_mappings[g={g}] token {t} (request {req}, position {p})",
                                  want, slots[t])
                        t += 1
            _check_cross_slots(c, where, scenario, step, seen, groups, per_block)
            _check_draft_slots(c, where, scenario, step, seen, groups, dcp, per_block)


def _check_cross_slots(c: Collector, where: str, scenario: Mapping[str, Any], step: Mapping[str, Any],
                       seen: Mapping[str, Any], groups: Sequence[Any], per_block: Sequence[int]) -> None:
    """A cross-attention builder's slots: at a request's first step (no computed tokens) each of
    its encoder tokens ``i`` goes to its own cross-attention blocks at offset ``i``, requests in
    batch order; no other request writes any. Neither the decoder's positions nor DCP play a part."""
    lens = scenario.get("encoder_lens") or {}
    blocks = seen.get("blocks") or {}
    for entry in seen.get("cross_slot_mappings", ()):
        g, slots = entry["group"], list(entry["slot_mapping"])
        if g >= len(groups):
            continue
        label = f"{where} cross_slot_mapping[g={g}, {entry['layers'][0]}]"
        t = 0
        for req, positions in step["batch"]:
            if not positions or positions[0] != 0 or req not in lens:
                continue
            ids = (blocks.get(req) or [])[g] if g < len(blocks.get(req) or ()) else None
            for i in range(lens[req]):
                want = None if ids is None else _own_slot(ids, i, groups[g].block_size, (1, 0, 1), per_block[g])
                if t >= len(slots):
                    break
                if want is None:
                    c.cmp("slot_address", f"{label} token {t} (request {req}, encoder token {i})",
                          "a block of the request's row", "no block in the row")
                    return
                if slots[t] != want:
                    c.cmp("slot_address", f"{label} token {t} (request {req}, encoder token {i})", want, slots[t])
                    return
                t += 1
        if t != len(slots):
            c.cmp("slot_address", f"{label} encoder tokens written", t, len(slots))


def _check_draft_slots(c: Collector, where: str, scenario: Mapping[str, Any], step: Mapping[str, Any],
                       seen: Mapping[str, Any], groups: Sequence[Any], dcp: Sequence[int],
                       per_block: Sequence[int] = ()) -> None:
    """A draft step's token ``k`` of a request sits at its last position + ``k``: its slot
    is that token's own (DCP: the rank's own, or PAD on another rank's), where the row
    holds a block for it (the scheduler allocates lookahead blocks before a draft step;
    a row without one is the schedule's, not vLLM's). Past ``max_model_len`` there is no
    such token: the slot is PAD or one of the request's own (MRv2 re-writes its last)."""
    draft = scenario.get("draft")
    if not draft:
        return
    limit = int(draft["max_model_len"])
    blocks = seen.get("blocks") or {}
    for k, drafted in enumerate(seen.get("draft_steps") or (), start=1):
        g = drafted.get("group")
        slots = drafted.get("slot_mapping")
        if slots is None or not isinstance(g, int) or g >= len(groups):
            continue
        block = groups[g].block_size
        ids_per_block = per_block[g] if g < len(per_block) else 1
        for i, (req, positions) in enumerate(step["batch"]):
            rows = blocks.get(req) or ()
            if i >= len(slots) or g >= len(rows) or not positions:
                continue
            ids, p = rows[g], positions[-1] + k
            label = f"{where} draft step {k} slot_mapping[g={g}] request {req} (position {p})"
            if p >= limit:
                if slots[i] != PAD_SLOT and slots[i] // (block // ids_per_block) not in ids:
                    c.cmp("slot_address", label, f"PAD or a slot of the request's own blocks (past max_model_len {limit})",
                          slots[i])
                continue
            want = _own_slot(ids, p, block, dcp, ids_per_block)
            if want is not None and slots[i] != want:
                c.cmp("slot_address", label, want, slots[i])


def contract_divergences(case: Any, runner: str, observation: Any, scenarios: Sequence[Mapping[str, Any]] = ()) -> list:
    """The contract's divergences of one observation (each with ``basis="contract"``);
    ``scenarios``: the request schedules it ran (their tokens and positions: the inputs)."""
    c = Collector(case.name if hasattr(case, "name") else str(case), runner, basis="contract")
    if getattr(observation, "unsupported", None) or getattr(observation, "error", None):
        return []
    observed = _Observed(observation)
    judge_contract(c, case, observed)
    if scenarios:
        judge_schedules(c, scenarios, observed)
    return c.out


class _Observed:
    """An observation whose fields a driver did not report read as None (not observed):
    an engine's recording, a generation-1 driver or a stand-in reports fewer fields, and
    the contract checks what is there."""

    def __init__(self, observation: Any) -> None:
        self._observation = observation

    # Collections a driver did not report read as empty, so that a check iterates nothing.
    EMPTY = {"registered": {}, "groups": (), "tensors": ()}

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._observation, name, None)
        return self.EMPTY.get(name) if value is None and name in self.EMPTY else value


__all__ = ["CONTRACT_KINDS", "ITEMSIZE", "KINDS", "SCHEDULE_KINDS", "contract_divergences", "judge_contract", "judge_schedules"]
