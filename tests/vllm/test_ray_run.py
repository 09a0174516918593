"""``kvconform run --ray`` against the installed vLLM, on a Ray cluster of two nodes on 127.0.0.1:
the shards run on both nodes and their merged report has the cases, verdicts and divergences
of the same run in one process (a case file travels to the node that runs its shard)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.merge import verdict_of
from suites.named_cases import CASES

pytest.importorskip("ray", reason="Ray is not installed here (pip install 'kvconform[distributed]')")

ROOT = Path(__file__).resolve().parents[2]
KVCONFORM = Path(sys.executable).with_name("kvconform")


def test_a_run_split_over_two_ray_nodes_equals_the_unsharded_run(tmp_path: Path) -> None:
    case_file = tmp_path / "draft.json"
    case_file.write_text(CASES["mla-gqa-draft-b64"].with_(name="my-draft-case").to_json())
    cases = ["--case", "flashinfer-b128-k64", "--case", str(case_file), "--case", "swa-hybrid-scaled", "--case", "mamba-hybrid"]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    alone = subprocess.run([str(KVCONFORM), "run", *cases, "--json", str(tmp_path / "alone.json")], cwd=ROOT, env=env,
                           capture_output=True, text=True)
    on_ray = subprocess.run([sys.executable, str(ROOT / "scripts" / "ray_loopback_cluster.py"), "--nodes", "2", "--",
                             str(KVCONFORM), "run", *cases, "--ray", "{address}", "--ray-tasks", "2",
                             "--json", str(tmp_path / "ray.json")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert on_ray.returncode == alone.returncode, on_ray.stderr[-2000:]
    a, b = (json.loads((tmp_path / name).read_text()) for name in ("alone.json", "ray.json"))
    assert [r["case"] for r in b["results"]] == [r["case"] for r in a["results"]] == [
        "flashinfer-b128-k64", "my-draft-case", "swa-hybrid-scaled", "mamba-hybrid"]
    assert [verdict_of(r) for r in b["results"]] == [verdict_of(r) for r in a["results"]]
    assert b["counts"] == a["counts"] and b["schedules"]["run"] == a["schedules"]["run"]
    nodes = set(re.findall(r"^kvconform: shard \d/2 \(on .*, node (\w+)\): exit", on_ray.stderr, re.M))
    assert len(nodes) == 2, on_ray.stderr  # one shard per node: two CPUs in all, one task each
    assert len(b["merged_from"]) == 2
