"""Diff throughput through the target release's own runners on CPU (gpu_impl.vllm_cpu), both runners.

Targets, measured in one run on the same configs (ratios: this machine is shared and noisy):

- >= 20 configs diffed per second on one core after import (both runners per config);
- the share of the observation time spent outside vLLM's (and torch's) own code, i.e. in
  kvconform's driver: under 10% (cProfile self time by file; the profiler's overhead
  lands on both sides). Freeing the objects vLLM built for a case (runners, layers, their
  CPU buffers) happens when the driver's frame returns, so cProfile charges it to the
  driver: it is reported both ways, ``share_outside_vllm`` (as cProfile charges it) and
  ``share_outside_vllm_teardown_as_vllm`` (those objects kept alive during the profiled
  pass and freed after it, timed, on vLLM's side). ``kvconform run``'s own mix, with one
  request schedule per case through each runner's block tables, is measured too
  (``share_outside_vllm_with_schedules``: the Triton interpreter counts as vLLM's kernels);
- the reference's derivation at least 100x faster than vLLM's own planning, runner
  initialisation and allocation for the same (case, runner).

Also reports the one-off import/setup cost. Needs vllm importable; exits 5 if it is not.

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
TARGET_SHARE_OUTSIDE_VLLM = 0.10
TARGET_REFERENCE_SPEEDUP = 100.0
REPO = str(Path(__file__).resolve().parents[1])


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
    from gpu_impl.vllm_cpu import runner_tables, shims

    runner_tables.prepare_process_env()  # as kvconform run: before vLLM is imported
    shims.prepare_env()
    from gpu_impl.vllm_cpu.planning import observe

    from conformance.diff import compare
    from suites.strategies import sample_cases

    cases = sample_cases(args.seed, args.count)
    observe(cases[0], "mrv1")  # first call pays for imports and platform patches
    for name in sorted({layer.backend for case in cases for layer in case.layers}):
        try:  # every backend module imported once (flashinfer's import alone takes seconds)
            shims.backend_class(name)
        except shims.BackendUnavailable:
            pass
    setup_s = time.perf_counter() - t0

    from reference.derive import derive
    from reference.errors import ReferenceError_

    runners = ("mrv1", "mrv2")
    statuses: dict[str, int] = {}
    fidelity: dict[str, int] = {}
    t1 = time.perf_counter()
    for case in cases:
        for runner in runners:
            observation = observe(case, runner)
            key = f"{runner}:{observation.fidelity or ('unsupported' if observation.unsupported else 'before_runner')}"
            fidelity[key] = fidelity.get(key, 0) + 1
            status = compare(case, runner, observation).status
            statuses[status] = statuses.get(status, 0) + 1
    elapsed = time.perf_counter() - t1
    per_s = len(cases) / elapsed

    # The reference on the same (case, runner) pairs.
    t2 = time.perf_counter()
    for case in cases:
        for runner in runners:
            try:
                derive(case, runner)
            except ReferenceError_:
                pass
    reference_s = time.perf_counter() - t2

    # Where observing spends its time: profiled separately (the profiler slows both sides).
    import cProfile
    import pstats

    sample = cases[: max(1, len(cases) // 3)]

    def profiled(schedules: int = 0) -> tuple[float, float]:
        from conformance.schedules import plan_schedules

        plans = {case.name: plan_schedules(case, args.seed, schedules).scenarios for case in sample}
        profiler = cProfile.Profile()
        profiler.enable()
        for case in sample:
            for runner in runners:
                observe(case, runner, schedules=plans[case.name])
        profiler.disable()
        ours = total = 0.0
        for (filename, _, _), (_, _, tottime, _, _) in pstats.Stats(profiler).stats.items():
            total += tottime
            if filename.startswith(REPO) and "/.venv" not in filename:
                ours += tottime
        return ours, total

    ours, total = profiled()
    share = ours / total if total else 0.0
    # The same pass with vLLM's objects kept alive, then freed (timed) on vLLM's side.
    from gpu_impl.vllm_cpu import runners as runner_module

    kept: list = []
    originals = runner_module.runner_instance, runner_module.build_layers

    def keeping(fn):
        def wrapper(*a, **k):
            out = fn(*a, **k)
            kept.append(out)
            return out
        return wrapper

    runner_module.runner_instance, runner_module.build_layers = map(keeping, originals)
    try:
        ours_kept, total_kept = profiled()
    finally:
        runner_module.runner_instance, runner_module.build_layers = originals
    t3 = time.perf_counter()
    kept.clear()
    import gc

    gc.collect()
    teardown_s = time.perf_counter() - t3
    share_teardown_apart = ours_kept / (total_kept + teardown_s) if total_kept else 0.0
    from gpu_impl.vllm_cpu.runner_tables import schedule_support

    if schedule_support() is None:
        ours_s, total_s = profiled(schedules=1)
        share_schedules = round(ours_s / total_s, 3) if total_s else None
    else:
        share_schedules = None
    speedup = elapsed / reference_s if reference_s else float("inf")
    figures = {
        "configs": len(cases),
        "seed": args.seed,
        "runners": list(runners),
        "statuses": statuses,
        "fidelity": fidelity,
        "import_and_setup_s": round(setup_s, 2),
        "configs_per_s": round(per_s, 1),
        "target_configs_per_s": TARGET_PER_S,
        "share_outside_vllm": round(share, 3),
        "share_outside_vllm_teardown_as_vllm": round(share_teardown_apart, 3),
        "teardown_s": round(teardown_s, 2),
        "share_outside_vllm_with_schedules": share_schedules,
        "target_share_outside_vllm": TARGET_SHARE_OUTSIDE_VLLM,
        "reference_speedup": round(speedup, 1),
        "target_reference_speedup": TARGET_REFERENCE_SPEEDUP,
    }
    print(json.dumps(figures, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    met = per_s >= TARGET_PER_S and share < TARGET_SHARE_OUTSIDE_VLLM and speedup >= TARGET_REFERENCE_SPEEDUP
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
