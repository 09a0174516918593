"""Reference-model speed: full derivation of a 64-layer hybrid model, and byte-range queries.

Targets (issue: reference model): full derivation <= 1 ms median on one core; 10,000
random (layer, block) byte-range queries <= 50 ms. Prints the figures and exits 1 if a
target is missed, so it can gate a release without being a timed unit test.

    python benchmarks/bench_reference.py [--repeat 200] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reference.config import CaseConfig, LayerConfig  # noqa: E402
from reference.derive import derive  # noqa: E402

DERIVE_TARGET_S = 1e-3
QUERY_TARGET_S = 50e-3


def hybrid_64_layer_case() -> CaseConfig:
    """Gemma-3-like: 64 layers, five sliding-window layers per full layer, FlashInfer, block 128."""
    layers = []
    for i in range(64):
        if i % 6 == 5:
            layers.append(LayerConfig(f"model.layers.{i}.self_attn.attn", backend="FLASHINFER", num_kv_heads=8, head_size=128))
        else:
            layers.append(
                LayerConfig(
                    f"model.layers.{i}.self_attn.attn",
                    kind="sliding_window",
                    sliding_window=1024,
                    backend="FLASHINFER",
                    num_kv_heads=8,
                    head_size=128,
                )
            )
    return CaseConfig("bench-hybrid-64", tuple(layers), block_size=128, num_blocks=None, kv_cache_memory_bytes=40 << 30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=300)
    parser.add_argument("--queries", type=int, default=10_000)
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()

    case = hybrid_64_layer_case()
    derive(case)  # warm caches and imports
    samples = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        d = derive(case)
        samples.append(time.perf_counter() - t0)
    derive_median = statistics.median(samples)

    rng = random.Random(0)
    layers = list(d.registered)
    queries = [(rng.choice(layers), rng.randrange(d.num_blocks)) for _ in range(args.queries)]
    query_runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        for layer, block in queries:
            d.block_bytes(layer, block)
        query_runs.append(time.perf_counter() - t0)
    query_median = statistics.median(query_runs)

    figures = {
        "case": case.name,
        "layers": len(case.layers),
        "groups": len(d.groups),
        "num_blocks": d.num_blocks,
        "derive_median_ms": round(derive_median * 1e3, 4),
        "derive_target_ms": DERIVE_TARGET_S * 1e3,
        "queries": args.queries,
        "queries_median_ms": round(query_median * 1e3, 3),
        "queries_target_ms": QUERY_TARGET_S * 1e3,
        "python": sys.version.split()[0],
    }
    print(json.dumps(figures, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    ok = derive_median <= DERIVE_TARGET_S and query_median <= QUERY_TARGET_S
    print("targets met" if ok else "TARGET MISSED", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
