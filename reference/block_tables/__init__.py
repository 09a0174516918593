"""Block tables and slot mappings of the target release's two GPU model runners.

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

Modules: ``_common`` (constants, checks, widths), ``slots``, ``mrv1``, ``mrv2``,
``kernel`` (kernel-block expansion), ``drafts`` and ``schedules``; everything public is
re-exported here.
"""

from __future__ import annotations

from reference.block_tables._common import (
    PAD_SLOT_ID,
    NULL_BLOCK_ID,
    DEFAULT_TOKEN_ALIGNMENT,
    SlotMappingMode,
    get_block_table_width,
)
from reference.block_tables.drafts import DraftStep, draft_step_mrv1, draft_step_mrv2
from reference.block_tables.kernel import (
    expand_row,
    map_to_kernel_block_table,
    kernel_slot,
    check_slot_invariant,
)
from reference.block_tables.mrv1 import MRv1BlockTable, MRv1MultiGroupBlockTable
from reference.block_tables.mrv2 import MRv2BlockTables
from reference.block_tables.schedules import (
    Add,
    Append,
    Remove,
    Preempt,
    Move,
    Swap,
    Op,
    Schedule,
    ScheduleResult,
    MRv1ScheduleState,
    MRv2ScheduleState,
    run_schedule_mrv1,
    run_schedule_mrv2,
    mrv2_step_order,
)
from reference.block_tables.slots import slot_mapping_mrv1, slot_mappings_mrv2

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
    "mrv2_step_order",
]
