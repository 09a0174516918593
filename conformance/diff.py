"""Field-by-field comparison of the reference's prediction with an observation of vLLM.

The observation is any object with the attributes of ``gpu_impl.vllm_cpu.Observation``
(layout, groups, num_blocks, bytes_per_block, tensors, kernel_block_sizes, registered,
error, unsupported); the reference side is a ``reference.derive.Derivation`` or the
StartupError it predicts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from reference.config import CaseConfig
from reference.derive import Derivation, derive
from reference.errors import ConfigError, NotModeledError, StartupError

KINDS = (
    "startup_error",
    "layout",
    "groups",
    "num_blocks",
    "bytes_per_block",
    "tensor_placement",
    "kernel_block_size",
    "registered_names",
    "registered_shape",
    "registered_stride",
    "registered_dtype",
    "registered_offset",
)


@dataclass(frozen=True)
class Divergence:
    """One way vLLM did something other than the reference predicts."""

    kind: str
    case: str
    runner: str
    field: str
    expected: Any
    observed: Any

    @property
    def message(self) -> str:
        return f"{self.case} [{self.runner}] {self.kind}: {self.field} is {self.observed!r}, reference expects {self.expected!r}"


@dataclass(frozen=True)
class Comparison:
    """The outcome of comparing one (case, runner)."""

    case: CaseConfig
    runner: str
    status: str
    """``pass``, ``fail``, ``unsupported`` (vLLM side cannot run it) or ``not_modeled``."""
    divergences: tuple[Divergence, ...] = ()
    detail: str = ""


def _cmp(out: list[Divergence], kind: str, case: str, runner: str, field: str, expected: Any, observed: Any) -> None:
    if expected != observed:
        out.append(Divergence(kind, case, runner, field, expected, observed))


def compare(case: CaseConfig, runner: str, observation: Any) -> Comparison:
    """Diff the reference against one observation of vLLM for the same case and runner."""
    if getattr(observation, "unsupported", None):
        return Comparison(case, runner, "unsupported", detail=observation.unsupported)
    try:
        expected: Derivation | None = derive(case, runner)
        predicted_error = None
    except StartupError as exc:
        expected, predicted_error = None, exc.vllm_message
    except NotModeledError as exc:
        return Comparison(case, runner, "not_modeled", detail=str(exc))
    except ConfigError as exc:
        return Comparison(case, runner, "not_modeled", detail=f"invalid case: {exc}")
    out: list[Divergence] = []
    name = case.name
    observed_error = getattr(observation, "error", None)
    if predicted_error is not None or observed_error is not None:
        if (predicted_error is None) != (observed_error is None):
            out.append(
                Divergence("startup_error", name, runner, "error", predicted_error or "(starts)", observed_error or "(starts)")
            )
        status = "fail" if out else "pass"
        return Comparison(case, runner, status, tuple(out), detail=observed_error or "")
    assert expected is not None
    _cmp(out, "layout", name, runner, "layout", expected.layout.name, observation.layout)
    exp_groups = [(tuple(g.layer_names), g.spec.block_size) for g in expected.groups]
    obs_groups = [(tuple(g.layer_names), g.block_size) for g in observation.groups]
    _cmp(out, "groups", name, runner, "groups", exp_groups, obs_groups)
    _cmp(out, "num_blocks", name, runner, "num_blocks", expected.num_blocks, observation.num_blocks)
    _cmp(out, "bytes_per_block", name, runner, "bytes_per_block", expected.plan.bytes_per_block, observation.bytes_per_block)
    exp_tensors = [(tuple(t.layers), t.size, t.layer_stride, t.block_stride, t.offset) for t in expected.plan.tensors]
    obs_tensors = [(tuple(t.layers), t.size, t.layer_stride, t.block_stride, t.offset) for t in observation.tensors]
    _cmp(out, "tensor_placement", name, runner, "kv_cache_tensors", exp_tensors, obs_tensors)
    _cmp(out, "kernel_block_size", name, runner, "kernel_block_sizes", list(expected.kernel_block_sizes), list(observation.kernel_block_sizes))
    _cmp(out, "registered_names", name, runner, "registered layers", sorted(expected.registered), sorted(observation.registered))
    for layer, view in expected.registered.items():
        obs = observation.registered.get(layer)
        if obs is None:
            continue
        _cmp(out, "registered_shape", name, runner, f"{layer}.shape", view.shape, tuple(obs.shape))
        _cmp(out, "registered_stride", name, runner, f"{layer}.stride", view.stride, tuple(obs.stride))
        _cmp(out, "registered_dtype", name, runner, f"{layer}.dtype", view.dtype, obs.dtype)
        _cmp(out, "registered_offset", name, runner, f"{layer}.storage_offset", view.storage_offset, obs.storage_offset)
    return Comparison(case, runner, "fail" if out else "pass", tuple(out))
