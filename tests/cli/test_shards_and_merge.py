"""Shards (``--shard K/N``) and ``kvconform report merge``, without vLLM.

Shards: disjoint parts whose union is the selection, balanced by cost, the same on every
machine; bad arguments are one line and exit 4. Merge: the published named-cases report cut
into shards as ``kvconform run --shard`` would cut it merges back into the same cases,
verdicts and divergences; two environments stay apart, side by side; every bad merge is one
line and exit 4.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from conformance.cli import main
from conformance.merge import merge, verdict_of
from conformance.shards import Shard, ShardError, assign, case_cost, parse_shard, shard_record, take
from reference.config import CaseConfig
from suites.named_cases import CASES
from report_fixtures import PUBLISHED, status_counts

# --- shards -------------------------------------------------------------------------------------


@pytest.mark.parametrize("count", [1, 2, 3, 4, 7, 64, 200])
def test_shards_are_disjoint_and_cover_the_selection(count: int) -> None:
    cases = list(CASES.values())
    parts = [take(cases, Shard(k, count), case_cost) for k in range(1, count + 1)]
    positions = [p for _, ps in parts for p in ps]
    assert sorted(positions) == list(range(len(cases)))  # each case in exactly one shard
    for mine, ps in parts:
        assert [c.name for c in mine] == [cases[p].name for p in ps]  # selection order kept
        assert ps == sorted(ps)


def test_shards_are_balanced_by_cost() -> None:
    cases = list(CASES.values())
    costs = [case_cost(c) for c in cases]
    owners = assign(costs, 4)
    loads = [sum(c for c, o in zip(costs, owners) if o == k) for k in range(1, 5)]
    # The greedy deal is within the largest single cost of even.
    assert max(loads) - min(loads) <= max(costs)
    drafted = next(c for c in cases if any(layer.is_draft for layer in c.layers))
    assert case_cost(drafted) > case_cost(CASES["dense-fa-b128-lbhnc"])


def test_the_assignment_depends_only_on_the_selection() -> None:
    cases = list(CASES.values())
    first = assign([case_cost(c) for c in cases], 5)
    again = assign([case_cost(CaseConfig.from_json(c.to_json())) for c in cases], 5)
    assert first == again


@pytest.mark.parametrize("text, why", [
    ("0/0", "the count 0"), ("3/2", "the index 3 must be from 1 to the count 2"), ("-1/4", "the index '-1' is not a whole number"),
    ("a/b", "the index 'a' is not a whole number"), ("2", "is not K/N"), ("1/99999", "from 1 to 4096"), ("0/3", "the index 0"),
])
def test_bad_shards_name_the_value(text: str, why: str) -> None:
    with pytest.raises(ShardError, match=why.replace("(", r"\(")):
        parse_shard(text, environ={})


def test_auto_reads_buildkite() -> None:
    assert parse_shard("auto", {"BUILDKITE_PARALLEL_JOB": "2", "BUILDKITE_PARALLEL_JOB_COUNT": "4"}) == Shard(3, 4)
    with pytest.raises(ShardError, match="BUILDKITE_PARALLEL_JOB"):
        parse_shard("auto", {})
    with pytest.raises(ShardError, match="the index 5 must be from 1 to the count 4"):
        parse_shard("auto", {"BUILDKITE_PARALLEL_JOB": "4", "BUILDKITE_PARALLEL_JOB_COUNT": "4"})


@pytest.mark.parametrize("command", ["run", "check"])
@pytest.mark.parametrize("text", ["0/0", "3/2", "-1/4", "a/b"])
def test_bad_shard_arguments_are_usage_errors(command: str, text: str, capsys: pytest.CaptureFixture[str]) -> None:
    extra = ["--all"] if command == "check" else []
    assert main([command, *extra, f"--shard={text}"]) == 4
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and text in err[0], err


# --- merge ---------------------------------------------------------------------------------------


def _published() -> dict[str, Any]:
    return json.loads(PUBLISHED.read_text())


def _shard_reports(report: dict[str, Any], count: int) -> list[dict[str, Any]]:
    """The report as ``kvconform run --shard k/count`` would have written each part."""
    cases = [CaseConfig.from_dict(r["config"]) for r in report["results"]]
    parts = []
    for k in range(1, count + 1):
        _, positions = take(cases, Shard(k, count), case_cost)
        part = copy.deepcopy(report)
        part["results"] = [report["results"][p] for p in positions]
        part["shard"] = shard_record(Shard(k, count), [c.to_json() for c in cases], positions)
        part["counts"] = status_counts(part["results"])
        parts.append(part)
    return parts


def _write(tmp_path: Path, name: str, report: dict[str, Any]) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(report))
    return str(path)


@pytest.mark.parametrize("count", [2, 4])
def test_a_merge_of_the_shards_is_the_unsharded_report(tmp_path: Path, count: int) -> None:
    whole = _published()
    paths = [_write(tmp_path, f"s{k}.json", part) for k, part in enumerate(_shard_reports(whole, count), 1)]
    merged = merge(list(reversed(paths)))  # any order
    assert [r["case"] for r in merged["results"]] == [r["case"] for r in whole["results"]]
    assert [verdict_of(r) for r in merged["results"]] == [verdict_of(r) for r in whole["results"]]
    assert merged["counts"] == dict(sorted(whole["counts"].items()))
    assert "environments" not in merged
    out = tmp_path / "all.json"
    assert main(["report", "merge", *paths, "--json", str(out), "--markdown", str(tmp_path / "all.md")]) == 0
    assert main(["report", str(out)]) == 0  # valid against report.schema.json


def test_two_environments_are_kept_apart_side_by_side(tmp_path: Path) -> None:
    here = _published()
    there = copy.deepcopy(here)
    there["environment"]["vllm"] = "0.32.0"
    there["results"][0]["runners"]["mrv1"]["status"] = "refused"
    a, b = _write(tmp_path, "a.json", here), _write(tmp_path, "b.json", there)
    merged = merge([a, b])
    assert [e["vllm"] for e in merged["environments"]] == [here["environment"]["vllm"], "0.32.0"]
    assert len(merged["results"]) == 2 * len(here["results"])
    assert {r["environment"] for r in merged["results"]} == {0, 1}
    md = tmp_path / "both.md"
    assert main(["report", "merge", a, b, "--json", str(tmp_path / "both.json"), "--markdown", str(md)]) == 0
    text = md.read_text()
    assert "## Environments side by side" in text and "vLLM 0.32.0" in text
    row = next(line for line in text.splitlines() if line.startswith(f"| {here['results'][0]['case']} |"))
    assert "mrv1:refused" in row and "mrv1:pass" in row
    assert main(["report", str(tmp_path / "both.json")]) == 0


def _bad(tmp_path: Path, reports: list[dict[str, Any]]) -> list[str]:
    prefix = len(list(tmp_path.iterdir()))  # each call its own files
    return [_write(tmp_path, f"r{prefix}-{i}.json", r) for i, r in enumerate(reports)]


def test_bad_merges_are_one_line_and_exit_4(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    whole = _published()
    parts = _shard_reports(whole, 3)
    disagree = copy.deepcopy(whole)
    disagree["results"][0]["runners"]["mrv1"]["status"] = "fail"
    incomplete = copy.deepcopy(whole)
    incomplete["complete"] = False
    truncated = copy.deepcopy(parts[0])
    truncated["results"] = truncated["results"][:-1]
    other_split = copy.deepcopy(parts[1])
    other_split["shard"]["count"] = 4
    other_schema = copy.deepcopy(whole)
    other_schema["schema"] = "kvconform.report/2"
    bad_types = copy.deepcopy(whole)
    bad_types["results"][0]["runners"]["mrv1"]["divergences"] = [{"case": 7}]
    deep = tmp_path / "deep.json"
    deep.write_text('{"schema": "kvconform.report/1", "results": ' + "[" * 5000 + "]" * 5000 + "}")
    cases = {
        "missing shard": (_bad(tmp_path, parts[:2]), "shard(s) 3/3 missing"),
        "same shard twice": (_bad(tmp_path, [parts[0], parts[0], parts[1], parts[2]]), "the same shard twice"),
        "disagreeing duplicate": (_bad(tmp_path, [whole, disagree]), "with different verdicts"),
        "incomplete": (_bad(tmp_path, [incomplete]), "an incomplete report"),
        "truncated shard": (_bad(tmp_path, [truncated, parts[1], parts[2]]), "positions"),
        "another split": (_bad(tmp_path, [parts[0], other_split, parts[2]]), "ways"),
        "another schema": (_bad(tmp_path, [whole, other_schema]), "kvconform.report/2"),
        "wrong types": (_bad(tmp_path, [bad_types]), "not a valid"),
        "nested deep": ([str(deep)], "nested too deep"),
        "no such file": ([str(tmp_path / "nope.json")], "does not exist"),
    }
    for what, (paths, message) in cases.items():
        code = main(["report", "merge", *paths, "--json", str(tmp_path / "out.json")])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 4, what
        assert len(err) == 1 and message in err[0], (what, err)


def test_merge_needs_reports_and_an_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", "merge", "--json", str(tmp_path / "o.json")]) == 4
    assert main(["report", "merge", str(PUBLISHED)]) == 4
    assert main(["report", str(PUBLISHED), str(PUBLISHED)]) == 4
    err = capsys.readouterr().err
    assert "needs the reports" in err and "give --json" in err and "report merge A.json" in err


def test_unused_expectations_are_those_no_shard_used(tmp_path: Path) -> None:
    whole = _published()
    a, b = _shard_reports(whole, 2)
    a["expectations"] = dict(a["expectations"], unused=["x", "y"], absorbed={"z": 1})
    b["expectations"] = dict(b["expectations"], unused=["z"], absorbed={"x": 2})
    merged = merge(_bad(tmp_path, [a, b]))
    assert merged["expectations"]["unused"] == ["y"]
    assert merged["expectations"]["absorbed"] == {"x": 2, "z": 1}
