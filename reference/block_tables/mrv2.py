"""MRv2: ``vllm/v1/worker/gpu/block_table.py`` ``BlockTables`` (persistent rows, gathered inputs)."""

from __future__ import annotations

from typing import Mapping, Sequence

from reference.block_tables._common import NULL_BLOCK_ID, PAD_SLOT_ID, _block_ids, _dcp, _int, _per_group
from reference.block_tables.slots import slot_mappings_mrv2
from reference.errors import ConfigError
from reference.kernel_blocks import expand_block_id


class MRv2BlockTables:
    """MRv2 ``BlockTables`` (``vllm/v1/worker/gpu/block_table.py``).

    ``widths[g]`` is ``max_num_blocks_per_group[g]`` (the runner already applied
    ``get_block_table_width``). Rows are persistent per **request-state slot**; batch order
    only exists in the gathered ``input_block_tables``. Staged writes are applied at once:
    the runner always calls ``apply_staged_writes`` before reading the tables.

    ``blocks_per_kv_block[g]`` R > 1 is vLLM 0.22 to 0.31 (``BlockTables(kernel_block_sizes)``):
    ``widths[g]`` and ``num_blocks`` are in kernel blocks, every block id written becomes its R
    kernel ids, and slots are read in kernel blocks (``slot_mappings_mrv2(kernel_block_sizes)``).
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
        blocks_per_kv_block: Sequence[int] | None = None,
    ) -> None:
        G = len(block_sizes)
        if len(widths) != G:
            raise ConfigError(f"{len(widths)} widths for {G} block sizes; expected one per group")
        self.block_sizes = [_int(b, "block size", minimum=1) for b in block_sizes]
        self.widths = [_int(w, "block table width", minimum=0) for w in widths]
        self.blocks_per_kv_block = [_int(r, "kernel blocks per block", minimum=1)
                                    for r in _per_group(blocks_per_kv_block, G, "blocks_per_kv_block", 1)]
        for b, r in zip(self.block_sizes, self.blocks_per_kv_block):
            if b % r:
                raise ConfigError(f"{r} kernel blocks per block do not divide block size {b}; expected a divisor of {b}")
        self.stored_block_sizes = [b // r for b, r in zip(self.block_sizes, self.blocks_per_kv_block)]
        """The token span of one stored id: the block size, or the kernel block size (R > 1)."""
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
        # 0.22-0.31: append_block_ids expands each id to its kernel ids (b * R + k).
        ids = [[k for b in g_ids for k in expand_block_id(b, r)] if r > 1 else g_ids
               for g_ids, r in zip(ids, self.blocks_per_kv_block)]
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
            B, table = self.stored_block_sizes[g], self._tables[g]
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
            dcp_sharded=self.dcp_sharded, kernel_block_sizes=self.stored_block_sizes,
        )

    def dummy_slot_mappings(self, num_tokens: int) -> list[list[int]]:
        """``BlockTables.get_dummy_slot_mappings``: every slot PAD."""
        n = _int(num_tokens, "num_tokens", minimum=0, maximum=self.max_num_batched_tokens)
        return [[PAD_SLOT_ID] * n for _ in range(self.num_groups)]
