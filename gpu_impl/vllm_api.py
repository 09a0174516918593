"""What a driver needs of the installed vLLM, and whether this vLLM provides it.

The drivers import vLLM's modules directly, where they use them. The one list of what
they need is those import statements themselves: ``required_api(driver)`` reads the
driver's own source (``ast``, a few milliseconds) for every ``from vllm... import ...``
and ``import vllm...`` outside a ``try`` that expects an ``ImportError``, so it cannot
drift from what the code really imports. ``missing_api(driver)`` then checks the
installed vLLM for each module and name and returns what is missing, which a command
reports in one line (exit 5: nothing ran) instead of failing with an ``ImportError``
part way, or blaming a connector for the harness's own incompatibility.

Drivers (``DRIVERS``): ``layout`` (vLLM's layout and runner code on CPU,
``gpu_impl.vllm_cpu``, the target release's API), ``gen1`` (generation-1 releases, 0.19 to 0.28:
``gpu_impl.vllm_cpu.gen1``) and the connector adapters ``nixl`` and ``mooncake``
(``gpu_impl.connectors``), which run on top of the layout driver.
"""

from __future__ import annotations

import ast
import functools
import importlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
_LAYOUT = tuple(HERE / "vllm_cpu" / f for f in ("planning.py", "planning_api.py", "runners.py", "shims.py",
                                              "runner_tables.py", "block_tables.py"))
DRIVERS: dict[str, tuple[Path, ...]] = {
    "layout": _LAYOUT,
    "nixl": _LAYOUT + (HERE / "connectors" / "nixl.py",),
    "mooncake": _LAYOUT + (HERE / "connectors" / "mooncake.py",),
    "gen1": (HERE / "vllm_cpu" / "gen1.py", HERE / "vllm_cpu" / "shims.py"),
}
"""Each driver and the source files whose vLLM imports it needs."""


def _guarded(handlers: list[ast.ExceptHandler]) -> bool:
    """A ``try`` whose handlers catch an ImportError: what it imports is optional."""
    for handler in handlers:
        names = [handler.type] if not isinstance(handler.type, ast.Tuple) else list(handler.type.elts)
        if handler.type is None or any(getattr(n, "id", None) in ("ImportError", "ModuleNotFoundError", "Exception") for n in names):
            return True
    return False


def _imports(tree: ast.AST, out: dict[str, set[str]], optional: bool = False) -> None:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.Try):
            inner = optional or _guarded(node.handlers)
            for child in node.body:
                _imports(ast.Module(body=[child], type_ignores=[]), out, inner)
            # An ImportError handler's imports are the other release's alternative
            # (gpu_impl/vllm_cpu/planning_api.py): optional as well.
            for part in node.handlers:
                _imports(part, out, optional or _guarded([part]))
            for part in (*node.orelse, *node.finalbody):
                _imports(part, out, optional)
            continue
        if not optional and isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "vllm" or node.module.startswith("vllm."):
                out.setdefault(node.module, set()).update(a.name for a in node.names)
        elif not optional and isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "vllm" or alias.name.startswith("vllm."):
                    out.setdefault(alias.name, set())
        _imports(node, out, optional)


@functools.lru_cache(maxsize=None)
def required_api(driver: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``((module, (names...)), ...)`` the driver's source imports unconditionally."""
    if driver not in DRIVERS:
        raise ValueError(f"driver {driver!r} is not one of {', '.join(DRIVERS)}")
    found: dict[str, set[str]] = {}
    for path in DRIVERS[driver]:
        _imports(ast.parse(path.read_text(), str(path)), found)
    return tuple((module, tuple(sorted(names))) for module, names in sorted(found.items()))


def _provides(module: str, name: str) -> bool:
    try:
        owner = importlib.import_module(module)
    except Exception:  # noqa: BLE001 - any failure to import is "not provided"
        return False
    if not name or hasattr(owner, name):
        return True
    try:  # ``from package import submodule``
        importlib.import_module(f"{module}.{name}")
    except Exception:  # noqa: BLE001
        return False
    return True


def missing_api(driver: str = "layout") -> list[str]:
    """What the installed vLLM lacks of what ``driver`` imports: ``module`` or
    ``module.name`` entries, in import order; empty when the driver can run."""
    missing: list[str] = []
    for module, names in required_api(driver):
        if not _provides(module, ""):
            missing.append(module)
            continue
        missing.extend(f"{module}.{name}" for name in names if not _provides(module, name))
    return missing


def api_problem(driver: str = "layout") -> str | None:
    """One line saying why ``driver`` cannot run on the installed vLLM, or None."""
    try:
        import vllm
    except Exception as exc:  # noqa: BLE001 - a broken install fails in many ways
        return f"vllm is not importable ({type(exc).__name__}: {exc})"
    # The CPU shims first, as the driver applies them before it imports vLLM's backends
    # and runners (importing those first would change what they see).
    from gpu_impl.vllm_cpu import shims

    shims.prepare_env()
    try:
        shims.apply()
        shim_error = None
    except Exception as exc:  # noqa: BLE001 - an older vLLM: the missing API below says what
        shim_error = f"{type(exc).__name__}: {exc}"
    missing = missing_api(driver)
    version = getattr(vllm, "__version__", "?")
    if not missing:
        if shim_error is None:
            return None
        return f"kvconform's CPU shims do not apply to vLLM {version}: {shim_error}"
    shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
    return (
        f"vLLM {version} does not provide what kvconform's {driver} driver uses ({shown}); "
        f"no driver of kvconform's handles vLLM {version}'s API for this yet"
    )


class NotDrivable(Exception):
    """The installed vLLM lacks what a driver uses: nothing can be observed (exit 5)."""


def require(driver: str = "layout") -> None:
    """Raise ``NotDrivable`` (with ``api_problem``'s line) when ``driver`` cannot run here."""
    problem = api_problem(driver)
    if problem is not None:
        raise NotDrivable(problem)


__all__ = ["DRIVERS", "NotDrivable", "api_problem", "missing_api", "require", "required_api"]
