"""The comparator's entry point: the reference's prediction against an observation of vLLM.

The observation is any object with the attributes of ``gpu_impl.vllm_cpu.Observation``
(layout, groups, num_blocks, bytes_per_block, tensors, kernel_block_sizes, registered,
builder_kernel_block_sizes, cache_block_size, error, unsupported); the reference side is
a ``reference.derive.Derivation`` or the StartupError it predicts. ``compare`` judges one
runner against the reference, ``compare_runners`` MRv1 against MRv2; each family of checks
(``conformance.checks``) declares its kinds, listed here in report order (``KINDS``).
"""

from __future__ import annotations

from typing import Any, Iterable

from reference.config import CaseConfig

import dataclasses

from conformance.checks import block_tables, connectors, contract, engine, layout, runners, views
from conformance.checks.contract import CONTRACT_KINDS, contract_divergences
from conformance.checks.block_tables import compare_schedule, schedule_divergences
from conformance.checks.engine import UNCHECKED_LAYERS, judge_token_writes
from conformance.checks.runners import compare_runners
from conformance.divergence import RUNNER_PAIR, Collector, Comparison, Divergence, Kind
from conformance.prediction import reference_prediction
from conformance.schedules import SchedulePlan

STARTUP_KINDS = (
    Kind("startup_error",
         "one side refuses the configuration and the other does not, or both refuse for different "
         "reasons (field ``error reason``: the first words of vLLM's message differ from the "
         "reference's prediction)."),
)

FAMILIES: tuple[tuple[Kind, ...], ...] = (
    STARTUP_KINDS,
    layout.KINDS,
    views.KINDS,
    contract.KINDS,
    block_tables.KINDS,
    runners.KINDS,
    connectors.KINDS,
    engine.KINDS,
)
"""Every family's kinds, roughly in pipeline order (root causes before their views): the
order reports and the report schema list them in."""

KINDS = tuple(kind.name for family in FAMILIES for kind in family)
"""Every divergence kind (``KIND_MEANINGS`` says what each compares)."""
KIND_MEANINGS = {kind.name: kind.meaning for family in FAMILIES for kind in family}
"""What differs when a divergence has each kind."""
ENGINE_ONLY_KINDS = tuple(kind.name for kind in engine.KINDS)
SCHEDULE_ONLY_KINDS = tuple(kind.name for kind in block_tables.KINDS) + contract.SCHEDULE_KINDS
"""Kinds only request schedules through the runners' block tables can show (none with ``--schedules 0``)."""
"""Only observations of a running engine carry what these compare."""


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


BASES = ("facts", "drift", "contract")
"""What ``compare`` judges by (``reference.releases.Judgement.basis``): the contract and the
installed release's facts; the contract and the newest facts, whose divergences are drift; the
contract alone."""


def compare(case: CaseConfig, runner: str, observation: Any, schedules: SchedulePlan | None = None,
            *, basis: str = "facts") -> Comparison:
    """Diff one observation of vLLM against the contract and (unless ``basis`` is
    ``"contract"``) the reference's prediction for the same case and runner.

    ``schedules``: the request schedules the observation ran through the runner's block
    tables, judged step by step (kinds ``block_table`` / ``slot_mapping``). ``basis``
    (``BASES``): with ``"drift"`` every divergence from the facts is marked drift; with
    ``"contract"`` a refusal is ``refused`` (nothing predicts it) and no fact is consulted."""
    if basis not in BASES:
        raise ValueError(f"basis {basis!r} is not one of {', '.join(BASES)}")
    if getattr(observation, "unsupported", None):
        return Comparison(case, runner, "unsupported", detail=observation.unsupported)
    scenarios = () if schedules is None else schedules.scenarios
    if basis == "contract":
        held = contract_divergences(case, runner, observation, scenarios)
        error = getattr(observation, "error", None)
        if error is not None:
            return Comparison(case, runner, "refused", detail=error)
        return Comparison(case, runner, "fail" if held else "pass", tuple(held))
    # The facts first: reading the case raises ConfigError on bad input before anything is judged.
    by_facts = _compare_with_facts(case, runner, observation, schedules)
    held = contract_divergences(case, runner, observation, scenarios)
    found = by_facts.divergences
    if basis == "drift":
        found = tuple(dataclasses.replace(d, basis="drift") for d in found)
    everything = (*held, *found)
    status = by_facts.status
    if status in ("pass", "fail"):
        status = "fail" if everything else "pass"
    elif status == "not_modeled" and held:
        status = "fail"  # the contract still holds where the facts do not reach
    return dataclasses.replace(by_facts, status=status, divergences=everything)


def _compare_with_facts(case: CaseConfig, runner: str, observation: Any, schedules: SchedulePlan | None) -> Comparison:
    """The reference's prediction for the case against the observation."""
    expected, predicted_error, early = reference_prediction(case, runner)
    if early is not None:
        return early
    c = Collector(case.name, runner)
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
        layout.judge_gen1_layout(c, expected, observation)
        views.compare_views(c, expected.registered, observation.registered, mismatch=False)
        if schedules is not None:
            c.out += schedule_divergences(case, runner, schedules, observation)
        return Comparison(case, runner, "fail" if c.out else "pass", tuple(c.out))
    layout.judge_layout(c, case, expected, observation)
    views.judge_views(c, expected, observation)
    engine.judge_engine_run(c, case, expected, observation)
    if schedules is not None:
        c.out += schedule_divergences(case, runner, schedules, observation)
    return Comparison(case, runner, "fail" if c.out else "pass", tuple(c.out))


def kinds_of(divergences: Iterable[Divergence]) -> set[str]:
    """The set of kinds among ``divergences`` (for tests and summaries)."""
    return {d.kind for d in divergences}


__all__ = [
    "BASES",
    "CONTRACT_KINDS",
    "ENGINE_ONLY_KINDS",
    "FAMILIES",
    "SCHEDULE_ONLY_KINDS",
    "KINDS",
    "KIND_MEANINGS",
    "RUNNER_PAIR",
    "UNCHECKED_LAYERS",
    "Comparison",
    "Divergence",
    "compare",
    "compare_runners",
    "compare_schedule",
    "judge_token_writes",
    "kinds_of",
    "reference_prediction",
    "refusal_reason",
]
