"""The target release's ``LMCacheMPConnector`` (LMCache multi-process mode) driven on CPU, as a
connector adapter; only where the ``lmcache`` package is installed (``scripts/lmcache_env.sh``),
elsewhere ``register`` raises ``Undrivable``.

vLLM resolves the class to LMCache's own connector, whose server decides every byte moved
from the registered tensors' shapes and strides: vLLM's code alone answers no descriptors.
So the connector (both roles, its own constructor, ``register_kv_caches``, the scheduler's
request planning, ``wait_for_save`` / ``start_load_kv``) and LMCache's multi-process server
run here, in this process; only the transport (``InProcessTransport``: each RPC straight to
the server module's handler) and the IPC handles (``SharedTensorHandle``) are faked.
``LMCacheMPAdapter`` is the server-driven transfer mode (LMCache's CUDA default),
``LMCacheMPEngineDrivenAdapter`` the engine-driven one (its CPU default).

Descriptors are observed: every registered view is filled with its layer's index + 1, block
``b`` is stored through the connector, the pool is zeroed, ``b`` is loaded back, and the bytes
the load wrote are the descriptors of the layer whose marker they carry (the pool is restored).
Findings: docs/findings/lmcache-kernel-split-as-compression.md.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import itertools
import logging
import time
from typing import Any, Iterator, Mapping
from unittest import mock

from gpu_impl.connectors.base import ALIASED_GROUPS, BuiltInAdapter, Ranges, Undrivable, groups_alias
from gpu_impl.connectors.vllm_setup import case_plan, set_until_exit, use_transfer_config

CONNECTOR_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.lmcache_mp_connector"
_ADAPTER_MODULE = "lmcache.integration.vllm.vllm_multi_process_adapter"
_L1_BYTES = 128 << 20
"""The server's CPU L1 pool (a chunk is one block of every layer: at most 64 MiB of the
256 MiB pools validate_registration allocates, which have at least 4 blocks)."""
_SETTLE_S = 5.0
"""How long the server's host-callback thread may take to commit a store."""
_LOOKUP_POLLS = 200
"""Scheduler steps (10 ms apart) a lookup may stay pending while the server prefetches."""
_COPY_LOGGERS = ("lmcache.v1.multiprocess.modules.lmcache_driven_transfer",
                 "lmcache.v1.multiprocess.transfer_context.worker_transfer")
"""Where LMCache logs (and swallows) an exception of its copy path."""
_CPU_FALLBACK_GAP = "non-CUDA fallback"
"""How LMCache's torch copy ops say a layout only its compiled CUDA kernel handles."""


class _CopyErrors(logging.Handler):
    """Collects the exceptions LMCache's copy path logs instead of raising."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.errors: list[BaseException] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and record.exc_info[1] is not None:
            self.errors.append(record.exc_info[1])


class SharedTensorHandle:
    """The IPC handle of one registered tensor: the server side gets the tensor itself."""

    def __init__(self, tensor: Any) -> None:
        self.tensor = tensor
        self.shape, self.stride, self.dtype = tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype
        self.storage_offset = int(tensor.storage_offset())

    def to_tensor(self) -> Any:
        return self.tensor


class InProcessTransport:
    """LMCache's ``RequestClient``, with each RPC handled by the in-process server's own
    module handler (what its ZMQ server would dispatch to); records ``(rpc, args)``."""

    def __init__(self, handlers: Mapping[str, Any]) -> None:
        self._handlers = dict(handlers)
        self.sent: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, rpc: str):
        if rpc.startswith("_") or rpc not in self._handlers:
            raise AttributeError(rpc)
        handler = self._handlers[rpc]

        def call(*args: Any) -> Any:
            from lmcache.v1.multiprocess.futures import MessagingFuture

            self.sent.append((rpc, args))
            future = MessagingFuture()
            future.set_result(handler(*args))
            return future

        return call

    def close(self) -> None:
        pass


_live_server: list[Any] = []
"""The one LMCache server alive in this process: its host-callback dispatcher drains a
process-global native completion queue, so a second server's dispatcher would take (and
misroute) the first one's store commits."""


def _start_server(chunk_size: int) -> tuple[Any, dict[str, Any], Any]:
    """LMCache's MP server (both transfer modules), as its command line would build it:
    the server, its RPC handlers, and its host-callback dispatcher (which commits stores).
    Closes the server an earlier adapter started (adapters are driven one at a time)."""
    from lmcache.v1.distributed.config import add_storage_manager_args, parse_args_to_config
    from lmcache.v1.multiprocess import server as mp_server
    from lmcache.v1.multiprocess.config import (
        add_coordinator_args,
        add_mp_server_args,
        parse_args_to_coordinator_config,
        parse_args_to_mp_server_config,
    )
    from lmcache.v1.multiprocess.engine_context import MPCacheServerContext
    from lmcache.v1.multiprocess.modules.lmcache_driven_transfer import LMCacheDrivenTransferModule
    from lmcache.v1.multiprocess.request_handler import iter_request_handlers

    while _live_server:
        with contextlib.suppress(Exception):
            _live_server.pop().close()
    parser = argparse.ArgumentParser()
    add_mp_server_args(parser)
    add_storage_manager_args(parser)
    add_coordinator_args(parser)
    # vLLM never schedules block 0 (its null block), which LMCache's default null-block
    # sentinel 0 relies on; kvconform addresses every block id, so the sentinel is -1
    # (the value LMCache documents for engines where block 0 is valid).
    args = parser.parse_args(["--chunk-size", str(chunk_size), "--l1-size-gb", str(_L1_BYTES / (1 << 30)),
                              "--eviction-policy", "LRU", "--supported-transfer-mode", "auto",
                              "--null-block-id", "-1"])
    mp_config = parse_args_to_mp_server_config(args)
    ctx = MPCacheServerContext(storage_manager_config=parse_args_to_config(args), chunk_size=mp_config.chunk_size,
                               hash_algorithm=mp_config.hash_algorithm, null_block_id=mp_config.null_block_id,
                               separate_object_groups=mp_config.separate_object_groups,
                               session_ttl_seconds=mp_config.session_ttl_seconds)
    components = mp_server._build_server_components(ctx, mp_config, parse_args_to_coordinator_config(args))
    server = mp_server.MPCacheServer(ctx, components.modules)
    handlers = {h.operation: h.handler for m in components.modules for h in iter_request_handlers(m)}
    (driven,) = [m for m in components.modules if isinstance(m, LMCacheDrivenTransferModule)]
    _live_server.append(server)
    return server, handlers, driven._device_host_func_dispatcher


class LMCacheMPAdapter(BuiltInAdapter):
    """``validate_registration`` adapter around the connector vLLM resolves as
    ``LMCacheMPConnector``, in LMCache's server-driven transfer mode (its CUDA default)."""

    connector = "LMCacheMPConnector"
    vllm_module = CONNECTOR_MODULE
    transfer_mode = "lmcache_driven"
    """``lmcache.mp.mp_transfer_mode`` given to the connector."""

    def init_state(self) -> None:
        self.server: Any = None
        self._dispatcher: Any = None
        self.transport: InProcessTransport | None = None
        self.worker: Any = None
        self.scheduler: Any = None
        self.caches: dict[str, Any] = {}
        self._config: tuple[Any, Any, str] | None = None
        self._ids = itertools.count()
        self._descriptors: dict[int, dict[str, Ranges]] = {}
        self._copy_errors = _CopyErrors()

    @contextlib.contextmanager
    def _services(self) -> Iterator[None]:
        """The faked transport and IPC, around every call into the connector."""
        adapter_module = importlib.import_module(_ADAPTER_MODULE)
        kv_wrap = importlib.import_module("lmcache.v1.platform.kv_wrap")
        with contextlib.ExitStack() as stack:
            stack.enter_context(mock.patch.object(adapter_module.RequestClientFactory, "create",
                                                  lambda *a, **k: self.transport))
            stack.enter_context(mock.patch.object(kv_wrap, "resolve_kv_wrapper_factory",
                                                  lambda device_type: SharedTensorHandle))
            # The heartbeat only pings the server, which lives in this process.
            stack.enter_context(mock.patch.object(adapter_module.HeartbeatThread, "start", lambda self: None))
            for name in _COPY_LOGGERS:
                logger = logging.getLogger(name)
                logger.addHandler(self._copy_errors)
                stack.callback(logger.removeHandler, self._copy_errors)
                if logger.level > logging.ERROR:  # LMCACHE_LOG_LEVEL=CRITICAL would drop them
                    stack.callback(logger.setLevel, logger.level)
                    logger.setLevel(logging.ERROR)
            yield

    @contextlib.contextmanager
    def _configured(self) -> Iterator[None]:
        """vLLM's config as the connector reads it (LMCache MP connector, this transfer
        mode, the resolved layout), with the faked services, around each call."""
        vc, _, layout_name = self._config
        with contextlib.ExitStack() as stack:
            use_transfer_config(stack, vc, kv_connector="LMCacheMPConnector", kv_role="kv_both",
                                kv_connector_extra_config={"lmcache.mp.host": "tcp://127.0.0.1", "lmcache.mp.port": 5555,
                                                           "lmcache.mp.mp_transfer_mode": self.transfer_mode})
            set_until_exit(stack, vc.cache_config, "kv_cache_layout", layout_name)
            stack.enter_context(self._services())
            yield

    def register(self, kv_caches: Mapping[str, Any]) -> None:
        if importlib.util.find_spec("lmcache") is None:
            raise Undrivable(
                "lmcache is not installed: vLLM's lmcache_mp_connector imports it at module level and "
                "LMCache's server decides every byte moved (run under scripts/lmcache_env.sh)"
            )
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

        module = importlib.import_module(CONNECTOR_MODULE)
        with contextlib.ExitStack() as stack:
            plan = case_plan(self.ctx, stack)
            vc, kcc = plan.vllm_config, plan.kv_cache_config
            self.server, handlers, self._dispatcher = _start_server(self.ctx.block_size)
            self.transport = InProcessTransport(handlers)
            self._config = (vc, kcc, plan.layout_name)
            stack.enter_context(self._configured())
            self.scheduler = module.LMCacheMPConnector(vc, KVConnectorRole.SCHEDULER, kcc)
            self.worker = module.LMCacheMPConnector(vc, KVConnectorRole.WORKER, kcc)
            self.worker.register_kv_caches(dict(kv_caches))
        self.caches = dict(kv_caches)
        # One block through the copy path now, so that a layout LMCache copies only with
        # its CUDA kernel is reported from here (its torch ops refuse it, and the server
        # swallows that: the store would just miss).
        self.descriptors(next(iter(self.caches)), min(1, self.ctx.num_blocks - 1))
        # The round trip gives every KV cache group the same block ids (_step). Where groups
        # alias one tensor (a hybrid model's uniform-page grouping: each tensor holds one layer
        # of every group), those ids make the groups' blocks the same bytes, so what LMCache
        # moves for one group cannot be told from another's: say so rather than judge it.
        if groups_alias(kcc, self.caches):
            raise Undrivable(ALIASED_GROUPS)

    # -- the connector's own planning and copy paths
    def _request(self, tokens: list[int]):
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.request import Request

        init_none_hash(sha256)
        return Request(request_id=f"kvconform-{next(self._ids)}", prompt_token_ids=list(tokens),
                       sampling_params=SamplingParams(max_tokens=1), pooling_params=None,
                       block_hasher=get_request_block_hasher(self.ctx.block_size, sha256))

    def _step(self, request, block_ids: list[int]) -> None:
        """One scheduler step for a new request given ``block_ids`` (in every KV cache
        group): the scheduler connector's metadata for it, bound to the worker."""
        from vllm.v1.core.kv_cache_manager import KVCacheBlocks
        from vllm.v1.core.kv_cache_utils import KVCacheBlock
        from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput

        ids = tuple(list(block_ids) for _ in self._config[1].kv_cache_groups)
        for _ in range(_LOOKUP_POLLS):  # the scheduler asks again each step while the server prefetches
            loadable, _ = self.scheduler.get_num_new_matched_tokens(request, 0)
            if loadable is not None:
                break
            time.sleep(0.01)
        else:
            raise TimeoutError(f"LMCache's lookup for {request.request_id} stayed pending")
        blocks = KVCacheBlocks(tuple([KVCacheBlock(block_id=b) for b in g] for g in ids))
        self.scheduler.update_state_after_alloc(request, blocks, loadable)
        scheduled = request.num_tokens - loadable
        out = SchedulerOutput(scheduled_new_reqs=[NewRequestData.from_request(request, ids)],
                              scheduled_cached_reqs=CachedRequestData.make_empty(),
                              num_scheduled_tokens={request.request_id: scheduled}, total_num_scheduled_tokens=scheduled,
                              scheduled_spec_decode_tokens={}, scheduled_encoder_inputs={}, finished_req_ids=set(),
                              free_encoder_mm_hashes=[])
        self.worker.bind_connector_metadata(self.scheduler.build_connector_meta(out))

    def _finish(self, request, block_ids: list[int]) -> None:
        self.worker.clear_connector_metadata()
        self.scheduler.request_finished(request, list(block_ids))

    def _tokens(self, n_blocks: int) -> list[int]:
        salt = next(self._ids)
        return [(salt * 7919 + i) % 30000 + 1 for i in range(n_blocks * self.ctx.block_size)]

    def store(self, block_ids: list[int], engine: Any) -> Any:
        """A new request whose prompt fills ``block_ids``: the connector stores its chunks."""
        tokens = self._tokens(len(block_ids))
        with self._configured():
            request = self._request(tokens)
            self._step(request, list(block_ids))
            dispatched, sent = self._dispatcher.dispatched_count(), len(self.transport.sent)
            self.worker.wait_for_save()
            self.worker.worker_adapter.transfer_ctx.flush_inflight_stores()
            self._finish(request, list(block_ids))
            # Server-driven stores commit on the server's callback thread (engine-driven
            # ones commit before the RPC returns).
            if any(rpc == "store" for rpc, _ in self.transport.sent[sent:]):
                self._settle(dispatched)
        return {"tokens": tokens}

    def _settle(self, dispatched: int) -> None:
        """Wait until the server's host-callback thread has run the completions the store
        recorded (it commits the written objects asynchronously, as after a CUDA stream)."""
        deadline = time.monotonic() + _SETTLE_S
        last, quiet = dispatched, 0
        while time.monotonic() < deadline and quiet < 3:
            time.sleep(0.005)
            now = self._dispatcher.dispatched_count()
            quiet = quiet + 1 if now == last and now > dispatched else 0
            last = now

    def load(self, handle: Any, block_ids: list[int], engine: Any) -> None:
        """The same prompt again, given ``block_ids``: the connector loads it from LMCache."""
        with self._configured():
            request = self._request(handle["tokens"])
            self._step(request, list(block_ids))
            self.worker.start_load_kv(None)
            self._finish(request, list(block_ids))

    @property
    def kernel_block_size(self) -> int:
        """Slots per registered block, as the server's cache context detected them."""
        (context,) = self.server.cache_contexts.values()
        return context.block_size

    def descriptors(self, layer: str, block_id: int) -> Ranges:
        if block_id not in self._descriptors:
            self._descriptors[block_id] = self._observe(block_id)
        return self._descriptors[block_id].get(layer, [])

    def _observe(self, block_id: int) -> dict[str, Ranges]:
        """The pool bytes the connector's own load of ``block_id`` writes, per layer whose
        registered view they were stored from."""
        import torch

        names = list(self.caches)
        tensors = list(self.caches.values())
        if (len(names) >= 255 or not all(isinstance(t, torch.Tensor) for t in tensors)
                or len({t.untyped_storage().data_ptr() for t in tensors}) != 1):
            raise Undrivable("the registered tensors are not tensor views of one storage with < 255 layers")
        pool = torch.empty(0, dtype=torch.int8).set_(tensors[0].untyped_storage())
        saved = pool.clone()
        try:
            pool.view(torch.uint8).fill_(255)
            for i, name in enumerate(names):
                self.caches[name].view(torch.uint8).fill_(i + 1)
            handle = self.store([block_id], None)
            pool.zero_()
            self.load(handle, [block_id], None)
            gaps = [e for e in self._copy_errors.errors if _CPU_FALLBACK_GAP in str(e)]
            if gaps:
                raise Undrivable(f"LMCache's torch copy ops (its CPU path): {type(gaps[0]).__name__}: "
                                 f"{str(gaps[0]).splitlines()[0]}")
            written = pool.view(torch.uint8)
            base = pool.data_ptr()
            out: dict[str, Ranges] = {}
            for i, name in enumerate(names):
                mask = (written == i + 1).to(torch.int8)
                edges = torch.nonzero(torch.diff(mask, prepend=mask.new_zeros(1), append=mask.new_zeros(1))).flatten()
                out[name] = [(base + a, z - a) for a, z in zip(edges[::2].tolist(), edges[1::2].tolist())]
            return out
        finally:
            pool.copy_(saved)


class LMCacheMPEngineDrivenAdapter(LMCacheMPAdapter):
    """The same connector in LMCache's engine-driven mode (its default for CPU tensors):
    the worker gathers/scatters with LMCache's torch ops, the server keeps the chunks."""

    transfer_mode = "engine_driven"

    @property
    def kernel_block_size(self) -> int:
        return self.worker.worker_adapter.transfer_ctx.engine_driven_context.metadata.block_size


__all__ = ["InProcessTransport", "LMCacheMPAdapter", "LMCacheMPEngineDrivenAdapter", "SharedTensorHandle"]
