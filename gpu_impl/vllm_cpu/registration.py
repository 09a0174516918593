"""What a runner hands a KV connector, as the drivers observe it (both generations)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RegisteredKV:
    """What a runner hands a connector: the ``kv_caches`` it registered and the planning they came from."""

    vllm_config: Any
    """The case's ``VllmConfig`` (current while ``on_registered`` runs)."""
    kv_cache_config: Any
    """vLLM's ``KVCacheConfig`` for the case."""
    backends: dict[str, Any]
    """Layer name -> attention backend class."""
    kernel_block_sizes: list[int] | None
    """What ``prepare_kernel_block_sizes`` returned, per group (None: the runner asks for none)."""
    kv_caches: dict[str, Any]
    """Layer name -> the registered tensor, in the case's layer order."""


__all__ = ["RegisteredKV"]
