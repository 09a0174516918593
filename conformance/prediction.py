"""What the reference predicts for one (case, runner): its derivation, vLLM's refusal, or nothing.

Shared by the comparator (``conformance.diff.compare``) and the schedule planner
(``conformance.schedules``), which both start from the same prediction.
"""

from __future__ import annotations

from reference.config import CaseConfig
from reference.derive import Derivation, derive
from reference.errors import NotModeledError, StartupError

from conformance.divergence import Comparison


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


__all__ = ["reference_prediction"]
