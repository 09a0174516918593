"""Kernel-block expansion: ``AttentionGroup.map_to_kernel_block_table`` and the slot invariant."""

from __future__ import annotations

from typing import Sequence

from reference.block_tables._common import _int
from reference.errors import ConfigError
from reference.kernel_blocks import expand_block_id


def expand_row(row: Sequence[int], num_valid: int, ratio: int, kernel_block_stride: int = 0) -> list[int]:
    """Kernel ids for the first ``num_valid`` columns of one row.

    Mirrors ``vllm/v1/worker/utils.py::AttentionGroup.map_to_kernel_block_table``: column
    ``c`` becomes ``row[c]*(stride or R) + j`` for ``j < R``, so the null block 0 expands
    to ``0..R-1``, not zeros. Compare runners only on this prefix (MRv2 tails are stale).
    """
    n = _int(num_valid, "num_valid", minimum=0, maximum=len(row))
    R = _int(ratio, "kernel blocks per block (ratio)", minimum=1)
    s = _int(kernel_block_stride, "kernel_block_stride", minimum=0)
    out: list[int] = []
    for b in row[:n]:
        out.extend(expand_block_id(_int(b, "block id", minimum=0), R, s))
    return out


def map_to_kernel_block_table(rows: Sequence[Sequence[int]], ratio: int, kernel_block_stride: int = 0) -> list[list[int]]:
    """``AttentionGroup.map_to_kernel_block_table`` on a whole table (every column)."""
    return [expand_row(r, len(r), ratio, kernel_block_stride) for r in rows]


def _kernel_sizes(block_size: int, kernel_block_size: int) -> tuple[int, int]:
    B = _int(block_size, "block size", minimum=1)
    K = _int(kernel_block_size, "kernel block size", minimum=1)
    if B % K:
        raise ConfigError(f"kernel block size {K} does not divide block size {B}; expected a divisor of {B}")
    return B, K


def kernel_slot(slot: int, block_size: int, kernel_block_size: int) -> tuple[int, int]:
    """``(kernel_block_id, offset)`` of a manager-unit slot in the kernel-unit view.

    The write kernels index the ``(NB*R, H, K, C)`` tensor with the unchanged slot
    (research note §1.5); this is the block/offset they land on when
    ``kernel_block_stride == 0``.
    """
    B, K = _kernel_sizes(block_size, kernel_block_size)
    s = _int(slot, "slot", minimum=0)  # PAD (-1) has no kernel block
    b, off = divmod(s, B)
    return b * (B // K) + off // K, off % K


def check_slot_invariant(block_id: int, offset: int, block_size: int, kernel_block_size: int) -> int:
    """Assert ``(b*R + off//K)*K + off%K == b*B + off`` and return the slot (note §1.5).

    Why kernel splitting never touches slot mappings in either runner. Raises
    ``AssertionError`` if the identity fails (it cannot for valid inputs).
    """
    B, K = _kernel_sizes(block_size, kernel_block_size)
    b = _int(block_id, "block id", minimum=0)
    off = _int(offset, "offset", minimum=0, maximum=B - 1)
    manager = b * B + off
    kb, koff = kernel_slot(manager, B, K)
    if kb != b * (B // K) + off // K or kb * K + koff != manager:
        raise AssertionError(f"slot invariant broken for block {b}, offset {off}, B={B}, K={K}")
    return manager
