"""Speculative draft steps at ``max_model_len`` (D15): MRv1 pads, MRv2 clamps."""

from __future__ import annotations

from dataclasses import dataclass

from reference.block_tables._common import _int


@dataclass(frozen=True)
class DraftStep:
    """Position, seq_len and whether the slot is PAD for the next draft token."""

    position: int
    seq_len: int
    pad_slot: bool


def draft_step_mrv1(position: int, seq_len: int, max_model_len: int) -> DraftStep:
    """MRv1 ``eagle_step_update_slot_mapping_and_metadata`` (``vllm/v1/spec_decode/utils.py``).

    Past the model length the slot is PAD and position/seq_len reset to 0/1 (D15).
    """
    p = _int(position, "position", minimum=0)
    s = _int(seq_len, "seq_len", minimum=0)
    L = _int(max_model_len, "max_model_len", minimum=1)
    if p + 1 >= L:
        return DraftStep(0, 1, True)
    return DraftStep(p + 1, s + 1, False)


def draft_step_mrv2(position: int, seq_len: int, max_model_len: int) -> DraftStep:
    """MRv2 draft decode step (``vllm/v1/worker/gpu/spec_decode/``): clamp, never PAD (D15).

    The clamped position re-uses (overwrites) the slot of ``max_model_len - 1``.
    """
    p = _int(position, "position", minimum=0)
    s = _int(seq_len, "seq_len", minimum=0)
    L = _int(max_model_len, "max_model_len", minimum=1)
    return DraftStep(min(p + 1, L - 1), min(s + 1, L), False)
