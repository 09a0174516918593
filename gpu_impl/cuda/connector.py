"""The GPU path's KV connector: records like ``RecordingConnector`` and observes written data.

Loaded by the engine through ``KVTransferConfig(kv_connector="CheckingConnector",
kv_connector_module_path="gpu_impl.cuda.connector")``. Everything the recording
connector records (``gpu_impl/engine/recording_connector.py``: the tensors
``register_kv_caches`` got, the engine's ``KVCacheConfig``, backends, block ids) is kept;
the worker side adds a data-level check in ``save_kv_layer``, which vLLM calls when an
attention layer's op returns (``maybe_transfer_kv_layer``), i.e. after that layer's
cache update for the step:

- the step's slot mapping for the layer (``forward_context.slot_mapping[layer]``, the
  one the cache-update op got; the attention metadata's ``slot_mapping`` as fallback);
- for a sample of written slots, ``gpu_impl.cuda.datacheck.observe_layer``: where the
  registered view (and the layer's bound view) places each token's K and V in the pool,
  and whether those bytes were written. ``conformance.gpu_verdict`` compares that with
  the reference afterwards; nothing here knows the reference's prediction.

``kv_connector_extra_config`` keys (besides the recorder's ``record_dir``/``record_tag``):
``check_case_name``, ``check_runner`` ("mrv1"/"mrv2"), ``check_calls`` (observed calls
per layer, default 3), ``check_slots`` (slots per call, default 8). Nothing here may
raise into the engine: every failure is recorded.
"""

from __future__ import annotations

import time
import traceback
from typing import Any

import torch

from gpu_impl.engine.recording_connector import RecordingConnector

DEFAULT_CHECK_CALLS = 3
DEFAULT_CHECK_SLOTS = 8
_MAX_ERRORS = 50


class CheckingConnector(RecordingConnector):
    """RecordingConnector + where vLLM's views place written K/V, for a data-level check."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None):
        super().__init__(vllm_config, role, kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        self._check_case_name = extra.get("check_case_name")
        self._check_runner = extra.get("check_runner") or "mrv1"
        self._check_calls = int(extra.get("check_calls", DEFAULT_CHECK_CALLS))
        self._check_slots = int(extra.get("check_slots", DEFAULT_CHECK_SLOTS))
        self._kv: dict[str, torch.Tensor] = {}
        self._calls: dict[str, int] = {}
        self._block_sizes = _manager_block_sizes(kv_cache_config)
        if "registered" in self._record:  # worker role (the recorder's own split)
            self._record.update(
                data_checks=[],
                data_check_errors=[],
                check_runner=self._check_runner,
                check_case_name=self._check_case_name,
            )
            try:
                self._record["use_v2_model_runner"] = bool(vllm_config.use_v2_model_runner)
            except Exception as exc:  # noqa: BLE001 - a stand-in config in tests
                self._record["use_v2_model_runner"] = f"? ({type(exc).__name__})"
            self._flush()

    # --- helpers --------------------------------------------------------------------------
    def _error(self, where: str, exc: BaseException) -> None:
        errors = self._record.setdefault("data_check_errors", [])
        if len(errors) < _MAX_ERRORS:
            errors.append({"where": where, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]})

    def _layer_object(self, layer_name: str) -> Any:
        try:
            from vllm.forward_context import get_forward_context, is_forward_context_available

            if is_forward_context_available():
                layer = get_forward_context().no_compile_layers.get(layer_name)
                if layer is not None:
                    return layer
        except Exception:  # noqa: BLE001
            pass
        try:
            return self._vllm_config.compilation_config.static_forward_context.get(layer_name)
        except Exception:  # noqa: BLE001
            return None

    def _head_size(self, layer_name: str) -> tuple[int | None, str]:
        """Where C splits into K and V, as vLLM's cache update splits it (None: MLA latent)."""
        layer = self._layer_object(layer_name)
        if layer is not None:
            if hasattr(layer, "kv_lora_rank"):
                return None, "layer (MLA)"
            if getattr(layer, "head_size", None) is not None:
                return int(layer.head_size), "layer"
        raise LookupError(f"no attention layer object for {layer_name!r}")

    @staticmethod
    def _slot_mapping(layer_name: str, attn_metadata: Any) -> tuple[torch.Tensor | None, str | None]:
        try:
            from vllm.forward_context import get_forward_context, is_forward_context_available

            if is_forward_context_available():
                mapping = get_forward_context().slot_mapping
                if isinstance(mapping, dict) and isinstance(mapping.get(layer_name), torch.Tensor):
                    return mapping[layer_name], "forward_context"
        except Exception:  # noqa: BLE001
            pass
        t = getattr(attn_metadata, "slot_mapping", None)
        if isinstance(t, torch.Tensor):
            return t, "attn_metadata"
        return None, None

    # --- worker side ----------------------------------------------------------------------
    def _probe_kv_placement(self, kv_caches: dict[str, torch.Tensor]) -> dict[str, Any]:
        """The recorder's probe, on CPU caches only.

        It feeds ``impl.do_kv_cache_update`` K/V/slot tensors made on the CPU; handed a
        CUDA cache, a cache-write kernel could dereference host pointers and poison the
        CUDA context for the rest of the run. On a GPU, ``save_kv_layer``'s data check
        covers where the kernels put K and V.
        """
        if any(t.device.type != "cpu" for t in kv_caches.values()):
            reason = "skipped on a GPU: the probe's K/V tensors are built on the CPU"
            return {name: {"skipped": reason} for name in kv_caches}
        probe = getattr(super(), "_probe_kv_placement", None)
        return probe(kv_caches) if probe is not None else {}

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        super().register_kv_caches(kv_caches)
        self._kv = dict(kv_caches)
        drafts = []
        for name in kv_caches:
            layer = self._layer_object(name)
            if getattr(layer, "is_draft_layer", False):
                drafts.append(name)
        self._record["draft_layers_at_register"] = drafts
        self._flush()

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        super().save_kv_layer(layer_name, kv_layer, attn_metadata, **kwargs)
        calls = self._calls.get(layer_name, 0)
        if calls >= self._check_calls:
            return
        try:
            self._check(layer_name, kv_layer, attn_metadata, calls)
        except Exception as exc:  # noqa: BLE001 - never break the engine's forward pass
            self._calls[layer_name] = calls + 1
            self._error(f"save_kv_layer({layer_name})", exc)
        self._flush()

    def _check(self, layer_name: str, kv_layer: Any, attn_metadata: Any, calls: int) -> None:
        from gpu_impl.cuda.datacheck import observe_layer

        slots_t, source = self._slot_mapping(layer_name, attn_metadata)
        if slots_t is None:
            raise LookupError(f"no slot mapping for {layer_name!r} in the forward context or attention metadata")
        slots = [int(s) for s in slots_t.detach().reshape(-1).cpu().tolist()]
        if not any(s >= 0 for s in slots):
            return  # a padded/dummy step: nothing written, not counted
        self._calls[layer_name] = calls + 1
        registered = self._kv.get(layer_name)
        if registered is None:
            raise LookupError(f"{layer_name!r} was never registered (register_kv_caches got {sorted(self._kv)})")
        block_size = self._block_sizes.get(layer_name)
        if block_size is None:
            raise LookupError(f"{layer_name!r} is in no KV cache group of the engine's KVCacheConfig")
        if isinstance(kv_layer, (list, tuple)):
            kv_layer = kv_layer[0] if kv_layer else None
        bound = kv_layer if isinstance(kv_layer, torch.Tensor) and kv_layer.numel() else None
        head_size, head_source = self._head_size(layer_name)
        t0 = time.monotonic()
        result = observe_layer(layer_name, registered, slots, head_size, block_size, bound=bound, limit=self._check_slots)
        result.update(
            call=calls,
            slot_mapping_source=source,
            head_size_source=head_source,
            is_draft_layer=bool(getattr(self._layer_object(layer_name), "is_draft_layer", False)),
            bound_shape=list(bound.shape) if bound is not None else None,
            bound_stride=list(bound.stride()) if bound is not None else None,
            check_s=round(time.monotonic() - t0, 4),
        )
        self._record["data_checks"].append(result)


def _manager_block_sizes(kv_cache_config: Any) -> dict[str, int]:
    """Per layer, its KV cache group's (manager) block size, from vLLM's ``KVCacheConfig``."""
    sizes: dict[str, int] = {}
    for group in getattr(kv_cache_config, "kv_cache_groups", None) or []:
        for name in group.layer_names:
            sizes[name] = int(group.kv_cache_spec.block_size)
    return sizes


__all__ = ["CheckingConnector", "DEFAULT_CHECK_CALLS", "DEFAULT_CHECK_SLOTS"]
