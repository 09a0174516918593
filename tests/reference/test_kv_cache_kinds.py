"""The table of vLLM 0.33.0's KV cache classes (``suites/kv_cache_kinds.py``) against the page it
is published in and the cases it names: a row cannot claim a kind, a named case or request
schedules that the project does not have."""

from __future__ import annotations

import pytest

from reference.block_tables.scenarios import case_groups
from reference.config import LAYER_KINDS, RUNNERS
from reference.derive import derive
from reference.errors import StartupError
from suites.kv_cache_kinds import DOC_PATH, DRIVEN, INVENTORY, render
from suites.named_cases import CASES

REGENERATE = "regenerate with: python -m suites.kv_cache_kinds --write"


def test_the_published_page_is_the_generated_one() -> None:
    assert DOC_PATH.read_text() == render() + "\n", REGENERATE


def test_rows_are_unique_and_well_formed() -> None:
    keys = [(c.path, c.name) for c in INVENTORY]
    assert len(keys) == len(set(keys)), sorted(k for k in keys if keys.count(k) > 1)
    for c in INVENTORY:
        assert c.role in ("spec", "layer"), c
        assert c.driven in DRIVEN, c
        if c.driven == "no":
            assert c.why, f"{c.name}: a class that is not driven says why"
        else:
            assert c.case_kind and c.named_case, f"{c.name}: a driven class names its case kind and a named case"


def test_every_case_kind_is_a_row_and_every_row_kind_a_case_kind() -> None:
    claimed = {c.case_kind for c in INVENTORY if c.case_kind}
    assert claimed <= set(LAYER_KINDS), claimed - set(LAYER_KINDS)
    assert set(LAYER_KINDS) <= claimed, f"kinds with no row: {sorted(set(LAYER_KINDS) - claimed)}"


@pytest.mark.parametrize("row", [c for c in INVENTORY if c.named_case], ids=lambda c: f"{c.name}@{c.path}")
def test_a_named_case_has_a_layer_of_its_kind_and_the_schedules_it_claims(row) -> None:
    case = CASES[row.named_case]
    assert row.case_kind in {layer.kind for layer in case.layers}, (row.named_case, row.case_kind)
    refusals = []
    for runner in RUNNERS:  # the first runner that starts it (MRv1 refuses a Step5 model)
        try:
            groups = case_groups(derive(case, runner))
            break
        except StartupError as exc:
            refusals.append(f"{runner}: {exc}")
    else:
        assert not row.schedules, f"{row.named_case} is refused ({'; '.join(refusals)}): it cannot claim schedules"
        return
    if row.schedules:
        assert not isinstance(groups, str), f"{row.named_case}: {groups}"
    else:
        # No schedules claimed: either the reference says why (a group kind no decoder schedule
        # fills), or the row's case is a refusal.
        assert isinstance(groups, str), f"{row.named_case} gets schedules: mark the row schedules=True"
