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
    # Only the real-engine comparison (conformance.engine_run) reports these; its own
    # tests (tests/engine/test_engine_report.py) prove each is caught.
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

    Exactly one of the three is set: the reference's derivation, the error it predicts
    vLLM raises, or a ``not_modeled`` comparison that ends the diff. Shared by every
    comparison (vLLM's layout code, the real engine).
    """
    try:
        return derive(case, runner), None, None
    except StartupError as exc:
        return None, exc.vllm_message, None
    except NotModeledError as exc:
        return None, None, Comparison(case, runner, "not_modeled", detail=str(exc))
    except ConfigError as exc:
        return None, None, Comparison(case, runner, "not_modeled", detail=f"invalid case: {exc}")


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
    c.cmp("layout", "layout", expected.layout.name, observation.layout)
    exp_groups = [(tuple(g.layer_names), g.spec.block_size) for g in expected.groups]
    obs_groups = [(tuple(g.layer_names), g.block_size) for g in observation.groups]
    c.cmp("groups", "groups", exp_groups, obs_groups)
    c.cmp("num_blocks", "num_blocks", expected.num_blocks, observation.num_blocks)
    c.cmp("bytes_per_block", "bytes_per_block", expected.plan.bytes_per_block, observation.bytes_per_block)
    _cmp_tensors(c, "tensor_placement", expected.plan.tensors, observation.tensors)
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
    if schedules is not None:
        from conformance.schedules import schedule_divergences

        c.out += schedule_divergences(case, runner, schedules, observation)
    return Comparison(case, runner, "fail" if c.out else "pass", tuple(c.out))


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


__all__ = ["KINDS", "Comparison", "Divergence", "compare", "compare_runners", "compare_schedule", "kinds_of"]
