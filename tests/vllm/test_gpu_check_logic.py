"""The GPU path's logic, tested on CPU with vLLM 0.33.0's own allocation code.

What runs on a GPU machine only (``scripts/gpu_check.sh``, ``tests/gpu``) is the engine
itself; everything it relies on is tested here:

- the reference byte addresses of a (layer, slot) (``reference.token_bytes``);
- the data check, observation (``gpu_impl.cuda.datacheck``: where vLLM's views put a
  written token), converted by the driver (``gpu_impl.recording``) and judged by the one
  comparator (``conformance.diff``), on REAL CPU tensors built the way the
  runners build them: vLLM's ``get_kv_cache_config_from_groups`` ->
  ``prepare_kernel_block_sizes`` -> ``allocate_kv_cache(device=cpu)`` ->
  ``map_kv_caches_to_kernel_blocks``, with marker K/V written through the bound view
  exactly as ``reshape_and_cache_flash`` indexes it (block = slot // N, offset = slot % N)
  or, for MLA, through the ``[B, N, 576]`` view ``MLAAttention.bind_kv_cache`` binds;
  a deliberately wrong prediction (one element off) and the #42846 bug shape (an
  unsplit registered view over a split bound view) must FAIL;
- the ``CheckingConnector`` end to end (register -> save_kv_layer -> JSON record);
- the tiny model configs (transformers and vLLM's ``ModelConfig`` / ``SpeculativeConfig``
  accept them), the run specs, the report summarizer and the CLI's no-GPU exit 5.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from conformance import gpu_verdict as summary
from reference.specs import vllm_spec_class
from conformance.diff import judge_token_writes
from gpu_impl.recording import _token_writes
from gpu_impl.cuda import models, scenarios
from reference import token_bytes as addresses
from reference.config import CaseConfig, uniform_layers
from reference.derive import derive
from suites.named_cases import get_case

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
SM90 = (9, 0)


# --- building real KV caches the way the runners do ----------------------------------------


def vllm_kv_caches(case: CaseConfig, runner: str = "mrv1", *, kernel_block_sizes=None):
    """``(kv_caches, bound, kernel_block_sizes, kv_cache_config)`` from vLLM's own code, on CPU."""
    from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts, resolve_kv_cache_layout
    from vllm.v1.core import kv_cache_planning as kvp
    from vllm.v1.worker.utils import allocate_kv_cache, map_kv_caches_to_kernel_blocks, prepare_kernel_block_sizes

    from gpu_impl.vllm_cpu import planning

    with planning._configure(case) as vc:
        specs, backends, _ = planning._specs(case, runner, vc)
        distinct = list({cls.full_cls_name(): cls for cls in backends.values()}.values())
        supported = [layout.name for layout in get_supported_kv_cache_layouts(distinct)]
        layout = resolve_kv_cache_layout(vc, [supported], list(specs.values()))
        groups = kvp.get_global_kv_cache_groups(vc, [specs])
        config = kvp.get_kv_cache_config_from_groups(vc, groups, case.num_blocks * kvp._pool_bytes_per_block(vc, groups))
        attn_groups = planning._attention_groups(config, backends)
        kbs = prepare_kernel_block_sizes(config, attn_groups) if kernel_block_sizes is None else kernel_block_sizes
        # vLLM's own builders mark the groups whose views map to kernel blocks.
        from gpu_impl.vllm_cpu import runners, shims

        with shims.cuda_on_meta(), runners.initialisation_environment(case):
            for gid, groups in enumerate(attn_groups):
                for group in groups:
                    group.create_metadata_builders(vc, torch.device("cpu"), kbs[gid] if gid < len(kbs) else None)
        kv = allocate_kv_cache(config, torch.device("cpu"), layout, kbs)
        bound = map_kv_caches_to_kernel_blocks(kv, (g for gs in attn_groups for g in gs))
    return kv, bound, kbs, config, layout


def head_size_of(d, layer: str):
    """How vLLM's cache update splits C: ``head_size`` (FA/FlashInfer), None for an MLA latent."""
    spec = d.specs[layer]
    return None if spec.kind.is_mla else spec.head_size


def marker(num: int, width: int, salt: int) -> torch.Tensor:
    """[num, width] bf16 integers in 1..251, adjacent elements distinct (exact in bf16)."""
    i = torch.arange(num * width).reshape(num, width)
    return (1 + (i * 7 + salt * 13) % 251).to(torch.bfloat16)


def kernel_write(bound: torch.Tensor, slot: int, head_size, salt: int) -> None:
    """Write one token the way the cache-update kernels do, through the layer's bound view.

    FA/FlashInfer: ``key_cache, value_cache = kv.transpose(1, 2).split(head_size, -1)``
    (``[B, N, H, D]``) then ``reshape_and_cache_flash``: block ``slot // N``, offset
    ``slot % N``. MLA: the layer binds ``kv.squeeze(1)`` (``[B, N, 576]``).
    """
    if head_size is None:
        cache = bound.squeeze(1) if bound.dim() == 4 else bound
        kb, off = divmod(slot, cache.shape[1])
        cache[kb, off] = marker(1, cache.shape[2], salt)[0]
        return
    key_cache, value_cache = bound.transpose(1, 2).split(head_size, dim=-1)
    kb, off = divmod(slot, key_cache.shape[1])
    heads, dv = value_cache.shape[2], value_cache.shape[3]
    key_cache[kb, off] = marker(heads, head_size, salt)
    value_cache[kb, off] = marker(heads, dv, salt + 5000)


def slots_for(d, layer: str) -> list[int]:
    """Slots in blocks 1 and the last: both ends of every kernel sub-block."""
    b = addresses.layer_block_size(d, layer)
    k = d.registered[layer].kernel_block_size
    out = []
    for block in (1, d.num_blocks - 1):
        for off in sorted({0, k - 1, k % b, min(k + 5, b - 1), b - 1}):
            out.append(block * b + off)
    return out


def _mla_case(name: str = "mla-b128", backend: str = "FLASHMLA") -> CaseConfig:
    return CaseConfig(name, uniform_layers(2, kind="mla", backend=backend, head_size=576), block_size=128, num_blocks=4)


DATA_CASES = {
    "flashinfer-b128-k64": lambda: get_case("flashinfer-b128-k64"),  # split 128 -> 64, LBNHC
    "flashinfer-b128-k64-hnd": lambda: get_case("flashinfer-b128-k64-hnd"),  # split, LBHNC
    "dense-fa-b128-lbhnc": lambda: get_case("dense-fa-b128-lbhnc"),  # LBHNC, no split
    "mla-b128-k64": _mla_case,  # MLA 576, FLASHMLA splits 128 -> 64
    "mla-gqa-draft-b128-k64": lambda: get_case("mla-gqa-draft-b128-k64"),  # MLA + GQA draft, one group
    **{f"gpu-{n}": (lambda n=n: scenarios.reference_case(scenarios.SCENARIOS[n], SM90)) for n in scenarios.SCENARIOS},
}


@pytest.fixture(scope="module")
def written():
    """Per case: the derivation, vLLM's caches with markers written, and the slots written."""
    cache = {}

    def get(name: str, runner: str = "mrv1"):
        key = (name, runner)
        if key not in cache:
            case = DATA_CASES[name]()
            d = derive(case, runner)
            kv, bound, kbs, config, _ = vllm_kv_caches(case, runner)
            slots = {}
            for li, layer in enumerate(kv):
                slots[layer] = slots_for(d, layer)
                for s in slots[layer]:
                    kernel_write(bound[layer], s, head_size_of(d, layer), salt=li * 1000 + s)
            cache[key] = SimpleNamespace(case=case, d=d, kv=kv, bound=bound, kbs=kbs, config=config, slots=slots)
        return cache[key]

    return get


# --- reference addresses ---------------------------------------------------------------------


def test_token_bytes_of_a_split_flashinfer_block_by_hand():
    """Block 128 viewed as 64-token kernel blocks, LBNHC: slot 198 = block 1, offset 70."""
    d = derive(get_case("flashinfer-b128-k64"), "mrv2")
    layer = "model.layers.1.self_attn.attn"
    tb = addresses.token_bytes(d, layer, 198)
    assert (tb.block_id, tb.offset, tb.kernel_block_id, tb.kernel_offset) == (1, 70, 3, 6)
    # layer 1 starts at 4 blocks * 512 KiB; kernel block 3 at 3 * 256 KiB; token 6 of
    # an [N, H, C] kernel block at 6 * (8 heads * 512 B); head h at h * 512 B; K first.
    base = 4 * 524288 + 3 * 262144 + 6 * 4096
    assert [h.chunk for h in tb.heads] == [(base + h * 512, base + h * 512 + 512) for h in range(8)]
    assert tb.k_runs == tuple((base + h * 512, base + h * 512 + 256) for h in range(8))
    assert tb.v_runs == tuple((base + h * 512 + 256, base + h * 512 + 512) for h in range(8))
    assert tb.kernel_block_id == 198 // 64  # the kernel-view index is the slot's own


def test_token_bytes_lbhnc_and_mla():
    d = derive(get_case("flashinfer-b128-k64-hnd"), "mrv1")
    tb = addresses.token_bytes(d, "model.layers.0.self_attn.attn", 128 + 64 + 1)  # block 1, kernel 3, token 1
    # LBHNC: [H, N, C] inside a kernel block: head stride 64 * 512 B, token stride 512 B.
    assert [h.chunk[0] for h in tb.heads] == [3 * 262144 + h * 32768 + 512 for h in range(8)]
    d = derive(_mla_case(), "mrv1")
    tb = addresses.token_bytes(d, "model.layers.1.self_attn.attn", 4 * 128 - 1)  # last slot of the pool
    assert len(tb.heads) == 1 and tb.v_runs == ()
    assert addresses.runs_nbytes(tb.k_runs) == 576 * 2
    assert tb.k_runs[0][1] == d.registered["model.layers.1.self_attn.attn"].max_byte()


def test_token_bytes_rejects_bad_slots():
    d = derive(get_case("flashinfer-b128-k64"), "mrv1")
    from reference.errors import ConfigError

    for bad in (-1, 4 * 128, True):
        with pytest.raises(ConfigError):
            addresses.token_bytes(d, "model.layers.0.self_attn.attn", bad)
    with pytest.raises(ConfigError):
        addresses.token_bytes(d, "no.such.layer", 0)
    # CPU_ATTN keeps K and V as per-head planes: a (token, head) chunk is not a token.
    from reference.errors import NotModeledError

    cpu = derive(get_case("cpu-attn-b32"), "mrv1")
    with pytest.raises(NotModeledError):
        addresses.token_bytes(cpu, "model.layers.0.self_attn.attn", 32)


def test_sample_slots_covers_both_kernel_halves():
    slots = list(range(128, 128 + 100)) + [-1, -1]  # block 1, offsets 0..99, padded
    picked = datacheck().sample_slots(slots, 128, 64, limit=8)
    assert picked == sorted(set(picked)) and len(picked) <= 8
    assert {(s % 128) // 64 for s in picked} == {0, 1}
    assert 128 in picked and 227 in picked and 128 + 63 in picked
    assert datacheck().sample_slots([-1, -1], 128, 64) == []
    assert datacheck().sample_slots([5, 6], 16, 16, limit=0) == []


# --- the data check on vLLM's own CPU tensors ------------------------------------------------


def _shifted(observed: dict, shift_bytes: int) -> dict:
    """The observation with every byte run moved (a view one element off from vLLM's)."""
    out = json.loads(json.dumps(observed))
    for token in out["tokens"]:
        for head in token.get("heads", []):
            for part in ("k", "v"):
                head[part] = [[a + shift_bytes, b + shift_bytes] for a, b in head[part]]
    return out


def judged(d, layer: str, registered, slots, head_size, *, bound=None, shift_bytes: int = 0, limit=None) -> list[list[str]]:
    """The worker's observation of ``slots`` judged by the one comparator: problems per token."""
    observed = datacheck().observe_layer(
        layer, registered, slots, head_size, addresses.layer_block_size(d, layer), bound=bound, limit=limit
    )
    assert observed["sampled"] == (sorted(set(s for s in slots if s >= 0)) if limit is None else observed["sampled"])
    writes = _token_writes([dict(_shifted(observed, shift_bytes), call=0)])
    found = judge_token_writes(d.case, "mrv1", d, writes)
    per_token = [[x.message for x in found if x.field.startswith(f"{w.layer} call 0 slot {w.slot}")] for w in writes]
    return per_token, observed


@pytest.mark.parametrize("name", sorted(DATA_CASES))
def test_data_check_passes_on_vllm_views(written, name):
    w = written(name)
    # The check is only meaningful if vLLM registered what the reference predicts.
    for layer, view in w.d.registered.items():
        t = w.kv[layer]
        assert (tuple(t.shape), tuple(t.stride()), t.storage_offset()) == (view.shape, view.stride, view.storage_offset), layer
        assert t.untyped_storage().nbytes() == view.storage_nbytes
    assert tuple(w.kbs) == w.d.kernel_block_sizes
    for layer in w.kv:
        problems, observed = judged(w.d, layer, w.kv[layer], w.slots[layer], head_size_of(w.d, layer), bound=w.bound[layer])
        assert problems and not any(problems), json.dumps(observed, indent=1)[:3000]
        assert all(t["k_nonzero"] and t["bound_equal"] for t in observed["tokens"])


@pytest.mark.parametrize("name", ["flashinfer-b128-k64", "flashinfer-b128-k64-hnd", "mla-b128-k64", "mla-gqa-draft-b128-k64"])
def test_data_check_fails_one_element_off(written, name):
    """A corrupted observation: every address one element (2 bytes) late."""
    w = written(name)
    for layer in w.kv:
        problems, _ = judged(w.d, layer, w.kv[layer], w.slots[layer], head_size_of(w.d, layer), shift_bytes=2)
        assert problems and all(problems), layer
        assert all(" K is " in p[0] and "reference expects" in p[0] for p in problems)


def test_data_check_fails_where_nothing_was_written(written):
    w = written("flashinfer-b128-k64")
    layer = "model.layers.0.self_attn.attn"
    (problems,), observed = judged(w.d, layer, w.kv[layer], [2 * 128 + 3], 128)  # block 2: never written
    assert not observed["tokens"][0]["k_nonzero"]
    assert [p.split(": ", 2)[-1] for p in problems] == ["K written is False, reference expects True", "V written is False, reference expects True"]


@pytest.mark.parametrize("name, caught", [("flashinfer-b128-k64-hnd", True), ("flashinfer-b128-k64", False)])
def test_data_check_on_an_unsplit_registered_view(name, caught):
    """The #42846 shape: the kernels write through 64-token kernel blocks, but the view a
    connector was given is the unsplit [B, H, 128, C] view of the same allocation.

    Head-major blocks (LBHNC) put a token at other bytes in the two views: caught. Under
    token-major LBNHC both views address the same bytes for every slot, so only the
    registered-shape diff can tell them apart (the data check passes, rightly).
    """
    from vllm.v1.kv_cache_interface import create_kv_cache_views

    case = get_case(name)
    d = derive(case, "mrv2")
    kv, bound, kbs, config, layout = vllm_kv_caches(case)
    assert kbs == [64]
    layer = "model.layers.0.self_attn.attn"
    raw = torch.empty(0, dtype=torch.int8).set_(kv[layer].untyped_storage())
    tensor = next(t for t in config.kv_cache_tensors if layer in t.layers)
    unsplit = create_kv_cache_views(raw, config.kv_cache_groups[0].kv_cache_spec, config.num_blocks, layout, tensor, None)[0]
    assert tuple(unsplit.shape) == (4, 8, 128, 256)
    slots = [128 + 70, 2 * 128 + 100]
    for s in slots:
        kernel_write(bound[layer], s, 128, salt=s)
    good, _ = judged(d, layer, kv[layer], slots, 128, bound=bound[layer])
    bad, observed = judged(d, layer, unsplit, slots, 128, bound=bound[layer])
    assert not any(good)
    assert all(bad) is caught and any(bad) is caught
    if caught:
        assert all(not t["bound_equal"] for t in observed["tokens"])


def test_storage_read_and_view_indexing_helpers():
    dc = datacheck()
    buf = torch.arange(64, dtype=torch.int16)
    raw = dc.storage_bytes(buf[8:])  # a view: the whole storage, from byte 0
    assert raw.numel() == 128 and raw.dtype == torch.uint8
    v = torch.zeros(3, 2, 4, 6)
    assert dc.view_index(v, 9) == (2, 1)
    assert dc.view_index(torch.zeros(3, 4, 6), 9) == (2, 1)  # MLA bound view
    with pytest.raises(IndexError):
        dc.view_index(v, 12)
    # Token 9 = [2, :, 1, :] of a contiguous fp32 view; K is the first 4 of C = 6.
    placed = dc.token_runs(v, 9, 4)
    head0 = (2 * 48 + 0 * 24 + 1 * 6) * 4
    assert placed["heads"][0] == {"head": 0, "k": [[head0, head0 + 16]], "v": [[head0 + 16, head0 + 24]]}
    # A strided last dim gives one run per element (merged where adjacent).
    strided = torch.zeros(3, 2, 4, 12)[..., ::2]
    assert len(dc.token_runs(strided, 0, None)["heads"][0]["k"]) == 6


def datacheck():
    from gpu_impl.cuda import datacheck as module

    return module


# --- the connector, end to end on CPU ---------------------------------------------------------


def make_connector(tmp_path: Path, case: CaseConfig, runner: str, layer_objects: dict, kv_cache_config=None, **extra):
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    from gpu_impl.cuda.connector import CheckingConnector

    transfer = SimpleNamespace(
        kv_connector_extra_config={"record_dir": str(tmp_path), "record_tag": case.name, "check_case_name": case.name, "check_runner": runner, **extra},
        is_kv_producer=True,
    )

    def no_layout():
        raise RuntimeError("not resolved in this stand-in")

    vllm_config = SimpleNamespace(
        kv_transfer_config=transfer,
        cache_config=SimpleNamespace(block_size=case.block_size, num_gpu_blocks=case.num_blocks, get_resolved_kv_cache_layout=no_layout),
        compilation_config=SimpleNamespace(static_forward_context=layer_objects),
        use_v2_model_runner=runner == "mrv2",
    )
    return CheckingConnector(vllm_config, KVConnectorRole.WORKER, kv_cache_config)


@pytest.mark.parametrize("name", ["gpu-flashinfer-b128-k64", "gpu-mla-b128", "gpu-eagle3-fa-b16"])
def test_checking_connector_records_and_checks(tmp_path, written, name):
    w = written(name, "mrv2")
    objects = {
        layer: SimpleNamespace(kv_lora_rank=512, head_size=576) if w.d.specs[layer].kind.is_mla else SimpleNamespace(head_size=w.d.specs[layer].head_size)
        for layer in w.kv
    }
    conn = make_connector(tmp_path, w.case, "mrv2", objects, w.config, check_calls=2, check_slots=4)
    conn.register_kv_caches(w.kv)
    for layer in w.kv:
        metadata = SimpleNamespace(slot_mapping=torch.tensor(w.slots[layer] + [-1, -1]))
        for _ in range(3):  # the third call is over check_calls: recorded, not checked
            conn.save_kv_layer(layer, w.bound[layer], metadata)
    record = json.loads(next(tmp_path.glob("worker-*.json")).read_text())
    assert record["use_v2_model_runner"] is True
    assert set(record["registered"]) == set(w.kv)
    assert record["data_check_errors"] == []
    checks = record["data_checks"]
    assert len(checks) == 2 * len(w.kv)
    assert all(c["tokens"] and c["slot_mapping_source"] == "attn_metadata" for c in checks)
    assert all(t["k_nonzero"] and "error" not in t for c in checks for t in c["tokens"])
    # The summarizer's verdict on this record, as the GPU report would carry it.
    report = {"ok": True, "spec": scenarios.build_run_spec(name.removeprefix("gpu-"), "mrv2", SM90), "worker": record}
    analysis = summary.analyze_run(report)
    assert analysis["status"] == "pass", [d["message"] for d in analysis["divergences"]]
    expected = sum(
        2 * len(datacheck().sample_slots(w.slots[n], addresses.layer_block_size(w.d, n), w.d.registered[n].kernel_block_size, 4))
        for n in w.kv
    )
    assert analysis["data"]["slots_checked"] == expected >= 2 * 3 * len(w.kv)


def test_checking_connector_skips_the_cpu_probe_off_cpu(tmp_path):
    """The recorder's probe builds K/V on the CPU: it must not reach a non-CPU cache."""
    case = scenarios.reference_case(scenarios.SCENARIOS["fa-b16"], SM90)
    impl = SimpleNamespace(do_kv_cache_update=lambda *a: pytest.fail("probe ran on a non-CPU cache"))
    conn = make_connector(tmp_path, case, "mrv1", {"l0": SimpleNamespace(head_size=128, impl=impl)})
    result = conn._probe_kv_placement({"l0": torch.empty(2, 8, 16, 256, dtype=torch.bfloat16, device="meta")})
    assert "skipped on a GPU" in result["l0"]["skipped"]


def test_checking_connector_reports_a_bad_reference(tmp_path, written):
    w = written("gpu-fa-b16")
    wrong = w.case.with_(layout="LBHNC")  # the reference disagrees with the engine (LBNHC)
    conn = make_connector(tmp_path, wrong, "mrv1", {n: SimpleNamespace(head_size=128) for n in w.kv}, w.config)
    conn.register_kv_caches(w.kv)
    for layer in w.kv:
        conn.save_kv_layer(layer, w.bound[layer], SimpleNamespace(slot_mapping=torch.tensor(w.slots[layer])))
    record = json.loads(next(tmp_path.glob("worker-*.json")).read_text())
    # The worker observes the same whatever the case says: only the judge uses the reference.
    assert len(record["data_checks"]) == 2 and all(c["tokens"] for c in record["data_checks"])
    spec = scenarios.build_run_spec("fa-b16", "mrv1", SM90)
    spec["case"] = wrong.to_dict()
    analysis = summary.analyze_run({"ok": True, "spec": spec, "worker": record})
    assert analysis["status"] == "fail"
    assert {"registered_stride"} <= {d["kind"] for d in analysis["divergences"]}
    assert analysis["data"]["failed_calls"] == 2


# --- tiny model configs ------------------------------------------------------------------------


def test_model_configs_parse(tmp_path):
    from transformers import AutoConfig
    from vllm.config import ModelConfig, ParallelConfig, SpeculativeConfig

    target = models.qwen3_config()
    q = models.write_model_dir(tmp_path / "qwen3", target)
    ds = models.write_model_dir(tmp_path / "ds", models.deepseek_v3_config())
    e3 = models.write_model_dir(tmp_path / "eagle3", models.eagle_draft_config(target, "eagle3"))
    e1 = models.write_model_dir(tmp_path / "eagle", models.eagle_draft_config(target, "eagle"))
    for path in (q, ds, e3, e1):
        json.loads((path / "config.json").read_text())
        AutoConfig.from_pretrained(path)
    qc = ModelConfig(model=str(q), skip_tokenizer_init=True, dtype="bfloat16", max_model_len=512)
    assert qc.architectures == ["Qwen3ForCausalLM"] and not qc.use_mla and qc.get_head_size() == 128
    dc = ModelConfig(model=str(ds), skip_tokenizer_init=True, dtype="bfloat16", max_model_len=512)
    assert dc.use_mla and dc.get_head_size() == 576
    spec = SpeculativeConfig(model=str(e3), method="eagle3", num_speculative_tokens=2, target_model_config=qc, target_parallel_config=ParallelConfig())
    assert spec.draft_model_config.architectures == ["Eagle3LlamaForCausalLM"]
    assert list(spec.draft_model_config.hf_config.eagle_aux_hidden_state_layer_ids) == [0, 1, 2]
    assert models.draft_layer_name(target) == "model.layers.2.self_attn.attn"
    with pytest.raises(ValueError):
        models.eagle_draft_config(models.qwen3_config(1), "eagle3")


def test_run_specs_are_json_and_match_the_reference():
    for name in scenarios.SCENARIOS:
        for runner in scenarios.RUNNERS:
            spec = scenarios.build_run_spec(name, runner, SM90)
            assert json.loads(json.dumps(spec)) == spec
            assert spec["env"]["VLLM_USE_V2_MODEL_RUNNER"] == {"mrv1": "0", "mrv2": "1"}[runner]
            case = CaseConfig.from_dict(spec["case"])
            assert case.block_size == spec["engine"]["block_size"] and case.num_blocks == spec["engine"]["num_gpu_blocks_override"]
            assert case.layout == spec["env"].get("VLLM_KV_CACHE_LAYOUT")
            assert sum(not layer.is_draft for layer in case.layers) == spec["models"]["target"]["num_hidden_layers"]
            assert all(len(p) + spec["max_tokens"] <= spec["engine"]["max_model_len"] for p in spec["prompts"])
            derive(case, runner)  # the reference can derive every scenario
    assert scenarios.build_run_spec("mla-b128", "mrv1", SM90)["backend"] == "FLASHMLA"
    assert scenarios.build_run_spec("mla-b128", "mrv1", (8, 0))["backend"] == "TRITON_MLA"
    eagle = scenarios.build_run_spec("eagle3-fa-b16", "mrv1", SM90)
    assert eagle["speculative"] == {"method": "eagle3", "num_speculative_tokens": 2}
    assert [l["name"] for l in eagle["case"]["layers"] if l.get("is_draft")] == ["model.layers.2.self_attn.attn"]


def test_run_one_engine_kwargs_and_records(tmp_path):
    from gpu_impl.cuda import run_one

    spec = scenarios.build_run_spec("eagle3-fa-b16", "mrv2", SM90)
    kwargs = run_one.engine_kwargs(spec, tmp_path, tmp_path / "records")
    assert json.loads(Path(kwargs["model"], "config.json").read_text()) == spec["models"]["target"]
    assert kwargs["speculative_config"]["model"] == str(tmp_path / "draft")
    transfer = kwargs["kv_transfer_config"]
    assert transfer["kv_connector"] == "CheckingConnector" and transfer["kv_connector_module_path"] == "gpu_impl.cuda.connector"
    assert transfer["kv_connector_extra_config"]["check_case_name"] == spec["case"]["name"]
    assert kwargs["enforce_eager"] and kwargs["load_format"] == "dummy" and kwargs["skip_tokenizer_init"]
    (tmp_path / "records").mkdir()
    (tmp_path / "records" / "worker-1.json").write_text(json.dumps({"role": "worker", "registered": {}}))
    (tmp_path / "records" / "scheduler-1.json").write_text(json.dumps({"role": "scheduler"}))
    records = run_one.read_records(tmp_path / "records")
    assert records["worker"]["role"] == "worker" and records["scheduler"]["role"] == "scheduler"


# --- the summarizer ---------------------------------------------------------------------------


def reference_view(view) -> dict:
    """A reference ``TensorView`` in the recorder's ``describe_tensor`` terms."""
    return {
        "shape": list(view.shape),
        "stride": list(view.stride),
        "dtype": view.dtype,
        "storage_offset": view.storage_offset,
        "byte_offset": view.byte_offset,
        "storage_nbytes": view.storage_nbytes,
    }


def fake_worker(case: CaseConfig, runner: str) -> dict:
    """A worker record as the connector writes it, built from the reference (a perfect engine)."""
    d = derive(case, runner)
    registered = {
        n: dict(reference_view(v), element_size=v.element_size, storage_base=1 << 40, device="cuda:0")
        for n, v in d.registered.items()
    }
    groups = [{"layer_names": list(g.layer_names), "kv_cache_spec": {"type": vllm_spec_class(g.spec), "block_size": g.spec.block_size}} for g in d.groups]
    tensors = [{"size": t.size, "layers": list(t.layers), "layer_stride": t.layer_stride, "block_stride": t.block_stride, "offset": t.offset} for t in d.plan.tensors]
    def observed_token(n: str, slot: int) -> dict:
        tb = addresses.token_bytes(d, n, slot)
        heads = [{"head": h.head, "k": [list(r) for r in h.k], "v": [list(r) for r in h.v]} for h in tb.heads]
        return {"slot": slot, "heads": heads, "k_nonzero": True, "v_nonzero": True if tb.v_runs else None}

    checks = [{"layer": n, "call": 0, "tokens": [observed_token(n, 1)], "element_size": v.element_size} for n, v in d.registered.items()]
    return {
        "role": "worker",
        "registered": registered,
        "resolved_layout": d.layout.name,
        "layer_backends": dict(d.layer_backends),
        "kv_cache_config": {"num_blocks": d.num_blocks, "kv_cache_groups": groups, "kv_cache_tensors": tensors},
        "block_size": case.block_size,
        "use_v2_model_runner": runner == "mrv2",
        "data_checks": checks,
        "data_check_errors": [],
        "save_kv_layer": {n: dict(v) for n, v in registered.items()},
    }


def fake_report(name: str, runner: str, **changes) -> dict:
    spec = scenarios.build_run_spec(name, runner, SM90)
    report = {"run_id": spec["run_id"], "ok": True, "spec": spec, "worker": fake_worker(CaseConfig.from_dict(spec["case"]), runner), "timings": {"total_s": 42.0}}
    report.update(changes)
    return report


def test_summary_of_a_conformant_engine_passes():
    reports = {s["run_id"]: fake_report(s["scenario"], s["runner"]) for s in (scenarios.build_run_spec(n, r, SM90) for n in scenarios.SCENARIOS for r in scenarios.RUNNERS)}
    result = summary.summarize(reports, {"device": "H200", "capability": [9, 0]})
    assert result["exit_code"] == 0, summary.format_summary(result)
    assert all(a["status"] == "pass" and not a["divergences"] for a in result["runs"].values())
    assert set(result["runner_differences"]) == set(scenarios.SCENARIOS)
    assert result["runner_differences"]["fa-b16"] == []
    text = summary.format_summary(result)
    assert "PASS" in text and "exit 0" in text and "MRv1 == MRv2 for flashinfer-b128-k64" in text


def test_summary_flags_divergences_data_failures_and_runner_differences():
    good = fake_report("flashinfer-b128-k64", "mrv1")
    bad = fake_report("flashinfer-b128-k64", "mrv2")
    layer = "model.layers.0.self_attn.attn"
    # The #42846 shape: MRv2 registers the unsplit view.
    bad["worker"]["registered"][layer].update(shape=[16, 8, 128, 256], stride=[131072, 256, 2048, 1])
    token = bad["worker"]["data_checks"][0]["tokens"][0]
    bad["worker"]["data_checks"][0]["tokens"] = [dict(token, slot=198)]  # slot 1's bytes reported for 198
    result = summary.summarize({"a": good, "b": bad})
    assert result["runs"]["a"]["status"] == "pass"
    b = result["runs"]["b"]
    assert b["status"] == "fail" and result["exit_code"] == 1
    assert {"registered_shape", "byte_range"} <= {d["kind"] for d in b["divergences"]}
    assert b["data"]["failed_calls"] == 1 and "slot 198" in b["data"]["problems"][0]
    diffs = result["runner_differences"]["flashinfer-b128-k64"]
    assert any(d["field"] == f"{layer}.shape" and d["kind"] == "mrv1_mrv2_mismatch" for d in diffs)
    assert "MRv1 != MRv2 for flashinfer-b128-k64" in summary.format_summary(result)


def test_summary_by_the_contract_alone():
    """``python -m conformance.gpu_check --contract-only``: a resolved layout name other than
    the facts' is no contract violation; a view that leaves its allocation is."""
    renamed = fake_report("fa-b16", "mrv1")
    renamed["worker"]["resolved_layout"] = "LBNHC" if renamed["worker"]["resolved_layout"] != "LBNHC" else "HNBLC"
    assert summary.summarize({"a": renamed})["runs"]["a"]["status"] == "fail"
    by_contract = summary.summarize({"a": renamed}, basis="contract")["runs"]["a"]
    assert by_contract["status"] == "pass" and by_contract["divergences"] == [], by_contract
    outside = fake_report("fa-b16", "mrv1")
    layer = next(iter(outside["worker"]["registered"]))
    view = outside["worker"]["registered"][layer]
    view["storage_offset"] = view["storage_offset"] + view["storage_nbytes"]  # every byte past the end
    found = summary.summarize({"a": outside}, basis="contract")["runs"]["a"]
    assert found["status"] == "fail" and {d["basis"] for d in found["divergences"]} == {"contract"}, found


def test_summary_statuses_without_a_verdict():
    unchecked = fake_report("fa-b16", "mrv1")
    unchecked["worker"]["data_checks"] = unchecked["worker"]["data_checks"][:1]
    unwritten = fake_report("fa-b16", "mrv2")
    unwritten["worker"]["data_checks"][0]["tokens"][0]["k_nonzero"] = False
    wrong_runner = fake_report("mla-b128", "mrv1")
    wrong_runner["worker"]["use_v2_model_runner"] = True
    runs = {
        "timeout": fake_report("fa-b16", "mrv1", ok=False, timed_out=True, stage="start", wall_s=300),
        "hung_in_shutdown": fake_report("fa-b16", "mrv1", timed_out=True, stage="done"),
        "error": {"ok": False, "spec": scenarios.build_run_spec("mla-b128", "mrv2", SM90), "error": "ValueError: boom", "worker": None},
        "skipped": {"spec": scenarios.build_run_spec("fa-b16", "mrv2", SM90), "skipped": "time budget"},
        "missing": None,
        "unchecked": unchecked,
        "unwritten": unwritten,
        "wrong_runner": wrong_runner,
    }
    result = summary.summarize(runs)
    status = {k: a["status"] for k, a in result["runs"].items()}
    assert status == {
        "timeout": "timeout",
        "hung_in_shutdown": "pass",
        "error": "fail",  # vLLM refused what the reference says starts: the one verdict
        "skipped": "skipped",
        "missing": "missing",
        "unchecked": "fail",
        "unwritten": "fail",
        "wrong_runner": "error",
    }
    (refusal,) = result["runs"]["error"]["divergences"]
    assert refusal["kind"] == "startup_error" and refusal["observed"] == "ValueError: boom"
    assert "timeout" not in {d["kind"] for d in result["runs"]["timeout"]["divergences"]}
    assert summary.exit_code(["pass", "timeout"]) == 3
    assert summary.exit_code(["pass", "fail", "error"]) == 1
    assert summary.exit_code([]) == 5 and summary.exit_code(["pass"]) == 0


# --- the CLI without a GPU ------------------------------------------------------------------


def test_cli_exits_5_with_one_line_without_a_gpu(tmp_path):
    env = dict(os.environ, PATH=str(tmp_path), PYTHONPATH=str(ROOT))  # no nvidia-smi on this PATH
    proc = subprocess.run(
        [sys.executable, "-m", "conformance.gpu_check", "--out", str(tmp_path / "out")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 5
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("kvconform gpu-check: nothing ran: no CUDA GPU")
    assert not (tmp_path / "out").exists()


def test_gpu_check_script_exits_5_without_a_gpu(tmp_path):
    bash = "/bin/bash" if Path("/bin/bash").exists() else "bash"
    env = dict(os.environ, PATH=f"{tmp_path}:/usr/bin:/bin")
    if any(Path(p, "nvidia-smi").exists() for p in ("/usr/bin", "/bin")):
        pytest.skip("nvidia-smi is installed system-wide here")
    proc = subprocess.run([bash, str(ROOT / "scripts" / "gpu_check.sh")], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 5 and proc.stdout == ""
    assert proc.stderr.strip().count("\n") == 0 and "nothing ran" in proc.stderr


FAKE_RUN_ONE = """#!/usr/bin/env python3
# Stands in for `python -m gpu_impl.cuda.run_one SPEC REPORT` (argv: -m MODULE SPEC REPORT).
import json, os, sys, time
spec = json.load(open(sys.argv[3]))
print("fake engine log line for", spec["run_id"], flush=True)
time.sleep(float(os.environ.get("FAKE_SLEEP", "0")) + (30 if spec["runner"] in os.environ.get("FAKE_HANG", "") else 0))
json.dump({"run_id": spec["run_id"], "spec": spec, "ok": True, "stage": "done", "timings": {"total_s": 0.1}}, open(sys.argv[4], "w"))
"""


def test_run_all_runs_in_parallel_times_out_and_skips(tmp_path):
    import time

    from conformance import gpu_check as cli

    stub = tmp_path / "fake-python"
    stub.write_text(FAKE_RUN_ONE)
    stub.chmod(0o755)
    specs = [scenarios.build_run_spec(n, r, SM90) for n in ("fa-b16", "mla-b128") for r in scenarios.RUNNERS]
    env = dict(os.environ, FAKE_HANG="mrv2", FAKE_SLEEP="0.5")
    t0 = time.monotonic()
    reports = cli.run_all(specs, tmp_path / "a", jobs=4, budget_s=60, timeout_s=3, python=str(stub), env=env, poll_s=0.05, min_start_s=1)
    assert time.monotonic() - t0 < 20  # four at once: the two hangs are killed together
    assert list(reports) == [s["run_id"] for s in specs]
    for rid, report in reports.items():
        hang = rid.endswith("mrv2")
        assert report["timed_out"] is hang and report["ok"] is not hang, rid
        assert f"fake engine log line for {rid}" in report["log_tail"]
        assert (tmp_path / "a" / "logs" / f"{rid}.log").exists() and (tmp_path / "a" / "specs" / f"{rid}.json").exists()
    # A budget that only lets the first run start: the others are skipped, not started.
    env = dict(os.environ, FAKE_SLEEP="1.5")
    reports = cli.run_all(specs, tmp_path / "b", jobs=1, budget_s=2.5, timeout_s=10, python=str(stub), env=env, poll_s=0.05, min_start_s=2)
    assert reports["fa-b16-mrv1"]["ok"] and all("time budget" in reports[s["run_id"]]["skipped"] for s in specs[1:])
    statuses = {rid: a["status"] for rid, a in summary.summarize(reports)["runs"].items()}
    assert statuses == {"fa-b16-mrv1": "error", "fa-b16-mrv2": "skipped", "mla-b128-mrv1": "skipped", "mla-b128-mrv2": "skipped"}


def test_cli_usage_and_list():
    from conformance import gpu_check as cli

    assert cli.main(["--scenario", "no-such-scenario"]) == 4
    assert cli.main(["--jobs", "0"]) == 4
    for flag in ("--budget-s", "--timeout-s"):
        for value in ("nan", "inf", "-1", "0"):
            assert cli.main([flag, value]) == 4, (flag, value)
    assert cli.main(["--bogus-flag"]) == 4
    assert cli.main(["--list"]) == 0


def test_the_gpu_runs_make_a_kvconform_report_through_the_one_run_loop(tmp_path, monkeypatch):
    """OUT/report.json: the same run loop, comparator, expectations and replay lines as `kvconform run`."""
    from conformance import gpu_check
    from conformance.report_formats import validate_report

    monkeypatch.setenv("KVCONFORM_VLLM_LOG", str(tmp_path / "vllm.log"))
    specs = [scenarios.build_run_spec(n, r, SM90) for n in ("fa-b16", "flashinfer-b128-k64") for r in scenarios.RUNNERS]
    reports = {s["run_id"]: fake_report(s["scenario"], s["runner"]) for s in specs}
    reports["fa-b16-mrv2"] = {"spec": reports["fa-b16-mrv2"]["spec"], "skipped": "time budget"}
    device = {"device": "H200", "capability": [9, 0], "vllm": "0.33.0", "torch": "2.14.0"}
    summary_of = summary.summarize(reports, device)
    code = gpu_check.write_report(reports, summary_of, device, tmp_path / "report.json")
    report = json.loads((tmp_path / "report.json").read_text())
    assert validate_report(report) == [] and code == 0
    assert report["environment"]["implementation"] == "vllm engine on cuda"
    rows = {r["case"]: r for r in report["results"]}
    assert rows["gpu-fa-b16"]["runners"]["mrv2"]["status"] == "unsupported"  # skipped: no verdict, never a pass
    assert "time budget" in rows["gpu-fa-b16"]["runners"]["mrv2"]["detail"]
    assert rows["gpu-flashinfer-b128-k64"]["runners"]["mrv1"]["status"] == "pass"
    assert rows["gpu-flashinfer-b128-k64"]["replay"] == "bash scripts/gpu_check.sh --scenario flashinfer-b128-k64"
    assert gpu_check.exit_status(code, [a["status"] for a in summary_of["runs"].values()]) == 3

    # The #42846 shape in MRv2: an unexpected divergence and an MRv1/MRv2 mismatch in the report.
    layer = "model.layers.0.self_attn.attn"
    bad = fake_report("flashinfer-b128-k64", "mrv2")
    bad["worker"]["registered"][layer].update(shape=[16, 8, 128, 256], stride=[131072, 256, 2048, 1])
    reports["flashinfer-b128-k64-mrv2"] = bad
    summary_of = summary.summarize(reports, device)
    code = gpu_check.write_report(reports, summary_of, device, tmp_path / "report.json")
    report = json.loads((tmp_path / "report.json").read_text())
    assert code == 1 and validate_report(report) == []
    row = next(r for r in report["results"] if r["case"] == "gpu-flashinfer-b128-k64")
    assert row["runners"]["mrv2"]["status"] == "fail"
    assert any(m["field"] == f"{layer}.shape" for m in row["mrv1_mrv2_mismatches"])
    assert gpu_check.exit_status(code, [a["status"] for a in summary_of["runs"].values()]) == 1


def test_the_gpu_checks_report_merges_beside_a_cpu_report(tmp_path, monkeypatch):
    """OUT/report.json is a run report: `kvconform report merge` keeps it apart from a CPU run's
    (another device, another environment) and shows both side by side."""
    from conformance import cli, gpu_check
    from report_fixtures import PUBLISHED

    monkeypatch.setenv("KVCONFORM_VLLM_LOG", str(tmp_path / "vllm.log"))
    specs = [scenarios.build_run_spec("flashinfer-b128-k64", r, SM90) for r in scenarios.RUNNERS]
    reports = {s["run_id"]: fake_report(s["scenario"], s["runner"]) for s in specs}
    device = {"device": "H200", "capability": [9, 0], "vllm": "0.33.0", "torch": "2.14.0"}
    assert gpu_check.write_report(reports, summary.summarize(reports, device), device, tmp_path / "report.json") == 0
    md = tmp_path / "both.md"
    assert cli.main(["report", "merge", str(PUBLISHED), str(tmp_path / "report.json"), "--json", str(tmp_path / "both.json"),
                     "--markdown", str(md)]) == 0
    merged = json.loads((tmp_path / "both.json").read_text())
    assert [e["gpu"] for e in merged["environments"]] == [json.loads(PUBLISHED.read_text())["environment"]["gpu"], "H200"]
    row = next(line for line in md.read_text().splitlines() if line.startswith("| gpu-flashinfer-b128-k64 |"))
    assert row.split("|")[2].strip() == "-" and "mrv1:pass" in row  # only the GPU environment ran it
