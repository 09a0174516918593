"""The contract (``conformance.checks.contract``) on hand-made observations: what every vLLM
must satisfy, judged without the reference or any release fact.

Each test builds the observation a correct vLLM would produce for a small pool, checks that
it holds, then breaks one thing and checks that exactly the matching kind is reported.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest

from conformance.checks.contract import CONTRACT_KINDS, KINDS, _own_slot, _runs, contract_divergences
from conformance.diff import KINDS as ALL_KINDS
from conformance.diff import compare
from gpu_impl.observation import GroupObs, ViewObs
from suites.named_cases import CASES

CASE = CASES["swa-hybrid-scaled"]


NUM_BLOCKS, HEADS, HEAD = 4, 2, 8
PAGE = HEADS * 16 * 2 * HEAD * 2  # (H, N=16, C=2*HEAD) bf16: one 16-token block of one layer
LAYER_STRIDE = NUM_BLOCKS * PAGE  # layers outermost (LBNHC)


def _view(layer: int, kernel: int = 16) -> ViewObs:
    """Layer ``layer``'s registered (B, H, N, C) view, LBNHC, split into ``kernel``-token blocks."""
    ratio = 16 // kernel
    content = 2 * HEAD
    return ViewObs((NUM_BLOCKS * ratio, HEADS, kernel, content), (kernel * HEADS * content, content, HEADS * content, 1),
                "bfloat16", layer * LAYER_STRIDE // 2, 2 * LAYER_STRIDE)


def _observation(**changes: Any) -> SimpleNamespace:
    """Two full-attention layers in one group and one allocation, as vLLM lays them out."""
    names = ("a", "b")
    base = dict(
        layout="LBNHC",
        groups=(GroupObs(names, 16, "FullAttentionSpec"),),
        num_blocks=NUM_BLOCKS,
        bytes_per_block=2 * PAGE,
        tensors=(SimpleNamespace(size=2 * LAYER_STRIDE, layers=names, layer_stride=LAYER_STRIDE, block_stride=PAGE, offset=0),),
        kernel_block_sizes=(16,),
        registered={"a": _view(0), "b": _view(1)},
        builder_kernel_block_sizes={"a": 16, "b": 16},
        page_bytes={"a": (PAGE, PAGE), "b": (PAGE, PAGE)},
        spec_dtypes={"a": "bfloat16", "b": "bfloat16"},
        supported_kernel_block_sizes={"a": ("*16",), "b": ("*16",)},
        storage_of={"a": 0, "b": 0},
        bound_views={"a": (_view(0),), "b": (_view(1),)},
        bound_outside_registered=(),
        schedules=(),
        error=None,
        unsupported=None,
    )
    base.update(changes)
    return SimpleNamespace(**base)


def _kinds(observation: SimpleNamespace, scenarios: tuple = ()) -> set[str]:
    return {d.kind for d in contract_divergences(CASE, "mrv1", observation, scenarios)}


def test_a_correct_layout_holds_the_contract() -> None:
    assert _kinds(_observation()) == set()


def test_every_contract_kind_is_a_comparator_kind_and_says_so() -> None:
    assert set(CONTRACT_KINDS) <= set(ALL_KINDS)
    assert all(kind.meaning.endswith("contract.") for kind in KINDS)


@pytest.mark.parametrize(
    ("change", "kind"),
    [
        (dict(registered={"a": _view(0), "b": dataclasses.replace(_view(1), storage_offset=_view(1).storage_offset + 1)}),
         "view_bounds"),
        (dict(registered={"a": _view(0), "b": dataclasses.replace(_view(1), shape=(NUM_BLOCKS + 1, HEADS, 16, 16))}),
         "kernel_blocks"),
        (dict(builder_kernel_block_sizes={"a": 16, "b": 8}), "kernel_blocks"),
        (dict(supported_kernel_block_sizes={"a": (32, 64), "b": ("*16",)}), "kernel_blocks"),
        (dict(spec_dtypes={"a": "bfloat16", "b": "float16"}), "view_dtype"),
        (dict(page_bytes={"a": (PAGE, PAGE), "b": (PAGE + 64, PAGE + 64)}), "page_bytes"),
        (dict(bytes_per_block=3 * PAGE), "pool_bytes"),
        (dict(bound_outside_registered=("b",)), "bound_storage"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_each_break_is_its_own_kind(change: dict, kind: str) -> None:
    assert kind in _kinds(_observation(**change))


def test_two_layers_of_one_group_on_the_same_bytes_overlap() -> None:
    same = {"a": _view(0), "b": _view(0)}
    assert "block_overlap" in _kinds(_observation(registered=same, bound_views={}))


def test_two_groups_may_share_a_block_id_but_not_two() -> None:
    """Hybrid groups overlay one another's pages: block b of one group on block b of the other."""
    groups = (GroupObs(("a",), 16, "FullAttentionSpec"), GroupObs(("b",), 16, "SlidingWindowSpec"))
    overlaid = {"a": _view(0), "b": _view(0)}
    pages = {"a": (PAGE, PAGE), "b": (PAGE, PAGE)}
    fine = _observation(groups=groups, kernel_block_sizes=(16, 16), registered=overlaid, bound_views={},
                        bytes_per_block=PAGE, page_bytes=pages)
    fine.registered = {"a": dataclasses.replace(_view(0), storage_nbytes=LAYER_STRIDE),
                       "b": dataclasses.replace(_view(0), storage_nbytes=LAYER_STRIDE)}
    assert _kinds(fine) == set()
    # Group b's block 1 on group a's block 0: two different blocks on the same bytes.
    roomy = {name: dataclasses.replace(view, storage_nbytes=LAYER_STRIDE + PAGE) for name, view in fine.registered.items()}
    shifted = dataclasses.replace(roomy["b"], storage_offset=PAGE // 2)
    broken = _observation(**{**fine.__dict__, "registered": {"a": roomy["a"], "b": shifted}})
    found = contract_divergences(CASE, "mrv1", broken)
    assert any(d.kind == "block_overlap" and "a[1]" in d.field and "b[0]" in d.field for d in found), [d.message for d in found]


def test_an_allocation_holds_exactly_its_blocks() -> None:
    bigger = {name: dataclasses.replace(view, storage_nbytes=view.storage_nbytes + PAGE) for name, view in _observation().registered.items()}
    assert {"allocation_size", "pool_bytes"} <= _kinds(_observation(registered=bigger, bound_views={}))


def test_a_bound_view_with_other_strides_is_caught() -> None:
    transposed = dataclasses.replace(_view(1), stride=(_view(1).stride[0], _view(1).stride[2], _view(1).stride[1], 1))
    assert _kinds(_observation(bound_views={"a": (_view(0),), "b": (transposed,)})) == {"bound_view"}


def test_a_cache_bound_in_kernel_blocks_may_run_its_builder_at_them() -> None:
    """vLLM 0.33's ``map_kv_cache_to_kernel_blocks``: a packed compressed cache stays registered in manager blocks
    (16 tokens here) while its layer is bound to a view of 8-token kernel blocks and its builder runs at 8. The
    backend's declared sizes are then judged at 8; a builder at 8 whose layer still computes with 16-token blocks is
    a divergence."""
    def halved(layer: int) -> ViewObs:
        view = _view(layer)
        return dataclasses.replace(view, shape=(view.shape[0] * 2, view.shape[1], 8, view.shape[3]))

    mapped = dict(builder_kernel_block_sizes={"a": 8, "b": 16}, supported_kernel_block_sizes={"a": (8,), "b": ("*16",)},
                  bound_views={"a": (halved(0),), "b": (_view(1),)})
    assert "kernel_blocks" not in _kinds(_observation(**mapped))
    assert "kernel_blocks" in _kinds(_observation(**dict(mapped, bound_views={"a": (_view(0),), "b": (_view(1),)})))


def test_view_order_follows_the_layout_name() -> None:
    v = _view(1)
    lbhnc = dataclasses.replace(v, stride=(v.stride[0], 16 * 16, 16, 1))  # heads before tokens
    assert "view_order" in _kinds(_observation(registered={"a": _view(0), "b": lbhnc}, bound_views={}))
    assert "view_order" not in _kinds(_observation(layout="LBHNC", registered={"a": dataclasses.replace(_view(0), stride=lbhnc.stride), "b": lbhnc}, bound_views={}))


def test_runs_merge_contiguous_dimensions_and_bound_their_count() -> None:
    assert _runs((4, 2, 16, 16), (512, 16, 32, 1), 10) == [(0, 2048)]
    assert _runs((2, 3), (10, 1), 10) == [(0, 3), (10, 13)]
    assert _runs((100, 100, 3), (1000, 10, 1), 50) is None


@pytest.mark.parametrize(
    ("position", "dcp", "slot"),
    [
        (0, (1, 0, 1), 7 * 16),
        (17, (1, 0, 1), 9 * 16 + 1),
        (1, (2, 0, 1), -1),  # rank 1 stores odd tokens
        (2, (2, 0, 1), 7 * 16 + 1),
        (33, (2, 1, 1), 9 * 16 + 0),  # virtual block 1 of 32 tokens; local offset 0 on rank 1
        (5, (2, 0, 4), -1),  # runs of 4 tokens: 4..7 on rank 1
    ],
)
def test_a_tokens_own_slot(position: int, dcp: tuple[int, int, int], slot: int) -> None:
    assert _own_slot([7, 9], position, 16, dcp) == slot


def test_a_token_past_its_rows_blocks_has_no_slot() -> None:
    assert _own_slot([7], 16, 16, (1, 0, 1)) is None


def _schedule(slots: list[int], rows: list[list[int]]) -> tuple[dict, dict]:
    scenario = {"name": "s", "dcp": [1, 0, 1], "groups": [{"kind": "attention", "block_size": 16}],
                "steps": [{"batch": [["r0", [0, 1, 16]]]}]}
    observed = {"name": "s", "steps": [{"blocks": {"r0": [[3, 5]]}, "locations": {"r0": 0},
                                        "kernel_tables": [{"group": 0, "owner": "runner", "layers": ["a", "b"], "rows": rows}],
                                        "slot_mappings": [slots]}]}
    return scenario, observed


def test_schedule_slots_and_kernel_tables() -> None:
    scenario, observed = _schedule([48, 49, 80], [[3, 5, 0]])
    assert _kinds(_observation(schedules=(observed,)), (scenario,)) == set()
    scenario, observed = _schedule([48, 50, 80], [[3, 5, 0]])
    assert _kinds(_observation(schedules=(observed,)), (scenario,)) == {"slot_address"}
    scenario, observed = _schedule([48, 49, 80], [[3, 6, 0]])
    assert _kinds(_observation(schedules=(observed,)), (scenario,)) == {"kernel_table"}


def test_split_kernel_tables_expand_by_the_views_ratio() -> None:
    """8-token kernel blocks of 16-token blocks: logical block b is kernel blocks 2b, 2b+1."""
    split = dict(kernel_block_sizes=(8,), registered={"a": _view(0, 8), "b": _view(1, 8)},
                 builder_kernel_block_sizes={"a": 8, "b": 8}, bound_views={"a": (_view(0, 8),), "b": (_view(1, 8),)},
                 supported_kernel_block_sizes={"a": ("*8",), "b": ("*8",)})
    assert _kinds(_observation(**split)) == set()
    scenario, observed = _schedule([48, 49, 80], [[6, 7, 10, 11]])
    assert _kinds(_observation(**split, schedules=(observed,)), (scenario,)) == set()
    scenario, observed = _schedule([48, 49, 80], [[3, 5, 0, 0]])
    assert _kinds(_observation(**split, schedules=(observed,)), (scenario,)) == {"kernel_table"}


def test_the_contract_alone_reports_a_refusal_without_judging_it() -> None:
    refused = _observation(error="ValueError: no", groups=())
    result = compare(CASE, "mrv1", refused, basis="contract")
    assert result.status == "refused" and result.detail == "ValueError: no" and not result.divergences


def test_an_unknown_basis_is_refused() -> None:
    with pytest.raises(ValueError, match="basis 'release'"):
        compare(CASE, "mrv1", _observation(), basis="release")


@pytest.mark.parametrize(("alignments", "blocks_of", "holds"), [
    ({"a": 3 * PAGE, "b": 1}, 3 * PAGE, True),   # 2 pages rounded up to the declared 3-page alignment
    ({"a": 3 * PAGE, "b": 1}, 2 * PAGE, False),  # not rounded up
    ({"a": PAGE, "b": PAGE}, 3 * PAGE, False),   # rounded up past what the alignment asks
    (None, 2 * PAGE, True),                      # a release whose specs declare no alignment (before 0.32)
])
def test_a_block_outermost_allocation_is_its_blocks_rounded_up_to_the_declared_alignment(alignments, blocks_of, holds) -> None:
    """``get_block_stride_alignment`` (0.32 on): a block-outermost block holds every layer's page of that block id,
    its stride a multiple of the alignment each layer's spec declares (Step5's DSA layers: an 8-token page)."""
    registered = {n: dataclasses.replace(_view(i), storage_nbytes=NUM_BLOCKS * blocks_of) for i, n in enumerate("ab")}
    observation = _observation(layout="BLNHC", stride_alignments=alignments, registered=registered, bound_views={})
    assert ("allocation_size" not in _kinds(observation)) is holds
