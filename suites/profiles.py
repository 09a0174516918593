"""The run profiles: how many seeded random configs and hypothesis examples each runs.

One table for the pytest plugin (``--kvconform-profile``) and ``kvconform run --profile``;
kept free of pytest and hypothesis so the CLI starts fast.
"""

from __future__ import annotations

PROJECT_SEED = 20261129
"""The default seed: CI and every laptop sample the same cases."""

PROFILES: dict[str, dict[str, int]] = {
    "ci": {"sample": 1000, "hypothesis": 60, "schedules": 30, "case_schedules": 1},
    "thorough": {"sample": 3000, "hypothesis": 1000, "schedules": 300, "case_schedules": 3},
    "gpu": {"sample": 300, "hypothesis": 60, "schedules": 30, "case_schedules": 1},
}
"""Per profile: seeded random configs per sampled test (and per ``kvconform run``),
hypothesis ``max_examples``, seeded block-table schedules (``suites.block_table_scenarios``)
and, per case of ``kvconform run``, the request schedules run through each runner's own
block tables (``case_schedules``; the named cases alone run 2). ``ci`` must diff >= 1,000 configs in <= 5 minutes on 2 cores
(benchmarks/bench_suite.py measures it)."""

__all__ = ["PROFILES", "PROJECT_SEED"]
