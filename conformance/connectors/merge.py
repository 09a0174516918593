"""``kvconform report merge`` of connector reports (``kvconform check --json``): one
``kvconform.connector-report/2`` out of the shards' and hosts' reports.

The rules are the run reports' (``conformance.merge``): every input is validated whole
against ``connector-report.schema.json`` first; results are keyed by connector, case and
runner within an environment (the vLLM the check ran against); the same result twice must
agree (status, expectation, findings), else the merge refuses in one line; shards of one
selection must all be there, once each, and their results go back in selection order, so a
merge of N shards is the unsharded report. Reports of several vLLMs are kept apart: each
connector entry names its environment, and the Markdown and HTML show them side by side.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from conformance.connectors.report import SCHEMA_ID
from conformance.merge import MergeError, check_shards
from conformance.report_formats import load_document

SCHEMA_PATH = Path(__file__).resolve().parents[1] / "connector-report.schema.json"
WHAT = "kvconform connector report"


def load_schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text())


def load_connector_report(path: str) -> tuple[dict[str, Any] | None, str | None]:
    """(report, None) for a valid connector report, else (None, one line naming the problem)."""
    return load_document(path, SCHEMA_ID, load_schema(), WHAT)


def _environment(doc: Mapping[str, Any]) -> tuple[Any, ...]:
    return (doc.get("vllm"),)


def cases_of(doc: Mapping[str, Any]) -> list[str]:
    """The report's cases, in the order it checked them (every connector checks the same ones)."""
    return list(dict.fromkeys(r["case"] for c in doc["connectors"] for r in c["results"]))


def _complete_cases(doc: Mapping[str, Any]) -> int:
    """Cases every connector of the report has a result for (each checks every case of the
    selection, so a shard's count is its positions' unless the file was cut or edited)."""
    per_connector = [{r["case"] for r in c["results"]} for c in doc["connectors"]]
    return len(set.intersection(*per_connector)) if per_connector else 0


def verdict_of(row: Mapping[str, Any]) -> Any:
    """What must agree when one (connector, case, runner) is in two reports of one vLLM."""
    findings = sorted(json.dumps([d.get("layer"), d.get("block"), d.get("field"), d.get("expected"), d.get("observed")])
                      for d in row.get("divergences") or ())
    return row["status"], row.get("expected_by"), row.get("cause"), findings


def merge_connector_reports(paths: Sequence[str]) -> dict[str, Any]:
    """The merged connector report (raises MergeError with one line)."""
    if not paths:
        raise MergeError("report merge needs at least one report")
    reports = []
    for path in paths:
        doc, problem = load_connector_report(path)
        if doc is None:
            raise MergeError(problem or f"{path}: not a valid {SCHEMA_ID} report")
        if "environments" in doc:
            raise MergeError(f"{path}: already a merge of several vLLMs; merge the reports it was made from")
        reports.append((path, doc))
    check_shards(reports, environment_of=_environment, results_of=_complete_cases,
                 describe=lambda key: f"vLLM {key[0]}")
    envs: list[tuple[Any, ...]] = []
    # Per environment, per adapter: its label, and (case, runner) -> (order, path, row).
    slots: list[dict[str, tuple[str, dict[tuple[str, str], tuple[tuple[int, int, int], str, dict[str, Any]]]]]] = []
    not_driven: dict[tuple[str, str], dict[str, str]] = {}
    for report_no, (path, doc) in enumerate(reports):
        key = _environment(doc)
        if key not in envs:
            envs.append(key)
            slots.append({})
        by_adapter = slots[envs.index(key)]
        shard = doc.get("shard")
        position = {case: (0, shard["positions"][i]) if shard else (1 + report_no, i) for i, case in enumerate(cases_of(doc))}
        for entry in doc["connectors"]:
            label, rows = by_adapter.setdefault(entry["adapter"], (entry["connector"], {}))
            for i, row in enumerate(entry["results"]):
                where = (row["case"], row["runner"])
                if where in rows:
                    _, other_path, other = rows[where]
                    if verdict_of(other) != verdict_of(row):
                        raise MergeError(f"{label} {row['case']} [{row['runner']}] is in {other_path} and {path} (vLLM {key[0]}) "
                                         f"with different verdicts: {other['status']} vs {row['status']}")
                    continue
                rows[where] = ((*position[row["case"]], i), path, row)
        for item in doc.get("not_driven") or ():
            not_driven.setdefault((item["connector"], item["reason"]), dict(item))
    connectors = []
    for index, by_adapter in enumerate(slots):
        for adapter, (label, rows) in by_adapter.items():
            ordered = [row for _, _, row in sorted(rows.values(), key=lambda item: item[0])]
            counts = {s: sum(1 for r in ordered if r["status"] == s) for s in ("pass", "refusal", "failure", "unsupported", "skipped")}
            entry = {"connector": label, "adapter": adapter, "counts": counts, "results": ordered}
            connectors.append(dict(entry, environment=index) if len(envs) > 1 else entry)
    totals: dict[str, int] = {}
    for entry in connectors:
        for status, n in entry["counts"].items():
            totals[status] = totals.get(status, 0) + n
    durations = [d["duration_s"] for _, d in reports if d.get("duration_s") is not None]
    merged: dict[str, Any] = {
        "schema": SCHEMA_ID,
        "vllm": envs[0][0],
        "duration_s": max(durations) if durations else None,  # shards run side by side
        "totals": totals,
        "connectors": connectors,
        "not_driven": [not_driven[k] for k in sorted(not_driven)],
        "merged_from": list(paths),
    }
    if len(envs) > 1:
        merged["environments"] = [{"vllm": key[0]} for key in envs]
    return merged


def unexpected_failures(doc: Mapping[str, Any]) -> int:
    """Failures no shipped expectation cites (what fails a check)."""
    return sum(1 for c in doc["connectors"] for r in c["results"] if r["status"] == "failure" and not r.get("expected_by"))


__all__ = ["cases_of", "load_connector_report", "merge_connector_reports", "unexpected_failures", "verdict_of"]
