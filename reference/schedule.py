"""The schedule description: plain-JSON request schedules over KV cache groups.

A *scenario* is input, like a ``CaseConfig``: KV cache groups, DCP world/rank/interleave
and steps of scheduler decisions (add / append / remove / preempt / move / swap
requests with their logical block ids, per-step batches and padding). The drivers
(``gpu_impl.vllm_cpu.block_tables``) run it through vLLM's block tables; the reference
(``reference.block_tables.scenarios``) predicts what they hold. This module only
describes and validates the input (``normalize_scenario`` fills every default so both
sides read the same explicit data) and derives the token layout of a step; it
predicts nothing. Pure Python.
"""

from __future__ import annotations

import copy
from typing import Any, Mapping

Scenario = dict[str, Any]

# Per group kind, what the runners derive from the KV cache spec (research note §2.1/2.2):
# MRv1 SlotMappingMode is NONE iff Mamba; MRv2 slot_mapping_enabled is
# spec.uses_slot_mapping (False only for CircularBufferSpec/HiSparse; Mamba inherits True);
# block_table_token_alignment is None for Mamba and circular-buffer specs; dcp_sharded is
# True for AttentionSpec and False for the base KVCacheSpec (Mamba).
GROUP_KINDS: dict[str, dict[str, Any]] = {
    "attention": {"mrv1_slot_mapping": "token", "mrv2_slot_mapping": True, "token_alignment": 128, "dcp_sharded": True},
    "mamba": {"mrv1_slot_mapping": "none", "mrv2_slot_mapping": True, "token_alignment": None, "dcp_sharded": False},
    "circular": {"mrv1_slot_mapping": "token", "mrv2_slot_mapping": False, "token_alignment": None,
                 "dcp_sharded": True},
}

OP_ARITY = {"add": 3, "append": 3, "remove": 2, "preempt": 2, "move": 3, "swap": 3}


class ScenarioError(ValueError):
    """A scenario the driver cannot run (malformed, or an MRv1 batch that is not dense)."""


# --------------------------------------------------------------------------- scenarios


def normalize_scenario(scenario: Mapping[str, Any]) -> Scenario:
    """Fill every default so both the driver and a reference see the same explicit data.

    Shape::

        {"name": str, "max_num_reqs": int, "max_num_batched_tokens": int,
         "dcp": [world_size, rank, interleave],                       # default [1, 0, 1]
         "groups": [{"kind": "attention"|"mamba"|"circular", "block_size": B,
                     "max_num_blocks": n,            # before get_block_table_width
                     "kernel_block_size": K|None, "kernel_block_stride": 0,
                     "sliding_window_reach": 0,      # MRv2 gather nulling (D8)
                     # overridable kind defaults: mrv1_slot_mapping ("token"|"none"),
                     # mrv2_slot_mapping (bool), token_alignment (MRv2 width), dcp_sharded
                     }, ...],
         "steps": [{"ops": [["add", req, [[ids] per group]], ["append", req, [[ids]...]],
                            ["remove", req], ["preempt", req], ["move", src, dst],
                            ["swap", a, b]],
                    "batch": [[req, [positions]], ...],  # MRv1 rows 0..n-1 in order
                    "num_reqs_padded": int,              # default len(batch)
                    "dummy_tokens": [int, ...],          # MRv2 idx_mapping=-1 requests
                    "num_tokens_padded": int}, ...]}     # default all tokens
    """
    if not isinstance(scenario, Mapping):
        raise ScenarioError(f"scenario {scenario!r} is not a JSON object")
    sc = copy.deepcopy(dict(scenario))
    sc.setdefault("name", "scenario")
    for key in ("max_num_reqs", "max_num_batched_tokens", "groups", "steps"):
        if key not in sc:
            raise ScenarioError(f"scenario {sc['name']!r} has no {key!r}")
    sc["dcp"] = list(sc.get("dcp", [1, 0, 1]))
    if len(sc["dcp"]) != 3:
        raise ScenarioError(f"dcp {sc['dcp']!r} is not [world_size, rank, interleave]")
    sc["groups"] = [_normalize_group(g, i) for i, g in enumerate(sc["groups"])]
    sc["steps"] = [_normalize_step(s, len(sc["groups"])) for s in sc["steps"]]
    return sc


def _normalize_group(group: Mapping[str, Any], index: int) -> dict[str, Any]:
    g = dict(group)
    kind = g.setdefault("kind", "attention")
    if kind not in GROUP_KINDS:
        raise ScenarioError(f"group {index} kind {kind!r} is not one of {sorted(GROUP_KINDS)}")
    for key, value in GROUP_KINDS[kind].items():
        g.setdefault(key, value)
    for key in ("block_size", "max_num_blocks"):
        if key not in g:
            raise ScenarioError(f"group {index} has no {key!r}")
    g.setdefault("kernel_block_size", None)
    g.setdefault("kernel_block_stride", 0)
    g.setdefault("sliding_window_reach", 0)
    if g["mrv1_slot_mapping"] not in ("token", "none"):
        raise ScenarioError(f"group {index} mrv1_slot_mapping {g['mrv1_slot_mapping']!r} is not 'token' or 'none'")
    k = g["kernel_block_size"]
    if k is not None and (k <= 0 or g["block_size"] % k):
        raise ScenarioError(f"group {index} kernel block size {k} does not divide block size {g['block_size']}")
    return g


def _normalize_step(step: Mapping[str, Any], num_groups: int) -> dict[str, Any]:
    s = dict(step)
    s["ops"] = [list(op) for op in s.get("ops", [])]
    for op in s["ops"]:
        if not op or op[0] not in OP_ARITY or len(op) != OP_ARITY[op[0]]:
            raise ScenarioError(f"op {op!r} is not one of {sorted(OP_ARITY)} with its arguments")
        if op[0] not in ("move", "swap"):
            op[1] = str(op[1])  # request ids are JSON object keys in the result
        if op[0] in ("add", "append") and len(op[2]) != num_groups:
            raise ScenarioError(f"op {op!r} has block ids for {len(op[2])} groups; expected {num_groups}")
    s["batch"] = [[str(req), list(pos)] for req, pos in s.get("batch", [])]
    s.setdefault("num_reqs_padded", len(s["batch"]))
    s["dummy_tokens"] = list(s.get("dummy_tokens", []))
    num_tokens = sum(len(pos) for _, pos in s["batch"]) + sum(s["dummy_tokens"])
    s.setdefault("num_tokens_padded", num_tokens)
    if s["num_reqs_padded"] < len(s["batch"]) or s["num_tokens_padded"] < num_tokens:
        raise ScenarioError(f"step pads below its real size: {s!r}")
    return s


def step_token_layout(step: Mapping[str, Any]) -> tuple[list[int], list[int], list[int], list[int]]:
    """``(query_start_loc, positions)`` of the real requests, then of real + dummy requests."""
    qsl, positions = [0], []
    for _, pos in step["batch"]:
        positions.extend(pos)
        qsl.append(len(positions))
    qsl_all, positions_all = list(qsl), list(positions)
    for n in step["dummy_tokens"]:
        positions_all.extend([0] * n)  # dummy requests own no blocks: any position
        qsl_all.append(len(positions_all))
    return qsl, positions, qsl_all, positions_all


def first_positions(step: Mapping[str, Any]) -> dict[Any, int]:
    """``num_computed_tokens`` per batch request: its first scheduled position."""
    return {req: (pos[0] if pos else 0) for req, pos in step["batch"]}



__all__ = ["GROUP_KINDS", "OP_ARITY", "Scenario", "ScenarioError", "first_positions", "normalize_scenario",
           "step_token_layout"]
