"""Observe a generation-1 vLLM (0.19 to 0.28: per-backend ``get_kv_cache_shape``) on CPU.

For a generation-1 case (``CaseConfig.generation == 1``), with meta tensors, under the case's
capability and a model-config stand-in (``model_config.ModelConfigStandIn``: FlashInfer's kernel block
sizes from 0.24 ask the model's query and KV heads):

0. the release's own selector (``selector.get_attn_backend``) for each layer with the layer's
   backend forced, as ``--attention-backend`` forces it: what it adjusts for the process (FlashInfer
   on SM10x sets HND as the layout override) is in force, and undone after the case;
1. the layers' specs from each runner's own ``get_kv_cache_spec`` (MRv1's
   ``GPUModelRunner.get_kv_cache_spec``, MRv2's ``gpu/attn_utils.get_kv_cache_spec``: from 0.24
   they mark backends that index pages by the block stride, from 0.28 MRv2 customizes) over
   stand-in layers in the static forward context: a full-attention, sliding-window or
   chunked-local layer answers with the release's own ``Attention.get_kv_cache_spec``
   (``ChunkedLocalAttention``'s) run on a stand-in carrying
   what the method reads (window, heads, cache dtype, backend class), so a window's block
   size is whatever that release picks (the configured one to 0.24, from 0.25
   ``_largest_kernel_block_within``); an MLA layer with an ``MLAAttentionSpec`` built from the
   case (one latent head; ``fidelity_reason`` says so);
2. vLLM's own planning: ``kv_cache_utils.get_kv_cache_groups`` and
   ``get_kv_cache_config_from_groups`` (``num_gpu_blocks_override`` = the case's blocks);
3. the attention groups from MRv1's own ``GPUModelRunner.initialize_attn_backend`` (on a
   stand-in runner, over stand-in layers that answer ``get_attn_backend`` /
   ``get_kv_cache_spec`` with the case's backend and spec), then vLLM's
   ``prepare_kernel_block_sizes`` on them (MRv2's kernel block sizes too, where its
   release asks for them: its own ``init_attn_backend`` builds metadata builders, which
   need a model);
4. MRv1: ``GPUModelRunner._allocate_kv_cache_tensors`` and ``_reshape_kv_cache_tensors``,
   the runner's own methods, on a stand-in ``self`` carrying what they read;
   MRv2: ``vllm/v1/worker/gpu/attn_utils.py`` ``_allocate_kv_cache`` and
   ``_reshape_kv_cache``, called with the arguments the installed release's signature
   takes (to 0.21: no kernel block sizes; 0.22 on: ``kernel_block_sizes``); MRv1's
   ``_reshape_kv_cache_tensors`` too (0.19/0.20 also take the KV cache config).

What each runner registered is read off the tensors. ``VLLM_KV_CACHE_LAYOUT`` (NHD/HND)
comes from the case, as ``get_kv_cache_layout`` reads it (its cache is cleared).
Request schedules: MRv1's own ``may_reinitialize_input_batch`` builds its ``InputBatch``
for the KV cache config and kernel block sizes; MRv2 runs its own ``initialize_kv_cache``
on a runner built as generation 2's are (``_mrv2_runners``). Each scenario runs through
them as ``runner_tables`` runs generation 2's (a fresh runner per scenario).

Nothing here predicts: the reference is ``reference.gen1``.
"""

from __future__ import annotations

import contextlib
import inspect
import os
from types import SimpleNamespace
from typing import Any, Callable, Iterator

from gpu_impl.observation import GroupObs, Observation, TensorObs, ViewObs
from gpu_impl.vllm_cpu.registration import RegisteredKV

FIDELITY_REASON = (
    "generation 1: the release's own attention selector per layer with the case's backend forced, under the case's "
    "capability (its layout adjustment in force: FlashInfer on SM10x is HND) and a model-config stand-in (a GQA model); "
    "each runner's own get_kv_cache_spec over stand-in layers (full, sliding-window and chunked-local "
    "attention answer with the release's own Attention.get_kv_cache_spec on a stand-in, MLA with a spec built from the case), then vLLM's planning, MRv1's initialize_attn_backend "
    "and prepare_kernel_block_sizes, and each runner's own allocate/reshape functions (MRv1 GPUModelRunner methods on a "
    "stand-in runner, MRv2 gpu/attn_utils); MRv2's kernel block sizes from MRv1's attention groups"
)
SUPPORTED_KINDS = ("full", "mla", "sliding_window", "chunked_local", "sink_full", "mamba")
STATE_MIXERS = {
    "MAMBA2_ATTN": ("vllm.model_executor.layers.mamba.mamba_mixer2", "MambaMixer2"),
    "MAMBA1_ATTN": ("vllm.model_executor.layers.mamba.mamba_mixer", "MambaMixer"),
}
"""Per state-space backend the case can name, the release's mixer class whose ``mamba_type``
the layer's spec carries (0.19's is a string, later releases' an enum member)."""
VLLM_ERRORS = (ValueError, AssertionError, NotImplementedError)


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _view(t: Any) -> ViewObs:
    return ViewObs(
        shape=tuple(t.shape),
        stride=tuple(t.stride()),
        dtype=_dtype_name(t.dtype),
        storage_offset=t.storage_offset(),
        storage_nbytes=t.untyped_storage().nbytes(),
    )


def _call_with_signature(function: Any, self_: Any, **available: Any) -> Any:
    """Call one of vLLM's functions with the arguments its installed signature names (by
    name, from ``available``); ``self_`` first for an unbound method. A parameter without
    a default that ``available`` lacks is a release this driver does not know:
    ``_UnknownSignature`` names it, and the observation says so (``unsupported``)."""
    params = list(inspect.signature(function).parameters.values())
    if self_ is not None:
        params = params[1:]
    missing = [p.name for p in params if p.name not in available and p.default is inspect.Parameter.empty
               and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if missing:
        raise _UnknownSignature(f"{function.__qualname__} takes {', '.join(missing)}, which the generation-1 driver does not provide")
    kwargs = {p.name: available[p.name] for p in params if p.name in available}
    return function(self_, **kwargs) if self_ is not None else function(**kwargs)


class _RunnerStandIn(SimpleNamespace):
    """A ``GPUModelRunner`` as far as its KV-cache methods read it: the attributes given, and
    the runner class's own methods bound to it (whichever the installed release calls)."""

    def __init__(self, runner_cls: Any, **attributes: Any) -> None:
        super().__init__(**attributes)
        object.__setattr__(self, "_runner_cls", runner_cls)

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.__dict__.get("_runner_cls"), name, None)
        if callable(method):
            return method.__get__(self)
        raise AttributeError(f"the stand-in runner has no {name!r} (GPUModelRunner.__init__ would set it)")


class _UnknownSignature(Exception):
    """The installed release's function takes an argument the driver has no value for."""


def _own_attention_spec(layer: Any, backend: Any, vc: Any, model_dtype: Any, use_mla: bool) -> Any:
    """The release's own ``Attention.get_kv_cache_spec`` for ``layer`` (full or sliding-window
    attention; ``ChunkedLocalAttention``'s for a chunked-local one), on a stand-in layer that
    carries what the method reads, as ``Attention.__init__`` sets it (the window or chunk, heads,
    head sizes, ``kv_cache_dtype`` and its torch dtype, the backend class, a decoder attention
    type), under the case's cache config and the model's ``use_mla`` (the window branch asserts
    it is off)."""
    from vllm.model_executor.layers.attention import attention as attention_module
    from vllm.utils import torch_utils

    stand_in = SimpleNamespace(
        attn_type=attention_module.AttentionType.DECODER, sliding_window=layer.sliding_window,
        num_kv_heads=layer.num_kv_heads, head_size=layer.head_size,
        head_size_v=layer.head_size if layer.head_size_v is None else layer.head_size_v,
        kv_cache_dtype=layer.cache_dtype,
        kv_cache_torch_dtype=torch_utils.kv_cache_dtype_str_to_dtype(layer.cache_dtype, SimpleNamespace(dtype=model_dtype)),
        attn_backend=backend)
    config = SimpleNamespace(cache_config=vc.cache_config, model_config=SimpleNamespace(use_mla=use_mla),
                             parallel_config=vc.parallel_config)
    if layer.kind == "chunked_local":
        # ChunkedLocalAttention (an Attention subclass) has its own get_kv_cache_spec.
        from vllm.model_executor.layers.attention.chunked_local_attention import ChunkedLocalAttention

        stand_in.attention_chunk_size = layer.attention_chunk_size
        return ChunkedLocalAttention.get_kv_cache_spec(stand_in, config)
    if layer.kind == "sink_full":
        # StaticSinkAttention (an Attention subclass) has its own get_kv_cache_spec.
        from vllm.model_executor.layers.attention.static_sink_attention import StaticSinkAttention

        stand_in.sink_len = layer.sink_len
        return StaticSinkAttention.get_kv_cache_spec(stand_in, config)
    return attention_module.Attention.get_kv_cache_spec(stand_in, config)


def _state_backend(layer: Any) -> Any:
    """The state-space backend class of a Mamba layer (``MambaAttentionBackendEnum``'s member)."""
    from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum

    from gpu_impl.vllm_cpu.shims import MAMBA_BACKENDS

    return MambaAttentionBackendEnum[MAMBA_BACKENDS[layer.backend]].get_class()


def _own_state_spec(layer: Any, vc: Any) -> Any:
    """The release's own ``MambaBase.get_kv_cache_spec`` for a Mamba layer, on a stand-in mixer
    carrying the case's state shapes and dtypes and the ``mamba_type`` of the release's own mixer
    class (read off its property); the block size and padded page come from the cache config, as
    the release's negotiation left them."""
    import importlib

    import torch
    from vllm.model_executor.layers.mamba.abstract import MambaBase

    module, name = STATE_MIXERS[layer.backend]
    mixer = getattr(importlib.import_module(module), name)
    dtypes = layer.mamba_dtypes or ("bfloat16",) * len(layer.mamba_shapes)
    stand_in = SimpleNamespace(get_state_shape=lambda: tuple(tuple(s) for s in layer.mamba_shapes),
                               get_state_dtype=lambda: tuple(getattr(torch, d) for d in dtypes),
                               is_kv_cache_tp_replicated=False)
    stand_in.mamba_type = mixer.mamba_type.fget(stand_in)
    return MambaBase.get_kv_cache_spec(stand_in, vc)


def _registered_views(case: Any, views: dict[str, Any]) -> dict[str, ViewObs]:
    """What each layer registered, in the case's layer order: a tensor's view; a Mamba layer of
    the releases that register a list of state tensors (to 0.26) one view per state, as
    ``"<layer>[i]"``."""
    out: dict[str, ViewObs] = {}
    for layer in case.layers:
        cache = views.get(layer.name)
        if isinstance(cache, (list, tuple)):
            out.update({f"{layer.name}[{i}]": _view(t) for i, t in enumerate(cache)})
        elif cache is not None:
            out[layer.name] = _view(cache)
    return out


def _run_selector(case: Any, vc: Any, model_dtype: Any, backends: dict[str, Any]) -> str | None:
    """The release's own attention selector (``vllm/v1/attention/selector.py`` ``get_attn_backend``)
    for each layer, with the layer's backend forced as ``--attention-backend`` forces it, under the
    case's capability: what it adjusts for the process is then in force (FlashInfer on SM10x
    requires HND: ``_cached_get_attn_backend`` calls ``set_kv_cache_layout``). Its cache is cleared
    first (a cached answer skips the adjustment). Returns None, or why a layer's selection
    refused or chose another class than the case's (said in the observation, not judged)."""
    from vllm.v1.attention import selector
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    cached = getattr(selector, "_cached_get_attn_backend", None)
    if hasattr(cached, "cache_clear"):
        cached.cache_clear()
    saved = vc.attention_config.backend
    try:
        for layer in case.layers:
            if layer.kind == "mamba":
                continue  # a state-space layer is not the attention selector's
            vc.attention_config.backend = AttentionBackendEnum[layer.backend]
            # Query heads as the model config stand-in reports them (a GQA model).
            chosen = _call_with_signature(
                selector.get_attn_backend, None, head_size=layer.head_size, dtype=model_dtype,
                kv_cache_dtype=layer.cache_dtype, use_mla=layer.kind == "mla", has_sink=layer.kind == "sink_full",
                num_heads=vc.model_config.get_num_attention_heads(vc.parallel_config),
                has_sliding_window=layer.kind == "sliding_window")
            if chosen is not backends[layer.name]:
                return f"the selector chose {chosen.get_name()} for {layer.name!r}, not {layer.backend}"
    except _UnknownSignature:
        raise
    except Exception as exc:  # noqa: BLE001 - a refusal of the selector is reported, not judged here
        return f"the selector refused {layer.backend} for {layer.name!r}: {type(exc).__name__}: {exc}".splitlines()[0][:300]
    finally:
        vc.attention_config.backend = saved
    return None


_VOCAB_SIZE = 1024
"""The model config's vocabulary as the input batch sizes its sampling buffers (no model is loaded)."""


def _mrv1_input_batch_runner(case: Any, vc: Any, kcc: Any, attn_groups: Any, kernel_block_sizes: Any) -> Any:
    """A stand-in MRv1 runner whose ``input_batch`` its own ``may_reinitialize_input_batch``
    built for the KV cache config and kernel block sizes (what ``initialize_kv_cache`` calls
    it with), carrying what the schedule driver reads (``_get_slot_mappings``: the KV cache
    config; the attention groups). ``GPUModelRunner.__init__``'s placeholder batch differs
    from every real one, so the method always builds a new ``InputBatch``."""
    import torch
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from gpu_impl.vllm_cpu.runners import MAX_NUM_REQS, MAX_NUM_TOKENS

    me = _RunnerStandIn(
        GPUModelRunner, vllm_config=vc, cache_config=vc.cache_config, parallel_config=vc.parallel_config,
        model_config=SimpleNamespace(get_vocab_size=lambda: _VOCAB_SIZE), device=torch.device("cpu"),
        max_num_reqs=MAX_NUM_REQS, max_num_tokens=MAX_NUM_TOKENS, max_model_len=case.max_model_len, max_encoder_len=0,
        num_spec_tokens=0, is_pooling_model=False, kv_cache_config=kcc, attn_groups=attn_groups, pin_memory=False,
        # Read by the releases that refuse to rebuild the batch under CPU weight offloading.
        offload_config=getattr(vc, "offload_config", None),
        input_batch=SimpleNamespace(logitsprocs=None, logitsprocs_need_output_token_ids=False),
        _init_block_sizes=[], _init_kernel_block_sizes=[], _init_max_num_blocks=[], _init_slot_mapping_modes=[])
    _call_with_signature(GPUModelRunner.may_reinitialize_input_batch, me, kv_cache_config=kcc,
                         kernel_block_sizes=list(kernel_block_sizes))
    return me


@contextlib.contextmanager
def _mrv2_runners(case: Any, vc: Any, groups: Any, memory: int,
                  runner_config: Callable[[Any], Any]) -> Iterator[Callable[[], Any]]:
    """Builds of MRv2 runners whose own ``initialize_kv_cache`` has run, as generation 2's
    are built (``runners.runner_instance`` over the case's layers from their own
    constructors, ``VLLM_USE_V2_MODEL_RUNNER=1`` as a deployment of MRv2 sets it). The KV
    cache config is vLLM's own planning of the case's groups with four blocks
    (``num_gpu_blocks_override``): the runner allocates its pool in host memory, and a
    block table does not depend on the pool's size. ``runner_config``: the layout driver's
    ``planning.vllm_config_for`` (the config generation 2's runners are built under)."""
    from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups

    from gpu_impl.vllm_cpu import runners, shims

    from vllm.v1.attention.backends import utils as backend_utils

    saved_override, saved_env = vc.cache_config.num_gpu_blocks_override, os.environ.get("VLLM_USE_V2_MODEL_RUNNER")
    # Building real layers runs the backend selector, which may force a KV cache layout for
    # the process (set_kv_cache_layout): the next case's layout must not inherit it.
    saved_layout_override = getattr(backend_utils, "_KV_CACHE_LAYOUT_OVERRIDE", None)
    vc.cache_config.num_gpu_blocks_override = _SCHEDULE_POOL_BLOCKS
    try:
        kcc = get_kv_cache_config_from_groups(vc, groups, memory)
    finally:
        vc.cache_config.num_gpu_blocks_override = saved_override
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"
    try:
        with runner_config(case) as config:
            runners.build_layers(case, "mrv2", config)

            def build() -> Any:
                instance = runners.runner_instance(case, "mrv2", config, "cpu")
                with runners.recording_transfer_group(), runners.initialisation_environment(case), \
                        shims.cuda_alike_worker_utils():
                    instance.initialize_kv_cache(kcc)
                return instance

            yield build
    finally:
        os.environ.pop("VLLM_USE_V2_MODEL_RUNNER", None)
        if saved_env is not None:
            os.environ["VLLM_USE_V2_MODEL_RUNNER"] = saved_env
        if hasattr(backend_utils, "set_kv_cache_layout"):
            backend_utils.set_kv_cache_layout(saved_layout_override)


_SCHEDULE_POOL_BLOCKS = 4
"""Blocks in the pool of a runner built for request schedules (its tables do not depend on it)."""


def _schedules(case: Any, runner: str, schedules: tuple, build: Callable[[], Any]) -> dict[str, Any]:
    """``{"schedules": ...}`` each scenario through a freshly built runner's own block tables
    (``runner_tables.run_schedule``), or ``{"schedules_unsupported": why}``."""
    from gpu_impl.vllm_cpu import runner_tables

    why = runner_tables.schedule_support()
    if why is not None:
        return {"schedules_unsupported": why}
    observed = []
    for scenario in schedules:
        try:
            instance = build()
        except (AttributeError, TypeError, ImportError, _UnknownSignature) as exc:
            return {"schedules_unsupported": f"{runner.upper()}'s block tables could not be built: {type(exc).__name__}: {exc}"}
        except VLLM_ERRORS + (RuntimeError, KeyError) as exc:
            # The runner did start for the layout above (its reshape); what its own
            # initialize_kv_cache refuses here (builders over the real layers) is said, not judged.
            return {"schedules_unsupported": f"{runner.upper()}'s initialize_kv_cache refused the case's layers: "
                                             f"{type(exc).__name__}: {exc}".splitlines()[0][:300]}
        overrun = _padded_row_overrun(instance) if runner == "mrv2" else None
        if overrun is not None:
            return {"schedules_unsupported": overrun}
        observed.append(runner_tables.run_schedule(runner, instance, scenario))
    return {"schedules": tuple(observed)}


def _padded_row_overrun(instance: Any) -> str | None:
    """Why MRv2's ``BlockTables`` of this release cannot be run for the case, or None.

    In 0.19.1 to 0.22.0 ``BlockTables.gather_block_tables`` hands its kernel group 0's row
    width (``self.input_block_tables[0].shape[1]``) as the length to zero in every group's
    padded rows; a group whose rows are narrower (a sliding-window group of larger blocks)
    is then written past its end: on CPU the Triton interpreter corrupts the process's heap
    (it aborts or segfaults), on a GPU the kernel writes out of bounds. 0.23.0 passes each
    group its own stride. The installed method's source is read, not run, and the widths are
    those of the runner's own tables."""
    import inspect

    tables = getattr(instance, "block_tables", None)
    gather = getattr(type(tables), "gather_block_tables", None)
    if gather is None:
        return None
    try:
        source = inspect.getsource(gather)
    except (OSError, TypeError):
        return None
    if "input_block_tables[0].shape[1]" not in source:
        return None
    widths = [t.shape[1] for t in tables.input_block_tables]
    narrower = [f"group {i}: {w}" for i, w in enumerate(widths) if w < widths[0]]
    if not narrower:
        return None
    return (f"MRv2's BlockTables.gather_block_tables zeroes every group's padded rows with group 0's width "
            f"({widths[0]} blocks) and {', '.join(narrower)} is narrower: its kernel would write past that group's "
            "table (vllm/v1/worker/gpu/block_table.py, fixed in 0.23.0); not run")


def observe(case: Any, runner: str, applied: tuple[str, ...] = (), *, device: str = "meta",
            on_registered: Callable[[RegisteredKV], None] | None = None, schedules: tuple = (),
            runner_config: Callable[[Any], Any] | None = None) -> Observation:
    """What ``runner`` of the installed generation-1 vLLM registers for ``case``.

    ``device="cpu"`` allocates real tensors (a connector needs addresses and bytes);
    ``on_registered`` is then called with them while the case's vLLM config and
    ``VLLM_KV_CACHE_LAYOUT`` are still in force, as a connector's ``register_kv_caches``
    runs inside the runner's ``initialize_kv_cache``. It must handle its own errors: an
    exception from it is not the runner's."""
    unsupported = [layer.name for layer in case.layers
                   if layer.kind not in SUPPORTED_KINDS or (layer.is_draft and layer.kind not in ("full", "mla"))
                   or (layer.kind == "mamba" and layer.backend not in STATE_MIXERS)]
    if unsupported:
        return Observation(case.name, runner, shims=applied,
                           unsupported=f"the generation-1 driver builds full-attention, sliding-window, chunked-local, static-sink, "
                                       f"MLA and Mamba-1/Mamba-2 layers and full-attention and MLA drafts only (not {unsupported[0]!r})")
    import torch
    from vllm.config import CacheConfig, DeviceConfig, VllmConfig, set_current_vllm_config
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups, get_kv_cache_groups
    from vllm.v1.kv_cache_interface import MLAAttentionSpec
    from vllm.v1.worker.gpu import attn_utils as mrv2_attn_utils
    from vllm.v1.worker.gpu.attn_utils import _allocate_kv_cache, _reshape_kv_cache
    from vllm.v1.worker import gpu_model_runner as gpu_model_runner_module
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    from vllm.v1.worker.utils import prepare_kernel_block_sizes

    runner_methods = ("initialize_attn_backend", "_allocate_kv_cache_tensors", "_reshape_kv_cache_tensors",
                      "_kv_cache_spec_attn_group_iterator", "_update_hybrid_attention_mamba_layout")
    absent = [m for m in runner_methods if not hasattr(GPUModelRunner, m)]
    if absent:
        return Observation(case.name, runner, shims=applied,
                           unsupported=f"this vLLM's GPUModelRunner has no {', '.join(absent)} (a generation-1 runner has)")

    partial: dict[str, Any] = dict(fidelity="runner_methods", fidelity_reason=FIDELITY_REASON, shims=applied,
                                   builder_kernel_block_sizes=None, bound_shapes=None)
    stage = "configure"
    saved_layout = os.environ.pop("VLLM_KV_CACHE_LAYOUT", None)
    from gpu_impl.vllm_cpu import shims
    from gpu_impl.vllm_cpu.model_config import ModelConfigStandIn, negotiate_hybrid_block_size
    from vllm.v1.attention.backends import utils as backend_utils

    saved_override = getattr(backend_utils, "_KV_CACHE_LAYOUT_OVERRIDE", None)
    capability = shims.fake_capability(case.capability)
    capability.__enter__()
    try:
        if case.layout is not None:
            os.environ["VLLM_KV_CACHE_LAYOUT"] = case.layout
        from vllm.v1.attention.backends import utils as backend_utils

        layout_of = getattr(backend_utils, "get_kv_cache_layout", None)
        if hasattr(layout_of, "cache_clear"):
            layout_of.cache_clear()
        model_dtype = getattr(torch, case.model_dtype if case.model_dtype in ("float16", "bfloat16", "float32") else "bfloat16")
        cache_config = CacheConfig(block_size=case.block_size)
        cache_config.num_gpu_blocks_override = case.num_blocks
        hybrid = any(layer.kind == "mamba" for layer in case.layers)
        if hybrid:
            # --block-size, --kv-cache-dtype (the target attention layers'), --mamba-block-size
            # (MambaModelConfig: max_model_len unless given) and --mamba-cache-mode as the case
            # gives them; prefix caching off, which keeps the case's cache mode (0.19's
            # MambaModelConfig turns "none" into "all"/"align" under prefix caching).
            cache_config.cache_dtype = next(
                (l.cache_dtype for l in case.layers if not l.is_draft and l.kind != "mamba"), "auto")
            cache_config.mamba_block_size = case.mamba_block_size or case.max_model_len
            cache_config.mamba_cache_mode = case.mamba_cache_mode
            cache_config.enable_prefix_caching = False
        vc = VllmConfig(device_config=DeviceConfig(device="cpu"), cache_config=cache_config)
        # The model's answers the driven code reads (FlashInfer's kernel block sizes from 0.24 ask
        # its query and KV heads): the layout driver's stand-in, which reports a GQA model.
        object.__setattr__(vc, "model_config", ModelConfigStandIn(case, model_dtype))
        # --disable-hybrid-kv-cache-manager: vLLM's planning reads it off the scheduler config.
        vc.scheduler_config.disable_hybrid_kv_cache_manager = case.disable_hybrid_kv_cache_manager
        with set_current_vllm_config(vc):
            stage = "specs"
            backends = {}
            for layer in case.layers:
                try:
                    backends[layer.name] = (_state_backend(layer) if layer.kind == "mamba"
                                            else AttentionBackendEnum[layer.backend].get_class())
                except (ImportError, AssertionError, RuntimeError) as exc:  # e.g. a module allocating CUDA memory at import
                    return Observation(case.name, runner, shims=applied,
                                       unsupported=f"backend class not importable on CPU: {layer.backend}: "
                                                   f"{type(exc).__name__}: {exc}".splitlines()[0][:300])
            partial["layer_backends"] = {name: cls.get_name() for name, cls in backends.items()}
            stage = "selector"
            selector_problem = _run_selector(case, vc, model_dtype, backends)
            if selector_problem is not None:
                return Observation(case.name, runner, shims=applied, unsupported=selector_problem)
            if hasattr(layout_of, "cache_clear"):
                layout_of.cache_clear()
            use_mla = any(layer.kind == "mla" for layer in case.layers if not layer.is_draft)
            # The model's layers as the runners find them in the static forward context:
            # stand-ins answering with the case's backend and the layer's own spec.
            layer_base = gpu_model_runner_module.AttentionLayerBase

            class _Layer(layer_base):  # type: ignore[misc, valid-type]
                def __init__(self, layer: Any, backend: Any) -> None:
                    self._layer, self._backend = layer, backend

                def get_attn_backend(self) -> Any:
                    return self._backend

                def get_kv_cache_spec(self, vllm_config: Any) -> Any:
                    layer = self._layer
                    if layer.kind == "mamba":
                        return _own_state_spec(layer, vllm_config)
                    if layer.kind == "mla":
                        # MLA keeps one latent "head" per token (MLAAttention.get_kv_cache_spec).
                        return MLAAttentionSpec(block_size=vllm_config.cache_config.block_size, num_kv_heads=1,
                                                head_size=layer.head_size, dtype=model_dtype, cache_dtype_str="auto")
                    return _own_attention_spec(layer, self._backend, vllm_config, model_dtype, use_mla)

            forward_context = vc.compilation_config.static_forward_context
            for layer in case.layers:
                forward_context[layer.name] = _Layer(layer, backends[layer.name])
            if hybrid:
                stage = "negotiation"
                # --block-size was given (set only now: the selector above, run with it, would
                # validate it against the backend under the capability stand-in).
                object.__setattr__(vc.cache_config, "user_specified_block_size", True)
                negotiate_hybrid_block_size(vc)
                partial["cache_block_size"] = vc.cache_config.block_size
            # Each runner's own get_kv_cache_spec over them (from 0.24 it marks the specs of
            # backends that index pages by the block stride, which page padding needs).
            if runner == "mrv1":
                specs = GPUModelRunner.get_kv_cache_spec(SimpleNamespace(vllm_config=vc, shared_kv_cache_layers={}))
            else:
                specs = mrv2_attn_utils.get_kv_cache_spec(vc)
            stage = "groups"
            groups = get_kv_cache_groups(vc, specs)
            stage = "placement"
            # The case's --kv-cache-memory when it sets one; else room for more than num_blocks
            # (num_gpu_blocks_override above caps the count).
            memory = case.kv_cache_memory_bytes or (case.num_blocks or 1) * sum(s.page_size_bytes for s in specs.values()) * 2
            kcc = get_kv_cache_config_from_groups(vc, groups, memory)
            partial["groups"] = tuple(GroupObs(tuple(g.layer_names), g.kv_cache_spec.block_size, type(g.kv_cache_spec).__name__)
                                      for g in kcc.kv_cache_groups)
            partial["num_blocks"] = kcc.num_blocks
            partial["tensors"] = tuple(TensorObs(t.size, tuple(t.shared_by), 0, 0, 0) for t in kcc.kv_cache_tensors)
            layout = layout_of() if layout_of is not None else None
            partial["layout"] = None if layout is None else str(getattr(layout, "name", layout))
            stage = "kernel_block_sizes"
            # The attention groups as MRv1 forms them: its own initialize_attn_backend over the
            # stand-in layers.
            grouper = SimpleNamespace(vllm_config=vc, attn_groups=[], kv_sharing_fast_prefill_eligible_layers=set(),
                                      _check_and_update_cudagraph_mode=lambda *a, **k: None)
            _call_with_signature(GPUModelRunner.initialize_attn_backend, grouper, kv_cache_config=kcc, is_profiling=False)
            attn_groups = grouper.attn_groups
            # MRv1 always picks kernel block sizes; MRv2 only from the release whose
            # gpu/attn_utils.py calls prepare_kernel_block_sizes (0.22: #42766); before it
            # its reshape takes none, so nothing is asked and nothing is recorded.
            if runner == "mrv1" or hasattr(mrv2_attn_utils, "prepare_kernel_block_sizes"):
                kernel_block_sizes = prepare_kernel_block_sizes(kcc, attn_groups)
                partial["kernel_block_sizes"] = tuple(kernel_block_sizes)
            else:
                kernel_block_sizes = partial["kernel_block_sizes"] = None
            stage = "allocate"
            meta = torch.device(device)
            if runner == "mrv1":
                me = _RunnerStandIn(GPUModelRunner, device=meta, runner_only_attn_layers=set(), attn_groups=attn_groups,
                                    kv_cache_config=kcc, cache_config=SimpleNamespace(cache_dtype="auto"))
                raw = GPUModelRunner._allocate_kv_cache_tensors(me, kcc)
                # 0.19/0.20 also pass the KV cache config; 0.21 on read it off self.
                views = _call_with_signature(GPUModelRunner._reshape_kv_cache_tensors, me, kv_cache_config=kcc,
                                             kv_cache_raw_tensors=raw, kernel_block_sizes=kernel_block_sizes)
            else:
                # The installed release's signatures: 0.19 to 0.21 (kcc, device) / (kcc, raw,
                # backends, cache_dtype); 0.22 on also the shared layers and kernel_block_sizes.
                allocate = inspect.signature(_allocate_kv_cache).parameters
                raw = _allocate_kv_cache(kcc, meta) if len(allocate) == 2 else _allocate_kv_cache(kcc, {}, meta)
                # 0.23 on: attention groups instead of backends (MRv1's, see the docstring).
                views = _call_with_signature(_reshape_kv_cache, None, kv_cache_config=kcc, kv_cache_raw_tensors=raw,
                                             attn_backends=backends, attn_groups=[g for groups in attn_groups for g in groups],
                                             cache_dtype="auto", kernel_block_sizes=kernel_block_sizes,
                                             shared_kv_cache_layers={})
            # In the case's layer order, as the runner's kv_caches dict.
            partial["registered"] = _registered_views(case, views)
            # What the contract holds the views to: vLLM's own spec objects' page sizes and
            # dtypes, the kernel block sizes each backend declares, which storage each view is in.
            from gpu_impl.vllm_cpu import spec_facts

            partial["page_bytes"] = spec_facts.page_bytes(kcc)
            partial["spec_dtypes"] = spec_facts.spec_dtypes(kcc)
            try:
                partial["supported_kernel_block_sizes"] = spec_facts.supported_kernel_block_sizes(kcc, backends)
            except AttributeError:
                pass  # a release whose backends declare no kernel block sizes: not judged
            # (A list of Mamba state tensors has no one storage number: its views are bounds-checked only.)
            partial["storage_of"] = spec_facts.storage_numbers({layer.name: views[layer.name] for layer in case.layers
                                                                if not isinstance(views.get(layer.name, ()), (list, tuple))})
            if schedules:
                stage = "schedules"
                if runner == "mrv1":
                    partial.update(_schedules(case, runner, schedules, lambda: _mrv1_input_batch_runner(
                        case, vc, kcc, attn_groups, kernel_block_sizes)))
                elif runner_config is None:
                    partial["schedules_unsupported"] = "MRv2's runner config was not given (planning.observe gives it)"
                else:
                    try:
                        with _mrv2_runners(case, vc, groups, memory, runner_config) as build:
                            partial.update(_schedules(case, runner, schedules, build))
                    except (AttributeError, TypeError, ImportError, RuntimeError, KeyError, AssertionError,
                            ValueError, NotImplementedError) as exc:
                        # Building the case's real layers for MRv2 (its own constructors) failed here.
                        partial["schedules_unsupported"] = (
                            f"MRv2's runner could not be built for the schedules: {type(exc).__name__}: {exc}"
                            .splitlines()[0][:300])
            if on_registered is not None:
                stage = "connector"
                on_registered(RegisteredKV(vc, kcc, backends, kernel_block_sizes,
                                           {layer.name: views[layer.name] for layer in case.layers if layer.name in views}))
    except VLLM_ERRORS as exc:
        # A bare assert says nothing: its repr (AssertionError()) stands for it, as generation 2's driver does.
        return Observation(case.name, runner, error=f"{type(exc).__name__}: {str(exc) or repr(exc)}", error_stage=stage, **partial)
    except _UnknownSignature as exc:
        return Observation(case.name, runner, shims=applied, unsupported=str(exc))
    finally:
        os.environ.pop("VLLM_KV_CACHE_LAYOUT", None)
        if saved_layout is not None:
            os.environ["VLLM_KV_CACHE_LAYOUT"] = saved_layout
        # The selector's layout adjustment is the process's: the next case must not inherit it.
        if hasattr(backend_utils, "set_kv_cache_layout"):
            backend_utils.set_kv_cache_layout(saved_override)
        capability.__exit__(None, None, None)
    return Observation(case.name, runner, **partial)


__all__ = ["RegisteredKV", "observe"]
