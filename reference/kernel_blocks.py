"""Kernel block size selection: which block size the attention kernels see per group.

Mirrors ``vllm/v1/worker/utils.py`` ``select_common_block_size``,
``_block_size_is_supported`` and ``prepare_kernel_block_sizes`` (the target release), and the
block size KV connectors derive for themselves (NIXL/Mooncake
``_sync_block_size_with_kernel``).
"""

from __future__ import annotations

from typing import Sequence

from reference.errors import StartupError
from reference.specs import KernelBlockSize, MultipleOf


def _accepts(sizes: Sequence[KernelBlockSize], block_size: int) -> bool:
    # An int entry is exact here; MultipleOf accepts multiples. (The platform-side
    # supports_block_size treats ints as "multiple of": a known double meaning.)
    for s in sizes:
        if isinstance(s, MultipleOf):
            if block_size % s.base == 0:
                return True
        elif block_size == s:
            return True
    return False


def format_sizes(sizes: Sequence[KernelBlockSize]) -> str:
    return ", ".join(f"multiples of {s.base}" if isinstance(s, MultipleOf) else str(s) for s in sizes)


def select_common_block_size(block_size: int, backends: Sequence[tuple[str, Sequence[KernelBlockSize]]]) -> int:
    """The largest kernel block size every backend supports that divides ``block_size``.

    ``backends`` is ``[(name, supported sizes)]``. Returns ``block_size`` itself if all
    accept it (no split). Only int entries propose smaller candidates.
    """
    if all(_accepts(sizes, block_size) for _, sizes in backends):
        return block_size
    candidates = sorted(
        {s for _, sizes in backends for s in sizes if isinstance(s, int) and block_size % s == 0},
        reverse=True,
    )
    for cand in candidates:
        if all(_accepts(sizes, cand) for _, sizes in backends):
            return cand
    detail = "; ".join(f"{name}: {format_sizes(sizes)}" for name, sizes in backends)
    raise StartupError(
        f"No common block size for {block_size} ({detail}).",
        where="vllm.v1.worker.utils.select_common_block_size",
    )


def expand_block_id(block_id: int, ratio: int, kernel_block_stride: int = 0) -> list[int]:
    """Kernel block ids of one logical block: ``b*R .. b*R+R-1`` (null block 0 -> 0..R-1)."""
    step = kernel_block_stride or ratio
    return [block_id * step + j for j in range(ratio)]


def align_hybrid_block_size(case) -> int:
    """The block size vLLM serves a hybrid (attention + state) case with.

    ``Platform._align_hybrid_block_size`` (run by ``update_block_size_for_backend``, which
    ``derive`` does not model: it takes the case's block size as final): the attention page
    must hold the largest state page, in multiples of the first attention backend's
    smallest kernel block (and of ``block_size``). Cases without state layers keep
    ``block_size``.
    """
    import math

    from reference.backends import get_backend
    from reference.dtypes import dtype_size, storage_dtype
    from reference.state_mixers import layer_state

    block_size = case.block_size
    attn = [layer for layer in case.layers if layer.kind != "mamba" and not layer.is_draft]
    states = [layer for layer in case.layers if layer.kind == "mamba"]
    if not states or not attn:
        return block_size
    first = attn[0]
    info = get_backend(first.backend)
    size = dtype_size(storage_dtype(first.cache_dtype, case.model_dtype))
    per_token = (1 if info.is_mla else first.num_kv_heads) * (first.head_size + (0 if info.is_mla else first.head_size)) * size
    state_page = max(
        sum(math.prod(s) * dtype_size(d) for s, d in zip(*layer_state(case, layer))) for layer in states
    )
    smallest = min(s.base if isinstance(s, MultipleOf) else s for s in info.kernel_block_sizes)
    align = max(smallest, block_size)
    attn_block = align * -(-state_page // (align * per_token))
    attn_block = smallest * -(-attn_block // smallest)
    return max(block_size, attn_block)
