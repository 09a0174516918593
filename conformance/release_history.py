"""The ``kvconform.release-history/1`` document: what one release's checks hold, what appears,
vanishes and changes between releases, the ids that name a divergence in every rendering, and
the check of a history read back in. ``conformance.matrix`` fills it by running releases,
``conformance.distributed`` by Ray tasks, ``conformance.history_formats`` renders it.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

SCHEMA = "kvconform.release-history/1"
CONNECTORS = {"nixl": "gpu_impl.connectors.nixl:NixlAdapter", "mooncake": "gpu_impl.connectors.mooncake:MooncakeAdapter"}
"""The connector checks each release gets, by name: the adapter ``kvconform check --connector`` runs."""


def unexpected(run: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The divergences of one release's run that no shipped expectation explains."""
    return [d for d in run.get("divergences", []) if not d.get("known")]

def _key(d: Mapping[str, Any]) -> tuple[str, str, str, str]:
    return (d["case"], d["runner"], d["kind"], d["field"])

def divergence_id(d: Mapping[str, Any]) -> str:
    """A short id of what diverges (case, runner, kind, field), the same in every release that
    has it: the Markdown names it, the JSON and HTML hold its config and replay line."""
    return "d" + hashlib.sha1("|".join(_key(d)).encode()).hexdigest()[:8]

def _check_findings(release: Mapping[str, Any]) -> dict[tuple[str, str, str, str], dict[str, Any]]:
    """A release's connector refusals and failures, keyed by (check, case, runner, status),
    as divergences of the run are (message and replay line)."""
    out = {}
    for name, check in release.get("checks", {}).items():
        for f in check.get("failures", []):
            status = f.get("status", "failure")
            message = f"{name} check: {f['case']} [{f['runner']}] {status}: {f['detail']}"
            finding = {"case": f["case"], "runner": f["runner"], "kind": f"{name}_{status}", "field": name,
                       "message": message, "replay": f["replay"], "known": f.get("known")}
            out[(name, f["case"], f["runner"], status)] = dict(finding, id=divergence_id(finding))
    return out

def transitions(releases: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per consecutive pair: the divergences (known or not) and the connector refusals and
    failures that appear and vanish."""
    out = []
    for before, after in zip(releases, releases[1:]):
        a = {_key(d): d for d in before["run"].get("divergences", [])}
        b = {_key(d): d for d in after["run"].get("divergences", [])}
        ca, cb = _check_findings(before), _check_findings(after)
        out.append({
            "from": before["version"], "to": after["version"],
            "appeared": [b[k] for k in sorted(set(b) - set(a))] + [cb[k] for k in sorted(set(cb) - set(ca))],
            "vanished": [a[k] for k in sorted(set(a) - set(b))] + [ca[k] for k in sorted(set(ca) - set(cb))],
            # In both releases, but with another value or another verdict (known / unexpected).
            "changed": [{"before": old[k], "after": new[k]} for old, new in ((a, b), (ca, cb))
                        for k in sorted(set(old) & set(new)) if _changed(old[k], new[k])],
        })
    return out

def _changed(before: Mapping[str, Any], after: Mapping[str, Any]) -> bool:
    """Whether one divergence reads differently in two releases (its message without the
    release's replay line, or whether an expectation explains it)."""
    return before["message"] != after["message"] or before.get("known") != after.get("known")

def history(releases: Sequence[Mapping[str, Any]], *, no_expectations: bool = False) -> dict[str, Any]:
    """The ``kvconform.release-history/1`` document of checked releases, oldest first: one
    construction whether the releases ran in turn (``build``) or as Ray tasks
    (``conformance.distributed``)."""
    releases = list(releases)
    for release in releases:
        for d in release["run"].get("divergences", []):
            d.setdefault("id", divergence_id(d))
        for name, check in release.get("checks", {}).items():
            for f in check.get("failures", []):
                f.setdefault("id", divergence_id({"case": f["case"], "runner": f["runner"],
                                                  "kind": f"{name}_{f.get('status', 'failure')}", "field": name}))
    return {"schema": SCHEMA, "created": time.time(), "expectations": "none" if no_expectations else "shipped",
            "releases": releases, "transitions": transitions(releases)}

VOLATILE_FIELDS = ("created", "seconds", "ray")
"""What differs between two histories of the same releases made at different times or places:
when it was made, how long each step took, and where a Ray task ran."""

def comparable(value: Any) -> Any:
    """``value`` (a history or part of one) without ``VOLATILE_FIELDS``: two matrices of the
    same releases, one serial and one on Ray, are equal after this."""
    if isinstance(value, Mapping):
        return {k: comparable(v) for k, v in value.items() if k not in VOLATILE_FIELDS}
    if isinstance(value, list):
        return [comparable(v) for v in value]
    return value

def _history_problem(doc: Any) -> str | None:
    """What makes ``doc`` no ``kvconform.release-history/1`` document, or None (the fields the
    renderings and transitions read, with their types)."""
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        return f"schema {doc.get('schema') if isinstance(doc, dict) else type(doc).__name__!r} is not {SCHEMA!r}"
    releases = doc.get("releases")
    if not isinstance(releases, list) or not releases:
        return "releases: expected a non-empty list"
    text = (str,)
    for i, r in enumerate(releases):
        where = f"releases[{i}]"
        if not isinstance(r, dict) or not isinstance(r.get("version"), str):
            return f"{where}: expected an object with a version string"
        run, checks = r.get("run"), r.get("checks", {})
        if not isinstance(run, dict) or type(run.get("exit")) is not int or not isinstance(run.get("line", ""), str):
            return f"{where}.run: expected an object with an integer exit"
        if not isinstance(run.get("counts", {}), dict) or not all(type(n) is int for n in run.get("counts", {}).values()):
            return f"{where}.run.counts: expected integers by outcome"
        for j, d in enumerate(run.get("divergences", []) if isinstance(run.get("divergences", []), list) else [None]):
            if not isinstance(d, dict) or not all(isinstance(d.get(k), text) for k in ("case", "runner", "kind", "field", "message")):
                return f"{where}.run.divergences[{j}]: expected case, runner, kind, field and message strings"
        if not isinstance(checks, dict):
            return f"{where}.checks: expected an object by check"
        for name, c in checks.items():
            if not isinstance(c, dict) or type(c.get("exit")) is not int or not isinstance(c.get("counts") or {}, dict):
                return f"{where}.checks.{name}: expected an object with an integer exit"
            for j, f in enumerate(c.get("failures", []) if isinstance(c.get("failures", []), list) else [None]):
                if not isinstance(f, dict) or not all(isinstance(f.get(k), text) for k in ("case", "runner", "detail")):
                    return f"{where}.checks.{name}.failures[{j}]: expected case, runner and detail strings"
    return None

def load_history(path: str | Path) -> tuple[dict[str, Any] | None, str | None]:
    """(history, None) for a ``kvconform matrix --json`` file, else (None, one line why): its
    transitions and ids made anew from its releases, so an older history renders like a new one."""
    from conformance.report_formats import read_json_file

    doc, problem = read_json_file(path, "release history", missing="release history")
    if problem:
        return None, problem
    try:
        problem = _history_problem(doc)
    except RecursionError:
        problem = "nested too deep"
    if problem:
        return None, f"{path}: not a kvconform release history: {problem}"
    made = history(doc["releases"], no_expectations=doc.get("expectations") == "none")
    made["created"] = doc.get("created", made["created"])
    if "ray" in doc:
        made["ray"] = doc["ray"]
    return made, None


__all__ = ["CONNECTORS", "SCHEMA", "VOLATILE_FIELDS", "comparable", "divergence_id", "history", "load_history",
           "transitions", "unexpected"]
