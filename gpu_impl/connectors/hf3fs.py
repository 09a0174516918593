"""The target release's ``HF3FSKVConnector`` (KV pages in a 3FS file) driven on CPU, as a connector adapter.

Its own constructor, ``register_kv_caches``, save path (``wait_for_save`` -> the gather
kernel -> batched file writes) and load path (``start_load_kv`` -> file reads -> the scatter
kernel) run, the two Triton kernels in the interpreter (``INTERPRETER_ENV`` set before
triton/vLLM are imported, else ``register`` raises ``Undrivable``). Faked: the 3FS file
client (``MemoryFileClient``: pages in engine host buffers), the metadata server's client
(``InProcessMetadataClient``), CUDA streams and events, pinning, the manager's threads (its
tasks run on the calling thread) and the TP rank. ``descriptors(layer, b)`` are the pool
bytes the connector's own scatter writes for logical block ``b``. Findings:
docs/findings/hf3fs-logical-ids-on-kernel-blocks.md.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import tempfile
from concurrent.futures import Future
from typing import Any, Callable, Iterator, Mapping
from unittest import mock

from gpu_impl.connectors.base import ALIASED_GROUPS, BuiltInAdapter, Ranges, Undrivable, groups_alias
from gpu_impl.connectors.cuda_stand_ins import SyncEvent, SyncStream
from gpu_impl.connectors.vllm_setup import case_plan, set_until_exit, use_transfer_config

_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.hf3fs"
_HELPER = f"{_MODULE}.utils.gather_scatter_helper"
INTERPRETER_ENV = {"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
"""Set before triton/vLLM are imported for the gather/scatter kernels to run on CPU."""
MAX_INTERPRETED_POOL_BYTES = 512 << 10
"""Pools the Triton interpreter gathers and scatters here: it moves about a MiB in tens of
seconds, so larger pools (the 4 MiB named cases) would take minutes each."""
MAX_LAYERS = 127
"""Layers the descriptor probe tells apart (one positive int8 marker per layer)."""


def interpreter_problem() -> str | None:
    """Why this process cannot run HF3FS's Triton kernels on CPU, or None when it can."""
    import importlib

    if any(os.environ.get(k) != v for k, v in INTERPRETER_ENV.items()):
        return ("HF3FS's gather/scatter kernels are Triton: on CPU they need the Triton interpreter, "
                "TRITON_INTERPRET=1 and CUDA_VISIBLE_DEVICES='' set before triton/vLLM are imported")
    helper = importlib.import_module(_HELPER)
    for kernel in (helper.kv_cache_gather_kernel, helper.kv_cache_scatter_kernel):
        if type(kernel).__name__ != "InterpretedFunction":
            return (f"{_HELPER} was imported before TRITON_INTERPRET=1 was set: its kernels are not "
                    "interpreted (set it before anything imports vLLM)")
    return None


# --- the 3FS service stand-ins -----------------------------------------------------------------


class MemoryFile:
    """The 3FS file of one rank: its written pages, each an engine host buffer."""

    def __init__(self) -> None:
        self.engine: Any = None
        self.pages: dict[int, Any] = {}

    def bind(self, engine: Any) -> None:
        """A fresh, empty file whose pages come from ``engine`` (earlier pages are not its memory)."""
        self.engine, self.pages = engine, {}


class MemoryFileClient:
    """``Hf3fsClient`` with the file in engine host buffers: the same results per entry
    (``bytes_per_page``, or -1 for an entry outside the file or of the wrong size)."""

    def __init__(self, file: MemoryFile, path: str, size: int, bytes_per_page: int, entries: int) -> None:
        self.file, self.path, self.size = file, path, size
        self.bytes_per_page, self.entries = bytes_per_page, entries

    def _fits(self, offset: int, tensor: Any) -> bool:
        nbytes = tensor.numel() * tensor.element_size()
        return 0 <= offset and offset + nbytes <= self.size and nbytes == self.bytes_per_page

    def batch_write(self, offsets: list[int], tensors: list[Any], event: Any = None) -> list[int]:
        out = []
        for offset, tensor in zip(offsets, tensors):
            if not self._fits(offset, tensor):
                out.append(-1)
                continue
            page = self.file.pages.get(offset)
            if page is None:
                page = self.file.pages[offset] = self.file.engine.host_buffer(self.bytes_per_page)
            self.file.engine.copy(tensor.data_ptr(), page.data_ptr(), self.bytes_per_page)
            out.append(self.bytes_per_page)
        return out

    def batch_read(self, offsets: list[int], tensors: list[Any]) -> list[int]:
        out = []
        for offset, tensor in zip(offsets, tensors):
            page = self.file.pages.get(offset)
            if page is None or not self._fits(offset, tensor):
                out.append(-1)  # never written: the adapter only loads what it stored
                continue
            self.file.engine.copy(page.data_ptr(), tensor.data_ptr(), self.bytes_per_page)
            out.append(self.bytes_per_page)
        return out

    def close(self) -> None:
        pass

    def flush(self) -> None:
        pass


class InProcessMetadataClient:
    """``Hf3fsGlobalMetadataClient`` answered by the metadata server's own
    ``GlobalMetadataState`` (as its HTTP handlers do), without the server."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        from vllm.distributed.kv_transfer.kv_connector.v1.hf3fs.hf3fs_metadata_server import GlobalMetadataState

        self._state_cls = GlobalMetadataState
        self.state = GlobalMetadataState()
        self.ranks: list[tuple[int, int]] = []
        """``(rank, num_pages)`` of each worker initialisation, replayed by ``reset``."""

    def initialize(self, rank: int, num_pages: int = 0, role: str = "worker") -> None:
        if role == "worker" and num_pages > 0:  # the server's rule (initialize_rank handler)
            self.ranks.append((rank, num_pages))
            self.state.initialize_rank(rank, num_pages)

    def reset(self) -> None:
        """An empty server for a fresh file (the workers' initialisations kept)."""
        self.state = self._state_cls()
        for rank, num_pages in self.ranks:
            self.state.initialize_rank(rank, num_pages)

    def allocate_pages_for_keys(self, rank: int, keys: list[tuple[str, str]]) -> list[tuple[str, int]]:
        return list(self.state.allocate_pages_for_keys(rank, keys).items())

    def confirm_write_for_keys(self, rank: int, key_confirmations, pages_to_release=None) -> None:
        self.state.confirm_write_for_keys(rank, key_confirmations, pages_to_release)

    def batch_key_exists(self, keys: list[str]) -> list[bool]:
        return self.state.batch_key_exists(keys)

    def get_key_locations(self, rank: int, keys: list[str]) -> list[int | None]:
        return self.state.get_key_locations(rank, keys)


# --- CUDA and thread stand-ins ----------------------------------------------------------------


class _InlineExecutor:
    """The manager's I/O thread pool, running each submitted call at once."""

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as exc:  # delivered through the future, as a pool does
            future.set_exception(exc)
        return future

    def shutdown(self, wait: bool = True) -> None:
        pass


@contextlib.contextmanager
def _cpu_device() -> Iterator[None]:
    """CUDA streams/events as no-ops and no pinning, while the connector's code runs."""
    import torch
    import vllm.utils.torch_utils as torch_utils

    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(torch.cuda, "Stream", SyncStream))
        stack.enter_context(mock.patch.object(torch.cuda, "Event", SyncEvent))
        stack.enter_context(mock.patch.object(torch.cuda, "stream", lambda stream=None: contextlib.nullcontext()))
        stack.enter_context(mock.patch.object(torch_utils, "PIN_MEMORY", False))
        yield


def _manager_class():
    """``AsyncOperationManager`` without its threads: queues and an inline I/O pool."""
    from vllm.distributed.kv_transfer.kv_connector.v1.hf3fs import hf3fs_connector as hf

    class InlineOperationManager(hf.AsyncOperationManager):
        def _init_worker_threads(self) -> None:
            import threading

            self._stop_event = threading.Event()
            self._save_queue = queue.Queue()
            self._load_queue = queue.Queue()
            self._io_executor = _InlineExecutor()

    return InlineOperationManager


# --- the adapter -----------------------------------------------------------------------------


class HF3FSAdapter(BuiltInAdapter):
    """``validate_registration`` adapter around the real ``HF3FSKVConnector`` worker."""

    connector = "HF3FSKVConnector"
    vllm_module = f"{_MODULE}.hf3fs_connector"

    def init_state(self) -> None:
        self.conn: Any = None
        self.caches: dict[str, Any] = {}
        self.file = MemoryFile()
        self.metadata: InProcessMetadataClient | None = None
        self._engine: Any = None
        self._requests = itertools.count()
        self._probed: dict[int, dict[str, Ranges]] = {}
        self.failures: list[str] = []
        """The manager's failure messages (``_fail_task``), in order."""

    # --- registration ---------------------------------------------------------------------

    def register(self, kv_caches: Mapping[str, Any]) -> None:
        problem = interpreter_problem()
        if problem is not None:
            raise Undrivable(problem)
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        from vllm.distributed.kv_transfer.kv_connector.v1.hf3fs import hf3fs_connector as hf

        def client(**kwargs: Any) -> MemoryFileClient:
            return MemoryFileClient(self.file, **kwargs)

        def metadata_client(*args: Any, **kwargs: Any) -> InProcessMetadataClient:
            self.metadata = InProcessMetadataClient(*args, **kwargs)
            return self.metadata

        with contextlib.ExitStack() as stack:
            plan = case_plan(self.ctx, stack)
            vc, kcc = plan.vllm_config, plan.kv_cache_config
            # One I/O job and the minimum staging pages (8 per job): the knobs change the
            # batching, not which bytes move; the file keeps the connector's default size.
            extra = {"hf3fs_storage_path": tempfile.gettempdir(), "hf3fs_client_numjobs": 1, "hf3fs_max_device_buffer_count": 0}
            use_transfer_config(stack, vc, kv_connector=self.connector, kv_role="kv_both", kv_connector_extra_config=extra)
            # The logical block size the scheduler hands out ids of (hashes cover this many tokens).
            set_until_exit(stack, vc.cache_config, "block_size", self.ctx.block_size)
            stack.enter_context(_cpu_device())
            for name, value in {
                "Hf3fsClient": client,
                "Hf3fsMetadataClient": metadata_client,
                "AsyncOperationManager": _manager_class(),
                "get_tensor_model_parallel_rank": lambda: 0,
            }.items():
                stack.enter_context(mock.patch.object(hf, name, value))
            stack.enter_context(mock.patch.object(hf.atexit, "register", lambda *a, **k: None))
            stack.enter_context(mock.patch.object(hf.signal, "signal", lambda *a, **k: None))
            conn = hf.HF3FSKVConnector(vc, KVConnectorRole.WORKER, kcc)
            conn.register_kv_caches(dict(kv_caches))
        # After the connector's own registration (its refusals come first): the transfers run
        # its Triton kernels in the interpreter, which bounds the pool.
        pool = next(iter(kv_caches.values())).untyped_storage().nbytes()
        if pool > MAX_INTERPRETED_POOL_BYTES:
            raise Undrivable(f"the {pool}-byte pool is over the {MAX_INTERPRETED_POOL_BYTES} bytes HF3FS's Triton "
                             "kernels are run on in the interpreter (minutes per MiB; a GPU runs them compiled)")
        if groups_alias(kcc, kv_caches):
            raise Undrivable(ALIASED_GROUPS)
        self.conn = conn
        self.caches = dict(kv_caches)
        manager = conn._async_manager
        fail = manager._fail_task

        def record_failure(operation: str, error_msg: str, request_id: str, future: Future) -> None:
            self.failures.append(f"{operation}: {error_msg}")
            fail(operation, error_msg, request_id, future)

        manager._fail_task = record_failure

    @property
    def kernel_block_size(self) -> int:
        """Tokens per registered block as HF3FS took them (``shape[2]``)."""
        return self.conn._local_block_size

    # --- the connector's own load path, observed ------------------------------------------

    def _pool(self):
        import torch

        storage = next(iter(self.caches.values())).untyped_storage()
        return torch.empty(0, dtype=torch.int8).set_(storage)

    def _probe(self, block_id: int) -> dict[str, Ranges]:
        """Per layer, the pool bytes the connector's scatter writes for ``block_id``."""
        import torch

        names = list(self.conn._kv_caches)  # the kernel's layer index is this order
        if len(names) > MAX_LAYERS:
            raise Undrivable(f"{len(names)} layers: the descriptor probe tells at most {MAX_LAYERS} apart")
        allocator = self.conn._async_manager._load_buffer_allocator
        pool = self._pool()
        saved = pool.clone()
        (page,) = allocator.alloc_buffer(1)
        try:
            pool.zero_()
            marks = page.view(torch.int8)
            for index in range(len(names)):
                marks[index].fill_(index + 1)
            with _cpu_device():
                self.conn._gather_or_scatter_kv_caches([block_id], [page], "scatter")
            base = pool.data_ptr()
            out: dict[str, Ranges] = {}
            for index, name in enumerate(names):
                hit = torch.nonzero(pool == index + 1).flatten()
                if hit.numel() == 0:
                    out[name] = []
                    continue
                breaks = torch.nonzero(hit[1:] != hit[:-1] + 1).flatten()
                starts = torch.cat([hit[:1], hit[breaks + 1]]).tolist()
                ends = torch.cat([hit[breaks], hit[-1:]]).add(1).tolist()
                out[name] = [(base + a, z - a) for a, z in zip(starts, ends)]
            return out
        finally:
            pool.copy_(saved)
            allocator.free_buffer([page])

    def descriptors(self, layer: str, block_id: int) -> Ranges:
        if block_id not in self._probed:
            self._probed[block_id] = self._probe(block_id)
        return self._probed[block_id].get(layer, [])

    # --- the round trip: the connector's own save and load --------------------------------

    def _attach(self, engine: Any) -> None:
        """Re-home the staging pages and the file into ``engine``'s memory (once per engine)."""
        if engine is self._engine:
            return
        manager = self.conn._async_manager
        for allocator in (manager._save_buffer_allocator, manager._load_buffer_allocator):
            if allocator._inuse_count:
                raise RuntimeError("HF3FS staging pages are in use: a transfer is still running")
            allocator._free_buffers = [
                engine.host_buffer(b.numel() * b.element_size()).view(b.dtype).view(b.shape)
                for b in allocator._free_buffers
            ]
        self.file.bind(engine)
        assert self.metadata is not None
        self.metadata.reset()
        self._engine = engine

    def _run(self, tasks: queue.Queue, handle: Callable[[Any], None], what: str) -> None:
        """Run the queued tasks as the manager's worker thread would; raise if one failed."""
        failed = len(self.failures)
        ok = True
        with _cpu_device():
            while not tasks.empty():
                task = tasks.get_nowait()
                handle(task)
                ok = task[3].result() and ok  # (request_id, block_ids, hashes, future, ...)
        if not ok:
            raise RuntimeError(f"HF3FSKVConnector {what} failed: {'; '.join(self.failures[failed:]) or 'no reason given'}")

    def _request(self, block_ids, tokens: list[int], **ops: Any):
        from vllm.distributed.kv_transfer.kv_connector.v1.hf3fs.utils.common import HF3FSConnectorMetadata, HF3FSRequestMetadata

        meta = HF3FSConnectorMetadata()
        meta.add_request(HF3FSRequestMetadata(
            request_id=f"kvconform-{next(self._requests)}", token_ids=tokens, block_ids=list(block_ids), **ops))
        return meta

    def store(self, block_ids, engine) -> list[int]:
        """Save the blocks as one request (``wait_for_save``); the handle is its tokens."""
        from vllm.distributed.kv_transfer.kv_connector.v1.hf3fs.utils.common import SaveBlockInfo

        self._attach(engine)
        n = len(block_ids) * self.conn._block_size
        start = next(self._requests) * n  # distinct tokens per store: distinct block hashes
        tokens = list(range(start, start + n))
        self.conn.bind_connector_metadata(self._request(block_ids, tokens, save_block_op=SaveBlockInfo(skip_leading_blocks=0)))
        try:
            with _cpu_device():
                self.conn.wait_for_save()
        finally:
            self.conn.clear_connector_metadata()
        manager = self.conn._async_manager
        self._run(manager._save_queue, manager._handle_save_task, f"save of blocks {list(block_ids)}")
        return tokens

    def load(self, handle: list[int], block_ids, engine) -> None:
        """Load the stored tokens' blocks into ``block_ids`` (``start_load_kv``)."""
        from vllm.distributed.kv_transfer.kv_connector.v1.hf3fs.utils.common import LoadBlockInfo

        if engine is not self._engine:
            raise ValueError("load with another copy engine than the store: the stored file is not in its memory")
        op = LoadBlockInfo(num_computed_blocks=0, num_blocks_to_load=len(block_ids), need_fetch_block_ids=list(block_ids))
        self.conn.bind_connector_metadata(self._request(block_ids, handle, load_block_op=op))
        try:
            self.conn.start_load_kv(None)
        finally:
            self.conn.clear_connector_metadata()
        manager = self.conn._async_manager
        self._run(manager._load_queue, manager._handle_load_task, f"load into blocks {list(block_ids)}")


__all__ = ["HF3FSAdapter", "InProcessMetadataClient", "MemoryFile", "MemoryFileClient", "interpreter_problem"]
