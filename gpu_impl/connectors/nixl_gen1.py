"""vLLM 0.20 to 0.28's ``NixlConnectorWorker`` registering what a generation-1 runner registered,
on CPU.

The tensors are the runner's own: ``gpu_impl.vllm_cpu.gen1`` runs the installed release's
planning and each runner's allocate/reshape code on real CPU tensors, then hands the
``kv_caches`` to the installed release's own ``NixlConnectorWorker.__init__`` and
``register_kv_caches``. Faked: what hardware and external services provide (the NIXL agent,
recording what is registered; the platform's device type and NIXL memory type; the TP rank of
one process; the ZMQ handshake is never started) and the model the worker asks for its
layers' backends, ``use_mla`` and heads (``get_current_attn_backend(s)`` answer with the
case's backends; a ``model_config`` stand-in carries the case's MLA flag and heads).

What the worker did is read off it: its block size after ``__init__`` (the kernel block size
it derived), ``num_blocks``, ``block_len_per_layer``, the base addresses it registered, and
for every logical block ``b`` the transfer descriptors the worker itself would read:
``_logical_to_kernel_block_ids([[b]])``, then its descriptor ids
(``_get_block_descs_ids`` up to 0.20, ``_compute_desc_ids`` from 0.21) into its own
``src_blocks_data``. Or the exception ``register_kv_caches`` raised and the line that raised
it. Nothing here predicts; ``conformance.connectors.mooncake_gen1.judge`` compares the
descriptors with ``reference.gen1``'s bytes of each block.
"""

from __future__ import annotations

import importlib
from types import SimpleNamespace
from typing import Any
from unittest import mock

from gpu_impl.connectors.mooncake_gen1 import LayerTensor, MooncakeRegistration, _raising_line, registration_through
from gpu_impl.connectors.nixl import RecordingNixl

WORKER_MODULES = ("vllm.distributed.kv_transfer.kv_connector.v1.nixl.worker",
                  "vllm.distributed.kv_transfer.kv_connector.v1.nixl_connector")
"""Where a release keeps ``NixlConnectorWorker`` (the package from 0.20, one module before)."""

NixlRegistration = MooncakeRegistration
"""The same record: tensors, block size, blocks, lengths, bases, per-block transfers, or why not."""


def _worker_module() -> tuple[Any, str | None]:
    problems = []
    for name in WORKER_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            problems.append(f"{name}: {exc}")
            continue
        if hasattr(module, "NixlConnectorWorker"):
            return module, None
    return None, "this vLLM has no NixlConnectorWorker here (" + "; ".join(problems) + ")"


def observe_registration(case: Any, runner: str) -> NixlRegistration:
    """Run ``runner``'s registration for ``case`` and the installed NIXL worker on it."""
    from gpu_impl.vllm_cpu import shims

    applied = tuple(shims.apply())
    module, why = _worker_module()
    if module is None:
        return NixlRegistration(case.name, runner, unsupported=why)
    return registration_through(case, runner, applied, lambda kv: _register(module, case, kv))


def _kernel_ids(worker: Any, block_ids: Any) -> Any:
    """The worker's own expansion of logical ids into kernel blocks (from 0.27 or so it takes the
    ratio, its ``_physical_blocks_per_logical_kv_block``)."""
    import inspect

    expand = worker._logical_to_kernel_block_ids
    if "ratio" in inspect.signature(expand).parameters:
        return expand(block_ids, worker._physical_blocks_per_logical_kv_block)
    return expand(block_ids)


def _descriptor_ids(worker: Any, kernel_ids: Any) -> list[int]:
    """The worker's own descriptor ids of ``kernel_ids`` (its own engine as the peer)."""
    if hasattr(worker, "_get_block_descs_ids"):  # 0.20
        return [int(i) for i in worker._get_block_descs_ids(worker.engine_id, kernel_ids)]
    return [int(i) for i in worker._compute_desc_ids(kernel_ids, worker.dst_num_blocks[worker.engine_id], None,
                                                     worker._physical_blocks_per_logical_kv_block)]


def _register(module: Any, case: Any, kv: Any) -> dict[str, Any]:
    from vllm.config import KVTransferConfig

    vc = kv.vllm_config
    backends = list(dict.fromkeys(kv.backends[layer.name] for layer in case.layers))
    use_mla = any(layer.kind == "mla" for layer in case.layers if not layer.is_draft)
    heads = max(layer.num_kv_heads for layer in case.layers if not layer.is_draft)
    vc.kv_transfer_config = KVTransferConfig(kv_connector="NixlConnector", kv_role="kv_both", kv_buffer_device="cuda")
    # The model's part (a HF config it has not got): MLA or not, and its heads.
    model = SimpleNamespace(use_mla=use_mla, get_total_num_kv_heads=lambda: heads, get_num_kv_heads=lambda *a: heads,
                            get_num_attention_heads=lambda *a: heads, is_hybrid=False, enable_sleep_mode=False,
                            hf_text_config=SimpleNamespace(), hf_config=SimpleNamespace(model_type="kvconform"),
                            dtype=None, get_head_size=lambda: case.layers[0].head_size,
                            get_num_layers=lambda *a: len(case.layers))
    platform = SimpleNamespace(device_type="cuda", get_nixl_memory_type=lambda: "VRAM", discover_numa_topology=lambda: [])
    fakes = {"NixlWrapper": RecordingNixl, "nixl_agent_config": None, "current_platform": platform,
             "get_tensor_model_parallel_rank": lambda: 0, "get_tensor_model_parallel_world_size": lambda: 1,
             "get_current_attn_backends": lambda *a, **k: backends, "get_current_attn_backend": lambda *a, **k: backends[0],
             "compute_nixl_compatibility_hash": lambda *a, **k: "kvconform"}
    # The names are looked up where the worker's code lives: worker.py, and from 0.27 or so
    # base_worker.py (the pull/push workers' shared base), as on the target release.
    homes = [module]
    try:
        homes.append(importlib.import_module(module.__name__.rsplit(".", 1)[0] + ".base_worker"))
    except ImportError:
        pass
    patches = [mock.patch.object(home, name, value) for home in homes for name, value in fakes.items() if hasattr(home, name)]
    caches = kv.kv_caches
    layers = tuple(LayerTensor(n, t.data_ptr(), t.nbytes, tuple(t.shape), tuple(t.stride()), t.element_size())
                   for n, t in caches.items())
    out: dict[str, Any] = {"layers": layers}
    saved_model = vc.__dict__.get("model_config")
    worker = None
    try:
        for p in patches:
            p.start()
        object.__setattr__(vc, "model_config", model)
        try:
            worker = module.NixlConnectorWorker(vc, "kvconform-engine", kv.kv_cache_config)
        except (AssertionError, ValueError) as exc:  # vLLM's own checks refusing the configuration
            return out | {"error": f"{type(exc).__name__}: {exc}".rstrip(": "), "error_line": _raising_line(exc, "nixl")}
        except (RuntimeError, AttributeError, TypeError, KeyError) as exc:  # a stand-in this release needs more of
            return out | {"unsupported": f"NixlConnectorWorker.__init__ did not run here: {type(exc).__name__}: {exc}"[:300]}
        out["block_size"] = int(worker.block_size)
        try:
            worker.register_kv_caches(dict(caches))
        except (AssertionError, ValueError, RuntimeError, IndexError) as exc:
            return out | {"error": f"{type(exc).__name__}: {exc}".rstrip(": ")[:400], "error_line": _raising_line(exc, "nixl"),
                          "block_len_per_layer": tuple(getattr(worker, "block_len_per_layer", ()))}
        descriptors = [tuple(d) for d in list(worker.src_blocks_data)]  # a list, or an array (0.27 on)
        logical = int(kv.kv_cache_config.num_blocks)
        transfers: dict[int, tuple[tuple[int, int], ...]] = {}
        notes: tuple[str, ...] = ()
        try:
            groups = len(kv.kv_cache_config.kv_cache_groups)
            for b in range(logical):
                kernel_ids = _kernel_ids(worker, [[b] for _ in range(groups)])
                transfers[b] = tuple((int(descriptors[i][0]), int(descriptors[i][1]))
                                     for i in _descriptor_ids(worker, kernel_ids))
        except (AttributeError, TypeError, IndexError, KeyError) as exc:
            transfers, notes = None, (f"transfer descriptors not read: {type(exc).__name__}: {exc}"[:300],)
        return out | {"num_blocks": int(worker.num_blocks), "block_len_per_layer": tuple(int(b) for b in worker.block_len_per_layer),
                      "base_addrs": tuple(int(a) for a in worker.kv_caches_base_addr[worker.engine_id][worker.tp_rank]),
                      "transfers": transfers, "notes": notes}
    finally:
        for p in reversed(patches):
            p.stop()
        object.__setattr__(vc, "model_config", saved_model)
        if worker is not None:
            for shut in ("shutdown",):
                try:
                    getattr(worker, shut)()
                except Exception:  # noqa: BLE001 - a half-built worker's cleanup is not an observation
                    pass


__all__ = ["NixlRegistration", "WORKER_MODULES", "observe_registration"]
