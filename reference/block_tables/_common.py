"""Constants, argument checks and block-table widths shared by both runners' models."""

from __future__ import annotations

import enum
import math
import operator
from typing import Iterable, Sequence

from reference.errors import ConfigError


PAD_SLOT_ID = -1
"""``vllm/v1/attention/backends/utils.py::PAD_SLOT_ID``: the KV write kernels skip it."""
NULL_BLOCK_ID = 0
"""``vllm/v1/attention/backends/utils.py::NULL_BLOCK_ID``: the block manager's null block."""
DEFAULT_TOKEN_ALIGNMENT = 128
"""``KVCacheSpec.block_table_token_alignment`` for attention specs."""


# --------------------------------------------------------------------------- helpers


def _int(value: object, what: str, *, minimum: int | None = None, maximum: int | None = None) -> int:
    # operator.index accepts any integral type (e.g. a caller's numpy int) but not floats.
    if isinstance(value, bool):
        raise ConfigError(f"{what} {value!r} is a bool; expected an integer")
    try:
        v = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ConfigError(f"{what} {value!r} is not an integer; expected an integer") from None
    if minimum is not None and v < minimum:
        raise ConfigError(f"{what} {v} is below {minimum}; expected an integer >= {minimum}")
    if maximum is not None and v > maximum:
        raise ConfigError(f"{what} {v} is above {maximum}; expected an integer <= {maximum}")
    return v


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _block_ids(ids: Iterable[object], what: str) -> list[int]:
    if isinstance(ids, (str, bytes)):
        raise ConfigError(f"{what} {ids!r} is a string; expected a list of block ids")
    try:
        items = list(ids)
    except TypeError:
        raise ConfigError(f"{what} {ids!r} is not a sequence; expected a list of block ids") from None
    # Block ids index the KV pool, so they are never negative (0 is the null block).
    return [_int(b, f"block id in {what}", minimum=0) for b in items]


def _per_group(values: Sequence[object] | None, num_groups: int, what: str, default: object) -> list:
    if values is None:
        return [default] * num_groups
    values = list(values)
    if len(values) != num_groups:
        raise ConfigError(f"{what} has {len(values)} entries; expected one per group ({num_groups})")
    return values


def _query_start_loc(query_start_loc: Sequence[object]) -> list[int]:
    qsl = [_int(q, "query_start_loc entry", minimum=0) for q in query_start_loc]
    if not qsl:
        raise ConfigError("query_start_loc is empty; expected num_reqs + 1 entries starting at 0")
    if qsl[0] != 0:
        raise ConfigError(f"query_start_loc starts at {qsl[0]}; expected 0")
    for i in range(1, len(qsl)):
        if qsl[i] < qsl[i - 1]:
            raise ConfigError(
                f"query_start_loc {qsl} decreases at index {i} ({qsl[i - 1]} -> {qsl[i]}); "
                "expected a non-decreasing cumulative token count"
            )
    return qsl


def _dcp(world_size: object, rank: object, interleave: object, block_size: int | None) -> tuple[int, int, int]:
    w = _int(world_size, "DCP world size", minimum=1)
    r = _int(rank, "DCP rank", minimum=0, maximum=w - 1)
    i = _int(interleave, "cp_kv_cache_interleave_size", minimum=1)
    # vLLM's config requires block_size % interleave == 0 under context parallelism; without
    # it the local offset can reach B and a slot would spill into the next block. Groups
    # that never shard by DCP pass block_size=None.
    if w > 1 and block_size is not None and block_size % i != 0:
        raise ConfigError(
            f"cp_kv_cache_interleave_size {i} does not divide block size {block_size}; "
            "expected a divisor of the block size when DCP is on"
        )
    return w, r, i


# --------------------------------------------------------------------------- widths


def get_block_table_width(max_num_blocks: int, block_size: int, token_alignment: int | None = DEFAULT_TOKEN_ALIGNMENT) -> int:
    """Row length of a block table (``vllm/v1/worker/block_table.py::get_block_table_width``).

    Rounds ``max_num_blocks`` up so a row spans a multiple of ``token_alignment`` tokens;
    ``None`` (Mamba, circular-buffer and HiSparse specs) leaves it unaligned.
    """
    n = _int(max_num_blocks, "max_num_blocks", minimum=0)
    b = _int(block_size, "block size", minimum=1)
    if token_alignment is None:
        return n
    a = _int(token_alignment, "token_alignment", minimum=1)
    block_alignment = a // math.gcd(a, b)
    return _cdiv(n, block_alignment) * block_alignment


class SlotMappingMode(str, enum.Enum):
    """MRv1 ``SlotMappingMode`` (``vllm/v1/worker/block_table.py``): ``NONE`` iff Mamba."""

    TOKEN_TO_KV_SLOT = "token"
    NONE = "none"


def _mode(mode: object) -> SlotMappingMode:
    try:
        return SlotMappingMode(mode)
    except ValueError:
        raise ConfigError(f"slot mapping mode {mode!r} is unknown; expected 'token' or 'none'") from None
