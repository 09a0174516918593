"""``kvconform run``: observe the installed vLLM for each case and runner, diff with the reference."""

from __future__ import annotations

import json
import platform
import shlex
import time
from pathlib import Path
from typing import Any, Sequence

from conformance.diff import Comparison, Divergence, compare
from reference.backends import VLLM_VERSION
from reference.config import CaseConfig

RUNNERS = ("mrv1", "mrv2")


def replay_command(case: CaseConfig) -> str:
    """One line that reruns exactly this case."""
    from suites.named_cases import CASES

    if CASES.get(case.name) == case:
        return f"kvconform run --case {case.name}"
    return f"echo {shlex.quote(case.to_json())} > case.json && kvconform run --case case.json"


def _observed_runner_differences(case: CaseConfig, observations: dict[str, Any]) -> list[Divergence]:
    """Anything a connector or kernel could see differently between MRv1 and MRv2."""
    a, b = observations.get("mrv1"), observations.get("mrv2")
    if a is None or b is None or a.unsupported or b.unsupported:
        return []
    out = []
    for field in ("error", "layout", "num_blocks", "bytes_per_block", "kernel_block_sizes"):
        if getattr(a, field) != getattr(b, field):
            out.append(Divergence("mrv1_mrv2_mismatch", case.name, "mrv1/mrv2", field, getattr(a, field), getattr(b, field)))
    for layer, view in a.registered.items():
        other = b.registered.get(layer)
        if other is None or (view.shape, view.stride, view.dtype, view.storage_offset) != (
            other.shape,
            other.stride,
            other.dtype,
            other.storage_offset,
        ):
            out.append(Divergence("mrv1_mrv2_mismatch", case.name, "mrv1/mrv2", f"registered {layer}", view, other))
    return out


def _environment() -> dict[str, Any]:
    env: dict[str, Any] = {"python": platform.python_version(), "reference_vllm": VLLM_VERSION}
    for module in ("vllm", "torch", "flashinfer"):
        try:
            env[module] = __import__(module).__version__
        except Exception:  # noqa: BLE001 - a missing optional package is just absent
            env[module] = None
    return env


def run_against_vllm(cases: Sequence[CaseConfig], *, json_target: str | None, quiet: bool) -> int:
    """Observe, compare and print; returns the CLI exit code (0 conformant, 1 divergent, 5 nothing ran)."""
    from gpu_impl.vllm_cpu import shims

    shims.prepare_env()  # before anything imports torch or vllm
    from gpu_impl.vllm_cpu.planning import observe

    started = time.time()
    env = _environment()
    comparisons: list[Comparison] = []
    runner_diffs: list[Divergence] = []
    results = []
    if not quiet:
        print(f"kvconform: vLLM {env['vllm']} (torch {env['torch']}) against the reference for vLLM {VLLM_VERSION}, {len(cases)} cases x {len(RUNNERS)} runners")
    for case in cases:
        observations = {runner: observe(case, runner) for runner in RUNNERS}
        case_comparisons = [compare(case, runner, observations[runner]) for runner in RUNNERS]
        diffs = _observed_runner_differences(case, observations)
        comparisons += case_comparisons
        runner_diffs += diffs
        results.append(
            {
                "case": case.name,
                "config": case.to_dict(),
                "replay": replay_command(case),
                "runners": {
                    c.runner: {
                        "status": c.status,
                        "detail": c.detail,
                        "divergences": [d.__dict__ | {"message": d.message} for d in c.divergences],
                    }
                    for c in case_comparisons
                },
                "mrv1_mrv2_mismatches": [{"field": d.field, "mrv1": repr(d.expected), "mrv2": repr(d.observed)} for d in diffs],
            }
        )
        if not quiet:
            statuses = " ".join(f"{c.runner}:{c.status}" for c in case_comparisons)
            print(f"  {case.name:34} {statuses}" + (f"  MRv1/MRv2 differ ({len(diffs)})" if diffs else ""))
    counts: dict[str, int] = {}
    for c in comparisons:
        counts[c.status] = counts.get(c.status, 0) + 1
    failed = [c for c in comparisons if c.status == "fail"]
    report = {
        "schema": "kvconform.report/1",
        "environment": env,
        "started": started,
        "duration_s": round(time.time() - started, 3),
        "counts": counts,
        "results": results,
    }
    if json_target == "-":
        print(json.dumps(report, indent=2, sort_keys=True, default=str))
    elif json_target:
        Path(json_target).write_text(json.dumps(report, indent=2, sort_keys=True, default=str) + "\n")
    if not quiet:
        print()
        print("  " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
        for c in failed:
            for d in c.divergences:
                print(f"  DIVERGENCE {d.message}")
            print(f"    config: {c.case.to_json()}\n    replay: {replay_command(c.case)}")
        for d in runner_diffs:
            print(f"  MRv1/MRv2 MISMATCH {d.case}: {d.field}: MRv1 {d.expected!r} vs MRv2 {d.observed!r}")
    if counts.get("pass", 0) + len(failed) == 0:
        if not quiet:
            print("kvconform: nothing ran: every case was unsupported by this vLLM or not modeled")
        return 5
    return 1 if failed or runner_diffs else 0
