"""The full GPU path on a real CUDA GPU: the smallest scenario under both model runners.

Skipped (with the reason) where there is no nvidia-smi (the project's pytest plugin), no
usable CUDA device or no vLLM. Runs ``python -m conformance.gpu_check --scenario fa-b16``
(what ``scripts/gpu_check.sh`` runs for every scenario): the real ``vllm.LLM`` with a
dummy-weight Qwen3-like model, once with MRv1 and once with MRv2, each in its own
process; every registered tensor must match the reference, every written slot the
connector sampled must read back identically through the registered view and at the
reference's byte addresses, and the two runners must register the same tensors.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_impl.cuda.scenarios import SMALLEST

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.kvconform_gpu


@pytest.fixture(scope="module")
def cuda_ready() -> None:
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("needs vllm==0.33.0 importable")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("nvidia-smi is present but torch sees no CUDA device")


def test_smallest_scenario_both_runners(cuda_ready, tmp_path):
    cmd = [
        sys.executable, "-m", "conformance.gpu_check",
        "--scenario", SMALLEST, "--out", str(tmp_path), "--jobs", "2", "--budget-s", "360", "--timeout-s", "300",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=480)
    output = proc.stdout[-6000:] + proc.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert proc.returncode == 0, output
    assert set(summary["runs"]) == {f"{SMALLEST}-mrv1", f"{SMALLEST}-mrv2"}, output
    for rid, analysis in summary["runs"].items():
        assert analysis["status"] == "pass", (rid, analysis)
        assert analysis["data"]["slots_checked"] > 0 and not analysis["data"]["unchecked_targets"], rid
        report = json.loads((tmp_path / f"{rid}.json").read_text())
        assert report["worker"]["use_v2_model_runner"] is rid.endswith("mrv2")
    assert summary["runner_differences"][SMALLEST] == [], output
    from conformance.report_formats import validate_report

    report = json.loads((tmp_path / "report.json").read_text())
    assert validate_report(report) == [] and report["expectations"]["unexpected"] == 0, output
    assert {r["runners"][runner]["status"] for r in report["results"] for runner in ("mrv1", "mrv2")} == {"pass"}
