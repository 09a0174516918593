"""``kvconform matrix``: one report of release x check, across vLLM releases.

Each release runs, in its own venv and process, that venv's ``kvconform run`` on the cases
its driver takes, then the built-in connector checks: every check is the same code as a
user's there. The ``kvconform.release-history/1`` result (JSON, Markdown, HTML) lists each
release's divergences (*known* when a shipped expectation cites the upstream bug, else
*unexpected*) and what appears and vanishes between consecutive releases.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from conformance.release_history import (CONNECTORS, SCHEMA, comparable, divergence_id, history, load_history,
                                         transitions, unexpected)
from reference.gen1 import check_gen1_version

ROOT = Path(__file__).resolve().parents[1]
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
        from suites.release_cases import gen1_cases, gen1_hybrid_cases

        return gen1_cases(version) + gen1_hybrid_cases(version)
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
    # The command's own verdict lines, not where it put vLLM's log (a temporary path); else its
    # last line of output (a connector check's count line), and only then the last line vLLM or
    # torch wrote (a crash says why there).
    lines = [line for line in (proc.stderr + proc.stdout).splitlines()
             if line.startswith("kvconform:") and "own output:" not in line and "request schedules" not in line]
    last = (proc.stdout.strip().splitlines() or proc.stderr.strip().splitlines() or [""])[-1]
    return proc.returncode, (lines[-1] if lines else last)[:400]


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


def check_release(version: str, venv: Path, workdir: Path, *, no_expectations: bool = False,
                  profile: str = "named") -> dict[str, Any]:
    """``kvconform run`` and the connector checks of one release, each in its own process
    (``no_expectations``: every divergence and connector failure counts as unexpected;
    ``profile``: ``kvconform run --profile``, the seeded random configs added to the release's
    cases: generation 1 draws them from what it has, ``suites.release_cases.gen1_sample_cases``)."""
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
    sampled = ["--profile", profile] if profile != "named" else []
    code, line = _run([str(venv / "bin" / "kvconform"), "run", *case_files, *sampled, *raw, "--json", str(report_path)], env)
    run: dict[str, Any] = {"exit": code, "line": line, "cases": len(cases), "seconds": round(time.monotonic() - t0, 1)}
    if report_path.exists():
        report = json.loads(report_path.read_text())
        schedules = report.get("schedules") or {}
        run.update(cases=len(report.get("results", [])) or len(cases), counts=report.get("counts", {}), complete=report.get("complete"),
                   vllm=(report.get("environment") or {}).get("vllm"), divergences=_divergences(report, version),
                   schedules=schedules.get("run") or {}, draft_steps=schedules.get("draft_steps") or {})
    checks = connector_checks(version, venv, cases, case_files, raw, env, workdir)
    return {"version": version, "venv": str(venv), "run": run, "checks": checks}


def gen2_connector_cases(cases: Sequence[Any]) -> list[Any]:
    """The cases each connector is checked on in a generation-2 release: its first four
    generation-2 cases (the dense layouts, one named case each)."""
    return [c for c in cases if c.generation == 2][:4]


def connector_checks(version: str, venv: Path, cases: Sequence[Any], case_files: Sequence[str], raw: Sequence[str],
                     env: Mapping[str, str], workdir: Path) -> dict[str, Any]:
    """Each built-in connector's ``kvconform check`` of one release (its own process), by name."""
    checks: dict[str, Any] = {}
    for name, adapter in CONNECTORS.items():
        target = workdir / f"check-{name}-{version}.json"
        # Generation 1: the release's cases (its own Mooncake worker; NIXL says it has no
        # generation-1 driver). Generation 2: four named cases.
        # (Not its Mamba hybrids: the adapters read attention views; suites.release_cases.gen1_hybrid_cases.)
        gen1 = [path for path, c in zip(case_files[1::2], cases)
                if c.generation == 1 and not any(layer.kind == "mamba" for layer in c.layers)]
        first = gen2_connector_cases(cases)
        args = ([arg for path in gen1 for arg in ("--case", path)] or
                [arg for c in first for arg in ("--case", c.name)] or ["--case", "flashinfer-b128-k64"])
        code, line = _run([str(venv / "bin" / "kvconform"), "check", "--connector", adapter, *args, *raw, "--json", str(target)], env)
        shown = "" if gen1 else " " + shlex.join(args)  # generation-1 cases: the release's own (bare check)
        checks[name] = {"exit": code, "line": line,
                        "replay": f"{_venv_prefix(version)} kvconform check --connector {adapter}{shown}"}
        if target.exists():
            found = json.loads(target.read_text())
            # Generation 1: one list of results and counts; generation 2 (kvconform.connector-report/2):
            # per connector, with the run's totals.
            results = found.get("results") or [r for c in found.get("connectors", []) for r in c.get("results", [])]
            checks[name]["counts"] = (found.get("counts") or {k: n for k, n in (found.get("totals") or {}).items() if n}
                                      or _connector_counts({"results": results}))
            checks[name]["failures"] = [
                {"case": r["case"], "runner": r["runner"], "status": r["status"], "detail": r["detail"],
                 "findings": (r.get("findings") or [_finding_line(d) for d in r.get("divergences", [])])[:2],
                 "known": r.get("expected_by"), "replay": f"{_venv_prefix(version)} {r.get('replay', '')}"}
                for r in results if r.get("status") in ("failure", "refusal")]
    return checks


def _finding_line(divergence: Any) -> str:
    """One line of a generation-2 connector divergence (a dict with a message, or text)."""
    if isinstance(divergence, Mapping):
        return str(divergence.get("message") or divergence.get("detail") or divergence)[:300]
    return str(divergence)[:300]


def _connector_counts(report: Mapping[str, Any]) -> dict[str, int]:
    """Status counts of a generation-2 connector report (its results carry ``status``)."""
    counts: dict[str, int] = {}
    for r in report.get("results", []):
        status = str(r.get("status", "?"))
        counts[status] = counts.get(status, 0) + 1
    return counts


def build(versions: Sequence[str], venv_of: Callable[[str], Path], workdir: Path, *, say: Callable[[str], None] = print,
          no_expectations: bool = False, profile: str = "named") -> dict[str, Any]:
    """The release history of ``versions``, each checked in turn in this process's machine."""
    releases = []
    for version in versions:
        say(f"kvconform: matrix: vLLM {version}")
        releases.append(check_release(version, venv_of(version), workdir, no_expectations=no_expectations, profile=profile))
        say(release_line(releases[-1]))
    return history(releases, no_expectations=no_expectations)


def release_line(release: Mapping[str, Any]) -> str:
    """One line saying how one release's check went (printed as each release finishes)."""
    run = release["run"]
    return (f"kvconform: matrix: vLLM {release['version']}: run exit {run['exit']}, {len(unexpected(run))} unexpected and "
            f"{len(run.get('divergences', [])) - len(unexpected(run))} known divergence(s)")


def release_venv(version: str) -> Path:
    """``scripts/release_env.sh VERSION``'s venv (made on first use)."""
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "release_env.sh"), version], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"scripts/release_env.sh {version} failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    return Path(proc.stdout.strip().splitlines()[-1])


def write(history: Mapping[str, Any], json_path: Path | None, markdown: Path | None, html_path: Path | None) -> None:
    """The history's files; the Markdown links each divergence id to the HTML page written beside it."""
    from conformance.history_formats import to_html, to_markdown

    if json_path is not None:
        json_path.write_text(json.dumps(history, indent=1, sort_keys=True) + "\n")
    if markdown is not None:
        link = os.path.relpath(html_path, markdown.parent) if html_path is not None else None
        markdown.write_text(to_markdown(history, html_link=link))
    if html_path is not None:
        html_path.write_text(to_html(history))


def main_matrix(versions: Sequence[str], venvs: Mapping[str, Path], json_path: Path | None, markdown: Path | None,
                html_path: Path | None, *, no_expectations: bool = False, profile: str = "named") -> int:
    """0: every release ran without an unexpected divergence; 1: a release had one; 5: none ran."""
    with tempfile.TemporaryDirectory(prefix="kvconform-matrix-") as tmp:
        doc = build(versions, lambda v: venvs.get(v) or release_venv(v), Path(tmp), say=lambda line: print(line, file=sys.stderr),
                    no_expectations=no_expectations, profile=profile)
    return finish(doc, json_path, markdown, html_path)


def finish(doc: Mapping[str, Any], json_path: Path | None, markdown: Path | None, html_path: Path | None) -> int:
    """Write a history's files, print its table; the matrix's exit code."""
    from conformance.history_formats import summary_table

    write(doc, json_path, markdown, html_path)
    print(summary_table(doc))
    runs = [r["run"] for r in doc["releases"]]
    if any(unexpected(run) for run in runs):
        return 1
    return 0 if any(run["exit"] in (0, 1) for run in runs) else 5


# The document's own names (conformance.release_history), here too for callers of the matrix.
__all__ = ["CONNECTORS", "SCHEMA", "build", "check_release", "comparable", "divergence_id", "finish", "history", "load_history",
           "gen2_connector_cases", "main_matrix", "release_cases", "release_line", "release_venv", "transitions", "unexpected", "write"]
