"""What the installed vLLM's attention backend classes say about their KV cache, read off
the classes themselves: ``get_kv_cache_shape`` (for one probe geometry), the stride order
under NHD and HND (``VLLM_KV_CACHE_LAYOUT``, with ``get_kv_cache_layout``'s cache cleared)
and ``get_supported_kernel_block_sizes``. Generation 1 (0.19 to 0.28) is where these
differ per backend and per release; ``tests/releases`` holds each release's facts against
the reference's (``reference.releases``), and ``python -m gpu_impl.vllm_cpu.backend_facts``
prints them as JSON (how the 0.19.1 / 0.20.0 differences there were found).

Nothing here predicts: a backend that cannot be loaded on this machine, or a method it
lacks, is reported as such.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from typing import Any

from gpu_impl.vllm_cpu.backends import size_repr

PROBE = {"num_blocks": 10, "block_size": 16, "num_kv_heads": 8, "head_size": 128, "mla_head_size": 576}
"""The geometry the shapes are asked for (MLA: one latent head of 576)."""


@dataclass(frozen=True)
class BackendFacts:
    """One backend class of the installed vLLM, as it answers."""

    name: str
    """The ``AttentionBackendEnum`` member."""
    shape: tuple[int, ...] | None
    """``get_kv_cache_shape(**PROBE)``; None when it raised (see ``problem``)."""
    stride_order: dict[str, tuple[int, ...] | None]
    """``get_kv_cache_stride_order()`` per layout; None where the backend has none
    (``NotImplementedError``/``AttributeError``: the runners fall back to the identity)."""
    kernel_block_sizes: tuple[str, ...] | None
    """``get_supported_kernel_block_sizes()``, each as ``backends.size_repr`` writes it
    (``"64"``, ``"MultipleOf(16)"``)."""
    problem: str | None = None
    """Why the class or a method could not be asked (e.g. a CUDA-only import)."""


def backend_facts(name: str, *, mla: bool) -> BackendFacts:
    """The facts of backend ``name`` (``mla``: probe with one latent head)."""
    from vllm.v1.attention.backends import utils as backend_utils
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    try:
        cls = AttentionBackendEnum[name].get_class()
    # AttributeError: a backend module that needs vLLM's compiled ops (vllm._C) at import.
    except (KeyError, ValueError, ImportError, AssertionError, RuntimeError, AttributeError) as exc:
        return BackendFacts(name, None, {}, None, problem=f"{type(exc).__name__}: {str(exc)[:160]}")
    heads, head_size = (1, PROBE["mla_head_size"]) if mla else (PROBE["num_kv_heads"], PROBE["head_size"])
    problem = None
    try:
        shape: tuple[int, ...] | None = tuple(cls.get_kv_cache_shape(PROBE["num_blocks"], PROBE["block_size"], heads, head_size))
    except (ValueError, AssertionError, NotImplementedError, TypeError) as exc:
        shape, problem = None, f"get_kv_cache_shape: {type(exc).__name__}: {exc}"
    orders: dict[str, tuple[int, ...] | None] = {}
    saved = os.environ.get("VLLM_KV_CACHE_LAYOUT")
    layout_of = getattr(backend_utils, "get_kv_cache_layout", None)
    try:
        for layout in ("NHD", "HND"):
            os.environ["VLLM_KV_CACHE_LAYOUT"] = layout
            if hasattr(layout_of, "cache_clear"):
                layout_of.cache_clear()
            try:
                orders[layout] = tuple(cls.get_kv_cache_stride_order())
            except (NotImplementedError, AttributeError):
                orders[layout] = None
    finally:
        os.environ.pop("VLLM_KV_CACHE_LAYOUT", None)
        if saved is not None:
            os.environ["VLLM_KV_CACHE_LAYOUT"] = saved
        if hasattr(layout_of, "cache_clear"):
            layout_of.cache_clear()
    try:
        kernel: tuple[str, ...] | None = tuple(str(size_repr(s)) for s in cls.get_supported_kernel_block_sizes())
    except (AttributeError, AssertionError, NotImplementedError) as exc:
        kernel = None
        problem = problem or f"get_supported_kernel_block_sizes: {type(exc).__name__}"
    return BackendFacts(name, shape, orders, kernel, problem)


def main() -> None:
    from gpu_impl.vllm_cpu import shims

    shims.prepare_env()
    import vllm
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    facts = [asdict(backend_facts(m.name, mla="MLA" in m.name)) for m in AttentionBackendEnum]
    print(json.dumps({"vllm": vllm.__version__, "probe": PROBE, "backends": facts}, indent=1))


if __name__ == "__main__":
    main()
