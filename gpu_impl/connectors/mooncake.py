"""The target release's ``MooncakeConnectorWorker`` registration driven on CPU, as a connector adapter.

Built as upstream's unit tests build it (``__new__`` plus the attributes ``register_kv_caches``
reads: no threads, sockets or bootstrap server) with a recording ``TransferEngine``; its own
``_sync_block_size_with_kernel`` and ``register_kv_caches`` run. Descriptors are Mooncake's:
region ``i``, kernel block ``k`` -> ``[base_i + k * block_len_i, + kv_block_len_i)``
(``_build_transfer_params``).
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from typing import Any, Mapping
from unittest import mock

from gpu_impl.connectors.base import Ranges, TransferWorkerAdapter, stand_in
from gpu_impl.connectors.vllm_setup import plan_case, set_until_exit


class RecordingTransferEngine:
    """Mooncake's ``TransferEngine`` (an RDMA service): records what is registered."""

    def __init__(self) -> None:
        self.registered: list[tuple[list[int], list[int]]] = []

    def initialize(self, *args: Any) -> int:  # the worker's own __init__ calls it (generation 1)
        return 0

    def get_rpc_port(self) -> int:
        return 0

    def batch_register_memory(self, ptrs, lens):
        self.registered.append((list(ptrs), list(lens)))
        return 0

    def batch_unregister_memory(self, ptrs):
        return 0


class MooncakeAdapter(TransferWorkerAdapter):
    """``validate_registration`` adapter around the real Mooncake P2P worker's registration."""

    requires_vllm_driver = "mooncake"
    connector = "MooncakeConnector"
    case_connector = "mooncake"

    def register(self, kv_caches: Mapping[str, Any]) -> None:
        from vllm.distributed.kv_transfer.kv_connector.v1.mooncake import mooncake_connector as mc

        class _Worker(mc.MooncakeConnectorWorker):
            def __del__(self):  # no threads or sockets were started
                pass

        with contextlib.ExitStack() as stack:
            plan = plan_case(self.ctx.case, self.ctx.runner, stack)
            vc, kcc = plan.vllm_config, plan.kv_cache_config
            set_until_exit(stack, vc.cache_config, "kv_cache_layout", plan.layout_name)
            # Mooncake, unlike NIXL, starts its kernel-block derivation from the block size:
            # the reference's post-planning value.
            set_until_exit(stack, vc.cache_config, "block_size", self.ctx.block_size)
            be, sp = plan.attention_backends_and_specs()
            stack.enter_context(mock.patch.object(mc, "get_current_attn_backends", lambda *a, **k: be))
            if hasattr(mc, "get_current_attn_backends_and_specs"):  # 0.31 on
                stack.enter_context(mock.patch.object(mc, "get_current_attn_backends_and_specs",
                                                      lambda *a, **k: (be, sp)))
            w = stand_in(_Worker)
            w.vllm_config = vc
            w.engine = RecordingTransferEngine()
            w.engine_id = "kvconform-engine"
            w.tp_rank, w.tp_size = 0, 1
            w.is_kv_producer, w.is_kv_consumer = False, True
            w.block_size = vc.cache_config.block_size
            w.model_config = vc.model_config
            w.cache_config = vc.cache_config
            w.kv_cache_config = kcc
            w.use_mla = vc.model_config.use_mla
            w._is_hma_required = len(kcc.kv_cache_groups) > 1
            w._physical_blocks_per_logical_kv_block = 1
            w._prepared_transfer_regions = {}
            w._layout_by_peer = OrderedDict()
            w._acked_layout_peers = set()
            w._kv_layout_id = 0
            w._kv_unregistered = False
            w.kv_caches_base_addr = []
            w.seen_base_addresses = []
            w._kv_data_lens = []
            w.device_kv_caches = {}
            w._layer_specs = {}
            for group in kcc.transfer_groups:
                by_layer = getattr(group.kv_cache_spec, "kv_cache_specs", {})
                for name in group.layer_names:
                    w._layer_specs[name] = by_layer.get(name, group.kv_cache_spec)
            # 0.29's register_kv_caches records each region's group from this map, which its
            # __init__ builds over the KV cache groups (later releases read the group elsewhere).
            w._layer_group_indices = {name: index for index, group in enumerate(kcc.kv_cache_groups)
                                      for name in group.layer_names}
            w._sync_block_size_with_kernel()
            w.attn_backends = be
            w.register_kv_caches(dict(kv_caches))
        self.worker = w
        self.caches = dict(kv_caches)

    def _regions_of(self, layer: str) -> list[int]:
        w = self.worker
        named = [i for i, n in enumerate(w.registered_layer_names) if n == layer]
        if named:
            return named
        t = self.caches[layer]

        def folded(candidates: list[int]) -> list[int]:
            # A packed row folded into a sibling's region (register_kv_caches dedupes by (base, block stride,
            # kv_block_len)): that sibling's region, not every region that happens to start where it does (other
            # groups' layers overlay the same row from the same offset).
            return [i for i in candidates if (n := w.registered_layer_names[i]) in self.caches
                    and self.caches[n].shape == t.shape and self.caches[n].stride() == t.stride()]

        exact = [i for i, b in enumerate(w.kv_caches_base_addr) if b == t.data_ptr()]
        if exact:
            return folded(exact) or exact
        storage = t.untyped_storage().data_ptr()
        at_storage = [i for i, b in enumerate(w.kv_caches_base_addr) if b == storage]
        return folded(at_storage) or at_storage

    def descriptors(self, layer: str, block_id: int) -> Ranges:
        w = self.worker
        out: Ranges = []
        for i in self._regions_of(layer):
            for k in self._kernel_ids(layer, block_id):
                out.append((w.kv_caches_base_addr[i] + k * w.block_len_per_layer[i], w.kv_block_len_per_layer[i]))
        return out

    def block_len(self, layer: str) -> int:
        return sum(self.worker.kv_block_len_per_layer[i] for i in self._regions_of(layer))


__all__ = ["MooncakeAdapter", "RecordingTransferEngine"]
