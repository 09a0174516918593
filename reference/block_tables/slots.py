"""Slot mappings: MRv1's ``ComputeSlotMappingKernel`` and MRv2's ``_compute_slot_mappings_kernel``."""

from __future__ import annotations

from typing import Mapping, Sequence

from reference.block_tables._common import (
    PAD_SLOT_ID,
    _cdiv,
    SlotMappingMode,
    _dcp,
    _int,
    _mode,
    _per_group,
    _query_start_loc,
)
from reference.errors import ConfigError


def slot_mapping_mrv1(
    block_rows: Sequence[Sequence[int]],
    block_size: int,
    query_start_loc: Sequence[int],
    positions: Sequence[int],
    max_num_batched_tokens: int,
    dcp_world_size: int = 1,
    dcp_rank: int = 0,
    interleave: int = 1,
    mode: SlotMappingMode | str = SlotMappingMode.TOKEN_TO_KV_SLOT,
    blocks_per_kv_block: int = 1,
) -> list[int] | None:
    """MRv1 slot mapping of one group (``BlockTable.compute_slot_mapping`` + its Triton kernel).

    ``block_rows[i]`` is the full row of batch position ``i``. Returns the whole
    ``max_num_batched_tokens`` buffer: real tokens get ``bt[req, vbi]*B + loff`` (or PAD on a
    non-local DCP rank) and ``[num_tokens, max_num_batched_tokens)`` is PAD.

    ``blocks_per_kv_block`` R > 1: the rows hold kernel block ids (vLLM before 0.32,
    ``BlockTable(kernel_block_size=B/R)``), and the kernel reads
    ``bt[req, vbi*R + loff//K]*K + loff%K`` with ``K = B/R``: the same slot wherever the
    row holds an expanded block id.

    ``mode="none"`` (Mamba groups) returns ``None``: vLLM returns before launching the
    kernel, so the buffer keeps whatever it held (see ``MRv1BlockTable.compute_slot_mapping``).
    """
    if _mode(mode) is SlotMappingMode.NONE:
        return None
    B = _int(block_size, "block size", minimum=1)
    R = _int(blocks_per_kv_block, "kernel blocks per block", minimum=1)
    if B % R:
        raise ConfigError(f"{R} kernel blocks per block do not divide block size {B}; expected a divisor of {B}")
    K = B // R
    W, r, I = _dcp(dcp_world_size, dcp_rank, interleave, B)
    qsl = _query_start_loc(query_start_loc)
    pos = [_int(p, "position", minimum=0) for p in positions]
    cap = _int(max_num_batched_tokens, "max_num_batched_tokens", minimum=0)
    num_reqs, num_tokens = len(qsl) - 1, len(pos)
    if qsl[-1] != num_tokens:
        # The kernel only pads from positions.shape[0]; a mismatch leaves tokens unwritten.
        raise ConfigError(
            f"query_start_loc ends at {qsl[-1]} but there are {num_tokens} positions; expected them equal"
        )
    if num_tokens > cap:
        raise ConfigError(f"{num_tokens} tokens exceed max_num_batched_tokens {cap}; expected at most {cap}")
    if len(block_rows) < num_reqs:
        raise ConfigError(f"{len(block_rows)} block table rows for {num_reqs} requests; expected one row per request")

    out = [PAD_SLOT_ID] * cap
    vbs = B * W  # a "virtual block" spans the B local tokens of every DCP rank
    for req in range(num_reqs):
        row = block_rows[req]
        for t in range(qsl[req], qsl[req + 1]):
            vbi, vbo = divmod(pos[t], vbs)
            if (vbo // I) % W != r:
                continue  # another DCP rank stores this token
            loff = (vbo // (W * I)) * I + vbo % I
            column = vbi * R + loff // K
            if column >= len(row):
                raise ConfigError(
                    f"position {pos[t]} of request {req} needs block column {column} but the row has "
                    f"{len(row)} columns; expected position < {len(row) * vbs // R}"
                )
            out[t] = _int(row[column], "block id", minimum=0) * K + loff % K
    return out


def slot_mappings_mrv2(
    block_tables: Sequence[Sequence[Sequence[int]]],
    block_sizes: Sequence[int],
    idx_mapping: Sequence[int],
    query_start_loc: Sequence[int],
    positions: Sequence[int],
    num_tokens_padded: int,
    max_num_batched_tokens: int,
    *,
    cp_size: int = 1,
    cp_rank: int = 0,
    cp_interleave: int = 1,
    slot_mapping_enabled: Sequence[bool] | None = None,
    dcp_sharded: Sequence[bool] | None = None,
    kernel_block_sizes: Sequence[int] | None = None,
) -> list[list[int]]:
    """MRv2 slot mappings, one list per group (``BlockTables.compute_slot_mappings``).

    ``block_tables[g][slot]`` is the persistent row of request-state slot ``slot``;
    ``idx_mapping[i]`` maps batch request ``i`` to its slot, ``-1`` for a dummy request
    (its tokens are PAD). Groups with ``slot_mapping_enabled`` False (circular-buffer,
    HiSparse) are all PAD (D4); groups with ``dcp_sharded`` False use the global position
    even under DCP. PAD starts at ``query_start_loc[num_reqs]``, the actual token count.
    ``kernel_block_sizes[g]`` K (vLLM before 0.32): the rows hold kernel block ids and a
    DCP-local position ``lp`` is read as ``row[lp // K]*K + lp % K`` (the same slot as
    ``row[lp // B]*B + lp % B`` over logical ids). Returns ``[g][:num_tokens_padded]``.
    """
    G = len(block_sizes)
    sizes = [_int(b, "block size", minimum=1) for b in block_sizes]
    kernels = [_int(k, "kernel block size", minimum=1) for k in _per_group(kernel_block_sizes, G, "kernel_block_sizes", None)
               ] if kernel_block_sizes is not None else list(sizes)
    if len(block_tables) != G:
        raise ConfigError(f"{len(block_tables)} block tables for {G} block sizes; expected one per group")
    enabled = [bool(e) for e in _per_group(slot_mapping_enabled, G, "slot_mapping_enabled", True)]
    sharded = [bool(s) for s in _per_group(dcp_sharded, G, "dcp_sharded", True)]
    W = _int(cp_size, "DCP world size", minimum=1)
    qsl = _query_start_loc(query_start_loc)
    num_reqs = len(qsl) - 1
    idx = [_int(i, "idx_mapping entry", minimum=-1) for i in idx_mapping]
    if len(idx) != num_reqs:
        raise ConfigError(
            f"idx_mapping has {len(idx)} entries but query_start_loc describes {num_reqs} requests; expected equal"
        )
    pos = [_int(p, "position", minimum=0) for p in positions]
    if len(pos) < qsl[-1]:
        raise ConfigError(f"{len(pos)} positions for {qsl[-1]} scheduled tokens; expected at least {qsl[-1]}")
    cap = _int(max_num_batched_tokens, "max_num_batched_tokens", minimum=0)
    padded = _int(num_tokens_padded, "num_tokens_padded", minimum=qsl[-1], maximum=cap)

    out: list[list[int]] = []
    for g in range(G):
        B, rows = sizes[g], block_tables[g]
        _, r, I = _dcp(W, cp_rank, cp_interleave, B if (sharded[g] and enabled[g]) else None)
        for req in idx:
            if req >= len(rows):
                raise ConfigError(
                    f"idx_mapping entry {req} is not a request-state slot of group {g}; "
                    f"expected -1 or a slot below {len(rows)}"
                )
        buf = [PAD_SLOT_ID] * cap
        for i, req in enumerate(idx):
            if req < 0 or not enabled[g]:
                continue  # the kernel masks the load and writes PAD
            row = rows[req]
            for t in range(qsl[i], qsl[i + 1]):
                p = pos[t]
                if W == 1 or not sharded[g]:
                    lp = p
                else:
                    vbi, vbo = divmod(p, B * W)
                    if (vbo // I) % W != r:
                        continue
                    lp = vbi * B + (vbo // (I * W)) * I + vbo % I
                K = kernels[g]
                bi = lp // K
                if bi >= len(row):
                    raise ConfigError(
                        f"position {p} of request slot {req} needs block column {bi} of group {g} but the "
                        f"row has {len(row)} columns; expected a position inside the row"
                    )
                buf[t] = _int(row[bi], "block id", minimum=0) * K + lp % K
        out.append(buf[:padded])
    return out


def cross_slot_mapping(
    kernel_rows: Sequence[Sequence[int]],
    kernel_block_size: int,
    batch: Sequence[tuple[str, Sequence[int]]],
    encoder_lens: Mapping[str, int],
) -> list[int]:
    """The slots a cross-attention group's encoder K/V are written to in one step
    (``CrossAttentionBuilder.build`` and ``_get_cross_slot_mapping``,
    ``model_executor/layers/attention/cross_attention.py``).

    Only a request with no computed tokens writes them (its first step: the cross K/V
    are computed once from the encoder output); each of its ``encoder_lens[req]`` tokens
    ``i`` goes to ``row[i // K] * K + i % K`` of its batch row of the kernel block table,
    requests in batch order. The decoder's positions play no part, nor does DCP.
    """
    K = _int(kernel_block_size, "kernel block size", minimum=1)
    out: list[int] = []
    for i, (req, positions) in enumerate(batch):
        if not positions or positions[0] != 0:
            continue  # its cross K/V were written at its first step
        n = encoder_lens.get(req)
        if n is None:
            raise ConfigError(f"request {req!r} has no encoder length; expected one for a cross-attention group")
        row = kernel_rows[i]
        if _cdiv(n, K) > len(row):
            raise ConfigError(f"request {req!r}'s {n} encoder tokens need {_cdiv(n, K)} kernel blocks but its row has "
                              f"{len(row)}; expected at most {len(row) * K} tokens")
        out += [_int(row[t // K], "block id", minimum=0) * K + t % K for t in range(n)]
    return out
