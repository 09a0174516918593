"""What a real vLLM backend class declares, as plain data (for the backend-table diff).

``declared(backend, layer, block_size, capability)`` asks the real class (loaded by
``shims.backend_class`` with the capability faked) for its kernel block sizes and
layouts, runs the layer's own ``get_kv_cache_spec`` and the runner's
``customize_attention_spec`` on the result, and tries ``select_common_block_size``
for ``block_size`` with that one backend. Kernel-size entries are ints or the
string ``"MultipleOf(n)"`` (the repr the reference's ``MultipleOf`` uses too).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpu_impl.vllm_cpu import planning, shims


@dataclass(frozen=True)
class BackendFacts:
    backend: str
    capability: tuple[int, int]
    kernel_block_sizes: tuple[Any, ...]
    """``get_supported_kernel_block_sizes(customized spec)``."""
    kernel_block_sizes_no_spec: tuple[Any, ...]
    """``get_supported_kernel_block_sizes(None)``."""
    layouts: tuple[str, ...] | None
    """``supported_kv_cache_layouts()`` names, or None (any layout)."""
    num_heads: int
    state_content_bytes: int
    page_size_bytes: int
    block_stride_alignment: Any
    """``spec.block_stride_alignment`` after customization: None, int or "MultipleOf(n)"."""
    block_stride_alignment_bytes: int
    """``spec.get_block_stride_alignment()``."""
    common_block_size: int | str
    """``select_common_block_size(block_size, [backend], [spec])``, or the ValueError text."""


def size_repr(size: Any) -> Any:
    """An int stays an int; a ``MultipleOf`` (vLLM's or the reference's) -> "MultipleOf(n)"."""
    if isinstance(size, int):
        return size
    base = getattr(size, "base", None)
    if base is None:
        raise TypeError(f"unknown kernel block size entry {size!r}")
    return f"MultipleOf({base})"


def declared(backend: str, layer, block_size: int, capability: tuple[int, int], model_dtype: str = "bfloat16") -> BackendFacts:
    """Ask the real backend class about ``layer`` (a reference ``LayerConfig``) at ``block_size``.

    Raises ``shims.BackendUnavailable`` when the class cannot load on CPU.
    """
    from reference.config import CaseConfig
    from vllm.v1.worker.utils import customize_attention_spec, select_common_block_size

    cls = shims.backend_class(backend)
    case = CaseConfig(
        name=f"declared-{backend}",
        layers=(layer,),
        block_size=block_size,
        model_dtype=model_dtype,
        capability=tuple(capability),
        num_blocks=1,
    )
    with planning._configure(case) as vc:
        spec_cfg = planning._spec_config(vc, case, vc.model_config.dtype)
        spec = planning._raw_spec(layer, cls, spec_cfg, vc.model_config)
        spec = customize_attention_spec(cls, spec)
        sizes = tuple(size_repr(s) for s in cls.get_supported_kernel_block_sizes(spec))
        sizes_none = tuple(size_repr(s) for s in cls.get_supported_kernel_block_sizes(None))
        layouts = cls.supported_kv_cache_layouts()
        try:
            common: int | str = select_common_block_size(block_size, [cls], [spec])
        except ValueError as exc:
            common = str(exc)
        align = spec.block_stride_alignment
        return BackendFacts(
            backend=backend,
            capability=tuple(capability),
            kernel_block_sizes=sizes,
            kernel_block_sizes_no_spec=sizes_none,
            layouts=None if layouts is None else tuple(l.name for l in layouts),
            num_heads=spec.num_heads,
            state_content_bytes=spec.state_content_size_bytes,
            page_size_bytes=spec.page_size_bytes,
            block_stride_alignment=None if align is None else size_repr(align),
            block_stride_alignment_bytes=spec.get_block_stride_alignment(),
            common_block_size=common,
        )


__all__ = ["BackendFacts", "declared", "size_repr"]
