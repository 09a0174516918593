"""The target release's ``UMBPStoreConnector`` (worker role) driven on CPU, as a connector adapter.

Its own constructor (``KVLayoutPlanner.from_kv_cache_config``: one region per layer),
``register_kv_caches`` and the worker's store and load paths (``wait_for_save`` /
``start_load_kv`` -> ``KVLayoutPlanner.materialize``) run; the UMBP runtime, an external
service vLLM ships only a registry for, is ``RecordingUMBPRuntime``, which moves each
``KVRange`` through ``CopyEngine.copy``. The scheduler's batches (one block per
prefix-cacheable group, keys from the connector's own codec) are built as it sends them.
Findings: docs/findings/umbp-bhlnc-layer-page-as-one-run.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
from typing import Any, Mapping, Sequence
from unittest import mock

from gpu_impl.connectors.base import BuiltInAdapter, Ranges
from gpu_impl.connectors.vllm_setup import case_plan, use_transfer_config


class RecordingUMBPRuntime:
    """A UMBP runtime (``IUMBPRuntime``) and its worker handle (``UMBPWorkerHandle``).

    With an ``engine`` set, ``store`` and ``load`` move bytes; without one they only record
    the materialized plans and succeed (a dry run)."""

    def __init__(self) -> None:
        self.engine: Any = None
        self.registered: dict[int, int] = {}
        """Storage address -> bytes, per unique allocation ``register_buffers`` saw."""
        self.stored: list[Any] = []
        self.loaded: list[Any] = []
        """Every plan the worker materialized and handed over, in order."""
        self.objects: dict[str, Any] = {}
        self.published: list[str] = []

    # IUMBPRuntime
    def create_worker_handle(self, namespace: str, topology: Any, layout: Any) -> RecordingUMBPRuntime:
        self.namespace, self.topology, self.layout = namespace, topology, layout
        return self

    def create_scheduler_handle(self, namespace: str, topology: Any, layout: Any) -> Any:
        raise AssertionError("the adapter builds the worker role only")

    # UMBPWorkerHandle
    def register_buffers(self, kv_caches: Mapping[str, Any]) -> None:
        for cache in kv_caches.values():
            storage = cache.untyped_storage()
            self.registered[storage.data_ptr()] = storage.nbytes()

    @staticmethod
    def _job(plans: Sequence[Any]):
        from vllm.distributed.kv_transfer.kv_connector.v1.umbp.data import TransferJobState

        job = TransferJobState(plans=tuple(plans))
        job.start()
        return job

    def store(self, plans: Sequence[Any]):
        self.stored.extend(plans)
        if self.engine is not None:
            for plan in plans:
                obj = self.engine.host_buffer(max((r.object_offset + r.length for r in plan.ranges), default=0))
                for r in plan.ranges:
                    self.engine.copy(r.base_address, obj.data_ptr() + r.object_offset, r.length)
                self.objects[plan.key] = obj
        job = self._job(plans)
        job.complete()
        return job

    def load(self, plans: Sequence[Any]):
        self.loaded.extend(plans)
        job = self._job(plans)
        if self.engine is None:
            job.complete()
            return job
        missing = [plan.key for plan in plans if plan.key not in self.objects]
        for plan in plans:
            obj = self.objects.get(plan.key)
            for r in plan.ranges if obj is not None else ():
                self.engine.copy(obj.data_ptr() + r.object_offset, r.base_address, r.length)
        job.complete([plan.key for plan in plans if plan.key not in missing])
        if missing:
            job.fail(missing, "no such object")
        return job

    def wait(self, job):
        return job

    def poll(self, job):
        return job

    def publish(self, job) -> None:
        self.published.extend(job.keys)

    def cancel(self, job):
        return job

    def take_evicted_keys(self) -> list[str]:
        return []

    def close(self) -> None:
        pass


class UMBPAdapter(BuiltInAdapter):
    """``validate_registration`` adapter around the real ``UMBPStoreConnector`` worker."""

    connector = "UMBPStoreConnector"
    vllm_module = "vllm.distributed.kv_transfer.kv_connector.v1.umbp.connector"

    def init_state(self) -> None:
        self.conn: Any = None
        self.runtime = RecordingUMBPRuntime()
        self._ids = itertools.count()
        self._planned: dict[int, list[Any]] = {}

    def register(self, kv_caches: Mapping[str, Any]) -> None:
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        from vllm.distributed.kv_transfer.kv_connector.v1.umbp import connector as uc

        with contextlib.ExitStack() as stack:
            plan = case_plan(self.ctx, stack)
            vc, kcc = plan.vllm_config, plan.kv_cache_config
            use_transfer_config(stack, vc, kv_connector=self.connector, kv_role="kv_both")
            # The runtime registry vLLM ships empty (adapters register themselves, e.g. MORI's).
            stack.enter_context(mock.patch.dict(uc.UMBPRuntimeFactory._builders, {"embedded": lambda config: self.runtime}))
            self.conn = uc.UMBPStoreConnector(vc, KVConnectorRole.WORKER, kcc)
            self.conn.register_kv_caches(dict(kv_caches))
        self.worker = self.conn.connector_worker
        self.codec = self.conn._codec(self.conn._namespace)
        planned = {r.group_id for r in self.worker.layout.regions}
        # The groups the scheduler stores and loads (its _store_plans / load batches).
        self.groups = [g for g in kcc.prefix_cacheable_group_ids if g in planned]
        self.group_block_sizes = {g: kcc.kv_cache_groups[g].kv_cache_spec.block_size for g in self.groups}

    @property
    def transferred_layers(self) -> frozenset[str]:
        return frozenset(r.layer_name for r in self.worker.layout.regions if r.group_id in self.groups)

    # --- one engine step ----------------------------------------------------------------------

    def _step(self, metadata, engine) -> None:
        """Bind the step's metadata and run the worker hooks the model runner calls."""
        self.runtime.engine = engine
        try:
            self.conn.bind_connector_metadata(metadata)
            self.conn.start_load_kv(None)
            self.conn.wait_for_save()
            self.conn.get_finished(set())  # drains the (already finished) async jobs
            self.conn.clear_connector_metadata()
        finally:
            self.runtime.engine = None
        failed = self.conn.get_block_ids_with_load_errors() | self.worker.get_failed_recving()
        if failed:
            raise RuntimeError(f"UMBP reported failed loads (block ids or requests): {sorted(map(str, failed))}")

    def _load_batch(self, hashes: Sequence[bytes], block_ids: Sequence[int], request_id: str):
        from vllm.distributed.kv_transfer.kv_connector.v1.umbp.data import BlockLoadBatch

        keys, dst, groups = [], [], []
        for h, b in zip(hashes, block_ids, strict=True):
            for g in self.groups:
                keys.append(self.codec.key(h, g))
                dst.append(b)
                groups.append(g)
        return BlockLoadBatch(keys, dst, groups, request_id)

    def _load(self, hashes: Sequence[bytes], block_ids: Sequence[int], engine) -> None:
        from vllm.distributed.kv_transfer.kv_connector.v1.umbp.data import UMBPConnectorMetadata

        req = f"kvconform-{next(self._ids)}"
        # Asynchronous, as the scheduler sends it (load_async defaults to True, and is forced
        # for several groups or Mamba layers).
        self._step(UMBPConnectorMetadata(async_load=True, load_requests={req: self._load_batch(hashes, block_ids, req)}), engine)

    def _new_hashes(self, n: int) -> list[bytes]:
        return [hashlib.sha256(f"kvconform:{next(self._ids)}".encode()).digest() for _ in range(n)]

    # --- what the connector plans -------------------------------------------------------------

    def _plans(self, block_id: int) -> list[Any]:
        """The plans the worker materializes for loading ``block_id`` (a dry run)."""
        if block_id not in self._planned:
            first = len(self.runtime.loaded)
            self._load(self._new_hashes(1), [block_id], None)
            self._planned[block_id] = self.runtime.loaded[first:]
        return self._planned[block_id]

    def descriptors(self, layer: str, block_id: int) -> Ranges:
        return [(r.base_address, r.length) for plan in self._plans(block_id) for r in plan.ranges if r.layer_name == layer]

    # --- round trip ---------------------------------------------------------------------------

    def store(self, block_ids: list[int], engine) -> list[bytes]:
        from vllm.distributed.kv_transfer.kv_connector.v1.umbp.data import BlockStoreBatch, UMBPConnectorMetadata

        hashes = self._new_hashes(len(block_ids))
        req = f"kvconform-{next(self._ids)}"
        rows = [(self.codec.key(h, g), b, g, h, self.group_block_sizes[g]) for h, b in zip(hashes, block_ids, strict=True) for g in self.groups]
        keys, ids, groups, block_hashes, sizes = (list(column) for column in zip(*rows)) if rows else ([], [], [], [], [])
        batch = BlockStoreBatch(keys, ids, groups, block_hashes, [None] * len(rows), [()] * len(rows), sizes, req)
        self._step(UMBPConnectorMetadata(store_requests={req: batch}), engine)
        return hashes

    def load(self, handle: list[bytes], block_ids: list[int], engine) -> None:
        self._load(handle, list(block_ids), engine)


__all__ = ["RecordingUMBPRuntime", "UMBPAdapter"]
