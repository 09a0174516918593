"""``kvconform matrix``: the release history's transitions, renderings and input boundary (no release venv needed)."""

from __future__ import annotations

import json

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


def test_renderings_carry_every_release_divergence_and_replay(tmp_path) -> None:
    bug = _divergence("gen1-flashinfer-b128", "model.layers.0.self_attn.attn.shape")
    releases = [_release("0.21.0", [bug], 1), _release("0.22.0", [])]
    history = {"schema": matrix.SCHEMA, "created": 0, "releases": releases, "transitions": matrix.transitions(releases)}
    matrix.write(history, tmp_path / "h.json", tmp_path / "h.md", tmp_path / "h.html")
    md, page = (tmp_path / "h.md").read_text(), (tmp_path / "h.html").read_text()
    assert "| 0.21.0 | exit 1: 14 pass | 1 | 0 |" in md and "vanished (unexpected): `" + bug["message"] in md
    assert "replay gen1-flashinfer-b128" in md
    assert "0.21.0 &rarr; 0.22.0" in page and "replay gen1-flashinfer-b128" in page
    assert json.loads((tmp_path / "h.json").read_text())["schema"] == "kvconform.release-history/1"


def test_a_known_divergence_is_listed_and_labelled_but_not_unexpected(tmp_path) -> None:
    known = _divergence("gen1-flashinfer-b128", "model.layers.0.self_attn.attn.shape", known="mrv2-logical-block-views-before-0.22")
    other = _divergence("gen1-fa-b16", "model.layers.0.self_attn.attn.stride")
    releases = [_release("0.21.0", [known, other], 1), _release("0.22.0", [])]
    assert matrix.unexpected(releases[0]["run"]) == [other]
    history = {"schema": matrix.SCHEMA, "created": 0, "releases": releases, "transitions": matrix.transitions(releases)}
    md = matrix.to_markdown(history)
    assert "| 0.21.0 | exit 1: 14 pass | 1 | 1 |" in md
    assert "vanished (known upstream [mrv2-logical-block-views-before-0.22]): `" + known["message"] in md
    assert "known upstream" in matrix.to_html(history)


def test_release_cases_follow_the_generation() -> None:
    assert {c.generation for c in matrix.release_cases("0.21.0")} == {1}
    assert all(c.vllm_version == "0.28.1" for c in matrix.release_cases("0.28.1"))
    assert {c.generation for c in matrix.release_cases("0.33.0")} == {2}


def test_bad_matrix_input_is_one_line_and_exit_4(tmp_path) -> None:
    from test_cli import kvconform

    for args, words in (
        (["matrix", "--releases", "0.21"], "is not a comma-separated list of vLLM releases"),
        (["matrix", "--releases", "0.21.0,latest"], "bad: ['latest']"),
        (["matrix", "--releases", "0.21.0", "--venv", "0.22.0=/x"], "expected VERSION=PATH for one of --releases"),
        (["matrix", "--releases", "0.21.0", "--json", str(tmp_path / "no" / "h.json")], "does not exist"),
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
    history = {"schema": matrix.SCHEMA, "created": 0, "releases": [old, new], "transitions": [step]}
    assert "exit 0: 1 refusal" in matrix.to_markdown(history) and "replay mla-eagle" in matrix.to_markdown(history)


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
