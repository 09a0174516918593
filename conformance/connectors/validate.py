"""``validate_registration``: feed a connector adapter the tensors vLLM registers, compare the
bytes it would transfer for every (layer, logical block) with the reference, and round-trip
a block through the connector's own copies (``conformance.connectors.roundtrip``).

The tensors (``tensors="vllm"``, the default) are the ``kv_caches`` each runner's own
``initialize_kv_cache`` registered, allocated in host memory
(``gpu_impl.vllm_cpu.planning.observe(device="cpu", on_registered=...)``); the adapter gets
the runner's vLLM config and KV cache config with them (``RegistrationContext.vllm``). Where
those views differ from the reference's, the connector is not judged on them (``kvconform
run`` reports the runner's divergence). ``tensors="reference"`` carves them from one int8
pool exactly as the reference's ``TensorView``s say, for checking an adapter's arithmetic
without vLLM installed.

Per connector x case x runner the status is one of ``STATUSES``:

- ``pass``: every block's descriptors are its bytes and the round trip restores them;
- ``refusal``: the connector's own code raised at registration (the message and the line
  that raised are reported; not a failure by default);
- ``failure``: it accepted the layout and moves other bytes (each divergence says which);
- ``unsupported``: the connector cannot be driven here for the case (why);
- ``skipped``: vLLM refuses the case, the reference does not model it, or vLLM registered
  other views than the reference predicts.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from conformance.connectors.protocol import ConnectorLike, LayerInfo, RegistrationContext
from reference import intervals

_TORCH_DTYPES = ("bfloat16", "float16", "float32", "uint8", "int8", "float8_e4m3fn", "float8_e5m2")
_SHOW = 3  # intervals shown per expected/observed value
STATUSES = ("pass", "refusal", "failure", "unsupported", "skipped")
CAUSES = ("kernel_blocks", "layout_strides", "kv_packing", "page_padding", "page_stride", "heads_as_tokens",
          "missing_bytes", "no_descriptors", "out_of_pool", "derived_value", "round_trip", "register")
"""What a divergence is put down to: logical vs kernel blocks, layout strides, K/V packing, page
padding, page size used as the block stride, heads counted as tokens, other missing/extra bytes,
no descriptors, addresses outside the pool, a wrong derived value (block_len, num_blocks,
kernel_block_size), a round-trip finding alone, a failed registration."""
TENSOR_SOURCES = ("vllm", "reference")
MAX_POOL_BYTES = 256 << 20
"""Pools above this are not allocated for a byte-level check (bounded memory on any case)."""


@dataclass(frozen=True)
class Divergence:
    """One way the connector's registration disagrees with the reference."""

    case: str
    runner: str
    layer: str
    block: int | None
    field: str
    """``descriptors``, ``k``, ``v``, ``heads``, ``block_len``, ``num_blocks``, ``kernel_block_size``,
    ``register`` or ``round_trip:<kind>`` (``conformance.connectors.roundtrip.Finding.kind``)."""
    expected: str
    observed: str
    message: str
    """One line telling the author what to fix."""
    blocks_affected: int = 1
    cause: str = "missing_bytes"
    """What the divergence is put down to (one of ``CAUSES``)."""

    def line(self) -> str:
        where = f"{self.layer}" + (f" block {self.block}" if self.block is not None else "")
        more = f" (+{self.blocks_affected - 1} more blocks)" if self.blocks_affected > 1 else ""
        return f"{self.case} [{self.runner}] {where}: {self.field}{more}: {self.message}"


@dataclass(frozen=True)
class CaseResult:
    """One connector x case x runner."""

    case: str
    runner: str
    status: str
    """One of ``STATUSES``."""
    detail: str = ""
    """For a refusal: the connector's message and the line that raised it."""
    config: str = ""
    replay: str = ""
    checked: int = 0
    """(layer, block) pairs compared."""
    round_trip: str = ""
    """``pass``, ``fail``, ``not_applicable`` or ``skipped`` (with why), empty if not reached."""
    tensors: str = ""
    """Where the registered tensors came from: ``vllm`` (the runner's own) or ``reference``."""
    connector: str = ""
    cause: str = ""
    """For a failure: what it is put down to (``CAUSES``; the first byte-level divergence's)."""
    expected_by: str | None = None
    """For a failure: the shipped expectation (``connector_copy_plan``, conformance/expectations.toml)
    that cites the upstream bug behind it; reported, but not failing the check."""


@dataclass
class ConnectorReport:
    connector: str
    results: list[CaseResult] = field(default_factory=list)
    divergences: list[Divergence] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No failure, other than ones a shipped expectation cites as a known upstream bug."""
        return not any(r.status == "failure" and not r.expected_by for r in self.results)

    @property
    def failed_cases(self) -> list[str]:
        return [r.case for r in self.results if r.status == "failure"]

    @property
    def passed_cases(self) -> list[str]:
        return [r.case for r in self.results if r.status == "pass"]

    @property
    def refused_cases(self) -> list[str]:
        return [r.case for r in self.results if r.status == "refusal"]

    def counts(self) -> dict[str, int]:
        return {status: sum(r.status == status for r in self.results) for status in STATUSES}

    def for_case(self, case: str) -> list[Divergence]:
        return [d for d in self.divergences if d.case == case]

    def format(self, max_per_case: int = 6) -> str:
        out = [f"connector {self.connector}"]
        for r in self.results:
            known = f" (known upstream [{r.expected_by}])" if r.expected_by else ""
            out.append(f"  {r.status.upper():11} {r.case} [{r.runner}] {r.detail}{known}".rstrip())
            if r.status != "failure":
                continue
            divs = [d for d in self.divergences if d.case == r.case and d.runner == r.runner]
            for d in divs[:max_per_case]:
                out.append(f"      {d.line()}")
                out.append(f"          expected {d.expected}; observed {d.observed}")
            if len(divs) > max_per_case:
                out.append(f"      ... {len(divs) - max_per_case} more")
            out.append(f"      config: {r.config}")
            out.append(f"      replay: {r.replay}")
        c = self.counts()
        out.append(f"{c['pass']} passed, {c['failure']} failed, {c['refusal']} refused by the connector, "
                   f"{c['unsupported']} unsupported, {c['skipped']} skipped (vLLM refuses, not modeled, or views differ)")
        return "\n".join(out)

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {
            "schema": "kvconform.connector-report/2",
            "connector": self.connector,
            "results": [asdict(r) for r in self.results],
            "divergences": [asdict(d) for d in self.divergences],
        }


# --- tensors ---------------------------------------------------------------------------------


def _require_torch():
    try:
        import torch
    except ImportError:  # pragma: no cover - exercised in the no-torch CI env
        raise ImportError("validate_registration needs torch (CPU is enough): pip install torch") from None
    return torch


def build_kv_caches(derivation) -> tuple[Any, dict[str, Any]]:
    """The pool and the ``kv_caches`` dict vLLM 0.33.0 hands ``register_kv_caches``."""
    torch = _require_torch()
    views = derivation.registered
    nbytes = {v.storage_nbytes for v in views.values()}
    if len(nbytes) != 1:
        raise AssertionError(f"reference views disagree on the pool size: {sorted(nbytes)}")
    pool = torch.zeros(nbytes.pop(), dtype=torch.int8)
    caches: dict[str, Any] = {}
    for name, view in views.items():
        if view.dtype not in _TORCH_DTYPES:
            raise NotImplementedError(f"dtype {view.dtype} has no torch equivalent here")
        dt = getattr(torch, view.dtype)
        typed = pool.view(dt) if dt.itemsize != 1 or dt != torch.int8 else pool
        caches[name] = typed.as_strided(view.shape, view.stride, view.storage_offset)
    return pool, caches


# --- intervals (reference.intervals) ---------------------------------------------------------


def _show(iv: list[tuple[int, int]], base: int) -> str:
    """Intervals as pool offsets, a few shown."""
    parts = [f"[{a - base}, {b - base})" for a, b in iv[:_SHOW]]
    more = f" +{len(iv) - _SHOW} more" if len(iv) > _SHOW else ""
    return f"{intervals.total(iv)} bytes at pool offsets {' '.join(parts) or 'none'}{more}"


MAX_DESCRIPTORS = 1 << 16
"""Descriptors one call may return: more is a connector bug (an endless iterator would
otherwise grow without bound)."""

ADAPTER_ERRORS = (Exception, SystemExit, KeyboardInterrupt)
"""What an adapter's own code may raise; reported as a divergence, never ending the check."""


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


# --- resolving the connector --------------------------------------------------------------------


def load_connector(spec: str):
    """``"package.module:Name"`` -> the object it names."""
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"connector {spec!r} must look like package.module:Name")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _label(connector: Any) -> str:
    if isinstance(connector, str):
        return connector
    target = connector if (inspect.isclass(connector) or inspect.isfunction(connector)) else type(connector)
    return f"{target.__module__}:{target.__qualname__}"


def _instantiate(connector: Any, ctx: RegistrationContext):
    if hasattr(connector, "register") and hasattr(connector, "descriptors") and not inspect.isclass(connector):
        return connector
    if not callable(connector):
        raise TypeError(f"{connector!r} is neither an adapter (register/descriptors) nor a factory")
    try:
        params = inspect.signature(connector).parameters
    except (TypeError, ValueError):
        params = {"ctx": None}
    return connector(ctx) if params else connector()


def make_context(derivation) -> RegistrationContext:
    from reference.specs import AttentionSpec

    layers = {}
    group_of = {n: gid for gid, g in enumerate(derivation.groups) for n in g.layer_names}
    for name, view in derivation.registered.items():
        spec = derivation.specs[name]
        attn = isinstance(spec, AttentionSpec)
        layers[name] = LayerInfo(
            name=name,
            group_id=group_of.get(name, view.group_id),
            kind=spec.kind.value if attn else "mamba",
            block_size=spec.block_size,
            page_size_bytes=spec.page_size_bytes,
            num_kv_heads=spec.num_kv_heads if attn else 0,
            head_size=spec.head_size if attn else 0,
            head_size_v=spec.head_size_v if attn else 0,
            dtype=view.dtype,
            backend=derivation.layer_backends.get(name, ""),
            is_mla=attn and spec.kind.is_mla,
            is_mamba=not attn,
            is_draft=bool(getattr(spec, "is_draft", False)),
            kv_packing=derivation.kv_packing(name).value,
        )
    return RegistrationContext(
        case_name=derivation.case.name,
        runner=derivation.runner,
        layout=derivation.layout.name,
        block_size=derivation.cache_block_size,
        num_blocks=derivation.num_blocks,
        layers=layers,
        kernel_block_sizes=tuple(derivation.kernel_block_sizes),
        case=derivation.case,
    )


def replay_command(connector_label: str, case) -> str:
    """``conformance.replay.replay_command`` through this connector."""
    from conformance.replay import replay_command as replay

    return replay(case, connector=connector_label)


# --- the check ---------------------------------------------------------------------------------


class _LayerFacts:
    """What the reference says about one registered layer (``Derivation.layer_blocks``),
    with the addresses of the tensor the connector was handed."""

    def __init__(self, derivation, name: str, view_tensor, base: int) -> None:
        blocks = derivation.layer_blocks(name)
        self.name = name
        self.view = derivation.registered[name]
        self.base = base
        self.es = self.view.element_size
        self.ratio = blocks.kernel_blocks_per_block
        self.kernel_tokens = blocks.kernel_block_tokens
        self.logical_tokens = blocks.block_tokens
        self.page = blocks.page_bytes
        self.stride0 = blocks.kernel_block_stride_bytes
        self.data_ptr = view_tensor.data_ptr()
        self.heads = blocks.heads
        self.kernel_content = blocks.kernel_content_bytes
        self.kernel_page = blocks.kernel_page_bytes


_PACKING_WHERE = {
    "kv_in_c": "K then V in the last dim C of every (token, head)",
    "two_head_slots": "two head slots: H = 2 (slot 0 is K, slot 1 is V) and C holds every head of one token",
    "cpu_kv_planes": "per (block, head) a K plane of all the block's tokens, then a V plane",
    "mla_latent": "one latent vector per token, no separate V",
    "state": "raw recurrent state, no K or V",
}


def _diagnose_descriptors(f: _LayerFacts, layout: str, block: int, expected: list, observed: list, kind: str,
                          packing: str = "kv_in_c") -> tuple[str, str]:
    """(the cause, one of ``CAUSES``; one line naming it and the fix) of a descriptor mismatch."""
    lo = observed[0][0] if observed else None
    n_obs, n_exp = intervals.total(observed), intervals.total(expected)
    what = "K bytes" if kind == "k" else "V bytes" if kind == "v" else "bytes"
    if not observed:
        return "no_descriptors", f"no descriptors for logical block {block}: every registered layer (including aliased groups) must transfer its block"
    if kind in ("k", "v") and packing != "kv_in_c":
        # The page is right (checked first) but K and V were split as if K then V share the last dim.
        return "kv_packing", (
            f"the block's page is right but its {what} are not: this layer's backend packs {_PACKING_WHERE.get(packing, packing)} "
            f"(LayerInfo.kv_packing = {packing!r}); split K from V by that packing, not by halving the last dim"
        )
    content_block = f.kernel_content * f.ratio  # the block's bytes without page padding
    if (lo is not None and block > 0 and f.page > content_block and f.stride0 * f.ratio == f.page
            and lo == f.data_ptr + block * content_block):
        return "page_padding", (
            f"block {block} starts {block} x {content_block} bytes (the block's K/V bytes) into the layer, but this layer's "
            f"pages are padded to {f.page} bytes (page_size_bytes: the group shares one page size): "
            f"address blocks with stride(0)*element_size ({f.stride0}), which includes the padding"
        )
    if lo is not None and f.ratio > 1 and lo == f.data_ptr + block * f.stride0 and (block > 0 or n_obs * f.ratio == n_exp):
        return "kernel_blocks", (
            f"logical block {block} was addressed as kernel block {block} (offset {block * f.stride0} into the layer); "
            f"vLLM registered {f.kernel_tokens}-token kernel blocks ({f.ratio} per {f.logical_tokens}-token logical block, "
            f"shape[0] = {f.view.shape[0]}): logical block b is kernel blocks [b*{f.ratio}, b*{f.ratio}+{f.ratio - 1}]"
        )
    if lo is not None and block > 0 and f.page != f.stride0 * f.ratio and lo == f.data_ptr + block * f.page:
        return "page_stride", (
            f"block {block} starts {block} x page ({f.page} bytes) into the layer, but under {layout} consecutive "
            f"blocks are {f.stride0 * f.ratio} bytes apart (stride(0)*element_size = {f.stride0}"
            + (", block-outermost: all layers' pages of a block sit together" if layout.startswith("B") else "")
            + "): address blocks with stride(0), never with the page size"
        )
    if f.heads != f.kernel_tokens and f.ratio * n_obs * f.kernel_tokens == n_exp * f.heads:
        return "heads_as_tokens", (
            f"{n_obs} {what} per block = shape[-3] ({f.heads}) tokens' worth: in 0.33.0's [B, H, N, C] view shape[-3] "
            f"is num_kv_heads; a block holds shape[2] = {f.kernel_tokens} tokens per kernel block ({f.logical_tokens} per logical block)"
        )
    if n_obs == n_exp * f.ratio and f.ratio > 1:
        return "kernel_blocks", (
            f"{n_obs} {what} per block looks like the logical block ({f.logical_tokens} tokens) laid over kernel blocks of "
            f"{f.kernel_tokens} tokens: take block length and count from the registered view (stride(0), shape[0])"
        )
    if n_obs == n_exp:
        order = {"LBHNC": "heads outer to tokens (H, N, C)", "LBNHC": "tokens outer to heads (N, H, C)"}.get(
            layout, f"the strides of {layout}"
        )
        return "layout_strides", (
            f"right amount ({n_obs} {what}) at the wrong addresses: under {layout} a block is laid out with {order}; "
            f"view strides are {tuple(s * f.es for s in f.view.stride)} bytes: compute offsets from tensor.stride(), "
            "not from an assumed layout"
        )
    missing, extra = intervals.subtract(expected, observed), intervals.subtract(observed, expected)
    return "missing_bytes", (
        f"{intervals.total(missing)} {what} of the block are not transferred and {intervals.total(extra)} bytes of other data are: "
        f"block {block} of this layer is {_show(expected, f.base)}"
    )


def _diagnose_heads(f: "_LayerFacts", layout: str, block: int, h0: int, h1: int, expected: list, observed: list) -> str:
    if intervals.total(observed) == intervals.total(expected):
        if layout in ("LBHNC", "BLHNC"):
            how = f"under {layout} each head's {f.kernel_tokens} tokens are contiguous (heads outer to tokens), so a head slice is one run per kernel block"
        elif layout in ("LBNHC", "BLNHC"):
            how = f"under {layout} tokens are outer to heads, so a head slice is one run per token"
        else:
            how = f"under {layout} heads sit {f.view.stride[1] * f.es} bytes apart"
        return (
            f"heads [{h0}, {h1}) of block {block} point at other heads' or tokens' bytes: {how}; "
            f"take head and token offsets from stride(1) and stride(2) ({f.view.stride[1] * f.es}, {f.view.stride[2] * f.es} bytes), "
            "never from an assumed NHD/HND order"
        )
    return f"heads [{h0}, {h1}) of block {block}: {intervals.total(observed)} bytes where the slice is {intervals.total(expected)}; derive head slices from the view's strides"


def _views_differ(derivation, kv_caches: Mapping[str, Any]) -> str | None:
    """Where vLLM's registered tensors differ from the reference's views (None: they agree)."""
    if list(kv_caches) != list(derivation.registered):
        return f"vLLM registered layers {list(kv_caches)}, the reference predicts {list(derivation.registered)}"
    for name, view in derivation.registered.items():
        t = kv_caches[name]
        got = (tuple(t.shape), tuple(t.stride()), t.storage_offset(), str(t.dtype).removeprefix("torch."), t.untyped_storage().nbytes())
        want = (tuple(view.shape), tuple(view.stride), view.storage_offset, view.dtype, view.storage_nbytes)
        if got != want:
            return f"{name}: vLLM registered (shape, stride, offset, dtype, pool bytes) {got}, the reference predicts {want}"
    storages = {t.untyped_storage().data_ptr() for t in kv_caches.values()}
    if len(storages) != 1:
        return f"vLLM registered {len(storages)} storages, the reference predicts one shared pool"
    return None


def _raised_in(exc: BaseException) -> tuple[str, str]:
    """(who raised: ``vllm``, ``kvconform`` or ``connector``, and ``file:line: code`` of the raise)."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "connector", ""
    last = frames[-1]
    where = f"{last.filename.split('site-packages/')[-1]}:{last.lineno}: {(last.line or '').strip()}"
    path = last.filename.replace("\\", "/")
    if "/vllm/" in path:
        return "vllm", where
    if any(f"/{pkg}/" in path for pkg in ("gpu_impl", "conformance", "reference")):
        return "kvconform", where
    return "connector", where


def _one_line(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"[:300]


def _check_case(connector: Any, label: str, derivation, report: ConnectorReport, tensors: str = "vllm") -> CaseResult:
    """One case x runner: the connector registers the tensors (vLLM's own, or the reference's
    views) and is judged by the reference."""
    case, runner = derivation.case, derivation.runner
    base_result = CaseResult(case.name, runner, "skipped", config=case.to_json(), replay=replay_command(label, case),
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
        differ = _views_differ(derivation, kv.kv_caches)
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


def _judge(connector: Any, label: str, derivation, caches: Mapping[str, Any], ctx: RegistrationContext,
           report: ConnectorReport, base_result: CaseResult) -> CaseResult:
    from gpu_impl.connectors import Undrivable
    from conformance.connectors.roundtrip import check_round_trip

    case, runner = derivation.case, derivation.runner
    first = next(iter(caches.values()))
    base = first.untyped_storage().data_ptr()
    pool_nbytes = first.untyped_storage().nbytes()
    divs: list[Divergence] = []

    def add(layer, block, fld, expected, observed, message, cause=None):
        for i, d in enumerate(divs):
            if d.layer == layer and d.field == fld:
                divs[i] = dataclasses.replace(d, blocks_affected=d.blocks_affected + 1)
                return
        if cause is None:
            cause = {"register": "register", "heads": "layout_strides"}.get(fld, "derived_value")
        divs.append(Divergence(case.name, runner, layer, block, fld, str(expected), str(observed), message,
                               cause=cause))

    def finish(status: str, detail: str, checked: int = 0, round_trip: str = "") -> CaseResult:
        report.divergences.extend(divs)
        byte_level = [d for d in divs if d.field in ("descriptors", "k", "v", "heads")]
        cause = (byte_level or divs)[0].cause if status == "failure" and divs else ""
        return dataclasses.replace(base_result, status=status, detail=detail, checked=checked, round_trip=round_trip,
                                   cause=cause)

    try:
        adapter = _instantiate(connector, ctx)
        adapter.register(dict(caches))
    except Undrivable as exc:
        return finish("unsupported", f"cannot be driven here: {exc}"[:300])
    except ADAPTER_ERRORS as exc:  # even sys.exit: reported, never ending the check
        who, where = _raised_in(exc)
        if not isinstance(exc, Exception):  # sys.exit / KeyboardInterrupt: no error a user could act on
            add("*", None, "register", "register_kv_caches succeeds or raises an error", f"{type(exc).__name__}: {exc}",
                f"register raised {type(exc).__name__}: {exc} at {where}")
            return finish("failure", f"register raised {type(exc).__name__}")
        if who == "kvconform" and label.startswith("gpu_impl.connectors."):
            # The built-in adapter itself failed (a changed connector API): not the connector's verdict.
            return finish("unsupported", f"the adapter could not drive the connector: {_one_line(exc)} at {where}"[:300])
        # The connector's own code refused the layout at registration.
        return finish("refusal", f"{_one_line(exc)} at {where}"[:300])

    facts = {n: _LayerFacts(derivation, n, caches[n], base) for n in derivation.registered}
    layout_name = derivation.layout.name
    # Bytes each KV cache group's pages occupy. Groups alias from byte 0 (a block id belongs
    # to one group at a time), so bytes of another group's page at the *same* block id are
    # harmless to move along (padding), as is padding nobody owns.
    group_of = {n: v.group_id for n, v in derivation.registered.items()}
    owned: dict[int, bytearray] = {}
    expected_pages: dict[tuple[str, int], list] = {}
    for name in derivation.registered:
        mask = owned.setdefault(group_of[name], bytearray(pool_nbytes))
        for b in range(derivation.num_blocks):
            bb = derivation.block_bytes(name, b)
            iv = intervals.merge((base + a, base + z) for a, z in bb.page.runs())
            expected_pages[name, b] = iv
            for a, z in iv:
                mask[a - base : z - base] = b"\x01" * (z - a)

    def harmful(name: str, block: int, extra: list) -> list:
        # Moving other layers' pages of the *same* block id along is fine (NIXL moves the
        # whole row of a block-outermost layout); bytes of any other block id are not.
        allowed = intervals.merge(iv for n in derivation.registered for iv in expected_pages[n, block])
        rest = intervals.subtract(intervals.merge(extra), allowed)
        return [(a, z) for a, z in rest if any(any(m[a - base : z - base]) for m in owned.values())]

    # derived facts, when the adapter exposes them
    kbs_expected = {f.kernel_tokens for f in facts.values() if not derivation.specs[f.name].__class__.__name__ == "MambaSpec"}
    kbs = getattr(adapter, "kernel_block_size", None)
    if callable(kbs):
        kbs = None
    if isinstance(kbs, int) and kbs_expected and kbs not in kbs_expected:
        some = next(f for f in facts.values() if f.kernel_tokens in kbs_expected)
        if kbs == some.heads and some.heads != some.kernel_tokens:
            why = (
                f"kernel_block_size {kbs} is shape[-3] of the registered view, which in 0.33.0's [B, H, N, C] view is "
                f"num_kv_heads ({some.heads}), not tokens: tokens per registered block are shape[2] ({some.kernel_tokens})"
            )
        elif kbs == some.logical_tokens:
            why = (
                f"kernel_block_size {kbs} is the logical block size; vLLM registered {some.kernel_tokens}-token kernel "
                f"blocks: use shape[2] (or shape[0] // num_blocks for the split ratio) of the registered view"
            )
        else:
            why = f"kernel_block_size {kbs} is not the {sorted(kbs_expected)} tokens per registered block (shape[2] of the views)"
        add("*", None, "kernel_block_size", sorted(kbs_expected), kbs, why)

    for name, f in facts.items():
        if hasattr(adapter, "block_len"):
            try:
                bl = int(adapter.block_len(name))
            except ADAPTER_ERRORS as exc:
                add(name, None, "block_len", f.kernel_page, f"{type(exc).__name__}: {exc}", f"block_len raised {type(exc).__name__}: {exc}")
            else:
                row_ok = layout_name.startswith("B") and bl == f.stride0  # the whole packed row
                if bl not in (f.kernel_page, f.kernel_content) and not row_ok:
                    if f.ratio > 1 and bl in (f.page, f.kernel_content * f.ratio):
                        why = (
                            f"block_len {bl} for layer {name} looks like the logical block ({f.logical_tokens} tokens); "
                            f"vLLM registered {f.kernel_tokens}-token kernel blocks: use shape[0]/stride[0] of the registered view"
                        )
                    elif f.heads != f.kernel_tokens and bl == f.kernel_content // f.kernel_tokens * f.heads:
                        why = (
                            f"block_len {bl} for layer {name} counts shape[-3] ({f.heads} = num_kv_heads) as tokens; "
                            f"a registered block holds shape[2] = {f.kernel_tokens} tokens: block_len is stride(0)*element_size for dense pages"
                        )
                    elif bl == f.stride0 and f.stride0 != f.kernel_page:
                        why = (
                            f"block_len {bl} for layer {name} is the block stride (stride(0)*element_size) of a "
                            f"block-outermost/packed layout; one layer's block is {f.kernel_page} bytes of that row"
                        )
                    else:
                        why = f"block_len {bl} for layer {name}: one registered block of this layer is {f.kernel_page} bytes"
                    add(name, None, "block_len", f.kernel_page, bl, why)
        if hasattr(adapter, "num_blocks"):
            try:
                nb = int(adapter.num_blocks(name))
            except ADAPTER_ERRORS as exc:
                nb = f"{type(exc).__name__}: {exc}"
            if nb != f.view.shape[0]:
                if nb == derivation.num_blocks and f.ratio > 1:
                    why = (
                        f"num_blocks {nb} is the logical count; the view of {name} has {f.view.shape[0]} "
                        f"{f.kernel_tokens}-token kernel blocks (shape[0]): register and address kernel blocks"
                    )
                else:
                    why = f"num_blocks {nb} for layer {name}: the registered view has shape[0] = {f.view.shape[0]} blocks"
                add(name, None, "num_blocks", f.view.shape[0], nb, why)

    checked = 0
    kv = hasattr(adapter, "kv_descriptors")
    moved = getattr(adapter, "transferred_layers", None)
    if moved is not None:  # by design the connector moves only some layers (e.g. only offloaded groups)
        facts = {n: f for n, f in facts.items() if n in moved}
    for name, f in facts.items():
        for b in range(derivation.num_blocks):
            checked += 1
            expected = expected_pages[name, b]
            try:
                if kv:
                    k_obs, v_obs = adapter.kv_descriptors(name, b)
                    k_obs, v_obs = _to_intervals(k_obs, "kv_descriptors"), _to_intervals(v_obs, "kv_descriptors")
                    observed = intervals.merge(k_obs + v_obs)
                else:
                    observed = _to_intervals(adapter.descriptors(name, b), "descriptors")
            except ADAPTER_ERRORS as exc:
                add(name, b, "descriptors", _show(expected, base), f"{type(exc).__name__}: {exc}",
                    f"descriptors({name!r}, {b}) raised {type(exc).__name__}: {exc}")
                continue
            outside = [(a, z) for a, z in observed if a < base or z > base + pool_nbytes]
            if outside:
                add(name, b, "descriptors", _show(expected, base), f"{intervals.total(outside)} bytes outside the pool",
                    f"descriptors leave the registered pool ({pool_nbytes} bytes at data_ptr of the shared storage): "
                    "addresses must be tensor.data_ptr() + offsets inside the view", "out_of_pool")
                continue
            missing = intervals.subtract(expected, observed)
            extra = intervals.subtract(observed, expected)
            # Extra bytes that belong to no layer's block (page padding) are harmless.
            extra = harmful(name, b, extra) if extra else extra
            if missing or extra:
                cause, why = _diagnose_descriptors(f, derivation.layout.name, b, expected, observed, "page")
                add(name, b, "descriptors", _show(expected, base), _show(observed, base), why, cause)
                continue
            if kv:
                bb = derivation.block_bytes(name, b)
                if bb.v is not None:
                    for side, obs, region in (("k", k_obs, bb.k), ("v", v_obs, bb.v)):
                        exp = intervals.merge((base + a, base + z) for a, z in region.runs())
                        if exp != obs:
                            cause, why = _diagnose_descriptors(f, derivation.layout.name, b, exp, obs, side,
                                                               derivation.kv_packing(name).value)
                            add(name, b, side, _show(exp, base), _show(obs, base), why, cause)
    if hasattr(adapter, "head_descriptors"):
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
                        add(name, b, "heads", _show(exp, base), f"{type(exc).__name__}: {exc}",
                            f"head_descriptors({name!r}, {b}, {h0}, {h1}) raised {type(exc).__name__}: {exc}")
                        continue
                    if obs != exp:
                        add(name, b, "heads", f"heads [{h0}, {h1}): " + _show(exp, base), _show(obs, base),
                            _diagnose_heads(f, derivation.layout.name, b, h0, h1, exp, obs))
    trip = check_round_trip(adapter, derivation, caches, *_round_trip_blocks(derivation.num_blocks), adapter_errors=ADAPTER_ERRORS)
    for finding in trip.findings:
        divs.append(Divergence(case.name, runner, finding.layer, trip.dst_block, f"round_trip:{finding.kind}",
                               f"block {trip.dst_block} holds block {trip.src_block}'s bytes, nothing else changes",
                               finding.message, f"round trip {trip.src_block} -> {trip.dst_block}: {finding.message}",
                               cause="out_of_pool" if finding.kind == "out_of_pool" else "round_trip"))
    status = "failure" if divs else "pass"
    detail = (f"layout {derivation.layout.name}, kernel blocks {derivation.kernel_block_sizes}, {checked} (layer, block) checked; "
              f"round trip {trip.status}" + (f" ({trip.detail})" if trip.status in ("skipped", "not_applicable") else ""))
    return finish(status, detail, checked, trip.status if trip.status in ("pass", "fail") else f"{trip.status}: {trip.detail}")


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

    label = _label(connector)
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
        for runner in runners:
            try:
                d = derive(case, runner)
            except StartupError as exc:
                report.results.append(CaseResult(case.name, runner, "skipped", f"vLLM refuses this configuration: {exc}"[:160]))
                break
            except NotModeledError as exc:
                report.results.append(CaseResult(case.name, runner, "skipped", f"not modeled: {exc}"[:160]))
                break
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
    import importlib.metadata as md

    from conformance.diff import Divergence as Known
    from conformance.expectations import case_facts, classify
    from suites.named_cases import CASES

    failures = {(r.case, r.runner): Known("connector_copy_plan", r.case, r.runner, f"{name}.{r.cause}", "the block's bytes", r.detail)
                for r in report.results if r.status == "failure"}
    if not failures:
        return
    try:
        version = md.version("vllm")
    except md.PackageNotFoundError:
        version = None
    facts = {case: case_facts(CASES[case]) for case, _ in failures if case in CASES}
    matched = {(m.divergence.case, m.divergence.runner): m.expectation.id
               for m in classify(failures.values(), {"vllm": version, "cases": facts}, expectations).expected}
    report.results = [dataclasses.replace(r, expected_by=matched.get((r.case, r.runner))) if r.status == "failure" else r
                      for r in report.results]


__all__ = ["STATUSES", "TENSOR_SOURCES", "CaseResult", "ConnectorReport", "Divergence", "build_kv_caches", "load_connector", "make_context", "validate_registration"]
