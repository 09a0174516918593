"""Tests for ``reference.block_tables`` (MRv1/MRv2 block tables and slot mappings).

Goldens come from the research note ``/work/shared/research/vllm-blocktables-runners.md``
(cited as "note §x"): the [run] examples were executed against the real vLLM 0.33.0 code;
the others are hand-computed from the formulas the note quotes, with the arithmetic
spelled out next to them.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference.block_tables import (
    PAD_SLOT_ID,
    Add,
    Append,
    DraftStep,
    Move,
    MRv1BlockTable,
    MRv1MultiGroupBlockTable,
    MRv1ScheduleState,
    MRv2BlockTables,
    MRv2ScheduleState,
    Preempt,
    Remove,
    Swap,
    check_slot_invariant,
    draft_step_mrv1,
    draft_step_mrv2,
    expand_row,
    get_block_table_width,
    kernel_slot,
    map_to_kernel_block_table,
    run_schedule_mrv1,
    run_schedule_mrv2,
    slot_mapping_mrv1,
    slot_mappings_mrv2,
)
from reference.errors import ConfigError
from suites.strategies import schedules

REPO = Path(__file__).resolve().parents[2]

# note §7.3: the batch both runner sketches use.
QSL = [0, 5, 8]
POSITIONS = [30, 31, 32, 33, 34, 0, 1, 2]


def test_module_imports_no_heavy_packages():
    code = (
        "import sys, reference.block_tables\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('vllm', 'torch', 'numpy'))\n"
        "assert not bad, bad\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# --------------------------------------------------------------------------- §1.1 widths


@pytest.mark.parametrize(
    "args, width",
    [((100, 16), 104), ((100, 48), 104), ((3, 128), 3), ((5, 16, None), 5)],
)
def test_block_table_width_examples(args, width):
    # note §1.1 [run]
    assert get_block_table_width(*args) == width


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2000), st.integers(1, 512), st.integers(1, 512))
def test_block_table_width_is_smallest_aligned_cover(n, block_size, align):
    w = get_block_table_width(n, block_size, align)
    step = align // math.gcd(align, block_size)
    assert w >= n
    assert w % step == 0
    assert (w * block_size) % align == 0  # a row spans a whole number of alignment units
    assert w - step < n or w == 0


@pytest.mark.parametrize(
    "args, needle",
    [((100, 0), "block size 0"), ((-1, 16), "max_num_blocks -1"), ((10, 16, 0), "token_alignment 0"),
     ((10.5, 16), "10.5"), ((True, 16), "True")],
)
def test_block_table_width_rejects_bad_inputs(args, needle):
    with pytest.raises(ConfigError, match=needle):
        get_block_table_width(*args)


def test_multigroup_widths_align_only_token_groups():
    # note §2.1 [run]: MultiGroupBlockTable(..., [16,64], [10,3], modes=[TOKEN, NONE]) -> [16, 3]
    t = MRv1MultiGroupBlockTable(4, 64, [16, 64], [10, 3], slot_mapping_modes=["token", "none"])
    assert t.widths == [16, 3]
    assert [m.value for m in t.slot_mapping_modes] == ["token", "none"]


# --------------------------------------------------------------------------- §2.1 MRv1 rows


def _table(width=8, rows=4):
    return MRv1BlockTable(16, rows, width, 64)


def test_add_row_does_not_zero_the_tail():
    t = _table()
    t.add_row([1, 2, 3], 0)
    t.add_row([4], 0)
    assert t.row(0) == [4, 2, 3, 0, 0, 0, 0, 0]
    assert t.valid(0) == [4]


def test_clear_row_zeroes_only_the_counted_prefix():
    t = _table()
    t.add_row([1, 2, 3], 0)
    t.add_row([4], 0)
    t.clear_row(0)
    assert t.row(0) == [0, 2, 3, 0, 0, 0, 0, 0]
    assert t.num_blocks(0) == 0


def test_move_row_copies_prefix_keeps_target_tail_and_zeroes_source():
    t = _table()
    t.add_row([7, 8, 9, 10, 11], 1)
    t.add_row([1, 2, 3], 0)
    t.move_row(0, 1)
    assert t.row(1) == [1, 2, 3, 10, 11, 0, 0, 0]
    assert t.num_blocks(1) == 3
    assert t.row(0) == [0] * 8
    assert t.num_blocks(0) == 0


def test_move_row_onto_itself_wipes_the_row_like_vllm():
    t = _table()
    t.add_row([1, 2], 2)
    t.move_row(2, 2)
    assert t.row(2) == [0] * 8 and t.num_blocks(2) == 0


def test_swap_row_swaps_whole_rows_and_counts():
    t = _table()
    t.add_row([1, 2, 3], 0)
    t.add_row([4], 0)  # row 0 = [4,2,3,...] with count 1
    t.add_row([5, 6], 3)
    t.swap_row(0, 3)
    assert t.row(3) == [4, 2, 3, 0, 0, 0, 0, 0] and t.num_blocks(3) == 1
    assert t.row(0) == [5, 6, 0, 0, 0, 0, 0, 0] and t.num_blocks(0) == 2


def test_append_row_and_clear():
    t = _table()
    t.append_row([], 0)
    assert t.num_blocks(0) == 0
    t.append_row([5], 0)
    t.append_row([6, 7], 0)
    assert t.valid(0) == [5, 6, 7]
    t.clear()
    assert t.row(0) == [0] * 8 and t.num_blocks(0) == 3  # BlockTable.clear leaves counts


def test_mrv1_overflow_messages_name_the_values():
    t = _table()
    with pytest.raises(ConfigError, match="^block id row of 9 blocks exceeds the table width 8 for group 0$"):
        t.add_row(list(range(9)), 0)
    t.add_row([1] * 6, 0)
    with pytest.raises(ConfigError, match="appending 3 block ids to row 0 holding 6 needs 9 columns.*width 8"):
        t.append_row([2, 3, 4], 0)
    assert t.valid(0) == [1] * 6  # nothing half-written


def test_multigroup_overflow_in_one_group_changes_no_group():
    t = MRv1MultiGroupBlockTable(2, 64, [16, 128], [8, 1], slot_mapping_modes=["token", "token"])
    assert t.widths == [8, 1]
    with pytest.raises(ConfigError, match="block id row of 2 blocks exceeds the table width 1 for group 1"):
        t.add_row(([1, 2], [3, 4]), 0)
    assert t[0].row(0) == [0] * 8
    with pytest.raises(ConfigError, match="block ids for 1 groups at row 0; expected 2 groups"):
        t.append_row(([1],), 0)


@pytest.mark.parametrize(
    "call, needle",
    [
        (lambda t: t.add_row([1, -3], 0), "block id in .* -3"),
        (lambda t: t.add_row([1], 4), "row index 4 is above 3"),
        (lambda t: t.move_row(0, -1), "target row index -1"),
        (lambda t: t.append_row("12", 0), "'12' is a string"),
        (lambda t: t.batch_rows(3, 2), "num_reqs_padded 2 is below 3"),
    ],
)
def test_mrv1_bad_inputs(call, needle):
    with pytest.raises(ConfigError, match=needle):
        call(_table())


def test_mrv1_rejects_unknown_mode_and_bad_dcp():
    with pytest.raises(ConfigError, match="slot mapping mode 'mamba' is unknown"):
        MRv1BlockTable(16, 4, 8, 64, slot_mapping_mode="mamba")
    with pytest.raises(ConfigError, match="DCP rank 2 is above 1"):
        MRv1BlockTable(16, 4, 8, 64, dcp_world_size=2, dcp_rank=2)
    with pytest.raises(ConfigError, match="cp_kv_cache_interleave_size 3 does not divide block size 16"):
        MRv1BlockTable(16, 4, 8, 64, dcp_world_size=2, cp_kv_cache_interleave_size=3)


def test_mrv1_batch_rows_null_the_padding_rows():
    # note §2.1 "_build_attention_metadata" step 2 / D9: blk[num_reqs:num_reqs_padded] = NULL_BLOCK_ID
    t = _table()
    t.add_row([5, 9], 0)
    t.add_row([3], 1)
    t.add_row([8, 8], 2)  # live in an earlier step, beyond num_reqs now
    assert t.batch_rows(2, 4) == [[5, 9, 0, 0, 0, 0, 0, 0], [3, 0, 0, 0, 0, 0, 0, 0], [0] * 8, [0] * 8]


# --------------------------------------------------------------------------- §2.1 MRv1 slots


def _sketch_table(**dcp):
    # note §7.3: BlockTable(16, 4, 8, 64, ...); add_row([5,9],0); append_row([11],0); add_row([3,4,7],1)
    t = MRv1BlockTable(16, 4, 8, 64, **dcp)
    t.add_row([5, 9], 0)
    t.append_row([11], 0)
    t.add_row([3, 4, 7], 1)
    return t


def test_mrv1_slot_mapping_example():
    t = _sketch_table()
    t.compute_slot_mapping(2, QSL, POSITIONS)
    assert t.slot_mapping[:10] == [158, 159, 176, 177, 178, 48, 49, 50, -1, -1]  # note §7.3 [run]
    assert t.slot_mapping[10:] == [PAD_SLOT_ID] * 54


@pytest.mark.parametrize(
    "interleave, expected",
    [(1, [-1, 95, -1, 144, -1, -1, 48, -1]), (4, [94, 95, -1, -1, -1, -1, -1, -1])],
)
def test_mrv1_slot_mapping_dcp_examples(interleave, expected):
    # note §7.3 [run]: dcp_world_size=2, dcp_rank=1
    t = _sketch_table(dcp_world_size=2, dcp_rank=1, cp_kv_cache_interleave_size=interleave)
    t.compute_slot_mapping(2, QSL, POSITIONS)
    assert t.slot_mapping[:8] == expected
    rows = [t.row(0), t.row(1)]
    assert slot_mapping_mrv1(rows, 16, QSL, POSITIONS, 8, 2, 1, interleave) == expected


def test_mrv1_none_mode_leaves_the_buffer_and_reads_old_padding():
    # D3: NONE returns before the kernel; real tokens read 0 or an earlier step's PAD fill.
    assert slot_mapping_mrv1([[1, 2]], 16, [0, 2], [0, 1], 8, mode="none") is None
    t = MRv1MultiGroupBlockTable(4, 16, [16, 16], [8, 8], slot_mapping_modes=["token", "none"])
    t.add_row(([5], [6]), 0)
    t.compute_slot_mapping(1, [0, 3], [0, 1, 2])
    step1 = t.get_slot_mappings(3, 5)
    assert step1 == [[80, 81, 82, -1, -1], [0, 0, 0, -1, -1]]
    t.compute_slot_mapping(1, [0, 5], [3, 4, 5, 6, 7])
    step2 = t.get_slot_mappings(5, 6)
    assert step2[0] == [83, 84, 85, 86, 87, -1]
    assert step2[1] == [0, 0, 0, -1, -1, -1]  # stale: PAD at real tokens 3 and 4


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(query_start_loc=[0, 5, 9]), "query_start_loc ends at 9 but there are 8 positions"),
        (dict(query_start_loc=[1, 5, 8]), "query_start_loc starts at 1"),
        (dict(query_start_loc=[0, 6, 5, 8]), "decreases at index 2"),
        (dict(max_num_batched_tokens=7), "8 tokens exceed max_num_batched_tokens 7"),
        (dict(positions=[30, 31, 32, 33, 34, 0, 1, 200]), "position 200 of request 1 needs block column 12"),
        (dict(positions=[30, 31, 32, 33, 34, 0, 1, -2]), "position -2 is below 0"),
        (dict(dcp_world_size=2, dcp_rank=1, interleave=32), "interleave_size 32 does not divide block size 16"),
        (dict(dcp_world_size=0), "DCP world size 0"),
    ],
)
def test_mrv1_slot_mapping_bad_inputs(kwargs, needle):
    args = dict(block_rows=[[5, 9, 11, 0, 0, 0, 0, 0], [3, 4, 7, 0, 0, 0, 0, 0]], block_size=16,
                query_start_loc=QSL, positions=POSITIONS, max_num_batched_tokens=64)
    args.update(kwargs)
    with pytest.raises(ConfigError, match=needle):
        slot_mapping_mrv1(**args)


# --------------------------------------------------------------------------- §2.2 MRv2


def _sketch_tables(**kw):
    # note §7.3: BlockTables([16, 32], 4, 64, [8, 4]) and its three append_block_ids calls
    bts = MRv2BlockTables([16, 32], 4, 64, [8, 4], **kw)
    bts.append_block_ids(2, ([5, 9], [1]), overwrite=True)
    bts.append_block_ids(2, ([11], [2]), overwrite=False)
    bts.append_block_ids(0, ([3, 4, 7], [6, 8]), overwrite=True)
    return bts


def test_mrv2_two_group_example():
    bts = _sketch_tables()
    g0, g1 = bts.gather([2, 0], 3)  # "rows: slot2, slot0, zeros"
    assert g0 == [[5, 9, 11, 0, 0, 0, 0, 0], [3, 4, 7, 0, 0, 0, 0, 0], [0] * 8]
    assert g1 == [[1, 2, 0, 0], [6, 8, 0, 0], [0] * 4]
    assert bts.compute_slot_mappings([2, 0], QSL, POSITIONS, 10) == [  # note §7.3 [run]
        [158, 159, 176, 177, 178, 48, 49, 50, -1, -1],
        [62, 63, 64, 65, 66, 192, 193, 194, -1, -1],
    ]


def test_mrv2_dummy_request_and_padding_from_actual_count():
    bts = _sketch_tables()
    # batch: slot 0 (2 tokens), a dummy request (1 token); 5 padded tokens, positions padded too.
    sm = bts.compute_slot_mappings([0, -1], [0, 2, 3], [0, 17, 5, 0, 0], 5)
    # group 0: 3*16+0, 4*16+1; group 1 (B=32): 6*32+0, 6*32+17
    assert sm == [[48, 65, -1, -1, -1], [192, 209, -1, -1, -1]]
    assert bts.dummy_slot_mappings(3) == [[-1] * 3, [-1] * 3]


def test_mrv2_disabled_group_is_all_pad_while_mrv1_computes_it():
    # D4: a CircularBufferSpec group has uses_slot_mapping=False in MRv2 only.
    bts = _sketch_tables(slot_mapping_enabled=[True, False])
    sm = bts.compute_slot_mappings([2, 0], QSL, POSITIONS, 10)
    assert sm[1] == [-1] * 10
    assert sm[0][:3] == [158, 159, 176]
    rows = [bts.persistent_row(1, 2), bts.persistent_row(1, 0)]
    assert slot_mapping_mrv1(rows, 32, QSL, POSITIONS, 10) == [62, 63, 64, 65, 66, 192, 193, 194, -1, -1]


def test_mrv2_mamba_group_gets_a_computed_slot_mapping():
    # D3: MRv2 computes bt[req, pos//B]*B + pos%B for Mamba (MambaSpec keeps uses_slot_mapping=True
    # and dcp_sharded=False), even under DCP; MRv1 leaves it unwritten (test above).
    bts = MRv2BlockTables([16, 64], 2, 32, [8, 3], cp_size=2, cp_rank=1, dcp_sharded=[True, False])
    bts.append_block_ids(1, ([5, 9], [2]), overwrite=True)
    sm = bts.compute_slot_mappings([1], [0, 4], [30, 31, 32, 33], 6)
    assert sm[1] == [2 * 64 + 30, 2 * 64 + 31, 2 * 64 + 32, 2 * 64 + 33, -1, -1]
    # group 0 is DCP-sharded: rank 1 holds odd positions; 31 -> block 5, local offset 15
    assert sm[0] == [-1, 95, -1, 144, -1, -1]


def test_mrv2_overflow_and_bad_inputs():
    bts = MRv2BlockTables([16], 4, 64, [8])
    bts.append_block_ids(0, ([1] * 6,), overwrite=True)
    with pytest.raises(ConfigError, match="3 block ids at column 6 for request slot 0 ends at 9, exceeding the row width 8 for group 0"):
        bts.append_block_ids(0, ([2, 3, 4],), overwrite=False)
    assert bts.valid(0, 0) == [1] * 6
    bts.append_block_ids(0, ([2, 3, 4, 5, 6, 7, 8, 9],), overwrite=True)  # overwrite restarts at 0
    assert bts.valid(0, 0) == [2, 3, 4, 5, 6, 7, 8, 9]
    with pytest.raises(ConfigError, match="request-state slot 4 is above 3"):
        bts.append_block_ids(4, ([1],), overwrite=True)
    with pytest.raises(ConfigError, match="block ids for 2 groups at request slot 0; expected 1"):
        bts.append_block_ids(0, ([1], [2]), overwrite=True)
    with pytest.raises(ConfigError, match="idx_mapping entry -1 is below 0"):
        bts.gather([-1], 1)
    with pytest.raises(ConfigError, match="num_reqs_padded 1 is below 2"):
        bts.gather([0, 1], 1)
    with pytest.raises(ConfigError, match="idx_mapping entry -2 is below -1"):
        bts.compute_slot_mappings([-2], [0, 1], [0], 1)
    with pytest.raises(ConfigError, match="num_tokens_padded 2 is below 3"):
        bts.compute_slot_mappings([0], [0, 3], [0, 1, 2], 2)
    with pytest.raises(ConfigError, match="position 200 of request slot 0 needs block column 12"):
        bts.compute_slot_mappings([0], [0, 1], [200], 1)
    with pytest.raises(ConfigError, match="interleave_size 3 does not divide block size 16"):
        MRv2BlockTables([16], 4, 64, [8], cp_size=2, cp_interleave=3)


def test_mrv2_gather_zeroes_padding_and_dirty_rows():
    # note §2.2 gather: batch row i < num_reqs gets [:n] only (columns >= n keep stale values);
    # rows from num_reqs up to max(num_reqs_padded, _num_dirty_rows) are zeroed.
    bts = MRv2BlockTables([16], 4, 64, [8])
    bts.append_block_ids(0, ([1, 2, 3, 4],), overwrite=True)
    bts.append_block_ids(1, ([5],), overwrite=True)
    bts.append_block_ids(2, ([6, 7],), overwrite=True)
    (first,) = bts.gather([0, 1, 2], 3)
    assert first == [[1, 2, 3, 4, 0, 0, 0, 0], [5, 0, 0, 0, 0, 0, 0, 0], [6, 7, 0, 0, 0, 0, 0, 0]]
    (second,) = bts.gather([1], 2)
    assert second == [[5, 2, 3, 4, 0, 0, 0, 0], [0] * 8]  # batch row 0 held slot 0: stale tail
    assert bts.input_block_tables[0][2] == [0] * 8  # the dirty row from the bigger batch


def test_sliding_window_nulling_example():
    # note §2.2 [run]: reach=20, B=16, first_pos=50 turns [5,9,11,12] into [0,9,11,12]
    bts = MRv2BlockTables([16], 4, 64, [8], sliding_window_reach=[20])
    bts.append_block_ids(0, ([5, 9, 11, 12],), overwrite=True)
    (rows,) = bts.gather([0], 1, num_computed_tokens=[50, 0, 0, 0])
    assert rows[0][:4] == [0, 9, 11, 12]
    # D8: MRv1 keeps the id; after expansion (R=2) MRv2's null becomes kernel blocks 0,1.
    assert expand_row(rows[0], 4, 2) == [0, 1, 18, 19, 22, 23, 24, 25]
    (plain,) = bts.gather([0], 1)  # without num_computed_tokens: no nulling
    assert plain[0][:4] == [5, 9, 11, 12]
    dcp = MRv2BlockTables([16], 4, 64, [8], cp_size=2, sliding_window_reach=[20])
    dcp.append_block_ids(0, ([5, 9, 11, 12],), overwrite=True)
    assert dcp.gather([0], 1, num_computed_tokens={0: 50})[0][0][:4] == [5, 9, 11, 12]  # cp_size > 1


def test_stale_tail_example():
    # note §2.2 [run] "Stale tails": slot 0 held [5,9,11,12], then overwritten with [7].
    bts = MRv2BlockTables([16], 4, 64, [8])
    bts.append_block_ids(0, ([5, 9, 11, 12],), overwrite=True)
    bts.gather([0], 1)  # a step ran with it, so batch row 0 of input_block_tables held it too
    bts.append_block_ids(0, ([7],), overwrite=True)
    assert bts.persistent_row(0, 0) == [7, 9, 11, 12, 0, 0, 0, 0]
    assert bts.num_blocks(0, 0) == 1
    (rows,) = bts.gather([0], 1)
    assert rows[0][:4] == [7, 9, 11, 12]
    assert bts.valid(0, 0) == [7]
    # "MRv1 would show [7,0,0,0,...]": remove (clear_row) then add_row.
    t = _table()
    t.add_row([5, 9, 11, 12], 0)
    t.clear_row(0)
    t.add_row([7], 0)
    assert t.row(0) == [7, 0, 0, 0, 0, 0, 0, 0]


# --------------------------------------------------------------------------- §1.4/§1.5 kernels


def test_kernel_expansion_example():
    # note §1.4 [run]: B=128, K=64 (R=2)
    assert map_to_kernel_block_table([[5, 9, 0, 0], [0, 0, 0, 0]], 2) == [
        [10, 11, 18, 19, 0, 1, 0, 1],
        [0, 1, 0, 1, 0, 1, 0, 1],
    ]
    assert expand_row([5, 9, 0, 0], 2, 2) == [10, 11, 18, 19]
    assert expand_row([5, 9], 2, 2, kernel_block_stride=3) == [15, 16, 27, 28]  # b*stride + j
    with pytest.raises(ConfigError, match="num_valid 5 is above 4"):
        expand_row([5, 9, 0, 0], 5, 2)


def test_kernel_slot_golden_and_errors():
    # B=128, K=64: slot 5*128+70 -> kernel block 5*2 + 70//64 = 11, offset 70%64 = 6
    assert kernel_slot(5 * 128 + 70, 128, 64) == (11, 6)
    assert check_slot_invariant(5, 70, 128, 64) == 710
    with pytest.raises(ConfigError, match="slot -1 is below 0"):
        kernel_slot(PAD_SLOT_ID, 128, 64)
    with pytest.raises(ConfigError, match="kernel block size 48 does not divide block size 128"):
        kernel_slot(3, 128, 48)
    with pytest.raises(ConfigError, match="offset 128 is above 127"):
        check_slot_invariant(1, 128, 128, 64)


def _divisors(n):
    return [k for k in range(1, n + 1) if n % k == 0]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 12), st.sampled_from([1, 16, 32, 48, 64, 128]), st.data())
def test_kernel_slot_is_a_bijection(num_blocks, block_size, data):
    K = data.draw(st.sampled_from(_divisors(block_size)))
    R = block_size // K
    seen = {}
    for b in range(num_blocks):
        for off in range(block_size):
            slot = check_slot_invariant(b, off, block_size, K)
            kb, koff = kernel_slot(slot, block_size, K)
            assert 0 <= kb < num_blocks * R and 0 <= koff < K
            assert kb in expand_row([b], 1, R)
            seen[(kb, koff)] = slot
            assert kb * K + koff == slot
    assert sorted(seen.values()) == list(range(num_blocks * block_size))
    assert len(seen) == num_blocks * block_size


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([16, 32, 64, 128]), st.data())
def test_slot_in_manager_units_equals_slot_in_kernel_units(block_size, data):
    K = data.draw(st.sampled_from(_divisors(block_size)))
    R = block_size // K
    n = data.draw(st.integers(1, 6))
    row = data.draw(st.lists(st.integers(0, 50), min_size=n, max_size=n)) + [0, 0]
    positions = data.draw(st.lists(st.integers(0, n * block_size - 1), min_size=1, max_size=12))
    slots = slot_mapping_mrv1([row], block_size, [0, len(positions)], positions, len(positions))
    kernel_row = expand_row(row, n, R)
    for p, s in zip(positions, slots):
        # what a kernel reading the kernel-id table at column p//K would address
        assert kernel_row[p // K] * K + p % K == s
        assert kernel_slot(s, block_size, K) == (kernel_row[p // K], p % K)


# --------------------------------------------------------------------------- slot properties


def _local_oracle(row, block_size, p, W, r, I):
    """DCP as round-robin shards of I tokens: rank (p//I)%W keeps local token (p//(I*W))*I + p%I."""
    if (p // I) % W != r:
        return PAD_SLOT_ID
    lp = (p // (I * W)) * I + p % I
    return row[lp // block_size] * block_size + lp % block_size


@settings(max_examples=80, deadline=None)
@given(st.sampled_from([16, 32, 64]), st.sampled_from([1, 2, 3, 4]), st.sampled_from([1, 2, 4, 8, 16]), st.data())
def test_mrv1_dcp_matches_round_robin_oracle_and_each_token_has_one_owner(block_size, W, I, data):
    n = data.draw(st.integers(1, 4))
    row = data.draw(st.lists(st.integers(0, 30), min_size=n, max_size=n))
    positions = data.draw(st.lists(st.integers(0, n * block_size * W - 1), min_size=1, max_size=10))
    by_rank = [slot_mapping_mrv1([row], block_size, [0, len(positions)], positions, len(positions) + 2, W, r, I)
               for r in range(W)]
    for r, slots in enumerate(by_rank):
        assert slots[len(positions):] == [PAD_SLOT_ID, PAD_SLOT_ID]
        assert slots[: len(positions)] == [_local_oracle(row, block_size, p, W, r, I) for p in positions]
    for t in range(len(positions)):
        assert sum(s[t] != PAD_SLOT_ID for s in by_rank) == 1


# --------------------------------------------------------------------------- D15 drafts


def test_draft_step_past_max_model_len_differs_between_runners():
    # note §4.3 / D15: MRv1 pads when pos+1 >= max_model_len and resets position/seq_len to 0/1;
    # MRv2 clamps pos to max_model_len-1 and seq_len to max_model_len (the slot is written).
    assert draft_step_mrv1(6, 7, 10) == DraftStep(7, 8, False)
    assert draft_step_mrv2(6, 7, 10) == DraftStep(7, 8, False)
    assert draft_step_mrv1(9, 10, 10) == DraftStep(0, 1, True)
    assert draft_step_mrv2(9, 10, 10) == DraftStep(9, 10, False)
    with pytest.raises(ConfigError, match="max_model_len 0 is below 1"):
        draft_step_mrv2(1, 1, 0)


# --------------------------------------------------------------------------- schedules


def _blocks(bs):
    return tuple(tuple(x) for x in bs)


def test_schedule_example_with_preemption_and_condense():
    sched = [
        Add("a", [[5, 9]]),  # MRv1 row 0; MRv2 slot 3 (RequestState pops the last free slot)
        Add("b", [[3]]),  # row 1 / slot 2
        Append("a", [[11]]),
        Preempt("a"),  # frees MRv1 row 0 / MRv2 slot 3 without clearing MRv2's row
        Add("c", [[8]]),  # takes row 0 / slot 3 (the slot freed last)
        Add("a", [[7]]),  # resumed with fresh blocks: row 2 / slot 1
        Remove("b"),
        Move(2, 1),  # condense: last row into the hole
        Swap(0, 1),
    ]
    r1 = run_schedule_mrv1(sched, [16], [8], 4)
    r2 = run_schedule_mrv2(sched, [16], [8], 4)
    expected = {"a": ((7,),), "c": ((8,),)}
    assert r1.blocks == expected and r2.blocks == expected
    assert r1.locations == {"a": 0, "c": 1}
    assert r2.locations == {"c": 3, "a": 1}
    assert r2.tables.persistent_row(0, 3)[:3] == [8, 9, 11]  # stale tail of preempted "a"
    assert r1.tables[0].row(1) == [8, 0, 0, 0, 0, 0, 0, 0]


@pytest.mark.parametrize(
    "sched, needle",
    [
        ([Add("a", [[1]]), Add("a", [[2]])], "Add of request 'a' which is already live"),
        ([Add("a", [[1]]), Remove("a"), Add("a", [[2]])], "request 'a' which already finished"),
        ([Append("x", [[1]])], "Append of request 'x' which is not live"),
        ([Preempt("x")], "Preempt of request 'x' which is not live"),
        ([Add("a", [[1]]), Add("b", [[1]]), Move(0, 1)], "Move to row 1 which holds live request 'b'"),
        ([Move(0, 1)], "Move from row 0 which holds no live request"),
        ([Add("a", [[1], [2]])], "has block ids for 2 groups; expected 1"),
        ([Add(i, [[1]]) for i in range(3)], "Add of request 2 with 2 live requests; expected at most 2"),
        ([Add("a", [list(range(9))])], "block id row of 9 blocks exceeds the table width 8"),
    ],
)
def test_invalid_schedules_raise_config_error(sched, needle):
    with pytest.raises(ConfigError, match=needle):
        run_schedule_mrv1(sched, [16], [8], 2)


def test_mrv2_schedule_overflow_names_the_value():
    with pytest.raises(ConfigError, match="ends at 9, exceeding the row width 8 for group 0"):
        run_schedule_mrv2([Add("a", [[1] * 5]), Append("a", [[2] * 4])], [16], [8], 2)


def test_failed_add_leaves_the_request_out():
    state = MRv1ScheduleState(MRv1MultiGroupBlockTable(2, 16, [16], [8]))
    with pytest.raises(ConfigError):
        state.apply(Add("a", [list(range(9))]))
    state.apply(Add("a", [[1]]))  # not "already live"
    assert state.result().blocks == {"a": ((1,),)}
    state2 = MRv2ScheduleState(MRv2BlockTables([16], 2, 16, [8]))
    with pytest.raises(ConfigError, match="schedule op 'oops' is unknown"):
        state2.apply("oops")  # type: ignore[arg-type]


# groups: (block size, max_num_blocks, MRv1 mode); MRv2 aligns a Mamba group with None as well.
GROUPS = [(16, 5, "token"), (32, 3, "token"), (64, 2, "none")]


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_runners_agree_on_logical_blocks_after_random_schedules(data):
    groups = data.draw(st.lists(st.sampled_from(GROUPS), min_size=1, max_size=3))
    sizes, maxb, modes = [g[0] for g in groups], [g[1] for g in groups], [g[2] for g in groups]
    aligns = [128 if m == "token" else None for m in modes]
    widths = [get_block_table_width(m, b, a) for m, b, a in zip(maxb, sizes, aligns)]
    max_num_reqs = data.draw(st.integers(1, 5))
    ops, expected, rows = data.draw(schedules(widths, max_num_reqs))

    r1 = run_schedule_mrv1(ops, sizes, maxb, max_num_reqs, slot_mapping_modes=modes)
    r2 = run_schedule_mrv2(ops, sizes, maxb, max_num_reqs, token_alignments=aligns)
    assert r1.blocks == expected
    assert r2.blocks == expected
    assert r1.locations == rows

    # D7: MRv1 rows stay zero-tailed, and free rows are all zero.
    for g, t in enumerate(r1.tables.tables):
        for i in range(max_num_reqs):
            assert t.row(i)[t.num_blocks(i):] == [0] * (t.width - t.num_blocks(i))
            if i not in rows.values():
                assert t.num_blocks(i) == 0

    # MRv2 gather in MRv1 batch order: [:n] agrees, padded rows are zero, sliding-window
    # nulling only zeroes a prefix of [:n].
    batch = sorted(expected, key=rows.__getitem__)
    idx = [r2.locations[req] for req in batch]
    padded = data.draw(st.integers(len(batch), max_num_reqs))
    computed = data.draw(st.lists(st.integers(0, 400), min_size=max_num_reqs, max_size=max_num_reqs))
    reach = data.draw(st.lists(st.integers(0, 100), min_size=len(sizes), max_size=len(sizes)))
    gathered = r2.tables.gather(idx, padded, num_computed_tokens=computed, sliding_window_reach=reach)
    for g, out in enumerate(gathered):
        assert len(out) == padded
        for i, req in enumerate(batch):
            logical = list(expected[req][g])
            n_null = max(computed[idx[i]] - reach[g], 0) // sizes[g] if reach[g] else 0
            want = [0] * min(n_null, len(logical)) + logical[n_null:]
            assert out[i][: len(logical)] == want
        for i in range(len(batch), padded):
            assert out[i] == [0] * widths[g]
    # D9 in MRv1: the first num_reqs rows as stored, the padding rows null.
    for g, grp in enumerate(r1.tables.batch_rows(len(batch), padded)):
        assert grp[: len(batch)] == [r1.tables[g].row(i) for i in range(len(batch))]
        assert all(row == [0] * widths[g] for row in grp[len(batch):])


@settings(max_examples=100, deadline=None)
@given(st.data(), st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 4, 8]))
def test_runners_agree_on_slot_mappings_with_dcp(data, W, I):
    # note §2.2 [run]: W in {1,2,4}, I in {1,2,4,8}, two groups with B = 16 and 32.
    sizes, maxb, pool = [16, 32], [6, 3], 48
    rank = data.draw(st.integers(0, W - 1))
    max_num_reqs = 4
    widths = [get_block_table_width(m, b) for m, b in zip(maxb, sizes)]
    ops, expected, rows = data.draw(schedules(widths, max_num_reqs, pool=pool, max_ops=20))
    r1 = run_schedule_mrv1(ops, sizes, maxb, max_num_reqs)
    r2 = run_schedule_mrv2(ops, sizes, maxb, max_num_reqs)

    batch = sorted(expected, key=rows.__getitem__)
    qsl, positions = [0], []
    for req in batch:
        cap = min(len(ids) * b * W for ids, b in zip(expected[req], sizes))  # stay inside [:n]
        count = 0
        if cap:
            start = data.draw(st.integers(0, cap - 1))
            count = data.draw(st.integers(0, min(8, cap - start)))
            positions += list(range(start, start + count))
        qsl.append(qsl[-1] + count)
    max_tokens = 40
    padded = data.draw(st.integers(len(positions), max_tokens))

    persistent = [[r2.tables.persistent_row(g, s) for s in range(max_num_reqs)] for g in range(len(sizes))]
    idx = [r2.locations[req] for req in batch]
    v2 = slot_mappings_mrv2(persistent, sizes, idx, qsl, positions + [0] * (padded - len(positions)), padded,
                            max_tokens, cp_size=W, cp_rank=rank, cp_interleave=I)
    for g, B in enumerate(sizes):
        block_rows = [r1.tables[g].row(r1.locations[req]) for req in batch]
        v1 = slot_mapping_mrv1(block_rows, B, qsl, positions, max_tokens, W, rank, I)
        assert v1[:padded] == v2[g]
        assert all(s == PAD_SLOT_ID for s in v1[len(positions):])
        assert all(s == PAD_SLOT_ID or 0 <= s < pool * B for s in v1)
