"""``validate_registration``: feed a connector adapter the tensors vLLM registers, compare the
bytes it would transfer for every (layer, logical block) with the reference, and round-trip
a block through the connector's own copies (``conformance.connectors.roundtrip``).

The tensors (``tensors="vllm"``, the default) are those each runner's own
``initialize_kv_cache`` registered, in host memory, with the runner's configs
(``RegistrationContext.vllm``); where they differ from the reference's views the connector is
not judged on them. ``tensors="reference"`` carves the reference's views from one pool, to
check an adapter's arithmetic without vLLM. Each check below adds ``ConnectorFinding``s
(``results``), each put down to a cause (``diagnosis``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping, Sequence

from conformance.connectors.diagnosis import (
    CAUSES,
    LayerFacts,
    block_len_is_right,
    block_len_message,
    descriptor_cause,
    heads_message,
    kernel_block_size_message,
    num_blocks_message,
    one_line,
    raised_in,
    show,
)
from conformance.connectors.loading import (
    adapter_label,
    build_kv_caches,
    instantiate,
    load_connector,
    make_context,
    views_differ,
)
from conformance.connectors.protocol import ConnectorLike, RegistrationContext
from conformance.connectors.results import STATUSES, CaseResult, ConnectorFinding, ConnectorReport
from reference import intervals

TENSOR_SOURCES = ("vllm", "reference")
"""Where the registered tensors come from (``validate_registration(tensors=...)``)."""
MAX_POOL_BYTES = 256 << 20
"""Pools above this are not allocated for a byte-level check (bounded memory on any case)."""
MAX_DESCRIPTORS = 1 << 16
"""Descriptors one call may return: more is a connector bug (an endless iterator would
otherwise grow without bound)."""
ADAPTER_ERRORS = (Exception, SystemExit, KeyboardInterrupt)
"""What an adapter's own code may raise; reported as a finding, never ending the check."""


def _to_intervals(ranges: Any, what: str) -> list[tuple[int, int]]:
    out = []
    for index, item in enumerate(ranges or ()):
        if index >= MAX_DESCRIPTORS:
            raise TypeError(f"{what} returned more than {MAX_DESCRIPTORS} (address, length) pairs; expected one per run of bytes")
        try:
            addr, length = item
        except (TypeError, ValueError):
            raise TypeError(f"{what} must return (address, length) pairs, got {item!r}") from None
        for label, value in (("address", addr), ("length", length)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise TypeError(f"{what} returned {label} {value!r} in {item!r}; expected a non-negative integer")
        out.append((addr, addr + length))
    return intervals.merge(out)


def _replay(label: str, case) -> str:
    """The command that checks ``case`` alone through this connector."""
    from conformance.replay import replay_command

    return replay_command(case, connector=label)


# --- one case x runner -----------------------------------------------------------------------------


def _check_case(connector: Any, label: str, derivation, report: ConnectorReport, tensors: str = "vllm") -> CaseResult:
    """One case x runner: the connector registers the tensors (vLLM's own, or the reference's
    views) and is judged by the reference."""
    case, runner = derivation.case, derivation.runner
    base_result = CaseResult(case.name, runner, "skipped", config=case.to_json(), replay=_replay(label, case),
                             tensors=tensors, connector=label)
    pool_bytes = next(iter(derivation.registered.values())).storage_nbytes if derivation.registered else 0
    if pool_bytes > MAX_POOL_BYTES:
        return dataclasses.replace(base_result, detail=f"the pool is {pool_bytes} bytes, over the {MAX_POOL_BYTES}-byte bound of a byte-level check")
    if tensors == "reference":
        _, caches = build_kv_caches(derivation)
        return _judge(connector, label, derivation, caches, make_context(derivation), report, base_result)
    from gpu_impl.vllm_cpu.planning import observe

    results: list[CaseResult] = []

    def on_registered(kv) -> None:
        differ = views_differ(derivation, kv.kv_caches)
        if differ is not None:
            results.append(dataclasses.replace(base_result, detail=f"vLLM's views differ from the reference's (kvconform run reports it): {differ}"[:300]))
            return
        ctx = dataclasses.replace(make_context(derivation), vllm=kv)
        results.append(_judge(connector, label, derivation, kv.kv_caches, ctx, report, base_result))

    obs = observe(case, runner, device="cpu", on_registered=on_registered)
    if results:
        return results[0]
    why = obs.unsupported or (f"vLLM's {runner.upper()} refused what the reference accepts: {obs.error}" if obs.error else
                              "the runner registered nothing")
    return dataclasses.replace(base_result, status="unsupported" if obs.unsupported else "skipped", detail=why[:300])


class _AdapterGap(Exception):
    """A built-in adapter could not drive this release's connector (its own code raised, or
    the connector read an attribute the adapter's stand-in lacks): ``unsupported``."""


def adapter_gap(exc: BaseException, label: str, *, registering: bool = False) -> str | None:
    """Why ``exc`` is the built-in adapter's gap rather than the connector's verdict, or None:
    raised in kvconform's own code (while registering: any error; after it, an AttributeError:
    the adapter reads what this release's worker does not have), or an AttributeError on an
    object the adapter made without its ``__init__`` (``gpu_impl.connectors.base.stand_in``)
    that this release's connector reads."""
    from gpu_impl.connectors.base import STAND_IN_MARK

    if not label.startswith("gpu_impl.connectors.") or not isinstance(exc, Exception):
        return None
    who, where = raised_in(exc)
    if who == "kvconform" and (registering or isinstance(exc, AttributeError)):
        return f"the adapter could not drive the connector: {one_line(exc)} at {where}"[:300]
    holder = getattr(exc, "obj", None) if isinstance(exc, AttributeError) else None
    if holder is not None and getattr(holder, STAND_IN_MARK, False):
        return (f"the adapter's {type(holder).__name__} stand-in lacks {getattr(exc, 'name', '?')!r}, which this "
                f"release's connector reads (its __init__ would set it): {one_line(exc)} at {where}")[:300]
    return None


class _Findings:
    """The findings of one case x runner; a repeat of a (layer, field) finding counts one
    more affected block instead of adding a line."""

    def __init__(self, case: str, runner: str, label: str = "") -> None:
        self.case, self.runner, self.label = case, runner, label
        self.items: list[ConnectorFinding] = []

    def raise_if_adapter_gap(self, exc: BaseException) -> None:
        """``_AdapterGap`` when ``exc`` is the built-in adapter's, not the connector's."""
        why = adapter_gap(exc, self.label)
        if why is not None:
            raise _AdapterGap(why) from exc

    def add(self, layer: str, block: int | None, fld: str, expected: Any, observed: Any, message: str,
            cause: str | None = None) -> None:
        for i, d in enumerate(self.items):
            if d.layer == layer and d.field == fld:
                self.items[i] = dataclasses.replace(d, blocks_affected=d.blocks_affected + 1)
                return
        if cause is None:
            cause = {"register": "register", "heads": "layout_strides"}.get(fld, "derived_value")
        self.items.append(ConnectorFinding(self.case, self.runner, layer, block, fld, str(expected), str(observed), message,
                                           cause=cause))


class _PoolPages:
    """The reference's bytes of every (layer, logical block), and which KV cache group owns
    each byte of the pool."""

    def __init__(self, derivation, base: int, pool_nbytes: int) -> None:
        self.derivation, self.base, self.nbytes = derivation, base, pool_nbytes
        # Groups alias from byte 0 (a block id belongs to one group at a time), so bytes of
        # another group's page at the *same* block id are harmless to move along (padding),
        # as is padding nobody owns.
        group_of = {n: v.group_id for n, v in derivation.registered.items()}
        self.owned: dict[int, bytearray] = {}
        self.expected: dict[tuple[str, int], list] = {}
        for name in derivation.registered:
            mask = self.owned.setdefault(group_of[name], bytearray(pool_nbytes))
            for b in range(derivation.num_blocks):
                bb = derivation.block_bytes(name, b)
                iv = intervals.merge((base + a, base + z) for a, z in bb.page.runs())
                self.expected[name, b] = iv
                for a, z in iv:
                    mask[a - base : z - base] = b"\x01" * (z - a)

    def harmful(self, block: int, extra: list) -> list:
        """The ``extra`` bytes moved for ``block`` that hold another block id's data."""
        # Moving other layers' pages of the *same* block id along is fine (NIXL moves the
        # whole row of a block-outermost layout); bytes of any other block id are not.
        base = self.base
        allowed = intervals.merge(iv for n in self.derivation.registered for iv in self.expected[n, block])
        rest = intervals.subtract(intervals.merge(extra), allowed)
        return [(a, z) for a, z in rest if any(any(m[a - base : z - base]) for m in self.owned.values())]


def _judge(connector: Any, label: str, derivation, caches: Mapping[str, Any], ctx: RegistrationContext,
           report: ConnectorReport, base_result: CaseResult) -> CaseResult:
    """Register, then every check the adapter's members allow, then the round trip."""
    findings = _Findings(derivation.case.name, derivation.runner, label)

    def finish(status: str, detail: str, checked: int = 0, round_trip: str = "") -> CaseResult:
        divs = findings.items
        report.divergences.extend(divs)
        byte_level = [d for d in divs if d.field in ("descriptors", "k", "v", "heads")]
        cause = (byte_level or divs)[0].cause if status == "failure" and divs else ""
        return dataclasses.replace(base_result, status=status, detail=detail, checked=checked, round_trip=round_trip,
                                   cause=cause)

    first = next(iter(caches.values()))
    base, pool_nbytes = first.untyped_storage().data_ptr(), first.untyped_storage().nbytes()
    adapter, outcome = _register(connector, label, caches, ctx, findings)
    if outcome is not None:
        return finish(*outcome)
    pages = _PoolPages(derivation, base, pool_nbytes)
    facts = {n: LayerFacts(derivation, n, caches[n], base) for n in derivation.registered}
    try:
        _check_kernel_block_size(adapter, derivation, facts, findings)
        for f in facts.values():
            _check_block_len(adapter, f, derivation.layout.name, findings)
            _check_num_blocks(adapter, f, derivation.num_blocks, findings)
        moved = getattr(adapter, "transferred_layers", None)
        if moved is not None:  # by design the connector moves only some layers (e.g. only offloaded groups)
            facts = {n: f for n, f in facts.items() if n in moved}
        checked = _check_descriptors(adapter, derivation, facts, pages, findings)
        _check_head_slices(adapter, derivation, facts, base, findings)
    except _AdapterGap as gap:
        findings.items.clear()  # what the adapter could not read is no finding of the connector's
        return finish("unsupported", str(gap))
    trip = _check_round_trip(adapter, derivation, caches, findings)
    status = "failure" if findings.items else "pass"
    detail = (f"layout {derivation.layout.name}, kernel blocks {derivation.kernel_block_sizes}, {checked} (layer, block) checked; "
              f"round trip {trip.status}" + (f" ({trip.detail})" if trip.status in ("skipped", "not_applicable") else ""))
    return finish(status, detail, checked, trip.status if trip.status in ("pass", "fail") else f"{trip.status}: {trip.detail}")


def _register(connector: Any, label: str, caches: Mapping[str, Any], ctx: RegistrationContext,
              findings: _Findings) -> tuple[Any, tuple[str, str] | None]:
    """(the registered adapter, None), or (None, (status, detail)) when registration did not
    succeed: ``unsupported`` (not drivable here, or the built-in adapter itself broke),
    ``refusal`` (the connector's own code raised) or ``failure`` (it exited the process)."""
    from gpu_impl.connectors import Undrivable

    try:
        adapter = instantiate(connector, ctx)
        adapter.register(dict(caches))
    except Undrivable as exc:
        return None, ("unsupported", f"cannot be driven here: {exc}"[:300])
    except ADAPTER_ERRORS as exc:  # even sys.exit: reported, never ending the check
        who, where = raised_in(exc)
        if not isinstance(exc, Exception):  # sys.exit / KeyboardInterrupt: no error a user could act on
            findings.add("*", None, "register", "register_kv_caches succeeds or raises an error", f"{type(exc).__name__}: {exc}",
                         f"register raised {type(exc).__name__}: {exc} at {where}")
            return None, ("failure", f"register raised {type(exc).__name__}")
        gap = adapter_gap(exc, label, registering=True)
        if gap is not None:
            # The built-in adapter itself failed (a changed connector API): not the connector's verdict.
            return None, ("unsupported", gap)
        # The connector's own code refused the layout at registration.
        return None, ("refusal", f"{one_line(exc)} at {where}"[:300])
    return adapter, None


# --- the derived values an adapter may expose -------------------------------------------------------


def _check_kernel_block_size(adapter: Any, derivation, facts: Mapping[str, LayerFacts], findings: _Findings) -> None:
    expected = {f.kernel_tokens for f in facts.values() if not derivation.specs[f.name].__class__.__name__ == "MambaSpec"}
    kbs = getattr(adapter, "kernel_block_size", None)
    if callable(kbs):
        kbs = None
    if isinstance(kbs, int) and expected and kbs not in expected:
        findings.add("*", None, "kernel_block_size", sorted(expected), kbs, kernel_block_size_message(kbs, expected, facts))


def _check_block_len(adapter: Any, f: LayerFacts, layout: str, findings: _Findings) -> None:
    if not hasattr(adapter, "block_len"):
        return
    name = f.name
    try:
        bl = int(adapter.block_len(name))
    except ADAPTER_ERRORS as exc:
        findings.raise_if_adapter_gap(exc)
        findings.add(name, None, "block_len", f.kernel_page, f"{type(exc).__name__}: {exc}", f"block_len raised {type(exc).__name__}: {exc}")
        return
    if not block_len_is_right(bl, f, layout):
        findings.add(name, None, "block_len", f.kernel_page, bl, block_len_message(bl, f))


def _check_num_blocks(adapter: Any, f: LayerFacts, logical_blocks: int, findings: _Findings) -> None:
    if not hasattr(adapter, "num_blocks"):
        return
    try:
        nb = int(adapter.num_blocks(f.name))
    except ADAPTER_ERRORS as exc:
        findings.raise_if_adapter_gap(exc)
        nb = f"{type(exc).__name__}: {exc}"
    if nb != f.view.shape[0]:
        findings.add(f.name, None, "num_blocks", f.view.shape[0], nb, num_blocks_message(nb, f, logical_blocks))


# --- the bytes ------------------------------------------------------------------------------------


def _check_descriptors(adapter: Any, derivation, facts: Mapping[str, LayerFacts], pages: _PoolPages,
                       findings: _Findings) -> int:
    """Every (layer, logical block)'s descriptors (and K and V apart, with ``kv_descriptors``)
    against the reference's bytes; returns the pairs checked."""
    base, pool_nbytes = pages.base, pages.nbytes
    add = findings.add
    checked = 0
    kv = hasattr(adapter, "kv_descriptors")
    for name, f in facts.items():
        for b in range(derivation.num_blocks):
            checked += 1
            expected = pages.expected[name, b]
            try:
                if kv:
                    k_obs, v_obs = adapter.kv_descriptors(name, b)
                    k_obs, v_obs = _to_intervals(k_obs, "kv_descriptors"), _to_intervals(v_obs, "kv_descriptors")
                    observed = intervals.merge(k_obs + v_obs)
                else:
                    observed = _to_intervals(adapter.descriptors(name, b), "descriptors")
            except ADAPTER_ERRORS as exc:
                findings.raise_if_adapter_gap(exc)
                add(name, b, "descriptors", show(expected, base), f"{type(exc).__name__}: {exc}",
                    f"descriptors({name!r}, {b}) raised {type(exc).__name__}: {exc}")
                continue
            outside = [(a, z) for a, z in observed if a < base or z > base + pool_nbytes]
            if outside:
                add(name, b, "descriptors", show(expected, base), f"{intervals.total(outside)} bytes outside the pool",
                    f"descriptors leave the registered pool ({pool_nbytes} bytes at data_ptr of the shared storage): "
                    "addresses must be tensor.data_ptr() + offsets inside the view", "out_of_pool")
                continue
            missing = intervals.subtract(expected, observed)
            extra = intervals.subtract(observed, expected)
            # Extra bytes that belong to no layer's block (page padding) are harmless.
            extra = pages.harmful(b, extra) if extra else extra
            if missing or extra:
                cause, why = descriptor_cause(f, derivation.layout.name, b, expected, observed, "page")
                add(name, b, "descriptors", show(expected, base), show(observed, base), why, cause)
                continue
            if kv:
                bb = derivation.block_bytes(name, b)
                if bb.v is not None:
                    for side, obs, region in (("k", k_obs, bb.k), ("v", v_obs, bb.v)):
                        exp = intervals.merge((base + a, base + z) for a, z in region.runs())
                        if exp != obs:
                            cause, why = descriptor_cause(f, derivation.layout.name, b, exp, obs, side,
                                                          derivation.kv_packing(name).value)
                            add(name, b, side, show(exp, base), show(obs, base), why, cause)
    return checked


def _check_head_slices(adapter: Any, derivation, facts: Mapping[str, LayerFacts], base: int, findings: _Findings) -> None:
    """With ``head_descriptors``: each half of the heads of every block (hetero-TP transfers)."""
    if not hasattr(adapter, "head_descriptors"):
        return
    for name, f in facts.items():
        heads = f.view.shape[1]
        if heads < 2:
            continue
        for b in range(derivation.num_blocks):
            for h0, h1 in ((0, heads // 2), (heads // 2, heads)):
                exp = intervals.merge((base + lo, base + hi) for lo, hi in derivation.head_slice(name, b, h0, h1))
                try:
                    obs = _to_intervals(adapter.head_descriptors(name, b, h0, h1), "head_descriptors")
                except ADAPTER_ERRORS as exc:
                    findings.add(name, b, "heads", show(exp, base), f"{type(exc).__name__}: {exc}",
                                 f"head_descriptors({name!r}, {b}, {h0}, {h1}) raised {type(exc).__name__}: {exc}")
                    continue
                if obs != exp:
                    findings.add(name, b, "heads", f"heads [{h0}, {h1}): " + show(exp, base), show(obs, base),
                                 heads_message(f, derivation.layout.name, b, h0, h1, exp, obs))


def _check_round_trip(adapter: Any, derivation, caches: Mapping[str, Any], findings: _Findings):
    """The round trip through the connector's own copies; each of its findings is one line."""
    from conformance.connectors.roundtrip import check_round_trip

    trip = check_round_trip(adapter, derivation, caches, *_round_trip_blocks(derivation.num_blocks), adapter_errors=ADAPTER_ERRORS)
    for finding in trip.findings:
        findings.items.append(ConnectorFinding(
            findings.case, findings.runner, finding.layer, trip.dst_block, f"round_trip:{finding.kind}",
            f"block {trip.dst_block} holds block {trip.src_block}'s bytes, nothing else changes",
            finding.message, f"round trip {trip.src_block} -> {trip.dst_block}: {finding.message}",
            cause="out_of_pool" if finding.kind == "out_of_pool" else "round_trip"))
    return trip


def _round_trip_blocks(num_blocks: int) -> tuple[int, int]:
    """Source and destination of the round trip: away from block 0 (where an offset lost
    to a wrong stride hides) and apart, so neighbours are exercised on both sides."""
    if num_blocks >= 4:
        return 1, num_blocks - 2
    return (0, 1) if num_blocks >= 2 else (0, 0)


def _cases(cases: Iterable[Any] | None):
    from reference.config import CaseConfig
    from suites.named_cases import CASES, get_case

    if cases is None:
        return list(CASES.values())
    out = []
    for c in cases:
        out.append(c if isinstance(c, CaseConfig) else get_case(c))
    return out


def validate_registration(
    connector: ConnectorLike,
    cases: Iterable[Any] | None = None,
    runners: Sequence[str] = ("mrv1", "mrv2"),
    *,
    tensors: str = "vllm",
    expectations: Sequence[Any] | None = None,
) -> ConnectorReport:
    """Check a connector adapter against the reference on every case (named cases by default).

    ``connector``: an adapter instance, a factory/class called with a ``RegistrationContext``
    per case, or ``"package.module:Name"``. ``cases``: names or ``CaseConfig``s.
    ``tensors``: ``vllm`` (each runner's own registration; needs vLLM) or ``reference`` (the
    reference's views; runners whose views are identical to an earlier runner's are then
    checked once). ``expectations``: None reads the shipped ones (failures they cite as known
    upstream bugs do not fail ``report.ok``); ``()`` uses none.
    """
    if tensors not in TENSOR_SOURCES:
        raise ValueError(f"tensors={tensors!r}: expected one of {', '.join(TENSOR_SOURCES)}")
    from reference.derive import derive
    from reference.errors import NotModeledError, StartupError

    label = adapter_label(connector)
    if isinstance(connector, str):
        connector = load_connector(connector)
    driver = getattr(connector, "requires_vllm_driver", None) or ("layout" if tensors == "vllm" else None)
    if driver is not None:
        # A built-in adapter drives vLLM's own connector: on a vLLM without the API it
        # uses, nothing can be checked (NotDrivable: exit 5), and the connector is not blamed.
        from gpu_impl.vllm_api import require

        require(driver)
    report = ConnectorReport(label)
    # A connector that asks vLLM for a layout (get_required_kvcache_layout) is checked on
    # the case as vLLM runs it with that connector configured (a forced layout still wins).
    configured = getattr(connector, "case_connector", None)
    for case in _cases(cases):
        if configured is not None and case.connector != configured:
            case = case.with_(connector=configured)
        seen: list[Mapping[str, Any]] = []
        skipped: set[str] = set()
        for runner in runners:
            try:
                d = derive(case, runner)
            except (StartupError, NotModeledError) as exc:
                why = (f"vLLM refuses this configuration: {exc}" if isinstance(exc, StartupError)
                       else f"not modeled: {exc}")[:160]
                # One row for what every runner refuses alike; a runner-specific refusal (MRv1 refuses PCP,
                # which MRv2 runs) leaves the other runner checked.
                if why not in skipped:
                    skipped.add(why)
                    report.results.append(CaseResult(case.name, runner, "skipped", why))
                continue
            if not d.registered:
                # An attention-free model (every layer encoder-only): no KV cache for a connector to move.
                report.results.append(CaseResult(case.name, runner, "skipped",
                                                 "nothing to move: the model keeps no KV cache (every layer encoder-only)"))
                continue
            if tensors == "reference":
                if d.registered in seen:
                    continue
                seen.append(d.registered)
            report.results.append(_check_case(connector, label, d, report, tensors))
    if expectations != ():
        _mark_known_failures(report, getattr(connector, "connector", None) or label, expectations)
    return report


def _mark_known_failures(report: ConnectorReport, name: str, expectations: Sequence[Any] | None) -> None:
    """Each failure a ``connector_copy_plan`` expectation explains gets ``expected_by`` (one
    source of known divergences: conformance/expectations.toml). The divergence's field is
    ``<connector>.<cause>`` (e.g. ``DecodeBenchConnector.kernel_blocks``), so an entry names
    both the connector and what it gets wrong."""
    from conformance.diff import Divergence as Known
    from conformance.expectations import case_facts, classify
    from suites.named_cases import CASES

    failures = {(r.case, r.runner): Known("connector_copy_plan", r.case, r.runner, f"{name}.{r.cause}", "the block's bytes", r.detail)
                for r in report.results if r.status == "failure"}
    if not failures:
        return
    from conformance.judgement import installed_vllm_version

    version = installed_vllm_version()
    # A failure is reported only where vLLM registered the reference's views (else "views differ"), so the
    # layout vLLM resolved is the derivation's: an entry scoped to a layout matches a case that leaves it to vLLM.
    facts = {case: _with_resolved_layout(case_facts(CASES[case]), CASES[case], runner)
             for case, runner in failures if case in CASES}
    matched = {(m.divergence.case, m.divergence.runner): m.expectation.id
               for m in classify(failures.values(), {"vllm": version, "cases": facts}, expectations).expected}
    report.results = [dataclasses.replace(r, expected_by=matched.get((r.case, r.runner))) if r.status == "failure" else r
                      for r in report.results]


def _with_resolved_layout(facts: Any, case: Any, runner: str) -> Any:
    """``facts`` with the layout the derivation resolved added (unchanged where the reference refuses the case)."""
    from reference.derive import derive
    from reference.errors import ReferenceError_

    try:
        layout = derive(case, runner).layout.name
    except ReferenceError_:
        return facts
    return dataclasses.replace(facts, layouts=facts.layouts | {layout})


__all__ = ["CAUSES", "STATUSES", "TENSOR_SOURCES", "CaseResult", "ConnectorFinding", "ConnectorReport", "build_kv_caches",
           "load_connector", "make_context", "validate_registration"]
