"""The comparator's vocabulary: a kind of divergence, one divergence, one (case, runner)'s outcome.

``conformance.diff`` (the entry point) and every family of checks (``conformance.checks``)
import these; none of them imports ``diff``, so the families never form an import loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from reference.config import CaseConfig

RUNNER_PAIR = "mrv1/mrv2"
"""The runner of a ``mrv1_mrv2_mismatch`` divergence."""

NOT_OBSERVED = object()
"""``getattr(observation, name, NOT_OBSERVED)``: the driver does not observe that fact at all
(``None`` is an observed value for some of them)."""


@dataclass(frozen=True)
class Divergence:
    """One way vLLM did something other than the reference predicts.

    For ``mrv1_mrv2_mismatch`` the runner is ``"mrv1/mrv2"``, ``expected`` is what MRv1
    showed and ``observed`` what MRv2 showed.
    """

    kind: str
    """One of ``conformance.diff.KINDS``."""
    case: str
    """The case's name."""
    runner: str
    """``mrv1``, ``mrv2`` or ``RUNNER_PAIR``."""
    field: str
    """What differs, precisely enough to find it (a layer, a step, a row)."""
    expected: Any
    """The reference's value (MRv1's for ``mrv1_mrv2_mismatch``)."""
    observed: Any
    """vLLM's value (MRv2's for ``mrv1_mrv2_mismatch``)."""
    basis: str = "facts"
    """What it breaks: ``contract`` (what every vLLM must satisfy, ``conformance.checks.contract``),
    ``facts`` (the reference's facts for the installed release) or ``drift`` (an unreleased or
    newer build differs from the newest facts the reference has: a regression, or a new fact)."""

    @property
    def message(self) -> str:
        """One line: case, runner, kind, field and both values."""
        if self.kind == "mrv1_mrv2_mismatch":
            text = f"{self.case} [{self.runner}] {self.kind}: {self.field}: MRv1 {self.expected!r} vs MRv2 {self.observed!r}"
        elif self.basis == "contract":
            text = f"{self.case} [{self.runner}] {self.kind}: {self.field} is {self.observed!r}, the contract requires {self.expected!r}"
        else:
            said = "the facts expect" if self.basis == "drift" else "reference expects"
            text = f"{self.case} [{self.runner}] {self.kind}: {self.field} is {self.observed!r}, {said} {self.expected!r}"
            if self.basis == "drift":
                text += " (drift)"
        # repr() escapes newlines in strings, but an object's own repr may not: keep one line.
        return " ".join(text.split())


@dataclass(frozen=True)
class Comparison:
    """The outcome of comparing one (case, runner)."""

    case: CaseConfig
    """The case compared."""
    runner: str
    """``mrv1`` or ``mrv2``."""
    status: str
    """``pass``, ``fail``, ``unsupported`` (vLLM side cannot run it), ``not_modeled``, or
    ``refused`` (vLLM refused the case where only the contract judges: no prediction holds
    the refusal to a reason)."""
    divergences: tuple[Divergence, ...] = ()
    """Every differing field, in the order the checks ran."""
    detail: str = ""
    """Why a case is unsupported or not modeled, or vLLM's refusal."""


class Collector:
    """Appends a Divergence for every differing field of one (case, runner)."""

    def __init__(self, case: str, runner: str, basis: str = "facts") -> None:
        self.case = case
        self.runner = runner
        self.basis = basis
        """Every divergence's ``basis``."""
        self.out: list[Divergence] = []

    def cmp(self, kind: str, field: str, expected: Any, observed: Any) -> bool:
        """Record a divergence if the values differ; True when they agree."""
        if expected != observed:
            self.out.append(Divergence(kind, self.case, self.runner, field, expected, observed, self.basis))
            return False
        return True


@dataclass(frozen=True)
class Kind:
    """A kind of divergence, declared by the family of checks that reports it."""

    name: str
    """The ``kind`` of a Divergence (report JSON, ``expectations.toml``)."""
    meaning: str
    """What differs when a divergence has this kind (one line)."""


def case_name(case: CaseConfig | str) -> str:
    """The name of a case given as a config or by name."""
    return case if isinstance(case, str) else case.name


def draft_layers(case: CaseConfig) -> set[str]:
    """The case's draft (Eagle/MTP) layers: the drafter builds their attention groups itself."""
    return {layer.name for layer in case.layers if layer.is_draft}


__all__ = ["NOT_OBSERVED", "RUNNER_PAIR", "Collector", "Comparison", "Divergence", "Kind", "case_name", "draft_layers"]
