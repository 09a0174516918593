"""``--expectations FILE`` (repeatable, layered on the shipped file), ``--no-shipped-expectations``
and ``--no-expectations``: parsed, loaded and reported without vLLM (usage errors come before
anything runs; the verdict lines are printed by ``vllm_run._print_verdict`` itself)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conformance.cli import _load_expectations, build_parser
from conformance.expectations import SHIPPED_SOURCE, Environment, classify, load

ROOT = Path(__file__).resolve().parents[2]


def kvconform(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "conformance.cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def _file(path: Path, *ids: str, kind: str = "layout", case: str = "*") -> Path:
    body = "".join(f'[[expectation]]\nid = "{i}"\nkind = "{kind}"\ncase = "{case}"\nreason = "my PR #1"\n\n' for i in ids)
    path.write_text("schema = 1\n\n" + body)
    return path


@pytest.mark.parametrize("command", [["run"], ["replay", "report.json"]])
def test_expectations_is_repeatable_and_layered_after_the_shipped_file(tmp_path: Path, command: list[str]) -> None:
    a, b = _file(tmp_path / "a.toml", "mine-a"), _file(tmp_path / "b.toml", "mine-b", "mine-c")
    args = build_parser().parse_args([*command, "--expectations", str(a), "--expectations", str(b)])
    entries, source = _load_expectations(args)
    shipped = load()
    assert [e.id for e in entries] == [e.id for e in shipped] + ["mine-a", "mine-b", "mine-c"]
    assert [e.source for e in entries[len(shipped):]] == [str(a), str(b), str(b)]
    assert source == f"{SHIPPED_SOURCE} (shipped) + {a} + {b}"
    # Without --expectations: the shipped file alone, named as before.
    entries, source = _load_expectations(build_parser().parse_args(command))
    assert [e.id for e in entries] == [e.id for e in shipped] and source == f"{SHIPPED_SOURCE} (shipped)"
    # --no-shipped-expectations keeps the files given; with none, nothing at all.
    args = build_parser().parse_args([*command, "--no-shipped-expectations", "--expectations", str(b)])
    entries, source = _load_expectations(args)
    assert [e.id for e in entries] == ["mine-b", "mine-c"] and source == str(b)
    assert _load_expectations(build_parser().parse_args([*command, "--no-shipped-expectations"])) == ((), None)
    assert _load_expectations(build_parser().parse_args([*command, "--no-expectations"])) == ((), None)


def test_no_expectations_with_expectations_is_a_one_line_usage_error(tmp_path: Path) -> None:
    mine = _file(tmp_path / "mine.toml", "mine-a")
    out = kvconform("run", "--case", "flashinfer-b16", "--no-expectations", "--expectations", str(mine))
    assert out.returncode == 4, out.stderr
    assert "--no-expectations and --expectations exclude each other" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and out.stdout == ""


def test_a_duplicate_id_across_files_is_a_one_line_usage_error_naming_both(tmp_path: Path) -> None:
    a, b = _file(tmp_path / "a.toml", "same"), _file(tmp_path / "b.toml", "same")
    out = kvconform("run", "--case", "flashinfer-b16", "--expectations", str(a), "--expectations", str(b))
    assert out.returncode == 4, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert str(a) in out.stderr and str(b) in out.stderr and "'same'" in out.stderr
    # A shipped id reused: the shipped file is named.
    taken = _file(tmp_path / "c.toml", load()[0].id)
    out = kvconform("run", "--case", "flashinfer-b16", "--expectations", str(taken))
    assert out.returncode == 4 and SHIPPED_SOURCE in out.stderr and str(taken) in out.stderr


def test_an_unused_consumer_entry_is_printed_with_its_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from conformance.vllm_run import _print_verdict
    from suites.named_cases import CASES

    mine = _file(tmp_path / "mine.toml", "my-id", kind="registered_shape", case="flashinfer-*")
    entries, _ = _load_expectations(build_parser().parse_args(["run", "--no-shipped-expectations", "--expectations", str(mine)]))
    case = CASES["flashinfer-b16"]
    verdict = classify([], Environment("0.33.0", {case.name: None}), entries)
    _print_verdict(verdict, {"pass": 2}, {case.name: case}, lambda c: f"kvconform run --case {c.name}")
    lines = capsys.readouterr().out.splitlines()
    assert f"kvconform: unused expectation my-id (kind=registered_shape, case=flashinfer-*) from {mine}: matched nothing in this run; delete or narrow it" in lines
    # Unused is reported, never a failure: the verdict has nothing unexpected.
    assert verdict.unexpected == () and [e.id for e in verdict.unused] == ["my-id"]
