"""docs/connector-authors.md's worked example, run as the doc says: the host-offload adapter
passes descriptors and the round trip on the tensors vLLM registers, and the same connector
with the kernel split ignored fails with the cause named."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.kvconform_vllm,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch (the check builds CPU tensors)"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm 0.33.0 importable (pip install 'kvconform[vllm]')"),
]

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"


def test_worked_example_passes_and_its_kernel_split_bug_is_named(monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))
    sys.modules.pop("host_offload", None)
    import host_offload

    from conformance.connectors import validate_registration

    cases = ["flashinfer-b128-k64", "dense-fa-b128-bhlnc", "rocm-attn-b16"]
    report = validate_registration("host_offload:HostOffloadAdapter", cases=cases, runners=("mrv1",))
    assert report.passed_cases == cases, report.format()
    assert all(r.round_trip == "pass" and r.tensors == "vllm" for r in report.results)

    class IgnoresKernelSplit(host_offload.HostOffloadWorker):
        def register_kv_caches(self, kv_caches):
            super().register_kv_caches(kv_caches)
            self.layers = {n: (base, stride, 1, runs) for n, (base, stride, _, runs) in self.layers.items()}

    monkeypatch.setattr(host_offload, "HostOffloadWorker", IgnoresKernelSplit)
    bad = validate_registration(host_offload.HostOffloadAdapter, cases=["flashinfer-b128-k64"], runners=("mrv1",))
    assert bad.failed_cases == ["flashinfer-b128-k64"], bad.format()
    fields = {d.field for d in bad.divergences}
    assert {"descriptors", "round_trip:not_loaded", "round_trip:overwritten_neighbour"} <= fields, fields
    (first,) = [d for d in bad.divergences if d.field == "descriptors"][:1]
    assert "logical block b is kernel blocks [b*2, b*2+1]" in first.message, first.message
