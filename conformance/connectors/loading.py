"""What an adapter is handed for one case: the adapter itself (resolved from
``package.module:Name``, or built by its factory), its ``RegistrationContext``, and the
registered tensors (the reference's views carved from one pool, or vLLM's own, compared
with the reference's before the connector is judged on them).
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Mapping

from conformance.connectors.protocol import LayerInfo, RegistrationContext

_TORCH_DTYPES = ("bfloat16", "float16", "float32", "uint8", "int8", "float8_e4m3fn", "float8_e5m2")
"""The view dtypes ``build_kv_caches`` can carve (each has a torch equivalent)."""


# --- the adapter ---------------------------------------------------------------------------------


def load_connector(spec: str):
    """``"package.module:Name"`` -> the object it names."""
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"connector {spec!r} must look like package.module:Name")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def adapter_label(connector: Any) -> str:
    """``package.module:Name`` of an adapter, its class or factory (a string as it is)."""
    if isinstance(connector, str):
        return connector
    target = connector if (inspect.isclass(connector) or inspect.isfunction(connector)) else type(connector)
    return f"{target.__module__}:{target.__qualname__}"


def instantiate(connector: Any, ctx: RegistrationContext):
    """The adapter for one case: an instance as it is, else its factory called with ``ctx``
    (or with nothing, for a factory that takes no argument)."""
    if hasattr(connector, "register") and hasattr(connector, "descriptors") and not inspect.isclass(connector):
        return connector
    if not callable(connector):
        raise TypeError(f"{connector!r} is neither an adapter (register/descriptors) nor a factory")
    try:
        params = inspect.signature(connector).parameters
    except (TypeError, ValueError):
        params = {"ctx": None}
    return connector(ctx) if params else connector()


def make_context(derivation) -> RegistrationContext:
    """The ``RegistrationContext`` of a reference ``Derivation`` (without vLLM's configs)."""
    from reference.specs import AttentionSpec

    layers = {}
    group_of = {n: gid for gid, g in enumerate(derivation.groups) for n in g.layer_names}
    for name, view in derivation.registered.items():
        spec = derivation.specs[name]
        attn = isinstance(spec, AttentionSpec)
        layers[name] = LayerInfo(
            name=name,
            group_id=group_of.get(name, view.group_id),
            kind=spec.kind.value if attn else "mamba",
            block_size=spec.block_size,
            page_size_bytes=spec.page_size_bytes,
            num_kv_heads=spec.num_kv_heads if attn else 0,
            head_size=spec.head_size if attn else 0,
            head_size_v=spec.head_size_v if attn else 0,
            dtype=view.dtype,
            backend=derivation.layer_backends.get(name, ""),
            is_mla=attn and spec.kind.is_mla,
            is_mamba=not attn,
            is_draft=bool(getattr(spec, "is_draft", False)),
            kv_packing=derivation.kv_packing(name).value,
        )
    return RegistrationContext(
        case_name=derivation.case.name,
        runner=derivation.runner,
        layout=derivation.layout.name,
        block_size=derivation.cache_block_size,
        num_blocks=derivation.num_blocks,
        layers=layers,
        kernel_block_sizes=tuple(derivation.kernel_block_sizes),
        case=derivation.case,
    )


# --- the tensors ---------------------------------------------------------------------------------


def _require_torch():
    try:
        import torch
    except ImportError:  # pragma: no cover - exercised in the no-torch CI env
        raise ImportError("validate_registration needs torch (CPU is enough): pip install torch") from None
    return torch


def build_kv_caches(derivation) -> tuple[Any, dict[str, Any]]:
    """The pool and the ``kv_caches`` dict the target release hands ``register_kv_caches``,
    carved from one int8 pool exactly as the reference's ``TensorView``s say."""
    torch = _require_torch()
    views = derivation.registered
    nbytes = {v.storage_nbytes for v in views.values()}
    if len(nbytes) != 1:
        raise AssertionError(f"reference views disagree on the pool size: {sorted(nbytes)}")
    pool = torch.zeros(nbytes.pop(), dtype=torch.int8)
    caches: dict[str, Any] = {}
    for name, view in views.items():
        if view.dtype not in _TORCH_DTYPES:
            raise NotImplementedError(f"dtype {view.dtype} has no torch equivalent here")
        dt = getattr(torch, view.dtype)
        typed = pool.view(dt) if dt.itemsize != 1 or dt != torch.int8 else pool
        caches[name] = typed.as_strided(view.shape, view.stride, view.storage_offset)
    return pool, caches


def views_differ(derivation, kv_caches: Mapping[str, Any]) -> str | None:
    """Where vLLM's registered tensors differ from the reference's views (None: they agree)."""
    # The same layers, in whatever order vLLM registers them (an encoder-decoder model
    # interleaves its self- and cross-attention layers; the reference lists them by group):
    # the order is not part of the layout contract, and each connector sees vLLM's own.
    if set(kv_caches) != set(derivation.registered):
        return f"vLLM registered layers {sorted(kv_caches)}, the reference predicts {sorted(derivation.registered)}"
    for name, view in derivation.registered.items():
        t = kv_caches[name]
        got = (tuple(t.shape), tuple(t.stride()), t.storage_offset(), str(t.dtype).removeprefix("torch."), t.untyped_storage().nbytes())
        want = (tuple(view.shape), tuple(view.stride), view.storage_offset, view.dtype, view.storage_nbytes)
        if got != want:
            return f"{name}: vLLM registered (shape, stride, offset, dtype, pool bytes) {got}, the reference predicts {want}"
    storages = {t.untyped_storage().data_ptr() for t in kv_caches.values()}
    if len(storages) != 1:
        return f"vLLM registered {len(storages)} storages, the reference predicts one shared pool"
    return None


__all__ = ["adapter_label", "build_kv_caches", "instantiate", "load_connector", "make_context", "views_differ"]
