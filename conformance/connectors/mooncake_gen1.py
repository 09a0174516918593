"""``kvconform check`` of vLLM's own Mooncake connector on a generation-1 release (0.19 to 0.28).

Per case and runner, ``gpu_impl.connectors.mooncake_gen1`` runs the release's runner
registration on real CPU tensors and then that release's ``MooncakeConnectorWorker``:
``register_kv_caches`` and its own transfer planning (``_build_transfer_params``) for each
logical block. ``reference.gen1`` is the judge: whether the worker must refuse
(``mooncake_refusal``: the pre-#39596 assert), the block size it must work in
(``mooncake_block_size``) and the bytes of every logical block (``block_bytes``).

- ``refusal``: the connector raised at registration (reported with the raising line, and
  whether the reference predicted it; not a failure by default);
- ``failure``: it accepted, but planned other bytes than the block's (each finding names
  the layer, block, bytes moved and bytes owned, and the cause), or accepted what the
  reference says it refuses; one a shipped ``connector_copy_plan`` expectation cites as an
  upstream bug is reported with its id and does not fail the check;
- ``pass``: every logical block's planned copies are exactly its bytes, within the tensors;
- ``unsupported``: the release or case cannot be driven here (why), or the runner itself
  refused the case (``kvconform run`` judges that).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from conformance.replay import replay_command
from reference import intervals

CONNECTOR = "gpu_impl.connectors.mooncake:MooncakeAdapter"
"""The built-in Mooncake adapter's name; on a generation-1 vLLM it is checked here."""
NIXL_CONNECTOR = "gpu_impl.connectors.nixl:NixlAdapter"
"""The built-in NIXL adapter's name; on a generation-1 vLLM, ``gpu_impl.connectors.nixl_gen1`` drives
the release's own ``NixlConnectorWorker`` and the same judge compares its transfer descriptors."""
CONNECTORS = {CONNECTOR: "mooncake", NIXL_CONNECTOR: "nixl"}
"""The built-in adapters checked on generation 1, by the short name their results carry."""
STATUSES = ("pass", "refusal", "failure", "unsupported")
MAX_FINDINGS = 6


@dataclass(frozen=True)
class Gen1ConnectorResult:
    """One connector x case x runner."""

    connector: str
    case: str
    runner: str
    status: str
    """One of ``STATUSES``."""
    detail: str
    findings: tuple[str, ...] = ()
    """Byte-level diagnosis, one line each (the first ``MAX_FINDINGS``)."""
    replay: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    expected_by: str | None = None
    """For a failure: the shipped expectation (conformance/expectations.toml, kind
    ``connector_copy_plan``) that cites the upstream bug behind it; such a failure is
    reported but does not fail the check."""


def _show(intervals: Sequence[tuple[int, int]]) -> str:
    return ", ".join(f"[{lo}, {hi})" for lo, hi in intervals[:3]) + (" ..." if len(intervals) > 3 else "")


def _cause(case: Any, obs: Any, block: int, got: Sequence[tuple[int, int]], owned: Sequence[tuple[int, int]]) -> str:
    """Which way a block's planned copies miss its bytes, in the terms of the layout."""
    ratio = case.block_size // obs.block_size if obs.block_size else 0
    missed, extra = intervals.total(intervals.subtract(owned, got)), intervals.total(intervals.subtract(got, owned))
    if ratio > 1 and len(got) == 1 and intervals.total(got) * ratio == intervals.total(owned):  # one kernel block's worth
        return (f"kernel blocks: the worker works in {obs.block_size}-token blocks ({ratio} per logical block) "
                f"but plans logical block {block} as one of them")
    if missed == 0 and extra:
        return (f"overlap: all of the block's bytes and {extra} bytes beyond it, which belong to its neighbour "
                f"(a copy longer than the {obs.block_size}-token block it starts at)")
    return f"the planned copies are not the block's bytes ({missed} of its bytes missed, {extra} others moved)"


def _nixl_block_size(d: Any) -> int | None:
    """The block size NIXL's worker works in: the kernel block size its ``__init__`` selects over the
    backends (``select_common_block_size``), when the groups agree on one."""
    sizes = set(d.selected_kernel_block_sizes)
    return sizes.pop() if len(sizes) == 1 and None not in sizes else None


def judge(case: Any, runner: str, obs: Any, connector: str = CONNECTOR) -> Gen1ConnectorResult:
    """The reference's verdict on one observed registration of ``connector`` (Mooncake's, or NIXL's:
    the transfer descriptors are judged alike, each worker's refusals by its own rule)."""
    from reference.errors import NotModeledError, StartupError
    from reference.gen1 import derive_gen1, merged_runs, mooncake_block_size, mooncake_refusal, nixl_refusal

    short = CONNECTORS[connector]

    def result(status: str, detail: str, findings: Sequence[str] = ()) -> Gen1ConnectorResult:
        return Gen1ConnectorResult(short, case.name, runner, status, detail, tuple(findings)[:MAX_FINDINGS],
                                   replay_command(case, connector=connector), case.to_dict())

    if obs.unsupported:
        return result("unsupported", obs.unsupported)
    try:
        d = derive_gen1(case, runner)
    except StartupError as exc:
        if obs.runner_error:
            return result("unsupported", f"vLLM refuses the case before any connector runs, as the reference predicts ({exc})")
        return result("failure", f"the reference predicts vLLM refuses the case ({exc}), but the runner registered")
    except NotModeledError as exc:
        return result("unsupported", f"reference.gen1 does not model this case: {exc}")
    if obs.runner_error:
        return result("failure", f"the runner refused ({obs.runner_error}) where the reference predicts it starts")
    predicted = mooncake_refusal(d) if short == "mooncake" else nixl_refusal(d)
    if obs.error:
        where = f" at {obs.error_line}" if obs.error_line else ""
        said = (f"predicted by the reference: {predicted}" if predicted
                else "NOT predicted by the reference, which finds nothing to refuse")
        return result("refusal", f"the worker raised {obs.error}{where}; {said}")
    if predicted:
        return result("failure", f"the reference predicts register_kv_caches refuses ({predicted}), but it accepted")
    findings: list[str] = []
    want_bs = mooncake_block_size(d) if short == "mooncake" else _nixl_block_size(d)
    if want_bs is not None and obs.block_size != want_bs:
        findings.append(f"worker.block_size is {obs.block_size}, the reference's {want_bs}")
    if obs.transfers is None:
        return result("unsupported", "; ".join(obs.notes) or "the worker's transfer planning was not driven", findings)
    tensors = {t.data_ptr: t for t in obs.layers}
    index = {t.name: d.tensor_index(t.name) for t in obs.layers}
    bases = d.tensor_bases
    for b, copies in sorted(obs.transfers.items()):
        moved: dict[int, list[tuple[int, int]]] = {}
        for addr, length in copies:
            owner = next((t for p, t in tensors.items() if p <= addr < p + t.nbytes), None)
            if owner is None:
                findings.append(f"block {b}: a copy of {length} bytes at {addr:#x} starts outside every registered tensor")
                continue
            if addr + length > owner.data_ptr + owner.nbytes:
                findings.append(f"block {b}: a copy in {owner.name} runs {addr + length - owner.data_ptr - owner.nbytes} bytes past its tensor")
            moved.setdefault(owner.data_ptr, []).append((addr - owner.data_ptr, addr - owner.data_ptr + length))
        for ptr, t in tensors.items():
            sharing = [u.name for u in obs.layers if u.data_ptr == ptr]
            shift = bases[index[t.name]]
            owned = intervals.merge((lo - shift, hi - shift) for name in sharing for lo, hi in merged_runs([d.block_bytes(name, b).page]))
            got = intervals.merge(moved.get(ptr, []))
            if got != owned:
                cause = _cause(case, obs, b, got, owned)
                findings.append(f"{t.name} block {b}: moves {_show(got)} where the block's bytes are {_show(owned)} ({cause})")
    if findings:
        return result("failure", f"{len(findings)} wrong copy plan(s) over {len(obs.transfers)} logical blocks", findings)
    return result("pass", f"every logical block's planned copies are exactly its bytes ({len(obs.transfers)} blocks, {len(obs.layers)} tensors)")


def _layer_of(result: Gen1ConnectorResult) -> str:
    first = result.findings[0] if result.findings else ""
    return first.split(" ", 1)[0] if first.startswith("model.") else "registration"


def known_failures(results: Sequence[Gen1ConnectorResult], cases: Sequence[Any], vllm_version: str,
                   expectations: Sequence[Any] | None = None) -> list[Gen1ConnectorResult]:
    """``results`` with each failure that a shipped ``connector_copy_plan`` expectation explains
    marked ``expected_by`` (one source of known divergences: conformance/expectations.toml)."""
    from conformance.diff import Divergence
    from conformance.expectations import case_facts, classify

    failures = {(r.case, r.runner): Divergence("connector_copy_plan", r.case, r.runner, f"{r.connector}.{_layer_of(r)}",
                                               "the block's bytes", r.detail)
                for r in results if r.status == "failure"}
    by_name = {c.name: c for c in cases}
    env = {"vllm": vllm_version, "cases": {name: case_facts(by_name[name]) for name, _ in failures if name in by_name}}
    matched = {(m.divergence.case, m.divergence.runner): m.expectation.id
               for m in classify(failures.values(), env, expectations).expected}
    return [dataclasses.replace(r, expected_by=matched.get((r.case, r.runner))) if r.status == "failure" else r
            for r in results]


def check(cases: Sequence[Any], runners: Sequence[str] = ("mrv1", "mrv2"), *, vllm_version: str,
          expectations: Sequence[Any] | None = None, connector: str = CONNECTOR) -> list[Gen1ConnectorResult]:
    if CONNECTORS[connector] == "nixl":
        from gpu_impl.connectors.nixl_gen1 import observe_registration
    else:
        from gpu_impl.connectors.mooncake_gen1 import observe_registration

    judged = [judge(case, runner, observe_registration(case, runner), connector) for case in cases for runner in runners]
    return known_failures(judged, cases, vllm_version, expectations)


def format_results(results: Sequence[Gen1ConnectorResult]) -> str:
    lines = []
    for r in results:
        known = f" (known upstream [{r.expected_by}])" if r.expected_by else ""
        lines.append(f"  {r.case:32} {r.runner}  {r.status:11} {r.detail}{known}")
        lines += [f"  {'':32}        - {f}" for f in r.findings]
        if r.status == "failure" and not r.expected_by:
            lines += [f"  {'':32}        config: {json.dumps(r.config, sort_keys=True, separators=(',', ':'))}",
                      f"  {'':32}        replay: {r.replay}"]
    counts = {s: sum(r.status == s for r in results) for s in STATUSES}
    known = sum(bool(r.expected_by) for r in results)
    lines.append("  " + ", ".join(f"{n} {s}" for s, n in counts.items() if n) + (f" ({known} failure(s) known upstream)" if known else ""))
    return "\n".join(lines)


def to_dict(results: Sequence[Gen1ConnectorResult], vllm_version: str) -> dict[str, Any]:
    return {"schema": "kvconform.connector-report/1", "vllm": vllm_version, "generation": 1,
            "counts": {s: sum(r.status == s for r in results) for s in STATUSES},
            "unexpected_failures": sum(r.status == "failure" and not r.expected_by for r in results),
            "results": [asdict(r) | {"findings": list(r.findings)} for r in results]}


__all__ = ["CONNECTOR", "CONNECTORS", "NIXL_CONNECTOR", "Gen1ConnectorResult", "check", "format_results", "judge", "known_failures", "to_dict"]
