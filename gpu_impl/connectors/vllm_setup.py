"""The vLLM side every built-in adapter sets up before it builds its connector: the case's
``VllmConfig`` and ``KVCacheConfig`` (the runner's own, or planned by vLLM's own code), and
the connector's ``kv_transfer_config`` while its code runs.

Whatever is set is undone when the caller's ``ExitStack`` closes: one ``VllmConfig`` serves
every case of the process (``gpu_impl.vllm_cpu.planning.vllm_config_for``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Mapping

from gpu_impl.connectors.base import RegistrationContext


@dataclass(frozen=True)
class CasePlan:
    """What a connector is constructed with for one case and runner."""

    vllm_config: Any
    """The ``VllmConfig`` (the process's shared one, set to the case)."""
    kv_cache_config: Any
    """The ``KVCacheConfig`` the engine core hands the workers."""
    backends: Mapping[str, Any]
    """Layer name -> attention backend class."""
    layout_name: str
    """The resolved ``KVCacheLayout`` name."""
    specs: Mapping[str, Any] | None = None
    """Layer name -> ``KVCacheSpec`` (planned cases only: the runner's are in its config)."""

    def attention_backends_and_specs(self) -> tuple[list[Any], list[Any]]:
        """What ``get_current_attn_backends_and_specs`` answers: each distinct (backend,
        spec) pair of the attention layers, else every backend with no spec."""
        specs = self.specs or {}
        attention = [(self.backends[n], s) for n, s in specs.items() if hasattr(s, "num_kv_heads")]
        pairs = list(dict.fromkeys(attention))
        backends = [b for b, _ in pairs] or list(dict.fromkeys(self.backends.values()))
        return backends, [s for _, s in pairs] or [None] * len(backends)


def plan_case(case: Any, runner: str, stack: contextlib.ExitStack) -> CasePlan:
    """vLLM's own planning of ``case`` as ``runner``'s model loading would see it: the
    per-layer specs and backend classes, the layout ``resolve_kv_cache_layout`` picks, the
    global KV cache groups and the ``KVCacheConfig`` (``case.num_blocks`` blocks, else
    ``case.kv_cache_memory_bytes``). The case's config stays set until ``stack`` closes."""
    from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts, resolve_kv_cache_layout

    from gpu_impl.vllm_cpu import planning, planning_api

    vc = stack.enter_context(planning.vllm_config_for(case))
    specs, backends, _ = planning.specs_and_backends(case, runner, vc)
    distinct = list({cls.full_cls_name(): cls for cls in backends.values()}.values())
    supported = [layout.name for layout in get_supported_kv_cache_layouts(distinct)]
    layout = resolve_kv_cache_layout(vc, [supported], list(specs.values()))
    groups = planning_api.global_kv_cache_groups(vc, [specs])
    if case.num_blocks is not None:
        available = case.num_blocks * planning_api.pool_bytes_per_block(vc, groups)
    else:
        available = case.kv_cache_memory_bytes
    kcc = planning_api.kv_cache_config_from_groups(vc, groups, available)
    return CasePlan(vc, kcc, backends, layout.name, specs)


def case_plan(ctx: RegistrationContext, stack: contextlib.ExitStack) -> CasePlan:
    """The configs the runner registered the tensors with (``ctx.vllm``), else the case
    planned by ``plan_case`` (tensors carved from the reference's views)."""
    if ctx.vllm is not None:
        return CasePlan(ctx.vllm.vllm_config, ctx.vllm.kv_cache_config, ctx.vllm.backends, ctx.layout)
    return plan_case(ctx.case, ctx.runner, stack)


def set_until_exit(stack: contextlib.ExitStack, obj: Any, name: str, value: Any) -> None:
    """``obj.name = value`` until ``stack`` closes (then the value before)."""
    stack.callback(setattr, obj, name, getattr(obj, name))
    setattr(obj, name, value)


def use_transfer_config(stack: contextlib.ExitStack, vllm_config: Any, **fields: Any) -> None:
    """``vllm_config.kv_transfer_config = KVTransferConfig(**fields)`` until ``stack`` closes
    (``object.__setattr__``: past the config's assignment guard)."""
    from vllm.config import KVTransferConfig

    stack.callback(object.__setattr__, vllm_config, "kv_transfer_config", vllm_config.kv_transfer_config)
    object.__setattr__(vllm_config, "kv_transfer_config", KVTransferConfig(**fields))


__all__ = ["CasePlan", "case_plan", "plan_case", "set_until_exit", "use_transfer_config"]
