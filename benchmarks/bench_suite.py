"""The ci profile's random sweep at scale: N configs through the target release's CPU path under xdist.

Target (issue: suites): 1,000 randomized configs diffed in at most 5 minutes on 2 cores
with ``-n 2``. Runs pytest in a subprocess and reports wall time and configs per second.

    python benchmarks/bench_suite.py [--examples N] [--workers 2] [--json out.json]
    python benchmarks/bench_suite.py --main-job [--workers 2]

Without ``--examples`` it runs the ci profile exactly as CI does (suites/profiles.py).
``--main-job`` times ``kvconform run --profile ci`` instead: the named cases and the
profile's random configs through both runners, with the profile's request schedules
through each runner's own block tables (the same 5-minute target).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 300.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=None, help="default: the ci profile's sample size")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json")
    parser.add_argument("--main-job", action="store_true", help="time `kvconform run --profile ci` (schedules included)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from suites.profiles import PROFILES

    configs = args.examples if args.examples is not None else PROFILES["ci"]["sample"]
    if args.main_job:
        return _main_job(args.workers, args.json)
    command = [
        sys.executable, "-m", "pytest", "tests/vllm/test_random_sweep.py", "-q", "-p", "no:cacheprovider",
        "-n", str(args.workers), "--kvconform-profile", "ci",
    ]
    if args.examples is not None:
        command += ["--kvconform-examples", str(args.examples)]
    started = time.perf_counter()
    out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - started
    passed = re.search(r"(\d+) passed", out.stdout)
    figures = {
        "command": " ".join(command[1:]),
        "exit_code": out.returncode,
        "configs": configs,
        "passed": int(passed.group(1)) if passed else 0,
        "wall_s": round(wall, 1),
        "configs_per_s": round(configs / wall, 1),
        "target_wall_s": TARGET_S,
    }
    print(json.dumps(figures, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0 if out.returncode == 0 and wall <= TARGET_S else 1


def _main_job(workers: int, json_target: str | None) -> int:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        report_path = Path(tmp) / "ci.json"
        command = [sys.executable, "-m", "conformance.cli", "run", "--profile", "ci", "--workers", str(workers),
                   "--json", str(report_path)]
        started = time.perf_counter()
        out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - started
        report = json.loads(report_path.read_text()) if report_path.exists() else {}
    cases = len(report.get("results", []))
    figures = {
        "command": "kvconform " + " ".join(command[3:-2]),
        "exit_code": out.returncode,
        "cases": cases,
        "schedules_run": report.get("schedules", {}).get("run"),
        "wall_s": round(wall, 1),
        "cases_per_s": round(cases / wall, 1) if wall else None,
        "target_wall_s": TARGET_S,
    }
    print(json.dumps(figures, indent=2))
    if json_target:
        Path(json_target).write_text(json.dumps(figures, indent=2) + "\n")
    return 0 if out.returncode in (0, 1) and cases and wall <= TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
