"""Where the installed vLLM keeps its KV-cache planning entry points: the one place the
drivers learn them, so a moved module or a split function is a change here only.

Each place is a ``Location`` keyed by the release it starts at, like the reference's release
facts (``reference.releases``; the drivers may not import it). Which one is used is decided by
feature detection, not by the version, so an unreleased build works too. Every answer is
vLLM's own function's; where a release computes something only inside a larger function,
that function is run and the fact read off its result.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Location:
    """Where a release keeps a planning entry point, from ``since`` on."""

    since: str
    """The first release it is there in."""
    module: str
    """The module that holds it."""
    source: str
    """What it looks like there, and how the drivers recognise it."""


PLANNING_MODULES: tuple[Location, ...] = (
    Location("0.29.0", "vllm.v1.core.kv_cache_utils",
             "get_kv_cache_configs computes the global groups itself (merge, spec registry check, sliding-window "
             "retained tokens, get_kv_cache_groups) and takes no groups; _pool_bytes_per_block takes the groups "
             "only up to 0.31"),
    Location("0.33.0", "vllm.v1.core.kv_cache_planning",
             "get_global_kv_cache_groups, get_kv_cache_configs(..., global_kv_cache_groups), "
             "_pool_bytes_per_block(vllm_config, groups); recognised by the module importing"),
)
"""The planning module per release, oldest first."""

UNLIMITED_MEMORY = 1 << 50
"""Memory offered to a release's ``get_kv_cache_configs`` when only its groups are wanted."""


def planning_module() -> Any:
    """The module holding the planning functions of the installed vLLM: the newest of
    ``PLANNING_MODULES`` that imports (the oldest one's ImportError otherwise)."""
    for location in reversed(PLANNING_MODULES[1:]):
        try:
            return importlib.import_module(location.module)
        except ImportError:
            continue
    return importlib.import_module(PLANNING_MODULES[0].module)


def global_kv_cache_groups(vllm_config: Any, kv_cache_specs: list[dict[str, Any]]) -> list[Any]:
    """The engine core's KV cache groups over every worker's specs."""
    planning = planning_module()
    if hasattr(planning, "get_global_kv_cache_groups"):
        return planning.get_global_kv_cache_groups(vllm_config, kv_cache_specs)
    # Up to 0.32 (PLANNING_MODULES): computed inside get_kv_cache_configs; read off the
    # config it returns (the groups depend neither on the memory offered nor on a block-count override, which is
    # lifted so that its admission check passes).
    cache_config = vllm_config.cache_config
    saved, cache_config.num_gpu_blocks_override = cache_config.num_gpu_blocks_override, None
    try:
        configs = planning.get_kv_cache_configs(vllm_config, kv_cache_specs, [UNLIMITED_MEMORY] * len(kv_cache_specs))
    finally:
        cache_config.num_gpu_blocks_override = saved
    return list(configs[0].kv_cache_groups)


def kv_cache_configs(vllm_config: Any, kv_cache_specs: list[dict[str, Any]], available: list[int], groups: list[Any]) -> list[Any]:
    """``get_kv_cache_configs``: null block, admission check, ``num_gpu_blocks_override``."""
    planning = planning_module()
    if "global_kv_cache_groups" in inspect.signature(planning.get_kv_cache_configs).parameters:
        return planning.get_kv_cache_configs(vllm_config, kv_cache_specs, available, groups)
    return planning.get_kv_cache_configs(vllm_config, kv_cache_specs, available)


def pool_bytes_per_block(vllm_config: Any, groups: list[Any]) -> int:
    """Bytes per block of the pool (0.29 to 0.31 take the groups only)."""
    function = planning_module()._pool_bytes_per_block
    if len(inspect.signature(function).parameters) == 1:
        return function(groups)
    return function(vllm_config, groups)


def check_enough_kv_cache_memory(*args: Any) -> None:
    planning_module()._check_enough_kv_cache_memory(*args)


def kv_cache_config_from_groups(vllm_config: Any, groups: list[Any], available: int) -> Any:
    return planning_module().get_kv_cache_config_from_groups(vllm_config, groups, available)


__all__ = ["Location", "PLANNING_MODULES", "check_enough_kv_cache_memory", "global_kv_cache_groups", "kv_cache_config_from_groups", "kv_cache_configs",
           "planning_module", "pool_bytes_per_block"]
