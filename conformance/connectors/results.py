"""What ``validate_registration`` reports: one ``CaseResult`` per connector x case x runner,
the ``ConnectorFinding``s that explain a failure, and the ``ConnectorReport`` gathering them
(text via ``format``, JSON via ``to_dict``: ``kvconform.connector-report/2``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

STATUSES = ("pass", "refusal", "failure", "unsupported", "skipped")
"""A case's status:

- ``pass``: every block's descriptors are its bytes and the round trip restores them;
- ``refusal``: the connector's own code raised at registration (the message and the line
  that raised are reported; not a failure by default);
- ``failure``: it accepted the layout and moves other bytes (each finding says which);
- ``unsupported``: the connector cannot be driven here for the case (why);
- ``skipped``: vLLM refuses the case, the reference does not model it, or vLLM registered
  other views than the reference predicts.
"""


@dataclass(frozen=True)
class ConnectorFinding:
    """One way the connector's registration disagrees with the reference (the report's
    ``divergences``; not the run comparator's ``conformance.diff.Divergence``)."""

    case: str
    """The case's name."""
    runner: str
    """``mrv1`` or ``mrv2``."""
    layer: str
    """The layer concerned (``*``: the whole connector)."""
    block: int | None
    """The logical block concerned (None: every block, a derived value)."""
    field: str
    """``descriptors``, ``k``, ``v``, ``heads``, ``block_len``, ``num_blocks``, ``kernel_block_size``,
    ``register`` or ``round_trip:<kind>`` (``conformance.connectors.roundtrip.Finding.kind``)."""
    expected: str
    """What the reference says, as shown in the report."""
    observed: str
    """What the connector did, as shown in the report."""
    message: str
    """One line telling the author what to fix."""
    blocks_affected: int = 1
    """Blocks with the same (layer, field) finding (the first one is shown)."""
    cause: str = "missing_bytes"
    """What the finding is put down to (one of ``conformance.connectors.diagnosis.CAUSES``)."""

    def line(self) -> str:
        where = f"{self.layer}" + (f" block {self.block}" if self.block is not None else "")
        more = f" (+{self.blocks_affected - 1} more blocks)" if self.blocks_affected > 1 else ""
        return f"{self.case} [{self.runner}] {where}: {self.field}{more}: {self.message}"


@dataclass(frozen=True)
class CaseResult:
    """One connector x case x runner."""

    case: str
    """The case's name."""
    runner: str
    """``mrv1`` or ``mrv2``."""
    status: str
    """One of ``STATUSES``."""
    detail: str = ""
    """For a refusal: the connector's message and the line that raised it."""
    config: str = ""
    """The case as JSON (``CaseConfig.to_json``)."""
    replay: str = ""
    """The command that checks this case alone (``conformance.replay.replay_command``)."""
    checked: int = 0
    """(layer, block) pairs compared."""
    round_trip: str = ""
    """``pass``, ``fail``, ``not_applicable`` or ``skipped`` (with why), empty if not reached."""
    tensors: str = ""
    """Where the registered tensors came from: ``vllm`` (the runner's own) or ``reference``."""
    connector: str = ""
    """The adapter's label (``package.module:Name``)."""
    cause: str = ""
    """For a failure: what it is put down to (``CAUSES``; the first byte-level finding's)."""
    expected_by: str | None = None
    """For a failure: the shipped expectation (``connector_copy_plan``, conformance/expectations.toml)
    that cites the upstream bug behind it; reported, but not failing the check."""


@dataclass
class ConnectorReport:
    """Every case result of one connector, and the findings behind its failures."""

    connector: str
    """The adapter's label."""
    results: list[CaseResult] = field(default_factory=list)
    """In the order the cases and runners were checked."""
    divergences: list[ConnectorFinding] = field(default_factory=list)
    """Every finding, of every failed case."""

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

    def for_case(self, case: str) -> list[ConnectorFinding]:
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


__all__ = ["STATUSES", "CaseResult", "ConnectorFinding", "ConnectorReport"]
