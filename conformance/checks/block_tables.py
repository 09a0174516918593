"""Block-table checks: request schedules run through a runner's own block tables, against the
reference's steps of them (``reference.block_tables.scenarios``).

``conformance.schedules`` plans the schedules; the driver runs them; ``schedule_divergences``
judges what it observed, step by step.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from reference.block_tables.kernel import map_to_kernel_block_table
from reference.block_tables.scenarios import predict_runner
from reference.config import CaseConfig, normalize_scenario

from conformance.divergence import Collector, Divergence, Kind, case_name
from conformance.schedules import SchedulePlan

KINDS = (
    Kind("block_table",
         "a request schedule run through the runner's own block tables (``compare_schedule``): "
         "table widths, which row/slot each request holds, its valid logical block ids, the tables "
         "handed to attention (padded rows included) and each attention group's kernel-block "
         "expansion of them, or where the runner failed."),
    Kind("slot_mapping", "the same schedules' slot mappings (``[:num_tokens_padded]``), those the "
                         "drafter (MRv1) or speculator (MRv2) computes itself for its draft steps after each "
                         "forward (their group, positions and slots), and the slots a cross-attention group's "
                         "builder writes each request's encoder K/V to at its first step."),
)


def _rows_differ(ref: Sequence[Sequence[int]], got: Sequence[Sequence[int]], prefix_len: Callable[[int], int | None]):
    """``(row, part, reference, observed)`` for each differing row; ``prefix_len(i)`` None compares whole rows."""
    if len(ref) != len(got):
        yield None, "", f"{len(ref)} rows", f"{len(got)} rows"
        return
    for i, (a, b) in enumerate(zip(ref, got)):
        n = prefix_len(i)
        a_cmp, b_cmp = (list(a), list(b)) if n is None else (list(a[:n]), list(b[:n]))
        if a_cmp != b_cmp:
            yield i, "" if n is None else f"[:{n}]", a_cmp, b_cmp


def compare_schedule(
    case: CaseConfig | str,
    runner: str,
    scenario: Mapping[str, Any],
    predicted: Mapping[str, Any],
    observed: Mapping[str, Any],
    layer_kernel_block_sizes: Mapping[str, Mapping[str, int]] | None = None,
) -> tuple[Divergence, ...]:
    """One runner's run of a request schedule against the reference's steps of it.

    ``predicted`` is ``reference.block_tables.scenarios.predict_runner``; ``observed``
    the driver's result (kernel tables: one entry per attention group with its KV cache
    group, owner, layers and rows). An attention group's expansion is predicted with the
    kernel block size of its layers for its owner (``layer_kernel_block_sizes[owner]``:
    ``runner`` for the runner's own groups, ``drafter`` for the drafter's / speculator's;
    the scenario group's when None; none where the runner's tables hold kernel ids, vLLM
    before 0.32: ``scenario["kernel_ids"]``). MRv2 leaves stale ids past ``num_blocks`` in gathered rows (they are never
    read), so its real rows are compared on ``[:num_blocks]`` (``[:num_blocks*R]`` once
    expanded); MRv1 rows and every padded row are compared whole. Only whether and at
    which step a runner fails is compared, not its words.
    """
    sc = normalize_scenario(scenario)
    c = Collector(case_name(case), runner)
    name = sc["name"]
    r_err, o_err = predicted.get("error"), observed.get("error")
    err_steps = [e["step"] if e else None for e in (r_err, o_err)]
    if err_steps[0] != err_steps[1]:
        c.cmp("block_table", f"schedule {name}: failing step", r_err or "(runs)", o_err or "(runs)")
    if -1 in err_steps:
        return tuple(c.out)
    c.cmp("block_table", f"schedule {name}: widths", list(predicted["widths"]), list(observed["widths"]))
    if "ids_per_block" in observed:
        c.cmp("block_table", f"schedule {name}: ids stored per block id", list(predicted["ids_per_block"]),
              list(observed["ids_per_block"]))
    groups = sc["groups"]
    for k, (ref, got) in enumerate(zip(predicted["steps"], observed["steps"])):
        step = sc["steps"][k]
        where = f"schedule {name} step {k}"
        if runner == "mrv2" and not sc["mrv2_frees_in_id_order"]:
            # Before 0.29 MRv2 frees a step's slots in set order (the process's string hashes):
            # which slot each request holds is not the schedule's to say, only who is live.
            c.cmp("block_table", f"{where} live requests", sorted(ref["locations"]), sorted(got.get("locations") or ()))
        else:
            c.cmp("block_table", f"{where} locations", ref["locations"], got.get("locations"))
        c.cmp("block_table", f"{where} blocks", ref["blocks"], got.get("blocks"))
        if not step["batch"]:
            continue
        n = len(step["batch"])

        def counts(g: int) -> list[int]:
            return [len(ref["blocks"].get(req, [[]] * len(groups))[g]) for req, _ in step["batch"]]

        def prefix(g: int, scale: int) -> Callable[[int], int | None]:
            real = counts(g)
            return lambda i: real[i] * scale if runner == "mrv2" and i < n else None

        for g in range(min(len(groups), len(ref["tables"]), len(got["tables"]))):
            for i, part, a, b in _rows_differ(ref["tables"][g], got["tables"][g], prefix(g, 1)):
                c.cmp("block_table", f"{where} tables[g={g}]" + ("" if i is None else f" row {i}{part}"), a, b)
        for entry in got.get("kernel_tables", ()):
            g = entry["group"]
            if g >= len(groups) or g >= len(ref["tables"]):
                continue
            group = groups[g]
            if layer_kernel_block_sizes is None:
                kernel, stride = group["kernel_block_size"], group["kernel_block_stride"]
            else:
                owned = layer_kernel_block_sizes.get(entry.get("owner", "runner"), {})
                sizes = {owned.get(layer) for layer in entry["layers"]} - {None}
                if len(sizes) != 1:
                    continue  # the builders of this attention group are compared per layer elsewhere
                kernel, stride = sizes.pop(), 0
            ratio = 1 if kernel in (None, group["block_size"]) else group["block_size"] // kernel
            if sc["kernel_ids"][runner] is not None:
                # Before 0.32 the tables hold kernel ids already and are handed over as they are.
                ratio = 1
            expanded = map_to_kernel_block_table(ref["tables"][g], ratio, stride if ratio > 1 else 0)
            owner = "" if entry.get("owner", "runner") == "runner" else f"{entry['owner']} "
            label = f"{where} kernel_tables[g={g}, {owner}{entry['layers'][0]}{' +' if len(entry['layers']) > 1 else ''}]"
            for i, part, a, b in _rows_differ(expanded, entry["rows"], prefix(g, ratio)):
                c.cmp("block_table", label + ("" if i is None else f" row {i}{part}"), a, b)
        for g, (a, b) in enumerate(zip(ref["slot_mappings"], got["slot_mappings"])):
            c.cmp("slot_mapping", f"{where} slot_mappings[g={g}]", list(a), list(b))
        if "cross_slot_mappings_unsupported" not in got:
            predicted_cross = ref.get("cross_slot_mappings") or []
            for entry in got.get("cross_slot_mappings", ()):
                g = entry["group"]
                if g < len(predicted_cross) and predicted_cross[g] is not None:
                    c.cmp("slot_mapping", f"{where} cross_slot_mapping[g={g}, {entry['layers'][0]}]",
                          list(predicted_cross[g]), list(entry["slot_mapping"]))
            observed_groups = {entry["group"] for entry in got.get("cross_slot_mappings", ())}
            for g, slots in enumerate(predicted_cross):
                if slots is not None and g not in observed_groups:
                    c.cmp("slot_mapping", f"{where} cross_slot_mapping[g={g}]", list(slots), "(no cross-attention builder)")
        if "draft_steps" in got and "draft_steps" in ref:  # a driver that cannot run draft steps reports none
            predicted_drafts, observed_drafts = ref["draft_steps"], got["draft_steps"]
            c.cmp("slot_mapping", f"{where} draft steps run", len(predicted_drafts), len(observed_drafts))
            for j, (a, b) in enumerate(zip(predicted_drafts, observed_drafts)):
                label = f"{where} draft step {j + 1}"
                c.cmp("slot_mapping", f"{label} group", a["group"], b["group"])
                c.cmp("slot_mapping", f"{label} positions", list(a["positions"]), list(b["positions"]))
                c.cmp("slot_mapping", f"{label} slot_mapping[g={a['group']}]", list(a["slot_mapping"]), b["slot_mapping"])
    if len(predicted["steps"]) != len(observed["steps"]) and err_steps[0] == err_steps[1]:
        c.cmp("block_table", f"schedule {name}: steps run", len(predicted["steps"]), len(observed["steps"]))
    return tuple(c.out)


def schedule_divergences(case: CaseConfig, runner: str, plan: SchedulePlan, observation: Any) -> tuple[Divergence, ...]:
    """Every divergence of ``observation.schedules`` from the reference's steps of the plan."""
    observed = tuple(getattr(observation, "schedules", ()) or ())
    if not plan.scenarios or not observed or runner not in plan.layer_kernel_block_sizes:
        return ()
    out: list[Divergence] = []
    for scenario, got in zip(plan.scenarios, observed):
        if "steps" not in got:
            continue  # unsupported / does not fit: said in the report's schedule summary
        out += compare_schedule(case, runner, scenario, predict_runner(scenario, runner), got,
                                plan.layer_kernel_block_sizes[runner])
    return tuple(out)


__all__ = ["KINDS", "compare_schedule", "schedule_divergences"]
