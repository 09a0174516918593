"""The target release's ``MooncakeStoreConnector`` (worker role) driven on CPU, as a connector adapter.

Its own constructor, ``register_kv_caches`` and the transfer threads' request handlers
(store: ``batch_put_from_multi_buffers``; load: ``batch_get_into_multi_buffers``), reached
through ``wait_for_save`` / ``start_load_kv``, run on the calling thread. Faked, as
upstream's ``test_mooncake_store_worker.py`` does: the ``mooncake.store`` service
(``RecordingMooncakeStore``, copying through ``CopyEngine.copy``), its config, ``get_ip``,
the lookup server, the TP / PCP / DCP world and ``torch.cuda.Event``. Logical block ids
address manager blocks directly (``group_kernel_blocks``). Findings:
docs/findings/mooncake-store-bhlnc-head-region-length.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import sys
import types
import weakref
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Iterator, Mapping
from unittest import mock

from gpu_impl.connectors.base import BuiltInAdapter, Ranges, Undrivable
from gpu_impl.connectors.cuda_stand_ins import SyncEvent
from gpu_impl.connectors.vllm_setup import case_plan, set_until_exit, use_transfer_config


class RecordingMooncakeStore:
    """Stands in for ``mooncake.store.MooncakeDistributedStore`` (a remote KV object store).

    With an ``engine`` set, ``batch_put_from_multi_buffers`` copies each key's buffers, in
    order, into one host buffer, and ``batch_get_into_multi_buffers`` copies an object back
    into the given buffers in the same order (Mooncake's multi-buffer semantics). Without an
    engine it only records what the connector asked for and reports success (a dry run).
    """

    def __init__(self) -> None:
        self.engine: Any = None
        self.registered: list[tuple[int, int]] = []
        self.puts: list[tuple[str, list[tuple[int, int]]]] = []
        """Every key put, with its ``(address, length)`` buffers, in order."""
        self.gets: list[tuple[str, list[tuple[int, int]]]] = []
        self.objects: dict[str, Any] = {}
        self.errors: list[BaseException] = []
        """What the engine raised inside a put or get (the connector logs and drops them)."""

    def setup(self, *args: Any, **kwargs: Any) -> int:
        return 0

    def register_buffer(self, addr: int, length: int) -> int:
        self.registered.append((addr, length))
        return 0

    def batch_is_exist(self, keys: list[str]) -> list[int]:
        return [1 if key in self.objects else 0 for key in keys]

    @staticmethod
    def _each_key(keys, addrs, sizes, log: list) -> Iterator[tuple[str, list[tuple[int, int]], list[int], int]]:
        """Per key: its ``(address, length)`` buffers (logged), each buffer's offset in the
        object, and the object's size."""
        for key, key_addrs, key_sizes in zip(keys, addrs, sizes, strict=True):
            buffers = [(int(a), int(n)) for a, n in zip(key_addrs, key_sizes, strict=True)]
            log.append((key, buffers))
            offsets = list(itertools.accumulate((n for _, n in buffers), initial=0))
            yield key, buffers, offsets, offsets[-1]

    def _move(self, pairs) -> None:
        """``engine.copy`` each ``(src, dst, nbytes)``; an engine error is kept for the adapter."""
        try:
            for src, dst, nbytes in pairs:
                self.engine.copy(src, dst, nbytes)
        except Exception as exc:
            self.errors.append(exc)
            raise

    def batch_put_from_multi_buffers(self, keys, addrs, sizes, replicate_config=None) -> list[int]:
        out = []
        for key, buffers, offsets, total in self._each_key(keys, addrs, sizes, self.puts):
            if self.engine is not None:
                obj = self.engine.host_buffer(total)
                self._move((a, obj.data_ptr() + o, n) for (a, n), o in zip(buffers, offsets))
                self.objects[key] = obj
            out.append(total)
        return out

    def batch_get_into_multi_buffers(self, keys, addrs, sizes) -> list[int]:
        out = []
        for key, buffers, offsets, total in self._each_key(keys, addrs, sizes, self.gets):
            if self.engine is not None:
                obj = self.objects.get(key)
                if obj is None or obj.numel() != max(total, 1):
                    out.append(-1)  # Mooncake: no such object, or the buffers do not fit it
                    continue
                self._move((obj.data_ptr() + o, a, n) for (a, n), o in zip(buffers, offsets))
            out.append(total)
        return out

    def close(self) -> int:
        return 0


class _ReplicateConfig:
    """``mooncake.store.ReplicateConfig`` (replica placement options; no ``group_ids``)."""

    def __init__(self) -> None:
        self.preferred_segment = ""


class _LookupKeyServer:
    """The rank-0 ZMQ lookup server: the scheduler's prefix queries are not driven here."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def close(self) -> None:
        pass


@contextlib.contextmanager
def _fake_mooncake(store: RecordingMooncakeStore) -> Iterator[None]:
    """``mooncake`` / ``mooncake.store`` in ``sys.modules`` while the worker imports them.

    Only these two keys are set and restored (``mock.patch.dict(sys.modules)`` would also
    drop every module first imported meanwhile)."""
    package = types.ModuleType("mooncake")
    module = types.ModuleType("mooncake.store")
    module.MooncakeDistributedStore = lambda: store  # type: ignore[attr-defined]
    module.ReplicateConfig = _ReplicateConfig  # type: ignore[attr-defined]
    package.store = module  # type: ignore[attr-defined]
    saved = {name: sys.modules.get(name) for name in ("mooncake", "mooncake.store")}
    sys.modules.update({"mooncake": package, "mooncake.store": module})
    try:
        yield
    finally:
        for name, previous in saved.items():
            if previous is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = previous


@dataclass(frozen=True)
class _Stored:
    """One logical block the connector stored: the hashes its keys were built from."""

    block_hashes: tuple[bytes, ...]
    token_len: int


class MooncakeStoreAdapter(BuiltInAdapter):
    """``validate_registration`` adapter around the real ``MooncakeStoreConnector`` worker."""

    connector = "MooncakeStoreConnector"
    vllm_module = "vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.connector"

    def init_state(self) -> None:
        self.conn: Any = None
        self.worker: Any = None
        self.store_service = RecordingMooncakeStore()
        self._ids = itertools.count()
        self._planned: dict[int, dict[int, Ranges]] = {}

    # --- registration -------------------------------------------------------------------------

    def register(self, kv_caches: Mapping[str, Any]) -> None:
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store import connector as sc
        from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store import worker as sw
        from vllm.distributed.mooncake_store import MooncakeStoreConfig

        with contextlib.ExitStack() as stack:
            plan = case_plan(self.ctx, stack)
            vc, kcc = plan.vllm_config, plan.kv_cache_config
            stack.enter_context(_fake_mooncake(self.store_service))
            use_transfer_config(stack, vc, kv_connector=self.connector, kv_role="kv_both")
            # Connectors are built after layout resolution, and after the engine set num_gpu_blocks.
            set_until_exit(stack, vc.cache_config, "kv_cache_layout", plan.layout_name)
            set_until_exit(stack, vc.cache_config, "num_gpu_blocks", kcc.num_blocks)
            mc = vc.model_config
            # What the project's ModelConfig stand-in lacks: at TP 1 the total KV head count is
            # the per-rank one; the layer count only feeds a log line.
            if not hasattr(mc, "get_total_num_kv_heads"):
                stack.enter_context(mock.patch.object(mc, "get_total_num_kv_heads", mc.get_num_kv_heads, create=True))
            if not hasattr(mc, "get_num_layers"):
                n_layers = sum(not l.is_draft for l in self.ctx.case.layers)
                stack.enter_context(mock.patch.object(mc, "get_num_layers", lambda parallel_config=None: n_layers, create=True))
            rank = SimpleNamespace(world_size=1, rank_in_group=0)
            store_config = MooncakeStoreConfig(metadata_server="kvconform", master_server_address="kvconform", protocol="tcp", device_name="")
            fakes = {
                "get_tensor_model_parallel_rank": lambda: 0,
                "get_tensor_model_parallel_world_size": lambda: 1,
                "get_pcp_group": lambda: rank,
                "get_dcp_group": lambda: rank,
                "get_ip": lambda: "127.0.0.1",
                "LookupKeyServer": _LookupKeyServer,
            }
            for name, value in fakes.items():
                stack.enter_context(mock.patch.object(sw, name, value))
            stack.enter_context(mock.patch.object(sw.MooncakeStoreConfig, "load_from_config", staticmethod(lambda: store_config)))
            # The transfer threads are driven on this thread (see _run): start() only does
            # what run() does before its loop.
            stack.enter_context(mock.patch.object(sw.KVTransferThread, "start", lambda t: t.ready_event.set()))
            conn = sc.MooncakeStoreConnector(vc, KVConnectorRole.WORKER, kcc)
            # Shut it down with the adapter (or at exit, while the modules its __del__ uses
            # still exist); its own shutdown is idempotent.
            weakref.finalize(self, conn.shutdown)
            self.conn, self.worker = conn, conn.connector_worker
            conn.register_kv_caches(dict(kv_caches))
        sizes = {db.block_size for db in self.worker.token_dbs}
        if sizes != {self.worker.block_size}:
            # A request position would be a different block id in each group.
            raise Undrivable(f"store groups have block sizes {sorted(sizes)}: the adapter drives one-block requests")
        if getattr(self.ctx.case, "mamba_cache_mode", "none") == "align":
            # Align mode stores Mamba state at request boundaries (its boundary puts), which a
            # one-block request does not reach: the loads would be judged on states never put.
            raise Undrivable("mamba_cache_mode='align': the adapter drives one-block requests, not the Mamba "
                             "boundary puts align mode stores state with")
        self.caches = dict(kv_caches)
        self.group_of = {name: g for g, group in enumerate(self.worker._kv_cache_groups) for name in group.layer_names}

    @property
    def transferred_layers(self) -> frozenset[str]:
        """Layers of the prefix-cacheable groups (the only ones the store keys)."""
        return frozenset(n for n in self.group_of if n in self.caches)

    # --- requests -----------------------------------------------------------------------------

    def _request(self, block_id: int, stored: _Stored | None = None):
        """A one-block request on ``block_id`` in every store group (new hashes unless ``stored``)."""
        from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.data import ReqMeta

        w = self.worker
        n = next(self._ids)
        if stored is None:
            hashes = (hashlib.sha256(f"kvconform:{n}:{i}".encode()).digest() for i in range(w.block_size // w.hash_block_size))
            stored = _Stored(tuple(hashes), w.block_size)
        req = ReqMeta(
            req_id=f"kvconform-{n}",
            token_len_chunk=stored.token_len,
            block_ids=tuple([block_id] for _ in w.token_dbs),
            block_hashes=list(stored.block_hashes),
            # The prompt runs one token past the block, as for any prompt whose first block
            # is saved: sparse groups (SWA, with vLLM's default retention interval 0) keep
            # only the tail a replay of that prompt can hit.
            prefill_end_tokens=stored.token_len + 1,
        )
        return req, stored

    def _run(self, requests, engine) -> None:
        """Bind the step's metadata and run the connector's save and load hooks, then each
        transfer thread's handler once per queued request (the body of its ``run`` loop)."""
        from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.data import MooncakeStoreConnectorMetadata

        w, service = self.worker, self.store_service
        meta = MooncakeStoreConnectorMetadata(set(), set())
        for req in requests:
            meta.add_request(req)
        service.engine, service.errors = engine, []
        try:
            self.conn.bind_connector_metadata(meta)
            self.conn.start_load_kv(None)
            with mock.patch("torch.cuda.Event", SyncEvent):  # the store fences the step's compute
                self.conn.wait_for_save()
            self.conn.clear_connector_metadata()
            for thread, queue in ((w.kv_send_thread, w.kv_send_thread.request_queue), (w.kv_recv_threads[0], w.recv_request_queue)):
                while not queue.empty():
                    thread._handle_request(queue.get())
        finally:
            service.engine = None
        for req in requests:
            w.kv_send_thread.delete_finished_stored_request(req.req_id)  # the request finished
        if service.errors:
            raise service.errors[0]  # the connector logged and dropped it

    def _save(self, block_ids: list[int], engine) -> list[_Stored]:
        pairs = [self._request(b) for b in block_ids]
        for req, _ in pairs:
            req.can_save = True
            req.store_job_id = next(self._ids)
        self._run([req for req, _ in pairs], engine)
        return [stored for _, stored in pairs]

    def _load(self, handle: list[_Stored], block_ids: list[int], engine) -> None:
        from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.data import LoadSpec

        requests = []
        for stored, block_id in zip(handle, block_ids, strict=True):
            req, _ = self._request(block_id, stored)
            req.load_spec = LoadSpec(vllm_cached_tokens=0, kvpool_cached_tokens=stored.token_len, can_load=True)
            requests.append(req)
        self._run(requests, engine)

    # --- what the connector plans -------------------------------------------------------------

    def _plan_block(self, block_id: int) -> dict[int, Ranges]:
        """Per store group, the ``(address, length)`` buffers the connector hands Mooncake for
        ``block_id``, from a dry-run load (the service only records).

        The load path plans every block id; the save path plans the same ``prepare_values``
        but skips ``NULL_BLOCK_ID`` (block 0, vLLM's null block, never a request's block)."""
        if block_id not in self._planned:
            service = self.store_service
            first = len(service.gets)
            _, stored = self._request(block_id)  # fresh hashes: keys no store holds
            self._load([stored], [block_id], None)
            planned = dict(service.gets[first:])
            last = stored.block_hashes[stored.token_len // self.worker.hash_block_size - 1]
            out: dict[int, Ranges] = {}
            for g, db in enumerate(self.worker.token_dbs):
                layout = db.store_layout
                out[g] = [r for shard in layout.local_shard_ids for r in planned.get(layout.key_for(shard, last), [])]
            self._planned[block_id] = out
        return self._planned[block_id]

    def descriptors(self, layer: str, block_id: int) -> Ranges:
        """What the connector moves for ``block_id`` of the layer's group: every registered
        region (each group's store layout covers every store layer's cache)."""
        g = self.group_of.get(layer)
        return [] if g is None else list(self._plan_block(block_id)[g])

    # --- round trip ---------------------------------------------------------------------------

    def store(self, block_ids: list[int], engine) -> list[_Stored]:
        return self._save(list(block_ids), engine)

    def load(self, handle: list[_Stored], block_ids: list[int], engine) -> None:
        self._load(handle, list(block_ids), engine)
        thread = self.worker.kv_recv_threads[0]
        failed = thread.get_and_clear_failed_requests() | {str(b) for b in thread.get_and_clear_block_ids_with_load_errors()}
        if failed:
            raise RuntimeError(f"MooncakeStore reported failed loads (requests or block ids): {sorted(failed)}")


__all__ = ["MooncakeStoreAdapter", "RecordingMooncakeStore"]
