"""Properties every generation-2 derivation must satisfy, over random valid cases."""

from __future__ import annotations

import json

import pytest
from hypothesis import assume, given, note

from reference.config import CaseConfig
from reference.derive import Derivation, derive
from reference.errors import NotModeledError, StartupError
from reference.specs import MambaSpec
from suites.strategies import cases


def _derive_or_skip(case: CaseConfig, runner: str = "mrv1") -> Derivation:
    note(f"case: {case.to_json()}")
    try:
        return derive(case, runner)
    except (StartupError, NotModeledError):
        # vLLM refuses (or we do not model) this combination: other tests pin those errors.
        assume(False)
        raise AssertionError("unreachable")


def _intervals(regions) -> list[tuple[int, int]]:
    return sorted(run for region in regions for run in region.runs())


def _assert_disjoint(intervals: list[tuple[int, int]], what: str) -> None:
    for (a0, a1), (b0, b1) in zip(intervals, intervals[1:]):
        assert a1 <= b0, f"{what}: [{a0}, {a1}) overlaps [{b0}, {b1})"


@given(cases())
def test_views_stay_inside_the_pool(case: CaseConfig) -> None:
    d = _derive_or_skip(case)
    for view in d.registered.values():
        assert view.byte_offset >= 0
        assert view.max_byte() <= view.storage_nbytes, f"{view.name} reaches past the pool"


@given(cases())
def test_blocks_of_one_group_never_overlap(case: CaseConfig) -> None:
    # Groups alias the pool from byte 0 by design (a block id belongs to one group at a
    # time); within a group, distinct (layer, block) pairs must own distinct bytes.
    d = _derive_or_skip(case)
    for gid, group in enumerate(d.groups):
        pages = [d.block_bytes(layer, b).page for layer in group.layer_names for b in range(d.num_blocks)]
        _assert_disjoint(_intervals(pages), f"group {gid}")


@given(cases())
def test_k_and_v_are_disjoint_parts_of_their_page(case: CaseConfig) -> None:
    d = _derive_or_skip(case)
    for layer in d.registered:
        block = d.block_bytes(layer, d.num_blocks - 1)
        page = set(_intervals([block.page]))
        lo, hi = block.page.span()
        parts = [block.k] + ([block.v] if block.v is not None else [])
        _assert_disjoint(_intervals(parts), f"{layer} K/V")
        for part in parts:
            p_lo, p_hi = part.span()
            assert lo <= p_lo and p_hi <= hi
        assert sum(p.nbytes for p in parts) <= block.page.nbytes
        assert page  # the page itself is non-empty


@given(cases())
def test_every_token_slot_lands_in_its_logical_block(case: CaseConfig) -> None:
    # slot = b*B + off in manager units; the kernel view indexes (slot // K, :, slot % K). A spec storing
    # one state per tokens_per_state tokens (pooled keys) counts its slots in states.
    d = _derive_or_skip(case)
    for layer, view in d.registered.items():
        spec = d.specs[layer]
        if isinstance(spec, MambaSpec):
            continue
        gid = view.group_id
        per_state = getattr(spec, "tokens_per_state", 1) or 1
        block_size, kbs = d.groups[gid].spec.block_size // per_state, d.kernel_block_sizes[gid] // per_state
        es = view.element_size
        for slot in {0, block_size - 1, d.num_blocks * block_size - 1}:
            kernel_block, offset = divmod(slot, kbs)
            element = view.storage_offset + kernel_block * view.stride[0] + offset * view.stride[2]
            address = element * es
            block = d.block_bytes(layer, slot // block_size)
            assert any(start <= address < stop for start, stop in block.page.runs()), (layer, slot)


@given(cases())
def test_runners_register_the_same_tensors_without_backend_overrides(case: CaseConfig) -> None:
    # Without --attention-backend the draft backend is the same in both runners, and
    # both call allocate_kv_cache with the same inputs (vllm-blocktables-runners.md 3.4).
    # With it, MRv2's draft inherits the target's backend and MRv1's does not (D1).
    assume(case.attention_backend is None)
    v1 = _derive_or_skip(case, "mrv1")
    v2 = derive(case, "mrv2")
    assert v1.registered == v2.registered
    assert v1.kernel_block_sizes == v2.kernel_block_sizes


@given(cases())
def test_case_json_round_trips(case: CaseConfig) -> None:
    assert CaseConfig.from_json(case.to_json()) == case
    assert json.loads(case.to_json())["name"] == case.name


def test_explicit_backend_makes_mrv1_and_mrv2_drafts_differ() -> None:
    # D1: with --attention-backend FLASHINFER, MRv2's draft inherits it while MRv1 auto-selects
    # (here FLASH_ATTN): MLA target + draft at block 128 then differ in kernel block size?
    # No: FLASHMLA already forces 64. Use a dense target at block 128 instead.
    from reference.config import LayerConfig, uniform_layers

    layers = uniform_layers(2, backend="FLASHINFER", head_size=128) + (
        LayerConfig("draft.layers.2.attn", backend="FLASH_ATTN", head_size=128, is_draft=True),
    )
    case = CaseConfig("d1", layers, block_size=256, num_blocks=2, attention_backend="FLASHINFER")
    v1, v2 = derive(case, "mrv1"), derive(case, "mrv2")
    assert v1.layer_backends["draft.layers.2.attn"] == "FLASH_ATTN"
    assert v2.layer_backends["draft.layers.2.attn"] == "FLASHINFER"
    # The group's kernel block size is 64 either way (FlashInfer targets force it).
    assert v1.kernel_block_sizes == v2.kernel_block_sizes == (64,)


@pytest.mark.parametrize("runner", ["mrv1", "mrv2"])
def test_block_bytes_rejects_out_of_range_blocks(runner: str) -> None:
    from suites.named_cases import CASES
    from reference.errors import ConfigError

    d = derive(CASES["flashinfer-b16"], runner)
    with pytest.raises(ConfigError, match=r"block id 8 is outside \[0, 8\)"):
        d.block_bytes("model.layers.0.self_attn.attn", 8)
    with pytest.raises(ConfigError, match=r"layer 'nope' is not one of"):
        d.block_bytes("nope", 0)
