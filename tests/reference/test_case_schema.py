"""The one case schema (``reference.case_schema``) against the files it is published in,
the strategy's configs, and ``CaseConfig``'s own validation."""

from __future__ import annotations

import copy
import json

import pytest

from conformance.report_formats import load_schema, validate, validate_case
from reference.case_schema import CASE_SCHEMA_PATH, case_schema, case_schema_document
from reference.config import MAX_BLOCKS, MAX_BYTES, MAX_HEAD_SIZE, MAX_HEADS, MAX_TOKENS, CaseConfig
from reference.errors import ConfigError
from suites.named_cases import CASES
from suites.strategies import sample_cases

REGENERATE = "regenerate with: python -m reference.case_schema --write"


def test_the_published_case_schema_is_the_generated_one() -> None:
    assert json.loads(CASE_SCHEMA_PATH.read_text()) == case_schema_document(), REGENERATE


def test_the_report_schema_config_is_the_case_schema() -> None:
    config = load_schema()["properties"]["results"]["items"]["properties"]["config"]
    assert config == case_schema(), REGENERATE


def test_every_named_and_seeded_case_is_valid_under_the_schema() -> None:
    for case in [*CASES.values(), *sample_cases(7, 300)]:
        data = json.loads(case.to_json())  # as a case file or a report stores it
        assert validate_case(data) == [], (case.name, validate_case(data)[:3])
        assert CaseConfig.from_dict(data) == case


BASE = {"name": "c", "layers": [{"name": "l0"}], "block_size": 16, "num_blocks": 8}

BAD_VALUES = [
    # (where, value): one field wrong, everything else valid
    ("block_size", True),
    ("block_size", 0),
    ("block_size", MAX_TOKENS + 1),
    ("block_size", 16.0),
    ("block_size", "16"),
    ("num_blocks", 0),
    ("num_blocks", MAX_BLOCKS + 1),
    ("kv_cache_memory_bytes", MAX_BYTES + 1),
    ("max_model_len", -1),
    ("mamba_block_size", 0),
    ("model_dtype", "float8"),
    ("connector", "nixl2"),
    ("generation", 3),
    ("tensor_parallel_size", 0),
    ("decode_context_parallel_size", False),
    ("prefill_context_parallel_size", 0),
    ("disable_hybrid_kv_cache_manager", 1),
    ("name", ""),
    ("vllm_version", ""),
    ("layers", []),
    ("surprise", 1),
    ("layers.0.head_size", 0),
    ("layers.0.head_size", MAX_HEAD_SIZE + 1),
    ("layers.0.num_kv_heads", MAX_HEADS + 1),
    ("layers.0.head_size_v", 0),
    ("layers.0.sliding_window", 0),
    ("layers.0.sink_len", -1),
    ("layers.0.kind", "fulll"),
    ("layers.0.cache_dtype", "fp9"),
    ("layers.0.is_draft", "yes"),
    ("layers.0.name", ""),
    ("layers.0.mamba_shapes", [[0, 4]]),
    ("layers.0.backend", ""),
    ("layers.0.extra", True),
]


def _with(where: str, value):
    data = copy.deepcopy(BASE)
    node, *path = where.split(".")
    target = data
    keys = [node, *path]
    for key in keys[:-1]:
        target = target[int(key)] if isinstance(target, list) else target[key]
    last = keys[-1]
    target[last] = value
    return data


@pytest.mark.parametrize("where, value", BAD_VALUES, ids=[f"{w}={v!r}" for w, v in BAD_VALUES])
def test_the_schema_and_caseconfig_reject_the_same_bad_value(where: str, value) -> None:
    data = _with(where, value)
    errors = validate_case(data)
    assert errors, f"the schema accepts {where}={value!r}"
    field = where.split(".")[-1]
    assert field in errors[0] or field == "surprise" or "unexpected key" in errors[0], errors
    with pytest.raises(ConfigError):
        CaseConfig.from_dict(data)


def test_the_base_case_is_valid_for_both() -> None:
    assert validate_case(BASE) == []
    CaseConfig.from_dict(BASE)


def test_schema_errors_name_the_value_and_what_was_expected() -> None:
    (error,) = validate_case(_with("block_size", MAX_TOKENS + 1))
    assert error == f"$.block_size: {MAX_TOKENS + 1} is more than the maximum {MAX_TOKENS}"
    (error,) = validate(True, {"type": "integer"})
    assert error == "$: true is a boolean, expected integer"
