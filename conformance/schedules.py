"""Request schedules of a case: which to run through the runners' block tables, and how many ran.

``plan_schedules(case, seed, count)`` draws ``count`` seeded schedules over the case's KV
cache groups as the reference predicts them, with the kernel block size each layer's
attention group expands to; the driver runs them and ``conformance.checks.block_tables``
judges the result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from reference.config import CaseConfig
from reference.releases import (BLOCK_TABLE_WIDTHS_TOKEN_ALIGNED, MRV1_MOVE_ROW_CLEARS_SOURCE, MRV1_ROWS_BLOCK_ALIGNED,
                                MRV1_STATE_SLOTS_SKIPPED,
                                MRV2_FREES_SLOTS_IN_ID_ORDER, holds)

from conformance.divergence import draft_layers
from conformance.prediction import reference_prediction

DEFAULT_SCHEDULES = 2
"""Schedules per case for the named cases (``kvconform run --schedules``)."""
DRAFT_STEPS = 2
"""Draft steps after each forward of a case with a draft (``num_speculative_tokens = 3``:
the first draft token comes from the pass over the target's tokens, the next two from
the drafter's own steps, whose slot mappings it computes itself)."""


@dataclass(frozen=True)
class SchedulePlan:
    """The schedules of one case and what the reference needs to judge them."""

    scenarios: tuple[dict[str, Any], ...] = ()
    """``reference.config`` scenarios, the same for both runners."""
    layer_kernel_block_sizes: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)
    """Per runner, per owner (``runner``: the runner's own attention groups; ``drafter``:
    the drafter's / speculator's), per layer: the kernel block size its attention group
    expands block tables to."""
    skipped: str | None = None
    """Why the case has no schedules (no KV cache groups the schedules fill, a refusal)."""
    seed: int = 0
    """The run seed the schedules were drawn from."""


PCP_SCHEDULES_NOT_MODELED = ("prefill context parallelism: MRv2 partitions each step's batch across the PCP ranks "
                             "(v1/worker/gpu/pcp_manager.py: partition_batch, prepare_attn), not modeled yet")


def plan_schedules(case: CaseConfig, seed: int, count: int) -> SchedulePlan:
    """``count`` schedules for ``case`` (none when ``count`` is 0 or no schedule fits)."""
    from reference.block_tables.scenarios import MAX_NUM_ENCODER_INPUT_TOKENS, case_groups
    from suites.block_table_scenarios import case_scenarios

    if count <= 0:
        return SchedulePlan(skipped="no schedules asked for (--schedules 0)", seed=seed)
    if case.prefill_context_parallel_size > 1:
        # MRv2 hands each step's batch to its PCPManager (partition_batch: DualChunkSwap rows per
        # rank; prepare_attn: the block tables gathered for the local rows, the slot mappings of
        # every rank's tokens gathered and masked), which the reference does not model yet.
        return SchedulePlan(skipped=PCP_SCHEDULES_NOT_MODELED, seed=seed)
    derivations, why_not = {}, set()
    for runner in ("mrv1", "mrv2"):
        derivation, refusal, early = reference_prediction(case, runner)
        if derivation is not None:
            derivations[runner] = derivation
        elif refusal is not None:
            why_not.add("the reference predicts vLLM refuses the case")
        elif early is not None:
            why_not.add(f"the reference does not model the case ({early.detail[:120]})")
    if not derivations:
        return SchedulePlan(skipped="; ".join(sorted(why_not)), seed=seed)
    first = next(iter(derivations.values()))
    groups = case_groups(first)
    if isinstance(groups, str):
        return SchedulePlan(skipped=groups, seed=seed)
    scenarios = case_scenarios(case.name, groups, max_model_len=case.max_model_len,
                               dcp_world=case.decode_context_parallel_size, seed=seed, count=count,
                               max_encoder_len=MAX_NUM_ENCODER_INPUT_TOKENS)
    draft = _draft_steps(case, first, groups)
    if draft is not None:
        scenarios = [dict(sc, draft=draft) for sc in scenarios]
    kernel_ids = _kernel_ids(case, derivations, groups)
    if any(ratios is not None for ratios in kernel_ids.values()):
        scenarios = [dict(sc, kernel_ids=kernel_ids) for sc in scenarios]
    if not holds(MRV1_MOVE_ROW_CLEARS_SOURCE, case.vllm_version):
        scenarios = [dict(sc, mrv1_move_clears_source=False) for sc in scenarios]
    if not holds(MRV2_FREES_SLOTS_IN_ID_ORDER, case.vllm_version):
        scenarios = [dict(sc, mrv2_frees_in_id_order=False) for sc in scenarios]
    if not holds(BLOCK_TABLE_WIDTHS_TOKEN_ALIGNED, case.vllm_version):
        scenarios = [dict(sc, widths_token_aligned=False) for sc in scenarios]
    if not holds(MRV1_STATE_SLOTS_SKIPPED, case.vllm_version):
        scenarios = [dict(sc, groups=[dict(g, mrv1_slot_mapping="token") if g.get("kind") == "mamba" else g
                                      for g in sc["groups"]]) for sc in scenarios]
    if holds(MRV1_ROWS_BLOCK_ALIGNED, case.vllm_version):
        scenarios = [dict(sc, mrv1_widths_block_aligned=True) for sc in scenarios]
    kernels = {runner: _kernel_sizes_by_owner(case, d) for runner, d in derivations.items()}
    if case.generation == 1:
        scenarios = [dict(sc, draft=None) for sc in scenarios]  # the generation-1 driver runs no drafter
    return SchedulePlan(tuple(scenarios), kernels, seed=seed)


def _kernel_ids(case: CaseConfig, derivations: dict[str, Any], groups: list[dict[str, Any]]) -> dict[str, list[int] | None]:
    """Per runner whose release stores kernel block ids in its block tables
    (``reference.releases.BLOCK_TABLES_HOLD_KERNEL_IDS``), how many per block id in each
    attention group: its own derivation's kernel split (the runners may differ, D1)."""
    from reference.releases import BLOCK_TABLES_HOLD_KERNEL_IDS, holds

    out: dict[str, list[int] | None] = {}
    fallback = next(iter(derivations.values()))
    for runner, facts in BLOCK_TABLES_HOLD_KERNEL_IDS.items():
        if not holds(facts, case.vllm_version):
            out[runner] = None
            continue
        kernels = derivations.get(runner, fallback).kernel_block_sizes
        out[runner] = [group["block_size"] // kernels[g] if group["kind"] in ("attention", "cross") and kernels[g] else 1
                       for g, group in enumerate(groups)]
    return out


def _draft_steps(case: CaseConfig, derivation: Any, groups: list[dict[str, Any]]) -> dict[str, int] | None:
    """The draft steps a case's schedules run after each forward: ``DRAFT_STEPS`` in the
    KV cache group that holds its draft layers (one group for all of them: vLLM's
    ``validate_same_kv_cache_group``), when that group is an attention group."""
    drafts = draft_layers(case)
    if not drafts:
        return None
    gids = {gid for gid, group in enumerate(derivation.groups) if drafts & set(group.layer_names)}
    if len(gids) != 1:
        return None
    gid = gids.pop()
    if gid >= len(groups) or groups[gid]["kind"] != "attention":
        return None
    return {"group": gid, "steps": DRAFT_STEPS, "max_model_len": case.max_model_len}


def _kernel_sizes_by_owner(case: CaseConfig, derivation: Any) -> dict[str, dict[str, int]]:
    """Targets: their builders' kernel block size. Drafts: the drafter's (speculator's)
    builders' size for the drafter's groups; in the runner's own groups (which hold every
    layer of the KV cache config) their KV cache group's kernel block size."""
    drafts = draft_layers(case)
    if case.generation == 1:
        # Generation 1's builders read the runner's table as it is: each layer its group's size.
        sizes = {name: derivation.kernel_block_sizes[gid] for gid, group in enumerate(derivation.groups)
                 for name in group.layer_names}
        return {"runner": sizes, "drafter": {}}
    builders = derivation.builder_kernel_block_sizes
    own = {name: size for name, size in builders.items() if name not in drafts}
    for gid, group in enumerate(derivation.groups):
        for name in group.layer_names:
            if name in drafts:
                own[name] = derivation.kernel_block_sizes[gid]
    return {"runner": own, "drafter": {name: size for name, size in builders.items() if name in drafts}}


def schedule_summary(plan: SchedulePlan | None, observation: Any) -> dict[str, Any]:
    """For the report: how many schedules ran through this runner's block tables, and why not the others."""
    if plan is None:
        return {"run": 0, "not_run": "no schedules asked for"}
    if plan.skipped:
        return {"run": 0, "not_run": plan.skipped}
    if getattr(observation, "unsupported", None):
        return {"run": 0, "not_run": "the case was not observed"}
    why = getattr(observation, "schedules_unsupported", None)
    observed = tuple(getattr(observation, "schedules", ()) or ())
    if why or not observed:
        reason = why or (f"vLLM refused the case ({getattr(observation, 'error_stage', None)})"
                         if getattr(observation, "error", None) else "not run")
        return {"run": 0, "not_run": reason}
    ran = [s for s in observed if "steps" in s]
    reasons = sorted({s.get("does_not_fit") or s.get("unsupported") or "" for s in observed if "steps" not in s} - {""})
    summary: dict[str, Any] = {"run": len(ran), "seed": plan.seed, "names": [s["name"] for s in ran]}
    drafted = sum(len(step.get("draft_steps") or ()) for s in ran for step in s["steps"])
    if drafted:
        summary["draft_steps"] = drafted  # the drafter's / speculator's own steps after the forwards
    not_drafted = sorted({step["draft_steps_unsupported"] for s in ran for step in s["steps"] if "draft_steps_unsupported" in step})
    if not_drafted:
        summary["draft_steps_not_run"] = "; ".join(not_drafted)
    crossed = sum(1 for s in ran for step in s["steps"] for entry in step.get("cross_slot_mappings") or ()
                  if entry["slot_mapping"])
    if crossed:
        summary["cross_slot_mappings"] = crossed  # steps' encoder K/V writes through a cross-attention builder
    not_crossed = sorted({step["cross_slot_mappings_unsupported"] for s in ran for step in s["steps"]
                          if "cross_slot_mappings_unsupported" in step})
    if not_crossed:
        summary["cross_slot_mappings_not_run"] = "; ".join(not_crossed)
    if reasons:
        summary["not_run"] = "; ".join(reasons)
    return summary


__all__ = ["DEFAULT_SCHEDULES", "SchedulePlan", "plan_schedules", "schedule_summary"]
