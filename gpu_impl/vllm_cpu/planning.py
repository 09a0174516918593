"""Observe the target release's KV-cache set-up for a reference case, as each runner does it.

``observe(case, runner)`` takes a ``reference.config.CaseConfig`` (generation 2) and, on
a CPU-only machine:

1. builds the case's layers as model loading does (``runners.build_layers``: real layer
   objects in ``static_forward_context``; drafts under the runner's own draft config);
2. asks the runner's own ``get_kv_cache_spec`` for the specs;
3. plans as the engine core does: ``get_supported_kv_cache_layouts`` +
   ``resolve_kv_cache_layout`` (``VLLM_KV_CACHE_LAYOUT`` from the case),
   ``get_global_kv_cache_groups``, ``get_kv_cache_config_from_groups`` (or
   ``get_kv_cache_configs`` with ``admission=True``), ``resolve_kv_cache_block_sizes``;
4. runs the runner's own ``initialize_kv_cache`` (``runners``) and reads what it built:
   kernel block sizes, its and its drafter's metadata builders, what it registered with
   the KV transfer group and what each layer was bound to.

Where a runner cannot be built for a case the shared ``v1/worker/utils.py`` functions
stand in (``fidelity="shared"``, with the reason); the observation says which.

The result is plain data with the reference's field meanings. vLLM errors
(ValueError / AssertionError / NotImplementedError) become ``Observation.error`` with
the stage that raised; what cannot run on CPU becomes ``Observation.unsupported``.

Replay one case: ``python -m gpu_impl.vllm_cpu.planning '<case json>' [mrv1|mrv2]``.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from dataclasses import asdict, dataclass, field, replace
from types import SimpleNamespace
from typing import Any, Callable, Iterator, NamedTuple

from gpu_impl.vllm_cpu import shims, spec_facts
from gpu_impl.vllm_cpu.model_config import ModelConfigStandIn
from reference.config import LAYER_OWN_BACKENDS
from gpu_impl.vllm_cpu.registration import RegisteredKV

VLLM_ERRORS = (ValueError, AssertionError, NotImplementedError)


# --- plain-data results: gpu_impl.observation (one observation type for every driver) ---

from gpu_impl.observation import GroupObs, Observation, TensorObs, ViewObs  # noqa: E402,F401


class _Failed(Exception):
    def __init__(self, stage: str, exc: BaseException):
        super().__init__(stage)
        self.stage = stage
        self.exc = exc


class _Unsupported(Exception):
    pass


@contextlib.contextmanager
def _stage(name: str) -> Iterator[None]:
    try:
        yield
    except VLLM_ERRORS as exc:
        raise _Failed(name, exc) from exc
    except (TypeError, AttributeError, ArithmeticError) as exc:
        # Raised by vLLM's own code (its innermost frame is in vllm/): vLLM's behaviour on this
        # configuration (e.g. a spec promotion passing a field its target class lacks), observed
        # as the stage's error. Raised by the harness: a harness bug, not hidden.
        if not _raised_in_vllm(exc):
            raise
        raise _Failed(name, exc) from exc


def _raised_in_vllm(exc: BaseException) -> bool:
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and "/vllm/" in frames[-1].filename.replace("\\", "/") and "/gpu_impl/" not in frames[-1].filename


# --- the process-wide VllmConfig ---------------------------------------------------------

_VLLM_CONFIG = None


def _vllm_config():
    """One real ``VllmConfig`` per process (no model), reset per case by ``vllm_config_for``."""
    global _VLLM_CONFIG
    if _VLLM_CONFIG is None:
        shims.apply()
        from vllm.config import CacheConfig, DeviceConfig, VllmConfig
        import vllm.v1.core.single_type_kv_cache_manager as single_type_kv_cache_manager

        vc = VllmConfig(device_config=DeviceConfig(device="cpu"), cache_config=CacheConfig(block_size=16))
        # The engine core registers the built-in spec types before grouping (releases
        # before the spec registry, generation 1, have nothing to register).
        register = getattr(single_type_kv_cache_manager, "register_all_kvcache_specs", None)
        if register is not None:
            register(vc)
        _VLLM_CONFIG = vc
    return _VLLM_CONFIG


_CONNECTOR_NAMES = {"nixl": "NixlConnector", "mooncake": "MooncakeConnector", "offloading": "OffloadingConnector"}


@contextlib.contextmanager
def vllm_config_for(case) -> Iterator[Any]:
    """Reset the shared VllmConfig to the case, set env/capability, and make it current.

    Everything set here is restored on exit (the VllmConfig is reused across cases).
    Public for drivers that plan without a runner (``gpu_impl.connectors.vllm_setup``).
    """
    import torch
    import vllm.envs as envs
    from vllm.config import KVTransferConfig, set_current_vllm_config

    if case.connector is not None and case.connector not in _CONNECTOR_NAMES:
        raise _Unsupported(f"connector {case.connector!r} is not driven on CPU")
    model_dtype = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "float": "float32"}.get(
        case.model_dtype, case.model_dtype
    )
    vc = _vllm_config()
    cc = vc.cache_config
    cc.block_size = case.block_size
    cc.kv_cache_layout = None  # resolve_kv_cache_layout: a set layout would win outright
    cc.num_gpu_blocks_override = case.num_blocks
    # MambaModelConfig: mamba_block_size = max_model_len without prefix-caching "align" mode.
    cc.mamba_block_size = case.mamba_block_size or case.max_model_len
    cc.mamba_page_size_padded = None
    cc.skip_page_size_padded = None
    cc.mamba_cache_mode = case.mamba_cache_mode
    # --mamba-cache-dtype / --mamba-ssm-cache-dtype: what a mixer class's get_state_dtype reads.
    cc.mamba_cache_dtype = getattr(case, "mamba_cache_dtype", "auto")
    cc.mamba_ssm_cache_dtype = getattr(case, "mamba_ssm_cache_dtype", "auto")
    # The model-wide --kv-cache-dtype: what the target attention layers use.
    # Side caches that name their own backend (indexer keys, QSA's, DeepSeek V4's) keep dtypes of their own: the
    # model's attention layers carry --kv-cache-dtype, those caches only where the model has nothing else.
    targets = [l for l in case.layers if not l.is_draft and l.kind != "mamba"]
    cc.cache_dtype = next((l.cache_dtype for l in targets if l.kind not in LAYER_OWN_BACKENDS),
                          next((l.cache_dtype for l in targets), "auto"))
    # vLLM's defaults for a generative model: block hashing for prefix caching on.
    cc.enable_prefix_caching = True
    cc.prefix_match_unit = None
    vc.scheduler_config.disable_hybrid_kv_cache_manager = case.disable_hybrid_kv_cache_manager
    pc = vc.parallel_config
    pc.tensor_parallel_size = case.tensor_parallel_size
    pc.decode_context_parallel_size = case.decode_context_parallel_size
    pc.prefill_context_parallel_size = getattr(case, "prefill_context_parallel_size", 1)
    # --attention-backend: the target layers' explicit choice, read by vLLM's selector
    # (and inherited, or not, by each runner's draft path).
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    saved_attention_config = vc.attention_config
    try:
        backend = AttentionBackendEnum[case.attention_backend] if case.attention_backend else None
    except (KeyError, ValueError):  # the enum's own lookup raises ValueError("Unknown attention backend ...")
        raise _Unsupported(f"--attention-backend {case.attention_backend}: this vLLM has no attention backend of "
                           "that name (a case for a later release)") from None
    attention_fields: dict[str, Any] = {"backend": backend}
    if hasattr(vc.attention_config, "sparse_mla_prefill_workspace_factor"):  # 0.33 on
        # VllmConfig.__post_init__ resolves this once a model config exists (config/vllm.py:
        # 5 up to 256k tokens, else 2); the shared config was built without one. The sparse-MLA
        # indexer's metadata builder sizes its prefill buffer from it.
        attention_fields["sparse_mla_prefill_workspace_factor"] = (
            vc.attention_config.sparse_mla_prefill_workspace_factor or (5 if case.max_model_len <= 256 * 1024 else 2))
    if hasattr(vc.attention_config, "indexer_kv_dtype"):
        # --attention-config indexer_kv_dtype: what MiniMax M3's indexer reads for its key cache
        # (attention_config.resolve_indexer_kv_dtype), described by the case as its minimax_indexer layers' dtype.
        indexer = {l.cache_dtype for l in case.layers if l.kind == "minimax_indexer"} - {"auto"}
        attention_fields["indexer_kv_dtype"] = "fp8" if indexer else "auto"
    object.__setattr__(vc, "attention_config", replace(vc.attention_config, **attention_fields))
    saved_model_config = vc.model_config
    saved_transfer = vc.kv_transfer_config
    saved_env = os.environ.pop("VLLM_KV_CACHE_LAYOUT", None)
    try:
        object.__setattr__(vc, "model_config", ModelConfigStandIn(case, getattr(torch, model_dtype)))
        if case.connector is not None:
            # Buffers on the GPU, as KVTransferConfig defaults them there (current_platform.device_type; on CPU it
            # would say "cpu", which Step5's DSA layers refuse for NIXL).
            transfer = KVTransferConfig(kv_connector=_CONNECTOR_NAMES[case.connector], kv_role="kv_both",
                                        kv_buffer_device="cuda")
            object.__setattr__(vc, "kv_transfer_config", transfer)
        if hasattr(envs, "disable_envs_cache"):
            envs.disable_envs_cache()  # envs are read live, per case
        if case.layout is not None:
            os.environ["VLLM_KV_CACHE_LAYOUT"] = case.layout
        # The conv-state layout is read from the environment the case runs under, never from a
        # previous case's cached answer (get_conv_state_layout is lru_cached for the process).
        with shims.fake_capability(case.capability), set_current_vllm_config(vc), \
                shims.conv_state_layout(os.environ.get("VLLM_SSM_CONV_STATE_LAYOUT")):
            yield vc
    finally:
        pc.tensor_parallel_size = pc.decode_context_parallel_size = pc.prefill_context_parallel_size = 1
        os.environ.pop("VLLM_KV_CACHE_LAYOUT", None)
        if saved_env is not None:
            os.environ["VLLM_KV_CACHE_LAYOUT"] = saved_env
        object.__setattr__(vc, "model_config", saved_model_config)
        object.__setattr__(vc, "attention_config", saved_attention_config)
        object.__setattr__(vc, "kv_transfer_config", saved_transfer)


# --- step 1: per-layer specs ------------------------------------------------------------------


def _spec_config(vc, case, model_torch_dtype):
    """What the layers' ``get_kv_cache_spec`` reads from the VllmConfig."""
    return SimpleNamespace(
        cache_config=vc.cache_config,
        model_config=SimpleNamespace(dtype=model_torch_dtype),
        num_speculative_tokens=0,
    )


def _raw_spec(layer, backend_cls, spec_cfg, model_config):
    """The layer's own ``get_kv_cache_spec``, run on a stand-in layer object."""
    from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype

    kind = layer.kind
    if kind in ("full", "sliding_window"):
        from vllm.model_executor.layers.attention.attention import Attention
        from vllm.v1.attention.backend import AttentionType

        stand_in = SimpleNamespace(
            attn_type=AttentionType.DECODER,
            kv_cache_dtype=layer.cache_dtype,
            kv_cache_torch_dtype=kv_cache_dtype_str_to_dtype(layer.cache_dtype, model_config),
            sliding_window=layer.sliding_window if kind == "sliding_window" else None,
            attn_backend=backend_cls,
            num_kv_heads=layer.num_kv_heads,
            head_size=layer.head_size,
            head_size_v=layer.head_size_v if layer.head_size_v is not None else layer.head_size,
        )
        return Attention.get_kv_cache_spec(stand_in, spec_cfg)
    if kind in ("cross", "chunked_local", "sink_full"):
        from vllm.v1.attention.backend import AttentionType

        stand_in = SimpleNamespace(
            attn_type=AttentionType.DECODER,
            kv_cache_dtype=layer.cache_dtype,
            kv_cache_torch_dtype=kv_cache_dtype_str_to_dtype(layer.cache_dtype, model_config),
            num_kv_heads=layer.num_kv_heads,
            head_size=layer.head_size,
            head_size_v=layer.head_size_v if layer.head_size_v is not None else layer.head_size,
            attention_chunk_size=layer.attention_chunk_size,
            sink_len=layer.sink_len,
        )
        if kind == "cross":
            from vllm.model_executor.layers.attention.cross_attention import CrossAttention as layer_cls
        elif kind == "chunked_local":
            from vllm.model_executor.layers.attention.chunked_local_attention import (
                ChunkedLocalAttention as layer_cls,
            )
        else:
            from vllm.model_executor.layers.attention.static_sink_attention import StaticSinkAttention as layer_cls
        return layer_cls.get_kv_cache_spec(stand_in, spec_cfg)
    if kind in ("mla", "sliding_window_mla"):
        from vllm.model_executor.layers.attention.mla_attention import MLAAttention

        stand_in = SimpleNamespace(
            kv_cache_dtype=layer.cache_dtype,
            head_size=layer.head_size,
            sliding_window=layer.sliding_window if kind == "sliding_window_mla" else None,
            topk_buffer_width=None,
            indexer=None,
            non_causal_multi_token_decode=False,
        )
        return MLAAttention.get_kv_cache_spec(stand_in, spec_cfg)
    if kind == "mamba":
        from vllm.model_executor.layers.mamba.abstract import MambaBase
        from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum

        if layer.backend not in shims.MAMBA_BACKENDS:
            raise _Unsupported(f"layer {layer.name!r}: {layer.backend} is not a state-space backend")
        dtypes = layer.mamba_dtypes or ("bfloat16",) * len(layer.mamba_shapes)
        import torch

        stand_in = SimpleNamespace(
            get_state_shape=lambda: tuple(tuple(s) for s in layer.mamba_shapes),
            get_state_dtype=lambda: tuple(getattr(torch, d) for d in dtypes),
            mamba_type=MambaAttentionBackendEnum[shims.MAMBA_BACKENDS[layer.backend]],
            is_kv_cache_tp_replicated=False,
        )
        return MambaBase.get_kv_cache_spec(stand_in, spec_cfg)
    raise _Unsupported(f"layer {layer.name!r}: kind {kind!r} is not driven on CPU yet")


def specs_and_backends(case, runner, vc):
    """``{layer: spec}`` for the case's layers (built as the runner's model loading
    builds them), their backend classes and names: for drivers that plan without
    initialising a runner (the connector drivers)."""
    from vllm.v1.worker.gpu.attn_utils import get_kv_cache_spec

    from gpu_impl.vllm_cpu.runners import mixer_environment

    with mixer_environment(case):
        layers = _build_layers(case, runner, vc)
        _negotiate_block_size(case, vc)
        specs = get_kv_cache_spec(vc)
    backends = {name: layer.get_attn_backend() for name, layer in layers.items()}
    return specs, backends, {name: _backend_name(layer) for name, layer in layers.items()}


_configure = vllm_config_for
_specs = specs_and_backends
"""The private names ``gpu_impl.vllm_cpu.backends`` and the tests still use."""


# --- the pipeline --------------------------------------------------------------------------------


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _attention_groups(kv_cache_config, backends):
    """Attention groups per KV cache group, keyed like the runners' discovery.

    ``GPUModelRunner.initialize_attn_backend`` (MRv1) and ``attn_utils.init_attn_backend``
    (MRv2) key on (backend class, per-layer spec, num_heads_q); the stand-ins have no
    query heads, so drafts are kept apart from targets by ``is_draft`` instead.
    """
    from vllm.v1.kv_cache_interface import UniformTypeKVCacheSpecs
    from vllm.v1.worker.utils import AttentionGroup

    out = []
    for gid, group in enumerate(kv_cache_config.kv_cache_groups):
        by_key: dict[Any, AttentionGroup] = {}
        for name in group.layer_names:
            spec = group.kv_cache_spec
            if isinstance(spec, UniformTypeKVCacheSpecs):
                spec = spec.kv_cache_specs[name]
            backend = backends[name]
            key = (backend.full_cls_name(), spec, getattr(spec, "is_draft", False))  # is_draft: 0.33 on
            if key in by_key:
                by_key[key].layer_names.append(name)
            else:
                by_key[key] = AttentionGroup(backend, [name], spec, gid)
        out.append(list(by_key.values()))
    return out


def _scheduler_block_sizes(vc, kv_cache_config) -> tuple[int, int, int]:
    """``EngineCore._initialize_kv_caches`` after planning: (cache_config.block_size,
    scheduler block size, hash block size), with vLLM's ``resolve_kv_cache_block_sizes``."""
    from vllm.v1.core.kv_cache_utils import generate_scheduler_kv_cache_config, resolve_kv_cache_block_sizes

    scheduler_config = generate_scheduler_kv_cache_config([kv_cache_config])
    groups = scheduler_config.kv_cache_groups
    participating = [g.kv_cache_spec.block_size for g in groups if g.kv_cache_spec.prefix_cacheable]
    cache_block_size = min(participating if participating else [g.kv_cache_spec.block_size for g in groups])
    cc = vc.cache_config
    saved, cc.block_size = cc.block_size, cache_block_size
    try:
        scheduler, hashing = resolve_kv_cache_block_sizes(scheduler_config, vc)
    finally:
        cc.block_size = saved
    return cache_block_size, scheduler, hashing


class _Registration(NamedTuple):
    """Where the pool is allocated, and who is handed the registered tensors."""

    device: str = "meta"
    on_registered: Callable[[RegisteredKV], None] | None = None


def _run(case, runner: str, admission: bool, result: dict[str, Any], schedules: tuple = (),
         registration: _Registration = _Registration()) -> None:
    """Fill ``result`` step by step (what succeeded stays there when a later step fails)."""
    from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts, resolve_kv_cache_layout
    from gpu_impl.vllm_cpu import planning_api as planning

    from gpu_impl.vllm_cpu import runners

    with vllm_config_for(case) as vc:
        with _stage("config"):
            # What refuses a configuration before any layer is built (PCP, MRv1's Step5): the runner's own validation.
            runners.check_model_runner_support(case, runner, vc)
        with _stage("specs"), runners.mixer_environment(case):
            layers = _build_layers(case, runner, vc)
            _negotiate_block_size(case, vc)
            instance, why_not = _runner_or_reason(case, runner, vc)
            result["fidelity"] = "runner" if instance is not None else "shared"
            result["fidelity_reason"] = why_not
            if instance is not None:
                specs = instance.get_kv_cache_spec()  # the runner's own
            else:
                from vllm.v1.worker.gpu.attn_utils import get_kv_cache_spec

                specs = get_kv_cache_spec(vc)
        result["layer_backends"] = {name: _backend_name(layer) for name, layer in layers.items()}
        backends = {name: layer.get_attn_backend() for name, layer in layers.items()}
        with _stage("layout"):
            distinct = list({cls.full_cls_name(): cls for cls in backends.values()}.values())
            supported = [layout.name for layout in get_supported_kv_cache_layouts(distinct)]
            layout = resolve_kv_cache_layout(vc, [supported], list(specs.values()))
        result["layout"] = layout.name
        with _stage("groups"):
            # The engine core's entry point: merges the workers' specs, checks the
            # spec registry, tags SW extra_retained_tokens, then the default
            # builder's get_kv_cache_groups and _check_exact_partition.
            groups = planning.global_kv_cache_groups(vc, [specs])
        with _stage("placement"):
            if not specs:
                # An attention-free model (every layer encoder-only: BERT-like pooling models): the
                # engine core offers no memory (EngineCore._initialize_kv_caches: has_kv_cache False)
                # and get_kv_cache_configs plans nothing.
                (kv_cache_config,) = planning.kv_cache_configs(vc, [specs], [0], groups)
                bytes_per_block = 0
            else:
                bytes_per_block = planning.pool_bytes_per_block(vc, groups)
                if case.num_blocks is not None:
                    # get_kv_cache_configs: an override replaces the profiled memory.
                    available = case.num_blocks * bytes_per_block
                else:
                    available = case.kv_cache_memory_bytes
                if admission:
                    # The engine core's full path: null-block reservation, the
                    # max-model-len admission check, num_gpu_blocks_override.
                    (kv_cache_config,) = planning.kv_cache_configs(vc, [specs], [available], groups)
                else:
                    # get_kv_cache_configs reserves the null block and refuses when
                    # nothing is left; the max-model-len half of the check is skipped
                    # (the reference does not model admission).
                    planning.check_enough_kv_cache_memory(
                        available - bytes_per_block, lambda: 0, vc.model_config.max_model_len, lambda _: 0
                    )
                    kv_cache_config = planning.kv_cache_config_from_groups(vc, groups, available)
        result.update(
            groups=tuple(
                GroupObs(tuple(g.layer_names), g.kv_cache_spec.block_size, type(g.kv_cache_spec).__name__,
                         tuple(type(getattr(g.kv_cache_spec, "kv_cache_specs", {}).get(n, g.kv_cache_spec)).__name__
                               for n in g.layer_names))
                for g in kv_cache_config.kv_cache_groups
            ),
            num_blocks=kv_cache_config.num_blocks,
            bytes_per_block=bytes_per_block,
            page_bytes=spec_facts.page_bytes(kv_cache_config),
            stride_alignments=spec_facts.stride_alignments(kv_cache_config),
            spec_dtypes=spec_facts.spec_dtypes(kv_cache_config),
            supported_kernel_block_sizes=spec_facts.supported_kernel_block_sizes(kv_cache_config, backends),
            tensors=tuple(
                TensorObs(t.size, tuple(t.layers), t.layer_stride, t.block_stride, t.offset)
                for t in kv_cache_config.kv_cache_tensors
            ),
        )
        if kv_cache_config.kv_cache_groups:
            with _stage("scheduler_block_sizes"):
                sizes = _scheduler_block_sizes(vc, kv_cache_config)
            result["cache_block_size"], result["scheduler_block_size"], result["hash_block_size"] = sizes
        if instance is not None:
            try:
                registered = _initialize_through_runner(case, runner, instance, kv_cache_config, layers, result,
                                                        registration.device)
            except _RunnerNotDriven as exc:
                # Said in the observation and the report; the shared functions still run.
                result["fidelity"], result["fidelity_reason"] = "shared", str(exc)
                for key in ("kernel_block_sizes", "builder_kernel_block_sizes", "registered", "bound_shapes"):
                    result.pop(key, None)
            else:
                if schedules:
                    _run_schedules(case, runner, instance, vc, kv_cache_config, layers, schedules, result)
                if registration.on_registered is not None and registered is not None:
                    registration.on_registered(RegisteredKV(vc, kv_cache_config, backends, result.get("kernel_block_sizes"),
                                                            _in_case_order(case, registered)))
                return
        registered = _initialize_through_shared_functions(kv_cache_config, layout, backends, layers, result,
                                                          registration.device)
        if registration.on_registered is not None:
            registration.on_registered(RegisteredKV(vc, kv_cache_config, backends, result.get("kernel_block_sizes"),
                                                    _in_case_order(case, registered)))
        if schedules:
            result["schedules_unsupported"] = (
                f"block tables are read from the runner's own initialize_kv_cache, which was not driven: "
                f"{result.get('fidelity_reason')}")


def _run_schedules(case, runner, instance, vc, kv_cache_config, layers, schedules, result) -> None:
    """Each schedule through the block tables of a freshly initialised runner (the first
    reuses the runner just observed)."""
    from gpu_impl.vllm_cpu import runner_tables, runners

    why = runner_tables.schedule_support()
    if why is not None:
        result["schedules_unsupported"] = why
        return
    observed = []
    for index, scenario in enumerate(schedules):
        if index:
            instance, why = _runner_or_reason(case, runner, vc)
            if instance is None:
                result["schedules_unsupported"] = why
                return
            with runners.recording_transfer_group(), runners.initialisation_environment(case):
                instance.initialize_kv_cache(kv_cache_config, kv_cache_allocation_context=runners.allocation_on_meta())
        with runners.initialisation_environment(case):
            observed.append(runner_tables.run_schedule(runner, instance, scenario))
    result["schedules"] = tuple(observed)


def _negotiate_block_size(case, vc) -> None:
    """A hybrid (attention + state) model's block size as engine start-up leaves it once the layers
    exist: the release's own ``Platform.update_block_size_for_backend`` raises ``--block-size`` until
    the attention page holds the model class's state page, and pads the state page to it."""
    if any(l.kind == "mamba" for l in case.layers) and any(l.kind != "mamba" and not l.is_draft for l in case.layers):
        from gpu_impl.vllm_cpu.model_config import negotiate_hybrid_block_size

        negotiate_hybrid_block_size(vc)


def _build_layers(case, runner: str, vc) -> dict[str, Any]:
    """``runners.build_layers``, with what keeps a layer from being built on CPU (a
    backend that does not import, kernels that do not load) as ``_Unsupported``; vLLM
    refusing a layer stays a vLLM error (e.g. fp8 on a backend that has none)."""
    from gpu_impl.vllm_cpu import runners

    try:
        return runners.build_layers(case, runner, vc)
    except shims.BackendUnavailable as exc:
        raise _Unsupported(f"backend class not importable on CPU: {exc}") from None
    except runners.RunnerUnavailable as exc:
        raise _Unsupported(str(exc)) from None
    except AssertionError as exc:
        if _kernel_availability_assert(exc):
            raise _Unsupported(f"a backend's kernels are not on this CPU machine: {_where(exc)}") from None
        raise
    except NotImplementedError as exc:
        if "requires CUDA" in str(exc):
            # A layer asking the platform for CUDA hardware (MiniMax M3's fp8 indexer: is_cuda() and supports_fp8()),
            # which the CPU drivers' platform is not: a GPU's answer, not this configuration's.
            raise _Unsupported(f"a layer checks for CUDA hardware, which the CPU platform is not: {_one_line(exc)}") from None
        raise
    except VLLM_ERRORS:
        raise
    except Exception as exc:  # noqa: BLE001 - hardware the shims do not stand in for
        raise _Unsupported(f"a layer could not be constructed on CPU: {_one_line(exc)}") from None


def _runner_or_reason(case, runner: str, vc):
    """The runner stand-in, or (None, why it cannot be built for this case)."""
    from gpu_impl.vllm_cpu import runners

    try:
        return runners.runner_instance(case, runner, vc, _DEVICE), None
    except runners.RunnerUnavailable as exc:
        return None, str(exc)
    except Exception as exc:  # noqa: BLE001 - a changed runner API: say so, fall back
        return None, f"{runner.upper()} runner could not be built: {_one_line(exc)}"


_DEVICE = "cpu"
"""The runners' device: builders and block tables live on CPU; the KV pool on ``meta``."""


def _backend_name(layer) -> str:
    return layer.get_attn_backend().get_name()


def _view(t) -> ViewObs:
    return ViewObs(tuple(t.shape), tuple(t.stride()), _dtype_name(t.dtype), t.storage_offset(), t.untyped_storage().nbytes())


def _in_case_order(case, registered: dict[str, Any]) -> dict[str, Any]:
    order = [layer.name for layer in case.layers]
    return dict(sorted(registered.items(), key=lambda item: order.index(item[0]) if item[0] in order else len(order)))


def _initialize_through_runner(case, runner, instance, kv_cache_config, layers, result, device: str = "meta"):
    """``initialize_kv_cache`` of the runner itself; observe the runner afterwards.
    Returns what the runner registered (None: it registered nothing)."""
    from gpu_impl.vllm_cpu import runners

    with runners.recording_transfer_group() as recorder, runners.initialisation_environment(case):
        try:
            instance.initialize_kv_cache(kv_cache_config, kv_cache_allocation_context=runners.allocation_on_meta(device))
        except VLLM_ERRORS as exc:
            _observe_runner_state(runner, instance, layers, recorder, result)
            raise _Failed(runners.failing_stage(exc, "initialize_kv_cache"), exc) from exc
        except Exception as exc:  # noqa: BLE001 - the stand-in lacks what this vLLM reads
            raise _RunnerNotDriven(f"{runner.upper()} initialize_kv_cache could not be driven: {_one_line(exc)}") from exc
    _observe_runner_state(runner, instance, layers, recorder, result)
    return recorder.registered


def _kernel_availability_assert(exc: AssertionError) -> bool:
    """A bare ``assert`` in a backend impl's constructor: it checks its compiled kernels
    (e.g. b12x's ``paged_attention.is_supported()``), not the configuration."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    last = frames[-1] if frames else None
    return not str(exc) and last is not None and "/v1/attention/backends/" in last.filename and last.name == "__init__"


def _where(exc: BaseException) -> str:
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return type(exc).__name__
    last = frames[-1]
    return f"{last.filename.split('site-packages/')[-1]}:{last.lineno}: {last.line}"


class _RunnerNotDriven(Exception):
    """The runner's own code failed for a harness reason (a changed API, a missing attribute)."""


def _one_line(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"[:300]


def _observe_runner_state(runner, instance, layers, recorder, result) -> None:
    """Whatever the runner had set up (all of it after a success, a prefix after a refusal)."""
    from gpu_impl.vllm_cpu import runners

    sizes = runners.kernel_block_sizes(runner, instance)
    if sizes is not None:
        result["kernel_block_sizes"] = sizes
    own, draft = runners.attention_groups(runner, instance)
    builders = runners.builder_block_sizes(own)
    builders.update(runners.builder_block_sizes(draft))
    if builders:
        result["builder_kernel_block_sizes"] = builders
    if recorder.registered is not None:
        result["registered"] = {name: _view(t) for name, t in recorder.registered.items()}
        result["storage_of"] = spec_facts.storage_numbers(recorder.registered)
        bound = runners.bound_caches(layers)
        result["bound_shapes"] = {name: tuple(ts[0].shape) for name, ts in bound.items()}
        result["bound_outside_registered"] = _bound_outside_registered(bound, recorder.registered)
        result["bound_views"] = {
            name: tuple(_view(t) for t in tensors)
            for name, tensors in bound.items()
            if name in recorder.registered and all(runners.same_storage(t, recorder.registered[name]) for t in tensors)
        }












def _bound_outside_registered(bound, registered) -> tuple[str, ...]:
    """Layers whose bound cache is not a view of the storage registered for that layer."""
    from gpu_impl.vllm_cpu import runners

    bad = []
    for name, tensors in bound.items():
        reg = registered.get(name)
        if reg is None or not all(runners.same_storage(t, reg) for t in tensors):
            bad.append(name)
    return tuple(sorted(bad))


def _initialize_through_shared_functions(kv_cache_config, layout, backends, layers, result, device: str = "meta"):
    """The fallback where a runner cannot be built: the shared ``v1/worker/utils.py``
    functions. No metadata builder is constructed here (the runner's own code does that),
    so builder block sizes and bound views are not observed (left None)."""
    import torch
    from vllm.v1.worker.utils import allocate_kv_cache, prepare_kernel_block_sizes

    with _stage("attention_groups"):
        # Both runners' initialize_kv_cache call it (MRv1 in initialize_attn_backend).
        from vllm.config import get_current_vllm_config
        from vllm.v1.worker.cp_utils import check_attention_cp_compatibility

        check_attention_cp_compatibility(get_current_vllm_config())
    with _stage("kernel_block_sizes"):
        attn_groups = _attention_groups(kv_cache_config, backends)
        kernel_block_sizes = prepare_kernel_block_sizes(kv_cache_config, attn_groups)
    result["kernel_block_sizes"] = tuple(kernel_block_sizes)
    with _stage("allocate"):
        kv_caches = allocate_kv_cache(kv_cache_config, torch.device(device), layout, kernel_block_sizes)
    result["registered"] = {name: _view(t) for name, t in kv_caches.items()}
    result["storage_of"] = spec_facts.storage_numbers(kv_caches)
    result["builder_kernel_block_sizes"] = None
    result["bound_shapes"] = None
    return kv_caches


_MODULES_AT_FREEZE = [0]
"""``len(sys.modules)`` when ``shims.freeze_long_lived`` last ran."""


def observe(case, runner: str = "mrv1", *, admission: bool = False, schedules=(), device: str = "meta",
            on_registered: Callable[[RegisteredKV], None] | None = None) -> Observation:
    """Run vLLM's own layout pipeline for ``case``; never raises for vLLM refusals.

    ``device="cpu"`` makes the runner allocate the KV pool in host memory, and
    ``on_registered`` is called with what it registered (``RegisteredKV``) while the
    case's vLLM config is current (a KV connector check runs there); what it raises
    propagates.

    ``admission=True`` plans through the engine core's ``get_kv_cache_configs``
    (which also refuses a pool too small for one ``max_model_len`` request); the
    default plans with ``get_kv_cache_config_from_groups`` and only keeps its
    "no memory left after the null block" check. ``schedules`` (``reference.config``
    scenarios) run through the block tables the runner built (``Observation.schedules``).
    """
    if runner not in ("mrv1", "mrv2"):
        raise ValueError(f"runner {runner!r} is not one of mrv1, mrv2")
    applied = tuple(shims.apply())
    if case.generation == 1:
        from gpu_impl import vllm_api

        problem = vllm_api.api_problem("gen1")
        if problem is not None:
            return Observation(case.name, runner, unsupported=f"generation-1 cases need a vLLM 0.19 to 0.28: {problem}", shims=applied)
        from gpu_impl.vllm_cpu import gen1

        return gen1.observe(case, runner, applied, device=device, on_registered=on_registered, schedules=tuple(schedules),
                            runner_config=vllm_config_for)
    try:
        return _observe(case, runner, admission, applied, tuple(schedules), _Registration(device, on_registered))
    finally:
        # Modules a case loads for the first time (a runner, a layer kind, a backend)
        # stay for good: keep them out of the cyclic collector's way from now on.
        if len(sys.modules) != _MODULES_AT_FREEZE[0]:
            shims.freeze_long_lived()
            _MODULES_AT_FREEZE[0] = len(sys.modules)


def _observe(case, runner: str, admission: bool, applied: tuple[str, ...], schedules: tuple = (),
             registration: _Registration = _Registration()) -> Observation:
    partial: dict[str, Any] = {}
    try:
        _run(case, runner, admission, partial, schedules, registration)
    except _Unsupported as exc:
        return Observation(case.name, runner, unsupported=str(exc), shims=applied)
    except _Failed as failed:
        exc = failed.exc
        message = str(exc) if str(exc) else repr(exc)
        # The steps before the failing one stay in the Observation, for diagnosis.
        return Observation(
            case.name,
            runner,
            error=f"{type(exc).__name__}: {message}",
            error_stage=failed.stage,
            shims=applied,
            **partial,
        )
    return Observation(case.name, runner, shims=applied, **partial)


def main(argv: list[str] | None = None) -> int:
    """``python -m gpu_impl.vllm_cpu.planning '<case json>' [mrv1|mrv2]``: print the Observation."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(main.__doc__)
        return 2
    from reference.config import CaseConfig
    from reference.errors import ConfigError

    text = argv[0]
    runner = argv[1] if len(argv) > 1 else "mrv1"
    try:
        if text.startswith("@"):
            with open(text[1:], encoding="utf-8") as fh:
                text = fh.read()
        case = CaseConfig.from_json(text)
        if runner not in ("mrv1", "mrv2"):
            raise ConfigError(f"runner {runner!r} is not one of mrv1, mrv2")
    except (ConfigError, ValueError, OSError) as exc:  # bad input: one line, exit 4
        print(f"planning: error: {exc}".splitlines()[0], file=sys.stderr)
        return 4
    obs = observe(case, runner)
    print(obs.to_json())
    return 0 if obs.unsupported is None else 1


if __name__ == "__main__":
    raise SystemExit(main())
