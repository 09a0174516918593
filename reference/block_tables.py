"""Block tables and slot mappings of vLLM 0.33.0's two GPU model runners.

Mirrors ``vllm/v1/worker/block_table.py`` (MRv1: ``get_block_table_width``,
``BlockTable``, ``MultiGroupBlockTable``, ``ComputeSlotMappingKernel``),
``vllm/v1/worker/gpu/block_table.py`` (MRv2: ``BlockTables`` and its Triton kernels) and
``vllm/v1/worker/utils.py::AttentionGroup.map_to_kernel_block_table``.

Both runners store **manager (logical) block ids** and compute slots with the manager
block size ``B``; the only expansion to kernel block ids happens when attention metadata
is built (``expand_row`` / ``map_to_kernel_block_table`` here). Lists of ints stand in for
vLLM's int32/int64 buffers so a case can be diffed against either runner without torch.

What is deliberately simplified (none of it is observable by a correct runner):
- device/host copies (``commit_block_table``, ``apply_staged_writes``, UVA) are immediate;
- on overflow vLLM fails mid-update (MRv1 numpy ``ValueError``, MRv2 ``RuntimeError``,
  D20); here a ``ConfigError`` is raised before anything is modified;
- inputs vLLM would read out of bounds (garbage) raise ``ConfigError`` instead.
"""

from __future__ import annotations

import enum
import math
import operator
from dataclasses import dataclass, field
from typing import Hashable, Iterable, Mapping, Sequence, Union

from reference.errors import ConfigError
from reference.kernel_blocks import expand_block_id

__all__ = [
    "PAD_SLOT_ID",
    "NULL_BLOCK_ID",
    "DEFAULT_TOKEN_ALIGNMENT",
    "SlotMappingMode",
    "get_block_table_width",
    "MRv1BlockTable",
    "MRv1MultiGroupBlockTable",
    "MRv2BlockTables",
    "slot_mapping_mrv1",
    "slot_mappings_mrv2",
    "expand_row",
    "map_to_kernel_block_table",
    "kernel_slot",
    "check_slot_invariant",
    "DraftStep",
    "draft_step_mrv1",
    "draft_step_mrv2",
    "Add",
    "Append",
    "Remove",
    "Preempt",
    "Move",
    "Swap",
    "Op",
    "Schedule",
    "ScheduleResult",
    "MRv1ScheduleState",
    "MRv2ScheduleState",
    "run_schedule_mrv1",
    "run_schedule_mrv2",
]

PAD_SLOT_ID = -1
"""``vllm/v1/attention/backends/utils.py::PAD_SLOT_ID``: the KV write kernels skip it."""
NULL_BLOCK_ID = 0
"""``vllm/v1/attention/backends/utils.py::NULL_BLOCK_ID``: the block manager's null block."""
DEFAULT_TOKEN_ALIGNMENT = 128
"""``KVCacheSpec.block_table_token_alignment`` for attention specs."""


# --------------------------------------------------------------------------- helpers


def _int(value: object, what: str, *, minimum: int | None = None, maximum: int | None = None) -> int:
    # operator.index accepts any integral type (e.g. a caller's numpy int) but not floats.
    if isinstance(value, bool):
        raise ConfigError(f"{what} {value!r} is a bool; expected an integer")
    try:
        v = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ConfigError(f"{what} {value!r} is not an integer; expected an integer") from None
    if minimum is not None and v < minimum:
        raise ConfigError(f"{what} {v} is below {minimum}; expected an integer >= {minimum}")
    if maximum is not None and v > maximum:
        raise ConfigError(f"{what} {v} is above {maximum}; expected an integer <= {maximum}")
    return v


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _block_ids(ids: Iterable[object], what: str) -> list[int]:
    if isinstance(ids, (str, bytes)):
        raise ConfigError(f"{what} {ids!r} is a string; expected a list of block ids")
    try:
        items = list(ids)
    except TypeError:
        raise ConfigError(f"{what} {ids!r} is not a sequence; expected a list of block ids") from None
    # Block ids index the KV pool, so they are never negative (0 is the null block).
    return [_int(b, f"block id in {what}", minimum=0) for b in items]


def _per_group(values: Sequence[object] | None, num_groups: int, what: str, default: object) -> list:
    if values is None:
        return [default] * num_groups
    values = list(values)
    if len(values) != num_groups:
        raise ConfigError(f"{what} has {len(values)} entries; expected one per group ({num_groups})")
    return values


def _query_start_loc(query_start_loc: Sequence[object]) -> list[int]:
    qsl = [_int(q, "query_start_loc entry", minimum=0) for q in query_start_loc]
    if not qsl:
        raise ConfigError("query_start_loc is empty; expected num_reqs + 1 entries starting at 0")
    if qsl[0] != 0:
        raise ConfigError(f"query_start_loc starts at {qsl[0]}; expected 0")
    for i in range(1, len(qsl)):
        if qsl[i] < qsl[i - 1]:
            raise ConfigError(
                f"query_start_loc {qsl} decreases at index {i} ({qsl[i - 1]} -> {qsl[i]}); "
                "expected a non-decreasing cumulative token count"
            )
    return qsl


def _dcp(world_size: object, rank: object, interleave: object, block_size: int | None) -> tuple[int, int, int]:
    w = _int(world_size, "DCP world size", minimum=1)
    r = _int(rank, "DCP rank", minimum=0, maximum=w - 1)
    i = _int(interleave, "cp_kv_cache_interleave_size", minimum=1)
    # vLLM's config requires block_size % interleave == 0 under context parallelism; without
    # it the local offset can reach B and a slot would spill into the next block. Groups
    # that never shard by DCP pass block_size=None.
    if w > 1 and block_size is not None and block_size % i != 0:
        raise ConfigError(
            f"cp_kv_cache_interleave_size {i} does not divide block size {block_size}; "
            "expected a divisor of the block size when DCP is on"
        )
    return w, r, i


# --------------------------------------------------------------------------- widths


def get_block_table_width(max_num_blocks: int, block_size: int, token_alignment: int | None = DEFAULT_TOKEN_ALIGNMENT) -> int:
    """Row length of a block table (``vllm/v1/worker/block_table.py::get_block_table_width``).

    Rounds ``max_num_blocks`` up so a row spans a multiple of ``token_alignment`` tokens;
    ``None`` (Mamba, circular-buffer and HiSparse specs) leaves it unaligned.
    """
    n = _int(max_num_blocks, "max_num_blocks", minimum=0)
    b = _int(block_size, "block size", minimum=1)
    if token_alignment is None:
        return n
    a = _int(token_alignment, "token_alignment", minimum=1)
    block_alignment = a // math.gcd(a, b)
    return _cdiv(n, block_alignment) * block_alignment


class SlotMappingMode(str, enum.Enum):
    """MRv1 ``SlotMappingMode`` (``vllm/v1/worker/block_table.py``): ``NONE`` iff Mamba."""

    TOKEN_TO_KV_SLOT = "token"
    NONE = "none"


def _mode(mode: object) -> SlotMappingMode:
    try:
        return SlotMappingMode(mode)
    except ValueError:
        raise ConfigError(f"slot mapping mode {mode!r} is unknown; expected 'token' or 'none'") from None


# --------------------------------------------------------------------------- slot mappings


def slot_mapping_mrv1(
    block_rows: Sequence[Sequence[int]],
    block_size: int,
    query_start_loc: Sequence[int],
    positions: Sequence[int],
    max_num_batched_tokens: int,
    dcp_world_size: int = 1,
    dcp_rank: int = 0,
    interleave: int = 1,
    mode: SlotMappingMode | str = SlotMappingMode.TOKEN_TO_KV_SLOT,
) -> list[int] | None:
    """MRv1 slot mapping of one group (``BlockTable.compute_slot_mapping`` + its Triton kernel).

    ``block_rows[i]`` is the full row of batch position ``i``. Returns the whole
    ``max_num_batched_tokens`` buffer: real tokens get ``bt[req, vbi]*B + loff`` (or PAD on a
    non-local DCP rank) and ``[num_tokens, max_num_batched_tokens)`` is PAD.

    ``mode="none"`` (Mamba groups) returns ``None``: vLLM returns before launching the
    kernel, so the buffer keeps whatever it held (see ``MRv1BlockTable.compute_slot_mapping``).
    """
    if _mode(mode) is SlotMappingMode.NONE:
        return None
    B = _int(block_size, "block size", minimum=1)
    W, r, I = _dcp(dcp_world_size, dcp_rank, interleave, B)
    qsl = _query_start_loc(query_start_loc)
    pos = [_int(p, "position", minimum=0) for p in positions]
    cap = _int(max_num_batched_tokens, "max_num_batched_tokens", minimum=0)
    num_reqs, num_tokens = len(qsl) - 1, len(pos)
    if qsl[-1] != num_tokens:
        # The kernel only pads from positions.shape[0]; a mismatch leaves tokens unwritten.
        raise ConfigError(
            f"query_start_loc ends at {qsl[-1]} but there are {num_tokens} positions; expected them equal"
        )
    if num_tokens > cap:
        raise ConfigError(f"{num_tokens} tokens exceed max_num_batched_tokens {cap}; expected at most {cap}")
    if len(block_rows) < num_reqs:
        raise ConfigError(f"{len(block_rows)} block table rows for {num_reqs} requests; expected one row per request")

    out = [PAD_SLOT_ID] * cap
    vbs = B * W  # a "virtual block" spans the B local tokens of every DCP rank
    for req in range(num_reqs):
        row = block_rows[req]
        for t in range(qsl[req], qsl[req + 1]):
            vbi, vbo = divmod(pos[t], vbs)
            if (vbo // I) % W != r:
                continue  # another DCP rank stores this token
            if vbi >= len(row):
                raise ConfigError(
                    f"position {pos[t]} of request {req} needs block column {vbi} but the row has "
                    f"{len(row)} columns; expected position < {len(row) * vbs}"
                )
            loff = (vbo // (W * I)) * I + vbo % I
            out[t] = _int(row[vbi], "block id", minimum=0) * B + loff
    return out


def slot_mappings_mrv2(
    block_tables: Sequence[Sequence[Sequence[int]]],
    block_sizes: Sequence[int],
    idx_mapping: Sequence[int],
    query_start_loc: Sequence[int],
    positions: Sequence[int],
    num_tokens_padded: int,
    max_num_batched_tokens: int,
    *,
    cp_size: int = 1,
    cp_rank: int = 0,
    cp_interleave: int = 1,
    slot_mapping_enabled: Sequence[bool] | None = None,
    dcp_sharded: Sequence[bool] | None = None,
) -> list[list[int]]:
    """MRv2 slot mappings, one list per group (``BlockTables.compute_slot_mappings``).

    ``block_tables[g][slot]`` is the persistent row of request-state slot ``slot``;
    ``idx_mapping[i]`` maps batch request ``i`` to its slot, ``-1`` for a dummy request
    (its tokens are PAD). Groups with ``slot_mapping_enabled`` False (circular-buffer,
    HiSparse) are all PAD (D4); groups with ``dcp_sharded`` False use the global position
    even under DCP. PAD starts at ``query_start_loc[num_reqs]``, the actual token count.
    Returns ``[g][:num_tokens_padded]``.
    """
    G = len(block_sizes)
    sizes = [_int(b, "block size", minimum=1) for b in block_sizes]
    if len(block_tables) != G:
        raise ConfigError(f"{len(block_tables)} block tables for {G} block sizes; expected one per group")
    enabled = [bool(e) for e in _per_group(slot_mapping_enabled, G, "slot_mapping_enabled", True)]
    sharded = [bool(s) for s in _per_group(dcp_sharded, G, "dcp_sharded", True)]
    W = _int(cp_size, "DCP world size", minimum=1)
    qsl = _query_start_loc(query_start_loc)
    num_reqs = len(qsl) - 1
    idx = [_int(i, "idx_mapping entry", minimum=-1) for i in idx_mapping]
    if len(idx) != num_reqs:
        raise ConfigError(
            f"idx_mapping has {len(idx)} entries but query_start_loc describes {num_reqs} requests; expected equal"
        )
    pos = [_int(p, "position", minimum=0) for p in positions]
    if len(pos) < qsl[-1]:
        raise ConfigError(f"{len(pos)} positions for {qsl[-1]} scheduled tokens; expected at least {qsl[-1]}")
    cap = _int(max_num_batched_tokens, "max_num_batched_tokens", minimum=0)
    padded = _int(num_tokens_padded, "num_tokens_padded", minimum=qsl[-1], maximum=cap)

    out: list[list[int]] = []
    for g in range(G):
        B, rows = sizes[g], block_tables[g]
        _, r, I = _dcp(W, cp_rank, cp_interleave, B if (sharded[g] and enabled[g]) else None)
        for req in idx:
            if req >= len(rows):
                raise ConfigError(
                    f"idx_mapping entry {req} is not a request-state slot of group {g}; "
                    f"expected -1 or a slot below {len(rows)}"
                )
        buf = [PAD_SLOT_ID] * cap
        for i, req in enumerate(idx):
            if req < 0 or not enabled[g]:
                continue  # the kernel masks the load and writes PAD
            row = rows[req]
            for t in range(qsl[i], qsl[i + 1]):
                p = pos[t]
                if W == 1 or not sharded[g]:
                    lp = p
                else:
                    vbi, vbo = divmod(p, B * W)
                    if (vbo // I) % W != r:
                        continue
                    lp = vbi * B + (vbo // (I * W)) * I + vbo % I
                bi = lp // B
                if bi >= len(row):
                    raise ConfigError(
                        f"position {p} of request slot {req} needs block column {bi} of group {g} but the "
                        f"row has {len(row)} columns; expected a position inside the row"
                    )
                buf[t] = _int(row[bi], "block id", minimum=0) * B + lp % B
        out.append(buf[:padded])
    return out


# --------------------------------------------------------------------------- MRv1


class MRv1BlockTable:
    """One group's MRv1 block table (``vllm/v1/worker/block_table.py::BlockTable``).

    Row ``i`` is batch position ``i``; rows start zeroed with count 0. ``width`` is the
    row length as given (only ``MRv1MultiGroupBlockTable`` aligns it). ``slot_mapping``
    is the persistent per-group buffer the runner slices each step.
    """

    def __init__(
        self,
        block_size: int,
        max_num_reqs: int,
        width: int,
        max_num_batched_tokens: int,
        *,
        slot_mapping_mode: SlotMappingMode | str = SlotMappingMode.TOKEN_TO_KV_SLOT,
        dcp_world_size: int = 1,
        dcp_rank: int = 0,
        cp_kv_cache_interleave_size: int = 1,
        group: int = 0,
    ) -> None:
        self.block_size = _int(block_size, "block size", minimum=1)
        self.max_num_reqs = _int(max_num_reqs, "max_num_reqs", minimum=1)
        self.width = _int(width, "block table width", minimum=0)
        self.max_num_batched_tokens = _int(max_num_batched_tokens, "max_num_batched_tokens", minimum=0)
        self.slot_mapping_mode = _mode(slot_mapping_mode)
        self.dcp_world_size, self.dcp_rank, self.cp_kv_cache_interleave_size = _dcp(
            dcp_world_size, dcp_rank, cp_kv_cache_interleave_size,
            self.block_size if self.slot_mapping_mode is SlotMappingMode.TOKEN_TO_KV_SLOT else None,
        )
        self.group = group
        self._rows = [[0] * self.width for _ in range(self.max_num_reqs)]
        self._counts = [0] * self.max_num_reqs
        self._slot_mapping = [0] * self.max_num_batched_tokens  # torch.zeros in vLLM

    def __repr__(self) -> str:
        return (
            f"MRv1BlockTable(group={self.group}, block_size={self.block_size}, "
            f"max_num_reqs={self.max_num_reqs}, width={self.width}, mode={self.slot_mapping_mode.value})"
        )

    def _row_index(self, row: object, what: str = "row") -> int:
        return _int(row, f"{what} index", minimum=0, maximum=self.max_num_reqs - 1)

    def _check_fits(self, n: int, k: int, row: int) -> None:
        if n + k > self.width:
            if n == 0:
                raise ConfigError(
                    f"block id row of {k} blocks exceeds the table width {self.width} for group {self.group}"
                )
            raise ConfigError(
                f"appending {k} block ids to row {row} holding {n} needs {n + k} columns, exceeding the "
                f"table width {self.width} for group {self.group}; expected at most {self.width - n} more"
            )

    # --- row operations (numpy-only in vLLM) ---------------------------------------
    def append_row(self, block_ids: Sequence[int], row_idx: int) -> None:
        """``BlockTable.append_row``: write after the row's current count."""
        ids = _block_ids(block_ids, f"row {row_idx} of group {self.group}")
        r = self._row_index(row_idx)
        if not ids:
            return
        n = self._counts[r]
        self._check_fits(n, len(ids), r)
        self._rows[r][n : n + len(ids)] = ids
        self._counts[r] = n + len(ids)

    def add_row(self, block_ids: Sequence[int], row_idx: int) -> None:
        """``BlockTable.add_row``: count = 0, then append. The tail is NOT zeroed."""
        ids = _block_ids(block_ids, f"row {row_idx} of group {self.group}")
        r = self._row_index(row_idx)
        self._check_fits(0, len(ids), r)
        self._counts[r] = 0
        self.append_row(ids, r)

    def clear_row(self, row_idx: int) -> None:
        """``BlockTable.clear_row``: zero ``[:n]``, count = 0."""
        r = self._row_index(row_idx)
        n = self._counts[r]
        self._rows[r][:n] = [0] * n
        self._counts[r] = 0

    def move_row(self, src: int, tgt: int) -> None:
        """``BlockTable.move_row``: copy ``[:n_src]`` to ``tgt`` then zero the source.

        The target's tail beyond ``n_src`` is untouched. As in vLLM, ``src == tgt`` wipes
        the row (the zeroing runs after the copy); ``InputBatch.condense`` never does that.
        """
        s, t = self._row_index(src, "source row"), self._row_index(tgt, "target row")
        n = self._counts[s]
        self._rows[t][:n] = self._rows[s][:n]
        self._counts[t] = n
        self._rows[s][:n] = [0] * n
        self._counts[s] = 0

    def swap_row(self, a: int, b: int) -> None:
        """``BlockTable.swap_row``: swap the whole rows and their counts."""
        i, j = self._row_index(a), self._row_index(b)
        self._rows[i], self._rows[j] = self._rows[j], self._rows[i]
        self._counts[i], self._counts[j] = self._counts[j], self._counts[i]

    def clear(self) -> None:
        """``BlockTable.clear``: zero-fill every row; counts are left as they are."""
        for row in self._rows:
            row[:] = [0] * self.width

    # --- views -----------------------------------------------------------------------
    def row(self, i: int) -> list[int]:
        """The full row ``i`` (``get_numpy_array()[i]``)."""
        return list(self._rows[self._row_index(i)])

    def valid(self, i: int) -> list[int]:
        """``row(i)[:num_blocks(i)]``: the part both runners agree on."""
        r = self._row_index(i)
        return self._rows[r][: self._counts[r]]

    def num_blocks(self, i: int) -> int:
        """``num_blocks_per_row[i]``."""
        return self._counts[self._row_index(i)]

    def batch_rows(self, num_reqs: int, num_reqs_padded: int) -> list[list[int]]:
        """The table handed to attention (``gpu_model_runner.py::_build_attention_metadata``).

        ``get_device_tensor(num_reqs_padded)`` after ``commit_block_table(num_reqs)``, with
        rows ``[num_reqs:num_reqs_padded]`` set to ``NULL_BLOCK_ID`` (D9).
        """
        n = _int(num_reqs, "num_reqs", minimum=0, maximum=self.max_num_reqs)
        p = _int(num_reqs_padded, "num_reqs_padded", minimum=n, maximum=self.max_num_reqs)
        return [list(self._rows[i]) for i in range(n)] + [[NULL_BLOCK_ID] * self.width for _ in range(p - n)]

    # --- slot mapping ----------------------------------------------------------------
    @property
    def slot_mapping(self) -> list[int]:
        """A copy of the persistent ``slot_mapping`` buffer (``max_num_batched_tokens`` long)."""
        return list(self._slot_mapping)

    def compute_slot_mapping(self, num_reqs: int, query_start_loc: Sequence[int], positions: Sequence[int]) -> None:
        """``BlockTable.compute_slot_mapping`` for batch rows ``[:num_reqs]``.

        In ``NONE`` mode (Mamba) the buffer is not written at all, so real tokens keep the
        initial 0 or a PAD left by an earlier step's padding fill (D3).
        """
        if self.slot_mapping_mode is SlotMappingMode.NONE:
            return
        n = _int(num_reqs, "num_reqs", minimum=0, maximum=self.max_num_reqs)
        if len(query_start_loc) != n + 1:
            raise ConfigError(
                f"query_start_loc has {len(query_start_loc)} entries for {n} requests; expected {n + 1}"
            )
        result = slot_mapping_mrv1(
            self._rows[:n], self.block_size, query_start_loc, positions, self.max_num_batched_tokens,
            self.dcp_world_size, self.dcp_rank, self.cp_kv_cache_interleave_size, self.slot_mapping_mode,
        )
        assert result is not None
        self._slot_mapping = result

    def get_slot_mapping(self, num_tokens: int, num_tokens_padded: int) -> list[int]:
        """The runner's per-group slice (``gpu_model_runner.py::_get_slot_mappings``).

        Fills ``[num_tokens:num_tokens_padded]`` of the buffer itself with PAD (that write
        persists, which is what a later Mamba step reads) and returns ``[:num_tokens_padded]``.
        """
        n = _int(num_tokens, "num_tokens", minimum=0, maximum=self.max_num_batched_tokens)
        p = _int(num_tokens_padded, "num_tokens_padded", minimum=n, maximum=self.max_num_batched_tokens)
        self._slot_mapping[n:p] = [PAD_SLOT_ID] * (p - n)
        return self._slot_mapping[:p]


class MRv1MultiGroupBlockTable:
    """MRv1 ``MultiGroupBlockTable`` (``vllm/v1/worker/block_table.py``): one table per group.

    Widths are ``get_block_table_width(max_num_blocks[g], B_g, 128)`` for token groups and
    unaligned for ``"none"`` (Mamba) groups. Row operations are forwarded to every group.
    """

    def __init__(
        self,
        max_num_reqs: int,
        max_num_batched_tokens: int,
        block_sizes: Sequence[int],
        max_num_blocks: Sequence[int],
        cp_kv_cache_interleave_size: int = 1,
        slot_mapping_modes: Sequence[SlotMappingMode | str] | None = None,
        *,
        dcp_world_size: int = 1,
        dcp_rank: int = 0,
    ) -> None:
        if len(block_sizes) != len(max_num_blocks):
            raise ConfigError(
                f"{len(block_sizes)} block sizes but {len(max_num_blocks)} max_num_blocks; expected one per group"
            )
        modes = [_mode(m) for m in _per_group(slot_mapping_modes, len(block_sizes), "slot_mapping_modes",
                                              SlotMappingMode.TOKEN_TO_KV_SLOT)]
        tables = []
        for g, (b, m, mode) in enumerate(zip(block_sizes, max_num_blocks, modes)):
            align = DEFAULT_TOKEN_ALIGNMENT if mode is SlotMappingMode.TOKEN_TO_KV_SLOT else None
            tables.append(MRv1BlockTable(
                b, max_num_reqs, get_block_table_width(m, b, align), max_num_batched_tokens,
                slot_mapping_mode=mode, dcp_world_size=dcp_world_size, dcp_rank=dcp_rank,
                cp_kv_cache_interleave_size=cp_kv_cache_interleave_size, group=g,
            ))
        self.tables: tuple[MRv1BlockTable, ...] = tuple(tables)
        self.max_num_reqs = _int(max_num_reqs, "max_num_reqs", minimum=1)

    def __len__(self) -> int:
        return len(self.tables)

    def __getitem__(self, group: int) -> MRv1BlockTable:
        return self.tables[group]

    @property
    def num_groups(self) -> int:
        return len(self.tables)

    @property
    def block_sizes(self) -> list[int]:
        return [t.block_size for t in self.tables]

    @property
    def widths(self) -> list[int]:
        return [t.width for t in self.tables]

    @property
    def slot_mapping_modes(self) -> list[SlotMappingMode]:
        return [t.slot_mapping_mode for t in self.tables]

    def _split(self, block_ids: Sequence[Sequence[int]], row_idx: int) -> list[list[int]]:
        if len(block_ids) != self.num_groups:
            raise ConfigError(
                f"block ids for {len(block_ids)} groups at row {row_idx}; expected {self.num_groups} groups"
            )
        return [_block_ids(ids, f"row {row_idx} of group {g}") for g, ids in enumerate(block_ids)]

    def append_row(self, block_ids: Sequence[Sequence[int]], row_idx: int) -> None:
        """``MultiGroupBlockTable.append_row``: ``block_ids[g]`` goes to group ``g``."""
        ids = self._split(block_ids, row_idx)
        for t, g_ids in zip(self.tables, ids):  # check all groups first: no half-applied step
            t._check_fits(t.num_blocks(row_idx), len(g_ids), row_idx)
        for t, g_ids in zip(self.tables, ids):
            t.append_row(g_ids, row_idx)

    def add_row(self, block_ids: Sequence[Sequence[int]], row_idx: int) -> None:
        """``MultiGroupBlockTable.add_row``."""
        ids = self._split(block_ids, row_idx)
        for t, g_ids in zip(self.tables, ids):
            t._check_fits(0, len(g_ids), row_idx)
        for t, g_ids in zip(self.tables, ids):
            t.add_row(g_ids, row_idx)

    def clear_row(self, row_idx: int) -> None:
        """``MultiGroupBlockTable.clear_row``."""
        for t in self.tables:
            t.clear_row(row_idx)

    def move_row(self, src: int, tgt: int) -> None:
        """``MultiGroupBlockTable.move_row``."""
        for t in self.tables:
            t.move_row(src, tgt)

    def swap_row(self, a: int, b: int) -> None:
        """``MultiGroupBlockTable.swap_row``."""
        for t in self.tables:
            t.swap_row(a, b)

    def clear(self) -> None:
        """``MultiGroupBlockTable.clear``."""
        for t in self.tables:
            t.clear()

    def batch_rows(self, num_reqs: int, num_reqs_padded: int) -> list[list[list[int]]]:
        """Per group, ``MRv1BlockTable.batch_rows``."""
        return [t.batch_rows(num_reqs, num_reqs_padded) for t in self.tables]

    def compute_slot_mapping(self, num_reqs: int, query_start_loc: Sequence[int], positions: Sequence[int]) -> None:
        """``MultiGroupBlockTable.compute_slot_mapping`` (``"none"`` groups are skipped)."""
        for t in self.tables:
            t.compute_slot_mapping(num_reqs, query_start_loc, positions)

    def get_slot_mappings(self, num_tokens: int, num_tokens_padded: int) -> list[list[int]]:
        """Per group, ``gpu_model_runner.py::_get_slot_mappings`` (``MRv1BlockTable.get_slot_mapping``)."""
        return [t.get_slot_mapping(num_tokens, num_tokens_padded) for t in self.tables]


# --------------------------------------------------------------------------- MRv2


class MRv2BlockTables:
    """MRv2 ``BlockTables`` (``vllm/v1/worker/gpu/block_table.py``).

    ``widths[g]`` is ``max_num_blocks_per_group[g]`` (the runner already applied
    ``get_block_table_width``). Rows are persistent per **request-state slot**; batch order
    only exists in the gathered ``input_block_tables``. Staged writes are applied at once:
    the runner always calls ``apply_staged_writes`` before reading the tables.
    """

    def __init__(
        self,
        block_sizes: Sequence[int],
        max_num_reqs: int,
        max_num_batched_tokens: int,
        widths: Sequence[int],
        cp_size: int = 1,
        cp_rank: int = 0,
        cp_interleave: int = 1,
        slot_mapping_enabled: Sequence[bool] | None = None,
        dcp_sharded: Sequence[bool] | None = None,
        sliding_window_reach: Sequence[int] | None = None,
    ) -> None:
        G = len(block_sizes)
        if len(widths) != G:
            raise ConfigError(f"{len(widths)} widths for {G} block sizes; expected one per group")
        self.block_sizes = [_int(b, "block size", minimum=1) for b in block_sizes]
        self.widths = [_int(w, "block table width", minimum=0) for w in widths]
        self.max_num_reqs = _int(max_num_reqs, "max_num_reqs", minimum=1)
        self.max_num_batched_tokens = _int(max_num_batched_tokens, "max_num_batched_tokens", minimum=0)
        self.cp_size = _int(cp_size, "DCP world size", minimum=1)
        self.cp_rank = _int(cp_rank, "DCP rank", minimum=0, maximum=self.cp_size - 1)
        self.cp_interleave = _int(cp_interleave, "cp_kv_cache_interleave_size", minimum=1)
        self.slot_mapping_enabled = [bool(e) for e in _per_group(slot_mapping_enabled, G, "slot_mapping_enabled", True)]
        self.dcp_sharded = [bool(s) for s in _per_group(dcp_sharded, G, "dcp_sharded", True)]
        for g in range(G):
            if self.dcp_sharded[g] and self.slot_mapping_enabled[g]:
                _dcp(self.cp_size, self.cp_rank, self.cp_interleave, self.block_sizes[g])
        reach = [_int(r, "sliding_window_reach", minimum=0) for r in _per_group(sliding_window_reach, G, "sliding_window_reach", 0)]
        # vLLM drops the reach under DCP: nulling by global position would hit the wrong shard.
        self.sliding_window_reach = reach if self.cp_size == 1 else [0] * G
        self._tables = [[[0] * w for _ in range(self.max_num_reqs)] for w in self.widths]
        self._num_blocks = [[0] * self.max_num_reqs for _ in range(G)]
        self._input = [[[0] * w for _ in range(self.max_num_reqs)] for w in self.widths]
        self._num_dirty_rows = 0

    def __repr__(self) -> str:
        return f"MRv2BlockTables(block_sizes={self.block_sizes}, widths={self.widths}, max_num_reqs={self.max_num_reqs})"

    @property
    def num_groups(self) -> int:
        return len(self.block_sizes)

    def _slot(self, req_index: object, what: str = "request-state slot") -> int:
        return _int(req_index, what, minimum=0, maximum=self.max_num_reqs - 1)

    def append_block_ids(self, req_index: int, new_block_ids: Sequence[Sequence[int]], overwrite: bool) -> None:
        """``BlockTables.append_block_ids``: write at 0 (``overwrite``) or after ``num_blocks``.

        Only ``[start, start+len)`` is written: an overwrite keeps the old row's tail (stale).
        """
        req = self._slot(req_index)
        if len(new_block_ids) != self.num_groups:
            raise ConfigError(
                f"block ids for {len(new_block_ids)} groups at request slot {req}; expected {self.num_groups} groups"
            )
        ids = [_block_ids(x, f"request slot {req} of group {g}") for g, x in enumerate(new_block_ids)]
        starts = [0 if overwrite else self._num_blocks[g][req] for g in range(self.num_groups)]
        for g, (start, g_ids) in enumerate(zip(starts, ids)):
            end = start + len(g_ids)
            if end > self.widths[g]:
                raise ConfigError(
                    f"block table write of {len(g_ids)} block ids at column {start} for request slot {req} "
                    f"ends at {end}, exceeding the row width {self.widths[g]} for group {g}"
                )
        for g, (start, g_ids) in enumerate(zip(starts, ids)):
            self._tables[g][req][start : start + len(g_ids)] = g_ids
            self._num_blocks[g][req] = start + len(g_ids)

    def num_blocks(self, group: int, req_index: int) -> int:
        """``num_blocks.np[group, req_index]``."""
        return self._num_blocks[group][self._slot(req_index)]

    def persistent_row(self, group: int, req_index: int) -> list[int]:
        """The full persistent row ``block_tables[group].gpu[req_index]`` (stale tail included)."""
        return list(self._tables[group][self._slot(req_index)])

    def valid(self, group: int, req_index: int) -> list[int]:
        """``persistent_row[:num_blocks]``: the part MRv1 and MRv2 agree on."""
        req = self._slot(req_index)
        return self._tables[group][req][: self._num_blocks[group][req]]

    @property
    def input_block_tables(self) -> list[list[list[int]]]:
        """A copy of the per-step batch-ordered tables (all ``max_num_reqs`` rows)."""
        return [[list(r) for r in t] for t in self._input]

    def gather(
        self,
        idx_mapping: Sequence[int],
        num_reqs_padded: int,
        num_computed_tokens: Sequence[int] | Mapping[int, int] | None = None,
        sliding_window_reach: Sequence[int] | None = None,
    ) -> tuple[list[list[int]], ...]:
        """``BlockTables.gather_block_tables`` into the persistent ``input_block_tables``.

        Batch row ``i`` gets ``[:n]`` of slot ``idx_mapping[i]``; columns ``>= n`` keep what
        that batch row held before (stale). Rows ``[num_reqs, max(num_reqs_padded,
        dirty))`` are zeroed. With ``num_computed_tokens`` (indexed by slot) and
        ``cp_size == 1``, the first ``max(computed - reach, 0) // B`` entries become 0 (D8).
        ``sliding_window_reach`` overrides the constructor's per-group reach for this call.
        Returns ``[g][:num_reqs_padded]`` (copies).
        """
        idx = [self._slot(i, "idx_mapping entry") for i in idx_mapping]
        num_reqs = len(idx)
        padded = _int(num_reqs_padded, "num_reqs_padded", minimum=num_reqs, maximum=self.max_num_reqs)
        if sliding_window_reach is None:
            reach = self.sliding_window_reach
        else:
            reach = [_int(r, "sliding_window_reach", minimum=0)
                     for r in _per_group(sliding_window_reach, self.num_groups, "sliding_window_reach", 0)]
        null_on = num_computed_tokens is not None and self.cp_size == 1 and any(reach)
        num_rows = max(padded, self._num_dirty_rows)
        for g, out in enumerate(self._input):
            B, table = self.block_sizes[g], self._tables[g]
            for i, req in enumerate(idx):
                n = self._num_blocks[g][req]
                num_null = 0
                if null_on and reach[g] > 0:
                    computed = _int(num_computed_tokens[req], f"num_computed_tokens of slot {req}", minimum=0)  # type: ignore[index]
                    num_null = max(computed - reach[g], 0) // B
                for c in range(n):
                    out[i][c] = NULL_BLOCK_ID if c < num_null else table[req][c]
            for i in range(num_reqs, num_rows):
                out[i][:] = [0] * self.widths[g]
        self._num_dirty_rows = padded
        return tuple([list(out[i]) for i in range(padded)] for out in self._input)

    gather_block_tables = gather

    def compute_slot_mappings(
        self,
        idx_mapping: Sequence[int],
        query_start_loc: Sequence[int],
        positions: Sequence[int],
        num_tokens_padded: int,
    ) -> list[list[int]]:
        """``BlockTables.compute_slot_mappings``: ``slot_mappings_mrv2`` over the persistent rows."""
        return slot_mappings_mrv2(
            self._tables, self.block_sizes, idx_mapping, query_start_loc, positions, num_tokens_padded,
            self.max_num_batched_tokens, cp_size=self.cp_size, cp_rank=self.cp_rank,
            cp_interleave=self.cp_interleave, slot_mapping_enabled=self.slot_mapping_enabled,
            dcp_sharded=self.dcp_sharded,
        )

    def dummy_slot_mappings(self, num_tokens: int) -> list[list[int]]:
        """``BlockTables.get_dummy_slot_mappings``: every slot PAD."""
        n = _int(num_tokens, "num_tokens", minimum=0, maximum=self.max_num_batched_tokens)
        return [[PAD_SLOT_ID] * n for _ in range(self.num_groups)]


# --------------------------------------------------------------------------- kernel blocks


def expand_row(row: Sequence[int], num_valid: int, ratio: int, kernel_block_stride: int = 0) -> list[int]:
    """Kernel ids for the first ``num_valid`` columns of one row.

    Mirrors ``vllm/v1/worker/utils.py::AttentionGroup.map_to_kernel_block_table``: column
    ``c`` becomes ``row[c]*(stride or R) + j`` for ``j < R``, so the null block 0 expands
    to ``0..R-1``, not zeros. Compare runners only on this prefix (MRv2 tails are stale).
    """
    n = _int(num_valid, "num_valid", minimum=0, maximum=len(row))
    R = _int(ratio, "kernel blocks per block (ratio)", minimum=1)
    s = _int(kernel_block_stride, "kernel_block_stride", minimum=0)
    out: list[int] = []
    for b in row[:n]:
        out.extend(expand_block_id(_int(b, "block id", minimum=0), R, s))
    return out


def map_to_kernel_block_table(rows: Sequence[Sequence[int]], ratio: int, kernel_block_stride: int = 0) -> list[list[int]]:
    """``AttentionGroup.map_to_kernel_block_table`` on a whole table (every column)."""
    return [expand_row(r, len(r), ratio, kernel_block_stride) for r in rows]


def _kernel_sizes(block_size: int, kernel_block_size: int) -> tuple[int, int]:
    B = _int(block_size, "block size", minimum=1)
    K = _int(kernel_block_size, "kernel block size", minimum=1)
    if B % K:
        raise ConfigError(f"kernel block size {K} does not divide block size {B}; expected a divisor of {B}")
    return B, K


def kernel_slot(slot: int, block_size: int, kernel_block_size: int) -> tuple[int, int]:
    """``(kernel_block_id, offset)`` of a manager-unit slot in the kernel-unit view.

    The write kernels index the ``(NB*R, H, K, C)`` tensor with the unchanged slot
    (research note §1.5); this is the block/offset they land on when
    ``kernel_block_stride == 0``.
    """
    B, K = _kernel_sizes(block_size, kernel_block_size)
    s = _int(slot, "slot", minimum=0)  # PAD (-1) has no kernel block
    b, off = divmod(s, B)
    return b * (B // K) + off // K, off % K


def check_slot_invariant(block_id: int, offset: int, block_size: int, kernel_block_size: int) -> int:
    """Assert ``(b*R + off//K)*K + off%K == b*B + off`` and return the slot (note §1.5).

    Why kernel splitting never touches slot mappings in either runner. Raises
    ``AssertionError`` if the identity fails (it cannot for valid inputs).
    """
    B, K = _kernel_sizes(block_size, kernel_block_size)
    b = _int(block_id, "block id", minimum=0)
    off = _int(offset, "offset", minimum=0, maximum=B - 1)
    manager = b * B + off
    kb, koff = kernel_slot(manager, B, K)
    if kb != b * (B // K) + off // K or kb * K + koff != manager:
        raise AssertionError(f"slot invariant broken for block {b}, offset {off}, B={B}, K={K}")
    return manager


# --------------------------------------------------------------------------- drafts (D15)


@dataclass(frozen=True)
class DraftStep:
    """Position, seq_len and whether the slot is PAD for the next draft token."""

    position: int
    seq_len: int
    pad_slot: bool


def draft_step_mrv1(position: int, seq_len: int, max_model_len: int) -> DraftStep:
    """MRv1 ``eagle_step_update_slot_mapping_and_metadata`` (``vllm/v1/spec_decode/utils.py``).

    Past the model length the slot is PAD and position/seq_len reset to 0/1 (D15).
    """
    p = _int(position, "position", minimum=0)
    s = _int(seq_len, "seq_len", minimum=0)
    L = _int(max_model_len, "max_model_len", minimum=1)
    if p + 1 >= L:
        return DraftStep(0, 1, True)
    return DraftStep(p + 1, s + 1, False)


def draft_step_mrv2(position: int, seq_len: int, max_model_len: int) -> DraftStep:
    """MRv2 draft decode step (``vllm/v1/worker/gpu/spec_decode/``): clamp, never PAD (D15).

    The clamped position re-uses (overwrites) the slot of ``max_model_len - 1``.
    """
    p = _int(position, "position", minimum=0)
    s = _int(seq_len, "seq_len", minimum=0)
    L = _int(max_model_len, "max_model_len", minimum=1)
    return DraftStep(min(p + 1, L - 1), min(s + 1, L), False)


# --------------------------------------------------------------------------- schedules

ReqId = Hashable


def _freeze_groups(block_ids: Sequence[Sequence[int]]) -> tuple[tuple[int, ...], ...]:
    if isinstance(block_ids, (str, bytes)):
        raise ConfigError(f"block ids {block_ids!r} are a string; expected one list per group")
    return tuple(tuple(_block_ids(ids, f"group {g}")) for g, ids in enumerate(block_ids))


@dataclass(frozen=True)
class Add:
    """A new or resumed request with its full block ids per group.

    MRv1 ``InputBatch.add_request`` -> ``add_row``; MRv2 ``add_requests`` ->
    ``append_block_ids(overwrite=True)``.
    """

    req: ReqId
    block_ids: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "block_ids", _freeze_groups(self.block_ids))


@dataclass(frozen=True)
class Append:
    """New blocks of a running request (``append_row`` / ``append_block_ids(overwrite=False)``)."""

    req: ReqId
    block_ids: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "block_ids", _freeze_groups(self.block_ids))


@dataclass(frozen=True)
class Remove:
    """A finished request (MRv1 ``remove_request`` -> ``clear_row``; MRv2 frees the slot)."""

    req: ReqId


@dataclass(frozen=True)
class Preempt:
    """A preempted request: removed like ``Remove`` but may come back with a fresh ``Add``."""

    req: ReqId


@dataclass(frozen=True)
class Move:
    """MRv1 ``condense``: ``move_row(src, dst)`` into a free row. No-op for MRv2."""

    src: int
    dst: int


@dataclass(frozen=True)
class Swap:
    """MRv1 reorder (``swap_states`` -> ``swap_row``). No-op for MRv2."""

    a: int
    b: int


Op = Union[Add, Append, Remove, Preempt, Move, Swap]
Schedule = list[Op]
"""A list of ops applied in order; any ``Sequence[Op]`` is accepted."""


@dataclass(frozen=True)
class ScheduleResult:
    """What a schedule leaves behind in one runner's model.

    ``blocks[req][g]`` is the logical block ids of every live request (``[:num_blocks]``
    only: MRv2 tails are stale); ``locations[req]`` is its MRv1 batch row or MRv2
    request-state slot.
    """

    blocks: Mapping[ReqId, tuple[tuple[int, ...], ...]]
    locations: Mapping[ReqId, int]
    tables: Union[MRv1MultiGroupBlockTable, MRv2BlockTables] = field(compare=False, repr=False)


class _Lifecycle:
    """Request bookkeeping both runners share: live, preempted and finished requests."""

    def __init__(self, num_groups: int, capacity: int) -> None:
        self.num_groups = num_groups
        self.capacity = capacity
        self.locations: dict[ReqId, int] = {}
        self.preempted: set[ReqId] = set()
        self.finished: set[ReqId] = set()

    def _free(self) -> list[int]:
        used = set(self.locations.values())
        return [i for i in range(self.capacity) if i not in used]

    def _check_groups(self, op: Union[Add, Append]) -> None:
        if len(op.block_ids) != self.num_groups:
            raise ConfigError(
                f"{type(op).__name__} for request {op.req!r} has block ids for {len(op.block_ids)} groups; "
                f"expected {self.num_groups}"
            )

    def _admit(self, op: Add) -> int:
        """Validate an ``Add`` and pick its location; ``_commit`` records it once the table took it."""
        self._check_groups(op)
        if op.req in self.locations:
            raise ConfigError(f"Add of request {op.req!r} which is already live; expected a new or preempted request")
        if op.req in self.finished:
            raise ConfigError(f"Add of request {op.req!r} which already finished; expected a new or preempted request")
        free = self._free()
        if not free:
            raise ConfigError(
                f"Add of request {op.req!r} with {len(self.locations)} live requests; expected at most "
                f"{self.capacity} (max_num_reqs)"
            )
        return free[0]

    def _commit(self, op: Add, loc: int) -> None:
        self.preempted.discard(op.req)
        self.locations[op.req] = loc

    def _live(self, req: ReqId, what: str) -> int:
        if req not in self.locations:
            raise ConfigError(f"{what} of request {req!r} which is not live; expected one of {sorted(map(repr, self.locations))}")
        return self.locations[req]

    def _leave(self, op: Union[Remove, Preempt]) -> int:
        loc = self._live(op.req, type(op).__name__)
        del self.locations[op.req]
        (self.preempted if isinstance(op, Preempt) else self.finished).add(op.req)
        return loc


class MRv1ScheduleState(_Lifecycle):
    """MRv1 ``InputBatch`` row bookkeeping (``vllm/v1/worker/gpu_input_batch.py``).

    A new request takes the lowest free batch row (``pop_removed`` / ``num_reqs``).
    """

    def __init__(self, tables: MRv1MultiGroupBlockTable) -> None:
        super().__init__(tables.num_groups, tables.max_num_reqs)
        self.tables = tables

    def free_rows(self) -> list[int]:
        """Batch rows no live request holds."""
        return self._free()

    def apply(self, op: Op) -> None:
        if isinstance(op, Add):
            row = self._admit(op)
            self.tables.add_row(op.block_ids, row)
            self._commit(op, row)
        elif isinstance(op, Append):
            self._check_groups(op)
            self.tables.append_row(op.block_ids, self._live(op.req, "Append"))
        elif isinstance(op, (Remove, Preempt)):
            self.tables.clear_row(self._leave(op))
        elif isinstance(op, Move):
            src = _int(op.src, "Move source row", minimum=0, maximum=self.capacity - 1)
            dst = _int(op.dst, "Move target row", minimum=0, maximum=self.capacity - 1)
            owner = {row: req for req, row in self.locations.items()}
            if src not in owner:
                raise ConfigError(f"Move from row {src} which holds no live request; expected a live row")
            if dst in owner:
                raise ConfigError(
                    f"Move to row {dst} which holds live request {owner[dst]!r}; expected a free row"
                )
            self.tables.move_row(src, dst)
            self.locations[owner[src]] = dst
        elif isinstance(op, Swap):
            a = _int(op.a, "Swap row", minimum=0, maximum=self.capacity - 1)
            b = _int(op.b, "Swap row", minimum=0, maximum=self.capacity - 1)
            owner = {row: req for req, row in self.locations.items()}
            self.tables.swap_row(a, b)
            if a in owner:
                self.locations[owner[a]] = b
            if b in owner:
                self.locations[owner[b]] = a
        else:
            raise ConfigError(f"schedule op {op!r} is unknown; expected Add, Append, Remove, Preempt, Move or Swap")

    def result(self) -> ScheduleResult:
        blocks = {
            req: tuple(tuple(t.valid(row)) for t in self.tables.tables) for req, row in self.locations.items()
        }
        return ScheduleResult(blocks, dict(self.locations), self.tables)


class MRv2ScheduleState(_Lifecycle):
    """MRv2 request-state slots (``vllm/v1/worker/gpu/states.py``) driving ``MRv2BlockTables``.

    A new request takes the lowest free slot; the choice only moves stale tails around,
    never ``[:num_blocks]``. Finished and preempted requests free their slot without
    clearing it. ``Move``/``Swap`` are no-ops: batch order is rebuilt by ``idx_mapping``.
    """

    def __init__(self, tables: MRv2BlockTables) -> None:
        super().__init__(tables.num_groups, tables.max_num_reqs)
        self.tables = tables

    def apply(self, op: Op) -> None:
        if isinstance(op, Add):
            slot = self._admit(op)
            self.tables.append_block_ids(slot, op.block_ids, overwrite=True)
            self._commit(op, slot)
        elif isinstance(op, Append):
            self._check_groups(op)
            self.tables.append_block_ids(self._live(op.req, "Append"), op.block_ids, overwrite=False)
        elif isinstance(op, (Remove, Preempt)):
            self._leave(op)
        elif isinstance(op, (Move, Swap)):
            pass
        else:
            raise ConfigError(f"schedule op {op!r} is unknown; expected Add, Append, Remove, Preempt, Move or Swap")

    def result(self) -> ScheduleResult:
        blocks = {
            req: tuple(tuple(self.tables.valid(g, slot)) for g in range(self.num_groups))
            for req, slot in self.locations.items()
        }
        return ScheduleResult(blocks, dict(self.locations), self.tables)


def run_schedule_mrv1(
    schedule: Sequence[Op],
    block_sizes: Sequence[int],
    max_num_blocks: Sequence[int],
    max_num_reqs: int,
    *,
    slot_mapping_modes: Sequence[SlotMappingMode | str] | None = None,
    max_num_batched_tokens: int = 2048,
) -> ScheduleResult:
    """Apply ``schedule`` to a fresh ``MRv1MultiGroupBlockTable`` (widths as MRv1 aligns them)."""
    state = MRv1ScheduleState(MRv1MultiGroupBlockTable(
        max_num_reqs, max_num_batched_tokens, block_sizes, max_num_blocks, slot_mapping_modes=slot_mapping_modes,
    ))
    for op in schedule:
        state.apply(op)
    return state.result()


def run_schedule_mrv2(
    schedule: Sequence[Op],
    block_sizes: Sequence[int],
    max_num_blocks: Sequence[int],
    max_num_reqs: int,
    *,
    token_alignments: Sequence[int | None] | None = None,
    max_num_batched_tokens: int = 2048,
) -> ScheduleResult:
    """Apply ``schedule`` to a fresh ``MRv2BlockTables``.

    Widths are ``get_block_table_width(max_num_blocks[g], B_g, token_alignments[g])`` as
    ``gpu/model_runner.py::initialize_kv_cache`` computes them (default 128; ``None`` for Mamba).
    """
    if len(block_sizes) != len(max_num_blocks):
        raise ConfigError(
            f"{len(block_sizes)} block sizes but {len(max_num_blocks)} max_num_blocks; expected one per group"
        )
    aligns = _per_group(token_alignments, len(block_sizes), "token_alignments", DEFAULT_TOKEN_ALIGNMENT)
    widths = [get_block_table_width(m, b, a) for m, b, a in zip(max_num_blocks, block_sizes, aligns)]
    state = MRv2ScheduleState(MRv2BlockTables(block_sizes, max_num_reqs, max_num_batched_tokens, widths))
    for op in schedule:
        state.apply(op)
    return state.result()
