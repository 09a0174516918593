"""The data-level check: a written token read two ways must give the same, non-zero bytes.

1. Tensor indexing of the view vLLM registered with the KV connector (``[B_k, H, N_k, C]``,
   or ``[B_k, N_k, C]`` for an MLA layer's bound view): kernel block
   ``slot // N_k``, offset ``slot % N_k``, all heads, all of C; split into K and V
   the way vLLM's own cache-update code splits C (``split(head_size, dim=-1)`` for
   FlashAttention/FlashInfer; the whole latent for MLA).
2. The raw bytes of the pool (the view's ``untyped_storage``, as a flat uint8 tensor) at
   the byte runs the REFERENCE predicts for that (layer, logical block, token offset)
   (``gpu_impl.cuda.addresses.token_bytes``).

They must be identical, and non-zero (the pool is allocated with ``torch.zeros`` and
dummy weights give non-zero K/V, so zeros mean nothing was written there). Where the
layer is bound to a different view than the one registered (the kernel-block view of
``map_kv_caches_to_kernel_blocks``), that view is read too and must agree: it is what
the cache-update kernel writes through.

Works on any device (CPU in the tests, CUDA in the engine); results are plain dicts.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from gpu_impl.cuda.addresses import TokenBytes, layer_block_size, sample_slots, token_bytes

_HEX = 16
"""Bytes shown per side when a comparison fails."""


def storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """The whole allocation behind ``t`` as a flat uint8 tensor (no copy)."""
    storage = t.untyped_storage()
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage, 0, (storage.nbytes(),), (1,))


def read_runs(raw: torch.Tensor, runs: Sequence[tuple[int, int]]) -> torch.Tensor:
    """The bytes of ``runs`` (``[start, stop)`` offsets into ``raw``), concatenated, on CPU."""
    if not runs:
        return torch.empty(0, dtype=torch.uint8)
    hi = max(b for _, b in runs)
    if hi > raw.numel() or min(a for a, _ in runs) < 0:
        raise IndexError(f"byte runs reach {hi}, outside the {raw.numel()}-byte allocation")
    index = torch.cat([torch.arange(a, b, dtype=torch.long) for a, b in runs]).to(raw.device)
    return raw.index_select(0, index).cpu()


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A tensor's elements as their raw bytes (row-major), on CPU."""
    return t.contiguous().view(torch.uint8).reshape(-1).cpu()


def view_token(view: torch.Tensor, slot: int) -> tuple[torch.Tensor, tuple[int, int]]:
    """``view[slot // N_k, :, slot % N_k, :]`` (all heads of one token) and the index used.

    A 3-D view is an MLA layer's bound cache (``[B_k, N_k, C]``, the head dim squeezed).
    """
    if view.dim() == 3:
        view = view.unsqueeze(1)
    if view.dim() != 4:
        raise ValueError(f"expected a [B, H, N, C] view, got shape {tuple(view.shape)}")
    tokens = view.shape[2]
    kb, off = divmod(int(slot), tokens)
    if kb >= view.shape[0]:
        raise IndexError(f"slot {slot} is kernel block {kb}, outside the view's {view.shape[0]} blocks")
    return view[kb, :, off, :], (kb, off)


def split_kv(row: torch.Tensor, head_size: int | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """K and V of ``row`` ([H, C]) as vLLM splits them; ``head_size=None``: an MLA latent (no V)."""
    if head_size is None:
        return row, None
    return row[:, :head_size], row[:, head_size:]


def _hex(t: torch.Tensor) -> str:
    return bytes(t[:_HEX].tolist()).hex()


def check_token(
    registered: torch.Tensor,
    tb: TokenBytes,
    head_size: int | None,
    *,
    bound: torch.Tensor | None = None,
    raw: torch.Tensor | None = None,
) -> dict[str, Any]:
    """Compare one written token: registered-view indexing vs reference bytes (vs bound view)."""
    out: dict[str, Any] = {
        "slot": tb.slot,
        "block_id": tb.block_id,
        "offset": tb.offset,
        "kernel_block_id": tb.kernel_block_id,
        "kernel_offset": tb.kernel_offset,
    }
    row, index = view_token(registered, tb.slot)
    out["registered_index"] = list(index)
    reg_k, reg_v = split_kv(row, head_size)
    if raw is None:
        raw = storage_bytes(registered)
    ref_k = read_runs(raw, tb.k_runs)
    ref_v = read_runs(raw, tb.v_runs)
    tk = as_bytes(reg_k)
    out["k_nbytes"] = int(tk.numel())
    out["k_equal"] = bool(torch.equal(tk, ref_k))
    out["k_nonzero"] = bool(ref_k.any()) if ref_k.numel() else False
    problems: list[str] = []
    if not out["k_equal"]:
        problems.append(f"K: view {tk.numel()} B {_hex(tk)}.. != reference {ref_k.numel()} B {_hex(ref_k)}..")
    elif not out["k_nonzero"]:
        problems.append("K: all zero at the reference address (nothing written there)")
    if reg_v is None:
        out["v_equal"] = ref_v.numel() == 0
        out["v_nonzero"] = None
        if not out["v_equal"]:
            problems.append(f"V: the layer has no V but the reference predicts {ref_v.numel()} V bytes")
    else:
        tv = as_bytes(reg_v)
        out["v_nbytes"] = int(tv.numel())
        out["v_equal"] = bool(torch.equal(tv, ref_v))
        out["v_nonzero"] = bool(ref_v.any()) if ref_v.numel() else False
        if not out["v_equal"]:
            problems.append(f"V: view {tv.numel()} B {_hex(tv)}.. != reference {ref_v.numel()} B {_hex(ref_v)}..")
        elif not out["v_nonzero"]:
            problems.append("V: all zero at the reference address (nothing written there)")
    if bound is not None:
        same_storage = bound.untyped_storage().data_ptr() == registered.untyped_storage().data_ptr()
        out["bound_same_storage"] = bool(same_storage)
        brow, bindex = view_token(bound, tb.slot)
        out["bound_index"] = list(bindex)
        out["bound_equal"] = bool(same_storage and torch.equal(as_bytes(brow), as_bytes(row)))
        if not out["bound_equal"]:
            problems.append(
                "the layer's bound view (what the cache-update kernel writes through) holds other bytes "
                f"at [{bindex[0]}, :, {bindex[1]}] than the registered view at [{index[0]}, :, {index[1]}]"
                + ("" if same_storage else " (different allocations)")
            )
    out["ok"] = not problems
    if problems:
        out["problems"] = problems
    return out


def check_layer(
    d,
    layer: str,
    registered: torch.Tensor,
    slots: Sequence[int],
    head_size: int | None,
    *,
    bound: torch.Tensor | None = None,
    limit: int | None = 8,
    shift_bytes: int = 0,
) -> dict[str, Any]:
    """Check a sample of the slots one forward step wrote for ``layer`` (``d``: a Derivation).

    ``limit``: how many slots ``sample_slots`` picks; None checks every written slot.
    ``shift_bytes`` moves every reference address (a deliberately wrong prediction: the
    check must then fail). Never raises for a data problem: everything is in the result;
    ``ok`` is True only if at least one slot was checked and every check passed.
    """
    written = [int(s) for s in slots if int(s) >= 0]
    result: dict[str, Any] = {"layer": layer, "num_written": len(written), "head_size": head_size}
    if layer not in d.registered:
        result.update(ok=False, error=f"layer {layer!r} is not in the reference's registered views")
        return result
    ref_view = d.registered[layer]
    if limit is None:
        sample = sorted(set(written))
    else:
        sample = sample_slots(written, layer_block_size(d, layer), ref_view.kernel_block_size, limit)
    result["sampled"] = sample
    raw = storage_bytes(registered)
    checks = []
    for slot in sample:
        try:
            tb = token_bytes(d, layer, slot)
            if shift_bytes:
                tb = tb.shifted(shift_bytes)
            checks.append(check_token(registered, tb, head_size, bound=bound, raw=raw))
        except Exception as exc:  # noqa: BLE001 - one slot's failure is a result, not a crash
            checks.append({"slot": slot, "ok": False, "problems": [f"{type(exc).__name__}: {exc}"]})
    result["checks"] = checks
    result["failures"] = sum(not c["ok"] for c in checks)
    result["ok"] = bool(checks) and result["failures"] == 0
    if not checks:
        result["error"] = "no written slot in this step's slot mapping"
    return result


__all__ = ["as_bytes", "check_layer", "check_token", "read_runs", "split_kv", "storage_bytes", "view_token"]
