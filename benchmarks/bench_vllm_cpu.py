"""Diff throughput through vLLM 0.33.0's own layout code on CPU (gpu_impl.vllm_cpu).

Target (issue: drivers): >= 20 configs diffed per second on one core after import; also
reports the one-off import/setup cost. Needs vllm importable; exits 5 if it is not.

    python benchmarks/bench_vllm_cpu.py [--count 300] [--seed 20261129] [--json out.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGET_PER_S = 20.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=300)
    parser.add_argument("--seed", type=int, default=20261129)
    parser.add_argument("--json")
    args = parser.parse_args()
    if importlib.util.find_spec("vllm") is None:
        print("bench_vllm_cpu: vllm is not installed; nothing to measure", file=sys.stderr)
        return 5

    t0 = time.perf_counter()
    from gpu_impl.vllm_cpu import shims

    shims.prepare_env()
    from gpu_impl.vllm_cpu.planning import observe

    from conformance.diff import compare
    from suites.strategies import sample_cases

    cases = sample_cases(args.seed, args.count)
    observe(cases[0], "mrv1")  # first call pays for imports and platform patches
    setup_s = time.perf_counter() - t0

    statuses: dict[str, int] = {}
    t1 = time.perf_counter()
    for case in cases:
        status = compare(case, "mrv1", observe(case, "mrv1")).status
        statuses[status] = statuses.get(status, 0) + 1
    elapsed = time.perf_counter() - t1
    per_s = len(cases) / elapsed
    figures = {
        "configs": len(cases),
        "seed": args.seed,
        "statuses": statuses,
        "import_and_setup_s": round(setup_s, 2),
        "configs_per_s": round(per_s, 1),
        "target_configs_per_s": TARGET_PER_S,
    }
    print(json.dumps(figures, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0 if per_s >= TARGET_PER_S else 1


if __name__ == "__main__":
    sys.exit(main())
