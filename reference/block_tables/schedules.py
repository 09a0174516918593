"""Request schedules (add, append, remove, preempt, move, swap) run through either runner's model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable, Mapping, Sequence, Union

from reference.block_tables._common import (
    DEFAULT_TOKEN_ALIGNMENT,
    SlotMappingMode,
    _block_ids,
    _int,
    _per_group,
    get_block_table_width,
)
from reference.block_tables.mrv1 import MRv1MultiGroupBlockTable
from reference.block_tables.mrv2 import MRv2BlockTables
from reference.errors import ConfigError


ReqId = Hashable


def _freeze_groups(block_ids: Sequence[Sequence[int]]) -> tuple[tuple[int, ...], ...]:
    if isinstance(block_ids, (str, bytes)):
        raise ConfigError(f"block ids {block_ids!r} are a string; expected one list per group")
    return tuple(tuple(_block_ids(ids, f"group {g}")) for g, ids in enumerate(block_ids))


@dataclass(frozen=True)
class _RequestBlocks:
    """A request and block ids per group (frozen into tuples, each id checked)."""

    req: ReqId
    """The request."""
    block_ids: tuple[tuple[int, ...], ...]
    """Its block ids, one tuple per KV cache group."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "block_ids", _freeze_groups(self.block_ids))


@dataclass(frozen=True)
class Add(_RequestBlocks):
    """A new or resumed request with its full block ids per group.

    MRv1 ``InputBatch.add_request`` -> ``add_row``; MRv2 ``add_requests`` ->
    ``append_block_ids(overwrite=True)``.
    """


@dataclass(frozen=True)
class Append(_RequestBlocks):
    """New blocks of a running request (``append_row`` / ``append_block_ids(overwrite=False)``)."""


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

    ``RequestState`` keeps its free slots as a stack: ``free_indices = list(range(n))``,
    a new request takes ``free_indices.pop()`` (the highest free slot at first) and a
    finished or preempted one is appended back, so the next request reuses the slot
    freed last. The choice only moves stale tails around, never ``[:num_blocks]``.
    Freed slots are not cleared. ``Move``/``Swap`` are no-ops: batch order is rebuilt by
    ``idx_mapping``. Within one scheduler step MRv2 frees finished and preempted requests
    in sorted order of their ids (``GPUModelRunner.finish_requests``): see
    ``mrv2_step_order``.
    """

    def __init__(self, tables: MRv2BlockTables) -> None:
        super().__init__(tables.num_groups, tables.max_num_reqs)
        self.tables = tables
        self._free_stack = list(range(tables.max_num_reqs))

    def _free(self) -> list[int]:
        return self._free_stack[::-1]  # pop() takes the last one

    def _commit(self, op: Add, loc: int) -> None:
        self._free_stack.remove(loc)
        super()._commit(op, loc)

    def apply(self, op: Op) -> None:
        if isinstance(op, Add):
            slot = self._admit(op)
            self.tables.append_block_ids(slot, op.block_ids, overwrite=True)
            self._commit(op, slot)
        elif isinstance(op, Append):
            self._check_groups(op)
            self.tables.append_block_ids(self._live(op.req, "Append"), op.block_ids, overwrite=False)
        elif isinstance(op, (Remove, Preempt)):
            self._free_stack.append(self._leave(op))
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


def mrv2_step_order(step_ops: Sequence[Op]) -> list[Op]:
    """One scheduler step's ops in the order MRv2's ``execute_model`` applies them:
    ``finish_requests`` (finished and preempted, sorted by request id), then
    ``add_requests`` and ``update_requests`` in schedule order. Row moves and swaps are
    MRv1 ``InputBatch`` operations; MRv2 has none."""
    leaves = sorted((op for op in step_ops if isinstance(op, (Remove, Preempt))), key=lambda op: str(op.req))
    return leaves + [op for op in step_ops if not isinstance(op, (Remove, Preempt))]


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
