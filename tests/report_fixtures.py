"""Valid ``kvconform.report/1`` reports for tests that read a report back (``replay``,
``report``): every report read is validated whole against ``report.schema.json`` first,
so a test's report must be one a run could write. Built on the published named-cases
report's environment, with the results the test asks for."""

from __future__ import annotations

import copy
import json
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

PUBLISHED = Path(__file__).resolve().parents[1] / "reports" / "vllm-0.33.0-cpu-named-cases.json"


@lru_cache(maxsize=1)
def _published() -> dict[str, Any]:
    return json.loads(PUBLISHED.read_text())


def result_for(case: Any, statuses: Mapping[str, str] | None = None) -> dict[str, Any]:
    """One case's result with these runner statuses (default: both pass), no divergences."""
    statuses = dict(statuses or {"mrv1": "pass", "mrv2": "pass"})
    runners = {runner: {"status": status, "detail": "", "divergences": [], "fidelity": "runner",
                        "fidelity_reason": None, "schedules": {"run": 0, "not_run": "no schedules asked for"}}
               for runner, status in statuses.items()}
    return {"case": case.name, "config": case.to_dict(), "replay": f"kvconform run --case {case.name}",
            "runners": runners, "mrv1_mrv2_mismatches": []}


def valid_report(results: list[dict[str, Any]], **environment: Any) -> dict[str, Any]:
    """The published report's frame around ``results``; ``environment`` entries override its own."""
    report = copy.deepcopy(_published())
    report["results"] = results
    report["counts"] = status_counts(results)
    report["environment"].update(environment)
    return report


def status_counts(results: list[dict[str, Any]]) -> dict[str, int]:
    """A report's ``counts``: runner outcomes over ``results``."""
    counts: dict[str, int] = {}
    for result in results:
        for runner in result["runners"].values():
            counts[runner["status"]] = counts.get(runner["status"], 0) + 1
    return counts
