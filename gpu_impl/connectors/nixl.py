"""The target release's ``NixlConnectorWorker`` (pull) driven on CPU, as a connector adapter.

Its own ``__init__``, ``_sync_block_size_with_kernel`` and ``register_kv_caches`` run on the
case as vLLM plans it (``vllm_setup.plan_case``); NIXL itself, the platform, the TP world and
the handshake are faked, as upstream's ``tests/v1/kv_connector/unit`` does. Descriptors are
NIXL's: region ``i``, kernel block ``k`` -> ``[base_i + k * block_stride_i, + block_len_i)``,
logical ids expanded by the worker's own ``_logical_to_kernel_block_ids``. Findings:
docs/findings/nixl-blhnc-hybrid-group-block-len.md.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Any, Mapping
from unittest import mock

from gpu_impl.connectors.base import Ranges, TransferWorkerAdapter
from gpu_impl.connectors.vllm_setup import plan_case, set_until_exit, use_transfer_config
from gpu_impl.vllm_cpu import shims


class RecordingNixl:
    """Stands in for ``nixl._api.nixl_agent``: records what the worker registers."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.registered: list[Any] = []
        self.dlists: list[Any] = []

    def get_reg_descs(self, ranges, mem_type):
        return (list(ranges), mem_type)

    def register_memory(self, descs, backends=None):
        self.registered.append(descs)

    def deregister_memory(self, descs):
        pass

    def get_xfer_descs(self, data, mem_type=None):
        return (data, mem_type)

    def prep_xfer_dlist(self, agent, descs, *args, **kwargs):
        self.dlists.append(descs)
        return len(self.dlists)

    def get_agent_metadata(self):
        return b"agent"

    def __getattr__(self, name):  # anything else the worker pokes: a harmless no-op
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *a, **k: None


class NixlAdapter(TransferWorkerAdapter):
    """``validate_registration`` adapter around the real NIXL pull worker."""

    worker_path = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.worker:NixlConnectorWorker"

    requires_vllm_driver = "nixl"
    connector = "NixlConnector"
    case_connector = "nixl"

    def register(self, kv_caches: Mapping[str, Any]) -> None:
        from vllm.distributed.kv_transfer.kv_connector.v1.nixl import base_worker as bw
        from vllm.distributed.kv_transfer.kv_connector.v1.nixl.worker import NixlConnectorWorker

        with contextlib.ExitStack() as stack:
            # NIXL's 3-read Mamba conv transfer needs the DS conv-state layout, a process-wide switch a
            # deployment sets before the model is built: the layers are built (planned) under it too.
            stack.enter_context(shims.conv_state_layout("DS"))
            # Under PCP the worker reads its rank in the PCP group (base_worker: pcp_rank).
            stack.enter_context(shims.prefill_context_parallel_group(
                getattr(self.ctx.case, "prefill_context_parallel_size", 1)))
            plan = plan_case(self.ctx.case, self.ctx.runner, stack)
            vc, kcc = plan.vllm_config, plan.kv_cache_config
            use_transfer_config(stack, vc, kv_connector="NixlConnector", kv_role="kv_both", kv_buffer_device="cuda")
            set_until_exit(stack, vc.cache_config, "kv_cache_layout", plan.layout_name)
            vc.model_config.enable_sleep_mode = False
            vc.model_config.get_total_num_kv_heads = vc.model_config.get_num_kv_heads
            be, sp = plan.attention_backends_and_specs()
            platform = SimpleNamespace(device_type="cuda", get_nixl_memory_type=lambda: "VRAM")
            fakes = {
                "NixlWrapper": RecordingNixl,
                "nixl_agent_config": None,
                "check_nixl_version": lambda *a, **k: None,  # 0.33 on
                "current_platform": platform,
                "get_tensor_model_parallel_rank": lambda: 0,
                "get_tensor_model_parallel_world_size": lambda: 1,
                "get_current_attn_backends": lambda *a, **k: be,
                "get_current_attn_backends_and_specs": lambda *a, **k: (be, sp),
                "TransferTopology": mock.MagicMock(),
                "compute_nixl_compatibility_hash": lambda *a, **k: "kvconform",
            }
            # Only what the installed release's worker module has (a release without one
            # of them does not call it).
            patches = [mock.patch.object(bw, name, value) for name, value in fakes.items() if hasattr(bw, name)]
            for pt in patches:
                stack.enter_context(pt)
            worker = NixlConnectorWorker(vc, "kvconform-engine", kcc)
            stack.callback(worker._handshake_initiation_executor.shutdown, wait=False)
            worker.register_kv_caches(dict(kv_caches))
        self.worker = worker
        self.caches = dict(kv_caches)
        self.kcc = kcc

    # --- what NIXL derived -------------------------------------------------------------------

    def _regions_of(self, layer: str) -> list[int]:
        """Region indices holding ``layer``, the way ``register_kv_caches`` chose them.

        Exact base (one region per layer, deduped aliases), else the packed whole-row
        region at the storage base, else the per-head segments inside the layer's view.
        """
        w = self.worker
        bases = w.kv_caches_base_addr[w.engine_id][w.tp_rank]
        members = getattr(w, "region_members", None) or []
        tracked = [i for i, names in enumerate(members) if layer in names]
        if tracked:
            return tracked
        t = self.caches[layer]
        # regions this layer created (LHBNC: one per head segment), or deduped onto (aliases)
        names = getattr(w, "region_names", None)  # 0.30 on; 0.29's regions are found by address
        named = [i for i, n in enumerate(names or ()) if n == layer]
        exact = [i for i, b in enumerate(bases) if b == t.data_ptr()]
        if exact and names is None:
            # 0.29 names no regions: a layer it split into per-head segments (LHBNC) owns every
            # region of its stride that starts inside its view.
            lo, hi, stride = t.data_ptr(), t.data_ptr() + t.nbytes, w.block_stride_per_layer[exact[0]]
            exact = [i for i, b in enumerate(bases) if lo <= b < hi and w.block_stride_per_layer[i] == stride]
        if named or exact:
            return sorted(set(named) | set(exact))
        storage = t.untyped_storage().data_ptr()
        row = [i for i, b in enumerate(bases) if b == storage and w.block_len_per_layer[i] == w.block_stride_per_layer[i]]
        if row:
            return row
        lo, hi = t.data_ptr(), t.data_ptr() + t.nbytes
        return [i for i, b in enumerate(bases) if lo <= b < hi]

    def _kernel_id_args(self) -> tuple[Any, ...]:
        return (self.worker._physical_blocks_per_logical_kv_block,)

    def _is_state_layer(self, layer: str) -> bool:
        return any(l.name == layer and l.kind == "mamba" for l in self.ctx.case.layers)

    def _state_split(self) -> int:
        """Sub-blocks NIXL registers a state page in: the attention kernel split (a state page itself is
        never split: its transfers are whole-page strided descriptors, ``_build_mamba_local``)."""
        return max(int(getattr(self.worker, "_physical_blocks_per_logical_kv_block", 1) or 1), 1)

    def _state_descriptors(self, block_id: int) -> dict[int, Ranges] | None:
        """Per region, NIXL's own descriptors of logical block ``block_id`` of a state layer: the conv
        sub-projections and the SSM state ``_build_mamba_local`` builds (``(addr, len, dev, stride,
        count)`` rows: block ``b`` is ``addr + b * stride``), or None where this release builds none."""
        w = self.worker
        build = getattr(w, "_build_mamba_local", None)
        if build is None or getattr(w, "_conv_decomp", None) is None:
            return None
        bases = w.kv_caches_base_addr[w.engine_id][w.tp_rank]
        rows = [tuple(int(x) for x in row) for row in build(list(bases))]
        if not rows or len(rows[0]) != 5:
            # Before the strided (addr, len, dev, stride, count) rows (0.30: one (addr, len, dev) row per
            # block), its state descriptors are not read here: the registered regions stand for them.
            return None
        regions = list(w._ssm_region_indices or range(len(bases)))
        per_region = len(w._conv_decomp.local_conv_offsets) + 1  # each conv sub-projection, then the SSM state
        out: dict[int, Ranges] = {}
        for n, region in enumerate(regions):
            chunk = rows[n * per_region:(n + 1) * per_region]
            out[region] = [(addr + block_id * stride, length) for addr, length, _dev, stride, _count in chunk]
        return out

    def descriptors(self, layer: str, block_id: int) -> Ranges:
        w = self.worker
        bases = w.kv_caches_base_addr[w.engine_id][w.tp_rank]
        out: Ranges = []
        states = self._state_descriptors(block_id) if self._is_state_layer(layer) else None
        for i in self._regions_of(layer):
            if states is not None and i in states:
                out.extend(states[i])
                continue
            for k in self._kernel_ids(layer, block_id):
                out.append((bases[i] + k * w.block_stride_per_layer[i], w.block_len_per_layer[i]))
        return out

    def block_len(self, layer: str) -> int:
        """Bytes per kernel block over the layer's regions (LHBNC: one segment per head); a state
        layer's per state page (NIXL registers its region in kernel-split sub-blocks)."""
        split = self._state_split() if self._is_state_layer(layer) else 1
        return sum(self.worker.block_len_per_layer[i] for i in self._regions_of(layer)) * split

    def num_blocks(self, layer: str) -> int:
        count = self._region_blocks(layer)
        return count // self._state_split() if self._is_state_layer(layer) else count

    def _region_blocks(self, layer: str) -> int:
        w = self.worker
        regions = self._regions_of(layer)
        if not regions:
            return 0
        per_region = getattr(w, "region_num_blocks", None)
        if per_region is not None:
            return per_region[regions[0]]
        # 0.29 keeps no per-region count: register_kv_caches sizes a Mamba region by the
        # logical blocks and every other region by the (kernel-expanded) worker's count.
        return w._logical_num_blocks if regions[0] in w._ssm_region_indices else w.num_blocks


__all__ = ["NixlAdapter", "RecordingNixl"]
