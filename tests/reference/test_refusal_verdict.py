"""A refusal conforms only when vLLM refuses for the predicted reason (``conformance.diff.compare``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from conformance.diff import compare, refusal_reason
from reference.derive import derive
from reference.errors import StartupError
from suites.named_cases import get_case

REFUSED = "flashinfer-b128-k64-lhbnc"


def _predicted() -> str:
    with pytest.raises(StartupError) as info:
        derive(get_case(REFUSED), "mrv1")
    return info.value.vllm_message


def _observed(error: str | None) -> SimpleNamespace:
    return SimpleNamespace(error=error, unsupported=None)


def test_a_refusal_for_another_reason_does_not_conform() -> None:
    result = compare(get_case(REFUSED), "mrv1", _observed("ValueError: totally unrelated failure"))
    assert result.status == "fail"
    (d,) = result.divergences
    assert (d.kind, d.field) == ("startup_error", "error reason")
    assert d.expected == _predicted() and d.observed == "ValueError: totally unrelated failure"


def test_a_refusal_for_the_predicted_reason_conforms() -> None:
    # vLLM's message names its own values after the opening words; those may differ.
    words = _predicted().split()
    observed = "ValueError: " + " ".join(words[:6] + ["(worded", "differently", "after", "that)"])
    assert compare(get_case(REFUSED), "mrv1", _observed(observed)).status == "pass"


def test_starting_where_a_refusal_is_predicted_does_not_conform() -> None:
    observation = SimpleNamespace(error=None, unsupported=None)
    result = compare(get_case(REFUSED), "mrv1", observation)
    assert [(d.kind, d.field, d.observed) for d in result.divergences] == [("startup_error", "error", "(starts)")]


def test_the_reason_is_the_opening_words() -> None:
    assert refusal_reason("No common block size for 96 (FLASHMLA: [64]).") == ("No", "common", "block", "size")
    assert refusal_reason("") == ()


def test_an_invalid_case_is_a_usage_error_not_a_verdict() -> None:
    """A case the reference cannot even read (here: an unknown backend) raises ConfigError
    from the comparator; the CLI turns it into exit 4 before anything runs."""
    from reference.config import CaseConfig, LayerConfig
    from reference.errors import ConfigError

    case = CaseConfig(name="typo", layers=(LayerConfig(name="l0", backend="FLASHINFERR"),))
    with pytest.raises(ConfigError, match="FLASHINFERR"):
        compare(case, "mrv1", _observed(None))
