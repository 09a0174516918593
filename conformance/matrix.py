"""``kvconform matrix``: one report of release x check, across vLLM releases.

Each release runs, in its own venv and process, that venv's ``kvconform run`` on the cases
its driver takes, then the built-in connector checks: every check is the same code as a
user's there. The ``kvconform.release-history/1`` result (JSON, Markdown, HTML) lists each
release's divergences (*known* when a shipped expectation cites the upstream bug, else
*unexpected*) and what appears and vanishes between consecutive releases.
"""

from __future__ import annotations

import html
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from reference.gen1 import check_gen1_version

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = "kvconform.release-history/1"
CONNECTORS = {"nixl": "gpu_impl.connectors.nixl:NixlAdapter", "mooncake": "gpu_impl.connectors.mooncake:MooncakeAdapter"}
STEP_TIMEOUT_S = 1800


def release_cases(version: str) -> list[Any]:
    """The cases a release is checked on: the generation-1 release cases for 0.19 to 0.28,
    the named cases otherwise (a release no driver handles says so in one line)."""
    from reference.errors import ConfigError, NotModeledError

    try:
        check_gen1_version(version)  # reference.gen1's own range of generation-1 releases
    except (ConfigError, NotModeledError):
        pass
    else:
        from suites.release_cases import gen1_cases

        return gen1_cases(version)
    from suites.named_cases import CASES

    return list(CASES.values())


def _venv_prefix(version: str) -> str:
    """Put that release's venv first on PATH for the rest of the replay line."""
    return f'export PATH="$(bash scripts/release_env.sh {version} | tail -n 1)/bin:$PATH" &&'


def _run(cmd: Sequence[str], env: Mapping[str, str]) -> tuple[int, str]:
    try:
        proc = subprocess.run(list(cmd), cwd=ROOT, env=dict(env), capture_output=True, text=True, timeout=STEP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {STEP_TIMEOUT_S} s"
    # The command's own verdict lines, not where it put vLLM's log (a temporary path).
    lines = [line for line in (proc.stderr + proc.stdout).splitlines()
             if line.startswith("kvconform:") and "own output:" not in line and "request schedules" not in line]
    return proc.returncode, (lines[-1] if lines else (proc.stderr.strip().splitlines() or [""])[-1])[:400]


def _divergences(report: Mapping[str, Any], version: str) -> list[dict[str, Any]]:
    """Each divergence of a run report, with its replay line in that release's venv and
    ``known``: the id of the shipped expectation that explains it (an upstream bug with its
    citation), or None for an unexpected one (which fails the run)."""
    out = []
    for result in report.get("results", []):
        replay = f"{_venv_prefix(version)} {result.get('replay', '')}"
        for runner, row in result.get("runners", {}).items():
            for d in row.get("divergences", []):
                out.append({"case": result["case"], "runner": runner, "kind": d["kind"], "field": d["field"],
                            "message": d["message"], "replay": replay, "known": d.get("expected_by")})
        for m in result.get("mrv1_mrv2_mismatches", []):
            out.append({"case": result["case"], "runner": "mrv1/mrv2", "kind": "mrv1_mrv2_mismatch", "field": m["field"],
                        "message": f"{result['case']} [mrv1/mrv2] mrv1_mrv2_mismatch: {m['field']}: MRv1 {m['mrv1']} vs MRv2 {m['mrv2']}",
                        "replay": replay, "known": m.get("expected_by")})
    return out


def unexpected(run: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The divergences of one release's run that no shipped expectation explains."""
    return [d for d in run.get("divergences", []) if not d.get("known")]


def _label(d: Mapping[str, Any]) -> str:
    if d.get("known"):
        return f"known upstream [{d['known']}]"
    if str(d.get("kind", "")).endswith("_refusal"):  # a connector refusing at registration
        return "refusal the reference predicts" if "predicted by the reference" in d["message"] else "refusal, not predicted"
    return "unexpected"


def check_release(version: str, venv: Path, workdir: Path, *, no_expectations: bool = False) -> dict[str, Any]:
    """``kvconform run`` and the connector checks of one release, each in its own process
    (``no_expectations``: every divergence and connector failure counts as unexpected)."""
    env = dict(os.environ, PATH=f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}", VIRTUAL_ENV=str(venv),
               CUDA_VISIBLE_DEVICES="", KVCONFORM_VLLM_LOG=str(workdir / f"vllm-{version}.log"))
    cases = release_cases(version)
    case_files = []
    for i, case in enumerate(cases):
        path = workdir / f"{version}-case-{i}.json"
        path.write_text(case.to_json())
        case_files += ["--case", str(path)]
    report_path = workdir / f"run-{version}.json"
    t0 = time.monotonic()
    raw = ["--no-expectations"] if no_expectations else []
    code, line = _run([str(venv / "bin" / "kvconform"), "run", *case_files, *raw, "--json", str(report_path)], env)
    run: dict[str, Any] = {"exit": code, "line": line, "cases": len(cases), "seconds": round(time.monotonic() - t0, 1)}
    if report_path.exists():
        report = json.loads(report_path.read_text())
        run.update(counts=report.get("counts", {}), complete=report.get("complete"),
                   vllm=(report.get("environment") or {}).get("vllm"), divergences=_divergences(report, version))
    checks = {}
    for name, adapter in CONNECTORS.items():
        target = workdir / f"check-{name}-{version}.json"
        # Generation 1: the release's cases (its own Mooncake worker; NIXL says it has no
        # generation-1 driver). Generation 2: four named cases.
        gen1 = [path for path, c in zip(case_files[1::2], cases) if c.generation == 1]
        first = [c for c in cases if c.generation == 2][:4]
        args = ([arg for path in gen1 for arg in ("--case", path)] or
                [arg for c in first for arg in ("--case", c.name)] or ["--case", "flashinfer-b128-k64"])
        code, line = _run([str(venv / "bin" / "kvconform"), "check", "--connector", adapter, *args, *raw, "--json", str(target)], env)
        shown = "" if gen1 else " " + shlex.join(args)  # generation-1 cases: the release's own (bare check)
        checks[name] = {"exit": code, "line": line,
                        "replay": f"{_venv_prefix(version)} kvconform check --connector {adapter}{shown}"}
        if target.exists():
            found = json.loads(target.read_text())
            checks[name]["counts"] = found.get("counts") or _connector_counts(found)
            checks[name]["failures"] = [
                {"case": r["case"], "runner": r["runner"], "status": r["status"], "detail": r["detail"],
                 "findings": r.get("findings", [])[:2], "known": r.get("expected_by"),
                 "replay": f"{_venv_prefix(version)} {r.get('replay', '')}"}
                for r in found.get("results", []) if r.get("status") in ("failure", "refusal")]
    return {"version": version, "venv": str(venv), "run": run, "checks": checks}


def _connector_counts(report: Mapping[str, Any]) -> dict[str, int]:
    """Status counts of a generation-2 connector report (its results carry ``status``)."""
    counts: dict[str, int] = {}
    for r in report.get("results", []):
        status = str(r.get("status", "?"))
        counts[status] = counts.get(status, 0) + 1
    return counts


def _check_cell(c: Mapping[str, Any]) -> str:
    counts = ", ".join(f"{n} {k}" for k, n in sorted((c.get("counts") or {}).items()) if n)
    known = sum(1 for f in c.get("failures", []) if f.get("known"))
    counts += f" ({known} known upstream)" if known else ""
    return f"exit {c['exit']}: {counts}" if counts else f"exit {c['exit']}"


def _key(d: Mapping[str, Any]) -> tuple[str, str, str, str]:
    return (d["case"], d["runner"], d["kind"], d["field"])


def _check_findings(release: Mapping[str, Any]) -> dict[tuple[str, str, str, str], dict[str, Any]]:
    """A release's connector refusals and failures, keyed by (check, case, runner, status),
    as divergences of the run are (message and replay line)."""
    out = {}
    for name, check in release.get("checks", {}).items():
        for f in check.get("failures", []):
            status = f.get("status", "failure")
            message = f"{name} check: {f['case']} [{f['runner']}] {status}: {f['detail']}"
            out[(name, f["case"], f["runner"], status)] = {"case": f["case"], "runner": f["runner"], "kind": f"{name}_{status}",
                                                           "field": name, "message": message, "replay": f["replay"],
                                                           "known": f.get("known")}
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
        })
    return out


def build(versions: Sequence[str], venv_of: Callable[[str], Path], workdir: Path, *, say: Callable[[str], None] = print,
          no_expectations: bool = False) -> dict[str, Any]:
    """The release history of ``versions``, each checked in turn in this process's machine."""
    releases = []
    for version in versions:
        say(f"kvconform: matrix: vLLM {version}")
        releases.append(check_release(version, venv_of(version), workdir, no_expectations=no_expectations))
        say(release_line(releases[-1]))
    return history(releases, no_expectations=no_expectations)


def release_line(release: Mapping[str, Any]) -> str:
    """One line saying how one release's check went (printed as each release finishes)."""
    run = release["run"]
    return (f"kvconform: matrix: vLLM {release['version']}: run exit {run['exit']}, {len(unexpected(run))} unexpected and "
            f"{len(run.get('divergences', [])) - len(unexpected(run))} known divergence(s)")


def history(releases: Sequence[Mapping[str, Any]], *, no_expectations: bool = False) -> dict[str, Any]:
    """The ``kvconform.release-history/1`` document of checked releases, oldest first: one
    construction whether the releases ran in turn (``build``) or as Ray tasks
    (``conformance.distributed``)."""
    releases = list(releases)
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


def release_venv(version: str) -> Path:
    """``scripts/release_env.sh VERSION``'s venv (made on first use)."""
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "release_env.sh"), version], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"scripts/release_env.sh {version} failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    return Path(proc.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- rendering


def to_markdown(history: Mapping[str, Any]) -> str:
    lines = ["# kvconform release history", "",
             "Each release in its own venv (`scripts/release_env.sh`), judged by the reference for that release; "
             "a divergence is *known* when a shipped expectation (conformance/expectations.toml) cites the upstream "
             "bug behind it, *unexpected* otherwise.", "",
             "| release | run | unexpected | known | NIXL check | Mooncake check |", "|---|---|---|---|---|---|"]
    if history.get("expectations") == "none":
        lines[2:2] = ["Judged without the shipped expectations (`--no-expectations`): known upstream bugs count as unexpected.", ""]
    for r in history["releases"]:
        run = r["run"]
        counts = ", ".join(f"{n} {k}" for k, n in sorted((run.get("counts") or {}).items())) or run["line"]
        known = len(run.get("divergences", [])) - len(unexpected(run))
        lines.append(f"| {r['version']} | exit {run['exit']}: {counts} | {len(unexpected(run))} | {known} | "
                     f"{_check_cell(r['checks']['nixl'])} | {_check_cell(r['checks']['mooncake'])} |")
    for t in history["transitions"]:
        lines += ["", f"## {t['from']} -> {t['to']}", ""]
        for label in ("appeared", "vanished"):
            for d in t[label]:
                lines += [f"- {label} ({_label(d)}): `{d['message']}`", f"  - replay: `{d['replay']}`"]
        if not t["appeared"] and not t["vanished"]:
            lines.append("- no change in divergences")
    for r in history["releases"]:
        lines += ["", f"## vLLM {r['version']}", "", f"- run: exit {r['run']['exit']}: {r['run']['line']}"]
        for name, c in r["checks"].items():
            lines.append(f"- {name} check: {_check_cell(c)}: {c['line']}")
            for f in c.get("failures", []):
                label = f"{f.get('status', 'failure')}" + (f", known upstream [{f['known']}]" if f.get("known") else "")
                lines += [f"  - {f['case']} [{f['runner']}] ({label}): {f['detail']}"] + [f"    - {x}" for x in f["findings"]]
                lines.append(f"    - replay: `{f['replay']}`")
        for d in r["run"].get("divergences", []):
            lines += [f"- {_label(d)}: `{d['message']}`", f"  - replay: `{d['replay']}`"]
    return "\n".join(lines) + "\n"


def to_html(history: Mapping[str, Any]) -> str:
    """One standalone page: the release x check table, then the transitions and each release's divergences."""
    e = html.escape
    rows = "".join(
        f"<tr><td>{e(r['version'])}</td><td>exit {r['run']['exit']}: "
        f"{e(', '.join(f'{n} {k}' for k, n in sorted((r['run'].get('counts') or {}).items())) or r['run']['line'])}</td>"
        f"<td>{len(unexpected(r['run']))}</td><td>{len(r['run'].get('divergences', [])) - len(unexpected(r['run']))}</td>"
        + "".join(f"<td>{e(_check_cell(c))}: {e(c['line'])}</td>" for c in r["checks"].values())
        + "</tr>"
        for r in history["releases"]
    )
    parts = ["<!doctype html><meta charset=utf-8><title>kvconform release history</title>",
             "<style>body{font-family:sans-serif;margin:2em}td,th{border:1px solid #ccc;padding:4px;vertical-align:top}"
             "table{border-collapse:collapse}code{font-size:90%}</style>",
             "<h1>kvconform release history</h1>",
             f"<table><tr><th>release</th><th>run</th><th>unexpected</th><th>known</th>{''.join(f'<th>{e(n)} check</th>' for n in CONNECTORS)}</tr>{rows}</table>"]
    for t in history["transitions"]:
        items = [f"<li>{label} ({e(_label(d))}): <code>{e(d['message'])}</code><br>replay: <code>{e(d['replay'])}</code></li>"
                 for label in ("appeared", "vanished") for d in t[label]]
        parts.append(f"<h2>{e(t['from'])} &rarr; {e(t['to'])}</h2><ul>{''.join(items) or '<li>no change in divergences</li>'}</ul>")
    return "\n".join(parts) + "\n"


def write(history: Mapping[str, Any], json_path: Path | None, markdown: Path | None, html_path: Path | None) -> None:
    if json_path is not None:
        json_path.write_text(json.dumps(history, indent=1, sort_keys=True) + "\n")
    if markdown is not None:
        markdown.write_text(to_markdown(history))
    if html_path is not None:
        html_path.write_text(to_html(history))


def main_matrix(versions: Sequence[str], venvs: Mapping[str, Path], json_path: Path | None, markdown: Path | None,
                html_path: Path | None, *, no_expectations: bool = False) -> int:
    """0: every release ran without an unexpected divergence; 1: a release had one; 5: none ran."""
    with tempfile.TemporaryDirectory(prefix="kvconform-matrix-") as tmp:
        doc = build(versions, lambda v: venvs.get(v) or release_venv(v), Path(tmp), say=lambda line: print(line, file=sys.stderr),
                    no_expectations=no_expectations)
    return finish(doc, json_path, markdown, html_path)


def finish(doc: Mapping[str, Any], json_path: Path | None, markdown: Path | None, html_path: Path | None) -> int:
    """Write a history's files, print its table; the matrix's exit code."""
    write(doc, json_path, markdown, html_path)
    print(to_markdown(doc).split("\n## ")[0])
    runs = [r["run"] for r in doc["releases"]]
    if any(unexpected(run) for run in runs):
        return 1
    return 0 if any(run["exit"] in (0, 1) for run in runs) else 5


__all__ = ["build", "check_release", "comparable", "finish", "history", "release_line", "release_venv", "unexpected", "main_matrix", "release_cases", "to_html", "to_markdown", "transitions", "write"]
