"""vLLM 0.33.0's HF3FSKVConnector driven on CPU (gpu_impl.connectors.hf3fs): its real
registration, save and load paths, with its gather/scatter Triton kernels in the Triton
interpreter and the 3FS file and metadata server faked.

The named cases with 8 heads x 256 take minutes each in the interpreter; the kernel-split
hazard is shown on a small FlashInfer case with the same 128 -> 64 split as
flashinfer-b128-k64."""

from __future__ import annotations

import importlib.util
import os

import pytest

pytestmark = [
    pytest.mark.kvconform_vllm,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch (validate_registration builds CPU tensors)"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm 0.33.0 importable (pip install 'kvconform[vllm]')"),
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                       reason="HF3FS's kernels run in the Triton interpreter: TRITON_INTERPRET=1 before vLLM is imported "
                              "(tests/conftest.py sets it on a machine without a GPU)"),
]

HF3FS = "gpu_impl.connectors.hf3fs:HF3FSAdapter"
UNIFORM = "HF3FS requires uniform KV cache shapes and strides."
RAISED_AT = "hf3fs/hf3fs_connector.py:548"


def _split_case():
    """flashinfer-b128-k64 in small: FlashInfer offers 16/32/64-token kernels, so 128-token
    blocks are registered as pairs of 64-token kernel blocks."""
    from reference.config import CaseConfig, uniform_layers

    layers = uniform_layers(2, num_kv_heads=1, head_size=64, backend="FLASHINFER")  # one 128-element row per token
    return CaseConfig("tiny-flashinfer-b128-k64", layers, block_size=128, num_blocks=4, layout="LBNHC")


def test_logical_block_ids_address_kernel_blocks():
    """Hazard H2: ``_gather_or_scatter_kv_caches`` takes tokens ``[b * shape[2], (b + 1) *
    shape[2])`` of the kernel-granular view for logical block b, so it moves kernel block b
    (half of logical block b // 2) instead of logical block b's two kernel blocks."""
    from conformance.connectors.roundtrip import check_round_trip
    from conformance.connectors.validate import build_kv_caches, make_context
    from gpu_impl.connectors.hf3fs import HF3FSAdapter
    from reference.derive import derive

    d = derive(_split_case(), "mrv1")
    assert d.kernel_block_sizes == (64,)
    pool, caches = build_kv_caches(d)
    adapter = HF3FSAdapter(make_context(d))
    adapter.register(caches)
    conn = adapter.conn
    # It reads the kernel size off the view, and hashes logical blocks of 128 tokens.
    assert (adapter.kernel_block_size, conn._block_size) == (64, 128)
    layer = "model.layers.0.self_attn.attn"
    base = pool.data_ptr()
    (lo, hi), = d.block_bytes(layer, 0).page.runs()
    half = (hi - lo) // 2
    # A load of logical block 1 writes the upper half of logical block 0 (kernel block 1).
    assert adapter.descriptors(layer, 1) == [(base + lo + half, half)]
    (lo3, _), = d.block_bytes(layer, 1).page.runs()
    # ... and of block 3 the upper half of logical block 1; nothing of block 3 itself.
    assert adapter.descriptors(layer, 3) == [(base + lo3 + half, half)]

    trip = check_round_trip(adapter, d, caches, 1, 2)
    kinds = {(f.kind, f.layer) for f in trip.findings}
    assert trip.status == "fail"
    assert kinds == {(k, f"model.layers.{i}.self_attn.attn") for k in ("not_loaded", "overwritten_neighbour") for i in (0, 1)}, trip.findings
    # Loading into logical block 2 wrote kernel block 2: the first half of logical block 1.
    over = [f for f in trip.findings if f.kind == "overwritten_neighbour"]
    assert all(f.nbytes == half and "of block 1" in f.message for f in over), over


def test_hf3fs_across_runners():
    """vLLM's own tensors, both runners: a layout it handles round-trips exactly, the kernel
    split fails on every block, non-uniform layers are refused at registration."""
    from conformance.connectors import validate_registration

    cases = ["tiny-uniform-lbnhc", _split_case(), "mamba-hybrid", "swa-hybrid-padded", "mla-gqa-draft-b64"]
    report = validate_registration(HF3FS, cases=cases, runners=("mrv1", "mrv2"))
    status = {(r.case, r.runner): r.status for r in report.results}
    for runner in ("mrv1", "mrv2"):
        assert status["tiny-uniform-lbnhc", runner] == "pass", report.format()
        assert status["tiny-flashinfer-b128-k64", runner] == "failure", report.format()
    divs = report.for_case("tiny-flashinfer-b128-k64")
    # Every logical block of every layer: 4 blocks, half of each moved, the other half not.
    desc = [d for d in divs if d.field == "descriptors"]
    assert {(d.layer, d.runner) for d in desc} == {(f"model.layers.{i}.self_attn.attn", r) for i in (0, 1) for r in ("mrv1", "mrv2")}
    assert all(d.blocks_affected == 4 for d in desc), [d.line() for d in desc]
    for case in ("mamba-hybrid", "swa-hybrid-padded", "mla-gqa-draft-b64"):
        refused = [r for r in report.results if r.case == case]
        assert {r.runner for r in refused} == {"mrv1", "mrv2"}
        assert all(r.status == "refusal" and UNIFORM in r.detail and RAISED_AT in r.detail for r in refused), refused


def test_without_the_interpreter_it_is_undrivable(monkeypatch):
    """The kernels only run on CPU in the Triton interpreter: without it, unsupported (why)."""
    from conformance.connectors.validate import build_kv_caches, make_context
    from gpu_impl.connectors import Undrivable
    from gpu_impl.connectors.hf3fs import HF3FSAdapter, interpreter_problem
    from reference.derive import derive
    from suites.named_cases import get_case

    assert interpreter_problem() is None  # this process: set before vLLM was imported
    monkeypatch.delenv("TRITON_INTERPRET")
    d = derive(get_case("tiny-uniform-lbnhc"))
    with pytest.raises(Undrivable, match="TRITON_INTERPRET=1 and CUDA_VISIBLE_DEVICES=''"):
        HF3FSAdapter(make_context(d)).register(build_kv_caches(d)[1])
