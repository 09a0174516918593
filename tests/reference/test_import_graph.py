"""The floors of the code base, read off its imports (``docs/architecture.md``).

Every import counts, at module level or inside a function: an import placed in a function
to break a cycle still ties the two modules together, so a cycle held that way is a cycle.
Imports under ``if TYPE_CHECKING:`` count too. Only the project's own packages are nodes;
vLLM, torch and the standard library are not.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("reference", "suites", "gpu_impl", "conformance", "benchmarks")
"""The project's importable packages, lowest floor first."""
MAY_IMPORT: dict[str, frozenset[str]] = {
    "reference": frozenset(),
    "suites": frozenset({"reference"}),
    "gpu_impl": frozenset({"reference"}),  # the case description only: test_driver_boundary.py
    "conformance": frozenset({"reference", "suites", "gpu_impl"}),
    "benchmarks": frozenset({"reference", "suites", "gpu_impl", "conformance"}),
}
"""Which other packages each package may import: none of them imports one above it."""


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Every module of the given packages, by dotted name."""
    return {module_name(p, root): p for pkg in packages for p in sorted((root / pkg).rglob("*.py"))}


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The project module an import of ``name`` loads (the longest known prefix)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules ``module`` imports anywhere in its source."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join(anchor + ([base] if base else []))
            # ``from pkg import name``: a submodule if one exists, else the package itself.
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for target in targets:
            resolved = _resolve(target, modules)
            if resolved is not None and resolved != module:
                found.add(resolved)
    return found


def import_graph(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    modules = project_modules(root, packages)
    return {m: imports_of(m, p, modules) for m, p in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        # Iterative: a deep chain of imports must not hit the recursion limit.
        work = [(v, iter(sorted(graph.get(v, ()))))]
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        while work:
            node, edges = work[-1]
            for w in edges:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on_stack:
                    low[node] = min(low[node], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """``importer -> imported`` for every import of a package its floor may not import."""
    bad = []
    for importer, targets in sorted(graph.items()):
        own = importer.split(".")[0]
        for target in sorted(targets):
            other = target.split(".")[0]
            if other != own and other not in MAY_IMPORT[own]:
                bad.append(f"{importer} -> {target}")
    return bad


def test_no_import_cycle_in_the_code_base() -> None:
    found = cycles(import_graph())
    assert found == [], "import cycles (each a set of modules that import each other, maybe inside functions): " + "; ".join(
        " <-> ".join(c) for c in found)


def test_no_package_imports_one_above_it() -> None:
    bad = upward_imports(import_graph())
    assert bad == [], f"imports that run up a floor (docs/architecture.md): {bad}"


def test_package_init_files_hold_only_re_exports() -> None:
    """A package's ``__init__`` holds its docstring, imports and ``__all__``: code lives in a named module."""
    offenders = {}
    for path in sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("__init__.py")):
        body = ast.parse(path.read_text()).body
        extra = [type(node).__name__ for node in body if not (
            isinstance(node, (ast.Import, ast.ImportFrom))
            or (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))  # docstring
            or (isinstance(node, (ast.Assign, ast.AnnAssign)) and _assigns_only(node, "__all__")))]
        if extra:
            offenders[str(path.relative_to(ROOT))] = extra
    assert offenders == {}, f"package __init__ files with code beyond re-exports: {offenders}"


def _assigns_only(node: ast.Assign | ast.AnnAssign, name: str) -> bool:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return all(isinstance(t, ast.Name) and t.id == name for t in targets)


@pytest.fixture
def planted(tmp_path: Path) -> Path:
    """A small tree with a cycle held by a function-level import and an arrow up."""
    for pkg in ("reference", "gpu_impl", "conformance"):
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text('"""pkg."""\n')
    (tmp_path / "conformance" / "a.py").write_text("from conformance.b import f\n")
    (tmp_path / "conformance" / "b.py").write_text("def f():\n    from conformance import a\n")
    (tmp_path / "gpu_impl" / "d.py").write_text("from conformance.a import f\nfrom . import e\n")
    (tmp_path / "gpu_impl" / "e.py").write_text("import reference\n")
    return tmp_path


def test_the_walk_sees_planted_cycles_and_arrows_up(planted: Path) -> None:
    graph = import_graph(planted, ("reference", "gpu_impl", "conformance"))
    assert graph["gpu_impl.d"] == {"conformance.a", "gpu_impl.e"}
    assert cycles(graph) == [["conformance.a", "conformance.b"]]
    assert upward_imports(graph) == ["gpu_impl.d -> conformance.a"]
