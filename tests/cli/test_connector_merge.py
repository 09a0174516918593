"""``kvconform report merge`` of connector reports (``kvconform check --json``): shards back
into the unsharded report, two vLLMs side by side, and every bad merge one line and exit 4.
Built on the published connector report (reports/vllm-0.33.0-connectors.json)."""

from __future__ import annotations

import copy
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest

from conformance.cli import main
from conformance.connectors.merge import cases_of, load_connector_report, merge_connector_reports
from conformance.shards import Shard, assign, shard_record

PUBLISHED = Path(__file__).resolve().parents[2] / "reports" / "vllm-0.33.0-connectors.json"


@lru_cache(maxsize=1)
def _published_text() -> str:
    return PUBLISHED.read_text()


def _published() -> dict[str, Any]:
    return json.loads(_published_text())


def _shards(doc: dict[str, Any], count: int) -> list[dict[str, Any]]:
    """The report split as `kvconform check --shard K/N` splits its cases."""
    cases = cases_of(doc)
    owners = assign([1.0 + (i % 3) for i in range(len(cases))], count)
    parts = []
    for k in range(1, count + 1):
        positions = [i for i, owner in enumerate(owners) if owner == k]
        mine = {cases[i] for i in positions}
        part = copy.deepcopy(doc)
        for c in part["connectors"]:
            c["results"] = [r for r in c["results"] if r["case"] in mine]
            c["counts"] = {s: sum(r["status"] == s for r in c["results"]) for s in c["counts"]}
        part["shard"] = shard_record(Shard(k, count), cases, positions)
        parts.append(part)
    return parts


def _write(tmp_path: Path, name: str, doc: dict[str, Any]) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


def test_the_published_connector_report_is_valid() -> None:
    doc, problem = load_connector_report(str(PUBLISHED))
    assert problem is None and doc is not None


@pytest.mark.parametrize("count", [2, 4])
def test_a_merge_of_the_shards_is_the_unsharded_connector_report(tmp_path: Path, count: int) -> None:
    whole = _published()
    paths = [_write(tmp_path, f"part{k}.json", part) for k, part in enumerate(_shards(whole, count), start=1)]
    merged = merge_connector_reports(list(reversed(paths)))  # any order
    assert merged["totals"] == {k: v for k, v in whole["totals"].items()}
    assert [c["adapter"] for c in merged["connectors"]] == [c["adapter"] for c in whole["connectors"]]
    for mine, theirs in zip(merged["connectors"], whole["connectors"]):
        assert mine["results"] == theirs["results"] and mine["counts"] == theirs["counts"]
    assert merged["not_driven"] == sorted(whole["not_driven"], key=lambda n: (n["connector"], n["reason"]))
    target = tmp_path / "all.json"
    assert main(["report", "merge", *paths, "--json", str(target), "--markdown", str(tmp_path / "all.md")]) == 0
    assert load_connector_report(str(target))[1] is None  # the merge is a valid connector report itself


def test_two_vllms_are_kept_apart_side_by_side(tmp_path: Path) -> None:
    here = _published()
    there = copy.deepcopy(here)
    there["vllm"] = "0.32.0"
    first = there["connectors"][0]
    first["results"][0]["status"] = "refusal"
    a, b = _write(tmp_path, "a.json", here), _write(tmp_path, "b.json", there)
    md = tmp_path / "both.md"
    assert main(["report", "merge", a, b, "--json", str(tmp_path / "both.json"), "--markdown", str(md),
                 "--html", str(tmp_path / "both.html")]) == 0
    merged = json.loads((tmp_path / "both.json").read_text())
    assert merged["environments"] == [{"vllm": here["vllm"]}, {"vllm": "0.32.0"}]
    assert len(merged["connectors"]) == 2 * len(here["connectors"])
    text = md.read_text()
    assert f"vLLM {here['vllm']} and 0.32.0 side by side" in text
    header = next(line for line in text.splitlines() if line.startswith("| case |"))
    assert f"{first['connector']} (vLLM {here['vllm']})" in header and f"{first['connector']} (vLLM 0.32.0)" in header
    assert f"{first['connector']} (vLLM 0.32.0)" in (tmp_path / "both.html").read_text()


def _bad(tmp_path: Path, docs: list[Any], capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    prefix = len(list(tmp_path.iterdir()))
    paths = [_write(tmp_path, f"bad{prefix}-{i}.json", d) if not isinstance(d, str) else d for i, d in enumerate(docs)]
    assert main(["report", "merge", *paths, *extra, "--json", str(tmp_path / "out.json")]) == 4
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_bad_connector_merges_are_one_line_and_exit_4(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    whole = _published()
    parts = _shards(whole, 3)
    assert "shard(s) 3/3 missing" in _bad(tmp_path, parts[:2], capsys)
    assert "the same shard twice" in _bad(tmp_path, [parts[0], parts[0], parts[1], parts[2]], capsys)
    truncated = copy.deepcopy(parts[1])  # the last case cut off one connector's results
    last = truncated["connectors"][-1]
    last["results"] = [r for r in last["results"] if r["case"] != last["results"][-1]["case"]]
    assert "truncated or edited" in _bad(tmp_path, [parts[0], truncated, parts[2]], capsys)
    other = copy.deepcopy(whole)
    other["connectors"][0]["results"][0]["status"] = "failure" if other["connectors"][0]["results"][0]["status"] != "failure" else "pass"
    assert "with different verdicts" in _bad(tmp_path, [whole, other], capsys)
    wrong = copy.deepcopy(whole)
    wrong["connectors"][0]["results"][0]["status"] = "maybe"
    assert "is not one of" in _bad(tmp_path, [wrong], capsys)
    deep = tmp_path / "deep.json"
    deep.write_text('{"schema": "kvconform.connector-report/2", "connectors": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert "nested too deep" in _bad(tmp_path, [str(deep)], capsys)
    run_report = str(Path(__file__).resolve().parents[2] / "reports" / "vllm-0.33.0-cpu-named-cases.json")
    assert "merge run reports and connector reports separately" in _bad(tmp_path, [whole, run_report], capsys)
    assert "--junit renders run reports" in _bad(tmp_path, [whole], capsys, "--junit", str(tmp_path / "x.xml"))
