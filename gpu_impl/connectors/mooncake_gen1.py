"""vLLM 0.19 to 0.28's ``MooncakeConnectorWorker`` registering what a generation-1 runner
registered, on CPU.

The tensors are the runner's own: ``gpu_impl.vllm_cpu.gen1`` runs the installed release's
planning and each runner's allocate/reshape code on real CPU tensors, then hands the
``kv_caches`` to the installed release's own ``MooncakeConnectorWorker.__init__`` (consumer
role: no sender threads or bootstrap server) and ``register_kv_caches``. Faked: what
hardware and external services provide (Mooncake's ``TransferEngine``, recording what is
registered; the host IP; the TP/PP ranks of one process; the device index the worker
binds) and the model the worker would
ask for its layers' backends and ``use_mla`` (``get_current_attn_backend(s)`` answer with
the case's backends; a ``model_config`` stand-in carries the case's MLA flag and heads).

What the worker did is read off it: its block size after ``__init__`` (0.20 on:
``_sync_block_size_with_kernel``), ``num_blocks``, ``block_len_per_layer``, the base
addresses and lengths it registered, or the exception ``register_kv_caches`` raised and the
line that raised it (0.19.1: ``assert self.block_size == kernel_block_size``, #39596).
Nothing here predicts; ``reference.gen1.mooncake_registration`` does.
"""

from __future__ import annotations

import inspect
import traceback
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any
from unittest import mock

WORKER_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.mooncake.mooncake_connector"


@dataclass(frozen=True)
class LayerTensor:
    """One registered tensor as the connector was given it."""

    name: str
    data_ptr: int
    nbytes: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    element_size: int


@dataclass(frozen=True)
class MooncakeRegistration:
    """What the installed Mooncake worker made of one runner's ``kv_caches``."""

    case: str
    runner: str
    layers: tuple[LayerTensor, ...] = ()
    """The tensors handed to ``register_kv_caches``, in order."""
    block_size: int | None = None
    """``worker.block_size`` when ``register_kv_caches`` ran (tokens per registered block)."""
    num_blocks: int | None = None
    block_len_per_layer: tuple[int, ...] = ()
    base_addrs: tuple[int, ...] = ()
    registered_lens: tuple[int, ...] = ()
    """What ``TransferEngine.batch_register_memory`` got, per region."""
    error: str | None = None
    """``register_kv_caches`` (or ``__init__``) raised: ``Type: message``."""
    error_line: str | None = None
    """The source line of the connector that raised, ``file:line: code``."""
    transfers: dict[int, tuple[tuple[int, int], ...]] | None = None
    """The worker's planned source ranges ``(address, length)`` per logical block (None:
    not driven, see ``notes``)."""
    runner_error: str | None = None
    """The runner itself refused the case (nothing reached the connector)."""
    unsupported: str | None = None
    """This driver cannot drive the installed release or the case (why)."""
    notes: tuple[str, ...] = field(default_factory=tuple)


def _raising_line(exc: BaseException, connector: str = "mooncake") -> str | None:
    """``file:line: code`` of the connector's own frame that raised (None: none of its frames)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if connector in f.filename]
    if not frames:
        return None
    f = frames[-1]
    return f"{f.filename.split('site-packages/')[-1]}:{f.lineno}: {f.line}"


def _plan_transfers(mc: Any, worker: Any, num_blocks: int) -> tuple[dict[int, tuple[tuple[int, int], ...]] | None, str | None]:
    """The worker's own transfer planning (``_build_transfer_params`` over
    ``_get_transfer_regions``) for sending each logical block ``b`` to block ``b`` of a peer
    with the same registration: ``{b: ((source address, length), ...)}``."""
    import asyncio

    build, regions_of = getattr(worker, "_build_transfer_params", None), getattr(worker, "_get_transfer_regions", None)
    if build is None or regions_of is None:
        return None, "transfer planning not driven: this release's worker has no _build_transfer_params/_get_transfer_regions"
    # What the worker registered, under the names its release's planning takes: its
    # _get_transfer_regions parameters and the peer's MooncakeXferMetadata fields (0.24
    # adds the registered layer names and indices, 0.25 K/V block lengths and groups).
    worker_attr = {"base_addrs": "kv_caches_base_addr", "block_lens": "block_len_per_layer",
                   "kv_block_lens": "kv_block_len_per_layer", "layer_names": "registered_layer_names",
                   "layer_indices": "registered_layer_indices", "group_indices": "registered_group_indices"}
    meta_field = {"kv_caches_base_addr": "kv_caches_base_addr", "block_lens": "block_len_per_layer",
                  "kv_block_lens": "kv_block_len_per_layer", "registered_layer_names": "registered_layer_names",
                  "registered_layer_indices": "registered_layer_indices",
                  "registered_group_indices": "registered_group_indices"}
    fields = set(getattr(mc.MooncakeXferMetadata, "__struct_fields__", ()))
    registered = {name: list(getattr(worker, attr)) for name, attr in worker_attr.items() if hasattr(worker, attr)}
    peer_fields = {f: list(getattr(worker, attr)) for f, attr in meta_field.items() if f in fields and hasattr(worker, attr)}

    def plan(b: int, ids: Any) -> tuple[tuple[int, int], ...]:
        req = f"kvconform-{b}"
        send = mc.SendBlockMeta(p_req_id=req, transfer_id=req, local_block_ids=ids, ready=asyncio.Event())
        peer = mc.MooncakeXferMetadata(remote_hostname="kvconform", remote_port=0, remote_tp_size=1, remote_tp_rank=0,
                                       req_blocks={req: (req, ids)}, **peer_fields)
        src, _dst, lengths, *_ = asyncio.run(build([(req, send)], peer, local, remote))
        return tuple((int(a), int(n)) for a, n in zip(src, lengths))

    try:
        takes = inspect.signature(regions_of).parameters
        local = remote = regions_of(**{k: registered[k] for k, param in takes.items()
                                       if k in registered or param.default is inspect.Parameter.empty})
        align = getattr(mc, "_align_transfer_regions", None)
        if align is not None:  # the sender pairs its regions with the peer's first (0.24 on)
            local, remote, problem = align(local, remote)
            if problem:
                return None, f"transfer planning not driven: _align_transfer_regions: {problem}"
    except (TypeError, AttributeError, AssertionError, ValueError, KeyError) as exc:
        return None, f"transfer planning not driven: _get_transfer_regions: {type(exc).__name__}: {exc}"
    # Block ids per KV cache group (0.20 on) or one flat list (0.19): the form the
    # release's MooncakeXferMetadata.req_blocks takes.
    # A hybrid model's groups each send block b (0.25 on: a region per group, by its index).
    groups = len(set(registered.get("group_indices") or ())) or 1
    problems = []
    for form in (lambda b: [[b]] * groups, lambda b: [b]):
        try:
            return {b: plan(b, form(b)) for b in range(num_blocks)}, None
        except (TypeError, AttributeError, AssertionError, ValueError) as exc:
            problems.append(f"{type(exc).__name__}: {exc}")
    return None, f"transfer planning not driven: {'; '.join(problems)}"


def observe_registration(case: Any, runner: str) -> MooncakeRegistration:
    """Run ``runner``'s registration for ``case`` and the installed Mooncake worker on it."""
    from gpu_impl.vllm_cpu import shims

    applied = tuple(shims.apply())
    try:
        import importlib

        mc = importlib.import_module(WORKER_MODULE)
    except ImportError as exc:
        missing = getattr(exc, "name", None) or ""
        why = (f"this vLLM has no {WORKER_MODULE}" if missing.startswith("vllm") or not missing
               else f"{WORKER_MODULE} needs the package {missing!r}, which is not installed")
        return MooncakeRegistration(case.name, runner, unsupported=f"{why} ({exc})")
    return registration_through(case, runner, applied, lambda kv: _register(mc, case, kv))


def registration_through(case: Any, runner: str, applied: tuple[str, ...], register: Any) -> MooncakeRegistration:
    """``runner``'s generation-1 registration of ``case`` on real CPU tensors, handed to
    ``register(kv)`` (a connector worker's, returning the record's fields) while the case's
    config is in force; the runner's own refusal or unsupported case is said instead."""
    from gpu_impl.vllm_cpu import gen1

    result: dict[str, Any] = {}
    obs = gen1.observe(case, runner, applied, device="cpu", on_registered=lambda kv: result.update(register(kv)))
    if obs.unsupported:
        return MooncakeRegistration(case.name, runner, unsupported=obs.unsupported)
    if obs.error and not result:
        return MooncakeRegistration(case.name, runner, runner_error=obs.error)
    return MooncakeRegistration(case.name, runner, **result)


def _register(mc: Any, case: Any, kv: Any) -> dict[str, Any]:
    from vllm.config import KVTransferConfig

    vc = kv.vllm_config
    backends = list(dict.fromkeys(kv.backends[layer.name] for layer in case.layers))
    use_mla = any(layer.kind == "mla" for layer in case.layers if not layer.is_draft)
    heads = max(layer.num_kv_heads for layer in case.layers if not layer.is_draft)
    vc.kv_transfer_config = KVTransferConfig(kv_connector="MooncakeConnector", kv_role="kv_consumer")
    # The model's part (a HF config it has not got): MLA or not, and its heads. The case has
    # no query heads; with one TP rank the worker only sizes per-rank head slices with them.
    model = SimpleNamespace(use_mla=use_mla, get_total_num_kv_heads=lambda: heads, get_num_kv_heads=lambda *a: heads,
                            get_num_attention_heads=lambda *a: heads, is_hybrid=False,
                            hf_text_config=SimpleNamespace(), dtype=None)
    from gpu_impl.connectors.mooncake import RecordingTransferEngine

    engine = RecordingTransferEngine()
    patches = [mock.patch.object(mc, "TransferEngine", lambda: engine), mock.patch.object(mc, "get_ip", lambda: "127.0.0.1"),
               mock.patch.object(mc, "get_tensor_model_parallel_rank", lambda: 0),
               mock.patch.object(mc, "get_tensor_model_parallel_world_size", lambda: 1),
               mock.patch.object(mc, "get_pp_group", lambda: SimpleNamespace(rank_in_group=0))]
    import torch

    if hasattr(torch, "accelerator"):  # 0.20 on: the worker binds its device (hardware)
        patches.append(mock.patch.object(torch.accelerator, "current_device_index", lambda *a: 0))
    if hasattr(mc, "current_platform"):
        patches.append(mock.patch.object(mc.current_platform, "set_device", lambda *a, **k: None, create=True))
    for name, value in (("get_current_attn_backend", lambda *a, **k: backends[0]),
                        ("get_current_attn_backends", lambda *a, **k: backends)):
        if hasattr(mc, name):
            patches.append(mock.patch.object(mc, name, value))
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
        class _Worker(mc.MooncakeConnectorWorker):
            def __del__(self) -> None:  # shut down below; a half-built worker has nothing to stop
                pass

        init_takes = mc.MooncakeConnectorWorker.__init__.__code__.co_varnames
        try:
            worker = _Worker(vc, "kvconform-engine", **({"kv_cache_config": kv.kv_cache_config} if "kv_cache_config" in init_takes else {}))
        except (AssertionError, ValueError) as exc:  # vLLM's own checks refusing the layout
            return out | {"error": f"{type(exc).__name__}: {exc}".rstrip(": "), "error_line": _raising_line(exc)}
        except (RuntimeError, AttributeError, TypeError) as exc:  # a stand-in this release needs more of
            return out | {"unsupported": f"MooncakeConnectorWorker.__init__ did not run here: {type(exc).__name__}: {exc}"}
        out["block_size"] = int(worker.block_size)
        try:
            worker.register_kv_caches(dict(caches))
        except (AssertionError, ValueError, RuntimeError, IndexError) as exc:
            return out | {"error": f"{type(exc).__name__}: {exc}".rstrip(": "), "error_line": _raising_line(exc),
                          "num_blocks": getattr(worker, "num_blocks", None) or None,
                          "block_len_per_layer": tuple(getattr(worker, "block_len_per_layer", ()))}
        ptrs, lens = engine.registered[-1] if engine.registered else ((), ())
        transfers, note = _plan_transfers(mc, worker, int(kv.kv_cache_config.num_blocks))
        num_blocks = getattr(worker, "num_blocks", None)  # 0.25 on: not kept on the worker
        return out | {"num_blocks": None if num_blocks is None else int(num_blocks), "block_len_per_layer": tuple(int(b) for b in worker.block_len_per_layer),
                      "base_addrs": tuple(int(a) for a in worker.kv_caches_base_addr), "registered_lens": tuple(int(n) for n in lens),
                      "block_size": int(worker.block_size), "transfers": transfers, "notes": (note,) if note else ()}
    finally:
        for p in reversed(patches):
            p.stop()
        object.__setattr__(vc, "model_config", saved_model)
        if worker is not None:
            try:
                worker.shutdown()
            except Exception:  # noqa: BLE001 - a half-built worker's cleanup is not an observation
                pass


__all__ = ["MooncakeRegistration", "observe_registration", "registration_through"]
