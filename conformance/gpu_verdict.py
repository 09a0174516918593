"""Turn the per-run reports of the GPU path into verdicts and one summary.

For each run (``run_one``'s report, plus what the orchestrator adds: ``timed_out``,
``returncode``, ``log_tail``):

- ``diff_registered``: what the worker's connector recorded (``register_kv_caches``
  tensors, layout, groups, placement, kernel block sizes as registered, backends)
  against ``reference.derive.derive(case, runner)``;
- ``data_summary``: the worker's observations of written tokens
  (``gpu_impl.cuda.datacheck``: where vLLM's registered and bound views put each token's
  K and V, and whether those bytes were written) against the byte runs the reference
  predicts (``reference.token_bytes``): how many slots were judged, which failed, and
  which layers were never observed;
- ``runner_differences``: the MRv1 and MRv2 recordings of one scenario against each
  other, reference-free (registered tensors, bound views, layout, groups, backends).

Statuses: ``pass``; ``fail`` (a divergence from the reference or a failed data check:
exit 1); ``error`` / ``timeout`` / ``missing`` / ``skipped`` (the run did not produce a
verdict: exit 3 when nothing failed). Pure Python (imports ``reference``): the judge of
what ``gpu_impl.cuda`` observed.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from reference.config import CaseConfig
from reference.errors import ConfigError, NotModeledError, StartupError

VERDICT_ORDER = ("fail", "error", "timeout", "missing", "skipped", "not_modeled", "pass")
_VIEW_FIELDS = ("shape", "stride", "dtype", "storage_offset", "byte_offset", "storage_nbytes")
_MAX_LISTED = 12


def _div(kind: str, field: str, expected: Any, observed: Any) -> dict[str, Any]:
    return {"kind": kind, "field": field, "expected": expected, "observed": observed}


class _Diff:
    def __init__(self) -> None:
        self.out: list[dict[str, Any]] = []

    def cmp(self, kind: str, field: str, expected: Any, observed: Any) -> bool:
        if expected != observed:
            self.out.append(_div(kind, field, expected, observed))
            return False
        return True


def reference_view(view) -> dict[str, Any]:
    """A reference ``TensorView`` in the recorder's ``describe_tensor`` terms."""
    return {
        "shape": list(view.shape),
        "stride": list(view.stride),
        "dtype": view.dtype,
        "storage_offset": view.storage_offset,
        "byte_offset": view.byte_offset,
        "storage_nbytes": view.storage_nbytes,
    }


def observed_kernel_block_sizes(worker: Mapping[str, Any]) -> list[Any]:
    """Per KV cache group, the tokens per block of its registered views (``shape[2]``).

    One int per group when its views agree, the sorted distinct values when they do not,
    None for a group without a registered 4-D view.
    """
    registered = worker.get("registered") or {}
    out: list[Any] = []
    for group in (worker.get("kv_cache_config") or {}).get("kv_cache_groups") or []:
        sizes = sorted({registered[n]["shape"][2] for n in group["layer_names"] if n in registered and len(registered[n]["shape"]) == 4})
        out.append(sizes[0] if len(sizes) == 1 else (sizes or None))
    return out


def diff_registered(d, worker: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Everything the worker recorded that the reference (``d``: a Derivation) predicts."""
    c = _Diff()
    registered: Mapping[str, Any] = worker.get("registered") or {}
    c.cmp("registered_names", "registered layers", sorted(d.registered), sorted(registered))
    for name, view in d.registered.items():
        obs = registered.get(name)
        if obs is None:
            continue
        exp = reference_view(view)
        if c.cmp("registered_shape", f"{name}.shape", exp["shape"], list(obs.get("shape", []))):
            c.cmp("registered_stride", f"{name}.stride", exp["stride"], list(obs.get("stride", [])))
        for key in ("dtype", "storage_offset", "byte_offset", "storage_nbytes"):
            if key in obs:
                c.cmp(f"registered_{key}", f"{name}.{key}", exp[key], obs[key])
    if worker.get("resolved_layout") is not None:
        c.cmp("layout", "layout", d.layout.name, worker.get("resolved_layout"))
    kv = worker.get("kv_cache_config") or {}
    if kv:
        c.cmp("num_blocks", "num_blocks", d.num_blocks, kv.get("num_blocks"))
        c.cmp(
            "groups",
            "groups",
            [[list(g.layer_names), g.spec.block_size] for g in d.groups],
            [[list(g["layer_names"]), g["kv_cache_spec"].get("block_size")] for g in kv.get("kv_cache_groups") or []],
        )
        exp_t = {tuple(t.layers): [t.size, t.layer_stride, t.block_stride, t.offset] for t in d.plan.tensors}
        obs_t = {
            tuple(t["layers"]): [t.get("size"), t.get("layer_stride"), t.get("block_stride"), t.get("offset")]
            for t in kv.get("kv_cache_tensors") or []
        }
        if c.cmp("tensor_placement", "kv_cache_tensors.layers", sorted(exp_t), sorted(obs_t)):
            for layers, e in exp_t.items():
                c.cmp("tensor_placement", f"kv_cache_tensor[{layers[0]}] size/layer_stride/block_stride/offset", e, obs_t[layers])
        c.cmp("kernel_block_size", "kernel_block_sizes (as registered)", list(d.kernel_block_sizes), observed_kernel_block_sizes(worker))
    for name, backend in sorted((worker.get("layer_backends") or {}).items()):
        c.cmp("layer_backend", f"{name}.backend", d.layer_backends.get(name), backend)
    return c.out


def _runs(runs: Iterable[Iterable[int]]) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, b in runs]


def judge_token(d, layer: str, token: Mapping[str, Any], *, shift_bytes: int = 0) -> list[str]:
    """What is wrong with one observed token (empty: it is where the reference says).

    ``shift_bytes`` moves the prediction (a deliberately wrong one, for tests).
    """
    from reference.token_bytes import token_bytes

    if token.get("error"):
        return [f"not observed: {token['error']}"]
    predicted = token_bytes(d, layer, int(token["slot"]))
    if shift_bytes:
        predicted = predicted.shifted(shift_bytes)
    problems: list[str] = []
    observed = {int(h["head"]): h for h in token.get("heads") or []}
    for head in predicted.heads:
        seen = observed.get(head.head)
        if seen is None:
            problems.append(f"head {head.head}: not in the registered view")
            continue
        for part, want in (("K", list(head.k)), ("V", list(head.v))):
            got = _runs(seen["k" if part == "K" else "v"])
            if got != want:
                problems.append(f"head {head.head} {part}: the registered view puts it at {got}, the reference at {want}")
    if len(observed) != len(predicted.heads):
        problems.append(f"{len(observed)} heads in the registered view, the reference predicts {len(predicted.heads)}")
    if not token.get("k_nonzero"):
        problems.append("K: all zero where the registered view puts it (nothing written there)")
    if token.get("v_nonzero") is False:
        problems.append("V: all zero where the registered view puts it (nothing written there)")
    if "bound_equal" in token and not token["bound_equal"]:
        problems.append(
            "the layer's bound view (what the cache-update kernel writes through) holds other bytes for this token "
            "than the registered view" + ("" if token.get("bound_same_storage") else " (different allocations)")
        )
    return problems


def data_summary(worker: Mapping[str, Any], case: CaseConfig | None = None, d=None) -> dict[str, Any]:
    """The worker's observed tokens judged against the reference ``d``, per layer."""
    checks: list[Mapping[str, Any]] = worker.get("data_checks") or []
    drafts = {layer.name for layer in case.layers if layer.is_draft} if case is not None else set()
    by_layer: dict[str, list[Mapping[str, Any]]] = {}
    for chk in checks:
        by_layer.setdefault(chk.get("layer", "?"), []).append(chk)
    registered = list(worker.get("registered") or {})
    unchecked = [n for n in registered if n not in by_layer]
    problems: list[str] = []
    failed_calls = 0
    slots_checked = 0
    for chk in checks:
        layer = chk.get("layer", "?")
        tokens = chk.get("tokens") or []
        call_problems: list[str] = []
        if not tokens:
            call_problems.append("no written slot in this step's slot mapping")
        if d is None:
            call_problems.append("no reference derivation to judge the observed tokens against")
            tokens = []
        for token in tokens:
            slots_checked += 1
            try:
                found = judge_token(d, layer, token)
            except Exception as exc:  # noqa: BLE001 - a token the reference cannot place
                found = [f"{type(exc).__name__}: {exc}"]
            call_problems += [f"slot {token.get('slot')}: {p}" for p in found]
        if call_problems:
            failed_calls += 1
            problems += [f"{layer} call {chk.get('call')}: {p}" for p in call_problems]
    errors = [e.get("error", str(e)) if isinstance(e, Mapping) else str(e) for e in worker.get("data_check_errors") or []]
    return {
        "calls_checked": len(checks),
        "slots_checked": slots_checked,
        "failed_calls": failed_calls,
        "layers_checked": sorted(by_layer),
        "unchecked_targets": [n for n in unchecked if n not in drafts],
        "unchecked_drafts": [n for n in unchecked if n in drafts],
        "problems": problems[:_MAX_LISTED],
        "num_problems": len(problems),
        "errors": errors[:_MAX_LISTED],
    }


def analyze_run(report: Mapping[str, Any] | None) -> dict[str, Any]:
    """One run's verdict: ``status``, ``reasons``, ``divergences`` and ``data``."""
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
    worker = report.get("worker")
    try:
        case = CaseConfig.from_dict(spec["case"])
    except (KeyError, ConfigError) as exc:
        out.update(status="error", reasons=[f"no valid reference case in the spec: {exc}"])
        return out
    if report.get("timed_out") and report.get("stage") != "done":
        out["status"] = "timeout"
        out["reasons"].append(f"killed after {report.get('wall_s')} s at stage {report.get('stage')!r}")
    elif not report.get("ok"):
        out["status"] = "error"
        out["reasons"].append(report.get("error") or f"the run failed at stage {report.get('stage')!r}")
    if worker is None:
        out.setdefault("status", "error")
        out["reasons"].append("the worker-side connector wrote no record")
        return out
    use_v2 = worker.get("use_v2_model_runner")
    if isinstance(use_v2, bool) and use_v2 != (out["runner"] == "mrv2"):
        out.setdefault("status", "error")
        out["reasons"].append(f"asked for {out['runner']} but vLLM ran use_v2_model_runner={use_v2}")
    try:
        from reference.derive import derive

        d = derive(case, out["runner"])
    except StartupError as exc:
        out["divergences"].append(_div("startup_error", "error", exc.vllm_message, "(the engine registered KV caches)"))
        d = None
    except NotModeledError as exc:
        out.setdefault("status", "not_modeled")
        out["reasons"].append(f"reference: {exc}")
        out["data"] = data_summary(worker, case, None)
        return out
    out["data"] = data_summary(worker, case, d)
    if d is not None and worker.get("registered"):
        out["divergences"] = diff_registered(d, worker)
    data = out["data"]
    if out["divergences"]:
        out["reasons"].append(f"{len(out['divergences'])} divergence(s) from the reference")
    if data["failed_calls"]:
        out["reasons"].append(f"data check failed in {data['failed_calls']} of {data['calls_checked']} checked calls")
    if data["errors"]:
        out["reasons"].append(f"data check errors: {data['errors'][0]}")
    if out.get("status") is None:
        if data["unchecked_targets"]:
            out["reasons"].append(f"no data check ran for {', '.join(data['unchecked_targets'])}")
    failed = bool(out["divergences"] or data["failed_calls"] or data["errors"])
    if out.get("status") is None:
        failed = failed or bool(data["unchecked_targets"])
        out["status"] = "fail" if failed else "pass"
    elif failed:
        out["status"] = "fail"  # a divergence found before the engine died still counts
    return out


def _view_rows(worker: Mapping[str, Any], key: str) -> dict[str, dict[str, Any]]:
    return {n: {f: v.get(f) for f in _VIEW_FIELDS if f in v} for n, v in (worker.get(key) or {}).items()}


def runner_differences(mrv1: Mapping[str, Any] | None, mrv2: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The two runners' worker records against each other (``expected`` = MRv1)."""
    if not mrv1 or not mrv2:
        return []
    c = _Diff()
    k = "mrv1_mrv2_mismatch"
    for key, label in (("registered", "registered"), ("save_kv_layer", "bound")):
        a, b = _view_rows(mrv1, key), _view_rows(mrv2, key)
        if key == "save_kv_layer" and (not a or not b):
            continue
        c.cmp(k, f"{label} layers", sorted(a), sorted(b))
        for name in sorted(set(a) & set(b)):
            for f in _VIEW_FIELDS:
                c.cmp(k, f"{label} {name}.{f}", a[name].get(f), b[name].get(f))
    c.cmp(k, "resolved_layout", mrv1.get("resolved_layout"), mrv2.get("resolved_layout"))
    b1, b2 = mrv1.get("layer_backends") or {}, mrv2.get("layer_backends") or {}
    for name in sorted(set(b1) | set(b2)):
        c.cmp(k, f"{name}.backend", b1.get(name), b2.get(name))
    kv1, kv2 = mrv1.get("kv_cache_config") or {}, mrv2.get("kv_cache_config") or {}
    c.cmp(k, "num_blocks", kv1.get("num_blocks"), kv2.get("num_blocks"))
    c.cmp(
        k,
        "groups",
        [[g["layer_names"], g["kv_cache_spec"].get("block_size"), g["kv_cache_spec"].get("type")] for g in kv1.get("kv_cache_groups") or []],
        [[g["layer_names"], g["kv_cache_spec"].get("block_size"), g["kv_cache_spec"].get("type")] for g in kv2.get("kv_cache_groups") or []],
    )
    c.cmp(k, "kv_cache_tensors", kv1.get("kv_cache_tensors"), kv2.get("kv_cache_tensors"))
    c.cmp(k, "block_size", mrv1.get("block_size"), mrv2.get("block_size"))
    return c.out


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


def summarize(reports: Mapping[str, Mapping[str, Any] | None], device: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``reports``: ``{run_id: report or None}`` -> per-run verdicts, runner diffs, exit code."""
    runs = {}
    for rid, report in reports.items():
        analysis = analyze_run(report)
        analysis.setdefault("run_id", rid)
        runs[rid] = analysis
    by_scenario: dict[str, dict[str, Mapping[str, Any]]] = {}
    for rid, report in reports.items():
        if report and report.get("worker") and runs[rid].get("scenario"):
            by_scenario.setdefault(runs[rid]["scenario"], {})[runs[rid]["runner"]] = report["worker"]
    differences = {
        scenario: runner_differences(workers.get("mrv1"), workers.get("mrv2"))
        for scenario, workers in by_scenario.items()
        if "mrv1" in workers and "mrv2" in workers
    }
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
    "diff_registered",
    "exit_code",
    "format_summary",
    "observed_kernel_block_sizes",
    "runner_differences",
    "summarize",
]
