"""What the engine wrote for a token, and where vLLM's own views put it: observation only.

For a sample of the slots one forward step wrote into a layer, the worker records:

1. where the view vLLM registered with the KV connector (``[B_k, H, N_k, C]``) places the
   token: for every head, the pool byte runs of its K and its V (``C`` split the way
   vLLM's cache-update code splits it: ``split(head_size, dim=-1)``; the whole latent for
   MLA), computed from the view's own storage offset and strides;
2. whether those bytes are non-zero (the pool is allocated with ``torch.zeros`` and dummy
   weights give non-zero K/V, so zeros mean nothing was written there);
3. where the layer's bound view (what the cache-update kernel writes through, when it is
   not the registered tensor) places the same token, and whether it reads the same bytes.

Nothing here knows what the reference predicts: ``conformance.gpu_verdict`` compares
the recorded byte runs with ``reference.token_bytes``. Works on any device (CPU in the
tests, CUDA in the engine); results are plain dicts.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

Run = list[int]
"""``[start, stop)`` byte offsets into the allocation behind a view."""


def storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """The whole allocation behind ``t`` as a flat uint8 tensor (no copy)."""
    storage = t.untyped_storage()
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage, 0, (storage.nbytes(),), (1,))


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A tensor's elements as their raw bytes (row-major), on CPU."""
    return t.contiguous().view(torch.uint8).reshape(-1).cpu()


def _four_d(view: torch.Tensor) -> torch.Tensor:
    # A 3-D view is an MLA layer's bound cache ([B_k, N_k, C], the head dim squeezed).
    if view.dim() == 3:
        view = view.unsqueeze(1)
    if view.dim() != 4:
        raise ValueError(f"expected a [B, H, N, C] view, got shape {tuple(view.shape)}")
    return view


def view_index(view: torch.Tensor, slot: int) -> tuple[int, int]:
    """The ``[kernel block, token]`` a slot has in a kernel-block view (``N_k`` tokens each)."""
    view = _four_d(view)
    kb, off = divmod(int(slot), view.shape[2])
    if kb >= view.shape[0]:
        raise IndexError(f"slot {slot} is kernel block {kb}, outside the view's {view.shape[0]} blocks")
    return kb, off


def _runs(view: torch.Tensor, kb: int, head: int, off: int, lo: int, hi: int) -> list[Run]:
    """Byte runs of ``view[kb, head, off, lo:hi]`` in its allocation (merged when adjacent)."""
    es = view.element_size()
    s0, s1, s2, s3 = view.stride()
    base = view.storage_offset() + kb * s0 + head * s1 + off * s2
    if s3 == 1:
        return [[(base + lo) * es, (base + hi) * es]] if hi > lo else []
    runs: list[Run] = []
    for c in range(lo, hi):
        start = (base + c * s3) * es
        if runs and runs[-1][1] == start:
            runs[-1][1] = start + es
        else:
            runs.append([start, start + es])
    return runs


def token_runs(view: torch.Tensor, slot: int, head_size: int | None) -> dict[str, Any]:
    """Where ``view`` places one token: per head, the byte runs of K and of V."""
    view = _four_d(view)
    kb, off = view_index(view, slot)
    width = view.shape[3]
    k_hi = width if head_size is None else head_size
    heads = [
        {"head": h, "k": _runs(view, kb, h, off, 0, k_hi), "v": _runs(view, kb, h, off, k_hi, width)}
        for h in range(view.shape[1])
    ]
    return {"index": [kb, off], "heads": heads}


def _read(raw: torch.Tensor, runs: Sequence[Run]) -> torch.Tensor:
    if not runs:
        return torch.empty(0, dtype=torch.uint8)
    index = torch.cat([torch.arange(a, b, dtype=torch.long) for a, b in runs]).to(raw.device)
    return raw.index_select(0, index).cpu()


def observe_token(registered: torch.Tensor, slot: int, head_size: int | None, *, bound: torch.Tensor | None = None) -> dict[str, Any]:
    """One written token, as vLLM's registered (and bound) views place it."""
    placed = token_runs(registered, slot, head_size)
    raw = storage_bytes(registered)
    k = _read(raw, [r for h in placed["heads"] for r in h["k"]])
    v = _read(raw, [r for h in placed["heads"] for r in h["v"]])
    out: dict[str, Any] = {
        "slot": int(slot),
        "registered_index": placed["index"],
        "heads": placed["heads"],
        "k_nonzero": bool(k.any()) if k.numel() else False,
        "v_nonzero": None if head_size is None else (bool(v.any()) if v.numel() else False),
    }
    if bound is not None:
        same_storage = bound.untyped_storage().data_ptr() == registered.untyped_storage().data_ptr()
        out["bound_same_storage"] = bool(same_storage)
        through_bound = token_runs(bound, slot, head_size)
        out["bound_index"] = through_bound["index"]
        out["bound_heads"] = through_bound["heads"]
        kb, off = through_bound["index"]
        rb, ro = placed["index"]
        out["bound_equal"] = bool(
            same_storage and torch.equal(as_bytes(_four_d(bound)[kb, :, off, :]), as_bytes(_four_d(registered)[rb, :, ro, :]))
        )
    return out


def sample_slots(slots: Sequence[int], block_size: int, kernel_block_size: int, limit: int = 8) -> list[int]:
    """A few written slots that cover every kernel sub-block the batch touched.

    ``slots`` is a slot mapping (PAD = -1 entries are dropped). Picked, in order, until
    ``limit``: the first and last slot, then for each kernel sub-block index
    ``j = (slot % block_size) // kernel_block_size`` its first and last slot (so a
    128-token block split into 64-token kernel blocks is checked in both halves), then
    the slots at the end of a kernel block (offset ``kernel_block_size - 1``). Sorted,
    without duplicates; deterministic. Both sizes are vLLM's (the group's manager block
    size, the registered view's tokens per kernel block).
    """
    if limit <= 0:
        return []
    written = [int(s) for s in slots if int(s) >= 0]
    if not written:
        return []
    picked: dict[int, None] = {}

    def take(s: int) -> None:
        if len(picked) < limit:
            picked.setdefault(s, None)

    take(written[0])
    take(written[-1])
    by_sub: dict[int, list[int]] = {}
    for s in written:
        by_sub.setdefault((s % block_size) // kernel_block_size, []).append(s)
    for j in sorted(by_sub):
        take(by_sub[j][0])
        take(by_sub[j][-1])
    for s in written:
        if s % kernel_block_size == kernel_block_size - 1:
            take(s)
    return sorted(picked)


def observe_layer(
    layer: str,
    registered: torch.Tensor,
    slots: Sequence[int],
    head_size: int | None,
    block_size: int,
    *,
    bound: torch.Tensor | None = None,
    limit: int | None = 8,
) -> dict[str, Any]:
    """A sample of the slots one step wrote for ``layer``, as vLLM's views place them.

    ``block_size`` is the layer's manager block size (its KV cache group's, from vLLM's
    ``KVCacheConfig``); ``limit`` how many slots ``sample_slots`` picks (None: every
    written slot). Never raises for one slot's problem: it is recorded in its entry.
    """
    written = [int(s) for s in slots if int(s) >= 0]
    kernel_block_size = _four_d(registered).shape[2]
    sample = sorted(set(written)) if limit is None else sample_slots(written, block_size, kernel_block_size, limit)
    tokens = []
    for slot in sample:
        try:
            tokens.append(observe_token(registered, slot, head_size, bound=bound))
        except Exception as exc:  # noqa: BLE001 - one slot's failure is a result, not a crash
            tokens.append({"slot": slot, "error": f"{type(exc).__name__}: {exc}"})
    return {
        "layer": layer,
        "num_written": len(written),
        "head_size": head_size,
        "block_size": int(block_size),
        "kernel_block_size": int(kernel_block_size),
        "element_size": registered.element_size(),
        "sampled": sample,
        "tokens": tokens,
    }


__all__ = ["as_bytes", "observe_layer", "observe_token", "sample_slots", "storage_bytes", "token_runs", "view_index"]
