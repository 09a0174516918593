"""The target release's ``DecodeBenchConnector`` driven on CPU, as a connector adapter (fill only).

DecodeBench moves no KV: it *writes* benchmark values into each new request's blocks
(``_fill_block_tensor``: ``kv_cache[block_ids] = values``, dim 0 taken as the block id). Its
scheduler and worker sides run end to end for a one-block request; nothing is faked (the fill
is torch indexing on the registered tensors). ``descriptors(layer, b)`` are the pool bytes
each layer's fill call wrote for logical block ``b``, seen by running it over ``0x00`` and
then ``0xff`` bytes; there is no store or load to round-trip (``fill_only``). Findings:
docs/findings/decode-bench-logical-ids-on-kernel-blocks.md.
"""

from __future__ import annotations

import contextlib
import functools
from types import SimpleNamespace
from typing import Any, Iterator, Mapping
from unittest import mock

from gpu_impl.connectors.base import BuiltInAdapter, Ranges, Undrivable
from gpu_impl.connectors.vllm_setup import case_plan, use_transfer_config

_BACKGROUNDS = (0, -1)
"""Pool bytes the fill runs over (int8 ``0x00`` and ``0xff``)."""


def _runs(mask) -> list[tuple[int, int]]:
    """``(start, end)`` runs of True in a flat bool array."""
    import numpy as np

    idx = np.flatnonzero(mask)
    if idx.size == 0:
        return []
    breaks = np.flatnonzero(idx[1:] != idx[:-1] + 1)
    starts = np.concatenate([idx[:1], idx[breaks + 1]]).tolist()
    ends = (np.concatenate([idx[breaks], idx[-1:]]) + 1).tolist()
    return list(zip(starts, ends))


def _extent(t: Any, base: int) -> tuple[int, int]:
    """Pool offsets ``[first, last + 1)`` of the bytes a tensor view can address."""
    last = sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
    start = t.data_ptr() - base
    return start, start + (last + 1) * t.element_size()


class DecodeBenchAdapter(BuiltInAdapter):
    """``validate_registration`` adapter around the real DecodeBench scheduler and worker."""

    connector = "DecodeBenchConnector"
    vllm_module = "vllm.distributed.kv_transfer.kv_connector.v1.decode_bench_connector"

    fill_only = True
    """The connector only writes benchmark values into blocks: no store or load to round-trip."""

    def init_state(self) -> None:
        self.scheduler: Any = None
        self.worker: Any = None
        self.caches: dict[str, Any] = {}
        self._pool: Any = None
        self._written: dict[int, dict[str, list[tuple[int, int]]]] = {}
        self._requests = 0

    @contextlib.contextmanager
    def _config(self) -> Iterator[tuple[Any, Any]]:
        """The case's VllmConfig and KVCacheConfig, with this connector as the transfer config."""
        with contextlib.ExitStack() as stack:
            plan = case_plan(self.ctx, stack)
            use_transfer_config(stack, plan.vllm_config, kv_connector=self.connector, kv_role="kv_both")
            yield plan.vllm_config, plan.kv_cache_config

    def register(self, kv_caches: Mapping[str, Any]) -> None:
        import torch
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        from vllm.distributed.kv_transfer.kv_connector.v1.decode_bench_connector import DecodeBenchConnector

        self.caches = dict(kv_caches)
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage() for t in self.caches.values()}
        if len(storages) != 1:
            raise Undrivable(f"the fill is observed on one shared pool; these tensors use {len(storages)} storages")
        self._pool = torch.empty(0, dtype=torch.int8).set_(next(iter(storages.values())))
        with self._config() as (vc, kcc):
            self.scheduler = DecodeBenchConnector(vc, KVConnectorRole.SCHEDULER, kcc)
            self.worker = DecodeBenchConnector(vc, KVConnectorRole.WORKER, kcc)
            self.worker.register_kv_caches(self.caches)
        self._written.clear()

    # --- one request's fill -----------------------------------------------------------------------

    def _request_meta(self, block_id: int) -> Any:
        """The scheduler side's metadata for a new request holding block ``block_id`` in every group."""
        from vllm.v1.core.kv_cache_utils import KVCacheBlock

        sched = self.scheduler.connector_scheduler
        self._requests += 1
        request = SimpleNamespace(request_id=f"kvconform-{self._requests}", num_tokens=min(sched.group_block_sizes) + 1)
        n_tokens, _ = self.scheduler.get_num_new_matched_tokens(request, 0)
        blocks = SimpleNamespace(blocks=tuple([KVCacheBlock(block_id)] for _ in sched.kv_cache_groups))
        self.scheduler.update_state_after_alloc(request, blocks, n_tokens)
        meta = self.scheduler.build_connector_meta(None)
        self.scheduler.request_finished(request, [block_id])
        return meta

    def _fill(self, block_id: int) -> dict[str, list[tuple[int, int]]]:
        """Pool byte runs (offsets) each layer's fill call wrote for logical block ``block_id``."""
        import numpy as np

        worker = self.worker.connector_worker
        # Observed in numpy over the pool's own memory (single-threaded: far cheaper than
        # torch's small ops on a busy machine); the fill itself is the connector's torch code.
        pool = self._pool.numpy()
        # A fill call indexes one registered view, so it can only write inside that view's
        # byte extent: each call is diffed there (much less than the pool for most layouts).
        window: dict[int, tuple[int, int]] = {}
        names: dict[int, list[str]] = {}
        for name, t in self.caches.items():
            window[id(t)] = _extent(t, self._pool.data_ptr())
            names.setdefault(id(t), []).append(name)
        masks = {name: np.zeros(window[id(t)][1] - window[id(t)][0], dtype=bool) for name, t in self.caches.items()}
        fill = worker._fill_block_tensor

        def observed(background: int, kv_cache, *args: Any, **kwargs: Any) -> None:
            a, z = window[id(kv_cache)]
            # A fresh background for each call: aliased layers (HMA groups from byte 0)
            # must not hide bytes an earlier layer's call wrote with the same value.
            pool[a:z] = background
            fill(kv_cache, *args, **kwargs)
            changed = pool[a:z] != background
            for name in names[id(kv_cache)]:
                masks[name] |= changed

        meta = self._request_meta(block_id)
        original = pool.copy()
        try:
            for background in _BACKGROUNDS:
                with mock.patch.object(worker, "_fill_block_tensor", functools.partial(observed, background)):
                    self.worker.bind_connector_metadata(meta)
                    self.worker.start_load_kv(None)
                    self.worker.clear_connector_metadata()
        finally:
            pool[:] = original
        out: dict[str, list[tuple[int, int]]] = {}
        for name, mask in masks.items():
            start = window[id(self.caches[name])][0]
            out[name] = [(start + a, start + z) for a, z in _runs(mask)]
        return out

    def descriptors(self, layer: str, block_id: int) -> Ranges:
        if block_id not in self._written:
            self._written[block_id] = self._fill(block_id)
        base = self._pool.data_ptr()
        return [(base + a, z - a) for a, z in self._written[block_id][layer]]


__all__ = ["DecodeBenchAdapter"]
