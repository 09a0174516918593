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
