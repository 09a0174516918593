"""The CPU shim set that lets vLLM's KV-cache layout code run without a GPU.

Everything the driver calls is vLLM's own code; this module only patches the few
process-global things that assume CUDA (see shared/research/feasibility-cpu.md,
"The complete shim set"). ``apply()`` is idempotent and must run before the first
``import vllm`` for the environment variables to take effect; ``applied_shims()``
returns the list of what was applied, for report metadata.

Importing this module does not import vLLM.
"""

from __future__ import annotations

import contextlib
import importlib
import functools
import os
import sys
import threading
import warnings
from types import SimpleNamespace
from typing import Any, Iterator

# Environment set before ``import vllm`` (setdefault: an explicit user value wins,
# except VLLM_TARGET_DEVICE and VLLM_KV_CACHE_LAYOUT, which the driver owns).
_ENV_DEFAULTS = {
    "HF_HUB_OFFLINE": "1",  # no network: ModelConfig / transformers never download
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_LOGGING_LEVEL": "ERROR",  # vLLM's own info/warning lines would drown kvconform's report
    "TORCH_CPP_LOG_LEVEL": "ERROR",  # torch's deprecation warnings on import, likewise
}
# "cpu" would select vLLM's CpuPlatform (different defaults: block size 128, CPU
# attention backends). The driver models a *virtual CUDA target* on vLLM's
# UnspecifiedPlatform with a faked compute capability, so pin the default "cuda":
# the CUDA plugin then fails to load libcuda and vLLM falls back to Unspecified.
_FORCED_ENV = {"VLLM_TARGET_DEVICE": "cuda"}

VIRTUAL_SM_COUNT = 132
"""Streaming multiprocessors of the virtual GPU (an H100 SXM's count)."""

_lock = threading.Lock()
_applied: list[str] = []
_done = False
_env_done = False
_capability: tuple[int, int] = (9, 0)


def freeze_long_lived() -> None:
    """Move everything alive now (vLLM's and torch's modules, caches, backend classes)
    out of the cyclic collector's generations: the runner stand-ins and layers each
    observation builds make cycles, and collecting them otherwise rescans the whole
    imported heap (a third of the observation time without it). ``planning.observe``
    calls it after any observation that imported new modules; garbage is collected first."""
    import gc

    gc.collect()
    gc.freeze()


def applied_shims() -> list[str]:
    """What ``apply()`` did, one line per shim (empty before ``apply()``)."""
    return list(_applied)


def current_capability() -> tuple[int, int]:
    return _capability


def set_capability(capability: tuple[int, int]) -> None:
    """Make ``current_platform.get_device_capability()`` report ``capability``."""
    global _capability
    new = (int(capability[0]), int(capability[1]))
    if new != _capability:
        _forget_capability_answers()
    _capability = new


CAPABILITY_CACHED = ("supports_trtllm_attention", "has_flashinfer_sparse_mla_sm120_config")
"""``functools.cache``d answers of ``vllm.utils.flashinfer`` that read the capability
(a real GPU's never changes within a process; the virtual target's does per case)."""


def _forget_capability_answers() -> None:
    module = sys.modules.get("vllm.utils.flashinfer")
    for name in CAPABILITY_CACHED:
        function = getattr(module, name, None)
        if function is not None and hasattr(function, "cache_clear"):
            function.cache_clear()


@contextlib.contextmanager
def fake_capability(capability: tuple[int, int]) -> Iterator[None]:
    """Temporarily report ``capability`` (SM90 = (9, 0), SM100 = (10, 0))."""
    previous = _capability
    set_capability(capability)
    try:
        yield
    finally:
        set_capability(previous)


def prepare_env() -> None:
    """Set the environment variables vLLM reads at import time (idempotent).

    Call this before anything imports vLLM (``apply()`` calls it too); it does not
    import vLLM itself, so a test session can set it up and then ``importorskip``.
    """
    global _env_done
    with _lock:
        if _env_done:
            return
        _set_env()
        _env_done = True


def _set_env() -> None:
    import logging

    # torch logs import-time deprecation warnings through the "torch" logger.
    logging.getLogger("torch").setLevel(logging.ERROR)
    already = "vllm" in sys.modules
    for key, value in _ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    for key, value in _FORCED_ENV.items():
        os.environ[key] = value
    # The layout is a per-case input; a stray value would silently change every case.
    os.environ.pop("VLLM_KV_CACHE_LAYOUT", None)
    note = " (vllm was already imported: they may not have taken effect)" if already else ""
    names = ", ".join(f"{k}={os.environ[k]}" for k in (*_ENV_DEFAULTS, *_FORCED_ENV))
    _applied.append(f"env before import vllm: {names}; VLLM_KV_CACHE_LAYOUT unset{note}")


def _patch_platform() -> None:
    from vllm.platforms import current_platform
    from vllm.platforms.interface import DeviceCapability

    cls = type(current_platform)
    _applied.append(f"platform: {cls.__module__}.{cls.__qualname__} (device_type={current_platform.device_type!r})")

    # UnspecifiedPlatform says False, so VllmConfig would set
    # disable_hybrid_kv_cache_manager=True and silently unify SWA into full attention.
    cls.support_hybrid_kv_cache = classmethod(lambda c: True)
    _applied.append(f"{cls.__name__}.support_hybrid_kv_cache -> True (before any VllmConfig)")

    # Backends read the capability (FlashInfer's SM10x layouts and TRT-LLM page sizes).
    cls.get_device_capability = classmethod(
        lambda c, device_id=0: DeviceCapability(*_capability)
    )
    _applied.append(
        f"{cls.__name__}.get_device_capability -> the case's capability (virtual SM target; default {_capability})"
    )
    cls.num_compute_units = classmethod(lambda c, device_id=0: VIRTUAL_SM_COUNT)
    _applied.append(f"{cls.__name__}.num_compute_units -> {VIRTUAL_SM_COUNT} (the virtual GPU's SMs)")


@contextlib.contextmanager
def cuda_alike_worker_utils() -> Iterator[None]:
    """While it lasts, ``vllm.v1.worker.utils`` sees a CUDA-alike platform (the virtual GPU).

    Releases to 0.25 ``bind_kv_cache`` raise NotImplementedError when two layers share a
    layer index (a target layer and a draft's) unless the platform is CUDA-alike, XPU or CPU;
    the undeclared platform of a CPU-only machine is none of them. Only that module's view
    of the platform changes, and only here (generation 1's MRv2 schedules)."""
    import vllm.v1.worker.utils as worker_utils

    real = getattr(worker_utils, "current_platform", None)
    if real is None:
        yield
        return

    class _CudaAlike:
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def is_cuda_alike(self) -> bool:
            return True

    worker_utils.current_platform = _CudaAlike()
    try:
        yield
    finally:
        worker_utils.current_platform = real


_declared_backend: list[str | None] = [None]


@contextlib.contextmanager
def declared_autoselection(backend: str | None) -> Iterator[None]:
    """While a layer is built, the platform's *auto*-selection answers ``backend``.

    A real platform picks a backend from its GPU (``CudaPlatform.get_attn_backend_cls``
    walks a per-capability priority list); the virtual target declares the answer per
    layer instead. An explicit backend (``--attention-backend``, the speculative
    config's) reaches the platform through vLLM's own config code and is honoured as is.
    """
    previous = _declared_backend[0]
    _declared_backend[0] = backend
    try:
        yield
    finally:
        _declared_backend[0] = previous


def _patch_attention_selection(cls) -> None:
    # CudaPlatform.get_attn_backend_cls cannot be imported without libcuda. Its explicit
    # path validates the backend (validate_configuration) and returns its path; its
    # auto-selection walks the GPU's priority list over the backends that validate.
    # Most of validate_configuration asks the GPU (capability, compiled kernels); the
    # parts that are properties of the layer and the configuration, the attention type and
    # PCP, are kept: a real GPU neither runs nor auto-selects a backend that does not support
    # the layer's type, or PCP when it is on (each answered by the backend class itself).
    def get_attn_backend_cls(c, selected_backend, attn_selector_config=None, num_heads=None, **_):
        from vllm.v1.attention.backends.registry import AttentionBackendEnum

        backend = selected_backend
        if backend is None:
            declared = _declared_backend[0]
            if declared is None:
                raise ValueError("no backend declared for auto-selection on the virtual target")
            backend_class(declared)  # an unknown or unloadable name: BackendUnavailable
            backend = AttentionBackendEnum[declared]
        backend_cls = backend_class(backend.name)
        attn_type = getattr(attn_selector_config, "attn_type", None)
        reasons = []
        if attn_type is not None and not backend_cls.supports_attn_type(attn_type):
            reasons.append(f"attention type {attn_type} not supported")
        if getattr(attn_selector_config, "use_pcp", False) and not backend_cls.supports_pcp():
            reasons.append("PCP not supported")  # the configuration's, as validate_configuration asks it
        if reasons:
            if selected_backend is not None:
                raise ValueError(
                    f"Selected backend {selected_backend} is not valid for this configuration. Reason: {reasons}"
                )
            raise ValueError(f"No valid attention backend found: {backend.name}: {reasons}")
        return backend.get_path()

    cls.get_attn_backend_cls = classmethod(get_attn_backend_cls)
    _applied.append(
        f"{cls.__name__}.get_attn_backend_cls: a backend not supporting the layer's attention type (or PCP) is refused "
        "(CudaPlatform's validation); explicit backends as given; auto-selection -> the backend the case declares"
    )


def _patch_uva(cls) -> None:
    # MRv2's buffers use UVA (pinned host memory mapped into the GPU) when the platform
    # has it; the NonUvaBuffer fallback allocates plain tensors on device_type.
    import vllm.v1.worker.gpu.buffer_utils as buffer_utils

    buffer_utils.is_uva_available = lambda: False
    cls.device_type = "cpu"
    _applied.append(f"no UVA (vllm.v1.worker.gpu.buffer_utils.is_uva_available -> False); {cls.__name__}.device_type = 'cpu'")
    uva_buffer = getattr(buffer_utils, "UvaBuffer", None)
    if uva_buffer is not None and not hasattr(buffer_utils, "NonUvaBuffer"):
        # Releases before the NonUvaBuffer fallback (0.28 and older) allocate UVA buffers
        # unconditionally: on a CPU device the accelerator's view of host memory is itself.
        def cpu_view(self, size, dtype) -> None:
            import torch

            self.cpu = torch.zeros(size, dtype=dtype, device="cpu")
            self.np = self.cpu.numpy()
            self.uva = self.cpu

        uva_buffer.__init__ = cpu_view
        _applied.append("UvaBuffer on CPU: host memory is its own device view (vllm.v1.worker.gpu.buffer_utils)")


class VirtualMLAPrefill:
    """The MLA prefill kernel library of the virtual GPU (a real one picks FlashAttention,
    FlashInfer or TRT-LLM ragged prefill by GPU; none loads on CPU). The metadata builders
    clone it; nothing here touches the KV cache."""

    def __init__(self, **_: object) -> None:
        pass

    def clone(self) -> "VirtualMLAPrefill":
        return self

    @staticmethod
    def get_name() -> str:
        return "VIRTUAL_PREFILL"

    def supports_quant_output(self, *_: object) -> bool:
        return False


def _patch_mla_prefill(cls) -> None:
    cls.get_mla_prefill_backend_cls = classmethod(lambda c, selector_config=None: VirtualMLAPrefill)
    patched = [f"{cls.__name__}.get_mla_prefill_backend_cls"]
    # Up to 0.31 the prefill kernel is picked by a module function instead (imported by name
    # into the MLA attention layer's module too).
    for name in ("vllm.v1.attention.backends.mla.prefill", "vllm.v1.attention.backends.mla.prefill.selector",
                 "vllm.model_executor.layers.attention.mla_attention"):
        try:
            module = __import__(name, fromlist=["get_mla_prefill_backend"])
        except Exception:  # noqa: BLE001 - a release without the module has nothing to patch
            continue
        if hasattr(module, "get_mla_prefill_backend"):
            module.get_mla_prefill_backend = lambda *a, **k: VirtualMLAPrefill
            patched.append(f"{name}.get_mla_prefill_backend")
    _applied.append(f"{', '.join(patched)} -> a virtual MLA prefill kernel (prefill only, no KV layout)")


def _patch_multi_layer_check(cls) -> None:
    # CudaPlatform.check_runner_kv_caches_multi_layer is a no-op (cross and self attention
    # in one decoder block, encoder-decoder models); the Unspecified base raises.
    cls.check_runner_kv_caches_multi_layer = classmethod(lambda c: None)
    _applied.append(f"{cls.__name__}.check_runner_kv_caches_multi_layer -> CudaPlatform's (no-op)")


def _patch_device_properties() -> None:
    import torch

    def get_device_properties(device=None):
        major, minor = _capability
        return SimpleNamespace(
            name="virtual GPU", major=major, minor=minor, multi_processor_count=VIRTUAL_SM_COUNT,
            total_memory=80 << 30, L2_cache_size=50 << 20, warp_size=32,
        )

    torch.cuda.get_device_properties = get_device_properties
    _applied.append(f"torch.cuda.get_device_properties -> the virtual GPU (the case's capability, {VIRTUAL_SM_COUNT} SMs)")


_PAGE = 4096


def _page_aligned_zeros(nbytes: int):
    """A zeroed int8 host tensor of exactly ``nbytes`` whose first byte is page-aligned, as a
    device allocator's large allocations are (a connector registering the pool as one RDMA
    region, MoRIIO, needs it; ``torch.zeros`` on CPU aligns to 64 bytes only)."""
    import mmap

    import torch

    return torch.frombuffer(mmap.mmap(-1, nbytes), dtype=torch.int8)


@functools.lru_cache(maxsize=None)
def _on_meta_mode(all_devices: bool, target: str = "meta"):
    """The TorchFunctionMode class (made once: importing this module must not import torch)."""
    from torch.overrides import TorchFunctionMode

    import torch

    class CudaOnMeta(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            # Pinned host memory needs the CUDA driver (kernel wrappers pin their host-side workspaces, e.g.
            # FlashInfer's): without one it is plain host memory.
            if kwargs.get("pin_memory"):
                kwargs.pop("pin_memory")
            device = kwargs.get("device")
            if device is not None and (all_devices or str(device).startswith("cuda")):
                kwargs["device"] = target
                kwargs.pop("pin_memory", None)
                if target == "cpu" and _is_kv_pool(func, args, kwargs):
                    return _page_aligned_zeros(args[0])
            return func(*args, **kwargs)

    def _is_kv_pool(func, args, kwargs) -> bool:
        # allocate_kv_cache's one backing allocation: torch.zeros(size, dtype=torch.int8, device=...)
        return (func is torch.zeros and kwargs.get("dtype") is torch.int8 and len(args) == 1
                and isinstance(args[0], int) and args[0] >= _PAGE and set(kwargs) <= {"dtype", "device"})

    return CudaOnMeta


@contextlib.contextmanager
def cuda_on_meta(*, all_devices: bool = False, target: str = "meta") -> Iterator[None]:
    """Tensors created for a CUDA device (or, with ``all_devices``, any device) land on ``meta``.

    Layers and metadata builders allocate scratch on the GPU at construction; the KV
    cache pool is allocated through the runners' ``kv_cache_allocation_context`` hook.
    Device memory is what the hardware provides: its contents are never read here. Pinned host
    memory (kernel wrappers' host-side workspaces: Step5's FlashInfer sparse adapter) needs the CUDA
    driver; without one it is plain host memory.
    ``target="cpu"`` puts them in host memory instead (a connector check reads and writes
    the KV pool's bytes).
    """
    import torch

    real_index = torch.accelerator.current_device_index
    torch.accelerator.current_device_index = lambda: 0  # the virtual GPU is device 0
    try:
        with _on_meta_mode(all_devices, target)():
            yield
    finally:
        torch.accelerator.current_device_index = real_index


def _patch_flash_attn_kernels() -> None:
    # vllm.vllm_flash_attn wraps the compiled FA2/FA3 kernels (_vllm_fa2_C, _vllm_fa3_C),
    # which a CPU wheel cannot load; fa_utils.get_flash_attn_version asks it which
    # versions this GPU runs. The virtual target runs FA2 everywhere and FA3 on SM90
    # and FA4 on SM100 (what vLLM's CUDA wheel ships for H100 / B200).
    import types

    name = "vllm.vllm_flash_attn.flash_attn_interface"
    try:
        __import__(name)
        return  # the real kernels are here: nothing to stand in for
    except ImportError:
        pass
    package = types.ModuleType("vllm.vllm_flash_attn")
    package.__path__ = []  # a package, so the submodule import resolves
    interface = types.ModuleType(name)

    def fa_version_unsupported_reason(version, device=None):
        if version == 2 or (version == 3 and _capability[0] == 9) or (version == 4 and _capability[0] == 10):
            return None
        return f"FA{version} kernels are not on the virtual SM{_capability[0]}{_capability[1]} target"

    interface.fa_version_unsupported_reason = fa_version_unsupported_reason
    interface.is_fa_version_supported = lambda version, device=None: fa_version_unsupported_reason(version) is None
    package.flash_attn_interface = interface
    sys.modules.setdefault("vllm.vllm_flash_attn", package)
    sys.modules[name] = interface
    _applied.append(f"{name}: FA2 everywhere, FA3 on SM90, FA4 on SM100 (the compiled kernels cannot load on CPU)")


class _RankZeroGroup:
    """A process group as its rank 0 sees it (hashable: vLLM caches per group)."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.rank_in_group = 0
        self.rank = 0
        self.ranks = list(range(world_size))
        self.is_first_rank = True
        self.is_last_rank = world_size == 1
        self.device_group = None  # no collectives run at initialisation
        self.cpu_group = None


@contextlib.contextmanager
def cuda_streams() -> Iterator[None]:
    """``torch.cuda.Stream()`` needs a CUDA driver; a layer that is handed side streams at construction (DeepSeek
    V4.1's attention: its input GEMMs' aux streams) only keeps them, so a stand-in object is enough."""
    import torch

    class _Stream:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

    saved = torch.cuda.Stream
    torch.cuda.Stream = _Stream
    try:
        yield
    finally:
        torch.cuda.Stream = saved


@contextlib.contextmanager
def model_runner_env(runner: str) -> Iterator[None]:
    """``VLLM_USE_V2_MODEL_RUNNER`` as a deployment of ``runner`` sets it (``VllmConfig.use_v2_model_runner`` reads it
    live), restored after."""
    saved = os.environ.get("VLLM_USE_V2_MODEL_RUNNER")
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1" if runner == "mrv2" else "0"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("VLLM_USE_V2_MODEL_RUNNER", None)
        else:
            os.environ["VLLM_USE_V2_MODEL_RUNNER"] = saved


@contextlib.contextmanager
def attributes_set(target: Any, **values: Any) -> Iterator[None]:
    """``target``'s attributes set to ``values`` for the block, the originals restored after it."""
    saved = {name: getattr(target, name) for name in values}
    for name, value in values.items():
        setattr(target, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(target, name, value)


@contextlib.contextmanager
def decode_context_parallel_group(world_size: int) -> Iterator[None]:
    """The DCP process group as rank 0 of ``world_size`` (no torch.distributed here):
    attention impls and MLA layers read its size and rank at construction."""
    import vllm.distributed.parallel_state as ps

    if world_size <= 1:
        yield
        return
    group: dict[str, Any] = {"_DCP": _RankZeroGroup(world_size)}
    if hasattr(ps, "get_dcp_world_size_and_rank"):  # 0.31 on; 0.30's layers read get_dcp_group() alone
        group["get_dcp_world_size_and_rank"] = lambda *args, **kwargs: (world_size, 0)
    with attributes_set(ps, **group):
        yield


@contextlib.contextmanager
def prefill_context_parallel_group(world_size: int) -> Iterator[None]:
    """The PCP process group as rank 0 of ``world_size`` (no torch.distributed here): attention
    impls, block tables and MRv2's ``PCPManager`` read its size and rank."""
    import vllm.distributed.parallel_state as ps

    if world_size <= 1 or not hasattr(ps, "_PCP"):
        yield
        return
    with attributes_set(ps, _PCP=_RankZeroGroup(world_size)):
        yield


@contextlib.contextmanager
def single_pipeline_stage() -> Iterator[None]:
    """vLLM's pipeline-parallel process group, as one stage of one rank (no
    torch.distributed is initialised on this machine)."""
    import vllm.distributed.parallel_state as ps

    saved = ps._PP
    if saved is None:
        ps._PP = _RankZeroGroup(1)
    try:
        yield
    finally:
        ps._PP = saved


def _clear_conv_state_layout() -> None:
    try:
        from vllm.model_executor.layers.mamba import mamba_utils
    except Exception:  # noqa: BLE001 - a release without the module has no cached layout
        return
    cached = getattr(mamba_utils, "get_conv_state_layout", None)
    if hasattr(cached, "cache_clear"):
        cached.cache_clear()


@contextlib.contextmanager
def conv_state_layout(layout: str | None) -> Iterator[None]:
    """``VLLM_SSM_CONV_STATE_LAYOUT`` as ``layout`` (None: unset, vLLM's default 'SD') while inside.
    ``get_conv_state_layout`` caches its first answer for the process (``functools.lru_cache``), so the
    cache is cleared on entry and on exit: every case reads the layout it runs under, never one a
    previous case (or connector) left behind."""
    saved = os.environ.pop("VLLM_SSM_CONV_STATE_LAYOUT", None)
    if layout is not None:
        os.environ["VLLM_SSM_CONV_STATE_LAYOUT"] = layout
    _clear_conv_state_layout()
    try:
        yield
    finally:
        os.environ.pop("VLLM_SSM_CONV_STATE_LAYOUT", None)
        if saved is not None:
            os.environ["VLLM_SSM_CONV_STATE_LAYOUT"] = saved
        _clear_conv_state_layout()


@contextlib.contextmanager
def tensor_parallel_group(world_size: int) -> Iterator[None]:
    """vLLM's tensor-parallel process group as rank 0 of ``world_size`` where none is initialised
    (no torch.distributed here): MiniMax M3's indexer metadata builder divides its index heads by it. The
    Engram TP group (from 0.33, read by Qwen4-exp's PLE n-gram embedding) is that group, as
    ``initialize_model_parallel`` makes it without an engram config."""
    import vllm.distributed.parallel_state as ps

    saved = getattr(ps, "_TP", None)
    saved_etp = getattr(ps, "_ETP", None)
    if saved is None:
        ps._TP = _RankZeroGroup(max(world_size, 1))
        if hasattr(ps, "_ETP") and saved_etp is None:
            ps._ETP = ps._TP
    try:
        yield
    finally:
        ps._TP = saved
        if hasattr(ps, "_ETP"):
            ps._ETP = saved_etp


def _patch_mla_kernel_checks() -> None:
    # FlashMLA and FlashAttention-MLA impls assert at construction that their compiled
    # kernels load on this GPU (vllm._flashmla_C, FA3 MLA); the virtual target has them.
    import vllm.v1.attention.backends.fa_utils as fa_utils
    import vllm.v1.attention.ops.flashmla as flashmla_ops

    def flash_attn_supports_mla() -> bool:
        return _capability[0] == 9  # FA3's MLA kernels: Hopper only

    flashmla_ops.is_flashmla_dense_supported = lambda: (True, None)
    fa_utils.flash_attn_supports_mla = flash_attn_supports_mla
    for module_name, attr, value in (
        ("vllm.v1.attention.backends.mla.flashmla", "is_flashmla_dense_supported", flashmla_ops.is_flashmla_dense_supported),
        ("vllm.v1.attention.backends.mla.flashattn_mla", "flash_attn_supports_mla", flash_attn_supports_mla),
    ):
        module = sys.modules.get(module_name)
        if module is not None:
            setattr(module, attr, value)
    _applied.append("FlashMLA dense kernels present; FlashAttention MLA kernels on SM90 (compiled kernels cannot load on CPU)")


def _patch_flashinfer_artifactory() -> None:
    # supports_trtllm_attention() probes NVIDIA's artifactory over the network (5 s
    # timeout). The virtual SM100 target is modelled as a machine that has the
    # TRT-LLM cubins, which is what real SM100 deployments have.
    try:
        import vllm.utils.flashinfer as fi_utils
    except Exception as exc:  # pragma: no cover - depends on the install
        _applied.append(f"vllm.utils.flashinfer not importable ({type(exc).__name__}); artifactory shim skipped")
        return
    fi_utils.has_nvidia_artifactory = lambda: True
    _applied.append("vllm.utils.flashinfer.has_nvidia_artifactory -> True (no network; TRT-LLM cubins assumed present)")


def _patch_pin_memory() -> None:
    # Computed at import time; UnspecifiedPlatform reports True and pinning needs CUDA.
    patched = []
    for name in ("vllm.utils.torch_utils", "vllm.v1.utils"):
        try:
            module = __import__(name, fromlist=["PIN_MEMORY"])
        except Exception:  # pragma: no cover
            continue
        if hasattr(module, "PIN_MEMORY"):
            module.PIN_MEMORY = False
            patched.append(name)
        # Up to 0.32 async_tensor_h2d asks is_pin_memory_available() at each call.
        if hasattr(module, "is_pin_memory_available"):
            module.is_pin_memory_available = lambda: False
            patched.append(f"{name}.is_pin_memory_available")
    # Releases to 0.28: MRv2's staged writes call async_tensor_h2d(..., pin_memory=True)
    # outright; pinning needs an accelerator's allocator.
    try:
        import vllm.v1.worker.gpu.buffer_utils as buffer_utils
    except Exception:  # pragma: no cover - a vLLM without MRv2
        buffer_utils = None
    h2d = getattr(buffer_utils, "async_tensor_h2d", None)
    if h2d is not None and not getattr(h2d, "unpinned", False):
        import functools
        import inspect

        signature = inspect.signature(h2d)
        if "pin_memory" in signature.parameters:
            @functools.wraps(h2d)
            def unpinned(*args, **kwargs):
                bound = signature.bind(*args, **kwargs)
                bound.arguments["pin_memory"] = False
                return h2d(*bound.args, **bound.kwargs)

            unpinned.unpinned = True  # type: ignore[attr-defined]
            buffer_utils.async_tensor_h2d = unpinned
            patched.append("vllm.v1.worker.gpu.buffer_utils.async_tensor_h2d(pin_memory=False)")
    _applied.append(f"PIN_MEMORY=False in {', '.join(patched)}")


def apply() -> list[str]:
    """Apply the whole shim set once per process; returns ``applied_shims()``."""
    global _done
    with _lock:
        if _done:
            return applied_shims()
    prepare_env()
    with _lock:
        if _done:
            return applied_shims()
        import vllm  # noqa: F401  (after the env vars)

        _patch_platform()
        from vllm.platforms import current_platform

        _patch_attention_selection(type(current_platform))
        _patch_multi_layer_check(type(current_platform))
        _patch_uva(type(current_platform))
        _patch_mla_prefill(type(current_platform))
        _patch_device_properties()
        _patch_flash_attn_kernels()
        _patch_flashinfer_artifactory()
        _patch_pin_memory()
        _applied.append(
            "backend import shims, only while the class loads: CUTLASS_MLA (cuda workspace -> meta, "
            "num_compute_units -> 132), FLASH_ATTN_MLA (fa_utils kernel symbols -> None)"
        )
        _done = True
        return applied_shims()


# --- backend classes ------------------------------------------------------------------


class BackendUnavailable(Exception):
    """A backend class that cannot be imported on this CPU machine (with a reason)."""


_backend_cache: dict[str, object] = {}

# The reference's names for the state-space backends -> vLLM's MambaAttentionBackendEnum.
MAMBA_BACKENDS = {
    "MAMBA1_ATTN": "MAMBA1",
    "MAMBA2_ATTN": "MAMBA2",
    "GDN_ATTN": "GDN_ATTN",
    "SHORT_CONV_ATTN": "SHORT_CONV",
    "LINEAR_ATTN": "LINEAR",
}


@contextlib.contextmanager
def _cutlass_mla_import() -> Iterator[None]:
    """``cutlass_mla`` allocates a 128 MiB CUDA workspace at import time."""
    import torch
    import vllm.utils.platform_utils as pu

    real_empty = torch.empty

    def empty(*args, **kwargs):
        device = kwargs.get("device")
        if device is not None and str(device).startswith("cuda"):
            kwargs["device"] = "meta"
        return real_empty(*args, **kwargs)

    with attributes_set(torch, empty=empty), attributes_set(pu, num_compute_units=lambda *a, **k: VIRTUAL_SM_COUNT):
        yield


@contextlib.contextmanager
def _flash_attn_mla_import() -> Iterator[None]:
    """``fa_utils`` defines the kernel entry points only when ``is_cuda()``."""
    import vllm.v1.attention.backends.fa_utils as fa_utils

    for symbol in ("flash_attn_varlen_func", "get_scheduler_metadata"):
        if not hasattr(fa_utils, symbol):
            setattr(fa_utils, symbol, None)
    yield


_IMPORT_SHIMS = {"CUTLASS_MLA": _cutlass_mla_import, "FLASH_ATTN_MLA": _flash_attn_mla_import}


LAYER_OWNED_BACKENDS = {
    "DEEPSEEK_V32_INDEXER": ("vllm.v1.attention.backends.mla.indexer", "DeepseekV32IndexerBackend"),
    "MINIMAX_M3_SPARSE_INDEXER": ("vllm.models.minimax_m3.common.indexer", "MiniMaxM3IndexerBackend"),
    "KPOOL_TAIL": ("vllm.v1.attention.backends.mla.indexer", "KpoolTailBackend"),
    "QWEN4_EXP_EXP_QSA_STATE": ("vllm.models.qwen4_exp.common.qsa_cache", "QSAStateBackend"),
    "CACHE_ONLY_ATTN": ("vllm.model_executor.models.extract_hidden_states", "CacheOnlyAttentionBackend"),
    "KIMI_K3_KDA": ("vllm.models.kimi_k3.nvidia.kda_metadata", "KimiK3KDAAttentionBackend"),
    "PLE_SHORT_CONV_ATTN": ("vllm.v1.attention.backends.short_conv_attn", "PleShortConvAttentionBackend"),
    # DeepSeek V4's FlashMLA path: DeepseekV4FlashMLAAttention.swa_backend_cls (named DEEPSEEK_SPARSE_SWA,
    # like the default it subclasses), the C4 indexer's and the compressors' backends.
    "DEEPSEEK_SPARSE_SWA": ("vllm.models.deepseek_v4.nvidia.flashmla", "DeepseekSparseSWAFlashMLABackend"),
    "DEEPSEEK_V4_INDEXER": ("vllm.v1.attention.backends.mla.indexer", "DeepseekV4IndexerBackend"),
    "CompressorBackend": ("vllm.models.deepseek_v4.compressor", "CompressorBackend"),
    # DeepSeek V4.1's indexer keys (DeepseekV4IndexerCache.get_attn_backend without sparse logits).
    "DEEPSEEK_V41_INDEXER": ("vllm.v1.attention.backends.mla.indexer", "DeepseekV41IndexerBackend"),
}
"""Backends no ``AttentionBackendEnum`` member names: the layer returns its class itself
(``DeepseekV32IndexerCache.get_attn_backend``)."""


def backend_class(name: str):
    """The real vLLM backend class for a reference backend name.

    Attention backends come from ``AttentionBackendEnum[name].get_class()``, state-space
    ones from ``MambaAttentionBackendEnum``. Raises ``BackendUnavailable`` (with the
    import error) when the class cannot load on this machine.
    """
    apply()
    if name in _backend_cache:
        cached = _backend_cache[name]
        if isinstance(cached, BackendUnavailable):
            raise cached
        return cached
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, MambaAttentionBackendEnum

    try:
        if name in LAYER_OWNED_BACKENDS:
            module, attr = LAYER_OWNED_BACKENDS[name]
            cls = getattr(importlib.import_module(module), attr)
            _backend_cache[name] = cls
            return cls
        if name in MAMBA_BACKENDS:
            member = MambaAttentionBackendEnum[MAMBA_BACKENDS[name]]
        else:
            member = AttentionBackendEnum[name]
        shim = _IMPORT_SHIMS.get(name, contextlib.nullcontext)
        # flashinfer/cutlass emit dozens of DeprecationWarnings at import: not ours.
        with shim(), warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            cls = member.get_class()
        if name in ("FLASHMLA", "FLASH_ATTN_MLA"):
            _patch_mla_kernel_checks()
    except Exception as exc:  # ImportError, RuntimeError("Found no NVIDIA driver"), KeyError
        error = BackendUnavailable(f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        _backend_cache[name] = error
        raise error from None
    _backend_cache[name] = cls
    return cls


__all__ = [
    "BackendUnavailable",
    "attributes_set",
    "MAMBA_BACKENDS",
    "applied_shims",
    "apply",
    "backend_class",
    "cuda_on_meta",
    "current_capability",
    "declared_autoselection",
    "single_pipeline_stage",
    "tensor_parallel_group",
    "conv_state_layout",
    "decode_context_parallel_group",
    "prefill_context_parallel_group",
    "fake_capability",
    "prepare_env",
    "set_capability",
]
