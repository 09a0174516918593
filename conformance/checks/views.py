"""View checks: the tensors ``register_kv_caches`` gets, and the storage layers compute with.

A registered view whose shape differs is reported once, as ``registered_shape``: strides of
differently shaped tensors cannot be compared axis by axis, so its stride is only compared
when the shapes agree.
"""

from __future__ import annotations

from typing import Any, Mapping

from conformance.divergence import Collector, Kind
from reference.views import state_views

KINDS = (
    Kind("registered_names", "which layers ``register_kv_caches`` gets."),
    Kind("registered_shape", "a registered view's shape."),
    Kind("registered_stride", "a registered view's element strides (compared when the shapes agree)."),
    Kind("registered_dtype", "a registered view's dtype."),
    Kind("registered_offset", "a registered view's storage offset (elements)."),
    Kind("registered_storage", "the size (bytes) of a registered view's storage."),
    Kind("state_view", "a state layer's bound state (``MambaBase.bind_kv_cache``): its shape, strides, dtype and "
                       "offset within the layer's registered page view."),
)


def _view_tuple(view: Any) -> tuple[tuple[int, ...], tuple[int, ...], str, int, int | None]:
    nbytes = getattr(view, "storage_nbytes", None)
    return tuple(view.shape), tuple(view.stride), view.dtype, view.storage_offset, nbytes


def compare_views(c: Collector, expected: Mapping[str, Any], observed: Mapping[str, Any], *, mismatch: bool) -> None:
    """Registered views: names, then per layer shape/stride/dtype/offset/storage size
    (all as ``mrv1_mrv2_mismatch`` when ``mismatch``: runner against runner)."""

    def kind(name: str) -> str:
        return "mrv1_mrv2_mismatch" if mismatch else name

    c.cmp(kind("registered_names"), "registered layers", sorted(expected), sorted(observed))
    for layer, view in expected.items():
        other = observed.get(layer)
        if other is None:
            continue
        e_shape, e_stride, e_dtype, e_offset, e_nbytes = _view_tuple(view)
        o_shape, o_stride, o_dtype, o_offset, o_nbytes = _view_tuple(other)
        if c.cmp(kind("registered_shape"), f"{layer}.shape", e_shape, o_shape):
            c.cmp(kind("registered_stride"), f"{layer}.stride", e_stride, o_stride)
        c.cmp(kind("registered_dtype"), f"{layer}.dtype", e_dtype, o_dtype)
        c.cmp(kind("registered_offset"), f"{layer}.storage_offset", e_offset, o_offset)
        if e_nbytes is not None and o_nbytes is not None:
            c.cmp(kind("registered_storage"), f"{layer}.storage_nbytes", e_nbytes, o_nbytes)


def judge_views(c: Collector, expected: Any, observation: Any) -> None:
    """The registered views against the reference's (what layers are bound to is the
    contract's: ``conformance.checks.contract``), and each state layer's bound states against the
    states the reference's spec slices from its page."""
    compare_views(c, expected.registered, observation.registered, mismatch=False)
    _judge_state_views(c, expected, observation)


def _judge_state_views(c: Collector, expected: Any, observation: Any) -> None:
    bound = getattr(observation, "bound_views", None) or {}
    specs = getattr(expected, "specs", None) or {}
    for layer, views in sorted(bound.items()):
        spec, page = specs.get(layer), expected.registered.get(layer)
        if page is None or getattr(spec, "shapes", None) is None or page.dtype != "int8" or len(page.shape) != 4:
            continue  # not a generation-2 state page view (attention layers: the contract's bound_view)
        predicted = state_views(page.shape[0], page.stride[0], page.storage_offset, spec.shapes, spec.dtypes)
        c.cmp("state_view", f"{layer}: bound states", len(predicted), len(views))
        for k, (want, view) in enumerate(zip(predicted, views)):
            got = (tuple(view.shape), tuple(view.stride), view.dtype, view.storage_offset)
            c.cmp("state_view", f"{layer}: bound state {k} (shape, stride, dtype, offset)", tuple(want), got)


__all__ = ["KINDS", "compare_views", "judge_views"]
