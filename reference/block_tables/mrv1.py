"""MRv1: ``vllm/v1/worker/block_table.py`` ``BlockTable`` and ``MultiGroupBlockTable``."""

from __future__ import annotations

from typing import Sequence

from reference.block_tables._common import (
    DEFAULT_TOKEN_ALIGNMENT,
    NULL_BLOCK_ID,
    PAD_SLOT_ID,
    SlotMappingMode,
    _block_ids,
    _dcp,
    _int,
    _mode,
    _per_group,
    get_block_table_width,
)
from reference.block_tables.slots import slot_mapping_mrv1
from reference.errors import ConfigError
from reference.kernel_blocks import expand_block_id


class MRv1BlockTable:
    """One group's MRv1 block table (``vllm/v1/worker/block_table.py::BlockTable``).

    Row ``i`` is batch position ``i``; rows start zeroed with count 0. ``width`` is the
    row length as given (only ``MRv1MultiGroupBlockTable`` aligns it). ``slot_mapping``
    is the persistent per-group buffer the runner slices each step.

    ``blocks_per_kv_block`` R > 1 is vLLM before 0.32 (``BlockTable(kernel_block_size=B/R)``):
    a row holds kernel block ids, every block id written becomes its R kernel ids
    (``BlockTable.map_to_kernel_blocks``), ``width`` and the counts are in kernel blocks.
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
        blocks_per_kv_block: int = 1,
        move_clears_source: bool = True,
    ) -> None:
        self.block_size = _int(block_size, "block size", minimum=1)
        self.move_clears_source = bool(move_clears_source)
        self.blocks_per_kv_block = _int(blocks_per_kv_block, "kernel blocks per block", minimum=1)
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

    def stored_ids(self, block_ids: Sequence[int]) -> list[int]:
        """The ids a row stores for ``block_ids``: themselves, or their kernel ids (R > 1)."""
        ids = _block_ids(block_ids, f"block ids of group {self.group}")
        if self.blocks_per_kv_block == 1:
            return ids
        return [k for b in ids for k in expand_block_id(b, self.blocks_per_kv_block)]

    # --- row operations (numpy-only in vLLM) ---------------------------------------
    def append_row(self, block_ids: Sequence[int], row_idx: int) -> None:
        """``BlockTable.append_row``: write after the row's current count."""
        ids = self.stored_ids(block_ids)
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
        self._check_fits(0, len(ids) * self.blocks_per_kv_block, r)
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
        Without ``move_clears_source`` (vLLM before 0.27, #49757) the source row and its
        count stay as they were.
        """
        s, t = self._row_index(src, "source row"), self._row_index(tgt, "target row")
        n = self._counts[s]
        self._rows[t][:n] = self._rows[s][:n]
        self._counts[t] = n
        if self.move_clears_source:
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
            self.blocks_per_kv_block,
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
    unaligned for ``"none"`` (Mamba) groups and without ``token_aligned`` (vLLM before 0.27);
    ``block_aligned`` (vLLM 0.21 to 0.26) rounds every group of blocks up to 128 tokens to a
    multiple of ``128 // B`` blocks instead,
    times ``blocks_per_kv_block[g]`` (vLLM before 0.32: rows of kernel block ids). Row
    operations are forwarded to every group.
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
        blocks_per_kv_block: Sequence[int] | None = None,
        move_clears_source: bool = True,
        token_aligned: bool = True,
        block_aligned: bool = False,
    ) -> None:
        if len(block_sizes) != len(max_num_blocks):
            raise ConfigError(
                f"{len(block_sizes)} block sizes but {len(max_num_blocks)} max_num_blocks; expected one per group"
            )
        modes = [_mode(m) for m in _per_group(slot_mapping_modes, len(block_sizes), "slot_mapping_modes",
                                              SlotMappingMode.TOKEN_TO_KV_SLOT)]
        ratios = [_int(r, "kernel blocks per block", minimum=1)
                  for r in _per_group(blocks_per_kv_block, len(block_sizes), "blocks_per_kv_block", 1)]
        tables = []
        for g, (b, m, mode, ratio) in enumerate(zip(block_sizes, max_num_blocks, modes, ratios)):
            align = DEFAULT_TOKEN_ALIGNMENT if mode is SlotMappingMode.TOKEN_TO_KV_SLOT and token_aligned else None
            if block_aligned and b <= DEFAULT_TOKEN_ALIGNMENT:
                # vLLM 0.21-0.26 (#39324): every group's row, a state group's too, to a multiple of 128 // B blocks.
                step = DEFAULT_TOKEN_ALIGNMENT // b
                m = -(-m // step) * step
            tables.append(MRv1BlockTable(
                b, max_num_reqs, get_block_table_width(m, b, align) * ratio, max_num_batched_tokens,
                slot_mapping_mode=mode, dcp_world_size=dcp_world_size, dcp_rank=dcp_rank,
                cp_kv_cache_interleave_size=cp_kv_cache_interleave_size, group=g, blocks_per_kv_block=ratio,
                move_clears_source=move_clears_source,
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
            t._check_fits(t.num_blocks(row_idx), len(g_ids) * t.blocks_per_kv_block, row_idx)
        for t, g_ids in zip(self.tables, ids):
            t.append_row(g_ids, row_idx)

    def add_row(self, block_ids: Sequence[Sequence[int]], row_idx: int) -> None:
        """``MultiGroupBlockTable.add_row``."""
        ids = self._split(block_ids, row_idx)
        for t, g_ids in zip(self.tables, ids):
            t._check_fits(0, len(g_ids) * t.blocks_per_kv_block, row_idx)
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
