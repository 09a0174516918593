"""What vLLM's own objects report about a KV cache config, for the contract
(``conformance.checks.contract``): each layer's spec page sizes and dtype, the kernel block
sizes its backend declares, and which storage each registered view lives in. Read off the
``KVCacheConfig``, the backends and the tensors the runner built, by both the generation-2
driver (``planning``) and the generation-1 one (``gen1``); nothing here computes a layout."""

from __future__ import annotations

from typing import Any, Iterator


def storage_numbers(registered) -> dict[str, int]:
    """Per layer, which storage its registered view lives in (numbered by first appearance)."""
    numbers: dict[int, int] = {}
    return {name: numbers.setdefault(t.untyped_storage()._cdata, len(numbers)) for name, t in registered.items()}


def layer_specs(kv_cache_config) -> Iterator[tuple[str, Any]]:
    """``(layer name, its own spec)`` for every layer of every group."""
    for group in kv_cache_config.kv_cache_groups:
        per_layer = getattr(group.kv_cache_spec, "kv_cache_specs", None)
        for name in group.layer_names:
            yield name, (per_layer.get(name, group.kv_cache_spec) if isinstance(per_layer, dict) else group.kv_cache_spec)


def spec_dtypes(kv_cache_config) -> dict[str, str]:
    """Per attention layer, its spec's dtype (Mamba specs hold a tuple of state dtypes: left out)."""
    import torch

    return {name: str(spec.dtype).removeprefix("torch.") for name, spec in layer_specs(kv_cache_config)
            if isinstance(getattr(spec, "dtype", None), torch.dtype)}


def supported_kernel_block_sizes(kv_cache_config, backends) -> dict[str, tuple[int | str, ...]]:
    """Per attention layer, the kernel block sizes its backend declares for its spec."""
    out: dict[str, tuple[int | str, ...]] = {}
    for name, spec in layer_specs(kv_cache_config):
        backend = backends.get(name)
        if backend is None or not hasattr(spec, "dtype"):
            continue
        try:
            declared = backend.get_supported_kernel_block_sizes(spec)
        except TypeError:  # releases whose method takes no spec
            declared = backend.get_supported_kernel_block_sizes()
        out[name] = tuple(s if isinstance(s, int) else f"*{getattr(s, 'base', 1)}" for s in declared)
    return out


def page_bytes(kv_cache_config) -> dict[str, tuple[int, int]]:
    """Per layer, its spec's ``(real_page_size_bytes, page_size_bytes)`` as vLLM reports them."""
    out: dict[str, tuple[int, int]] = {}
    for group in kv_cache_config.kv_cache_groups:
        per_layer = getattr(group.kv_cache_spec, "kv_cache_specs", None)
        for name in group.layer_names:
            spec = per_layer.get(name, group.kv_cache_spec) if isinstance(per_layer, dict) else group.kv_cache_spec
            padded = spec.page_size_bytes
            # The unpadded page: real_page_size_bytes, or before it (0.29's MambaSpec) the
            # state's own size, state_content_size_bytes; a spec with neither is not padded.
            real = getattr(spec, "real_page_size_bytes", None)
            if real is None:  # (a state spec: per-state shapes; an attention spec's is per token and head)
                real = getattr(spec, "state_content_size_bytes", padded) if hasattr(spec, "shapes") else padded
            out[name] = (real, padded)
    return out


def stride_alignments(kv_cache_config) -> dict[str, int] | None:
    """Per layer, the bytes its spec says a block stride must be a multiple of (``get_block_stride_alignment``,
    vLLM 0.32 on); None for a release whose specs declare none."""
    out: dict[str, int] = {}
    for name, spec in layer_specs(kv_cache_config):
        method = getattr(spec, "get_block_stride_alignment", None)
        if method is None:
            return None
        out[name] = int(method())
    return out


__all__ = ["layer_specs", "page_bytes", "spec_dtypes", "storage_numbers", "stride_alignments",
           "supported_kernel_block_sizes"]
