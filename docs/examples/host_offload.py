"""The worked example of docs/connector-authors.md: a small host-offload connector and its
kvconform adapter, checked with ``kvconform check`` exactly like vLLM's own connectors.

``HostOffloadWorker`` stands for your connector's worker: it registers the ``kv_caches``
vLLM hands it and saves / loads logical blocks through a copy primitive (on a GPU,
``cudaMemcpyAsync`` or a copy kernel). ``HostOffloadAdapter`` is all kvconform needs: it
runs the worker's own code and swaps only the copy primitive for the check's bounds-checked
``engine.copy``.

    PYTHONPATH=docs/examples kvconform check --connector host_offload:HostOffloadAdapter --case flashinfer-b128-k64
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

Copy = Callable[[int, int, int], None]
"""``copy(src_address, dst_address, nbytes)``."""


class HostOffloadWorker:
    """A connector worker that keeps whole logical blocks in one host buffer per layer."""

    def __init__(self, num_blocks: int, copy: Copy) -> None:
        self.num_blocks = num_blocks  # kv_cache_config.num_blocks: logical blocks
        self.copy = copy

    def register_kv_caches(self, kv_caches: Mapping[str, Any]) -> None:
        self.layers = {}
        for name, t in kv_caches.items():
            es = t.element_size()
            ratio = t.shape[0] // self.num_blocks  # kernel blocks per logical block (FlashInfer at 128: 2)
            runs = _runs(t)  # byte runs of one kernel block, relative to its start
            self.layers[name] = (t.data_ptr(), t.stride(0) * es, ratio, runs)

    def block_runs(self, layer: str, block_id: int) -> list[tuple[int, int]]:
        """Absolute (address, length) runs of logical block ``block_id`` of ``layer``."""
        base, stride0, ratio, runs = self.layers[layer]
        return [(base + k * stride0 + off, n) for k in range(block_id * ratio, (block_id + 1) * ratio) for off, n in runs]

    def save(self, block_id: int, host: dict[str, int]) -> None:
        """Copy every layer's block to its host address (``host[layer]``)."""
        for layer in self.layers:
            at = host[layer]
            for addr, n in self.block_runs(layer, block_id):
                self.copy(addr, at, n)
                at += n

    def load(self, block_id: int, host: dict[str, int]) -> None:
        for layer in self.layers:
            at = host[layer]
            for addr, n in self.block_runs(layer, block_id):
                self.copy(at, addr, n)
                at += n


def _runs(t: Any) -> list[tuple[int, int]]:
    """(offset, length) byte runs of ``t[0]`` from its strides: dense pages are one run,
    LHBNC pages one run per head, block-outermost pages runs inside the row."""
    es = t.element_size()
    run = t.shape[-1] * es
    dims = sorted(((t.stride(d) * es, t.shape[d]) for d in range(1, t.dim() - 1) if t.shape[d] > 1), reverse=True)
    while dims and dims[-1][0] == run:
        run *= dims.pop()[1]
    offsets = [0]
    for stride, count in dims:
        offsets = [o + i * stride for o in offsets for i in range(count)]
    return [(o, run) for o in offsets]


class HostOffloadAdapter:
    """kvconform's view of ``HostOffloadWorker``: its own code, the copy primitive faked."""

    def __init__(self, ctx) -> None:  # conformance.connectors.protocol.RegistrationContext
        self.ctx = ctx

    def register(self, kv_caches: Mapping[str, Any]) -> None:
        self.caches = dict(kv_caches)
        self.worker = HostOffloadWorker(self.ctx.num_blocks, copy=_no_engine)
        self.worker.register_kv_caches(kv_caches)

    def descriptors(self, layer: str, block_id: int) -> list[tuple[int, int]]:
        return self.worker.block_runs(layer, block_id)

    def store(self, block_ids: list[int], engine) -> Any:
        """The connector's own save path; host memory from the engine, copies through it."""
        self.worker.copy = engine.copy
        saved = []
        for b in block_ids:
            host = {layer: engine.host_buffer(sum(n for _, n in self.worker.block_runs(layer, b))).data_ptr()
                    for layer in self.caches}
            self.worker.save(b, host)
            saved.append(host)
        return saved

    def load(self, handle: Any, block_ids: list[int], engine) -> None:
        self.worker.copy = engine.copy
        for host, b in zip(handle, block_ids):
            self.worker.load(b, host)


def _no_engine(src: int, dst: int, nbytes: int) -> None:
    raise RuntimeError("copies run only inside kvconform's round trip (store/load)")
