"""Request schedules through the block tables each runner built in its own ``initialize_kv_cache``.

After ``planning`` has run a runner's ``initialize_kv_cache`` (``runners``), the runner
holds the block tables it constructed from the KV cache config, with its own widths,
slot-mapping modes, DCP settings and kernel block sizes, and attention groups whose
``kernel_block_table`` buffers its metadata-builder set-up allocated. A scenario
(``reference.config``) is then run through those objects:

- MRv1 (``gpu_model_runner.py``): the runner's ``InputBatch`` in ``_update_states``'
  order (``remove_request``, ``block_table.append_row``, ``add_request`` of a
  ``CachedRequestState``, ``condense``, ``swap_states``), so InputBatch picks each
  request's row; ``commit_block_table`` and ``compute_slot_mapping`` as
  ``_prepare_inputs`` calls them, the slot mappings from the runner's own
  ``_get_slot_mappings`` (its PAD fill), the attention tables as
  ``_build_attention_metadata`` takes them (``get_device_tensor`` with the padded rows
  set to the null block; that code is a closure inside the method, so its two lines
  are repeated here) and each attention group's ``map_to_kernel_block_table``.
- MRv2 (``gpu/model_runner.py``): the runner's own ``finish_requests``,
  ``add_requests`` and ``update_requests`` on scheduler-output stand-ins (so its
  ``RequestState`` picks each request's slot), ``block_tables.apply_staged_writes``
  as ``execute_model`` calls it, the runner's ``prepare_attn`` (gathered tables and slot
  mappings) and each attention group's ``map_to_kernel_block_table`` (the runner's and
  the speculator's).

The Triton kernels run in the Triton interpreter: the process must have had
``TRITON_INTERPRET=1`` (and ``CUDA_VISIBLE_DEVICES=""``) before vLLM was imported
(``kvconform run`` and the test suite set it); otherwise ``schedule_support()`` says
why and nothing is run. Nothing here imports the reference beyond the case description.
"""

from __future__ import annotations

import contextlib
import os
from types import SimpleNamespace
from typing import Any, Iterator, Mapping, Sequence

from gpu_impl.vllm_cpu.block_tables import NULL_BLOCK_ID, TRITON_CPU_ENV, _tolist, observe_tables
from reference.config import ScenarioError, first_positions, last_positions, normalize_scenario, step_token_layout

Result = dict[str, Any]

_VLLM_ERRORS = (ValueError, RuntimeError, IndexError, AssertionError, KeyError)


class _RowsDiffer(Exception):
    """MRv1's InputBatch chose rows other than the schedule's, so its batch cannot be formed."""


def prepare_process_env() -> bool:
    """Set the Triton interpreter's environment if vLLM is not imported yet; True if set now or before."""
    import sys

    if all(os.environ.get(k) == v for k, v in TRITON_CPU_ENV.items()):
        return True
    if "vllm" in sys.modules or "triton" in sys.modules:
        return False
    os.environ.update(TRITON_CPU_ENV)
    return True


def schedule_support() -> str | None:
    """Why this process cannot run vLLM's block-table kernels, or None when it can."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return ("vLLM's block-table kernels need the Triton interpreter on CPU: TRITON_INTERPRET=1 and "
                "CUDA_VISIBLE_DEVICES='' before vLLM is imported (kvconform run sets them)")
    try:
        import vllm.v1.worker.block_table as mrv1_tables
        import vllm.v1.worker.gpu.block_table as mrv2_tables
    except ImportError as exc:
        return f"vLLM's block tables do not import: {exc}"
    for module in (mrv1_tables, mrv2_tables):
        kernels = [v for k, v in vars(module).items() if k.startswith("_") and k.endswith("_kernel")]
        if kernels and not all(type(k).__name__ == "InterpretedFunction" for k in kernels):
            return (f"{module.__name__} was imported before TRITON_INTERPRET=1 was set: its kernels are not "
                    "interpreted (set it before anything imports vLLM)")
    return None


def _attention_group_entries(groups_by_gid, owner: str) -> list[tuple[int, str, Any]]:
    return [(gid, owner, ag) for gid, groups in enumerate(groups_by_gid or []) for ag in groups]


def _kernel_tables(entries: Sequence[tuple[int, str, Any]], tables: Sequence[Any]) -> list[dict[str, Any]]:
    """Each attention group's ``map_to_kernel_block_table`` of its KV cache group's table
    (``owner``: the runner's own groups, or the drafter's / speculator's). Releases before
    0.32 have no such method: their block tables hold kernel ids already and the builders
    get the table as it is, which is then what is reported."""
    out = []
    for gid, owner, group in entries:
        if gid >= len(tables):
            continue
        expand = getattr(group, "map_to_kernel_block_table", None)
        rows = tables[gid] if expand is None else expand(tables[gid])
        out.append({"group": gid, "owner": owner, "layers": sorted(group.layer_names), "rows": _tolist(rows)})
    return out


def _cross_entries(entries: Sequence[tuple[int, str, Any]]) -> list[tuple[int, str, Any]]:
    """The attention groups of cross-attention layers (their spec a ``CrossAttentionSpec``)."""
    try:
        from vllm.v1.kv_cache_interface import CrossAttentionSpec
    except ImportError:
        return []
    return [e for e in entries if isinstance(getattr(e[2], "kv_cache_spec", None), CrossAttentionSpec)]


def _encoder_features(req: str, encoder_lens: Mapping[str, int]) -> list[Any]:
    """A request's encoder input as the scheduler hands it to the runners: one
    ``MultiModalFeatureSpec`` whose placeholder holds its encoder tokens (as Whisper's audio)."""
    if req not in encoder_lens:
        return []
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange

    return [MultiModalFeatureSpec(data=None, modality="audio", identifier=f"{req}-encoder",
                                  mm_position=PlaceholderRange(offset=0, length=int(encoder_lens[req])))]


@contextlib.contextmanager
def _underlying_build_stood_in(builder) -> Iterator[None]:
    """``CrossAttentionBuilder.build`` ends in its backend's own ``build``, which needs device
    metadata this driver does not have: that call alone returns an empty metadata object, so
    the cross builder's own masking and ``_get_cross_slot_mapping`` run as they are."""
    base = type(builder).__mro__[1]
    saved = base.__dict__.get("build")
    base.build = lambda self, common_prefix_len, common_attn_metadata, fast_build=False: SimpleNamespace()
    try:
        yield
    finally:
        if saved is None:
            del base.build
        else:
            base.build = saved


def _cross_slot_mappings(cross: Sequence[tuple[int, str, Any]], kernel_tables: Sequence[Mapping[str, Any]],
                         step: Mapping[str, Any], encoder_seq_lens: Mapping[int, tuple[Any, Any]]) -> list[dict[str, Any]]:
    """Each cross-attention group's slots for this step, from its own builder's ``build``
    (``cross_attention.py``): the common metadata the runner hands it (query start locations, the
    seq lens' upper bound, the runner's own encoder seq lens for the group, the group's kernel
    block table) and the builder's own spec (its kernel block size)."""
    import torch

    n = len(step["batch"])
    qsl, _, _, _ = step_token_layout(step)
    seq_lens = [pos[-1] + 1 if pos else 0 for _, pos in step["batch"]]
    out = []
    for gid, owner, group in cross:
        rows = next((t["rows"] for t in kernel_tables if t["group"] == gid and t["layers"] == sorted(group.layer_names)), None)
        if rows is None or gid not in encoder_seq_lens:
            continue
        lens_gpu, lens_cpu = encoder_seq_lens[gid]
        common = SimpleNamespace(
            query_start_loc_cpu=torch.tensor(qsl, dtype=torch.int32), seq_lens_cpu_upper_bound=torch.tensor(seq_lens, dtype=torch.int32),
            encoder_seq_lens=lens_gpu[:n], encoder_seq_lens_cpu=lens_cpu[:n],
            block_table_tensor=torch.tensor(rows[:n], dtype=torch.int32), causal=True, max_seq_len=max(seq_lens),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32))
        builder = group.get_metadata_builder()
        with _underlying_build_stood_in(builder):
            metadata = builder.build(0, common)
        out.append({"group": gid, "owner": owner, "layers": sorted(group.layer_names),
                    "slot_mapping": _tolist(metadata.slot_mapping)})
    return out


class _MRv1Schedule:
    """A scenario through MRv1's own ``InputBatch`` (its request methods and block table)
    and attention groups."""

    def __init__(self, instance, sc: Mapping[str, Any]) -> None:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.worker.gpu_input_batch import CachedRequestState

        self.instance, self.sc = instance, sc
        self.batch = instance.input_batch
        self.table = self.batch.block_table
        self.num_groups = len(self.table.block_tables)
        self.widths = [int(t.get_numpy_array().shape[1]) for t in self.table.block_tables]
        # Before 0.32 a BlockTable stores each block id as its kernel block ids (blocks_per_kv_block).
        self.ids_per_block = [int(getattr(t, "blocks_per_kv_block", 1)) for t in self.table.block_tables]
        # Each group's (manager) block size; before 0.32 block_size is the kernel's.
        self.block_sizes = [int(t.block_size) * r for t, r in zip(self.table.block_tables, self.ids_per_block)]
        groups = list(getattr(instance, "attn_groups", []) or [])
        drafter = getattr(instance, "drafter", None)
        self.drafter = drafter if getattr(drafter, "draft_attn_groups", None) else None
        draft = list(getattr(drafter, "draft_attn_groups", []) or [])
        self.entries = _attention_group_entries(groups, "runner")
        # The drafter's attention groups carry their own kv_cache_group_id.
        self.entries += [(int(ag.kv_cache_group_id), "drafter", ag) for ag in draft]
        self._request, self._sampling = CachedRequestState, SamplingParams
        self.cross = _cross_entries(self.entries)
        if self.cross:
            import torch
            from vllm.v1.utils import CpuGpuBuffer

            # GPUModelRunner.__init__'s request states and encoder seq-len buffer (its _make_buffer,
            # unpinned: no pinned host memory without a GPU), which its _get_encoder_seq_lens reads.
            instance.requests = {}
            instance.encoder_seq_lens = CpuGpuBuffer(int(instance.max_num_reqs), dtype=torch.int32, device=instance.device,
                                                     pin_memory=False)

    @property
    def locations(self) -> SimpleNamespace:
        return SimpleNamespace(of=dict(self.batch.req_id_to_index))

    def apply_step(self, step: Mapping[str, Any]) -> None:
        """``_update_states``' order: removals, appends, adds, ``condense``, then the
        reorder's ``swap_states``. The schedule's ``move`` ops are what ``condense``
        should do: the rows it chose are read back, not supplied."""
        batch, firsts = self.batch, first_positions(step)
        last = {req: (pos[-1] if pos else 0) for req, pos in step["batch"]}
        condensed = False
        for op in step["ops"]:
            kind = op[0]
            if kind in ("remove", "preempt"):
                if batch.remove_request(op[1]) is None:
                    raise ScenarioError(f"request {op[1]!r} is not live")
                if self.cross:
                    self.instance.requests.pop(op[1], None)
            elif kind == "append":
                if op[1] not in batch.req_id_to_index:
                    raise ScenarioError(f"request {op[1]!r} is not live")
                self.table.append_row(tuple(list(ids) for ids in op[2]), batch.req_id_to_index[op[1]])
            elif kind == "add":
                if op[1] in batch.req_id_to_index:
                    raise ScenarioError(f"add of request {op[1]!r} which is already live")
                tokens = [0] * max(1, last.get(op[1], 0) + 1)
                state = self._request(
                    req_id=op[1], prompt_token_ids=tokens, mm_features=_encoder_features(op[1], self.sc["encoder_lens"]),
                    sampling_params=self._sampling(max_tokens=1), generator=None,
                    block_ids=tuple(list(ids) for ids in op[2]), num_computed_tokens=firsts.get(op[1], 0),
                    output_token_ids=[])
                if self.cross:
                    self.instance.requests[op[1]] = state  # _update_states keeps it there too
                batch.add_request(state)
            elif kind in ("move", "swap") and not condensed:
                batch.condense()
                condensed = True
            if kind == "swap":
                batch.swap_states(op[1], op[2])
        if not condensed:
            batch.condense()
        batch.refresh_metadata()  # _update_states ends with it (the batch update is consumed)

    def blocks(self) -> dict[str, list[list[int]]]:
        out = {}
        for req, row in self.batch.req_id_to_index.items():
            out[req] = [t.get_numpy_array()[row, : int(t.num_blocks_per_row[row])].tolist() for t in self.table.block_tables]
        return out

    def forward(self, step: Mapping[str, Any]) -> dict[str, Any]:
        import torch

        rows = self.batch.req_id_to_index
        for i, (req, _) in enumerate(step["batch"]):
            if rows.get(req) != i:
                # InputBatch put the request elsewhere than the schedule's rows: the
                # locations differ (reported), and this batch cannot be formed.
                raise _RowsDiffer(f"MRv1 batch position {i} is {req!r} but InputBatch holds it in row {rows.get(req)}")
        n, padded = len(step["batch"]), step["num_reqs_padded"]
        qsl, positions, _, _ = step_token_layout(step)
        self.table.commit_block_table(n)  # _prepare_inputs
        self.table.compute_slot_mapping(n, torch.tensor(qsl, dtype=torch.int32), torch.tensor(positions, dtype=torch.int64))
        slots_by_gid, _ = self.instance._get_slot_mappings(
            num_tokens_padded=step["num_tokens_padded"], num_reqs_padded=padded, num_tokens_unpadded=len(positions))
        tables = []
        for t in self.table.block_tables:
            # _build_attention_metadata._get_block_table
            blk = t.get_device_tensor(padded)
            blk[n:padded].fill_(NULL_BLOCK_ID)
            tables.append(blk)
        out = {
            "tables": [_tolist(t) for t in tables],
            "kernel_tables": _kernel_tables(self.entries, tables),
            "slot_mappings": [_tolist(slots_by_gid[g]) for g in range(self.num_groups)],
        }
        if self.cross:
            # _build_attention_metadata: per KV cache group, the runner's own encoder seq lens, asked with the KV
            # cache group's spec (a group of several cross specs would be a UniformTypeKVCacheSpecs there).
            scheduled = {req: len(pos) for req, pos in step["batch"]}
            groups = self.instance.kv_cache_config.kv_cache_groups
            out.update(_observed("cross_slot_mappings", "MRv1's cross-attention slots", lambda: _cross_slot_mappings(self.cross, out["kernel_tables"], step, {
                gid: self.instance._get_encoder_seq_lens(scheduled, groups[gid].kv_cache_spec, n)
                for gid, _, _ in self.cross})))
        if self.sc.get("draft") and self.drafter is not None:
            out.update(_observed("draft_steps", "MRv1 drafter's draft steps", lambda: self._draft_steps(step, tables, int(self.sc["draft"]["steps"]))))
        return out

    def _draft_steps(self, step: Mapping[str, Any], tables: Sequence[Any], count: int) -> list[dict[str, Any]]:
        """``count`` draft steps after this forward, as ``propose`` runs them for
        ``num_speculative_tokens = count + 1``: from the sampled tokens' positions (each
        request's last) and the common metadata the runner hands the drafter (its KV cache
        group's table from ``_build_attention_metadata``, the seq lens after the target's
        tokens), the drafter's own ``_update_positions_dependent_metadata`` with its own
        ``block_size`` and group, every step. None of the requests' tokens is rejected."""
        import torch

        drafter = self.drafter
        gid = int(drafter.kv_cache_gid)
        if not 0 <= gid < len(tables):
            return []
        last = last_positions(step)
        n = len(last)
        positions = torch.tensor(last, dtype=torch.int64)
        common = SimpleNamespace(block_table_tensor=tables[gid],
                                 seq_lens=torch.tensor([p + 1 for p in last], dtype=torch.int32),
                                 max_seq_len=max(last) + 1, seq_lens_cpu_upper_bound=None, slot_mapping=None)
        out = []
        for _ in range(count):
            positions = drafter._update_positions_dependent_metadata(positions, common, n, n, drafter.block_size)
            # What the draft layers write through (the forward context's slot mapping).
            given = drafter._get_slot_mapping(n)  # one view of the buffer for every draft layer
            out.append({"group": gid, "positions": _tolist(positions[:n]),
                        "slot_mapping": _tolist(next(iter(given.values()), common.slot_mapping[:n]))})
        return out


class _MRv2Schedule:
    """A scenario through MRv2's own request updates, ``BlockTables`` and ``prepare_attn``."""

    def __init__(self, instance, sc: Mapping[str, Any]) -> None:
        from vllm.v1.worker.gpu.lora_utils import LoraState

        self.instance, self.sc = instance, sc
        tables = instance.block_tables
        self.num_groups = int(tables.num_kv_cache_groups)
        self.widths = [int(t.gpu.shape[1]) for t in tables.block_tables]
        # 0.22 to 0.31: BlockTables stores each block id as its kernel block ids.
        self.ids_per_block = [int(r) for r in getattr(tables, "blocks_per_kv_block", [1] * self.num_groups)]
        self.block_sizes = [int(b) for b in tables.block_sizes]
        speculator = getattr(instance, "speculator", None)
        self.speculator = speculator if getattr(speculator, "block_tables", None) is not None else None
        self.entries = _attention_group_entries(getattr(instance, "attn_groups", None), "runner")
        self.entries += _attention_group_entries(getattr(speculator, "attn_groups", None), "drafter")
        self.cross = _cross_entries(self.entries)
        # What GPUModelRunner.__init__ sets and the request updates read; no pooling,
        # pipeline stages, prompt logprobs or sampler on this rank (not the last PP rank).
        for name, value in (("pooling_runner", None), ("pp_handler", None), ("prompt_logprobs_worker", None),
                            ("sampler", None), ("is_last_pp_rank", False), ("kv_block_zeroer", None),
                            ("lora_state", LoraState(max_num_reqs=int(instance.max_num_reqs)))):
            if not hasattr(instance, name):
                setattr(instance, name, value)
        self._num_computed: dict[str, int] = {}

    @property
    def locations(self) -> SimpleNamespace:
        return SimpleNamespace(of=dict(self.instance.req_states.req_id_to_index))

    def apply_step(self, step: Mapping[str, Any]) -> None:
        firsts = first_positions(step)
        last = {req: (pos[-1] if pos else 0) for req, pos in step["batch"]}
        new, cached_ids, cached_computed, cached_blocks = [], [], [], []
        finished, preempted = set(), set()
        for op in step["ops"]:
            kind, req = op[0], op[1]
            if kind == "remove":
                finished.add(req)
            elif kind == "preempt":
                preempted.add(req)
            elif kind == "add":
                start = firsts.get(req, 0)
                tokens = [0] * max(1, last.get(req, 0) + 1)
                new.append(SimpleNamespace(
                    req_id=req, prompt_token_ids=tokens, prefill_token_ids=tokens, prompt_len=len(tokens),
                    mm_features=_encoder_features(req, self.sc["encoder_lens"]), sampling_params=None,
                    pooling_params=None, block_ids=tuple(list(i) for i in op[2]),
                    num_computed_tokens=start, lora_request=None, prompt_embeds=None))
            elif kind == "append":
                cached_ids.append(req)
                cached_computed.append(firsts.get(req, 0))
                cached_blocks.append(tuple(list(i) for i in op[2]))
        for req in firsts:  # scheduled again without new blocks
            if req not in cached_ids and all(n.req_id != req for n in new):
                cached_ids.append(req)
                cached_computed.append(firsts[req])
                cached_blocks.append(None)
        out = SimpleNamespace(
            finished_req_ids=finished, preempted_req_ids=preempted, scheduled_new_reqs=new,
            scheduled_cached_reqs=SimpleNamespace(req_ids=cached_ids, num_computed_tokens=cached_computed,
                                                  new_block_ids=cached_blocks),
            new_block_ids_to_zero=None, kv_cache_block_copies=None, free_encoder_mm_hashes=[],
            block_table_updates=None,  # SchedulerOutput's default (0.30/0.31 read it: whole-row overwrites)
        )
        runner = self.instance
        # execute_model's order (gpu/model_runner.py).
        runner.finish_requests(out)
        runner.free_states(out)
        runner.add_requests(out)
        runner.update_requests(out)
        runner.block_tables.apply_staged_writes()

    def blocks(self) -> dict[str, list[list[int]]]:
        tables = self.instance.block_tables
        out = {}
        for req, slot in self.instance.req_states.req_id_to_index.items():
            out[req] = [_tolist(tables.block_tables[g].gpu[slot, : int(tables.num_blocks.np[g, slot])])
                        for g in range(self.num_groups)]
        return out

    def forward(self, step: Mapping[str, Any]) -> dict[str, Any]:
        import torch

        runner = self.instance
        index = runner.req_states.req_id_to_index
        idx = [index[req] for req, _ in step["batch"]]
        # What postprocess leaves after the previous step: each scheduled request's
        # computed tokens on the device (gather nulls sliding-window entries below them).
        for req, first in first_positions(step).items():
            runner.req_states.num_computed_tokens.gpu[index[req]] = first
        qsl, positions, _, _ = step_token_layout(step)
        batch = SimpleNamespace(
            idx_mapping=torch.tensor(idx, dtype=torch.int32),
            num_reqs_after_padding=step["num_reqs_padded"],
            query_start_loc=torch.tensor(qsl, dtype=torch.int32),
            positions=torch.tensor(positions, dtype=torch.int64),
            num_tokens_after_padding=step["num_tokens_padded"],
        )
        tables, slots = runner.prepare_attn(batch)
        out = {
            "tables": [_tolist(t) for t in tables],  # copies: the buffers are reused next step
            "kernel_tables": _kernel_tables(self.entries, tables),
            "slot_mappings": _tolist(slots),
        }
        if self.cross:
            # EncoderDecoderModelState.prepare_attn: the encoder seq lens of the cross groups.
            out.update(_observed("cross_slot_mappings", "MRv2's cross-attention slots", lambda: _cross_slot_mappings(
                self.cross, out["kernel_tables"], step,
                runner.model_state._get_encoder_seq_lens([req for req, _ in step["batch"]], runner.attn_groups, False,
                                                         len(step["batch"])))))
        if self.sc.get("draft") and self.speculator is not None:
            out.update(_observed("draft_steps", "MRv2 speculator's draft steps", lambda: self._draft_steps(step, idx, int(self.sc["draft"]["steps"]))))
        return out

    def _draft_steps(self, step: Mapping[str, Any], idx: Sequence[int], count: int) -> list[dict[str, Any]]:
        """``count`` draft steps after this forward, through the speculator's own
        ``propose`` tail for ``num_speculative_steps = count + 1``: what its ``_prefill``
        leaves (the last tokens' positions, the batch's request slots),
        ``prepare_decode_inputs``, then its own multi-step decode (fused or not, as
        ``propose`` picks) over the runner's ``BlockTables`` it was given in ``set_attn``,
        its ``update_draft_inputs`` advancing the positions. The draft model's forward,
        its sampling and its attention builders' metadata are not there (no checkpoint is
        loaded): stand-ins that record the slot mapping of each forward's draft layers.
        None of the requests' tokens is rejected."""
        import torch

        # Optional imports (gpu_impl.vllm_api skips imports under an ImportError handler): releases
        # before 0.33 keep their speculators elsewhere, and _observed says so, per step.
        try:
            from vllm.config.compilation import CUDAGraphMode
            from vllm.v1.worker.gpu.input_batch import InputBuffers
            from vllm.v1.worker.gpu.spec_decode.target_dependent_ar import speculator as ar
        except ImportError:
            raise

        spec, runner = self.speculator, self.instance
        layers = sorted(spec.draft_attn_layer_names)
        gid = next((g for g, group in enumerate(spec.kv_cache_config.kv_cache_groups)
                    if set(layers) & set(group.layer_names)), None)
        if gid is None:
            return []
        n, hidden = len(idx), 8
        last = last_positions(step)
        # What DraftModelSpeculator / TargetDependentARSpeculator.__init__ allocate, for
        # count + 1 speculative steps and a hidden size of ``hidden``.
        spec.input_buffers = InputBuffers(max_num_reqs=int(spec.max_num_reqs), max_num_tokens=int(spec.max_num_tokens),
                                          device=runner.device)
        spec.idx_mapping = torch.zeros(int(spec.max_num_reqs), dtype=torch.int64)
        spec.draft_tokens = torch.zeros(int(spec.max_num_reqs), count + 1, dtype=torch.int64)
        spec.sample_src_positions = torch.zeros(int(spec.max_num_reqs), dtype=torch.int64)
        spec.hidden_states = torch.zeros(int(spec.max_num_tokens), hidden)
        spec.current_draft_step = torch.tensor(0, dtype=torch.int64)
        spec.temperature = torch.zeros(int(spec.max_num_reqs))
        spec.seeds = torch.zeros(int(spec.max_num_reqs), dtype=torch.int64)
        spec.num_speculative_steps = count + 1
        for name, value in (("draft_logits", None), ("eplb_state", None), ("decode_cudagraph_manager", None)):
            setattr(spec, name, value)
        # _prefill's state: each request's slot and its last token's position.
        spec.idx_mapping[:n] = torch.tensor(list(idx), dtype=torch.int64)
        spec.input_buffers.positions[:n] = torch.tensor(last, dtype=torch.int64)
        seen: list[dict[str, Any]] = []

        def draft_forward(num_tokens, attn_metadata, slot_mappings, *args, **kwargs):
            mapping = (slot_mappings or {}).get(layers[0])
            seen.append({"group": gid, "positions": _tolist(spec.input_buffers.positions[:n]),
                         "slot_mapping": None if mapping is None else _tolist(mapping[:n])})
            out = torch.zeros(num_tokens, hidden)
            return out, out

        spec._run_model = draft_forward
        spec.sample_draft = lambda hidden_states, *args, **kwargs: torch.zeros(hidden_states.shape[0], dtype=torch.int64)
        spec._build_uniform_attn_metadata = lambda **kwargs: {}
        spec._update_draft_decode_metadata = lambda attn_metadata, num_reqs: None
        try:
            ar.prepare_decode_inputs(spec.draft_tokens[:n, 0], torch.tensor([p + 1 for p in last], dtype=torch.int32),
                                     torch.zeros(n, dtype=torch.int32), spec.input_buffers, spec.sample_src_positions,
                                     int(spec.max_model_len), int(spec.max_num_reqs),
                                     advance_draft_positions=spec.advance_draft_positions)
            decode = (spec._fused_multi_step_decode if getattr(spec, "supports_decode_metadata_update", False)
                      else spec._multi_step_decode)
            batch_desc = SimpleNamespace(num_tokens=n, cg_mode=CUDAGraphMode.NONE)
            decode(n, False, batch_desc, None, torch.tensor([p + 1 + count for p in last], dtype=torch.int32), count + 1)
        finally:
            for name in ("_run_model", "sample_draft", "_build_uniform_attn_metadata", "_update_draft_decode_metadata"):
                vars(spec).pop(name, None)
        return seen


def _observed(key: str, what: str, run) -> dict[str, Any]:
    """``{key: run()}``, or, where this release's runner, drafter or cross-attention builder has
    other methods than the driver calls (an older or newer vLLM), ``{key + "_unsupported": why}``
    (``what`` names the part not reached): the step's own tables and slots are still observed
    and judged."""
    try:
        return {key: run()}
    except (AttributeError, TypeError, ImportError) as exc:
        return {f"{key}_unsupported": f"{what} not reachable: {type(exc).__name__}: {exc}"}


def _fits(sc: Mapping[str, Any], num_groups: int, instance, block_sizes: Sequence[int] = ()) -> str | None:
    if len(sc["groups"]) != num_groups:
        return f"the schedule has {len(sc['groups'])} KV cache groups, the runner's block tables {num_groups}"
    planned = [g["block_size"] for g in sc["groups"]]
    if block_sizes and list(block_sizes) != planned:
        # The schedule was drawn for other groups than this release built (a release the
        # reference has no facts for): its block ids would not cover its tokens here.
        return f"the schedule's groups have {planned}-token blocks, the runner's block tables {list(block_sizes)}"
    if sc["max_num_reqs"] > int(instance.max_num_reqs):
        return f"the schedule needs {sc['max_num_reqs']} requests, the runner holds {instance.max_num_reqs}"
    if sc["max_num_batched_tokens"] > int(instance.max_num_tokens):
        return f"the schedule needs {sc['max_num_batched_tokens']} tokens per step, the runner {instance.max_num_tokens}"
    return None


def run_schedule(runner: str, instance, scenario: Mapping[str, Any]) -> Result:
    """One scenario through ``instance``'s own block tables (state accumulates: run each
    scenario on a freshly initialised runner). ``widths``, ``ids_per_block`` (per group, how
    many ids a row stores per block id: its kernel blocks before 0.32, else 1) and per step ``locations``,
    ``blocks``, and for a step with a batch ``tables``, ``kernel_tables`` (one entry
    per attention group: its KV cache group, layers and rows) and ``slot_mappings``;
    ``error`` when vLLM raised; ``does_not_fit`` when the runner cannot hold it."""
    sc = normalize_scenario(scenario)
    cls = _MRv1Schedule if runner == "mrv1" else _MRv2Schedule
    try:
        driver = cls(instance, sc)
    except (AttributeError, TypeError) as exc:
        return {"name": sc["name"], "unsupported": f"{runner.upper()} block tables not reachable: {type(exc).__name__}: {exc}"}
    why = _fits(sc, driver.num_groups, instance, driver.block_sizes)
    if why is not None:
        return {"name": sc["name"], "does_not_fit": why}
    out: Result = {"name": sc["name"], "widths": list(driver.widths), "ids_per_block": list(driver.ids_per_block),
                   "steps": []}
    for i, step in enumerate(sc["steps"]):
        try:
            driver.apply_step(step)
            obs = observe_tables(driver, step)
        except ScenarioError:
            raise
        except _RowsDiffer as exc:
            out["steps"].append(observe_tables(driver))
            out["error"] = {"step": i, "message": str(exc)}
            break
        except _VLLM_ERRORS as exc:
            if os.environ.get("KVCONFORM_DEBUG"):
                import traceback

                traceback.print_exc()
            out["error"] = {"step": i, "message": f"{type(exc).__name__}: {exc}"}
            break
        except (AttributeError, TypeError) as exc:  # a changed runner API: say so
            return {"name": sc["name"], "unsupported": f"{runner.upper()} step {i}: {type(exc).__name__}: {exc}"}
        except Exception as exc:
            if type(exc).__name__ != "InterpreterError":
                raise
            # The release's Triton kernel does not run under this Triton's CPU interpreter
            # (e.g. vLLM 0.32's _apply_write_kernel with a newer Triton): not vLLM's verdict.
            return {"name": sc["name"], "unsupported": f"{runner.upper()} step {i}: its Triton kernel does not run in the "
                                                       f"Triton interpreter here: {exc}"}
        out["steps"].append(obs)
    return out


__all__ = ["prepare_process_env", "run_schedule", "schedule_support"]
