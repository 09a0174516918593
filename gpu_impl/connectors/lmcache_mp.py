"""vLLM 0.33.0's ``LMCacheMPConnector`` (LMCache multi-process mode) driven on CPU, as a
connector adapter.

What the connector is
    ``vllm/distributed/kv_transfer/kv_connector/v1/lmcache_mp_connector.py`` ends with
    ``LMCacheMPConnector = _resolve_lmcache_mp_connector()``: when the ``lmcache`` package
    is installed the class IS LMCache's own ``lmcache.integration.vllm.lmcache_mp_connector
    .LMCacheMPConnector``; vLLM's in-tree ``LMCacheMPConnectorUpstream`` is used only with
    ``LMCACHE_USE_UPSTREAM_MP`` set or an lmcache without that module. Both import lmcache
    at module level, so without lmcache nothing of the connector imports at all.

    vLLM's in-tree side (``LMCacheMPConnectorUpstream.register_kv_caches`` ->
    ``lmcache_integration/multi_process_adapter.py:414``) sends, read off the source:
    ``REGISTER_KV_CACHE [instance_id (the pid), [CudaIPCWrapper(t) for t in
    kv_caches.values()]]`` -- the tensors in dict order, no layer names, no group or
    layout metadata; ``STORE``/``RETRIEVE [keys, instance_id, block_ids, event IPC
    handle]`` with the LOGICAL vLLM block ids of the request (``allocated_block_ids``
    sliced at chunk boundaries, ``LMCacheMPRequestMetadata.GetStoreMetadata``) and one
    token-range key per request; the chunk size comes from the server (``GET_CHUNK_SIZE``)
    and must be a multiple of ``cache_config.block_size``. Every byte the in-tree side
    moves is therefore decided by the LMCache server from the tensors' own shapes and
    strides: vLLM's code alone answers no ``descriptors``.

What runs here (only inside the venv of ``scripts/lmcache_env.sh``, where lmcache 0.5.6 is
installed; elsewhere ``register`` raises ``Undrivable``)
    Real: the connector class vLLM resolves, constructed for both roles with its own
    constructor (geometry checks, parallel strategy, adapters); the worker's
    ``register_kv_caches`` (``apply_kv_cache_group_edits``,
    ``create_engine_group_infos_from_vllm``, ``LMCacheMPWorkerAdapter.register_kv_caches``
    -> ``create_transfer_context`` for the tensors' device -> LMCache's KV-format
    detection ``normalize_kv_and_discover_format`` / ``compute_kv_layout``); the scheduler's
    request planning (``get_num_new_matched_tokens``, ``update_state_after_alloc``,
    ``build_connector_meta``: which logical block ids form which chunk); the worker's
    ``wait_for_save`` / ``start_load_kv`` and LMCache's worker-side copy path for CPU
    tensors (``EngineDrivenTransferContext``: ``gather_paged_kv_to_cpu`` /
    ``scatter_cpu_to_paged_kv`` with the torch device ops, moving bytes by torch ops on
    the registered tensors).

    Faked: the LMCache server behind LMCache's ``RequestClient`` (the ZMQ transport and
    the server's storage): ``RecordingLMCacheServer`` answers the RPCs, records every
    request, keeps committed chunks by their token prefix and serves them back on lookup
    / retrieve; the heartbeat thread that pings it is not started. The server's chunk
    size is the case's logical block size, so one logical block is one LMCache chunk.

    On a CUDA worker LMCache defaults to its server-driven path (the server opens the
    ``CudaIPCWrapper``s and copies per KV-cache group); on CPU tensors it defaults to the
    engine-driven path above, which is LMCache's own code for exactly these tensors but
    supports a single KV transfer group: for several groups (hybrid models) ``register``
    raises ``Undrivable`` with LMCache's message (on a GPU the connector would not refuse).

Descriptors are observed, not derived: for block ``b`` the adapter runs the connector's own
load path for ``b`` with a chunk whose bytes carry the layer index (chunk layout from the
layout LMCache registered with the server: ``[2, layers, tokens, hidden]``, or
``[layers, tokens, hidden]`` for single-plane formats), on a zeroed pool (saved and
restored around it), and reports the pool bytes LMCache's scatter wrote, per layer.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import pickle
from typing import Any, Iterator, Mapping
from unittest import mock

from conformance.connectors.protocol import Ranges, RegistrationContext
from gpu_impl.connectors import Undrivable

CONNECTOR_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.lmcache_mp_connector"
_ADAPTER_MODULE = "lmcache.integration.vllm.vllm_multi_process_adapter"


class RecordingLMCacheServer:
    """The LMCache multi-process server, as LMCache's ``RequestClient`` sees it.

    Records each call as ``(method, args)`` in ``sent``. Committed chunks are kept per
    chunk under the token prefix that ends them (LMCache keys chunks by prefix), so a
    lookup of the same tokens hits them and a retrieve gets them back.
    """

    def __init__(self, chunk_size: int) -> None:
        self.chunk_size = chunk_size
        self.sent: list[tuple[str, tuple[Any, ...]]] = []
        self.chunks: dict[tuple[Any, ...], Any] = {}
        self._hits: dict[str, int] = {}

    @staticmethod
    def _done(value: Any = None):
        from lmcache.v1.multiprocess.futures import MessagingFuture

        future = MessagingFuture()
        future.set_result(value)
        return future

    def _record(self, method: str, *args: Any) -> None:
        self.sent.append((method, args))

    def _chunk_keys(self, key: Any) -> list[tuple[Any, ...]]:
        ends = range(key.start + self.chunk_size, key.end + 1, self.chunk_size)
        return [(key.cache_salt, tuple(key.token_ids[:end])) for end in ends]

    def hold(self, tokens: list[int], chunks: list[Any]) -> None:
        """Make the server hold ``chunks`` for the first chunks of ``tokens`` (no salt)."""
        ends = range(self.chunk_size, len(tokens) + 1, self.chunk_size)
        self.chunks.update(zip((("", tuple(tokens[:end])) for end in ends), chunks))

    # -- what the adapters' constructors and heartbeats ask
    def get_chunk_size(self):
        self._record("get_chunk_size")
        return self._done(self.chunk_size)

    def get_experimental(self):
        self._record("get_experimental")
        return self._done([])

    def ping(self, instance_id=None):
        return self._done(True)

    # -- registration (engine-driven and server-driven)
    def register_kv_cache_engine_driven_context(self, payload):
        from lmcache.v1.multiprocess.custom_types import RegisterEngineDrivenContextResponse

        self._record("register_kv_cache_engine_driven_context", payload)
        return self._done(RegisterEngineDrivenContextResponse())  # no SHM pool: pickle transport

    def register_kv_cache(self, *args):
        self._record("register_kv_cache", *args)
        return self._done(None)

    def unregister_kv_cache_engine_driven_context(self, instance_id):
        self._record("unregister_kv_cache_engine_driven_context", instance_id)
        return self._done(None)

    def unregister_kv_cache(self, instance_id):
        self._record("unregister_kv_cache", instance_id)
        return self._done(None)

    # -- scheduler side
    def lookup(self, key, tp_size):
        self._record("lookup", key, tp_size)
        hits = 0
        for chunk_key in self._chunk_keys(key):
            if chunk_key not in self.chunks:
                break
            hits += 1
        self._hits[key.request_id] = hits
        return self._done(None)

    def query_prefetch_status(self, request_id):
        self._record("query_prefetch_status", request_id)
        return self._done(self._hits.get(request_id, 0))

    def free_lookup_locks(self, key, tp_size):
        self._record("free_lookup_locks", key, tp_size)
        return self._done(None)

    def end_session(self, request_id):
        self._record("end_session", request_id)
        return self._done(None)

    def report_block_allocation(self, *args):
        self._record("report_block_allocation", *args)
        return self._done(None)

    # -- engine-driven data path (pickle transport)
    def prepare_store(self, key, instance_id):
        from lmcache.v1.multiprocess.custom_types import PrepareStoreResponse

        self._record("prepare_store", key, instance_id)
        return self._done(PrepareStoreResponse())

    def commit_store(self, key, instance_id, data: bytes):
        self._record("commit_store", key, instance_id, len(data))
        chunks = pickle.loads(data)
        keys = self._chunk_keys(key)
        if len(chunks) != len(keys):
            return self._done(False)
        self.chunks.update(zip(keys, chunks))
        return self._done(True)

    def prepare_retrieve(self, key, instance_id):
        from lmcache.v1.multiprocess.custom_types import PrepareRetrieveResponse

        self._record("prepare_retrieve", key, instance_id)
        keys = self._chunk_keys(key)
        if not keys or any(k not in self.chunks for k in keys):
            return self._done(PrepareRetrieveResponse(success=False))
        return self._done(PrepareRetrieveResponse(success=True, data=pickle.dumps([self.chunks[k] for k in keys])))

    def commit_retrieve(self, key, instance_id):
        self._record("commit_retrieve", key, instance_id)
        return self._done(True)

    def close(self) -> None:
        pass


class LMCacheMPAdapter:
    """``validate_registration`` adapter around the connector vLLM resolves as
    ``LMCacheMPConnector`` (LMCache's own, with lmcache installed)."""

    connector = "LMCacheMPConnector"
    vllm_module = CONNECTOR_MODULE

    def __init__(self, ctx: RegistrationContext) -> None:
        self.ctx = ctx
        self.server = RecordingLMCacheServer(ctx.block_size)
        self.worker: Any = None
        self.scheduler: Any = None
        self.caches: dict[str, Any] = {}
        self._config: Any = None
        self._ids = itertools.count()
        self._descriptors: dict[int, dict[str, Ranges]] = {}

    # -- the faked services, active around every call into the connector
    @contextlib.contextmanager
    def _services(self) -> Iterator[None]:
        adapter_module = importlib.import_module(_ADAPTER_MODULE)
        with contextlib.ExitStack() as stack:
            stack.enter_context(mock.patch.object(adapter_module.RequestClientFactory, "create",
                                                  lambda *a, **k: self.server))
            # The heartbeat thread only pings the server; the fake never goes away.
            stack.enter_context(mock.patch.object(adapter_module.HeartbeatThread, "start", lambda self: None))
            yield

    def register(self, kv_caches: Mapping[str, Any]) -> None:
        if importlib.util.find_spec("lmcache") is None:
            raise Undrivable(
                "lmcache is not installed: vLLM's lmcache_mp_connector imports it at module level and "
                "LMCache's server decides every byte moved (run under scripts/lmcache_env.sh)"
            )
        from vllm.config import KVTransferConfig
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

        module = importlib.import_module(CONNECTOR_MODULE)
        if self.ctx.vllm is not None:
            stack = contextlib.ExitStack()
            vc, kcc, layout_name = self.ctx.vllm.vllm_config, self.ctx.vllm.kv_cache_config, self.ctx.layout
        else:
            from gpu_impl.connectors.nixl import _plan

            stack, vc, kcc, _, _, layout = _plan(self.ctx.case, self.ctx.runner)
            layout_name = layout.name
        with stack:
            saved = vc.kv_transfer_config
            object.__setattr__(vc, "kv_transfer_config", KVTransferConfig(
                kv_connector="LMCacheMPConnector", kv_role="kv_both",
                kv_connector_extra_config={"lmcache.mp.host": "tcp://127.0.0.1", "lmcache.mp.port": 5555}))
            stack.callback(object.__setattr__, vc, "kv_transfer_config", saved)
            vc.cache_config.kv_cache_layout = layout_name
            stack.callback(setattr, vc.cache_config, "kv_cache_layout", None)
            stack.enter_context(self._services())
            if len(kcc.kv_cache_groups) > 1 and not vc.cache_config.enable_prefix_caching:
                vc.cache_config.enable_prefix_caching = True
            self.scheduler = module.LMCacheMPConnector(vc, KVConnectorRole.SCHEDULER, kcc)
            self.worker = module.LMCacheMPConnector(vc, KVConnectorRole.WORKER, kcc)
            try:
                self.worker.register_kv_caches(dict(kv_caches))
            except ValueError as exc:
                if "engine-driven transfer does not support multiple KV transfer groups" in str(exc):
                    raise Undrivable(f"LMCache's CPU (engine-driven) path: {exc}; its CUDA path copies "
                                     "per group on the server through CUDA IPC") from exc
                raise
            self._config = (vc, kcc, layout_name)
        self.caches = dict(kv_caches)

    # -- the connector's own planning and copy paths
    @contextlib.contextmanager
    def _configured(self) -> Iterator[Any]:
        vc, kcc, layout_name = self._config
        with contextlib.ExitStack() as stack:
            saved = vc.cache_config.kv_cache_layout
            vc.cache_config.kv_cache_layout = layout_name
            stack.callback(setattr, vc.cache_config, "kv_cache_layout", saved)
            stack.enter_context(self._services())
            yield vc

    def _request(self, tokens: list[int]):
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.request import Request

        init_none_hash(sha256)
        return Request(request_id=f"kvconform-{next(self._ids)}", prompt_token_ids=list(tokens),
                       sampling_params=SamplingParams(max_tokens=1), pooling_params=None,
                       block_hasher=get_request_block_hasher(self.ctx.block_size, sha256))

    def _step(self, request, block_ids: list[int], num_tokens: int):
        """One scheduler step for a new request that was given ``block_ids``: the
        scheduler connector's metadata for it, bound to the worker connector."""
        from vllm.v1.core.kv_cache_manager import KVCacheBlocks
        from vllm.v1.core.kv_cache_utils import KVCacheBlock
        from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput

        groups = len(self._config[1].kv_cache_groups)
        ids = tuple(list(block_ids) for _ in range(groups))
        loadable, _ = self.scheduler.get_num_new_matched_tokens(request, 0)
        loadable = loadable or 0
        blocks = KVCacheBlocks(tuple([KVCacheBlock(block_id=b) for b in g] for g in ids))
        self.scheduler.update_state_after_alloc(request, blocks, loadable)
        new = NewRequestData.from_request(request, ids)
        out = SchedulerOutput(scheduled_new_reqs=[new], scheduled_cached_reqs=CachedRequestData.make_empty(),
                              num_scheduled_tokens={request.request_id: num_tokens - loadable},
                              total_num_scheduled_tokens=num_tokens - loadable, scheduled_spec_decode_tokens={},
                              scheduled_encoder_inputs={}, finished_req_ids=set(), free_encoder_mm_hashes=[])
        meta = self.scheduler.build_connector_meta(out)
        self.worker.bind_connector_metadata(meta)
        return meta, loadable

    def _tokens(self, n_blocks: int, salt: int) -> list[int]:
        return [(salt * 7919 + i) % 30000 + 1 for i in range(n_blocks * self.ctx.block_size)]

    def store(self, block_ids: list[int], engine: Any) -> Any:
        tokens = self._tokens(len(block_ids), next(self._ids))
        with self._configured():
            request = self._request(tokens)
            meta, _ = self._step(request, list(block_ids), len(tokens))
            self.worker.wait_for_save()
            self.worker.clear_connector_metadata()
            self.scheduler.request_finished(request, list(block_ids))
        return {"tokens": tokens, "plan": [(m.direction, list(m.op.block_ids)) for m in meta.requests]}

    def load(self, handle: Any, block_ids: list[int], engine: Any) -> None:
        with self._configured():
            request = self._request(handle["tokens"])
            meta, loadable = self._step(request, list(block_ids), len(handle["tokens"]))
            self.worker.start_load_kv(None)
            self.worker.clear_connector_metadata()
            self.scheduler.request_finished(request, list(block_ids))

    def descriptors(self, layer: str, block_id: int) -> Ranges:
        if block_id not in self._descriptors:
            self._descriptors[block_id] = self._observe_writes(block_id)
        return self._descriptors[block_id].get(layer, [])

    def _observe_writes(self, block_id: int) -> dict[str, Ranges]:
        """The pool bytes the connector's own load path writes for ``block_id``, per layer."""
        import torch

        from conformance.connectors.roundtrip import _pool_tensor

        pool = _pool_tensor(self.caches)
        if pool is None:
            raise Undrivable("the registered tensors are not views of one storage")
        ctx = self.worker.worker_adapter.transfer_ctx.engine_driven_context
        (shape,), (dtype,) = ctx.layout_desc.shapes, ctx.layout_desc.dtypes
        names = list(self.caches)
        layer_dim = 1 if len(shape) == 4 else 0
        if shape[layer_dim] != len(names) or len(names) > 250:
            raise Undrivable(f"LMCache's chunk {tuple(shape)} does not have one layer slot per registered layer")
        chunk = torch.empty(tuple(shape), dtype=dtype)
        for i in range(len(names)):
            chunk.select(layer_dim, i).view(torch.uint8).fill_(i + 1)
        saved = pool.clone()
        try:
            pool.zero_()
            tokens = self._tokens(1, 10**6 + block_id)
            self.server.hold(tokens, [chunk])  # what the server returns for these tokens
            self.load({"tokens": tokens}, [block_id], None)
            written = pool.view(torch.uint8)
            out: dict[str, Ranges] = {}
            base = pool.data_ptr()
            for i, name in enumerate(names):
                mask = (written == i + 1).to(torch.int8)
                edges = torch.nonzero(torch.diff(torch.cat([torch.zeros(1, dtype=torch.int8), mask,
                                                            torch.zeros(1, dtype=torch.int8)]))).flatten().tolist()
                out[name] = [(base + a, z - a) for a, z in zip(edges[::2], edges[1::2])]
            return out
        finally:
            pool.copy_(saved)

    @property
    def kernel_block_size(self) -> int:
        ctx = self.worker.worker_adapter.transfer_ctx.engine_driven_context
        return ctx.metadata.block_size


__all__ = ["LMCacheMPAdapter", "RecordingLMCacheServer"]
