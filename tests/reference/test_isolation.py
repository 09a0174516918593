"""The reference stays independent: no vLLM, torch or numpy, and it imports fast."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import sys
from suites.named_cases import CASES
from reference.derive import derive
from reference.errors import ReferenceError_
from conformance.cli import build_parser
for case in CASES.values():
    for runner in ("mrv1", "mrv2"):
        try:
            derive(case, runner)
        except ReferenceError_:
            pass
heavy = sorted(m for m in ("vllm", "torch", "numpy", "flashinfer", "triton", "hypothesis") if m in sys.modules)
print(",".join(heavy))
"""


def test_reference_and_cli_import_no_heavy_packages() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"the reference imported {out.stdout.strip()}"


def test_reference_sources_never_mention_vllm_imports() -> None:
    for path in (ROOT / "reference").glob("*.py"):
        text = path.read_text()
        for bad in ("import vllm", "from vllm", "import torch", "from torch"):
            assert bad not in text, f"{path.name} contains {bad!r}"
