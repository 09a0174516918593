"""The README's main job, ``kvconform run``, against the installed vLLM."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_run_reports_conformance_as_json() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "conformance.cli", "run", "--case", "flashinfer-b128-k64", "--case", "mla-gqa-draft-b128-k64", "--json", "-"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout)
    assert report["schema"] == "kvconform.report/1"
    assert report["environment"]["vllm"] == "0.33.0"
    assert report["counts"] == {"pass": 4}
    assert [r["case"] for r in report["results"]] == ["flashinfer-b128-k64", "mla-gqa-draft-b128-k64"]
    assert all(r["mrv1_mrv2_mismatches"] == [] for r in report["results"])


def test_run_flags_a_divergent_case_with_replay(tmp_path: Path) -> None:
    # A case file whose name is not a named case gets a replay line built from its JSON.
    from conformance.vllm_run import replay_command
    from suites.named_cases import CASES

    case = CASES["flashinfer-b16"].with_(name="custom", num_blocks=3)
    assert replay_command(case).startswith("echo '")
    assert replay_command(CASES["flashinfer-b16"]) == "kvconform run --case flashinfer-b16"
