"""``kvconform matrix``: the release history's transitions, renderings and input boundary (no release venv needed)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from conformance import history_formats as matrix_formats
from conformance import matrix


def _release(version: str, divergences: list[dict], exit_code: int = 0) -> dict:
    return {
        "version": version,
        "venv": f"/venvs/{version}",
        "run": {"exit": exit_code, "line": "", "cases": 7, "counts": {"pass": 14}, "divergences": divergences},
        "checks": {name: {"exit": 5, "line": "kvconform: nothing ran: ...", "replay": "..."} for name in matrix.CONNECTORS},
    }


def _divergence(case: str, field: str, known: str | None = None) -> dict:
    return {"case": case, "runner": "mrv1/mrv2", "kind": "mrv1_mrv2_mismatch", "field": field,
            "message": f"{case} [mrv1/mrv2] mrv1_mrv2_mismatch: {field}: MRv1 (20,) vs MRv2 (10,)", "replay": f"replay {case}",
            "known": known}


def test_transitions_list_what_appears_and_vanishes_between_consecutive_releases() -> None:
    bug = _divergence("gen1-flashinfer-b128", "model.layers.0.self_attn.attn.shape")
    other = _divergence("gen1-fa-b16", "model.layers.0.self_attn.attn.stride")
    releases = [_release("0.21.0", [bug], 1), _release("0.22.0", []), _release("0.23.0", [other], 1)]
    first, second = matrix.transitions(releases)
    assert (first["from"], first["to"], first["appeared"], first["vanished"]) == ("0.21.0", "0.22.0", [], [bug])
    assert (second["appeared"], second["vanished"]) == ([other], [])


def _history(releases: list[dict]) -> dict:
    return matrix.history(releases)


def test_the_markdown_has_a_row_of_counts_per_release_and_no_replay_lines(tmp_path) -> None:
    bug = _divergence("gen1-flashinfer-b128", "model.layers.0.self_attn.attn.shape")
    releases = [_release("0.21.0", [bug], 1), _release("0.22.0", [])]
    releases[0]["run"]["counts"] = {"pass": 12, "fail": 1, "unsupported": 1}
    releases[1]["run"]["schedules"] = {"mrv1": 200, "mrv2": 198}
    matrix.write(_history(releases), tmp_path / "h.json", tmp_path / "h.md", tmp_path / "h.html")
    md, page = (tmp_path / "h.md").read_text(), (tmp_path / "h.html").read_text()
    assert "| 0.21.0 | exit 1 | 7 | – | 12 | 0 | **1** | 0 | 1 | 0 / **1** |" in md
    assert "| 0.22.0 | exit 0 | 7 | 200 / 198 | 14 | 0 | 0 | 0 | 0 | 0 / 0 |" in md
    assert "replay gen1-flashinfer-b128" not in md and "{" not in md  # configs and replays: JSON and HTML only
    ident = matrix.divergence_id(bug)
    row = next(line for line in md.splitlines() if line.startswith("| - |"))
    assert row.split(" | ")[1:5] == ["gen1-flashinfer-b128", "mrv1/mrv2", "mrv1_mrv2_mismatch", "model.layers.*.self_attn.attn.shape"]
    assert "unexpected: MRv1 (20,) vs MRv2 (10,)" in row and f"[{ident}](h.html#0.21.0-{ident})" in row
    assert f'id="0.21.0-{ident}"' in page and "replay gen1-flashinfer-b128" in page  # the link's target holds the replay
    saved = json.loads((tmp_path / "h.json").read_text())
    assert saved["schema"] == "kvconform.release-history/1" and saved["releases"][0]["run"]["divergences"][0]["id"] == ident


def test_layers_that_diverge_alike_are_one_line_and_a_long_transition_is_cut_to_a_screen() -> None:
    layers = [_divergence("gen1-flashinfer-b128", f"model.layers.{i}.self_attn.attn.shape") for i in range(2)]
    many = [_divergence(f"case-{i}", "kernel_block_sizes", known="a-bug") for i in range(matrix_formats.MAX_TRANSITION_LINES + 5)]
    md = matrix_formats.to_markdown(_history([_release("0.21.0", layers + many, 1), _release("0.22.0", [])]))
    section = md.split("## 0.21.0 → 0.22.0: 0 appeared, 25 vanished, 0 changed")[1].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| - |")]
    assert len(rows) == matrix_formats.MAX_TRANSITION_LINES
    assert "gen1-flashinfer-b128" in rows[0] and "model.layers.*.self_attn.attn.shape ×2" in rows[0]  # unexpected first
    assert "… and 6 more line(s) (6 mrv1_mrv2_mismatch): the HTML and JSON list them." in section


def test_a_divergence_whose_value_or_verdict_changes_is_one_changed_line() -> None:
    before = _divergence("gen1-flashmla-b128", "model.layers.0.self_attn.attn.shape", known="old-bug")
    after = dict(before, message=before["message"].replace("(10,)", "(5,)"), known=None)
    (step,) = matrix.transitions([_release("0.21.0", [before], 1), _release("0.22.0", [after], 1)])
    assert step["appeared"] == step["vanished"] == [] and step["changed"] == [{"before": before, "after": after}]
    (row,) = matrix_formats.transition_rows(step)
    assert (row["sign"], row["before"], row["after"]) == ("~", "known [old-bug]: MRv1 (20,) vs MRv2 (10,)",
                                                          "unexpected: MRv1 (20,) vs MRv2 (5,)")


def test_the_html_colours_each_release_and_check(tmp_path) -> None:
    ok, bad, dead = _release("0.21.0", []), _release("0.22.0", [_divergence("c", "f")], 1), _release("0.29.0", [], 5)
    dead["run"]["line"] = "kvconform: nothing ran: no facts"
    ok["checks"]["mooncake"] = {"exit": 0, "line": "", "replay": "...", "counts": {"pass": 3, "failure": 1},
                                "failures": [{"case": "c", "runner": "mrv1", "status": "failure", "detail": "d",
                                              "findings": [], "known": "some-bug", "replay": "r"}]}
    page = matrix_formats.to_html(_history([ok, bad, dead]))
    run_row = next(line for line in page.split("<tr>") if line.startswith("<th>run:"))
    assert run_row.count('class="c pass"') == 1 and run_row.count('class="c bad"') == 1  # an unexpected divergence is red
    assert 'class="c none" title="kvconform: nothing ran: no facts">not run' in run_row
    divergences = next(line for line in page.split("<tr>") if line.startswith("<th>divergences"))
    assert 'class="c bad">0 known / 1 unexpected' in divergences
    mooncake = next(line for line in page.split("<tr>") if line.startswith("<th>Mooncake"))
    assert 'class="c known"' in mooncake and "4 / 4 (1 known)" in mooncake


def test_matrix_from_renders_a_saved_history_again(tmp_path) -> None:
    from test_cli import kvconform

    bug = _divergence("gen1-flashinfer-b128", "model.layers.0.self_attn.attn.shape")
    old = {"schema": matrix.SCHEMA, "created": 1, "releases": [_release("0.21.0", [bug], 1), _release("0.22.0", [])],
           "transitions": []}  # as an older kvconform wrote it: no ids, no changed
    (tmp_path / "old.json").write_text(json.dumps(old))
    out = kvconform("matrix", "--from", str(tmp_path / "old.json"), "--markdown", str(tmp_path / "h.md"), "--json", str(tmp_path / "h.json"))
    assert out.returncode == 1, out.stderr  # the saved history's verdict: an unexpected divergence
    again = json.loads((tmp_path / "h.json").read_text())
    assert again["created"] == 1 and again["transitions"][0]["vanished"][0]["id"] == matrix.divergence_id(bug)
    assert "| 0.21.0 | exit 1 |" in (tmp_path / "h.md").read_text()


def test_release_cases_follow_the_generation() -> None:
    assert {c.generation for c in matrix.release_cases("0.21.0")} == {1}
    assert all(c.vllm_version == "0.28.1" for c in matrix.release_cases("0.28.1"))
    assert {c.generation for c in matrix.release_cases("0.33.0")} == {2}


def test_bad_matrix_input_is_one_line_and_exit_4(tmp_path) -> None:
    from test_cli import kvconform

    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    bad = _release("0.21.0", [dict(_divergence("c", "f"), case=7)])
    (tmp_path / "bad.json").write_text(json.dumps({"schema": matrix.SCHEMA, "releases": [bad]}))

    for args, words in (
        (["matrix", "--releases", "0.21"], "is not a comma-separated list of vLLM releases"),
        (["matrix", "--releases", "0.21.0,latest"], "bad: ['latest']"),
        (["matrix", "--releases", "0.21.0", "--venv", "0.22.0=/x"], "expected VERSION=PATH for one of --releases"),
        (["matrix", "--releases", "0.21.0", "--json", str(tmp_path / "no" / "h.json")], "does not exist"),
        (["matrix", "--markdown", str(tmp_path / "h.md")], "matrix needs --releases"),
        (["matrix", "--from", str(tmp_path / "none.json"), "--markdown", str(tmp_path / "h.md")], "does not exist"),
        (["matrix", "--from", str(tmp_path / "deep.json"), "--markdown", str(tmp_path / "h.md")], "nested too deep"),
        (["matrix", "--from", str(tmp_path / "bad.json"), "--markdown", str(tmp_path / "h.md")],
         "releases[0].run.divergences[0]: expected case, runner, kind, field and message strings"),
        (["matrix", "--from", str(tmp_path / "bad.json")], "give --markdown, --html and/or --json"),
        (["matrix", "--from", str(tmp_path / "bad.json"), "--ray", "--json", str(tmp_path / "h.json")], "drop --ray"),
        (["matrix", "--from", str(tmp_path / "bad.json"), "--profile", "ci", "--json", str(tmp_path / "h.json")],
         "drop --profile"),
    ):
        out = kvconform(*args)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 4 and len(lines) == 1 and words in lines[0], (args, out.stderr)


def test_connector_refusals_and_failures_appear_and_vanish_between_releases() -> None:
    refused = {"case": "gen1-mla-eagle-b64", "runner": "mrv1", "status": "refusal", "detail": "the worker raised AssertionError",
               "findings": [], "known": None, "replay": "replay mla-eagle"}
    old, new = _release("0.19.1", []), _release("0.20.0", [])
    old["checks"]["mooncake"] = {"exit": 0, "line": "", "replay": "...", "counts": {"refusal": 1}, "failures": [refused]}
    new["checks"]["mooncake"] = {"exit": 0, "line": "", "replay": "...", "counts": {"pass": 1}, "failures": []}
    (step,) = matrix.transitions([old, new])
    assert step["appeared"] == [] and len(step["vanished"]) == 1
    assert step["vanished"][0]["message"].startswith("mooncake check: gen1-mla-eagle-b64 [mrv1] refusal")
    history = _history([old, new])
    md = matrix_formats.to_markdown(history)
    assert "| 1 refusal |" in md and "| - | gen1-mla-eagle-b64 | mrv1 | mooncake_refusal | mooncake | refusal: the worker raised AssertionError | – |" in md
    assert "replay mla-eagle" in matrix_formats.to_html(history) and "replay mla-eagle" not in md


def test_no_expectations_reaches_every_step_of_a_release(tmp_path, monkeypatch) -> None:
    """``kvconform matrix --no-expectations``: the run and the connector checks of each
    release are judged without the shipped expectations (known bugs count as unexpected)."""
    commands = []
    monkeypatch.setattr(matrix, "_run", lambda cmd, env: (commands.append(list(cmd)) or (0, "")))
    history = matrix.build(["0.21.0"], lambda v: tmp_path, tmp_path, say=lambda line: None, no_expectations=True)
    assert history["expectations"] == "none"
    assert len(commands) == 1 + len(matrix.CONNECTORS) and all("--no-expectations" in c for c in commands)
    commands.clear()
    assert matrix.build(["0.21.0"], lambda v: tmp_path, tmp_path, say=lambda line: None)["expectations"] == "shipped"
    assert commands and not any("--no-expectations" in c for c in commands)


def test_a_profile_reaches_each_releases_run_and_only_it(tmp_path, monkeypatch) -> None:
    """``kvconform matrix --profile ci``: each release's ``kvconform run`` adds the profile's seeded
    random configs; the connector checks keep their cases."""
    commands = []
    monkeypatch.setattr(matrix, "_run", lambda cmd, env: (commands.append(list(cmd)) or (0, "")))
    matrix.build(["0.21.0"], lambda v: tmp_path, tmp_path, say=lambda line: None, profile="ci")
    run, *checks = commands
    assert run[1] == "run" and run[run.index("--profile") + 1] == "ci"
    assert checks and not any("--profile" in c for c in checks)
    commands.clear()
    matrix.build(["0.21.0"], lambda v: tmp_path, tmp_path, say=lambda line: None)
    assert not any("--profile" in c for c in commands)


@pytest.mark.parametrize(("stdout", "stderr", "line"), [
    ("89 passed, 2 failed\n", "Please install mooncake by following the instructions\n", "89 passed, 2 failed"),
    ("", "noise\nkvconform: nothing ran: no vLLM\nmore noise\n", "kvconform: nothing ran: no vLLM"),
    ("", "Traceback (most recent call last):\nImportError: no module named vllm\n", "ImportError: no module named vllm"),
])
def test_a_steps_line_is_its_own_verdict_not_vllms_noise(stdout: str, stderr: str, line: str) -> None:
    script = f"import sys; sys.stdout.write({stdout!r}); sys.stderr.write({stderr!r})"
    assert matrix._run([sys.executable, "-c", script], dict(os.environ)) == (0, line)


def test_a_generation_2_connector_report_is_counted_with_its_failures(tmp_path, monkeypatch) -> None:
    """``kvconform check --json`` on generation 2 writes kvconform.connector-report/2 (results per
    connector, the run's totals): the history counts them and lists each failure with its replay."""
    report = {"schema": "kvconform.connector-report/2", "totals": {"pass": 3, "failure": 1, "refusal": 0},
              "connectors": [{"results": [
                  {"case": "c", "runner": "mrv1", "status": "failure", "detail": "3 wrong bytes", "replay": "kvconform check x",
                   "divergences": [{"message": "block 0: moves [0, 8) where the block's bytes are [0, 4)"}], "expected_by": None},
                  {"case": "c", "runner": "mrv2", "status": "pass", "detail": "", "replay": "", "divergences": []}]}]}

    def run(cmd, env):
        if cmd[1] == "check":
            Path(cmd[cmd.index("--json") + 1]).write_text(json.dumps(report))
        return 0, ""

    monkeypatch.setattr(matrix, "_run", run)
    release = matrix.check_release("0.33.0", tmp_path, tmp_path)
    for check in release["checks"].values():
        assert check["counts"] == {"pass": 3, "failure": 1}
        (failure,) = check["failures"]
        assert failure["case"] == "c" and failure["findings"] == ["block 0: moves [0, 8) where the block's bytes are [0, 4)"]
