"""The GPU check: every scenario x runner observed in its own process, then judged.

    python -m conformance.gpu_check [--out DIR] [--scenario NAME ...] [--runner mrv1|mrv2 ...]
                            [--jobs N] [--budget-s S] [--timeout-s S] [--draft-method eagle|eagle3]
    python -m conformance.gpu_check --list

Each run is ``python -m gpu_impl.cuda.run_one`` in a fresh process (clean GPU memory),
``--jobs`` at a time, within ``--budget-s``; the verdicts are ``conformance.gpu_verdict``'s,
and ``OUT/report.json`` is the ``kvconform.report/1`` of the same observations, made by
``kvconform run``'s own loop (``GpuSource``). Exit status (pytest's): 0 all pass, 1 an
unexpected divergence, 2 interrupted, 3 a run gave no verdict, 4 usage, 5 no GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from conformance.expectations import DEFAULT_PATH, load
from conformance.gpu_verdict import IMPLEMENTATION, format_summary, run_observation, summarize
from conformance.schedules import plan_schedules
from conformance.vllm_run import ObservationSource, run_against_vllm
from gpu_impl.cuda import scenarios as sc
from reference.config import CaseConfig

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BUDGET_S = 450.0
DEFAULT_TIMEOUT_S = 300.0
DEFAULT_JOBS = 4
MIN_START_S = 40.0
"""An engine start takes ~30-60 s: a run is not started with less budget left than this."""
LOG_TAIL = 6000
PREFIX = "kvconform gpu-check"


class UsageError(Exception):
    pass


def gpu_problem() -> str | None:
    """Why no CUDA GPU is usable here (cheap: no torch import), or None."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "no CUDA GPU (nvidia-smi is not on PATH)"
    try:
        proc = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"no CUDA GPU (nvidia-smi -L failed: {exc})"
    if proc.returncode != 0 or "GPU" not in proc.stdout:
        detail = " ".join((proc.stderr or proc.stdout).split())[:200]
        return f"no CUDA GPU (nvidia-smi -L exited {proc.returncode}: {detail or 'no GPU listed'})"
    return None


def cuda_device() -> tuple[dict[str, Any] | None, str | None]:
    """``(device info, None)`` from torch, or ``(None, why not)``."""
    try:
        import torch
    except Exception as exc:  # noqa: BLE001
        return None, f"torch does not import ({type(exc).__name__}: {exc})"
    try:
        if not torch.cuda.is_available():
            return None, f"torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is False)"
        info: dict[str, Any] = {
            "device": torch.cuda.get_device_name(0),
            "capability": list(torch.cuda.get_device_capability(0)),
            "device_count": torch.cuda.device_count(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
        }
    except Exception as exc:  # noqa: BLE001
        return None, f"torch.cuda failed ({type(exc).__name__}: {exc})"
    try:
        from importlib.metadata import version

        info["vllm"] = version("vllm")
    except Exception:  # noqa: BLE001
        info["vllm"] = None
    return info, None


def _nvcc_dir() -> str | None:
    """A pip-installed CUDA toolkit's bin dir (FlashInfer JIT-compiles with nvcc)."""
    purelib = Path(sysconfig.get_paths()["purelib"])
    for sub in ("nvidia/cu13/bin", "nvidia/cu12/bin", "nvidia/cuda_nvcc/bin"):
        if (purelib / sub / "nvcc").exists():
            return str(purelib / sub)
    return None


def child_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of every run: the repo on PYTHONPATH, nvcc on PATH if only pip has one."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    if not shutil.which("nvcc", path=env.get("PATH")) and not env.get("CUDA_HOME") and not Path("/usr/local/cuda").exists():
        nvcc = _nvcc_dir()
        if nvcc:
            env["PATH"] = os.pathsep.join([nvcc, env.get("PATH", "")])
    env.setdefault("VLLM_LOGGING_LEVEL", "INFO")
    return env


@dataclass
class _Running:
    spec: dict[str, Any]
    proc: subprocess.Popen
    started: float
    limit: float
    report_path: Path
    log_path: Path
    log_file: Any
    timed_out: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def _kill(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=10)
            return
        except subprocess.TimeoutExpired:
            continue


def _tail(path: Path, n: int = LOG_TAIL) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-n:].decode("utf-8", errors="replace")


def _finish(r: _Running, rc: int) -> dict[str, Any]:
    r.log_file.close()
    report: dict[str, Any] | None = None
    if r.report_path.exists():
        try:
            report = json.loads(r.report_path.read_text())
        except ValueError as exc:
            report = {"ok": False, "error": f"unreadable report: {exc}"}
    if report is None:
        report = {"ok": False, "error": f"run_one wrote no report (exit {rc})"}
    report.setdefault("spec", r.spec)
    report.setdefault("run_id", r.spec["run_id"])
    report.update(
        returncode=rc,
        timed_out=r.timed_out,
        wall_s=round(time.monotonic() - r.started, 1),
        log=str(r.log_path.name),
        log_tail=_tail(r.log_path),
    )
    if r.timed_out and report.get("stage") != "done":
        report["ok"] = False  # killed mid-run (a run killed while shutting down keeps its result)
    return report


def run_all(
    specs: Sequence[dict[str, Any]],
    out: Path,
    *,
    jobs: int = DEFAULT_JOBS,
    budget_s: float = DEFAULT_BUDGET_S,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    python: str = sys.executable,
    env: dict[str, str] | None = None,
    poll_s: float = 0.5,
    min_start_s: float = MIN_START_S,
    echo=None,
) -> dict[str, dict[str, Any]]:
    """Run every spec in its own ``run_one`` process; ``{run_id: report}`` in spec order."""
    deadline = time.monotonic() + budget_s
    env = child_env() if env is None else env
    (out / "specs").mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    pending = list(specs)
    running: dict[str, _Running] = {}
    reports: dict[str, dict[str, Any]] = {}
    try:
        while pending or running:
            while pending and len(running) < max(1, jobs):
                remaining = deadline - time.monotonic()
                if remaining < min_start_s:
                    for spec in pending:
                        reports[spec["run_id"]] = {
                            "run_id": spec["run_id"],
                            "spec": spec,
                            "ok": False,
                            "skipped": f"time budget: {max(0.0, remaining):.0f} s of {budget_s:.0f} s left",
                        }
                    pending.clear()
                    break
                spec = pending.pop(0)
                rid = spec["run_id"]
                spec_path = out / "specs" / f"{rid}.json"
                spec_path.write_text(json.dumps(spec, indent=1, sort_keys=True))
                report_path = out / "runs" / f"{rid}.raw.json"
                report_path.unlink(missing_ok=True)
                log_path = out / "logs" / f"{rid}.log"
                log_file = open(log_path, "wb")
                proc = subprocess.Popen(
                    [python, "-m", "gpu_impl.cuda.run_one", str(spec_path), str(report_path)],
                    cwd=ROOT,
                    env=env,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
                running[rid] = _Running(spec, proc, time.monotonic(), min(timeout_s, remaining), report_path, log_path, log_file)
                if echo:
                    echo(f"started {rid} (limit {min(timeout_s, remaining):.0f} s)")
            for rid, r in list(running.items()):
                rc = r.proc.poll()
                if rc is None and time.monotonic() - r.started > r.limit:
                    r.timed_out = True
                    _kill(r.proc)
                    rc = r.proc.wait()
                if rc is not None:
                    try:  # anything the run left behind in its session (an engine-core child) goes too
                        os.killpg(r.proc.pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
                    reports[rid] = _finish(r, rc)
                    del running[rid]
                    if echo:
                        echo(f"finished {rid}: exit {rc}{' (timed out)' if r.timed_out else ''} after {reports[rid]['wall_s']} s")
            if running:
                time.sleep(poll_s)
    except KeyboardInterrupt:
        for r in running.values():
            _kill(r.proc)
            r.log_file.close()
        raise
    order = [s["run_id"] for s in specs]
    return {rid: reports.get(rid) for rid in order}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m conformance.gpu_check", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--out", default=os.environ.get("OUT") or str(ROOT / "out" / "gpu-check"), help="report directory (default: $OUT, else out/gpu-check)"
    )
    p.add_argument("--scenario", action="append", help=f"scenario to run (repeatable; default all: {', '.join(sc.DEFAULT_ORDER)})")
    p.add_argument("--runner", action="append", choices=sc.RUNNERS, help="model runner (repeatable; default both)")
    p.add_argument("--jobs", type=int, default=int(os.environ.get("KVCONFORM_GPU_JOBS", DEFAULT_JOBS)))
    p.add_argument("--budget-s", type=float, default=float(os.environ.get("KVCONFORM_GPU_BUDGET_S", DEFAULT_BUDGET_S)))
    p.add_argument("--timeout-s", type=float, default=float(os.environ.get("KVCONFORM_GPU_TIMEOUT_S", DEFAULT_TIMEOUT_S)))
    p.add_argument("--draft-method", choices=("eagle", "eagle3"), help="override the Eagle scenarios' draft method")
    p.add_argument("--contract-only", action="store_true",
                   help="judge by the contract alone (what every vLLM must satisfy), not by any release's facts")
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    return p


def _selected(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    names = args.scenario or list(sc.DEFAULT_ORDER)
    unknown = [n for n in names if n not in sc.SCENARIOS]
    if unknown:
        raise UsageError(f"unknown scenario(s) {', '.join(unknown)}; one of {', '.join(sc.SCENARIOS)}")
    if args.jobs < 1:
        raise UsageError(f"--jobs {args.jobs} is not a positive number of parallel runs")
    for flag, value in (("--budget-s", args.budget_s), ("--timeout-s", args.timeout_s)):
        if not math.isfinite(value) or value <= 0:
            raise UsageError(f"{flag} {value!r} is not a positive, finite number of seconds")
    return list(dict.fromkeys(names)), list(dict.fromkeys(args.runner or sc.RUNNERS))


NO_VERDICT = ("error", "timeout", "missing", "skipped")


class GpuSource(ObservationSource):
    """The GPU runs already made (``run_all``), as observations for ``kvconform run``'s loop.

    A run without a verdict (it timed out, crashed before registering, was skipped for the
    budget or wrote no report) is ``unsupported`` with the reason, never a pass."""

    schedules_supported = False

    def __init__(self, reports: dict[str, Any], analyses: dict[str, Any], device: dict[str, Any] | None) -> None:
        self.reports, self.analyses, self.device = reports, analyses, dict(device or {})

    def prepare(self) -> None:
        pass  # the engine ran in its own processes

    def environment(self, cases: Sequence[Any]) -> dict[str, Any]:
        import platform

        return {
            "implementation": IMPLEMENTATION,
            "python": platform.python_version(),
            "reference_vllm": ",".join(sorted({c.vllm_version for c in cases})),
            "vllm": self.device.get("vllm"),
            "torch": self.device.get("torch"),
            "flashinfer": self.device.get("flashinfer"),
            "gpu": self.device.get("device"),
        }

    def header(self, cases: Sequence[Any], env: dict[str, Any]) -> str:
        return f"kvconform: the vLLM engine on {env.get('gpu') or 'a GPU'} against the reference, {len(cases)} scenario(s)"

    def observe(self, cases: Sequence[Any], bar: Any, env: dict[str, Any], **_: Any):
        from gpu_impl.observation import Observation

        for case in cases:
            bar.advance(case.name)
            scenario = case.name.removeprefix("gpu-")
            observations = {}
            for runner in sc.RUNNERS:
                rid = sc.run_id(scenario, runner)
                analysis = self.analyses.get(rid)
                report = self.reports.get(rid)
                if analysis is None or report is None or analysis["status"] in NO_VERDICT:
                    why = "; ".join((analysis or {}).get("reasons") or []) or "not run"
                    status = (analysis or {}).get("status", "not run")
                    observations[runner] = Observation(case.name, runner, unsupported=f"{status}: {why}", implementation=IMPLEMENTATION)
                else:
                    observations[runner] = run_observation(report, case, runner)
            yield case, plan_schedules(case, 0, 0), observations

    def replay(self, case: Any, seed: int | None = None, schedules: int | None = None) -> str:
        return f"bash scripts/gpu_check.sh --scenario {case.name.removeprefix('gpu-')}"


def write_report(reports: dict[str, Any], summary: dict[str, Any], device: dict[str, Any] | None, target: Path,
                 *, contract_only: bool = False) -> int:
    """``target``: the ``kvconform.report/1`` of the GPU runs; returns the run loop's exit code.
    ``contract_only``: judged by the contract alone (the header and every divergence say so)."""
    cases: dict[str, Any] = {}
    for report in reports.values():
        spec = (report or {}).get("spec") or {}
        try:
            case = CaseConfig.from_dict(spec["case"])
        except Exception:  # noqa: BLE001 - its analysis already says the spec is bad
            continue
        cases.setdefault(case.name, case)
    if not cases:
        return 5
    return run_against_vllm(
        list(cases.values()),
        json_target=str(target),
        quiet=True,
        expectations=load(DEFAULT_PATH),
        expectations_source="conformance/expectations.toml (shipped)",
        selection="the GPU scenarios",
        source=GpuSource(reports, summary["runs"], device),
        judgement=_contract_judgement(cases.values()) if contract_only else None,
    )


def _contract_judgement(cases) -> Any:
    """The contract alone, for the vLLM the GPU runs had (the cases name it)."""
    from reference.releases import judgement_for

    versions = sorted({case.vllm_version for case in cases})
    return judgement_for(versions[0], contract_only=True)


def exit_status(report_code: int, statuses: Sequence[str]) -> int:
    """1 when the report holds an unexpected divergence; else 3 when a run gave no verdict;
    5 when nothing ran; else 0."""
    if report_code == 1:
        return 1
    if not statuses:
        return 5
    if any(s in NO_VERDICT for s in statuses):
        return 3
    return 5 if report_code == 5 else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return 0 if exc.code == 0 else 4
    if args.list:
        for s in sc.SCENARIOS.values():
            print(f"{s.name:22} {s.description}")
        return 0
    try:
        names, runners = _selected(args)
    except UsageError as exc:
        print(f"{PREFIX}: usage: {exc}", file=sys.stderr)
        return 4
    problem = gpu_problem()
    device = None
    if problem is None:
        device, problem = cuda_device()
    if problem is not None:
        print(f"{PREFIX}: nothing ran: {problem}", file=sys.stderr)
        return 5
    assert device is not None
    capability = tuple(device["capability"])
    specs = [sc.build_run_spec(n, r, capability, draft_method=args.draft_method) for n in names for r in runners]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = child_env()
    device["nvcc"] = shutil.which("nvcc", path=env.get("PATH"))
    echo = lambda line: print(f"{PREFIX}: {line}", flush=True)  # noqa: E731
    echo(f"{len(specs)} run(s) on {device['device']} (SM{capability[0]}{capability[1]}), {args.jobs} at a time, budget {args.budget_s:.0f} s")
    t0 = time.monotonic()
    try:
        reports = run_all(specs, out, jobs=args.jobs, budget_s=args.budget_s, timeout_s=args.timeout_s, env=env, echo=echo)
    except KeyboardInterrupt:
        print(f"{PREFIX}: interrupted", file=sys.stderr)
        return 2
    basis = "contract" if args.contract_only else "facts"
    summary = summarize(reports, device, basis=basis)
    summary["wall_s"] = round(time.monotonic() - t0, 1)
    for rid, report in reports.items():
        if report is not None:
            report = dict(report, analysis=summary["runs"][rid])
            (out / f"{rid}.json").write_text(json.dumps(report, indent=1, sort_keys=True, default=repr))
    (out / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True, default=repr))
    code = exit_status(write_report(reports, summary, device, out / "report.json", contract_only=args.contract_only),
                       [a["status"] for a in summary["runs"].values()])
    summary["exit_code"] = code
    text = format_summary(summary)
    (out / "summary.txt").write_text(text + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True, default=repr))
    print(text, flush=True)
    print(f"{PREFIX}: report {out / 'report.json'} (kvconform report {out / 'report.json'} --html report.html)", flush=True)
    return code


__all__ = ["DEFAULT_BUDGET_S", "GpuSource", "child_env", "cuda_device", "exit_status", "gpu_problem", "main", "run_all", "write_report"]


if __name__ == "__main__":
    sys.exit(main())
