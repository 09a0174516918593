"""The target release's ``SimpleCPUOffloadConnector`` (worker role) driven on CPU, as a connector adapter.

Its own constructor, ``register_kv_caches`` (``[num_blocks, block_stride]`` regions over the
raw storage, the CPU cache sized from ``cpu_bytes_to_use`` = the GPU pool's size), the DMA
backend's ``copy_blocks`` and the store / load path (``wait_for_save``, ``start_load_kv``,
the backend's ``_copy_loop`` run on the calling thread) run. Faked, hardware only:
``cuMemcpyBatchAsync`` (each descriptor through ``CopyEngine.copy``), CUDA streams and
events, pinning (the host cache is ``engine.host_buffer`` memory, so ``store`` re-runs the
registration once the round trip's engine exists) and ``set_device``. A store uses CPU
blocks ``0 .. n-1`` (the scheduler's choice, not run). The connector never splits blocks.
"""

from __future__ import annotations

import contextlib
import ctypes
import types
from typing import Any, Callable, Iterator, Mapping
from unittest import mock

from gpu_impl.connectors.base import BuiltInAdapter, Ranges, Undrivable
from gpu_impl.connectors.cuda_stand_ins import SyncEvent, SyncStream
from gpu_impl.connectors.vllm_setup import case_plan, use_transfer_config

_REQUEST = "kvconform"
"""The request id a load reports back (``load_event_to_reqs``)."""


class _InlineThread:
    """``threading.Thread`` for the copy backend: holds the loop for the adapter's ``_drain``."""

    def __init__(self, target: Callable[..., None], args: tuple, daemon: bool | None = None) -> None:
        self.target, self.args = target, args

    def start(self) -> None:
        pass

    def join(self, timeout: float | None = None) -> None:
        pass


class _BatchMemcpy:
    """``cuMemcpyBatchAsync``: hands each ``(src, dst, nbytes)`` descriptor to ``sink``."""

    def __init__(self) -> None:
        self.sink: Callable[[int, int, int], None] | None = None

    def __call__(self, dsts, srcs, sizes, count, attrs, attrs_idx, num_attrs, fail_idx, stream) -> int:
        if self.sink is None:
            raise RuntimeError("kvconform: a copy was issued outside a transfer")

        def read(address: int) -> list[int]:
            return list((ctypes.c_uint64 * count).from_address(address))

        for dst, src, nbytes in zip(read(dsts), read(srcs), read(sizes)):
            self.sink(int(src), int(dst), int(nbytes))
        return 0


class _TorchProxy(types.ModuleType):
    """``torch`` as the worker and backend modules see it: CUDA streams/events faked, and
    CPU ``zeros`` (the pinned host cache) from ``host_alloc`` when one is bound."""

    def __init__(self) -> None:
        import torch

        super().__init__("torch")
        self._torch = torch
        self.host_alloc: Callable[[int], Any] | None = None
        self.cuda = types.SimpleNamespace(Stream=SyncStream, current_stream=lambda *a, **k: SyncStream())
        self.Event = SyncEvent

    def __getattr__(self, name: str) -> Any:
        return getattr(self._torch, name)

    def zeros(self, *args: Any, **kwargs: Any) -> Any:
        if self.host_alloc is None or str(kwargs.get("device")) != "cpu":
            return self._torch.zeros(*args, **kwargs)
        shape = tuple(int(n) for n in (args[0] if len(args) == 1 else args))
        dtype = kwargs["dtype"]
        count = 1
        for n in shape:
            count *= n
        return self.host_alloc(count * dtype.itemsize).view(dtype).view(shape)


def _extent(t: Any) -> tuple[int, int]:
    """``[first, last + 1)`` byte addresses a tensor view can touch."""
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


class SimpleCPUOffloadAdapter(BuiltInAdapter):
    """``validate_registration`` adapter around the real SimpleCPUOffload worker."""

    connector = "SimpleCPUOffloadConnector"
    vllm_module = "vllm.distributed.kv_transfer.kv_connector.v1.simple_cpu_offload_connector"

    def init_state(self) -> None:
        self.connector_obj: Any = None
        self.caches: dict[str, Any] = {}
        self._torch = _TorchProxy()
        self._memcpy = _BatchMemcpy()
        self._engine: Any = None
        self._event = 0
        self._by_block: dict[int, list[tuple[int, int, int]]] = {}

    # --- faking ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _hardware(self) -> Iterator[None]:
        """The fakes, for as long as the connector's code runs."""
        from vllm.v1.simple_kv_offload import copy_backend, cuda_mem_ops
        from vllm.v1.simple_kv_offload import worker as worker_mod

        patches = [
            mock.patch.object(worker_mod, "torch", self._torch),
            mock.patch.object(copy_backend, "torch", self._torch),
            # PIN_MEMORY is False off CUDA; on a CUDA host the worker pins its host cache.
            mock.patch.object(worker_mod, "PIN_MEMORY", True),
            mock.patch.object(worker_mod, "pin_tensor", lambda tensor: None),
            mock.patch.object(copy_backend, "threading", types.SimpleNamespace(Thread=_InlineThread)),
            mock.patch.object(copy_backend, "current_platform", types.SimpleNamespace(set_device=lambda device: None)),
            mock.patch.object(cuda_mem_ops, "_batch_memcpy", (self._memcpy, 1)),
        ]
        with contextlib.ExitStack() as stack:
            for p in patches:
                stack.enter_context(p)
            yield

    @contextlib.contextmanager
    def _config(self) -> Iterator[tuple[Any, Any]]:
        """The case's VllmConfig and KVCacheConfig, with this connector as the transfer config."""
        from vllm.v1.simple_kv_offload.sizing import gpu_total_bytes

        with contextlib.ExitStack() as stack:
            plan = case_plan(self.ctx, stack)
            vc, kcc = plan.vllm_config, plan.kv_cache_config
            # A CPU pool as large as the GPU pool; the worker sizes its blocks from it.
            use_transfer_config(stack, vc, kv_connector=self.connector, kv_role="kv_both",
                                kv_connector_extra_config={"cpu_bytes_to_use": gpu_total_bytes(kcc)})
            yield vc, kcc

    def _drain(self) -> None:
        """Run the backend's own copy loop over what was queued (it returns at the sentinel)."""
        backend = self.worker._backend
        backend._queue.put(None)
        backend._thread.target(*backend._thread.args)

    # --- registration ---------------------------------------------------------------------------

    def register(self, kv_caches: Mapping[str, Any]) -> None:
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        from vllm.distributed.kv_transfer.kv_connector.v1.simple_cpu_offload_connector import (
            SimpleCPUOffloadConnector,
        )

        self.caches = dict(kv_caches)
        with self._config() as (vc, kcc), self._hardware():
            self.connector_obj = SimpleCPUOffloadConnector(vc, KVConnectorRole.WORKER, kcc)
            if self.worker is None:  # it disables itself without prefix caching
                raise Undrivable("SimpleCPUOffloadConnector built no worker: prefix caching is off for this case")
            self.connector_obj.register_kv_caches(self.caches)
        self._engine = None
        self._by_block.clear()

    @property
    def worker(self) -> Any:
        return self.connector_obj.worker_handler

    def _bind(self, engine: Any) -> None:
        """Re-run the real registration with the host cache in ``engine``'s memory."""
        if engine is self._engine:
            return
        self.worker._backend.shutdown()
        self._torch.host_alloc = engine.host_buffer
        try:
            with self._hardware():
                self.connector_obj.register_kv_caches(self.caches)
        finally:
            self._torch.host_alloc = None
        self._engine = engine

    # --- what it moves -------------------------------------------------------------------------

    def _copies(self, block_id: int) -> list[tuple[int, int, int]]:
        """The store descriptors ``copy_blocks`` builds for GPU block ``block_id`` (recorded, not run)."""
        from vllm.v1.simple_kv_offload.cuda_mem_ops import copy_blocks

        if block_id not in self._by_block:
            recorded: list[tuple[int, int, int]] = []
            self._memcpy.sink = lambda src, dst, n: recorded.append((src, dst, n))
            try:
                with self._hardware():
                    copy_blocks([block_id], [0], self.worker._backend._store_params)
            finally:
                self._memcpy.sink = None
            self._by_block[block_id] = recorded
        return self._by_block[block_id]

    def descriptors(self, layer: str, block_id: int) -> Ranges:
        """Copies of regions holding ``layer``'s bytes: its own region(s), or the packed row."""
        lo, hi = _extent(self.caches[layer])
        out: Ranges = []
        for src, _dst, nbytes in self._copies(block_id):
            region = next(r for r in self.worker.gpu_kv_caches.values() if r.data_ptr() <= src < r.data_ptr() + r.nbytes)
            if region.data_ptr() < hi and lo < region.data_ptr() + region.nbytes:
                out.append((src, nbytes))
        return out

    # --- round trip ----------------------------------------------------------------------------

    def _next_event(self) -> int:
        self._event += 1
        return self._event

    def store(self, block_ids: list[int], engine: Any) -> list[int]:
        """``wait_for_save`` for GPU blocks ``block_ids`` into CPU blocks ``0 .. n-1``."""
        from vllm.v1.simple_kv_offload.metadata import SimpleCPUOffloadMetadata

        self._bind(engine)
        cpu_ids = list(range(len(block_ids)))
        if len(cpu_ids) > self.worker.num_cpu_blocks:
            raise ValueError(f"{len(cpu_ids)} blocks do not fit the {self.worker.num_cpu_blocks}-block CPU cache")
        event = self._next_event()
        meta = SimpleCPUOffloadMetadata(store_event=event, store_gpu_blocks=list(block_ids), store_cpu_blocks=cpu_ids)
        self._memcpy.sink = engine.copy
        try:
            with self._hardware():
                self.connector_obj.bind_connector_metadata(meta)
                self.connector_obj.wait_for_save()
                self._drain()
                self.connector_obj.get_finished(set())
                done = self.connector_obj.build_connector_worker_meta()
                self.connector_obj.clear_connector_metadata()
        finally:
            self._memcpy.sink = None
        if done is None or event not in done.completed_store_events:
            raise RuntimeError(f"the worker did not report store event {event} complete")
        return cpu_ids

    def load(self, handle: list[int], block_ids: list[int], engine: Any) -> None:
        """``start_load_kv`` from CPU blocks ``handle`` into GPU blocks ``block_ids``."""
        from vllm.v1.simple_kv_offload.metadata import SimpleCPUOffloadMetadata

        if engine is not self._engine:
            raise ValueError("load needs the engine the blocks were stored with (the CPU cache lives there)")
        event = self._next_event()
        meta = SimpleCPUOffloadMetadata(
            load_event=event,
            load_gpu_blocks=list(block_ids),
            load_cpu_blocks=list(handle),
            load_event_to_reqs={event: [_REQUEST]},
        )
        self._memcpy.sink = engine.copy
        try:
            with self._hardware():
                self.connector_obj.bind_connector_metadata(meta)
                self.connector_obj.start_load_kv(None)
                self._drain()
                _, received = self.connector_obj.get_finished(set())
                self.connector_obj.clear_connector_metadata()
        finally:
            self._memcpy.sink = None
        if received != {_REQUEST}:
            raise RuntimeError(f"the worker did not report load event {event} complete (got {received!r})")


__all__ = ["SimpleCPUOffloadAdapter"]
