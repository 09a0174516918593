"""The target release's ``MoRIIOConnectorWorker`` (AMD MoRI IO, READ mode) driven on CPU, as a
connector adapter.

Its own constructor, ``register_kv_caches`` (the per-layer transfer geometry, the one
page-aligned shared memory region), the handshake (its own listener and dialler over
in-process sockets) and the READ planning (``_read_blocks`` down to ``read_remote_data``)
run. Faked: ``mori.io`` (the stand-ins below record each posted read and, with a copy
engine, move it), ZMQ, the TP world, the open ports and the attention-backend lookup.
Without ``msgpack`` (not in vLLM's CPU install) the adapter is ``Undrivable``; so is a CPU
pool that is not page-aligned and page-padded as ROCm's is, once the connector's own
geometry checks have passed (``SHARED_MR_SOURCE``, ``ROCM_PADDING_SOURCE``).

``descriptors(layer, b)``: the local side of the reads ``_read_blocks`` posts for block ``b``
from a peer with this engine's layout. ``store`` / ``load``: the peer is an identical engine
holding a copy of the pool; ``load`` READs from it. Findings:
docs/findings/moriio-bhlnc-last-block-outside-region.md.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import weakref
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any, Iterator, Mapping
from unittest import mock

from gpu_impl.connectors.base import BuiltInAdapter, Ranges, Undrivable
from gpu_impl.connectors.vllm_setup import case_plan, use_transfer_config

_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.moriio"
PAGE = 4096
"""The page MoRIIO aligns its shared memory region to (``_build_shared_kv_mr``)."""
SHARED_MR_SOURCE = "vllm/distributed/kv_transfer/kv_connector/v1/moriio/moriio_connector.py:2440"
ROCM_PADDING_SOURCE = "vllm/v1/worker/utils.py:585-592"
_HOST, _HANDSHAKE_PORT = "127.0.0.1", 61000
_LOCAL_ID, _PEER_ID = "kvconform-local", "kvconform-peer"


# --- mori.io stand-ins ---------------------------------------------------------------------------


class BackendType:
    RDMA = "rdma"
    XGMI = "xgmi"


class PollCqMode:
    POLLING = "polling"


def _config(*args: Any, **kwargs: Any) -> tuple:
    """``IOEngineConfig`` / ``RdmaBackendConfig`` / ``XgmiBackendConfig``: recorded, unused."""
    return (args, kwargs)


@dataclass(frozen=True)
class MemoryDesc:
    """A registered memory region."""

    engine_key: str
    data: int
    size: int

    def pack(self) -> bytes:
        import msgpack

        return msgpack.packb([self.engine_key, self.data, self.size])

    @classmethod
    def unpack(cls, packed: bytes) -> "MemoryDesc":
        import msgpack

        return cls(*msgpack.unpackb(packed))


@dataclass(frozen=True)
class EngineDesc:
    key: str

    def pack(self) -> bytes:
        return self.key.encode()

    @classmethod
    def unpack(cls, packed: bytes) -> "EngineDesc":
        return cls(packed.decode())


@dataclass(frozen=True)
class TransferStatus:
    """A posted transfer's status (the fake completes it when posted)."""

    message: str = ""

    def Succeeded(self) -> bool:  # noqa: N802 - mori's API
        return not self.message

    def Failed(self) -> bool:  # noqa: N802
        return bool(self.message)

    def Message(self) -> str:  # noqa: N802
        return self.message


@dataclass
class Session:
    """An RDMA session between a local and a remote region: records each posted read."""

    engine: "IOEngine"
    local: MemoryDesc
    remote: MemoryDesc
    reads: list[tuple[int, int, int]] = field(default_factory=list)
    """``(local address, remote address, nbytes)`` of every read posted."""

    def batch_read(self, local_offsets, remote_offsets, sizes, uid) -> TransferStatus:
        for lo, ro, n in zip(local_offsets, remote_offsets, sizes):
            lo, ro, n = int(lo), int(ro), int(n)
            if lo < 0 or ro < 0 or lo + n > self.local.size or ro + n > self.remote.size:
                # The NIC refuses a work request outside the registered regions.
                return TransferStatus(f"read of {n} bytes at local offset {lo} / remote offset {ro} leaves the "
                                      f"registered regions ({self.local.size} / {self.remote.size} bytes)")
            self.reads.append((self.local.data + lo, self.remote.data + ro, n))
            if self.engine.copy_engine is not None:
                self.engine.copy_engine.copy(self.remote.data + ro, self.local.data + lo, n)
        return TransferStatus()

    def batch_write(self, local_offsets, remote_offsets, sizes, uid) -> TransferStatus:
        raise NotImplementedError("the adapter drives MoRIIO's READ mode only")


class IOEngine:
    """``mori.io.IOEngine``: registrations, sessions and transfer ids, no hardware."""

    def __init__(self, key: str, config: Any = None) -> None:
        self.key = key
        self.registered: list[MemoryDesc] = []
        self.remote_engines: list[EngineDesc] = []
        self.sessions: list[Session] = []
        self.copy_engine: Any = None
        """The round trip's ``CopyEngine`` while a load runs (None: record only)."""
        self._uids = itertools.count()

    def create_backend(self, backend_type: Any, config: Any) -> None:
        pass

    def get_engine_desc(self) -> EngineDesc:
        return EngineDesc(self.key)

    def register_torch_tensor(self, tensor: Any) -> MemoryDesc:
        desc = MemoryDesc(self.key, tensor.data_ptr(), tensor.numel() * tensor.element_size())
        self.registered.append(desc)
        return desc

    def register_remote_engine(self, desc: EngineDesc) -> None:
        self.remote_engines.append(desc)

    def create_session(self, local: MemoryDesc, remote: MemoryDesc) -> Session:
        session = Session(self, local, remote)
        self.sessions.append(session)
        return session

    def allocate_transfer_uid(self) -> int:
        return next(self._uids)


_MORI_CONNECTOR = {"IOEngine": IOEngine, "IOEngineConfig": _config, "BackendType": BackendType}
_MORI_ENGINE = {"IOEngine": IOEngine, "EngineDesc": EngineDesc, "MemoryDesc": MemoryDesc, "BackendType": BackendType,
                "PollCqMode": PollCqMode, "RdmaBackendConfig": _config, "XgmiBackendConfig": _config}


# --- ZMQ stand-ins for the handshake ------------------------------------------------------------


class _Served(Exception):
    """Ends the listener's serve loop after one metadata request."""


class _ListenerSocket:
    """The ROUTER socket of ``_moriio_handshake_listener``: one metadata request, then done."""

    def __init__(self, request: bytes) -> None:
        self.requests = [[b"kvconform", request]]
        self.sent: list[tuple[bytes, ...]] = []

    def recv_multipart(self):
        if not self.requests:
            raise _Served
        return self.requests.pop(0)

    def send_multipart(self, frames) -> None:
        self.sent.append(tuple(frames))


class _DialSocket:
    """The DEALER socket of ``_moriio_handshake``: receives what the listener sent (ROUTER
    strips the identity frame)."""

    def __init__(self, frames: list[tuple[bytes, ...]]) -> None:
        self.frames = [list(f[1:]) for f in frames]

    def send(self, message: bytes) -> None:
        pass

    def recv_multipart(self):
        return self.frames.pop(0)


@contextlib.contextmanager
def _sockets(socket: Any) -> Iterator[Any]:
    yield socket


@dataclass
class _Advertised:
    """What the worker's handshake listener thread was started with."""

    metadata: Any = None
    region_metadata: dict[str, list[bytes]] = field(default_factory=dict)
    args: tuple = ()


def _shut_down(worker: Any) -> None:
    """The worker's own shutdown, once: its ``__del__`` repeats it, maybe after the logging
    module is torn down at exit, and skips the wrapper when it is gone."""
    worker.shutdown()
    worker.moriio_wrapper = None


# --- the adapter -----------------------------------------------------------------------------


class MoRIIOAdapter(BuiltInAdapter):
    """``validate_registration`` adapter around the real MoRIIO worker (READ mode)."""

    connector = "MoRIIOConnector"
    vllm_module = f"{_MODULE}.moriio_connector"

    def init_state(self) -> None:
        self.worker: Any = None
        self.engine: IOEngine | None = None
        self.caches: dict[str, Any] = {}
        self.advertised = _Advertised()
        self.transfer_groups = 0
        self.backends: Mapping[str, Any] = {}
        self._serve: Any = None
        self._requests = itertools.count()
        self._planned: dict[int, dict[str, Ranges]] = {}

    # --- registration ---------------------------------------------------------------------

    @contextlib.contextmanager
    def _fakes(self, backends: Mapping[str, Any]) -> Iterator[None]:
        """mori.io, the TP world, ports and the attention-backend lookup, while vLLM's code runs."""
        from vllm.distributed.kv_transfer.kv_connector.v1.moriio import moriio_common as common
        from vllm.distributed.kv_transfer.kv_connector.v1.moriio import moriio_connector as mc
        from vllm.distributed.kv_transfer.kv_connector.v1.moriio import moriio_engine as me

        attention = next((b for n, b in backends.items() if n in self.ctx.layers and not self.ctx.layers[n].is_mamba),
                         next(iter(backends.values()), None))
        ports = itertools.count(_HANDSHAKE_PORT + 100)
        with contextlib.ExitStack() as stack:
            for module, names in ((mc, _MORI_CONNECTOR), (me, _MORI_ENGINE)):
                for name, value in names.items():
                    stack.enter_context(mock.patch.object(module, name, value, create=True))
            for module, name, value in (
                (mc, "MoRIIO_enabled", True),
                (mc, "get_world_group", lambda: SimpleNamespace(rank=0, local_rank=0)),
                (mc, "get_tp_group", lambda: SimpleNamespace(rank_in_group=0, world_size=1)),
                (mc, "get_tensor_model_parallel_world_size", lambda: 1),
                (mc, "get_attn_backend", lambda *a, **k: attention),
                (common, "get_tensor_model_parallel_rank", lambda: 0),
                (common, "get_tensor_model_parallel_world_size", lambda: 1),
                (common, "get_open_port", lambda: next(ports)),
            ):
                stack.enter_context(mock.patch.object(module, name, value))
            yield

    def register(self, kv_caches: Mapping[str, Any]) -> None:
        try:
            from vllm.distributed.kv_transfer.kv_connector.v1.moriio import moriio_connector as mc
            from vllm.distributed.kv_transfer.kv_connector.v1.moriio import moriio_engine as me
        except ImportError as exc:  # msgpack: a dependency of MoRIIO's, not of vLLM's CPU install
            raise Undrivable(f"vLLM's MoRIIO modules do not import here: {exc}") from exc

        advertised = self.advertised

        def listener(*args: Any) -> None:
            # The listener thread: record what it serves and signal it ready (no socket).
            advertised.metadata, ready = args[0], args[1]
            advertised.region_metadata, advertised.args = args[5], args
            ready.set()

        with contextlib.ExitStack() as stack:
            plan = case_plan(self.ctx, stack)
            vc, kcc, backends = plan.vllm_config, plan.kv_cache_config, plan.backends
            extra = {"read_mode": "true", "host_ip": _HOST, "handshake_port": _HANDSHAKE_PORT,
                     "notify_port": _HANDSHAKE_PORT + 1, "http_port": _HANDSHAKE_PORT + 2}
            use_transfer_config(stack, vc, kv_connector=self.connector, kv_role="kv_consumer", kv_connector_extra_config=extra)
            mc_model = vc.model_config
            if not hasattr(mc_model, "get_total_num_kv_heads"):
                # The project's model stand-in: TP 1, so the total is the per-rank count.
                mc_model.get_total_num_kv_heads = mc_model.get_num_kv_heads
            stack.enter_context(self._fakes(backends))
            self._serve = mc.MoRIIOConnectorWorker._moriio_handshake_listener  # the real one, for _handshake
            stack.enter_context(mock.patch.object(mc.MoRIIOConnectorWorker, "_moriio_handshake_listener", staticmethod(listener)))
            stack.enter_context(mock.patch.object(me.MoRIIOWrapper, "async_wait_reqid", lambda wrapper: None))
            worker = mc.MoRIIOConnectorWorker(vc, _LOCAL_ID, kcc)
            # Shut it down with the adapter, or at exit while the modules its __del__ uses exist.
            weakref.finalize(self, _shut_down, worker)
            try:
                worker.register_kv_caches(dict(kv_caches))
            except Exception as exc:
                self._undrivable_region(exc, kv_caches)
                raise
            self.worker, self.engine = worker, worker.moriio_engine
            self.caches, self.backends = dict(kv_caches), backends
            self.transfer_groups = len(kcc.transfer_groups)
            self._handshake(_LOCAL_ID, advertised.metadata, advertised.region_metadata)

    def _undrivable_region(self, exc: Exception, kv_caches: Mapping[str, Any]) -> None:
        """Raise ``Undrivable`` if ``exc`` is the shared region failing on a CPU pool."""
        import traceback

        frames = {f.name for f in traceback.extract_tb(exc.__traceback__)}
        storage = next(iter(kv_caches.values())).untyped_storage()
        base, nbytes = storage.data_ptr(), storage.nbytes()
        if "_build_shared_kv_mr" in frames and (base % PAGE or nbytes % PAGE):
            raise Undrivable(
                f"this CPU pool starts {base % PAGE} bytes into a {PAGE}-byte page and is {nbytes} bytes: MoRIIO "
                f"registers it as one page-aligned RDMA region ({SHARED_MR_SOURCE.split('v1/')[-1]}), which needs "
                f"ROCm's page-padded pool ({ROCM_PADDING_SOURCE}) on page-aligned device memory "
                f"({type(exc).__name__}: {exc})") from exc

    def _handshake(self, engine_id: str, metadata: Any, region_metadata: Mapping[str, list[bytes]]) -> None:
        """The worker's own handshake with a peer advertising ``metadata`` / ``region_metadata``,
        served by the worker's own listener code over in-process sockets."""
        from vllm.distributed.kv_transfer.kv_connector.v1.moriio import moriio_connector as mc
        from vllm.distributed.kv_transfer.kv_connector.v1.moriio.moriio_common import MoRIIOConstants

        listening = _ListenerSocket(MoRIIOConstants.GET_META_MSG)
        _, _, port, tp_rank, dp_rank, _ = self.advertised.args
        with mock.patch.object(mc, "zmq_ctx", lambda kind, path: _sockets(listening)):
            with contextlib.suppress(_Served):
                self._serve(metadata, threading.Event(), port, tp_rank, dp_rank, dict(region_metadata))
        with mock.patch.object(mc, "zmq_ctx", lambda kind, path: _sockets(_DialSocket(listening.sent))):
            self.worker._moriio_handshake(_HOST, _HANDSHAKE_PORT, 1, self.worker.get_engine_name_with_dp(engine_id, 0))

    @property
    def kernel_block_size(self) -> int:
        """Tokens MoRIIO moves per block (the geometry's block size, reconciled at registration)."""
        return self.worker.block_size

    # --- the READ planning ------------------------------------------------------------------

    def _payload(self, block_ids: list[int]) -> tuple[list[int], ...]:
        """The block-id payload ``_read_blocks`` takes: per transfer group, or (attention,
        Mamba groups...) for a hybrid model (``_read_blocks``' ``expected_groups``)."""
        w = self.worker
        groups = 1 + w._num_mamba_transfer_groups if w._has_mamba else self.transfer_groups
        return tuple(list(block_ids) for _ in range(groups))

    def _read(self, local_ids: list[int], remote_ids: list[int], peer: str) -> dict[str, list[tuple[int, int, int]]]:
        """Run ``_read_blocks``; per layer, the reads it posted (absolute local, remote, size)."""
        w = self.worker
        request = f"kvconform-{next(self._requests)}"
        with self._fakes(self.backends):
            sessions, _ = w._get_built_session(w.get_engine_name_with_dp(peer, 0))
            for s in sessions:
                s.reads.clear()
            w._read_blocks(
                local_block_ids=self._payload(local_ids), remote_block_ids=self._payload(remote_ids), dst_engine_id=peer,
                request_id=request, transfer_id=request, remote_host=_HOST, remote_notify_port=_HANDSHAKE_PORT + 1,
                remote_tp_size=1,
            )
        statuses = [s for layer in w._recving_transfers.pop(request, {}).values() for s in layer]
        for book in (w._recving_transfers_start, w._recving_local_blocks, w._recving_transfers_callback_addr):
            book.pop(request, None)
        w._reads_issued_this_step.clear()
        failed = [s.Message() for s in statuses if s.Failed()]
        if failed:
            raise RuntimeError(f"MoRIIO READ of blocks {remote_ids} -> {local_ids}: {failed[0]}")
        return {layer: [r for i in w._region_session_indices(layer) for r in sessions[i].reads]
                for layer in w.layer_name_to_local_kv_cache_metadata}

    def descriptors(self, layer: str, block_id: int) -> Ranges:
        if block_id not in self._planned:
            reads = self._read([block_id], [block_id], _LOCAL_ID)
            self._planned[block_id] = {name: [(lo, n) for lo, _, n in r] for name, r in reads.items()}
        return self._planned[block_id].get(layer, [])

    @property
    def transferred_layers(self) -> frozenset[str]:
        """The layers of transfer-enabled groups (``register_kv_caches`` drops the others)."""
        return frozenset(self.worker.kv_caches)

    # --- the round trip ---------------------------------------------------------------------

    def store(self, block_ids, engine) -> tuple[str, list[int]]:
        """The peer: an identical engine holding a copy of this pool as it is now (the copy
        is the peer's own prefill, not MoRIIO's doing); the handle is (peer, its block ids)."""
        import msgspec

        storage = next(iter(self.caches.values())).untyped_storage()
        copy = engine.host_buffer(storage.nbytes())
        engine.copy(storage.data_ptr(), copy.data_ptr(), storage.nbytes())
        delta = copy.data_ptr() - storage.data_ptr()
        peer = f"{_PEER_ID}-{next(self._requests)}"
        metadata = msgspec.structs.replace(self.advertised.metadata, engine_id=peer,
                                           kv_caches_base_addr=[a + delta for a in self.advertised.metadata.kv_caches_base_addr])
        regions = {name: [self._shifted(m, delta) for m in metas] for name, metas in self.advertised.region_metadata.items()}
        with self._fakes(self.backends):
            self._handshake(peer, metadata, regions)
        return peer, list(block_ids)

    @staticmethod
    def _shifted(packed: bytes, delta: int) -> bytes:
        desc = MemoryDesc.unpack(packed)
        return replace(desc, engine_key=_PEER_ID, data=desc.data + delta).pack()

    def load(self, handle: tuple[str, list[int]], block_ids, engine) -> None:
        """MoRIIO's own READ of the stored blocks from the peer into ``block_ids``."""
        assert self.engine is not None
        peer, stored = handle
        self.engine.copy_engine = engine
        try:
            self._read(list(block_ids), stored, peer)
        finally:
            self.engine.copy_engine = None


__all__ = ["IOEngine", "MemoryDesc", "MoRIIOAdapter", "Session"]
