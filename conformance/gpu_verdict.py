"""Verdicts of the GPU path: each run's recording judged by the one comparator, and one summary.

A run's worker-connector recording becomes the one ``Observation`` type
(``gpu_impl.recording``) and goes through ``conformance.diff.compare`` (written tokens read
back included) and, per scenario, ``compare_runners``. Statuses: ``pass``, ``fail`` (exit 1),
``error`` / ``timeout`` / ``missing`` / ``skipped`` (no verdict: exit 3), ``not_modeled``.
Pure Python: no vLLM, no torch.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from conformance.diff import UNCHECKED_LAYERS, compare, compare_runners
from reference.config import CaseConfig
from reference.errors import ConfigError

VERDICT_ORDER = ("fail", "error", "timeout", "missing", "skipped", "not_modeled", "pass")
IMPLEMENTATION = "vllm engine on cuda"
_MAX_LISTED = 12
_DATA_KINDS = ("byte_range", "bound_storage")


def run_observation(report: Mapping[str, Any], case: CaseConfig, runner: str) -> Any:
    """One run's worker recording as an ``Observation`` (``gpu_impl.recording``)."""
    from gpu_impl.recording import observation_from_recording

    rec = {"ok": bool(report.get("ok")), "error": report.get("error"), "log": report.get("log_tail") or "",
           "worker": report.get("worker")}
    return observation_from_recording(case.name, runner, rec, implementation=IMPLEMENTATION)


def _divergence_record(d: Any) -> dict[str, Any]:
    return {"kind": d.kind, "field": d.field, "expected": d.expected, "observed": d.observed, "message": d.message,
            "basis": d.basis}


def data_summary(observation: Any, divergences: Iterable[Any]) -> dict[str, Any]:
    """How many written tokens were read back, and which of them the comparator failed."""
    writes = getattr(observation, "token_writes", None) or ()
    calls = {(w.layer, w.call) for w in writes}
    prefixes = {(w.layer, w.call): f"{w.layer} call {w.call} " for w in writes}
    problems = [d for d in divergences if d.kind in _DATA_KINDS and (d.field == "data check" or any(d.field.startswith(p) for p in prefixes.values()))]
    failed = {key for key, p in prefixes.items() for d in problems if d.field.startswith(p)}
    unchecked = next((d.observed for d in divergences if d.field == UNCHECKED_LAYERS), [])
    checked = sorted({w.layer for w in writes})
    drafts = [n for n in (getattr(observation, "registered", None) or {}) if n not in checked and n not in unchecked]
    return {
        "calls_checked": len(calls),
        "slots_checked": sum(1 for w in writes if w.slot is not None and w.problem is None),
        "failed_calls": len(failed),
        "layers_checked": checked,
        "unchecked_targets": list(unchecked),
        "unchecked_drafts": drafts,
        "problems": [d.message for d in problems[:_MAX_LISTED]],
        "num_problems": len(problems),
        "errors": list(getattr(observation, "token_write_errors", ()))[:_MAX_LISTED],
    }


def analyze_run(report: Mapping[str, Any] | None, *, basis: str = "facts") -> dict[str, Any]:
    """One run's verdict: ``status``, ``reasons``, ``divergences`` and ``data``; judged by
    the contract and the facts, or with ``basis="contract"`` by the contract alone."""
    if report is None:
        return {"status": "missing", "reasons": ["no report was written"]}
    spec = report.get("spec") or {}
    out: dict[str, Any] = {
        "run_id": report.get("run_id") or spec.get("run_id"),
        "scenario": spec.get("scenario"),
        "runner": spec.get("runner"),
        "backend": spec.get("backend"),
        "timings": report.get("timings", {}),
        "divergences": [],
        "reasons": [],
    }
    if report.get("skipped"):
        out.update(status="skipped", reasons=[str(report["skipped"])])
        return out
    try:
        case = CaseConfig.from_dict(spec["case"])
    except (KeyError, ConfigError) as exc:
        out.update(status="error", reasons=[f"no valid reference case in the spec: {exc}"])
        return out
    worker = report.get("worker") or {}
    if report.get("ok") and not worker:
        out.update(status="error", reasons=["the engine ran but the worker-side connector wrote no record"])
        return out
    use_v2 = worker.get("use_v2_model_runner")
    if isinstance(use_v2, bool) and use_v2 != (out["runner"] == "mrv2"):
        out.update(status="error", reasons=[f"asked for {out['runner']} but vLLM ran use_v2_model_runner={use_v2}"])
        return out
    timed_out = bool(report.get("timed_out")) and report.get("stage") != "done"
    if timed_out:
        out["reasons"].append(f"killed after {report.get('wall_s')} s at stage {report.get('stage')!r}")
        if not worker.get("registered"):
            out["status"] = "timeout"
            return out
    observation = run_observation(report, case, out["runner"])
    comparison = compare(case, out["runner"], observation, basis=basis)
    found = list(comparison.divergences)
    if timed_out:
        # A run killed part way: what it did not get to is no divergence.
        found = [d for d in found if d.kind != "engine_output" and d.field != UNCHECKED_LAYERS]
    out["observation"] = {"implementation": IMPLEMENTATION, "error": observation.error, "run_error": observation.run_error}
    out["divergences"] = [_divergence_record(d) for d in found]
    out["data"] = data = data_summary(observation, found)
    if comparison.status == "not_modeled":
        out.update(status="not_modeled", reasons=[f"reference: {comparison.detail}"])
        return out
    if found:
        out["reasons"].append(f"{len(found)} divergence(s) from the reference")
    if data["failed_calls"]:
        out["reasons"].append(f"data check failed in {data['failed_calls']} of {data['calls_checked']} checked calls")
    if data["unchecked_targets"]:
        out["reasons"].append(f"no data check ran for {', '.join(data['unchecked_targets'])}")
    if observation.error is not None and not found:
        out["reasons"].append(f"refused as predicted: {observation.error}")
    out["status"] = "fail" if found else ("timeout" if timed_out else "pass")
    return out


def runner_differences(case: CaseConfig, mrv1: Mapping[str, Any] | None, mrv2: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The two runners' runs of one scenario against each other (``expected`` = MRv1)."""
    if not mrv1 or not mrv2:
        return []
    obs1, obs2 = run_observation(mrv1, case, "mrv1"), run_observation(mrv2, case, "mrv2")
    return [_divergence_record(d) for d in compare_runners(case, obs1, obs2)]


def exit_code(statuses: Iterable[str]) -> int:
    """pytest-style: 0 all pass, 1 any fail, 3 no verdict for some run, 5 nothing ran."""
    statuses = list(statuses)
    if not statuses:
        return 5
    if "fail" in statuses:
        return 1
    if any(s != "pass" for s in statuses):
        return 3
    return 0


def summarize(reports: Mapping[str, Mapping[str, Any] | None], device: Mapping[str, Any] | None = None,
              *, basis: str = "facts") -> dict[str, Any]:
    """``reports``: ``{run_id: report or None}`` -> per-run verdicts, runner diffs, exit code.
    ``basis``: ``conformance.diff.compare``'s (``"contract"``: ``--contract-only``)."""
    runs = {}
    for rid, report in reports.items():
        analysis = analyze_run(report, basis=basis)
        analysis.setdefault("run_id", rid)
        runs[rid] = analysis
    by_scenario: dict[str, dict[str, Mapping[str, Any]]] = {}
    for rid, report in reports.items():
        if report and report.get("worker") and runs[rid].get("scenario"):
            by_scenario.setdefault(runs[rid]["scenario"], {})[runs[rid]["runner"]] = report
    differences = {}
    for scenario, pair in by_scenario.items():
        if "mrv1" in pair and "mrv2" in pair:
            try:
                case = CaseConfig.from_dict((pair["mrv1"].get("spec") or {})["case"])
            except (KeyError, ConfigError):
                continue  # analyze_run already says so for the run
            differences[scenario] = runner_differences(case, pair["mrv1"], pair["mrv2"])
    counts: dict[str, int] = {}
    for analysis in runs.values():
        counts[analysis["status"]] = counts.get(analysis["status"], 0) + 1
    return {
        "device": dict(device or {}),
        "runs": runs,
        "runner_differences": differences,
        "counts": counts,
        "exit_code": exit_code(a["status"] for a in runs.values()),
    }


def _short(value: Any, width: int = 100) -> str:
    text = " ".join((value if isinstance(value, str) else repr(value)).split())
    return text if len(text) <= width else text[: width - 3] + "..."


def format_summary(summary: Mapping[str, Any]) -> str:
    """Human-readable: one line per run, its reasons, then the MRv1/MRv2 differences."""
    lines = []
    device = summary.get("device") or {}
    if device:
        lines.append(
            "kvconform GPU path on "
            + ", ".join(f"{k}={device[k]}" for k in ("device", "capability", "vllm", "torch") if k in device)
        )
    for rid, a in summary["runs"].items():
        data = a.get("data") or {}
        t = a.get("timings") or {}
        extra = f"{data.get('slots_checked', 0)} slots checked" if data else "no data checks"
        lines.append(f"{a['status'].upper():8} {rid:32} {a.get('backend') or '':12} {extra}, {t.get('total_s', '?')} s")
        for reason in a.get("reasons", []):
            lines.append(f"         - {_short(reason, 160)}")
        for div in a.get("divergences", [])[:_MAX_LISTED]:
            lines.append(
                f"         {div['kind']}: {div['field']}: observed {_short(div['observed'])}, reference {_short(div['expected'])}"
            )
        for problem in (data.get("problems") or [])[:4]:
            lines.append(f"         data: {_short(problem, 200)}")
        if data.get("unchecked_drafts"):
            lines.append(f"         (no data check ran for draft layer(s) {', '.join(data['unchecked_drafts'])})")
    for scenario, diffs in summary.get("runner_differences", {}).items():
        if not diffs:
            lines.append(f"MRv1 == MRv2 for {scenario} (registered tensors, bound views, layout, groups, backends)")
            continue
        lines.append(f"MRv1 != MRv2 for {scenario}: {len(diffs)} difference(s)")
        for div in diffs[:_MAX_LISTED]:
            lines.append(f"         {div['field']}: MRv1 {_short(div['expected'])} vs MRv2 {_short(div['observed'])}")
    counts = ", ".join(f"{n} {s}" for s, n in sorted(summary["counts"].items(), key=lambda kv: VERDICT_ORDER.index(kv[0]) if kv[0] in VERDICT_ORDER else 99))
    lines.append(f"{counts or 'nothing ran'}; exit {summary['exit_code']}")
    return "\n".join(lines)


__all__ = [
    "analyze_run",
    "data_summary",
    "exit_code",
    "format_summary",
    "run_observation",
    "runner_differences",
    "summarize",
]
