"""validate_registration against the example adapters: the correct one passes everything,
each wrong one fails where its bug class bites, with a message that names the fix."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch", reason="validate_registration builds real CPU tensors: needs torch")

from conformance.connectors import ConnectorFinding, validate_registration  # noqa: E402
from conformance.connectors.examples import (  # noqa: E402
    LogicalBlockAdapter,
    PermutationBlindAdapter,
    ReferenceAdapter,
    ShapeMinus3Adapter,
)
from conformance.connectors.protocol import ConnectorAdapter  # noqa: E402
from conformance.connectors.validate import build_kv_caches, load_connector  # noqa: E402
from reference.derive import derive  # noqa: E402
from reference.errors import StartupError  # noqa: E402
from suites.named_cases import CASES, get_case  # noqa: E402


def _report(cls, cases=None):
    # The judge's own diagnoses, on the reference's views (no vLLM needed); the tensors
    # vLLM itself registers are used by default (tests/connectors/test_vllm_connectors.py).
    return validate_registration(cls, cases=cases, tensors="reference")


def test_reference_adapter_passes_every_named_case():
    report = _report(ReferenceAdapter)
    assert report.ok, report.format()
    statuses = {(r.case, r.runner): r.status for r in report.results}
    assert {case for case, _ in statuses} == set(CASES)
    # Exactly the (case, runner) pairs vLLM refuses at startup are skipped (nothing to register; one row
    # for what both runners refuse alike), and the models that keep no KV cache (every layer encoder-only).
    refused = set()
    for name, case in CASES.items():
        for runner in ("mrv1", "mrv2"):
            try:
                derive(case, runner)
            except StartupError:
                refused.add((name, runner))
    attention_free = {name for name, case in CASES.items() if all(l.kind == "encoder_only" for l in case.layers)}
    assert {("flashinfer-b128-k64-lhbnc", "mrv1"), ("mamba-hybrid-hma-off", "mrv1"), ("pcp2-mla-flashmla-b64", "mrv1")} <= refused
    assert {c for (c, _), s in statuses.items() if s == "skipped"} == {c for c, _ in refused} | attention_free
    # A refusal of one runner only leaves the other checked (MRv1 refuses PCP, which MRv2 runs).
    for name, runner in refused:
        other = "mrv2" if runner == "mrv1" else "mrv1"
        if (name, other) not in refused and name not in attention_free:
            assert statuses.get((name, other)) == "pass", (name, other, statuses.get((name, other)))
    assert all(r.checked > 0 for r in report.results if r.status == "pass")


def test_reference_adapter_satisfies_protocol():
    from conformance.connectors.validate import make_context

    ctx = make_context(derive(get_case("flashinfer-b128-k64")))
    assert isinstance(ReferenceAdapter(ctx), ConnectorAdapter)


@pytest.mark.parametrize("name", ["flashinfer-b128-k64", "mla-gqa-draft-b64-blhnc", "mamba-hybrid", "fp8-fa-b16"])
def test_kv_caches_are_views_of_one_pool_exactly_as_the_reference_says(name):
    d = derive(get_case(name))
    pool, caches = build_kv_caches(d)
    assert list(caches) == list(d.registered)
    for layer, t in caches.items():
        view = d.registered[layer]
        assert tuple(t.shape) == view.shape and tuple(t.stride()) == view.stride
        assert str(t.dtype) == f"torch.{view.dtype}"
        assert t.untyped_storage().data_ptr() == pool.data_ptr()
        assert t.untyped_storage().nbytes() == view.storage_nbytes
        assert t.data_ptr() - pool.data_ptr() == view.byte_offset


def test_shape_minus3_is_caught_with_a_heads_not_tokens_message():
    report = _report(ShapeMinus3Adapter, ["dense-fa-b128-lbhnc", "tiny-uniform-lbnhc"])
    assert set(report.failed_cases) == {"dense-fa-b128-lbhnc", "tiny-uniform-lbnhc"}
    kbs = [d for d in report.divergences if d.field == "kernel_block_size"]
    assert kbs and "shape[-3]" in kbs[0].message and "num_kv_heads (8)" in kbs[0].message
    assert "shape[2] (128)" in kbs[0].message
    block_len = [d for d in report.divergences if d.field == "block_len"]
    assert block_len and "counts shape[-3]" in block_len[0].message
    assert any(d.field == "descriptors" for d in report.divergences)


def test_logical_block_size_is_caught_only_where_vllm_splits_kernel_blocks():
    split = ["flashinfer-b128-k64", "flashinfer-b128-k64-hnd", "mla-gqa-draft-b128-k64", "gqa+draft-attention-backend-b128"]
    no_split = ["dense-fa-b128-lbnhc", "flashinfer-b16", "flashinfer-sm100-b128", "nixl-dense-fa"]
    report = _report(LogicalBlockAdapter, split + no_split)
    assert set(report.passed_cases) >= set(no_split)
    assert set(split) <= set(report.failed_cases)
    msgs: dict = {}
    for d in report.for_case("flashinfer-b128-k64"):
        msgs.setdefault(d.field, d)
    assert msgs["block_len"].message == (
        "block_len 524288 for layer model.layers.0.self_attn.attn looks like the logical block (128 tokens); "
        "vLLM registered 64-token kernel blocks: use shape[0]/stride[0] of the registered view"
    )
    assert "logical count" in msgs["num_blocks"].message and msgs["num_blocks"].expected == "8"
    assert "kernel_block_size 128 is the logical block size" in msgs["kernel_block_size"].message
    desc = msgs["descriptors"]
    assert desc.block == 1 and "addressed as kernel block 1" in desc.message
    assert "[b*2, b*2+1]" in desc.message


def test_logical_block_size_on_mrv2_draft_keeps_target_backend():
    # gqa+draft-attention-backend-b128: MRv1 splits to 64 (FlashInfer draft), MRv2 keeps TRITON's 128
    report = _report(LogicalBlockAdapter, ["gqa+draft-attention-backend-b128"])
    by_runner = {r.runner: r.status for r in report.results}
    assert by_runner == {"mrv1": "failure", "mrv2": "pass"}


def test_permutation_blind_is_caught_on_hnd_and_block_outermost_layouts():
    report = _report(PermutationBlindAdapter, [f"dense-fa-b128-{l}" for l in ("lbnhc", "lbhnc", "blhnc", "blnhc", "lhbnc", "bhlnc")])
    assert report.passed_cases == ["dense-fa-b128-lbnhc"]
    hnd = report.for_case("dense-fa-b128-lbhnc")
    assert [d.field for d in hnd] == ["heads", "heads"]
    assert "heads outer to tokens" in hnd[0].message and "stride(1) and stride(2)" in hnd[0].message
    blhnc = report.for_case("dense-fa-b128-blhnc")
    assert blhnc[0].field == "descriptors" and blhnc[0].block == 1
    assert "address blocks with stride(0), never with the page size" in blhnc[0].message
    assert "block-outermost" in blhnc[0].message
    lhbnc = report.for_case("dense-fa-b128-lhbnc")[0]
    assert "compute offsets from tensor.stride()" in lhbnc.message


def test_failures_carry_case_json_and_replay_line():
    report = _report("conformance.connectors.examples:LogicalBlockAdapter", ["flashinfer-b128-k64"])
    (result,) = report.results
    assert result.status == "failure"
    assert json.loads(result.config)["name"] == "flashinfer-b128-k64"
    assert result.replay == "kvconform check --connector conformance.connectors.examples:LogicalBlockAdapter --case flashinfer-b128-k64"
    text = report.format()
    assert "replay: kvconform check" in text and "config: {" in text
    d = report.divergences[0]
    assert isinstance(d, ConnectorFinding)
    with pytest.raises(Exception):
        d.message = "x"  # frozen
    assert report.to_dict()["schema"] == "kvconform.connector-report/2"


def test_custom_case_gets_a_json_replay():
    case = get_case("flashinfer-b128-k64").with_(name="mine", num_blocks=2)
    report = _report(LogicalBlockAdapter, [case])
    assert report.results[0].replay.startswith("echo '") and "--case case.json" in report.results[0].replay


def test_padding_bytes_are_not_divergences():
    # FA pages are padded to the SW page (3072 bytes, 2048 content): moving the padded page is fine.
    class WholePage(ReferenceAdapter):
        def descriptors(self, layer, block_id):
            t = self.caches[layer]
            stride = t.stride(0) * t.element_size()
            return [(t.data_ptr() + block_id * stride, stride)]

    assert validate_registration(WholePage, tensors="reference", cases=["swa-hybrid-padded", "dense-fa-b128-lbnhc"]).ok


def test_adapter_exceptions_are_reported_not_raised():
    class Broken(ReferenceAdapter):
        def register(self, kv_caches):
            raise RuntimeError("KV cache tensor has too few blocks")

    report = validate_registration(Broken, cases=["nixl-dense-fa"], tensors="reference")
    # The connector's own code raising at registration is a refusal: reported with the
    # message and the line that raised, not a failure by default.
    (result,) = report.results
    assert result.status == "refusal" and report.ok and report.refused_cases == ["nixl-dense-fa"]
    assert "RuntimeError: KV cache tensor has too few blocks" in result.detail
    assert "test_validate.py" in result.detail and 'raise RuntimeError("KV cache tensor has too few blocks")' in result.detail


def test_instance_adapter_is_reused_and_bad_spec_is_rejected():
    class Instance(ReferenceAdapter):
        def __init__(self):
            self.ctx = None

        def register(self, kv_caches):
            self.caches = dict(kv_caches)
            self.ctx = type("C", (), {"num_blocks": next(iter(kv_caches.values())).shape[0]})()

    assert validate_registration(Instance(), cases=["nixl-dense-fa"], tensors="reference").ok
    with pytest.raises(ValueError, match="package.module:Name"):
        load_connector("no_colon")


@pytest.mark.parametrize(("name", "packing"), [("b12x-two-slots", "two_head_slots"), ("cpu-attn-b32", "cpu_kv_planes"),
                                                ("flashinfer-b128-k64", "kv_in_c"), ("mla-gqa-draft-b64", None)])
def test_layer_facts_say_where_k_and_v_sit(name: str, packing: str | None) -> None:
    """``LayerInfo.kv_packing``: an adapter written from it finds K and V for every backend,
    not only where K then V share the last dim."""
    from conformance.connectors.validate import make_context

    ctx = make_context(derive(get_case(name), "mrv1"))
    got = {info.backend: info.kv_packing for info in ctx.layers.values()}
    if packing is None:  # MLA target, GQA draft
        assert set(got.values()) == {"mla_latent", "kv_in_c"}, got
    else:
        assert set(got.values()) == {packing}, got


def test_replay_line_of_an_out_of_tree_adapter_carries_its_import_path(tmp_path, monkeypatch) -> None:
    import subprocess
    import sys

    from conformance.replay import replay_command

    (tmp_path / "my_adapters.py").write_text("from conformance.connectors.examples import ReferenceAdapter as Mine\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    line = replay_command(get_case("flashinfer-b16"), connector="my_adapters:Mine")
    assert line.startswith(f"PYTHONPATH={tmp_path}") and "kvconform check --connector my_adapters:Mine" in line
    assert replay_command(get_case("flashinfer-b16"), connector="conformance.connectors.examples:ReferenceAdapter").startswith("kvconform check")
    # Works as printed, from another directory, in a shell without that path.
    kvconform = f"{sys.executable} -m conformance.cli"
    out = subprocess.run(["bash", "-c", line.replace("kvconform ", f"{kvconform} ", 1)], cwd="/", capture_output=True, text=True,
                         env={k: v for k, v in __import__("os").environ.items() if k != "PYTHONPATH"})
    assert out.returncode == 0, out.stdout[-500:] + out.stderr[-500:]


@pytest.mark.parametrize(("adapter", "case", "cause"), [
    ("LogicalBlockAdapter", "flashinfer-b128-k64", "logical block b is kernel blocks"),
    ("PermutationBlindAdapter", "dense-fa-b128-lhbnc", "compute offsets from tensor.stride()"),
    ("KVInLastDimAdapter", "rocm-attn-b16", "LayerInfo.kv_packing = 'two_head_slots'"),
    ("KVInLastDimAdapter", "cpu-attn-b32", "LayerInfo.kv_packing = 'cpu_kv_planes'"),
    ("UnpaddedPageAdapter", "swa-hybrid-padded", "pages are padded to"),
])
def test_each_wrong_adapter_is_diagnosed_with_its_cause(adapter: str, case: str, cause: str) -> None:
    """One wrong adapter per cause (logical vs kernel blocks, layout strides, K/V packing,
    page padding): the first divergence of each layer names that cause, not a generic mismatch."""
    report = _report(f"conformance.connectors.examples:{adapter}", [case])
    assert report.failed_cases, report.format()
    messages = [d.message for d in report.divergences if d.field in ("descriptors", "k", "v")]
    assert messages and all(cause in m for m in messages), messages[:3]


@pytest.mark.parametrize("case", ["flashinfer-b128-k64", "dense-fa-b128-lbnhc"])
def test_the_wrong_adapters_are_right_where_their_assumption_holds(case: str) -> None:
    """K/V halves of the last dim are right for kv_in_c backends; unpadded spacing is right
    for layer-outermost pages without padding: each wrong adapter fails only where its cause applies."""
    for adapter in ("KVInLastDimAdapter", "UnpaddedPageAdapter"):
        report = _report(f"conformance.connectors.examples:{adapter}", [case])
        assert report.ok, report.format()
