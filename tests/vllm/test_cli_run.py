"""The README's main job, ``kvconform run``, against the installed vLLM."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

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
    import importlib.metadata

    assert report["environment"]["vllm"] == importlib.metadata.version("vllm")  # 0.33.0, or what it pretends to be
    # MRv2's speculator gives the draft's builder 128 while its views count 64-token kernel
    # blocks: the contract sees it (known: mrv2-speculator-draft-builder-off-the-views).
    assert report["counts"] == {"pass": 3, "expected": 1}
    assert [r["case"] for r in report["results"]] == ["flashinfer-b128-k64", "mla-gqa-draft-b128-k64"]
    plain, draft = report["results"]
    assert plain["mrv1_mrv2_mismatches"] == []
    # MRv2's speculator picks the draft's kernel block over the draft backend alone: known.
    assert {(m["field"], m["expected_by"]) for m in draft["mrv1_mrv2_mismatches"]} == {
        ("draft_builder_kernel_block_sizes", "mrv2-speculator-draft-kernel-block")
    }
    assert all(r["runners"][runner]["fidelity"] == "runner" for r in report["results"] for runner in ("mrv1", "mrv2"))
    absorbed = report["expectations"]["absorbed"]
    assert absorbed["mrv2-speculator-draft-kernel-block"] == 1 and absorbed["mrv2-speculator-draft-builder-off-the-views"] == 1
    assert set(absorbed) == {"mrv2-speculator-draft-kernel-block", "mrv2-speculator-draft-builder-off-the-views",
                             "mrv2-speculator-draft-table-unexpanded"}
    draft_mrv2 = draft["runners"]["mrv2"]
    assert draft_mrv2["status"] == "expected"
    assert {d["basis"] for d in draft_mrv2["divergences"]} == {"contract"}


def test_run_flags_a_divergent_case_with_replay(tmp_path: Path) -> None:
    # A case file whose name is not a named case gets a replay line built from its JSON.
    from conformance.replay import replay_command
    from suites.named_cases import CASES

    case = CASES["flashinfer-b16"].with_(name="custom", num_blocks=3)
    assert replay_command(case).startswith("echo '")
    assert replay_command(CASES["flashinfer-b16"]) == "kvconform run --case flashinfer-b16"


def test_run_classifies_with_expectations(tmp_path: Path) -> None:
    """A known MRv1/MRv2 difference passes with the expectations and fails without; an
    entry of a consumer's file (layered on the shipped one) that matched nothing is
    reported as unused, with its file, without failing the run."""
    from vllm_cases import CASES

    case = next(c for c in CASES if c.name == "gqa+draft-attention-backend-bs128")
    case_file = tmp_path / "case.json"
    case_file.write_text(case.to_json())
    expectations = tmp_path / "expectations.toml"
    expectations.write_text('schema = 1\n\n[[expectation]]\nid = "stale"\nkind = "layout"\nreason = "r"\n')

    def run(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "conformance.cli", "run", "--case", str(case_file), *extra],
            cwd=ROOT, capture_output=True, text=True, timeout=300,
        )

    target = tmp_path / "report.json"
    out = run("--expectations", str(expectations), "--json", str(target))
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(target.read_text())
    mismatches = report["results"][0]["mrv1_mrv2_mismatches"]
    assert mismatches and {m["expected_by"] for m in mismatches} == {"mrv2-draft-keeps-attention-backend"}
    assert report["expectations"]["unexpected"] == 0 and "stale" in report["expectations"]["unused"]
    assert "mrv2-draft-keeps-attention-backend" not in report["expectations"]["unused"]
    assert report["expectations"]["file"] == f"conformance/expectations.toml (shipped) + {expectations}"
    assert f"kvconform: unused expectation stale (kind=layout, case=*) from {expectations}: matched nothing" in out.stdout

    # Only the consumer's file: the shipped entry that knew the difference is gone.
    out = run("--no-shipped-expectations", "--expectations", str(expectations))
    assert out.returncode == 1 and "MRv1/MRv2 MISMATCH" in out.stdout

    out = run("--no-expectations")
    assert out.returncode == 1 and "MRv1/MRv2 MISMATCH" in out.stdout


def _results_so_far(target: Path) -> int:
    try:
        return len(json.loads(target.read_text())["results"])
    except (OSError, ValueError, KeyError):
        return -1


@pytest.mark.parametrize("signame", ["SIGKILL", "SIGTERM", "SIGINT"])
def test_an_interrupted_run_leaves_a_valid_partial_report(tmp_path: Path, signame: str) -> None:
    """The report exists (incomplete) from the start and is replaced atomically; SIGTERM and
    SIGINT end the run with exit 2 after writing what it got; no temporary file remains."""
    import signal
    import time

    target = tmp_path / "report.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "conformance.cli", "run", "--json", str(target)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + 240
        while time.time() < deadline and _results_so_far(target) < 0:
            time.sleep(0.05)
        assert _results_so_far(target) == 0, "the report should exist, empty, before the first case"
        while time.time() < deadline and _results_so_far(target) < 1:
            time.sleep(0.05)
        assert _results_so_far(target) >= 1, "no case reached the report before the deadline"
        proc.send_signal(getattr(signal, signame))
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    report = json.loads(target.read_text())  # written atomically: always valid JSON
    assert report["complete"] is False
    from suites.named_cases import CASES

    assert 1 <= len(report["results"]) < len(CASES)
    assert report["results"][0]["runners"]["mrv1"]["status"] == "pass"
    if signame != "SIGKILL":
        assert code == 2
        assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


def test_replay_reruns_the_divergent_case(tmp_path: Path) -> None:
    from suites.named_cases import CASES

    from report_fixtures import result_for, valid_report

    case = CASES["flashinfer-b128-k64"]
    report = valid_report([result_for(case, {"mrv1": "fail", "mrv2": "pass"})])
    path = tmp_path / "old.json"
    path.write_text(json.dumps(report))
    out = subprocess.run(
        [sys.executable, "-m", "conformance.cli", "replay", str(path), "--json", "-"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    replayed = json.loads(out.stdout[out.stdout.index("{"):])
    assert [r["case"] for r in replayed["results"]] == ["flashinfer-b128-k64"]
    assert replayed["counts"] == {"pass": 2}


def test_workers_give_the_same_report_in_the_same_order() -> None:
    names = ["flashinfer-b128-k64", "gqa+draft-attention-backend-b128", "mamba-hybrid-dcp2", "swa-hybrid-padded"]
    reports = []
    for workers in ("1", "2"):
        args = [a for n in names for a in ("--case", n)]
        out = subprocess.run(
            [sys.executable, "-m", "conformance.cli", "run", *args, "--workers", workers, "--json", "-"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        reports.append(json.loads(out.stdout))
    one, two = ([(r["case"], r["runners"], r["mrv1_mrv2_mismatches"]) for r in rep["results"]] for rep in reports)
    assert [case for case, _, _ in one] == names
    assert one == two


def test_shards_run_as_processes_merge_into_the_unsharded_report(tmp_path: Path) -> None:
    """Three ``kvconform run --shard k/3`` processes side by side (as three CI agents), merged:
    the same cases, verdicts and divergences as one unsharded run."""
    from conformance.merge import verdict_of

    cases = ["dense-fa-b128-lbhnc", "flashinfer-b128-k64", "mla-gqa-draft-b128-k64", "swa-hybrid-padded",
             "kpool-tail-b64", "mamba-hybrid", "dsv32-indexer-b64"]
    selection = [arg for name in cases for arg in ("--case", name)]

    def run(*extra: str, out: Path) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "conformance.cli", "run", *selection, *extra, "--json", str(out)],
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    parts = [tmp_path / f"shard{k}.json" for k in (1, 2, 3)]
    procs = [run("--shard", f"{k}/3", out=path) for k, path in zip((1, 2, 3), parts)]
    whole = tmp_path / "whole.json"
    alone = run(out=whole)
    for proc in (*procs, alone):
        assert proc.wait(timeout=600) == 0, proc.stderr.read()[-2000:]
    merged_path = tmp_path / "merged.json"
    merged_run = subprocess.run([sys.executable, "-m", "conformance.cli", "report", "merge", *map(str, parts),
                                 "--json", str(merged_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert merged_run.returncode == 0, merged_run.stderr
    merged, unsharded = json.loads(merged_path.read_text()), json.loads(whole.read_text())
    sizes = [len(json.loads(p.read_text())["results"]) for p in parts]
    assert sum(sizes) == len(cases) and all(sizes)
    assert [r["case"] for r in merged["results"]] == [r["case"] for r in unsharded["results"]] == cases
    assert [verdict_of(r) for r in merged["results"]] == [verdict_of(r) for r in unsharded["results"]]
    assert merged["counts"] == unsharded["counts"] and merged["schedules"]["run"] == unsharded["schedules"]["run"]
    assert merged["expectations"]["absorbed"] == unsharded["expectations"]["absorbed"]
