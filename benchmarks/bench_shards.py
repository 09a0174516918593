"""Shards side by side against one process: ``kvconform run --shard k/N`` as N processes at once
(as N CI agents would run them, here on one machine's cores) versus the same selection in one
process, measured in one run, and the parts merged (``kvconform report merge``) against the
unsharded report.

Targets (a ratio: this machine is shared and noisy):

- the N shards' wall time at most 0.85 of one process's, with N = 2 on 2 cores (each process
  imports vLLM once, ~8 s, which no split removes);
- the merge of the parts is the unsharded report: the same cases in order, verdicts and
  divergences, counts and schedules.

Needs vllm importable; exits 5 if it is not.

    python benchmarks/bench_shards.py [--profile ci] [--shards 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGET_RATIO = 0.85
KVCONFORM = [sys.executable, "-m", "conformance.cli"]


def _runs(commands: list[list[str]]) -> float:
    """Wall seconds for the commands run at once; each must exit 0."""
    start = time.perf_counter()
    procs = [subprocess.Popen(c, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for c in commands]
    for proc, command in zip(procs, commands):
        _, err = proc.communicate()
        if proc.returncode != 0:
            raise SystemExit(f"bench_shards: {' '.join(command[2:])} exited {proc.returncode}: {err[-500:]}")
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="ci")
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--json")
    args = parser.parse_args()
    if importlib.util.find_spec("vllm") is None:
        print("bench_shards: vllm is not installed; nothing to measure", file=sys.stderr)
        return 5
    from conformance.merge import merge, verdict_of

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        base = [*KVCONFORM, "run", "--profile", args.profile]
        parts = [work / f"part{k}.json" for k in range(1, args.shards + 1)]
        sharded_s = _runs([[*base, "--shard", f"{k}/{args.shards}", "--json", str(p)] for k, p in enumerate(parts, 1)])
        whole = work / "whole.json"
        one_s = _runs([[*base, "--json", str(whole)]])
        merged = merge([str(p) for p in parts])
        unsharded = json.loads(whole.read_text())
    same = (
        [r["case"] for r in merged["results"]] == [r["case"] for r in unsharded["results"]]
        and [verdict_of(r) for r in merged["results"]] == [verdict_of(r) for r in unsharded["results"]]
        and merged["counts"] == dict(sorted(unsharded["counts"].items()))
        and merged["schedules"]["run"] == unsharded["schedules"]["run"]
    )
    ratio = sharded_s / one_s
    result = {
        "profile": args.profile,
        "cases": len(unsharded["results"]),
        "shards": args.shards,
        "sharded_wall_s": round(sharded_s, 1),
        "one_process_wall_s": round(one_s, 1),
        "ratio": round(ratio, 3),
        "target_ratio": TARGET_RATIO,
        "merge_equals_unsharded": same,
    }
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if same and ratio <= TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
