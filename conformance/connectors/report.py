"""The connector report: connector x case x runner, as JSON, Markdown and one HTML page.

``kvconform check --all`` runs every built-in adapter (``gpu_impl.connectors.BUILT_IN``) over
the named cases and both runners; ``connector_report`` gathers the ``ConnectorReport``s into
one ``kvconform.connector-report/2`` document, which ``to_markdown`` / ``to_html`` render with
the run reports' conventions (summary first, failures open, each with its diagnosis, config
and replay line). Pure standard library: rendering needs neither vLLM nor torch.
"""

from __future__ import annotations

import html as _html
import json
from dataclasses import asdict
from typing import Any, Mapping, Sequence

from conformance.connectors.results import STATUSES, ConnectorReport

SCHEMA_ID = "kvconform.connector-report/2"
_ORDER = ("failure", "refusal", "unsupported", "skipped", "pass")


def connector_report(reports: Sequence[ConnectorReport], *, vllm_version: str | None, not_driven: Mapping[str, str] = {},
                     names: Mapping[str, str] = {}, duration_s: float | None = None) -> dict[str, Any]:
    """One document for all connectors. ``names``: adapter label -> vLLM connector class."""
    connectors = []
    for report in reports:
        results = []
        for r in report.results:
            row = asdict(r)
            row["connector"] = names.get(report.connector, report.connector)
            row["divergences"] = [asdict(d) for d in report.divergences if d.case == r.case and d.runner == r.runner]
            results.append(row)
        connectors.append({"connector": names.get(report.connector, report.connector), "adapter": report.connector,
                           "counts": report.counts(), "results": results})
    totals = {s: sum(c["counts"][s] for c in connectors) for s in STATUSES}
    return {"schema": SCHEMA_ID, "vllm": vllm_version, "duration_s": duration_s, "totals": totals,
            "connectors": connectors,
            "not_driven": [{"connector": name, "reason": why} for name, why in sorted(not_driven.items())]}


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{counts[s]} {s}" for s in _ORDER if counts.get(s))


def _worst(results: Sequence[Mapping[str, Any]]) -> str:
    statuses = {r["status"] for r in results}
    return next((s for s in _ORDER if s in statuses), "none")


def _md(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _cases(doc: Mapping[str, Any]) -> list[str]:
    return list(dict.fromkeys(r["case"] for c in doc["connectors"] for r in c["results"]))


def _cell(results: Sequence[Mapping[str, Any]]) -> str:
    """``pass`` or ``mrv1 failure / mrv2 pass`` for one connector x case."""
    statuses = {r["runner"]: r["status"] for r in results}
    if len(set(statuses.values())) == 1:
        return next(iter(statuses.values()))
    return " / ".join(f"{runner} {status}" for runner, status in statuses.items())


def _vllms(doc: Mapping[str, Any]) -> str:
    """``vLLM 0.33.0``, or for a merge of several vLLMs ``vLLM 0.32.0 and 0.33.0 side by side``."""
    envs = doc.get("environments")
    if not envs:
        return f"vLLM {doc.get('vllm')}"
    return "vLLM " + " and ".join(str(e.get("vllm")) for e in envs) + " side by side"


def _label(doc: Mapping[str, Any], connector: Mapping[str, Any]) -> str:
    """A connector's column: its name, and in a merge of several vLLMs which one."""
    if "environment" not in connector or not doc.get("environments"):
        return connector["connector"]
    return f"{connector['connector']} (vLLM {doc['environments'][connector['environment']].get('vllm')})"


def to_markdown(doc: Mapping[str, Any]) -> str:
    out = [f"# kvconform connector report: {_vllms(doc)}", ""]
    out.append(f"Every built-in connector adapter over every named case and both runners, on the `kv_caches` each "
               f"runner registered; {_counts(doc['totals'])}.")
    out.append("A failure a shipped expectation cites as a known upstream bug (`conformance/expectations.toml`, "
               "written up in `docs/findings/`) is counted under *known*; any other failure fails the check.")
    out += ["", "| connector | failure (known) | " + " | ".join(_ORDER[1:]) + " |", "|---|" + "---|" * len(_ORDER)]
    for c in doc["connectors"]:
        known = sum(1 for r in c["results"] if r["status"] == "failure" and r.get("expected_by"))
        out.append(f"| {_label(doc, c)} | {c['counts'].get('failure', 0)} ({known}) | "
                   + " | ".join(str(c["counts"].get(s, 0)) for s in _ORDER[1:]) + " |")
    if doc.get("not_driven"):
        out += ["", "## Not driven", ""]
        out += [f"- **{n['connector']}**: {n['reason']}" for n in doc["not_driven"]]
    cases = _cases(doc)
    out += ["", "## Connector x case", "", "| case | " + " | ".join(_label(doc, c) for c in doc["connectors"]) + " |",
            "|---|" + "---|" * len(doc["connectors"])]
    for case in cases:
        cells = [_cell([r for r in c["results"] if r["case"] == case]) or "-" for c in doc["connectors"]]
        out.append(f"| `{case}` | " + " | ".join(cells) + " |")
    for status, title in (("failure", "Failures"), ("refusal", "Refusals"), ("unsupported", "Unsupported")):
        rows = [(c, r) for c in doc["connectors"] for r in c["results"] if r["status"] == status]
        if not rows:
            continue
        out += ["", f"## {title}", ""]
        for c, r in rows:
            known = f" (known upstream [{r['expected_by']}], cause `{r.get('cause')}`)" if r.get("expected_by") else (
                f" (UNEXPECTED, cause `{r.get('cause')}`)" if status == "failure" else "")
            out.append(f"- **{_label(doc, c)}** `{r['case']}` [{r['runner']}]: {_md(r['detail'])}{known}")
            for d in r.get("divergences", [])[:6]:
                out.append(f"  - {_md(d['layer'])}: {d['field']}: {_md(d['message'])}")
            if status == "failure":
                out.append(f"  - replay: `{r['replay']}`")
    return "\n".join(out) + "\n"


_CSS = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:2rem auto;max-width:1200px;padding:0 1rem;color:#1f2328}
h1{font-size:1.6rem}h2{font-size:1.2rem;margin-top:2rem;border-bottom:1px solid #d0d7de}
table{border-collapse:collapse}th,td{border:1px solid #d0d7de;padding:.25rem .5rem;text-align:left;vertical-align:top;font-size:13px}
th{background:#f6f8fa}code,pre{font:12px/1.4 ui-monospace,Menlo,Consolas,monospace}
pre{background:#f6f8fa;border:1px solid #d0d7de;padding:.5rem;white-space:pre-wrap;word-break:break-all}
.s-pass{background:#dafbe1;color:#116329}.s-failure{background:#ffebe9;color:#a40e26;font-weight:600}
.s-refusal{background:#fff8c5;color:#7d4e00}.s-unsupported,.s-skipped,.s-none{background:#eaeef2;color:#57606a}
details{border:1px solid #d0d7de;border-radius:6px;margin:.3rem 0;padding:.3rem .7rem}summary{cursor:pointer}
""".strip()


def _e(text: Any) -> str:
    return _html.escape(str(text), quote=True)


def to_html(doc: Mapping[str, Any]) -> str:
    title = f"kvconform connector report: {_vllms(doc)}"
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>", f"<h1>{_e(title)}</h1>",
           f"<p>{_e(_counts(doc['totals']))} (connector x case x runner, on the tensors each runner registered).</p>"]
    cases = _cases(doc)
    out.append("<table><tr><th>case</th>" + "".join(f"<th>{_e(_label(doc, c))}</th>" for c in doc["connectors"]) + "</tr>")
    for case in cases:
        row = [f"<th><code>{_e(case)}</code></th>"]
        for c in doc["connectors"]:
            results = [r for r in c["results"] if r["case"] == case]
            row.append(f'<td class="s-{_e(_worst(results))}">{_e(_cell(results) or "-")}</td>')
        out.append("<tr>" + "".join(row) + "</tr>")
    out.append("</table>")
    if doc.get("not_driven"):
        out.append("<h2>Not driven</h2><ul>" + "".join(f"<li><b>{_e(n['connector'])}</b>: {_e(n['reason'])}</li>" for n in doc["not_driven"]) + "</ul>")
    out.append("<h2>Results</h2>")
    for c in doc["connectors"]:
        for r in sorted(c["results"], key=lambda r: _ORDER.index(r["status"]) if r["status"] in _ORDER else 0):
            opened = " open" if r["status"] == "failure" else ""
            out.append(f'<details{opened}><summary><span class="s-{_e(r["status"])}">{_e(r["status"])}</span> '
                       f"<b>{_e(_label(doc, c))}</b> <code>{_e(r['case'])}</code> [{_e(r['runner'])}]</summary>")
            out.append(f"<p>{_e(r['detail'])}</p>")
            if r["status"] == "failure":
                out.append(f"<p>{'known upstream [' + _e(r['expected_by']) + ']' if r.get('expected_by') else '<b>UNEXPECTED</b>'}, "
                           f"cause <code>{_e(r.get('cause'))}</code></p>")
            if r.get("divergences"):
                out.append("<ul>" + "".join(f"<li><code>{_e(d['layer'])}</code> {_e(d['field'])}: {_e(d['message'])}<br>"
                                            f"expected {_e(d['expected'])}; observed {_e(d['observed'])}</li>"
                                            for d in r["divergences"][:8]) + "</ul>")
            if r["status"] == "failure":
                out.append(f"<p>replay:</p><pre>{_e(r['replay'])}</pre><p>config:</p><pre>{_e(json.dumps(json.loads(r['config']), indent=2) if r.get('config') else '')}</pre>")
            out.append("</details>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


__all__ = ["SCHEMA_ID", "connector_report", "to_html", "to_markdown"]
