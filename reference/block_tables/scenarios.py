"""What the block tables hold after each step of a scenario (``reference.config``).

``predict(scenario)`` steps the reference's MRv1 and MRv2 models through a scenario the
way the runners step theirs and returns, per runner, the table widths and per step the
request locations, the valid logical block ids per live request and group, the tables
handed to attention (``num_reqs_padded`` rows), their kernel-block expansion and the
slot mappings (``[:num_tokens_padded]``). A ``ConfigError`` ends a runner's steps with
``error`` at that step (-1: construction), as vLLM's own exceptions end the driver's.

``case_groups(derivation)`` gives the groups of a case's scenarios: the block-table
parameters the runners derive from each KV cache group's spec. Pure Python.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

from reference.releases import MRV2_DCP_SHARDING_PER_GROUP, MRV2_SLIDING_WINDOW_REACH, holds
from reference.block_tables._common import PAD_SLOT_ID as PAD_SLOT, get_block_table_width
from reference.block_tables.drafts import DraftStep, draft_step_mrv1, draft_step_mrv2
from reference.block_tables.kernel import map_to_kernel_block_table
from reference.block_tables.mrv1 import MRv1MultiGroupBlockTable
from reference.block_tables.mrv2 import MRv2BlockTables
from reference.block_tables.slots import cross_slot_mapping
from reference.block_tables.schedules import (
    Add,
    Append,
    Move,
    MRv1ScheduleState,
    MRv2ScheduleState,
    Op,
    Preempt,
    Remove,
    ScheduleResult,
    Swap,
    mrv2_step_order,
)
from reference.errors import ConfigError
from reference.config import first_positions, last_positions, normalize_scenario, step_token_layout

if TYPE_CHECKING:
    from reference.derive import Derivation


def schedule_op(op: Sequence[Any]) -> Op:
    """A scenario op (``["add", req, ids]``, ...) as the reference's ``Op``."""
    kind = op[0]
    if kind == "add":
        return Add(op[1], op[2])
    if kind == "append":
        return Append(op[1], op[2])
    if kind == "remove":
        return Remove(op[1])
    if kind == "preempt":
        return Preempt(op[1])
    if kind == "move":
        return Move(op[1], op[2])
    return Swap(op[1], op[2])


def kernel_ratio(group: Mapping[str, Any]) -> tuple[int, int]:
    """``(R, kernel_block_stride)`` as ``map_to_kernel_block_table`` uses them."""
    k = group["kernel_block_size"]
    if k is None or k == group["block_size"]:
        return 1, 0
    return group["block_size"] // k, group["kernel_block_stride"]


def stored_ratios(sc: Mapping[str, Any], runner: str) -> list[int]:
    """Per group, how many ids ``runner``'s tables store per block id: its kernel blocks per
    block where its tables hold kernel ids (``sc["kernel_ids"][runner]``), else 1."""
    ratios = sc["kernel_ids"][runner]
    return [1] * len(sc["groups"]) if ratios is None else list(ratios)


def blocks_of(result: ScheduleResult) -> dict[str, list[list[int]]]:
    return {req: [list(g) for g in ids] for req, ids in result.blocks.items()}


class _MRv1Model:
    """MRv1: ``MultiGroupBlockTable`` rows as ``InputBatch`` moves them."""

    def __init__(self, sc: Mapping[str, Any]) -> None:
        groups, (W, r, I) = sc["groups"], sc["dcp"]
        self.groups = groups
        self.kernel_ids = sc["kernel_ids"]["mrv1"] is not None
        self.tables = MRv1MultiGroupBlockTable(
            sc["max_num_reqs"], sc["max_num_batched_tokens"], [g["block_size"] for g in groups],
            [g["max_num_blocks"] for g in groups], I, [g["mrv1_slot_mapping"] for g in groups],
            dcp_world_size=W, dcp_rank=r, blocks_per_kv_block=stored_ratios(sc, "mrv1"),
            move_clears_source=sc["mrv1_move_clears_source"], token_aligned=sc["widths_token_aligned"],
            block_aligned=sc["mrv1_widths_block_aligned"],
        )
        self.state = MRv1ScheduleState(self.tables)
        self.widths = self.tables.widths
        self.draft = sc["draft"]
        self.encoder_lens = sc["encoder_lens"]

    def step(self, step: Mapping[str, Any]) -> dict[str, Any]:
        for op in step["ops"]:
            self.state.apply(schedule_op(op))
        res = self.state.result()
        obs: dict[str, Any] = {"locations": dict(res.locations), "blocks": blocks_of(res)}
        if step["batch"]:
            n = len(step["batch"])
            qsl, positions, _, _ = step_token_layout(step)
            self.tables.compute_slot_mapping(n, qsl, positions)
            rows = self.tables.batch_rows(n, step["num_reqs_padded"])
            obs["tables"] = rows
            # Tables of kernel ids are handed to the builders as they are (no expansion).
            obs["kernel_tables"] = [rows[g] if self.kernel_ids else map_to_kernel_block_table(rows[g], *kernel_ratio(grp))
                                    for g, grp in enumerate(self.groups)]
            obs["slot_mappings"] = self.tables.get_slot_mappings(len(positions), step["num_tokens_padded"])
            if any(g["kind"] == "cross" for g in self.groups):
                obs["cross_slot_mappings"] = _cross_slots(self.groups, obs["kernel_tables"], step, self.encoder_lens)
            if self.draft is not None:
                obs["draft_steps"] = self._draft_steps(step, rows[self.draft["group"]])
        return obs

    def _draft_steps(self, step: Mapping[str, Any], rows: Sequence[Sequence[int]]) -> list[dict[str, Any]]:
        """The drafter's steps after the forward (``llm_base_proposer.py`` ``propose``:
        ``eagle_step_update_slot_mapping_and_metadata`` per step): from each request's
        last position, ``draft_step_mrv1`` (PAD past the model length, D15), the slot
        ``row[min(p // B, width - 1)] * B + p % B`` of the drafter's group's batch row
        with its logical block size. DCP plays no part in it: the drafter's kernel takes
        no DCP size or rank (the contract's ``slot_address`` says what that breaks)."""
        d = self.draft
        table = self.tables[d["group"]]
        # The drafter reads its group's table in the unit of its ids (kernel blocks before 0.32).
        B, width = table.block_size // table.blocks_per_kv_block, self.widths[d["group"]]
        out = []
        for moved in _draft_moves(step, d, draft_step_mrv1):
            slots = [PAD_SLOT if m.pad_slot else rows[i][min(m.position // B, width - 1)] * B + m.position % B
                     for i, m in enumerate(moved)]
            out.append({"group": d["group"], "positions": [m.position for m in moved], "slot_mapping": slots})
        return out


class _MRv2Model:
    """MRv2: ``BlockTables`` indexed by request-state slot."""

    def __init__(self, sc: Mapping[str, Any]) -> None:
        groups, (W, r, I) = sc["groups"], sc["dcp"]
        self.groups = groups
        self.kernel_ids = sc["kernel_ids"]["mrv2"] is not None
        ratios = stored_ratios(sc, "mrv2")
        aligned = sc["widths_token_aligned"]
        self.widths = [get_block_table_width(g["max_num_blocks"], g["block_size"], g["token_alignment"] if aligned else None)
                       * ratio for g, ratio in zip(groups, ratios)]
        self.tables = MRv2BlockTables(
            [g["block_size"] for g in groups], sc["max_num_reqs"], sc["max_num_batched_tokens"], self.widths,
            W, r, I, [g["mrv2_slot_mapping"] for g in groups], [g["dcp_sharded"] for g in groups],
            [g["sliding_window_reach"] for g in groups], blocks_per_kv_block=ratios,
        )
        self.state = MRv2ScheduleState(self.tables)
        self.draft = sc["draft"]
        self.encoder_lens = sc["encoder_lens"]

    def step(self, step: Mapping[str, Any]) -> dict[str, Any]:
        for op in mrv2_step_order([schedule_op(op) for op in step["ops"]]):
            self.state.apply(op)
        res = self.state.result()
        obs: dict[str, Any] = {"locations": dict(res.locations), "blocks": blocks_of(res)}
        if step["batch"]:
            idx = [res.locations[req] for req, _ in step["batch"]]
            computed = {res.locations[req]: p for req, p in first_positions(step).items()}
            gathered = self.tables.gather(idx, step["num_reqs_padded"], num_computed_tokens=computed)
            _, _, qsl_all, positions_all = step_token_layout(step)
            obs["tables"] = [list(t) for t in gathered]
            obs["kernel_tables"] = [list(gathered[g]) if self.kernel_ids else map_to_kernel_block_table(gathered[g], *kernel_ratio(grp))
                                    for g, grp in enumerate(self.groups)]
            obs["slot_mappings"] = self.tables.compute_slot_mappings(
                idx + [-1] * len(step["dummy_tokens"]), qsl_all, positions_all, step["num_tokens_padded"])
            if any(g["kind"] == "cross" for g in self.groups):
                obs["cross_slot_mappings"] = _cross_slots(self.groups, obs["kernel_tables"], step, self.encoder_lens)
            if self.draft is not None:
                obs["draft_steps"] = self._draft_steps(step, idx)
        return obs

    def _draft_steps(self, step: Mapping[str, Any], idx: Sequence[int]) -> list[dict[str, Any]]:
        """The speculator's decode steps after the forward (``target_dependent_ar/
        speculator.py``: ``prepare_decode_inputs``, then per step ``compute_slot_mappings``
        over the runner's block tables and ``update_draft_inputs``): positions clamp at
        ``max_model_len - 1`` (``draft_step_mrv2``, D15), one token per request, its slot
        as the forward's (DCP included), in the drafter's group."""
        d = self.draft
        n, out = len(idx), []
        for moved in _draft_moves(step, d, draft_step_mrv2):
            positions = [m.position for m in moved]
            slots = self.tables.compute_slot_mappings(list(idx), list(range(n + 1)), positions, n)[d["group"]]
            out.append({"group": d["group"], "positions": positions, "slot_mapping": list(slots[:n])})
        return out


def _cross_slots(groups: Sequence[Mapping[str, Any]], kernel_tables: Sequence[Sequence[Sequence[int]]],
                 step: Mapping[str, Any], encoder_lens: Mapping[str, int]) -> list[list[int] | None]:
    """Per group, the slots its cross-attention builder writes the encoder K/V to this step
    (``cross_slot_mapping`` over the group's kernel table); None for other groups."""
    out: list[list[int] | None] = []
    for g, group in enumerate(groups):
        if group["kind"] != "cross":
            out.append(None)
            continue
        R, _ = kernel_ratio(group)
        out.append(cross_slot_mapping(kernel_tables[g], group["block_size"] // R, step["batch"], encoder_lens))
    return out


def _draft_moves(step: Mapping[str, Any], draft: Mapping[str, int], move) -> Iterator[list[DraftStep]]:
    """Each draft step's ``DraftStep`` per batch request, ``move`` (a runner's rule) applied
    from the last scheduled position and the seq len after it."""
    state = [(p, p + 1) for p in last_positions(step)]
    for _ in range(draft["steps"]):
        moved = [move(p, s, draft["max_model_len"]) for p, s in state]
        yield moved
        state = [(m.position, m.seq_len) for m in moved]


_MODELS = {"mrv1": _MRv1Model, "mrv2": _MRv2Model}


def predict_runner(scenario: Mapping[str, Any], runner: str) -> dict[str, Any]:
    """One runner's steps of ``scenario`` (normalised here)."""
    sc = normalize_scenario(scenario)
    try:
        model = _MODELS[runner](sc)
    except ConfigError as exc:
        return {"widths": [], "steps": [], "error": {"step": -1, "message": f"ConfigError: {exc}"}}
    steps: list[dict[str, Any]] = []
    ids_per_block = stored_ratios(sc, runner)
    for k, step in enumerate(sc["steps"]):
        try:
            steps.append(model.step(step))
        except ConfigError as exc:
            return {"widths": model.widths, "ids_per_block": ids_per_block, "steps": steps,
                    "error": {"step": k, "message": f"ConfigError: {exc}"}}
    return {"widths": model.widths, "ids_per_block": ids_per_block, "steps": steps}


def predict(scenario: Mapping[str, Any]) -> dict[str, Any]:
    """Both runners' steps of ``scenario``: ``{"name", "mrv1": {...}, "mrv2": {...}}``."""
    sc = normalize_scenario(scenario)
    return {"name": sc["name"], "mrv1": predict_runner(sc, "mrv1"), "mrv2": predict_runner(sc, "mrv2")}


# --- a case's block-table groups ------------------------------------------------------------------


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


MAX_NUM_ENCODER_INPUT_TOKENS = 2048
"""The encoder budget of a scheduler configured as the drivers configure it:
``SchedulerConfig.max_num_encoder_input_tokens`` is ``max_num_batched_tokens``, 2048 by
default (``vllm/config/scheduler.py``). Encoder-decoder runners size every block table for
it (MRv1 ``GPUModelRunner.__init__``: ``max_encoder_len``; MRv2 ``initialize_kv_cache``:
``block_table_max_model_len``), and a request's encoder input is at most this long."""


def block_table_max_len(case: Any) -> int:
    """The token count the runners size each request's block-table row for: ``max_model_len``,
    or for an encoder-decoder model (a cross-attention layer) the encoder budget if longer.
    The model configs the drivers build carry no ``max_source_positions`` (MRv2's third term)."""
    if any(layer.kind == "cross" for layer in case.layers):
        return max(case.max_model_len, MAX_NUM_ENCODER_INPUT_TOKENS)
    return case.max_model_len


def case_groups(derivation: "Derivation") -> list[dict[str, Any]] | str:
    """The scenario groups of a case: what each runner builds its block tables from.

    Per KV cache group (``vllm/v1/kv_cache_interface.py``): attention specs are
    DCP-sharded, need ``cdiv(max_model_len, block_size * dcp)`` entries per request
    and align MRv2's width to 128 tokens; a sliding window keeps
    ``sliding_window - 1`` tokens below a step readable (``num_retained_tokens``;
    MRv2 nulls the entries below it); Mamba state is one replicated block per request
    with no MRv1 slot mapping (one per ``mamba_block_size`` tokens in ``align`` mode). The kernel block size of group ``g`` is
    ``kernel_block_sizes[g]``. A string says why no schedule fits the case.
    """
    from reference.specs import MambaSpec, SpecKind, first_layer_spec

    scheduled = (SpecKind.FULL, SpecKind.MLA, SpecKind.SLIDING_WINDOW, SpecKind.SLIDING_WINDOW_MLA,
                 SpecKind.CHUNKED_LOCAL, SpecKind.SINK_FULL, SpecKind.RSWA,
                 SpecKind.HIDDEN_STATE)
    case = derivation.case
    dcp = case.decode_context_parallel_size
    row_len = block_table_max_len(case)
    out: list[dict[str, Any]] = []
    for gid, group in enumerate(derivation.groups):
        spec = first_layer_spec(group.spec)
        B = group.spec.block_size
        if isinstance(spec, MambaSpec):
            # One state block per request, or per block of tokens in "align" mode (a row as wide
            # as the attention rows: MambaSpec.max_num_blocks_per_req).
            out.append({"kind": "mamba", "block_size": B, "max_num_blocks": spec.max_num_blocks_per_req(case.max_model_len),
                        # Replicated state, but MRv2 shards every group's slots before 0.31.
                        "dcp_sharded": not holds(MRV2_DCP_SHARDING_PER_GROUP, case.vllm_version)})
            continue
        if spec.kind is SpecKind.CIRCULAR_BUFFER:
            # CircularBufferSpec: one ring block per request, replicated across DCP ranks, no
            # slot mapping in MRv2 (MRv1 computes one anyway: its kind is not Mamba).
            out.append({"kind": "circular", "block_size": B, "max_num_blocks": spec.max_num_blocks_per_req(case.max_model_len),
                        "dcp_sharded": spec.dcp_sharded, "kernel_block_size": derivation.kernel_block_sizes[gid]})
            continue
        if spec.kind is SpecKind.CROSS:
            if dcp > 1:
                return ("a cross-attention group under decode context parallelism: its slot mapping "
                        "(cross_attention.py _get_cross_slot_mapping) is not DCP-aware; not modeled yet")
            # The request's encoder tokens, allocated once (CrossAttentionManager), in a row as wide
            # as every other group's of an encoder-decoder model.
            out.append({"kind": "cross", "block_size": B, "max_num_blocks": _cdiv(row_len, B),
                        "dcp_sharded": spec.dcp_sharded, "kernel_block_size": derivation.kernel_block_sizes[gid]})
            continue
        if spec.kind not in scheduled:
            # Encoder-only layers own no KV cache group.
            return f"KV cache group {gid} is {spec.kind.value}: a decoder request schedule does not fill its block table"
        window = spec.sliding_window if spec.kind in (SpecKind.SLIDING_WINDOW, SpecKind.SLIDING_WINDOW_MLA) else None
        shards = dcp if spec.dcp_sharded else 1
        out.append({
            "kind": "attention",
            "block_size": B,
            "max_num_blocks": _cdiv(row_len, B * shards),
            "dcp_sharded": spec.dcp_sharded,
            "kernel_block_size": derivation.kernel_block_sizes[gid],
            # MRv2 nulls the ids below the window in the releases reference.releases says.
            "sliding_window_reach": (window - 1) if window and holds(MRV2_SLIDING_WINDOW_REACH, case.vllm_version) else 0,
        })
    if not out:
        return "the case has no KV cache groups"
    return out


__all__ = ["blocks_of", "case_groups", "kernel_ratio", "predict", "predict_runner", "schedule_op"]
