"""The target release's ``OffloadingConnector`` (worker role, default CPU tier) driven on CPU, as a
connector adapter.

Its own constructor (offloading config, ``CPUOffloadingSpec``), ``register_kv_caches``
(canonical mappings, packed-row detection, group aliasing), the CPU worker and its
handlers, and the transfers through the connector's own entry points (``wait_for_save``,
``start_load_kv``, ``get_finished``) run. Faked, hardware or a host service: the CUDA
platform, streams and events, ``Tensor.is_cuda`` (True for the registered pool only),
``SharedOffloadRegion`` (its memory from ``engine.host_buffer``), pinning and
``ops.swap_blocks_batch`` (one ``engine.copy`` per descriptor). A layout other than the one
vLLM resolves with the connector configured is ``Undrivable`` (the connector would be handed
other tensors; it never checks the layout itself). A store uses CPU chunks from the end of
the cache, so chunk 0 never hides an offset error. Findings:
docs/findings/offloading-lhbnc-packed-row-misdetection.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import mmap
from types import SimpleNamespace
from typing import Any, Iterator, Mapping, Sequence
from unittest import mock

from gpu_impl.connectors.base import BuiltInAdapter, Ranges, Undrivable
from gpu_impl.connectors.cuda_stand_ins import SyncEvent, SyncStream
from gpu_impl.connectors.vllm_setup import case_plan, set_until_exit, use_transfer_config

REQUIRED_LAYOUT_SOURCE = "vllm/distributed/kv_transfer/kv_connector/v1/offloading_connector.py:236"
"""Where ``OffloadingConnector.get_required_kvcache_layout`` says LBHNC (BLHNC with HiSparse)."""


_CUDA = SimpleNamespace(
    is_cuda_alike=lambda: True,
    is_rocm=lambda: False,
    is_xpu=lambda: False,
    Stream=SyncStream,
    current_stream=SyncStream,
    stream=lambda stream: contextlib.nullcontext(),
)
"""The ``current_platform`` answers the CPU tier reads."""


class SwapBlocks:
    """Stands in for ``ops.swap_blocks_batch``: one ``engine.copy`` per descriptor.

    Without an engine it only records (the descriptors a store would issue)."""

    def __init__(self) -> None:
        self.engine: Any = None
        self.issued: list[tuple[int, int, int]] = []

    def __call__(self, src_addrs, dst_addrs, sizes, is_src_access_order_any: bool = False) -> None:
        for src, dst, nbytes in zip(src_addrs.tolist(), dst_addrs.tolist(), sizes.tolist()):
            self.issued.append((src, dst, nbytes))
            if self.engine is not None:
                self.engine.copy(src, dst, nbytes)


def _host_region_class():
    from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion

    class HostRegion(SharedOffloadRegion):
        """``SharedOffloadRegion`` without the ``/dev/shm`` files, the mmap and the barrier.

        The attributes its own ``create_next_worker_view`` / ``create_next_canonical_view``
        read are set as its ``__init__`` sets them; ``bind`` moves the region and every view
        carved from it onto one ``engine.host_buffer``."""

        def __init__(self, engine_id: str, num_chunks: int, rank: int | None, kv_bytes_per_chunk: int,
                     cpu_page_size: int, barrier: Any = None, **kwargs: Any) -> None:
            import torch

            self.page_size = mmap.PAGESIZE
            assert kv_bytes_per_chunk % self.page_size == 0
            self.num_chunks = num_chunks
            self._row_stride = kv_bytes_per_chunk
            self.total_size_bytes = num_chunks * kv_bytes_per_chunk
            self.cpu_page_size = cpu_page_size
            self.mmap_path = f"/dev/shm/vllm_offload_{engine_id}.mmap"
            self._segments = []
            self._creator = False
            self.mmap_obj = None
            self.fd = None
            self.rank = rank
            if rank is not None:
                self._worker_offset = rank * cpu_page_size
                self._worker_area_end = (rank + 1) * cpu_page_size
            self._base = torch.zeros(self.total_size_bytes, dtype=torch.int8)
            self._views = []
            self._canonical_offset = 0
            self.is_pinned = False
            self.pinned_addresses = []
            self.engine: Any = None

        def bind(self, engine: Any) -> None:
            if engine is self.engine:
                return
            storage = engine.host_buffer(self.total_size_bytes).untyped_storage()
            for view in [self._base, *self._views]:
                view.set_(storage, view.storage_offset(), view.shape, view.stride())
            self.engine = engine

    return HostRegion


def _layout_with_connector(vc: Any, kcc: Any, backends: Mapping[str, Any]) -> str:
    """The layout vLLM's ``resolve_kv_cache_layout`` picks for the case with ``vc``'s connector
    (an explicit ``VLLM_KV_CACHE_LAYOUT`` wins over the connector's requirement)."""
    from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts, resolve_kv_cache_layout
    from vllm.v1.kv_cache_interface import iter_layer_specs

    distinct = list({cls.full_cls_name(): cls for cls in backends.values()}.values())
    supported = [layout.name for layout in get_supported_kv_cache_layouts(distinct)]
    specs = [spec for group in kcc.kv_cache_groups for spec in iter_layer_specs(group.kv_cache_spec)]
    return resolve_kv_cache_layout(vc, [supported], specs).name


@contextlib.contextmanager
def _cuda_stand_in(extra: Sequence[Any] = ()) -> Iterator[None]:
    """The platform, events and pinning the CPU tier sees (plus ``extra`` patches)."""
    import torch
    from vllm.v1.kv_offload.cpu import gpu_worker, spec

    with contextlib.ExitStack() as stack:
        for patch in (
            mock.patch.object(spec, "current_platform", _CUDA),
            mock.patch.object(gpu_worker, "current_platform", _CUDA),
            mock.patch.object(gpu_worker, "PIN_MEMORY", False),
            mock.patch.object(torch, "Event", SyncEvent),
            *extra,
        ):
            stack.enter_context(patch)
        yield


@dataclasses.dataclass(frozen=True)
class StoredBlocks:
    """What ``store`` returns: where each (offloaded group, block) went in the CPU cache."""

    engine: Any
    chunks: tuple[tuple[int, ...], ...]
    """Per offloaded group, the CPU chunk of each stored block."""


class OffloadingAdapter(BuiltInAdapter):
    """``validate_registration`` / round-trip adapter around the real OffloadingConnector worker."""

    connector = "OffloadingConnector"
    case_connector = "offloading"
    """The case's ``connector``: vLLM resolves the layout this connector asks for (LBHNC)."""
    vllm_module = "vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector"

    def init_state(self) -> None:
        self.connector_obj: Any = None
        self.swap = SwapBlocks()
        self.region: Any = None
        self._jobs = itertools.count(1)
        self._planned: dict[tuple[int, int], list[tuple[int, int, int]]] = {}

    # --- registration ------------------------------------------------------------------------

    def register(self, kv_caches: Mapping[str, Any]) -> None:
        import torch
        from vllm import _custom_ops
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import OffloadingConnector
        from vllm.v1.kv_offload.cpu import spec as cpu_spec

        with contextlib.ExitStack() as stack:
            plan = case_plan(self.ctx, stack)
            vc, kcc = plan.vllm_config, plan.kv_cache_config
            pool = next(iter(kv_caches.values())).untyped_storage().nbytes()
            # Room for every (group, logical block) in the CPU cache, chunk padding included.
            cpu_bytes = len(kcc.kv_cache_groups) * (pool + kcc.num_blocks * mmap.PAGESIZE)
            use_transfer_config(stack, vc, kv_connector="OffloadingConnector", kv_role="kv_both", engine_id="kvconform-engine",
                                kv_connector_extra_config={"cpu_bytes_to_use": cpu_bytes})
            # A recorded layout would win outright over the connector's requirement.
            set_until_exit(stack, vc.cache_config, "kv_cache_layout", None)
            layout = _layout_with_connector(vc, kcc, plan.backends)
            # The connector asks the config which runner runs (use_v2_model_runner reads the env).
            stack.enter_context(mock.patch.dict("os.environ", {"VLLM_USE_V2_MODEL_RUNNER": str(int(self.ctx.runner == "mrv2"))}))
            # The TP world is faked to one rank: this rank's heads are all the heads.
            stack.enter_context(mock.patch.object(vc.model_config, "get_total_num_kv_heads",
                                                  vc.model_config.get_num_kv_heads, create=True))

            pool_storages = {t.untyped_storage().data_ptr() for t in kv_caches.values()}
            is_cuda = torch._C.TensorBase.is_cuda

            def on_device(t) -> bool:
                return t.untyped_storage().data_ptr() in pool_storages or is_cuda.__get__(t)

            host_region = _host_region_class()
            regions: list[Any] = []

            def make_region(*args: Any, **kwargs: Any):
                regions.append(host_region(*args, **kwargs))
                return regions[-1]

            with _cuda_stand_in([
                mock.patch.object(cpu_spec, "SharedOffloadRegion", make_region),
                mock.patch.object(_custom_ops, "swap_blocks_batch", self.swap),
                mock.patch.object(torch.Tensor, "is_cuda", property(on_device)),
            ]):
                # Its own config checks run (and may refuse) whatever the tensors' layout.
                conn = OffloadingConnector(vc, KVConnectorRole.WORKER, kcc)
                if layout != self.ctx.layout:
                    raise Undrivable(
                        f"with OffloadingConnector configured vLLM resolves layout {layout} for this case "
                        f"(get_required_kvcache_layout, {REQUIRED_LAYOUT_SOURCE}), but the registered tensors are "
                        f"{self.ctx.layout} (resolved without the connector): check the case with connector='offloading'"
                    )
                conn.register_kv_caches(dict(kv_caches))
        self.connector_obj = conn
        self.region = regions[0] if regions else None
        self.caches = dict(kv_caches)

    # --- what the connector derived ------------------------------------------------------------

    @property
    def worker(self):
        """The ``OffloadingConnectorWorker``."""
        return self.connector_obj.connector_worker

    @property
    def cpu_worker(self):
        """The ``CPUOffloadingWorker`` its spec created."""
        return self.worker.worker

    @property
    def canonical(self) -> tuple[list[Any], list[list[Any]]]:
        """``(gpu tensors, refs per offloaded group)`` as the store handler holds them."""
        handler = self.cpu_worker._store_handler
        return handler.src_tensors, handler.layer_refs_per_group

    @property
    def offloaded_groups(self) -> tuple[Any, ...]:
        """The connector's ``OffloadingGroupConfig``s (the groups it offloads, in its order)."""
        return self.worker.spec.config.groups

    @property
    def transferred_layers(self) -> frozenset[str]:
        return frozenset(n for g in self.offloaded_groups for n in g.layer_names)

    def _group_of(self, layer: str) -> int | None:
        return next((i for i, g in enumerate(self.offloaded_groups) if layer in g.layer_names), None)

    def _ref_index(self, group: int, layer: str) -> int:
        """The ref (and so the descriptor of a one-block transfer) that carries ``layer``.

        ``register_kv_caches`` appends one ref per layer in the group's layer order, or one
        ref for the whole packed row shared by every layer."""
        refs = self.canonical[1][group]
        names = self.offloaded_groups[group].layer_names
        if len(refs) == len(names):
            return names.index(layer)
        if len(refs) == 1:
            return 0
        raise AssertionError(f"group {group}: {len(refs)} refs for {len(names)} layers")

    # --- the connector's own transfer paths ---------------------------------------------------------

    def _transfer(self, engine: Any, stores: dict[int, Any], loads: dict[int, Any]) -> None:
        """One engine step: metadata bound, stores deferred by ``wait_for_save`` and submitted
        with the loads by the next ``start_load_kv``, then ``get_finished``."""
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import OffloadingConnectorMetadata

        if engine is not None and self.region is not None:
            self.region.bind(engine)
        self.swap.engine = engine
        conn = self.connector_obj
        try:
            with _cuda_stand_in():
                conn.bind_connector_metadata(OffloadingConnectorMetadata(load_jobs={}, store_jobs=stores))
                conn.wait_for_save()
                conn.bind_connector_metadata(OffloadingConnectorMetadata(load_jobs=loads, store_jobs={}))
                conn.start_load_kv(None)
                conn.get_finished(set())
                conn.clear_connector_metadata()
        finally:
            self.swap.engine = None

    def _store_jobs(self, block_ids: list[int], chunks: list[list[int]]) -> dict[int, Any]:
        """Store jobs as the scheduler builds them: one per (group, block), the GPU spec
        naming only that group."""
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import TransferJob
        from vllm.v1.kv_offload.base import GPULoadStoreSpec
        from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

        n = len(self.offloaded_groups)
        jobs = {}
        for g, group_chunks in enumerate(chunks):
            for index, (block, chunk) in enumerate(zip(block_ids, group_chunks)):
                sizes, indices = [0] * n, [0] * n
                sizes[g], indices[g] = 1, index
                jobs[next(self._jobs)] = TransferJob(
                    req_id="kvconform", src_spec=GPULoadStoreSpec([block], group_sizes=sizes, block_indices=indices),
                    dst_spec=CPULoadStoreSpec([chunk]))
        return jobs

    def descriptors(self, layer: str, block_id: int) -> Ranges:
        group = self._group_of(layer)
        if group is None:
            return []
        if (group, block_id) not in self._planned:
            chunks = [[] for _ in self.offloaded_groups]
            chunks[group] = [0]
            self.swap.issued.clear()
            self._transfer(None, self._store_jobs([block_id], chunks), {})
            self._planned[group, block_id] = list(self.swap.issued)
        src, _, nbytes = self._planned[group, block_id][self._ref_index(group, layer)]
        return [(src, nbytes)]

    def store(self, block_ids: list[int], engine: Any) -> StoredBlocks:
        num_chunks = self.worker.spec.num_chunks
        n = len(self.offloaded_groups)
        free = iter(range(num_chunks - 1, -1, -1))
        chunks = [[next(free) for _ in block_ids] for _ in range(n)]
        self._transfer(engine, self._store_jobs(list(block_ids), chunks), {})
        return StoredBlocks(engine, tuple(tuple(c) for c in chunks))

    def load(self, handle: StoredBlocks, block_ids: list[int], engine: Any) -> None:
        """One sync load job over every offloaded group, as the scheduler issues a load."""
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import TransferJob
        from vllm.v1.kv_offload.base import GPULoadStoreSpec
        from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

        if handle.engine is not engine:
            raise ValueError("load: the stored chunks live in another copy engine's host buffer")
        gpu = GPULoadStoreSpec([b for _ in handle.chunks for b in block_ids],
                               group_sizes=[len(block_ids)] * len(handle.chunks), block_indices=[0] * len(handle.chunks))
        cpu = CPULoadStoreSpec([c for group in handle.chunks for c in group])
        job = TransferJob(req_id="kvconform", src_spec=cpu, dst_spec=gpu, sync=True)
        self._transfer(engine, {}, {next(self._jobs): job})


__all__ = ["OffloadingAdapter", "StoredBlocks", "SwapBlocks"]
