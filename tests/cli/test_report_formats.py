"""``conformance.report_formats``: the report schema, its validator, and the JUnit / Markdown / HTML writers.

Pure standard library: runs without vLLM and without torch.
"""

from __future__ import annotations

import copy
import json
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from conformance import report_formats as rf

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "reports" / "vllm-0.33.0-cpu-named-cases.json"
EVIL = 'evil<script>alert("x")</script>&'


def committed() -> dict[str, Any]:
    return json.loads(COMMITTED.read_text())


def _result(name: str, backend: str | None, mrv1: dict[str, Any], mrv2: dict[str, Any], mismatches=()) -> dict[str, Any]:
    layer: dict[str, Any] = {"name": "model.layers.0.self_attn.attn"}
    if backend:
        layer["backend"] = backend
    config = {"name": name, "block_size": 128, "num_blocks": 4, "layers": [{"name": "draft.0", "backend": "TRITON_ATTN", "is_draft": True}, layer]}
    return {
        "case": name,
        "config": config,
        "replay": f"kvconform run --case {name}",
        "runners": {"mrv1": mrv1, "mrv2": mrv2},
        "mrv1_mrv2_mismatches": list(mismatches),
    }


def _div(case: str, runner: str, expected_by: str | None, field: str = "model.layers.0.self_attn.attn.shape") -> dict[str, Any]:
    return {
        "kind": "registered_shape",
        "case": case,
        "runner": runner,
        "field": field,
        "expected": [8, 8, 64, 256],
        "observed": [4, 8, 128, 256],
        "message": f"{case} [{runner}] registered_shape: {field} is (4, 8, 128, 256), reference expects (8, 8, 64, 256)",
        "expected_by": expected_by,
    }


def synthetic(complete: bool = True) -> dict[str, Any]:
    """Three cases: one unexpected failure, one known (expected) divergence, one unsupported."""
    ok = {"status": "pass", "detail": "", "divergences": []}
    results = [
        _result("fi-fails", "FLASHINFER", ok, {"status": "fail", "detail": "", "divergences": [_div("fi-fails", "mrv2", None)]},
                [{"field": "kernel_block_sizes", "mrv1": "[64]", "mrv2": "[128]", "expected_by": None}]),
        _result("fa-known", None, {"status": "expected", "detail": "", "divergences": [_div("fa-known", "mrv1", "known-issue-42")]}, ok),
        _result(EVIL, "FLASHMLA", {"status": "unsupported", "detail": "FLASHMLA needs SM90 <here>", "divergences": []},
                {"status": "unsupported", "detail": "FLASHMLA needs SM90 <here>", "divergences": []}),
    ]
    return {
        "schema": "kvconform.report/1",
        "complete": complete,
        "environment": {"python": "3.11.7", "reference_vllm": "0.33.0", "vllm": "0.33.0", "torch": None, "flashinfer": None},
        "started": 1795982427.8,
        "duration_s": 1.5,
        "counts": {"pass": 2, "fail": 1, "expected": 1, "unsupported": 2},
        "expectations": {
            "file": "conformance/expectations.toml",
            "expected": 1 if complete else None,
            "unexpected": 2 if complete else None,
            "unused": ["stale-one"] if complete else None,
        },
        "results": results,
    }


# ------------------------------------------------------------------- schema and validator


def test_committed_report_validates() -> None:
    assert rf.validate_report(committed()) == []


def test_synthetic_reports_validate() -> None:
    assert rf.validate_report(synthetic()) == []
    assert rf.validate_report(synthetic(complete=False)) == []


def test_schema_uses_only_keywords_the_validator_implements() -> None:
    schema = rf.load_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"

    def walk(node: Any, in_schema: bool) -> None:
        if isinstance(node, dict):
            if in_schema:
                assert set(node) <= rf.SUPPORTED_KEYWORDS | rf.ANNOTATIONS, set(node)
            for key, value in node.items():
                if key in ("properties", "$defs"):
                    for sub in value.values():
                        walk(sub, True)
                elif key in ("items", "additionalProperties") and isinstance(value, dict):
                    walk(value, True)

    walk(schema, True)


def test_divergence_kinds_in_schema_match_diff_module() -> None:
    from conformance.diff import KINDS

    kinds = rf.load_schema()["$defs"]["runner"]["properties"]["divergences"]["items"]["properties"]["kind"]["enum"]
    assert tuple(kinds) == KINDS


def _mutate(path: list[Any], value: Any = None, delete: bool = False) -> dict[str, Any]:
    data = copy.deepcopy(committed())
    node = data
    for key in path[:-1]:
        node = node[key]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return data


@pytest.mark.parametrize(
    ("path", "value", "delete", "expected"),
    [
        (["schema"], "kvconform.report/2", False, '$.schema: "kvconform.report/2" is not "kvconform.report/1"'),
        (["complete"], "yes", False, '$.complete: "yes" is a string, expected boolean'),
        (["results"], None, True, "$: required key 'results' is missing"),
        (["counts", "pass"], 58.5, False, "$.counts.pass: 58.5 is a number, expected integer"),
        (["counts", "passed"], 1, False, "$.counts.passed: unexpected key 'passed'"),
        (["results", 3, "runners", "mrv2", "status"], "ok", False, '$.results[3].runners.mrv2.status: "ok" is not one of "pass"'),
        (["results", 0, "runners", "mrv1"], None, True, "$.results[0].runners: required key 'mrv1' is missing"),
        (["results", 1, "config", "layers", 0, "name"], 7, False, "$.results[1].config.layers[0].name: 7 is an integer, expected string"),
        (["results", 2, "mrv1_mrv2_mismatches"], [{"field": "x", "mrv1": "1", "mrv2": "2"}], False,
         "$.results[2].mrv1_mrv2_mismatches[0]: required key 'expected_by' is missing"),
        (["expectations", "unused"], [True], False, "$.expectations.unused[0]: true is a boolean, expected string"),
        (["environment", "vllm"], 33, False, "$.environment.vllm: 33 is an integer, expected string or null"),
        (["started"], True, False, "$.started: true is a boolean, expected number"),
    ],
)
def test_mutated_reports_fail_with_the_path(path: list[Any], value: Any, delete: bool, expected: str) -> None:
    errors = rf.validate_report(_mutate(path, value, delete))
    assert errors, "the mutated report validated"
    assert any(expected in e for e in errors), errors


def test_divergence_needs_all_its_fields() -> None:
    data = synthetic()
    del data["results"][0]["runners"]["mrv2"]["divergences"][0]["message"]
    assert rf.validate_report(data) == ["$.results[0].runners.mrv2.divergences[0]: required key 'message' is missing"]


def test_non_object_report() -> None:
    assert rf.validate_report([1, 2]) == ["$: [1, 2] is an array, expected object"]


# ------------------------------------------------------------------- JUnit


def test_junit_counts_and_contents() -> None:
    root = ET.fromstring(rf.to_junit_xml(synthetic()))
    assert root.tag == "testsuites"
    suites = {s.get("name"): s for s in root.findall("testsuite")}
    assert list(suites) == ["mrv1", "mrv2", "mrv1=mrv2"]
    for suite in suites.values():
        assert suite.get("tests") == "3" and len(suite.findall("testcase")) == 3
    # mrv1: pass, expected (pass + note), unsupported (skipped)
    assert (suites["mrv1"].get("failures"), suites["mrv1"].get("skipped")) == ("0", "1")
    # mrv2: fail, pass, unsupported
    assert (suites["mrv2"].get("failures"), suites["mrv2"].get("skipped")) == ("1", "1")
    # mrv1=mrv2: the unexpected mismatch fails; a case a runner could not run compared
    # nothing, so it is skipped there too (not a pass)
    assert (suites["mrv1=mrv2"].get("failures"), suites["mrv1=mrv2"].get("skipped")) == ("1", "1")
    assert (root.get("tests"), root.get("failures"), root.get("skipped"), root.get("errors")) == ("9", "2", "3", "0")

    cases = {tc.get("name"): tc for tc in suites["mrv2"].findall("testcase")}
    failure = cases["fi-fails"].find("failure")
    assert failure is not None
    assert "registered_shape" in failure.get("message")
    assert "fi-fails [mrv2] registered_shape: model.layers.0.self_attn.attn.shape" in failure.text
    assert "replay: kvconform run --case fi-fails" in failure.text
    config_line = next(line for line in failure.text.splitlines() if line.startswith("config: "))
    assert json.loads(config_line[len("config: "):])["name"] == "fi-fails"

    mrv1 = {tc.get("name"): tc for tc in suites["mrv1"].findall("testcase")}
    known = mrv1["fa-known"]
    assert known.find("failure") is None and known.find("skipped") is None
    assert "expected [known-issue-42]" in known.find("system-out").text
    skipped = mrv1[EVIL].find("skipped")
    assert skipped is not None and skipped.get("message") == "unsupported: FLASHMLA needs SM90 <here>"

    pair = {tc.get("name"): tc for tc in suites["mrv1=mrv2"].findall("testcase")}
    assert "kernel_block_sizes: MRv1 [64] vs MRv2 [128]" in pair["fi-fails"].find("failure").text


def test_junit_of_committed_report_has_no_failures() -> None:
    report = committed()
    root = ET.fromstring(rf.to_junit_xml(report))
    assert root.get("tests") == str(3 * len(report["results"]))
    # Skipped: the runner checks vLLM cannot be driven for on CPU, and the pair of each such case.
    unsupported = {r["case"]: sorted(k for k, v in r["runners"].items() if v["status"] == "unsupported")
                   for r in report["results"] if any(v["status"] == "unsupported" for v in r["runners"].values())}
    assert unsupported == {"b12x-two-slots": ["mrv1", "mrv2"], "pcp2-dcp2-sparse-mla-b64": ["mrv2"]}
    skipped = sum(len(runners) + 1 for runners in unsupported.values())
    assert root.get("failures") == "0" and root.get("skipped") == str(skipped)


def test_junit_drops_characters_xml_cannot_carry() -> None:
    data = synthetic()
    data["results"][0]["runners"]["mrv2"]["divergences"][0]["message"] += " \x00\x1b"
    ET.fromstring(rf.to_junit_xml(data))


# ------------------------------------------------------------------- Markdown


def test_markdown_matrix_and_replay() -> None:
    md = rf.to_markdown(synthetic())
    assert "| backend | mrv1 | mrv2 | mrv1=mrv2 |" in md
    # backend = the first non-draft layer's; a layer without "backend" has the default FLASH_ATTN
    assert "| FLASHINFER | 1 pass | 1 fail | 1 fail |" in md
    assert "| FLASH_ATTN | 1 expected | 1 pass | 1 pass |" in md
    assert "| FLASHMLA | 1 unsupported | 1 unsupported | 1 unsupported |" in md
    assert "TRITON_ATTN" not in md.split("## Backend x check")[1].split("##")[0]  # the draft's backend is not the row
    unexpected, expected = md.split("## Unexpected divergences")[1].split("## Expected divergences")
    assert "### fi-fails" in unexpected and "kvconform run --case fi-fails" in unexpected
    assert '"name":"fi-fails"' in unexpected
    assert "kernel_block_sizes: MRv1 [64] vs MRv2 [128]" in unexpected
    assert "[known-issue-42]" in expected and "fa-known" not in unexpected
    assert "stale-one" in md
    assert "python 3.11.7" in md and "1 fail" in md


def test_markdown_of_committed_report() -> None:
    report = committed()
    md = rf.to_markdown(report)
    fa = sum(1 for r in report["results"] if rf.primary_backend(r["config"]) == "FLASH_ATTN")
    assert fa >= 16
    # MRv1's QSA ring slot mapping is the one known FLASH_ATTN divergence (mrv1-qsa-ring-slot-mapping-reads-past-row);
    # the one known MRv1/MRv2 difference is MRv1 refusing the Step5 model MRv2 starts (mrv1-refuses-step5).
    assert f"| FLASH_ATTN | 1 expected, {fa - 1} pass | {fa} pass | 1 expected, {fa - 1} pass |" in md
    assert "| TRITON_ATTN | 2 pass | 2 pass | 2 expected |" in md
    assert "## Unexpected divergences\n\nNone." in md
    assert md.count("[mrv2-draft-keeps-attention-backend]") == 14


# ------------------------------------------------------------------- HTML


class _Tree(HTMLParser):
    """Checks tags nest and close; collects text and whether any <script> element exists."""

    VOID = {"meta", "br", "hr", "img", "input", "link"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.tags: list[str] = []
        self.text: list[str] = []
        self.external: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.external += [v for k, v in attrs if k in ("src", "href") and v]
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes {self.stack[-1:]}"
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _parse(page: str) -> _Tree:
    tree = _Tree()
    tree.feed(page)
    tree.close()
    assert tree.stack == [], f"unclosed: {tree.stack}"
    return tree


def test_html_is_well_formed_and_escapes() -> None:
    page = rf.to_html(synthetic())
    tree = _parse(page)
    assert "script" not in tree.tags and tree.external == []
    assert "<script>" not in page and "&lt;script&gt;" in page
    text = "".join(tree.text)
    assert EVIL in text  # escaped, so it reads back as the original name
    assert tree.tags.count("details") == 3
    assert "<details open><summary><code>fi-fails</code>" in page  # the failing case is open and first
    assert page.index("fi-fails") < page.index("fa-known")
    assert 'class="s-fail"' in page and 'class="s-expected"' in page
    assert "kvconform run --case fi-fails" in text and "FLASHMLA needs SM90 <here>" in text


def test_html_of_committed_report() -> None:
    data = committed()
    tree = _parse(rf.to_html(data))
    assert tree.tags.count("details") == len(data["results"]) and tree.external == []


# ------------------------------------------------------------------- incomplete reports and convert


def test_incomplete_report_converts_and_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "partial.json"
    src.write_text(json.dumps(synthetic(complete=False)))
    out = {k: tmp_path / f"out.{k}" for k in ("xml", "md", "html")}
    # Written, and exit 1: the synthetic report holds divergences no expectation absorbed.
    assert rf.convert(src, junit=str(out["xml"]), markdown=str(out["md"]), html=str(out["html"])) == 1
    err = capsys.readouterr().err
    assert "incomplete" in err and "holds 2 unexpected divergence(s)" in err
    assert "INCOMPLETE" in out["md"].read_text() and "not classified yet" in out["md"].read_text()
    assert "INCOMPLETE" in out["html"].read_text()
    root = ET.fromstring(out["xml"].read_text())
    assert "incomplete" in root.get("name")
    assert root.find("testsuite/properties/property[@name='kvconform.complete']").get("value") == "false"


def test_a_report_with_unexpected_divergences_exits_1_whatever_its_counts_say(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    report = synthetic(complete=True)
    report["counts"] = {"pass": 4}  # a report's own counts are not trusted
    src = tmp_path / "r.json"
    src.write_text(json.dumps(report))
    assert rf.convert(src) == 1
    assert "2 unexpected divergence(s)" in capsys.readouterr().out
    for result in report["results"]:  # every divergence absorbed: conformant
        for runner in result["runners"].values():
            for d in runner["divergences"]:
                d["expected_by"] = "some-entry"
        for d in result["mrv1_mrv2_mismatches"]:
            d["expected_by"] = "some-entry"
    src.write_text(json.dumps(report))
    assert rf.convert(src) == 0
    assert "0 unexpected divergence(s)" in capsys.readouterr().out


def test_convert_committed_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert rf.convert(COMMITTED) == 0
    from suites.named_cases import CASES

    # The published report covers exactly today's named cases (regenerate it when they change).
    assert [r["case"] for r in committed()["results"]] == list(CASES)
    assert f"valid kvconform.report/1 report (complete), {len(CASES)} case(s)" in capsys.readouterr().out
    assert rf.convert(COMMITTED, markdown="-") == 0
    assert capsys.readouterr().out.startswith("# kvconform conformance report")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "does not exist"),
        ('{"schema": "kvconform.report/1", ', "malformed JSON"),
        ('{"schema": "kvconform.reference-report/1", "results": []}', "schema 'kvconform.reference-report/1' is not a kvconform run report"),
        ("[1]", "not a valid kvconform.report/1 report: $: [1] is an array, expected object"),
        ("MUTATED", "$.results[0].runners.mrv1.status: \"bad\" is not one of"),
    ],
)
def test_convert_bad_reports_are_one_line_exit_4(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, message: str) -> None:
    src = tmp_path / "report.json"
    if content == "MUTATED":
        content = json.dumps(_mutate(["results", 0, "runners", "mrv1", "status"], "bad"))
    if content is not None:
        src.write_text(content)
    out = tmp_path / "out.md"
    assert rf.convert(src, markdown=str(out)) == 4
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and err.startswith("kvconform: error: ")
    assert not out.exists()


def test_convert_unwritable_output_is_exit_4(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert rf.convert(COMMITTED, html=str(tmp_path / "no" / "such" / "dir" / "r.html")) == 4
    assert "cannot write" in capsys.readouterr().err


def test_gzipped_reports_are_written_read_and_converted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import gzip

    report = committed()
    target = tmp_path / "big.json.gz"
    rf.write_report_atomically(target, report)
    assert not list(tmp_path.glob(".tmp-*"))
    assert json.loads(gzip.decompress(target.read_bytes())) == json.loads(json.dumps(report, default=str))
    # Byte-identical on a rewrite: no file name or mtime in the gzip header.
    first = target.read_bytes()
    rf.write_report_atomically(target, report)
    assert target.read_bytes() == first
    loaded, problem = rf.load_report(target)
    assert problem is None and loaded["results"] == report["results"]
    assert rf.convert(target, markdown="-") == 0
    assert "## Backend x check" in capsys.readouterr().out
    broken = tmp_path / "broken.json.gz"
    broken.write_bytes(b"not gzip")
    assert rf.load_report(broken)[1].startswith(f"{broken}: cannot read:")


def test_published_ci_profile_report_is_todays_sample() -> None:
    """reports/vllm-0.33.0-cpu-ci-profile.json.gz holds exactly the cases the ci profile runs
    today (named cases, then the seeded sample): regenerate it when either changes."""
    from suites.named_cases import CASES
    from suites.profiles import PROFILES, PROJECT_SEED
    from suites.strategies import sample_cases

    report, problem = rf.load_report(ROOT / "reports" / "vllm-0.33.0-cpu-ci-profile.json.gz")
    assert problem is None, problem
    expected = [c.to_dict() for c in CASES.values()] + [c.to_dict() for c in sample_cases(PROJECT_SEED, PROFILES["ci"]["sample"])]
    assert [r["config"] for r in report["results"]] == json.loads(json.dumps(expected))
    assert report["complete"] and report["expectations"]["unexpected"] == 0


def test_the_report_schema_describes_exactly_the_case_fields() -> None:
    """One case description: the schema's config and layer properties are CaseConfig's and
    LayerConfig's fields, and seeded configs (every kind the strategy draws) validate."""
    from dataclasses import fields

    from reference.config import CaseConfig, LayerConfig
    from suites.strategies import sample_cases

    schema = json.loads((ROOT / "conformance" / "report.schema.json").read_text())
    config = schema["properties"]["results"]["items"]["properties"]["config"]
    assert set(config["properties"]) == {f.name for f in fields(CaseConfig)}
    assert set(config["properties"]["layers"]["items"]["properties"]) == {f.name for f in fields(LayerConfig)}
    for case in sample_cases(3, 200):
        errors: list[str] = []
        data = json.loads(case.to_json())  # as a report stores it
        rf._check(data, config, schema, ["config"], errors)
        assert errors == [], (case.name, errors[:3])
        assert CaseConfig.from_dict(data) == case
