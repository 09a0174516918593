"""Observe, never supply: the drivers under ``gpu_impl/`` read the case description from
``reference/`` (``reference.config``, ``reference.errors``) and nothing else of it.

An import of ``reference.derive``, views, planning, block tables or gen1 from a driver
would let a prediction leak into what is reported as observed (as the draft's attention
backend once did through ``reference.derive.layer_backend``).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ALLOWED = {"reference", "reference.config", "reference.errors"}
"""The case description: a case and its request schedules (``config``), and the errors a
description can raise (``errors``)."""

def _reference_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "reference":
                found |= {f"reference.{alias.name}" for alias in node.names}
            elif node.module.startswith("reference."):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.split(".")[0] == "reference"}
    return found


def _violations() -> dict[str, set[str]]:
    out = {}
    for path in sorted((ROOT / "gpu_impl").rglob("*.py")):
        bad = _reference_imports(path) - ALLOWED
        if bad:
            out[str(path.relative_to(ROOT))] = bad
    return out


def test_drivers_import_only_the_case_description_from_the_reference() -> None:
    violations = {p: sorted(m) for p, m in _violations().items()}
    assert violations == {}, f"gpu_impl/ modules import reference internals: {violations}"


def test_the_check_sees_a_planted_import(tmp_path: Path) -> None:
    planted = tmp_path / "driver.py"
    planted.write_text("from reference.derive import layer_backend\nfrom reference import views\nfrom reference.config import CaseConfig\n")
    assert _reference_imports(planted) - ALLOWED == {"reference.derive", "reference.views"}
