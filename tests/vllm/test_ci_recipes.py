"""The CI recipes of ``docs/ci/`` run as written: their kvconform commands, the shards as
processes side by side (as parallel agents would), then the merge step.

Buildkite's step runs in full (4 agents, ``--shard auto`` from the parallel-job variables);
GitHub Actions' matrix is run for the installed vLLM: one shard command as written (the same
part as Buildkite's), then its merge command over the four reports of that release.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "docs" / "ci"
KVCONFORM = [sys.executable, "-m", "conformance.cli"]


def _commands(recipe: str) -> list[str]:
    """The recipe's kvconform command lines, as written."""
    text = (RECIPES / recipe).read_text()
    found = re.findall(r"(?:command:|- |run:)\s*(kvconform [^\n]+)", text)
    assert found, f"no kvconform command in {recipe}"
    return found


def _argv(command: str, variables: dict[str, str]) -> list[str]:
    """A command line with the CI's variables filled in (Buildkite's $$ is a runtime $)."""
    line = command.replace("$$", "$")
    for name, value in variables.items():
        line = line.replace(f"${{{name}}}", value).replace(f"${{{{ {name} }}}}", value)
    assert "$" not in line, line
    return line.split()


def _glob_argv(argv: list[str], cwd: Path) -> list[str]:
    out = []
    for arg in argv:
        out += sorted(p.name for p in cwd.glob(arg)) if "*" in arg else [arg]
    return out


def _kvconform(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    assert argv[0] == "kvconform"
    return subprocess.Popen([*KVCONFORM, *argv[1:]], cwd=cwd, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen, timeout: float = 900) -> tuple[int, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out + err


def test_buildkite_shards_then_merge_as_written(tmp_path: Path) -> None:
    shard_cmd, merge_cmd = _commands("buildkite.yml")
    count = int(re.search(r"parallelism:\s*(\d+)", (RECIPES / "buildkite.yml").read_text()).group(1))
    agents = []
    for job in range(count):
        env = {"BUILDKITE_PARALLEL_JOB": str(job), "BUILDKITE_PARALLEL_JOB_COUNT": str(count)}
        agents.append(_kvconform(_argv(shard_cmd, env), tmp_path, env))
    for proc in agents:
        code, output = _finish(proc)
        assert code == 0, output[-2000:]
    reports = sorted(tmp_path.glob("kvconform-shard-*.json"))
    assert len(reports) == count
    code, output = _finish(_kvconform(_glob_argv(_argv(merge_cmd, {}), tmp_path), tmp_path))
    assert code == 0, output[-2000:]
    merged = json.loads((tmp_path / "kvconform.json").read_text())
    parts = [json.loads(p.read_text()) for p in reports]
    assert len(merged["results"]) == sum(len(p["results"]) for p in parts) == parts[0]["shard"]["selection_size"]
    assert (tmp_path / "kvconform.md").is_file() and (tmp_path / "kvconform.junit.xml").is_file()

    # GitHub Actions, the installed release's row: its shard command is the same part as
    # Buildkite's first agent's; its merge command makes one verdict of that release's shards.
    import importlib.metadata

    release = importlib.metadata.version("vllm")
    gh_shard, gh_merge = _commands("github-actions.yml")
    gh = tmp_path / "github"
    gh.mkdir()
    code, output = _finish(_kvconform(_argv(gh_shard, {"matrix.vllm": release, "matrix.shard": "1"}), gh))
    assert code == 0, output[-2000:]
    mine = json.loads((gh / f"kvconform-{release}-1.json").read_text())
    assert [r["case"] for r in mine["results"]] == [r["case"] for r in parts[0]["results"]]
    for k, path in enumerate(reports[1:], start=2):
        shutil.copy(path, gh / f"kvconform-{release}-{k}.json")
    code, output = _finish(_kvconform(_glob_argv(_argv(gh_merge, {}), gh), gh))
    assert code == 0, output[-2000:]
    assert [r["case"] for r in json.loads((gh / "kvconform.json").read_text())["results"]] == [r["case"] for r in merged["results"]]
