"""Expectations of known divergences: parsing, version ranges, matching, unused entries,
malformed files. Needs no vLLM: divergences are built by hand, or by diffing the reference
against a stand-in observation made from the reference itself."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from conformance.diff import KINDS, Divergence, compare, compare_runners, kinds_of
from conformance.expectations import (
    DEFAULT_PATH,
    CaseFacts,
    Environment,
    Expectation,
    ExpectationsError,
    VersionRange,
    case_facts,
    classify,
    load,
    loads,
    release,
)
from reference.derive import derive
from reference.errors import ConfigError
from conformance.derivation_summary import observed_groups
from suites.named_cases import CASES

FULL = """
schema = 1

[[expectation]]
id = "fi-split"
kind = "kernel_block_size"
case = "flashinfer-*"
field = "kernel_block_sizes"
backend = "FLASHINFER"
layout = "NHD"
runner = "mrv2"
vllm = ">=0.33,<0.34"
reason = "vllm/v1/worker/utils.py: prepare_kernel_block_sizes"
"""


def _div(kind: str = "kernel_block_size", case: str = "flashinfer-b128-k64", runner: str = "mrv2", field: str = "kernel_block_sizes") -> Divergence:
    return Divergence(kind, case, runner, field, [64], [128])


def _entry(**overrides) -> str:
    values = {"id": '"e1"', "kind": '"layout"', "reason": '"vllm/x.py"'} | overrides
    body = "\n".join(f"{k} = {v}" for k, v in values.items() if v is not None)
    return f"[[expectation]]\n{body}\n"


# --- the shipped file ----------------------------------------------------------------------------


def test_shipped_file_loads_and_every_reason_cites_vllm_source() -> None:
    entries = load()
    assert DEFAULT_PATH.name == "expectations.toml"
    for entry in entries:
        assert re.search(r"vllm/[\w/]+\.py", entry.reason), f"{entry.id}: the reason must cite the vLLM source file"
        assert entry.vllm is not None, f"{entry.id}: a known divergence is known for some vLLM versions only"


# --- parsing ---------------------------------------------------------------------------------------


def test_full_entry_parses() -> None:
    (entry,) = loads(FULL)
    assert entry == Expectation(
        id="fi-split",
        kind="kernel_block_size",
        reason="vllm/v1/worker/utils.py: prepare_kernel_block_sizes",
        case="flashinfer-*",
        field="kernel_block_sizes",
        backend="FLASHINFER",
        layout="LBNHC",  # the generation-1 NHD name, resolved
        runner="mrv2",
        vllm=VersionRange.parse(">=0.33,<0.34"),
    )
    assert "fi-split" in entry.describe() and "vllm=>=0.33,<0.34" in entry.describe()


def test_minimal_entry_defaults_and_empty_file() -> None:
    (entry,) = loads(_entry())
    assert (entry.case, entry.field, entry.backend, entry.layout, entry.runner, entry.vllm) == ("*", "*", None, None, None, None)
    assert loads("") == ()
    assert loads("schema = 1\n# only comments\n") == ()


def test_load_reads_a_path(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(FULL)
    assert [e.id for e in load(path)] == ["fi-split"]
    with pytest.raises(ExpectationsError, match=r"expectations file '.*missing.toml' does not exist"):
        load(tmp_path / "missing.toml")


# --- version ranges --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "version", "inside"),
    [
        (">=0.33,<0.34", "0.33.0", True),
        (">=0.33,<0.34", "0.33", True),
        (">=0.33,<0.34", "0.33.7", True),
        (">=0.33,<0.34", "0.33.1.dev12+g1a2b3c", True),
        (">=0.33,<0.34", "0.33.0+cu128", True),
        (">=0.33,<0.34", "0.34.0rc1", False),  # a pre-release already has 0.34's code
        (">=0.33,<0.34", "0.34.0", False),
        (">=0.33,<0.34", "0.32.9", False),
        (">=0.33, <0.34", "0.33.2", True),  # spaces are fine
        ("==0.33.0", "0.33", True),  # missing trailing components are zeros
        ("0.33.0", "0.33.0", True),  # a bare version is ==
        ("0.33.0", "0.33.1", False),
        ("!=0.33.1", "0.33.1", False),
        ("!=0.33.1", "0.33.2", True),
        ("==0.33.*", "0.33.9", True),
        ("==0.33.*", "0.34.0", False),
        ("==0.33.*", "0.33", True),
        ("!=0.21.*", "0.21.3", False),
        ("!=0.21.*", "0.33.0", True),
        (">0.21", "0.21.0", False),
        (">0.21", "0.21.1", True),
        ("<=0.28", "0.28.0", True),
        ("<=0.28", "0.28.1", False),
        (">=0.9", "0.10.0", True),  # numeric, not string, comparison
        ("<0.10", "0.9.5", True),
        (">=1", "0.99", False),
    ],
)
def test_version_ranges(spec: str, version: str, inside: bool) -> None:
    assert VersionRange.parse(spec).contains(version) is inside


def test_release_numbers() -> None:
    assert release("0.33.0") == (0, 33)
    assert release("v0.33.1.dev12+g1a2b") == (0, 33, 1)
    assert release("0.34.0rc1") == (0, 34)
    with pytest.raises(ValueError, match="'main' does not start with a release number"):
        release("main")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "version range '' is empty; expected e.g. '>=0.33,<0.34'"),
        ("~=0.33", "clause '~=0.33' is not OP VERSION"),
        (">=0.33,", "clause '' is not OP VERSION"),
        ("=>0.33", "clause '=>0.33' is not OP VERSION"),
        (">=0.33rc1", "clause '>=0.33rc1' is not OP VERSION"),
        (">=0.33.*", "clause '>=0.33.*': '.*' only goes with == or !="),
    ],
)
def test_malformed_version_ranges(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        VersionRange.parse(spec)


# --- malformed files -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[expectation]\nid = 1", "<expectations>: not valid TOML: "),
        ("schema = 2\n", "<expectations>: schema 2 is not 1, the only schema this kvconform reads"),
        ("expectations = []\n", "<expectations>: top-level key 'expectations' is not one of schema, expectation"),
        ("expectation = 3\n", "<expectations>: expectation 3 must be an array of tables ([[expectation]])"),
        ("expectation = [1]\n", "<expectations>: expectation 1: 1 is not a table; write each entry as [[expectation]]"),
        (_entry(kinds='"layout"'), "expectation 1: key 'kinds' is not one of id, kind, reason, case, field, observed, backend, layout, runner, options, without, vllm"),
        (_entry(reason=None), "expectation 1: required key 'reason' is missing (required: id, kind, reason)"),
        (_entry(id='"two words"'), "expectation 1: id 'two words' must be letters, digits, '.', '_' or '-'"),
        (_entry(id="7"), "expectation 1: id 7 must be a non-empty string"),
        (_entry(kind='"kernel_size"'), "expectation 1 (id 'e1'): kind 'kernel_size' is not one of startup_error, layout,"),
        (_entry(reason='"  "'), "expectation 1 (id 'e1'): reason '  ' must be a non-empty string"),
        (_entry(case="[1, 2]"), "expectation 1 (id 'e1'): case [1, 2] must be a non-empty string"),
        (_entry(backend='"FLASHINFERR"'), "expectation 1 (id 'e1'): backend 'FLASHINFERR' is not one of "),
        (_entry(layout='"LBNCH"'), "expectation 1 (id 'e1'): layout 'LBNCH' is not one of LBHNC, LBNHC, LHBNC, BLHNC, BLNHC, BHLNC, NHD, HND"),
        (_entry(layout='["BLHNC", "LBNCH"]'), "expectation 1 (id 'e1'): layout 'LBNCH' is not one of LBHNC, LBNHC, LHBNC, BLHNC, BLNHC, BHLNC, NHD, HND"),
        (_entry(layout='[]'), "expectation 1 (id 'e1'): layout [] must be a layout name or a non-empty list of them"),
        (_entry(layout='["BLHNC", 3]'), "expectation 1 (id 'e1'): layout ['BLHNC', 3] must be a layout name or a non-empty list of them"),
        (_entry(runner='"mrv3"'), "expectation 1 (id 'e1'): runner 'mrv3' is not one of mrv1, mrv2, mrv1/mrv2"),
        (
            _entry(kind='"mrv1_mrv2_mismatch"', runner='"mrv2"'),
            "expectation 1 (id 'e1'): runner 'mrv2': kind mrv1_mrv2_mismatch is always reported for runner 'mrv1/mrv2'",
        ),
        (_entry(vllm='">=0.33;<0.34"'), "expectation 1 (id 'e1'): vllm: version range '>=0.33;<0.34': clause '>=0.33;<0.34' is not OP VERSION"),
        (_entry(vllm="0.33"), "expectation 1 (id 'e1'): vllm: version range 0.33 must be a quoted string like '>=0.33,<0.34'"),
        (_entry() + _entry(), "expectation 2: id 'e1' is already used by expectation 1"),
    ],
)
def test_malformed_files_give_one_line(text: str, message: str) -> None:
    with pytest.raises(ExpectationsError) as info:
        loads(text)
    error = str(info.value)
    assert message in error, error
    assert "\n" not in error
    assert isinstance(info.value, ConfigError)  # the CLI turns ConfigError into a usage error


def test_malformed_file_error_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(_entry(kind='"nope"'))
    with pytest.raises(ExpectationsError, match=re.escape(f"{path}: expectation 1 (id 'e1'): kind 'nope'")):
        load(path)


# --- matching and classification ---------------------------------------------------------------


def _one(text: str) -> Expectation:
    (entry,) = loads(text)
    return entry


FI_FACTS = {"flashinfer-b128-k64": CaseFacts(frozenset({"FLASHINFER"}), frozenset({"LBNHC"}))}


@pytest.mark.parametrize(
    ("overrides", "divergence", "matches"),
    [
        ({}, _div(kind="layout"), True),
        ({}, _div(kind="kernel_block_size"), False),
        ({"kind": '"kernel_block_size"', "case": '"flashinfer-*"'}, _div(), True),
        ({"kind": '"kernel_block_size"', "case": '"dense-*"'}, _div(), False),
        ({"kind": '"kernel_block_size"', "field": '"kernel_*"'}, _div(), True),
        ({"kind": '"kernel_block_size"', "field": '"registered*"'}, _div(), False),
        ({"kind": '"kernel_block_size"', "runner": '"mrv2"'}, _div(), True),
        ({"kind": '"kernel_block_size"', "runner": '"mrv1"'}, _div(), False),
        ({"kind": '"kernel_block_size"', "backend": '"FLASHINFER"'}, _div(), True),
        ({"kind": '"kernel_block_size"', "backend": '"FLASH_ATTN"'}, _div(), False),
        ({"kind": '"kernel_block_size"', "layout": '"LBNHC"'}, _div(), True),
        ({"kind": '"kernel_block_size"', "layout": '"LBHNC"'}, _div(), False),
        # a list of layouts: the case's may be any of them
        ({"kind": '"kernel_block_size"', "layout": '["BLHNC", "LBNHC"]'}, _div(), True),
        ({"kind": '"kernel_block_size"', "layout": '["BLHNC", "LBHNC"]'}, _div(), False),
        ({"kind": '"kernel_block_size"', "backend": '"FLASHINFER"'}, _div(case="unknown-case"), False),  # no facts
        ({"kind": '"mrv1_mrv2_mismatch"', "runner": '"mrv1/mrv2"'}, _div(kind="mrv1_mrv2_mismatch", runner="mrv1/mrv2"), True),
        # observed: a glob on what vLLM showed (here [128]), e.g. one exception of vLLM's rather than any error
        ({"kind": '"kernel_block_size"', "observed": '"[[]128[]]"'}, _div(), True),
        ({"kind": '"kernel_block_size"', "observed": '"[[]64[]]"'}, _div(), False),
        ({"kind": '"startup_error"', "observed": '"ZeroDivisionError*"'},
         Divergence("startup_error", "c", "mrv1", "error reason", "No common block size", "ZeroDivisionError: division by zero"), True),
        ({"kind": '"startup_error"', "observed": '"ZeroDivisionError*"'},
         Divergence("startup_error", "c", "mrv1", "error reason", "No common block size", "ValueError: something else"), False),
    ],
)
def test_matching(overrides: dict[str, str], divergence: Divergence, matches: bool) -> None:
    entry = _one(_entry(**overrides))
    assert entry.matches(divergence, FI_FACTS.get(divergence.case)) is matches


def test_version_scoping() -> None:
    entry = _one(_entry(vllm='">=0.33,<0.34"'))
    assert entry.applies_to("0.33.0")
    assert not entry.applies_to("0.21.0")
    assert not entry.applies_to(None)  # unknown vLLM: a ranged entry cannot hold
    assert not entry.applies_to("nightly")
    assert _one(_entry()).applies_to(None)


def test_classify_splits_expected_unexpected_and_unused() -> None:
    entries = loads(
        _entry(id='"fi"', kind='"kernel_block_size"', case='"flashinfer-*"', vllm='">=0.33,<0.34"')
        + _entry(id='"fi-again"', kind='"kernel_block_size"', case='"flashinfer-*"')  # shadowed by "fi"
        + _entry(id='"stale"', kind='"registered_stride"')
        + _entry(id='"old-vllm"', kind='"registered_stride"', vllm='"<0.30"')
        + _entry(id='"other-cases"', kind='"registered_stride"', case='"mla-*"')
    )
    known = _div()
    surprise = _div(kind="layout", field="layout")
    env = Environment("0.33.0", FI_FACTS)
    expected, unexpected, unused = classify([known, surprise], env, entries)
    assert [(m.divergence, m.expectation.id) for m in expected] == [(known, "fi")]
    assert expected[0].message.endswith("[expected: fi]")
    assert unexpected == (surprise,)
    # "old-vllm" is not in force for 0.33.0 and "other-cases" is scoped to cases that did
    # not run: neither is stale. "fi-again" only ever matches what "fi" already took.
    assert [e.id for e in unused] == ["fi-again", "stale"]


def test_classify_environment_forms() -> None:
    entries = loads(_entry(kind='"kernel_block_size"', vllm='"==0.33.*"'))
    # The report's environment dict works as is.
    assert classify([_div()], {"vllm": "0.33.0", "python": "3.11"}, entries).unexpected == ()
    assert classify([_div()], {"vllm": "0.28.0"}, entries).unexpected == (_div(),)
    # Without a version, a ranged entry is not in force, and not reported unused either.
    result = classify([_div()], None, entries)
    assert (result.expected, result.unused) == ((), ())
    # Unknown cases (no facts) still match entries without backend/layout; with no
    # cases named, every entry in force may be unused.
    assert classify([], Environment("0.33.0"), entries).unused == entries


def test_classify_defaults_to_the_shipped_file() -> None:
    result = classify([_div(kind="layout", field="layout", case="zz-not-a-case")], Environment("0.33.0"))
    assert len(result.unexpected) == 1


def test_case_facts() -> None:
    case = CASES["mla-flashinfer-draft-mooncake"]
    facts = case_facts(case)
    assert facts.backends == {"FLASHMLA", "FLASHINFER"} and facts.layouts == frozenset()
    obs = SimpleNamespace(layer_backends={"x": "TRITON_ATTN"}, layout="LBNHC")
    widened = case_facts(case.with_(layout="HND"), [obs, None])
    assert widened.backends == {"FLASHMLA", "FLASHINFER", "TRITON_ATTN"}
    assert widened.layouts == {"LBHNC", "LBNHC"}


# --- the divergences being classified (diff engine, no vLLM) ------------------------------------


def _stand_in(case_name: str, runner: str = "mrv1", **changes) -> SimpleNamespace:
    """An observation with the reference's own answers (what a conformant vLLM shows)."""
    d = derive(CASES[case_name], runner)
    obs = SimpleNamespace(
        unsupported=None,
        error=None,
        layer_backends=dict(d.layer_backends),
        layout=d.layout.name,
        groups=observed_groups(d.groups),
        num_blocks=d.num_blocks,
        bytes_per_block=d.plan.bytes_per_block,
        tensors=list(d.plan.tensors),
        kernel_block_sizes=tuple(d.kernel_block_sizes),
        builder_kernel_block_sizes=dict(d.builder_kernel_block_sizes),
        cache_block_size=d.cache_block_size,
        registered={
            n: SimpleNamespace(shape=tuple(v.shape), stride=tuple(v.stride), dtype=v.dtype, storage_offset=v.storage_offset, storage_nbytes=v.storage_nbytes)
            for n, v in d.registered.items()
        },
        bound_shapes={},
    )
    for key, value in changes.items():
        setattr(obs, key, value)
    return obs


def test_reference_against_itself_is_clean_and_kinds_are_named() -> None:
    case = CASES["mla-gqa-draft-b128-k64"]
    assert compare(case, "mrv1", _stand_in(case.name)).status == "pass"
    draft = "draft.layers.2.attn"
    builders = dict(_stand_in(case.name).builder_kernel_block_sizes) | {draft: 128}
    result = compare(case, "mrv1", _stand_in(case.name, builder_kernel_block_sizes=builders, layout="LBHNC"))
    # The facts name the draft's builder; the contract sees the same builder off its views.
    assert kinds_of(result.divergences) == {"draft_kernel_block_size", "layout", "kernel_blocks"}
    assert {d.kind for d in result.divergences if d.basis == "contract"} == {"kernel_blocks"}
    message = next(d for d in result.divergences if d.kind == "draft_kernel_block_size").message
    assert message == (
        "mla-gqa-draft-b128-k64 [mrv1] draft_kernel_block_size: draft_kernel_block_sizes is "
        "{'draft.layers.2.attn': 128}, reference expects {'draft.layers.2.attn': 64}"
    )
    assert set(kinds_of(result.divergences)) <= set(KINDS)


def test_runner_check_without_reference() -> None:
    a = _stand_in("flashinfer-b128-k64")
    b = _stand_in("flashinfer-b128-k64", kernel_block_sizes=(128,), error="ValueError: boom\nsecond line")
    assert compare_runners("flashinfer-b128-k64", a, _stand_in("flashinfer-b128-k64")) == ()
    found = compare_runners("flashinfer-b128-k64", a, b)
    assert [(d.kind, d.field) for d in found] == [("mrv1_mrv2_mismatch", "error"), ("mrv1_mrv2_mismatch", "kernel_block_sizes")]
    assert all("\n" not in d.message and d.runner == "mrv1/mrv2" for d in found)
    assert compare_runners("x", a, SimpleNamespace(unsupported="no CPU backend")) == ()


def test_options_scope_an_entry_to_cases_setting_engine_options() -> None:
    from conformance.expectations import case_facts
    from suites.named_cases import CASES

    (entry,) = loads(
        '[[expectation]]\nid = "d1"\nkind = "mrv1_mrv2_mismatch"\nreason = "vllm/x.py"\n'
        'options = ["attention_backend", "draft"]\nwithout = ["speculative_attention_backend"]\n'
    )
    assert entry.options == ("attention_backend", "draft") and "options=attention_backend,draft" in entry.describe()
    d1 = CASES["gqa+draft-attention-backend-b128"]
    facts = case_facts(d1)
    assert facts.options == {"attention_backend", "draft"}
    mismatch = Divergence("mrv1_mrv2_mismatch", d1.name, "mrv1/mrv2", "kernel_block_sizes", [64], [128])
    assert classify([mismatch], Environment("0.33.0", {d1.name: facts}), [entry]).unexpected == ()
    # The same mismatch where the speculative backend is also set, or without a draft: unexpected.
    for case in (d1.with_(speculative_attention_backend="FLASH_ATTN"), d1.with_(layers=d1.layers[:2])):
        verdict = classify([mismatch], Environment("0.33.0", {d1.name: case_facts(case)}), [entry])
        # ... and the entry is not "unused" there: no case that ran is in its scope.
        assert verdict.unexpected == (mismatch,) and verdict.unused == ()
    # In scope and matching nothing: unused.
    assert classify([], Environment("0.33.0", {d1.name: facts}), [entry]).unused == (entry,)


@pytest.mark.parametrize(
    "line, message",
    [
        ('options = "draft"', "options 'draft' must be a non-empty array of option names"),
        ('without = ["tp"]', "without: option 'tp' is not one of attention_backend"),
    ],
)
def test_malformed_options_give_one_line(line: str, message: str) -> None:
    with pytest.raises(ExpectationsError, match=re.escape(message)):
        loads(f'[[expectation]]\nid = "e"\nkind = "layout"\nreason = "vllm/x.py"\n{line}\n')


# --- layering: the shipped file, then a consumer's own files ---------------------------------------


def _write(path: Path, *entries: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("schema = 1\n\n" + "\n".join(entries))
    return path


def test_layered_files_come_after_the_shipped_one_in_order_and_record_their_source(tmp_path: Path) -> None:
    from conformance.expectations import SHIPPED_SOURCE, describe_layers, load_layered

    first = _write(tmp_path / "ci" / "first.toml", _entry(id='"mine-a"', kind='"kernel_block_size"'))
    second = _write(tmp_path / "second.toml", _entry(id='"mine-b"', kind='"kernel_block_size"'),
                    _entry(id='"mine-c"', kind='"layout"'))
    shipped = load()
    entries = load_layered([first, second])
    assert [e.id for e in entries] == [e.id for e in shipped] + ["mine-a", "mine-b", "mine-c"]
    assert {e.source for e in entries[: len(shipped)]} == {SHIPPED_SOURCE}
    assert [e.source for e in entries[len(shipped):]] == [str(first), str(second), str(second)]
    # The order given is the order classified in.
    assert [e.id for e in load_layered([second, first])][len(shipped):] == ["mine-b", "mine-c", "mine-a"]
    assert describe_layers([first, second]) == f"{SHIPPED_SOURCE} (shipped) + {first} + {second}"
    # Labels name the files for messages; the source is not part of an entry's identity.
    (labelled,) = load_layered([first], shipped=False, labels=["ci/first.toml"])
    assert labelled.source == "ci/first.toml" and labelled == Expectation("mine-a", "kernel_block_size", "vllm/x.py")
    assert loads(_entry(), source="x.toml")[0].source == "x.toml" and Expectation("i", "layout", "r").source == ""


def test_no_shipped_keeps_only_the_given_files(tmp_path: Path) -> None:
    from conformance.expectations import describe_layers, load_layered

    mine = _write(tmp_path / "mine.toml", _entry(id='"mine-a"'))
    assert [e.id for e in load_layered([mine], shipped=False)] == ["mine-a"]
    assert load_layered([], shipped=False) == () and describe_layers([], shipped=False) is None
    assert describe_layers([mine], shipped=False) == str(mine)


def test_first_match_wins_so_a_consumer_entry_cannot_override_a_shipped_one(tmp_path: Path) -> None:
    from conformance.expectations import load_layered

    shipped_like = _write(tmp_path / "a.toml", _entry(id='"theirs"', kind='"kernel_block_size"'))
    mine = _write(tmp_path / "b.toml", _entry(id='"mine"', kind='"kernel_block_size"', case='"flashinfer-*"'))
    entries = load_layered([shipped_like, mine], shipped=False)
    verdict = classify([_div()], Environment("0.33.0"), entries)
    assert [m.expectation.id for m in verdict.expected] == ["theirs"]
    assert [(e.id, e.source) for e in verdict.unused] == [("mine", str(mine))]


def test_duplicate_id_across_files_is_one_line_naming_both_files(tmp_path: Path) -> None:
    from conformance.expectations import SHIPPED_SOURCE, load_layered

    a = _write(tmp_path / "a.toml", _entry(id='"same"'))
    b = _write(tmp_path / "b.toml", _entry(id='"other"'), _entry(id='"same"'))
    with pytest.raises(ExpectationsError) as info:
        load_layered([a, b], shipped=False)
    text = str(info.value)
    assert "\n" not in text and str(a) in text and str(b) in text
    assert text.startswith(f"{b}: expectation 2: id 'same' is already used by expectation 1 of {a}")
    # A shipped id reused in a consumer file names the shipped file (and the way out).
    taken = load()[0].id
    c = _write(tmp_path / "c.toml", _entry(id=f'"{taken}"'))
    with pytest.raises(ExpectationsError, match=rf"of {re.escape(SHIPPED_SOURCE)}; .*--no-shipped-expectations"):
        load_layered([c])
    assert [e.id for e in load_layered([c], shipped=False)] == [taken]
    # The same file twice, or the shipped file given again.
    with pytest.raises(ExpectationsError, match="is layered twice"):
        load_layered([a, a], shipped=False)
    with pytest.raises(ExpectationsError, match="is layered twice"):
        load_layered([DEFAULT_PATH])
    with pytest.raises(ExpectationsError, match="does not exist"):
        load_layered([tmp_path / "missing.toml"])
