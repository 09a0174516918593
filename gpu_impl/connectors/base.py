"""The connector-adapter protocol: what an adapter is given (the ``kv_caches`` dict of
``register_kv_caches`` and a ``RegistrationContext``) and what it answers (absolute byte
ranges per layer and logical block), so kvconform can check a connector's registration.

It lives beside the built-in adapters, which implement it; ``conformance.connectors``
re-exports it for connector authors (docs/connector-authors.md: the optional members and
the round trip). Pure Python: importing it needs neither vLLM nor torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Union, runtime_checkable

Ranges = list[tuple[int, int]]
"""Absolute ``(address, length)`` byte ranges."""


@runtime_checkable
class ConnectorAdapter(Protocol):
    """The two methods every adapter implements (the optional ones: docs/connector-authors.md)."""

    def register(self, kv_caches: Mapping[str, Any]) -> None:
        """Called once with the dict ``register_kv_caches`` receives (layer name -> tensor)."""

    def descriptors(self, layer: str, block_id: int) -> Ranges:
        """Absolute ``(address, length)`` ranges moved for logical block ``block_id`` of ``layer``."""


@dataclass(frozen=True)
class LayerInfo:
    """What a connector can learn about a layer from vLLM's config (its ``KVCacheSpec``)."""

    name: str
    """The layer name, a key of ``kv_caches``."""
    group_id: int
    """The KV cache group the layer belongs to."""
    kind: str
    """``full``, ``sliding_window``, ``mla``, ``mamba``, ... (reference ``SpecKind`` value)."""
    block_size: int
    """The group's logical (scheduler) block size in tokens."""
    page_size_bytes: int
    """``spec.page_size_bytes`` of one logical block, padding included."""
    num_kv_heads: int
    """KV heads on this rank (0 for a state layer)."""
    head_size: int
    """Elements per head of K (0 for a state layer)."""
    head_size_v: int
    """Elements per head of V (0 for a state layer)."""
    dtype: str
    """The registered tensor's dtype name (``bfloat16``, ``float8_e4m3fn``, ...)."""
    backend: str
    """The layer's attention backend name."""
    is_mla: bool
    """An MLA-family layer (one latent vector per token)."""
    is_mamba: bool
    """A state layer (no KV spec)."""
    is_draft: bool
    """A layer of the speculative draft model."""
    kv_packing: str = "kv_in_c"
    """Where K and V sit in the layer's ``[B, H, N, C]`` page (``reference.backends.Packing``):

    - ``kv_in_c``: K then V in the last dim C, per (token, head) (FlashAttention,
      FlashInfer, Triton, Flex);
    - ``two_head_slots``: H is 2 slots, K then V, and C holds every head of one token
      (ROCM_ATTN, B12X, nvfp4 caches);
    - ``cpu_kv_planes``: per (block, head) a K plane of N tokens, then a V plane (CPU_ATTN);
    - ``mla_latent``: one latent vector per token, no separate V (the MLA family);
    - ``state``: raw recurrent state (Mamba-like layers).
    """


@dataclass(frozen=True)
class RegistrationContext:
    """What vLLM gives a connector besides the tensors (config, cache config, specs).

    A factory passed to ``validate_registration`` is called with one of these per case.
    Note that vLLM does *not* pass the kernel block size to connectors: real connectors
    re-derive it; ``kernel_block_sizes`` is here for adapters that want to cross-check.
    """

    case_name: str
    """The case's name (``reference.config.CaseConfig.name``)."""
    runner: str
    """``mrv1`` or ``mrv2``: the model runner that registered the tensors."""
    layout: str
    """The resolved ``KVCacheLayout`` name (``cache_config.get_resolved_kv_cache_layout()``)."""
    block_size: int
    """``cache_config.block_size`` (logical)."""
    num_blocks: int
    """``kv_cache_config.num_blocks`` (logical, per group)."""
    layers: Mapping[str, LayerInfo]
    """Per registered layer, what its spec says."""
    kernel_block_sizes: tuple[int, ...] = field(default=())
    """Per KV cache group, what ``prepare_kernel_block_sizes`` chose."""
    case: Any = field(default=None, compare=False, repr=False)
    """The ``reference.config.CaseConfig`` (drivers of real connectors rebuild vLLM's config from it)."""
    vllm: Any = field(default=None, compare=False, repr=False)
    """What the runner had when it registered the tensors (``gpu_impl.vllm_cpu.registration.RegisteredKV``:
    ``vllm_config``, ``kv_cache_config``, ``backends``, ``kernel_block_sizes``, ``kv_caches``);
    None when the tensors were not registered by vLLM (an out-of-tree check of the reference's views)."""


ConnectorFactory = Callable[[RegistrationContext], ConnectorAdapter]
"""A class or function building an adapter from a case's context."""
ConnectorLike = Union[ConnectorAdapter, ConnectorFactory, str]
"""An adapter instance (reused for every case), a factory/class taking a context, or
``"package.module:Name"`` naming either."""


class Undrivable(Exception):
    """The connector's own code cannot be driven for this case on CPU (the message says
    why: a service it needs at registration, a kernel that cannot run here). Reported as
    ``unsupported``, never as the connector's failure or refusal."""


STAND_IN_MARK = "_kvconform_stand_in"
"""Set on an object an adapter made with ``__new__`` (``stand_in``): an AttributeError on it
inside the connector's code is an attribute the adapter did not set, not the connector's verdict."""


def stand_in(cls: type) -> Any:
    """An instance of ``cls`` without its ``__init__`` (as upstream's unit tests build
    workers), marked so that an attribute it lacks reads as the adapter's gap."""
    obj = cls.__new__(cls)
    object.__setattr__(obj, STAND_IN_MARK, True)
    return obj


class BuiltInAdapter:
    """What every built-in adapter shares: made with the case's context, it keeps it as
    ``self.ctx`` and then sets up its own state in ``init_state`` (fakes of the connector's
    services), before ``register`` is called."""

    connector: str = ""
    """vLLM's name of the connector class (``kv_transfer_config.kv_connector``)."""
    case_connector: str | None = None
    """The case's ``connector`` this adapter runs under: vLLM resolves the layout that
    connector asks for (None: the case's own layout)."""
    requires_vllm_driver: str | None = None
    """What the installed vLLM must provide for this adapter to run (``gpu_impl.vllm_api``;
    None: the layout driver's needs only)."""

    def __init__(self, ctx: RegistrationContext) -> None:
        self.ctx = ctx
        self.init_state()

    def init_state(self) -> None:
        """The adapter's own state for one case (none by default)."""


class TransferWorkerAdapter(BuiltInAdapter):
    """An adapter around a P2P transfer worker (NIXL, Mooncake P2P): the worker, once it
    registered, answers; logical block ids become kernel block ids through the worker's own
    ``_logical_to_kernel_block_ids``, per transfer group."""

    def init_state(self) -> None:
        self.worker: Any = None
        self.caches: dict[str, Any] = {}

    @property
    def kernel_block_size(self) -> int:
        return self.worker.block_size

    def _kernel_id_args(self) -> tuple[Any, ...]:
        """Arguments of ``_logical_to_kernel_block_ids`` after the ids (the worker's own)."""
        return ()

    def _kernel_ids(self, layer: str, block_id: int) -> list[int]:
        w = self.worker
        gid = w.kv_cache_config.transfer_group_index_by_layer[layer]
        ids: list[list[int]] = [[] for _ in w.kv_cache_config.transfer_groups]
        ids[gid] = [block_id]
        out = w._logical_to_kernel_block_ids(ids, *self._kernel_id_args())
        return [int(k) for k in out[gid]]


def _block_span(cache: Any, block: int) -> tuple[int, int]:
    """The bytes ``[start, end)`` of one block of a registered view, from its own strides."""
    view = cache[block]
    size = view.element_size()
    start = view.storage_offset() * size
    last = sum((n - 1) * st for n, st in zip(view.shape, view.stride()) if n > 0) * size
    return start, start + last + size


def groups_alias(kv_cache_config: Any, caches: Mapping[str, Any]) -> bool:
    """Whether the same block id addresses the same bytes in two KV cache groups (a hybrid
    model's uniform-page grouping overlays its groups on one allocation; a block id is owned
    by one group at a time, which the adapter's single id list cannot mimic)."""
    groups = kv_cache_config.kv_cache_groups
    if len(groups) < 2:
        return False
    block = 1 if next(iter(caches.values())).shape[0] > 1 else 0
    spans = [(g, _block_span(caches[name], block)) for g, group in enumerate(groups)
             for name in group.layer_names if name in caches]
    return any(ga != gb and a[0] < b[1] and b[0] < a[1] for ga, a in spans for gb, b in spans)


ALIASED_GROUPS = (
    "the KV cache groups alias one allocation (a hybrid model's uniform-page grouping) and this adapter's "
    "round trip gives every group the same block ids, so the connector's transfer of one group cannot be "
    "told from another's: not driven yet"
)

__all__ = [
    "ALIASED_GROUPS", "BuiltInAdapter", "ConnectorAdapter", "ConnectorFactory", "ConnectorLike", "LayerInfo", "Ranges",
    "RegistrationContext", "TransferWorkerAdapter", "Undrivable", "groups_alias",
]
