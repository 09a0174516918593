"""What a KV-connector adapter implements so kvconform can check its registration logic.

An adapter wraps the part of a connector that runs in ``register_kv_caches``: it is
given exactly the ``kv_caches`` dict vLLM 0.33.0 hands over (one CPU tensor per layer,
all views into one shared int8 pool), and then answers, for a layer and a *logical*
(scheduler) block id, which absolute ``(address, length)`` byte ranges the connector
would transfer. kvconform compares those against its reference model.

Example (a connector that transfers whole kernel blocks, as NIXL does)::

    class MyAdapter:
        def __init__(self, ctx):            # ctx: RegistrationContext (optional)
            self.ctx = ctx

        def register(self, kv_caches):
            self.caches = kv_caches

        def descriptors(self, layer, block_id):
            t = self.caches[layer]
            es = t.element_size()
            r = t.shape[0] // self.ctx.num_blocks      # kernel blocks per logical block
            stride = t.stride(0) * es                  # bytes between kernel blocks
            length = t[0].numel() * es                 # valid if t[0] is dense
            return [(t.data_ptr() + k * stride, length) for k in range(block_id * r, block_id * r + r)]

    from conformance.connectors import validate_registration
    print(validate_registration(MyAdapter).format())

Optional members (checked when present, with a targeted message when wrong):

- ``block_len(layer) -> int``: bytes transferred per registered (kernel) block of the layer;
- ``num_blocks(layer) -> int``: blocks the connector addresses in the layer's view
  (kernel-granular: ``shape[0]`` of the registered view);
- ``kernel_block_size``: tokens per registered block (an int attribute or property);
- ``kv_descriptors(layer, block_id) -> (k_ranges, v_ranges)``: for connectors that move
  K and V separately; each side is compared with the reference's K and V bytes.

The round trip (``conformance.connectors.roundtrip``) fills the pool with a pattern, stores
logical block b, clears the pool, loads into block b' and checks every byte. A connector
with its own copy path implements both of:

- ``store(block_ids, engine) -> handle``: the connector's own store path for those logical
  block ids (every layer it transfers), moving bytes out of the registered tensors into
  connector-side memory obtained from ``engine.host_buffer(nbytes)``;
- ``load(handle, block_ids, engine)``: its own load path, from ``handle`` into those ids.

Every byte either moves through ``engine.copy(src, dst, nbytes)`` (the faked copy engine:
bounds-checked, refused outside the pool and the host buffers) or through torch ops on the
registered tensors. Without ``store``/``load`` the round trip moves each layer's
``descriptors`` in order (what NIXL and Mooncake pair up, descriptor i to descriptor i).
``transferred_layers`` (optional, after ``register``): the layers the connector moves at
all, when it moves only some by design (e.g. only the offloaded groups). ``fill_only = True``:
the connector only writes blocks (benchmark fills): its ``descriptors`` are the bytes a fill
of the block writes, and the round trip does not apply.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Union, runtime_checkable

Ranges = list[tuple[int, int]]
"""Absolute ``(address, length)`` byte ranges."""


@runtime_checkable
class ConnectorAdapter(Protocol):
    """The two methods every adapter implements."""

    def register(self, kv_caches: Mapping[str, Any]) -> None:
        """Called once with the dict ``register_kv_caches`` receives (layer name -> tensor)."""

    def descriptors(self, layer: str, block_id: int) -> Ranges:
        """Absolute ``(address, length)`` ranges moved for logical block ``block_id`` of ``layer``."""


@dataclass(frozen=True)
class LayerInfo:
    """What a connector can learn about a layer from vLLM's config (its ``KVCacheSpec``)."""

    name: str
    group_id: int
    kind: str
    """``full``, ``sliding_window``, ``mla``, ``mamba``, ... (reference ``SpecKind`` value)."""
    block_size: int
    """The group's logical (scheduler) block size in tokens."""
    page_size_bytes: int
    """``spec.page_size_bytes`` of one logical block, padding included."""
    num_kv_heads: int
    head_size: int
    head_size_v: int
    dtype: str
    backend: str
    is_mla: bool
    is_mamba: bool
    is_draft: bool
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
    runner: str
    layout: str
    """The resolved ``KVCacheLayout`` name (``cache_config.get_resolved_kv_cache_layout()``)."""
    block_size: int
    """``cache_config.block_size`` (logical)."""
    num_blocks: int
    """``kv_cache_config.num_blocks`` (logical, per group)."""
    layers: Mapping[str, LayerInfo]
    kernel_block_sizes: tuple[int, ...] = field(default=())
    """Per KV cache group, what ``prepare_kernel_block_sizes`` chose."""
    case: Any = field(default=None, compare=False, repr=False)
    """The ``reference.config.CaseConfig`` (drivers of real connectors rebuild vLLM's config from it)."""
    vllm: Any = field(default=None, compare=False, repr=False)
    """What the runner had when it registered the tensors (``gpu_impl.vllm_cpu.registration.RegisteredKV``:
    ``vllm_config``, ``kv_cache_config``, ``backends``, ``kernel_block_sizes``, ``kv_caches``);
    None when the tensors were not registered by vLLM (an out-of-tree check of the reference's views)."""


ConnectorFactory = Callable[[RegistrationContext], ConnectorAdapter]
ConnectorLike = Union[ConnectorAdapter, ConnectorFactory, str]
"""An adapter instance (reused for every case), a factory/class taking a context, or
``"package.module:Name"`` naming either."""

__all__ = ["ConnectorAdapter", "ConnectorFactory", "ConnectorLike", "LayerInfo", "Ranges", "RegistrationContext"]
