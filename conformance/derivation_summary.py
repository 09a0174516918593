"""Plain-data summaries of reference derivations: the ``kvconform run --reference-only`` report.

Each runner's outcome as JSON-ready data, and the MRv1/MRv2 differences the reference predicts
(through the one runner comparator, ``conformance.checks.runners``).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from conformance.checks.runners import compare_runners
from reference.config import CaseConfig
from reference.derive import Derivation, derive
from reference.errors import ConfigError, NotModeledError, StartupError
from reference.specs import vllm_spec_class


def observed_groups(groups: Any) -> tuple[SimpleNamespace, ...]:
    """The reference's KV cache groups as a driver reports them (``GroupObs``: layer names,
    block size, vLLM spec class)."""
    return tuple(SimpleNamespace(layer_names=tuple(g.layer_names), block_size=g.spec.block_size,
                                 spec_type=vllm_spec_class(g.spec)) for g in groups)


def derivation_summary(d: Derivation) -> dict[str, Any]:
    """The connector-visible facts of one derivation, JSON-ready."""
    return {
        "layout": d.layout.name,
        "num_blocks": d.num_blocks,
        "bytes_per_block": d.plan.bytes_per_block,
        "groups": [
            {"layers": list(g.layer_names), "block_size": g.spec.block_size, "spec": g.spec.describe()}
            for g in d.groups
        ],
        "kernel_block_sizes": list(d.kernel_block_sizes),
        "connector_kernel_block_size": d.connector_kernel_block_size,
        "tensors": [
            {
                "layers": list(t.layers),
                "size": t.size,
                "layer_stride": t.layer_stride,
                "block_stride": t.block_stride,
                "offset": t.offset,
            }
            for t in d.plan.tensors
        ],
        "registered": {
            name: {
                "shape": list(v.shape),
                "stride": list(v.stride),
                "dtype": v.dtype,
                "storage_offset": v.storage_offset,
                "backend": d.layer_backends[name],
            }
            for name, v in d.registered.items()
        },
    }


def gen1_summary(d: Any) -> dict[str, Any]:
    """A generation-1 derivation (``reference.gen1``), JSON-ready."""
    return {
        "generation": 1,
        "layout": d.layout,
        "num_blocks": d.num_blocks,
        "groups": [{"layers": list(g.layer_names), "block_size": g.spec.block_size} for g in d.groups],
        "kernel_block_sizes": list(d.kernel_block_sizes),
        "tensors": [{"shared_by": list(t.shared_by), "size": t.size} for t in d.kv_cache_tensors],
        "registered": {
            name: {"shape": list(v.shape), "stride": list(v.stride), "dtype": v.dtype, "backend": d.layer_backends[d.layer_of(name)]}
            for name, v in d.registered.items()
        },
    }


def _derive_any(case: CaseConfig, runner: str) -> Any:
    if case.generation == 1:
        from reference.gen1 import derive_gen1

        return derive_gen1(case, runner)
    return derive(case, runner)


def reference_outcome(case: CaseConfig, runner: str) -> dict[str, Any]:
    """Derive one runner, turning predicted vLLM refusals into data instead of exceptions."""
    try:
        d = _derive_any(case, runner)
        return {"status": "ok", **(gen1_summary(d) if case.generation == 1 else derivation_summary(d))}
    except StartupError as exc:
        return {"status": "vllm_refuses", "error": exc.vllm_message, "where": exc.where}
    except NotModeledError as exc:
        return {"status": "not_modeled", "error": str(exc)}
    except ConfigError as exc:
        return {"status": "invalid", "error": str(exc)}


def _facts(case: CaseConfig, runner: str) -> Any:
    """The reference's outcome for one runner in the attribute names ``conformance.diff``
    compares observations by (a refusal is ``error``; not modeled is ``unsupported``)."""

    empty = dict(layout=None, groups=(), num_blocks=None, bytes_per_block=None, tensors=(), kernel_block_sizes=(),
                 registered={}, layer_backends={}, fidelity="reference")
    try:
        d = _derive_any(case, runner)
    except StartupError as exc:
        return SimpleNamespace(**empty, error=exc.vllm_message, unsupported=None)
    except (NotModeledError, ConfigError) as exc:
        return SimpleNamespace(**empty, error=None, unsupported=str(exc))
    if case.generation == 1:
        return SimpleNamespace(
            error=None, unsupported=None, fidelity="reference", layout=d.layout, num_blocks=d.num_blocks, bytes_per_block=None,
            groups=observed_groups(d.groups),
            tensors=(), kernel_block_sizes=tuple(d.kernel_block_sizes), registered=d.registered,
            layer_backends=dict(d.layer_backends),
        )
    return SimpleNamespace(
        error=None,
        unsupported=None,
        fidelity="reference",
        layout=d.layout.name,
        groups=observed_groups(d.groups),
        num_blocks=d.num_blocks,
        bytes_per_block=d.plan.bytes_per_block,
        tensors=d.plan.tensors,
        kernel_block_sizes=tuple(d.kernel_block_sizes),
        builder_kernel_block_sizes=dict(d.builder_kernel_block_sizes),
        connector_kernel_block_size=d.connector_kernel_block_size,
        cache_block_size=d.cache_block_size,
        scheduler_block_size=d.scheduler_block_size,
        hash_block_size=d.hash_block_size,
        registered=d.registered,
        layer_backends=dict(d.layer_backends),
    )


def runner_differences(case: CaseConfig) -> list[str]:
    """What a connector or kernel would see differently between the two runners, as the
    reference predicts them (``conformance.diff.compare_runners``, the one comparator)."""
    return [
        " ".join(f"{d.field}: MRv1 {d.expected!r} vs MRv2 {d.observed!r}".split())
        for d in compare_runners(case, _facts(case, "mrv1"), _facts(case, "mrv2"))
    ]
