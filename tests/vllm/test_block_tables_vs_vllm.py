"""``reference.block_tables`` against vLLM 0.33.0's real block tables and slot mappings.

Each scenario (plain JSON: groups, DCP, a schedule of Add/Append/Remove/Preempt/Move/Swap
and per-step batches) runs through vLLM's MRv1 ``MultiGroupBlockTable``, MRv2
``BlockTables`` and ``AttentionGroup.map_to_kernel_block_table`` on CPU (the Triton
kernels in the interpreter, ``gpu_impl.vllm_cpu.block_tables``) and through the
reference model; every field is diffed: table widths, per step the request locations,
the valid block ids, the tables handed to attention, their kernel expansion and the
slot mappings. MRv2 leaves stale ids past ``num_blocks`` in gathered rows (D7), so its
real rows are compared on ``[:num_blocks]`` (``[:num_blocks*R]`` once expanded); MRv1
rows and every padded row are compared whole.

vLLM runs in one driver subprocess per pytest process (the kernels need
``TRITON_INTERPRET=1`` before triton is imported, which the planning tests' process
cannot have). Every failure prints the scenario JSON and a one-line replay command.
This module imports neither torch nor vLLM.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping

import pytest

from conformance.diff import compare_schedule
from gpu_impl.vllm_cpu.block_tables import observe_block_tables, prewarm, scenario_command
from reference import block_tables as rb
from reference.block_tables.scenarios import blocks_of, predict, schedule_op
from reference.config import normalize_scenario
from suites.block_table_scenarios import _attention, _mamba, make_scenario, sample_scenarios

REPO = Path(__file__).resolve().parents[2]
MAX_PROBLEMS = 12

# Scenario name -> why the reference is known to disagree with vLLM (with the vLLM source
# lines). Strict xfails: a test fails as soon as the disagreement goes away.
KNOWN_DISAGREEMENTS: dict[str, str] = {
    "mrv2-slot-int32-overflow": (
        "MRv2 computes slots in int32: vllm/v1/worker/gpu/block_table.py:404-409 "
        "(_compute_slot_mappings_kernel) multiplies the int32 block id loaded at :404 by the int32 "
        "block size loaded at :370 (block_sizes_tensor, :114), so block_id*B >= 2**31 wraps "
        "(200000000*16+5 -> -1094967291); MRv1 casts the id to int64 first "
        "(vllm/v1/worker/block_table.py:373-374). reference.slot_mappings_mrv2 uses unbounded ints."
    ),
}


# --------------------------------------------------------------------------- scenarios


def _random_scenarios() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    # One attention group: every block size 16..256, with and without kernel splits.
    singles = [(16, None), (32, 16), (64, None), (64, 32), (128, 64), (128, 16), (256, 64), (256, 128), (256, 16)]
    for i, (b, k) in enumerate(singles):
        out.append(make_scenario(f"single-b{b}-k{k}", 100 + i, [_attention(b, k)], max_model_len=2048))
    # Full + sliding window (MRv2 nulls blocks below the window, D8).
    swa = [(128, 64, 16, 20), (16, None, 32, 100), (64, 16, 64, 200), (256, 64, 16, 33)]
    for i, (b1, k1, b2, reach) in enumerate(swa):
        out.append(make_scenario(f"swa-b{b1}-b{b2}-reach{reach}", 200 + i,
                                 [_attention(b1, k1), _attention(b2, None, sliding_window_reach=reach)]))
    # Attention + Mamba: MRv1 slot mapping "none" (stale buffer, D3) vs MRv2 computed slots.
    for i, (b, k, mb) in enumerate([(16, None, 1056), (128, 64, 2048), (64, 32, 1024), (256, 128, 4096)]):
        out.append(make_scenario(f"mamba-b{b}-k{k}-m{mb}", 300 + i, [_attention(b, k), _mamba(mb)]))
    # Three groups: split attention, sliding window, Mamba.
    for i, (b, k, reach) in enumerate([(128, 64, 50), (32, 16, 127), (256, 32, 300)]):
        out.append(make_scenario(f"hybrid3-b{b}-k{k}", 400 + i,
                                 [_attention(b, k), _attention(16, None, sliding_window_reach=reach), _mamba(1024)]))
    # DCP: world 2/4, interleave 1/2/8, every rank; reach is dropped by MRv2 under DCP.
    dcps = [(2, 0, 1), (2, 1, 1), (2, 1, 2), (2, 0, 8), (4, 3, 1), (4, 1, 2), (4, 2, 8), (4, 0, 8)]
    for i, (w, r, itl) in enumerate(dcps):
        b = [16, 64, 128, 32, 16, 256, 64, 128][i]
        k = [None, 32, 64, None, None, 64, 16, None][i]
        groups = [_attention(b, k)]
        if i % 2:
            groups.append(_attention(16, None, sliding_window_reach=40))
        if i % 3 == 0:
            groups.append(_mamba(2048))
        out.append(make_scenario(f"dcp{w}-r{r}-i{itl}-b{b}", 500 + i, groups, dcp=(w, r, itl)))
    # DCP world 1 written out explicitly, with interleave > 1 (no effect without DCP).
    out.append(make_scenario("dcp1-i8-b128", 520, [_attention(128, 64)], dcp=(1, 0, 8)))
    # Circular-buffer group: MRv2 disables its slot mapping (D4), widths unaligned (D5).
    for i, dcp in enumerate([(1, 0, 1), (2, 1, 2)]):
        out.append(make_scenario(f"circular-dcp{dcp[0]}", 600 + i,
                                 [_attention(64, 32), {"kind": "circular", "block_size": 16}], dcp=dcp))
    # Packed compressed caches: kernel block j of block b is b*kernel_block_stride + j.
    for i, (b, k, stride) in enumerate([(64, 16, 8), (128, 64, 5)]):
        out.append(make_scenario(f"kernel-stride-b{b}-k{k}-s{stride}", 700 + i,
                                 [_attention(b, k, kernel_block_stride=stride)]))
    # Longer schedules with heavy churn: many preemptions, re-adds, moves and swaps.
    for i in range(4):
        out.append(make_scenario(f"churn-{i}", 800 + i, [_attention([16, 128, 64, 32][i], [None, 64, 16, 16][i]),
                                                         _mamba(1024)] if i % 2 else [_attention(16 << i, None)],
                                 num_steps=6, max_num_reqs=5))
    # No padding at all (num_reqs_padded == num_reqs, tokens unpadded).
    out.append(make_scenario("unpadded-b32", 900, [_attention(32, 16), _attention(128, None)],
                             features=("preempt", "swap")))
    return out


def _hand_scenarios() -> list[dict[str, Any]]:
    """Named cases from the research note and the D-table, each aimed at one behaviour."""
    return [
        # Note §7.3: the same two-group batch in both runners.
        {"name": "note-7.3-two-groups", "max_num_reqs": 4, "max_num_batched_tokens": 64,
         "groups": [_attention(128, 64, max_num_blocks=4), _attention(16, None, max_num_blocks=32)],
         "steps": [{"ops": [["add", "a", [[3, 7], [1, 2, 3, 4, 5]]], ["append", "a", [[9], [6]]],
                            ["add", "b", [[5], [10, 11]]]],
                    "batch": [["a", [126, 127, 128]], ["b", [0, 1]]], "num_reqs_padded": 3, "num_tokens_padded": 8}]},
        # Note §2.2 [run] stale tails: slot 0 [5,9,11,12], re-added as [7] -> gathered [7,9,11,12,...].
        {"name": "stale-tail-readd", "max_num_reqs": 2, "max_num_batched_tokens": 32,
         "groups": [_attention(16, None, max_num_blocks=8)],
         "steps": [{"ops": [["add", "a", [[5, 9, 11, 12]]]], "batch": [["a", [50, 51]]]},
                   {"ops": [["preempt", "a"]]},
                   {"ops": [["add", "a", [[7]]]], "batch": [["a", [0, 1, 2]]], "num_reqs_padded": 2,
                    "num_tokens_padded": 5}]},
        # Note §2.2 [run] sliding window: reach 20, B=16, first position 50 -> [0,9,11,12].
        {"name": "sliding-window-note", "max_num_reqs": 2, "max_num_batched_tokens": 16,
         "groups": [_attention(16, None, max_num_blocks=8, sliding_window_reach=20)],
         "steps": [{"ops": [["add", "a", [[5, 9, 11, 12]]]], "batch": [["a", [50, 51, 52]]]}]},
        # Note §7.3 DCP: W=2, r=1 with interleave 1 and 4.
        *[{"name": f"note-7.3-dcp2-r1-i{itl}", "max_num_reqs": 4, "max_num_batched_tokens": 10, "dcp": [2, 1, itl],
           "groups": [_attention(16, None, max_num_blocks=8)],
           "steps": [{"ops": [["add", "a", [[5, 9, 11]]], ["add", "b", [[3, 4, 7]]]],
                      "batch": [["a", [30, 31, 32, 33, 34]], ["b", [0, 1, 2]]]}]} for itl in (1, 4)],
        # MRv1 swap with a free row (rows 1 <-> 3 and back), and a move into a stale row.
        {"name": "swap-free-row-and-back", "max_num_reqs": 4, "max_num_batched_tokens": 32,
         "groups": [_attention(32, 16, max_num_blocks=4), _mamba(512)],
         "steps": [{"ops": [["add", "a", [[1, 2], [40]]], ["add", "b", [[3], [41]]]],
                    "batch": [["a", [0, 1, 40]], ["b", [5]]]},
                   {"ops": [["swap", 1, 3], ["add", "c", [[4, 5, 6], [42]]]], "batch": [["a", [41]], ["c", [64, 65]]]},
                   {"ops": [["swap", 3, 1], ["remove", "a"], ["move", 3, 0]],
                    "batch": [["c", [66]], ["b", [6, 7]]], "num_reqs_padded": 3, "num_tokens_padded": 6}]},
        # D3: the Mamba group's MRv1 buffer keeps a PAD written by an earlier step's padding.
        {"name": "mamba-none-reads-old-pad", "max_num_reqs": 2, "max_num_batched_tokens": 16,
         "groups": [_attention(16, None, max_num_blocks=4), _mamba(256)],
         "steps": [{"ops": [["add", "a", [[8], [30]]]], "batch": [["a", [0, 1]]], "num_tokens_padded": 6},
                   {"ops": [["add", "b", [[9], [31]]]], "batch": [["a", [2, 3, 4]], ["b", [0, 1, 2, 3]]],
                    "num_tokens_padded": 8}]},
        # Block id * B past 2**31: MRv1 slots are int64, MRv2's kernel multiplies in int32.
        {"name": "mrv2-slot-int32-overflow", "max_num_reqs": 2, "max_num_batched_tokens": 4,
         "groups": [_attention(16, None, max_num_blocks=8)],
         "steps": [{"ops": [["add", "a", [[200_000_000]]]], "batch": [["a", [5, 6]]]}]},
        # D20: a row overflowing its (aligned) width fails in both runners (numpy ValueError /
        # RuntimeError in vLLM, ConfigError in the reference).
        {"name": "row-overflow-fails", "expect_error": True, "max_num_reqs": 2, "max_num_batched_tokens": 4,
         "groups": [_attention(16, None, max_num_blocks=2)],
         "steps": [{"ops": [["add", "a", [[1, 2, 3]]]], "batch": [["a", [0]]]},
                   {"ops": [["append", "a", [[4, 5, 6, 7, 8, 9]]]], "batch": [["a", [40]]]}]},
        # D9: a batch padded to max_num_reqs rows and dummy (idx_mapping=-1) requests in MRv2.
        {"name": "padded-rows-and-dummies", "max_num_reqs": 4, "max_num_batched_tokens": 24,
         "groups": [_attention(64, 16, max_num_blocks=2), _attention(16, None, max_num_blocks=8)],
         "steps": [{"ops": [["add", "a", [[2], [3, 4]]]], "batch": [["a", [16, 17]]], "num_reqs_padded": 4,
                    "dummy_tokens": [3, 1], "num_tokens_padded": 10},
                   {"ops": [["add", "b", [[5, 6], [7, 8, 9, 10, 11, 12, 13, 14]]]],
                    "batch": [["a", [18]], ["b", [100, 127]]], "num_reqs_padded": 2, "num_tokens_padded": 3}]},
    ]


SCENARIOS: list[dict[str, Any]] = _hand_scenarios() + _random_scenarios()

_VLLM_SPEC = importlib.util.find_spec("vllm")
if _VLLM_SPEC is not None and _VLLM_SPEC.origin is not None:  # not tests/vllm as a namespace package
    # Start the driver subprocess at collection: its ~8 s vLLM import then overlaps the
    # conftest's own vLLM import instead of delaying the first scenario.
    prewarm()


# --------------------------------------------------------------------------- diff


def _diff_final(sc: Mapping[str, Any], got: Mapping[str, Any], problems: list[str]) -> None:
    """``run_schedule_mrv1/mrv2`` over the whole schedule against vLLM's state after the last step."""
    groups = sc["groups"]
    ops = [schedule_op(op) for step in sc["steps"] for op in step["ops"]]
    # MRv2 frees a step's finished requests in sorted order before its adds.
    ops_mrv2 = [op for step in sc["steps"] for op in rb.mrv2_step_order([schedule_op(o) for o in step["ops"]])]
    sizes, max_blocks = [g["block_size"] for g in groups], [g["max_num_blocks"] for g in groups]
    common = {"max_num_batched_tokens": sc["max_num_batched_tokens"]}
    final = {
        "mrv1": rb.run_schedule_mrv1(ops, sizes, max_blocks, sc["max_num_reqs"],
                                     slot_mapping_modes=[g["mrv1_slot_mapping"] for g in groups], **common),
        "mrv2": rb.run_schedule_mrv2(ops_mrv2, sizes, max_blocks, sc["max_num_reqs"],
                                     token_alignments=[g["token_alignment"] for g in groups], **common),
    }
    for runner, res in final.items():
        steps = got[runner]["steps"]
        if len(steps) != len(sc["steps"]):
            continue  # already reported
        if dict(res.locations) != steps[-1]["locations"] or blocks_of(res) != steps[-1]["blocks"]:
            problems.append(f"{runner} run_schedule final state: reference {dict(res.locations)} {blocks_of(res)}, "
                            f"vLLM {steps[-1]['locations']} {steps[-1]['blocks']}")


def diff(scenario: Mapping[str, Any], ref: Mapping[str, Any], got: Mapping[str, Any]) -> list[str]:
    """Every field where the reference's prediction and vLLM's observation differ
    (``conformance.diff.compare_schedule`` per runner, then the whole-schedule check)."""
    sc = normalize_scenario(scenario)
    problems = [d.message for runner in ("mrv1", "mrv2")
                for d in compare_schedule(sc["name"], runner, sc, ref[runner], got[runner])]
    if not any("error" in got[runner] for runner in ("mrv1", "mrv2")):
        _diff_final(sc, got, problems)
    return problems


def _report(scenario: Mapping[str, Any], problems: list[str]) -> str:
    lines = [f"scenario {scenario['name']!r}: reference.block_tables and vLLM 0.33.0 disagree"]
    lines += [f"  - {p}" for p in problems[:MAX_PROBLEMS]]
    if len(problems) > MAX_PROBLEMS:
        lines.append(f"  ... and {len(problems) - MAX_PROBLEMS} more")
    lines.append(f"scenario JSON: {json.dumps(scenario, separators=(',', ':'))}")
    lines.append(f"replay (vLLM side): {scenario_command(scenario)}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- tests


def _params() -> list[Any]:
    params = []
    for sc in SCENARIOS:
        marks = []
        if sc["name"] in KNOWN_DISAGREEMENTS:
            marks.append(pytest.mark.xfail(strict=True, reason=KNOWN_DISAGREEMENTS[sc["name"]]))
        params.append(pytest.param(sc, id=sc["name"], marks=marks))
    return params


def test_scenario_set_is_broad() -> None:
    """The generated set covers what the brief promises (and is deterministic)."""
    assert len(SCENARIOS) >= 40 and len({s["name"] for s in SCENARIOS}) == len(SCENARIOS)
    assert SCENARIOS == _hand_scenarios() + _random_scenarios()
    norm = [normalize_scenario(s) for s in SCENARIOS]
    blocks = {g["block_size"] for s in norm for g in s["groups"] if g["kind"] == "attention"}
    assert {16, 32, 64, 128, 256} <= blocks
    assert {len(s["groups"]) for s in norm} >= {1, 2, 3}
    assert {s["dcp"][0] for s in norm} >= {1, 2, 4} and {s["dcp"][2] for s in norm} >= {1, 2, 8}
    ops = {op[0] for s in norm for st in s["steps"] for op in st["ops"]}
    assert ops == {"add", "append", "remove", "preempt", "move", "swap"}
    assert any(g["kind"] == "mamba" for s in norm for g in s["groups"])
    assert any(g["sliding_window_reach"] for s in norm for g in s["groups"])
    assert any(st["num_reqs_padded"] > len(st["batch"]) for s in norm for st in s["steps"])
    assert any(st["dummy_tokens"] for s in norm for st in s["steps"])
    # The reference accepts every scenario but the ones meant to fail: a ConfigError
    # elsewhere would be a broken generator.
    for s in SCENARIOS:
        pred = predict(s)
        errors = ["error" in pred["mrv1"], "error" in pred["mrv2"]]
        assert errors == [bool(s.get("expect_error"))] * 2, (s["name"], pred)


def test_sampled_scenarios_are_deterministic_valid_and_broad() -> None:
    first = sample_scenarios(7, 120)
    assert first == sample_scenarios(7, 120) and first != sample_scenarios(8, 120)
    norm = [normalize_scenario(s) for s in first]
    assert {op[0] for s in norm for st in s["steps"] for op in st["ops"]} == {
        "add", "append", "remove", "preempt", "move", "swap"
    }
    assert {s["dcp"][0] for s in norm} == {1, 2, 4}
    kinds = {g["kind"] for s in norm for g in s["groups"]}
    assert {"attention", "mamba", "circular"} <= kinds
    assert any(g.get("kernel_block_stride") for s in norm for g in s["groups"])
    for s in first:
        pred = predict(s)
        assert "error" not in pred["mrv1"] and "error" not in pred["mrv2"], (s["name"], pred)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``sampled_scenario``: drawn at collection time from the run seed (``--kvconform-seed``),
    the same list on every xdist worker; the count is the profile's ``schedules``."""
    if "sampled_scenario" not in metafunc.fixturenames:
        return
    from conformance.pytest_plugin import run_settings
    from suites.profiles import PROFILES

    s = run_settings(metafunc.config)
    count = PROFILES[s.profile]["schedules"]
    scenarios = sample_scenarios(s.seed, count)
    metafunc.parametrize("sampled_scenario", scenarios, ids=[sc["name"] for sc in scenarios])


def test_sampled_block_tables_match_vllm(sampled_scenario: dict[str, Any], pytestconfig: pytest.Config) -> None:
    from conformance.pytest_plugin import run_settings

    s = run_settings(pytestconfig)
    got = observe_block_tables(sampled_scenario)
    if "unsupported" in got:
        pytest.skip(f"vLLM block tables cannot be driven here: {got['unsupported']}")
    assert "invalid" not in got, _report(sampled_scenario, [f"driver rejected the scenario: {got['invalid']}"])
    problems = diff(sampled_scenario, predict(sampled_scenario), got)
    assert not problems, f"seed: {s.seed} (profile {s.profile}; rerun with --kvconform-seed {s.seed})\n" + _report(
        sampled_scenario, problems
    )


@pytest.mark.parametrize("scenario", _params())
def test_block_tables_match_vllm(scenario: dict[str, Any]) -> None:
    got = observe_block_tables(scenario)
    if "unsupported" in got:
        pytest.skip(f"vLLM block tables cannot be driven here: {got['unsupported']}")
    assert "invalid" not in got, _report(scenario, [f"driver rejected the scenario: {got['invalid']}"])
    problems = diff(scenario, predict(scenario), got)
    assert not problems, _report(scenario, problems)
    if scenario.get("expect_error"):
        # Both runners fail on the step that overflows (diffed against the reference above).
        assert [got[r]["error"]["step"] for r in ("mrv1", "mrv2")] == [1, 1], got


def test_invalid_scenario_is_reported_not_crashed() -> None:
    # MRv1 batches are rows 0..n-1 in order; "b" sits in row 1.
    bad = {"name": "not-dense", "max_num_reqs": 2, "max_num_batched_tokens": 8,
           "groups": [_attention(16, None, max_num_blocks=2)],
           "steps": [{"ops": [["add", "a", [[1]]], ["add", "b", [[2]]]], "batch": [["b", [0]]]}]}
    got = observe_block_tables(bad)
    if "unsupported" in got:
        pytest.skip(got["unsupported"])
    assert "MRv1 batches are rows 0..n-1" in got["invalid"]


def _blocked_vllm_env(tmp_path: Path) -> dict[str, str]:
    """An environment where ``import vllm`` fails, as on a machine without vLLM."""
    fake = tmp_path / "vllm"
    fake.mkdir()
    # ModuleNotFoundError, as for a package that is not installed (importorskip only
    # skips on that one; a plain ImportError means "installed but broken").
    (fake / "__init__.py").write_text(
        "raise ModuleNotFoundError('vllm blocked by the kvconform test', name='vllm')\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(REPO), env.get("PYTHONPATH", "")])
    env.pop("PYTEST_XDIST_WORKER", None)
    return env


def test_folder_skips_with_a_reason_without_vllm(tmp_path: Path) -> None:
    """tests/vllm/conftest.py skips this module, with its reason, when vLLM is missing."""
    env = _blocked_vllm_env(tmp_path)
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-rs", "-q",
         str(Path(__file__)), "-k", "note-7.3-two-groups or stale-tail-readd"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text  # importable without vLLM: no collection error
    assert "2 skipped" in text, text
    assert "vllm is not installed" in text and "needs vLLM" in text, text


def test_driver_reports_unsupported_without_vllm(tmp_path: Path) -> None:
    """The replay CLI answers ``{"unsupported": ...}`` instead of crashing without vLLM."""
    scenario = _hand_scenarios()[0]
    out = subprocess.run(
        [sys.executable, "-m", "gpu_impl.vllm_cpu.block_tables", json.dumps(scenario)],
        cwd=REPO, env=_blocked_vllm_env(tmp_path), capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 1, out.stderr
    reply = json.loads(out.stdout)
    assert "vllm blocked by the kvconform test" in reply["unsupported"], reply


def test_scenario_command_is_one_line() -> None:
    cmd = scenario_command(SCENARIOS[0])
    assert "\n" not in cmd and "-m gpu_impl.vllm_cpu.block_tables" in cmd
    assert json.loads(shlex.split(cmd)[-1]) == SCENARIOS[0]
