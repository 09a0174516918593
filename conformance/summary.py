"""Plain-data summaries of reference derivations, for reports and diffs."""

from __future__ import annotations

from typing import Any

from reference.config import CaseConfig
from reference.derive import Derivation, derive
from reference.errors import ConfigError, NotModeledError, StartupError


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


def reference_outcome(case: CaseConfig, runner: str) -> dict[str, Any]:
    """Derive one runner, turning predicted vLLM refusals into data instead of exceptions."""
    try:
        return {"status": "ok", **derivation_summary(derive(case, runner))}
    except StartupError as exc:
        return {"status": "vllm_refuses", "error": exc.vllm_message, "where": exc.where}
    except NotModeledError as exc:
        return {"status": "not_modeled", "error": str(exc)}
    except ConfigError as exc:
        return {"status": "invalid", "error": str(exc)}


def runner_differences(mrv1: dict[str, Any], mrv2: dict[str, Any]) -> list[str]:
    """What a connector or kernel would see differently between the two runners."""
    if mrv1.get("status") != mrv2.get("status"):
        return [f"status: MRv1 {mrv1.get('status')} vs MRv2 {mrv2.get('status')}"]
    if mrv1.get("status") != "ok":
        return []
    out = []
    for key in ("layout", "kernel_block_sizes", "num_blocks", "bytes_per_block", "connector_kernel_block_size"):
        if mrv1[key] != mrv2[key]:
            out.append(f"{key}: MRv1 {mrv1[key]} vs MRv2 {mrv2[key]}")
    for name, view in mrv1["registered"].items():
        other = mrv2["registered"].get(name)
        if other is None:
            out.append(f"{name}: registered by MRv1 only")
            continue
        for key in ("shape", "stride", "dtype", "storage_offset", "backend"):
            if view[key] != other[key]:
                out.append(f"{name}.{key}: MRv1 {view[key]} vs MRv2 {other[key]}")
    return out
