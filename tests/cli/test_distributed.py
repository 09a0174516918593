"""``--ray`` (conformance/distributed.py): its input boundary, and the release matrix on a real
Ray cluster of two nodes on 127.0.0.1 equal to the serial matrix.

The matrix test gives both matrices the same two "release venvs" whose ``kvconform`` is this
checkout's, run as if vLLM were not installed (``sys.modules['vllm'] = None``): every step is
the real command, it just has nothing to check against (exit 5), so the test is fast and
compares how the two matrices run and gather, not a vLLM. ``tests/vllm/test_ray_run.py`` runs
``kvconform run --ray`` against the installed vLLM.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conformance import distributed, matrix
from conformance.cli import main

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "scripts" / "ray_loopback_cluster.py"
KVCONFORM = Path(sys.executable).with_name("kvconform")
needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                               reason="Ray is not installed here (pip install 'kvconform[distributed]')")


@pytest.mark.parametrize("text, expected", [
    ("", None), ("local", None), ("auto", "auto"), ("127.0.0.1:6379", "127.0.0.1:6379"),
    ("ray://head.example:10001", "ray://head.example:10001"), ("[::1]:6379", "[::1]:6379"),
])
def test_ray_addresses(text: str, expected: str | None) -> None:
    assert distributed.parse_address(text) == expected


@pytest.mark.parametrize("text", ["127.0.0.1", "127.0.0.1:0", "127.0.0.1:70000", "head:port", "http://x:1", "a b:1"])
def test_bad_ray_addresses_are_one_line_and_exit_4(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["matrix", "--releases", "0.21.0", "--ray", text]) == 4
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and repr(text) in err and "HOST:PORT" in err


def test_without_ray_the_option_says_so_in_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    for argv in (["run", "--ray", "--case", "flashinfer-b128-k64"], ["matrix", "--releases", "0.21.0", "--ray"]):
        assert main(argv) == 4
        err = capsys.readouterr().err.strip()
        assert err == f"kvconform: error: {distributed.RAY_MISSING}"


@pytest.mark.parametrize("argv, why", [
    (["run", "--ray-tasks", "2"], "needs --ray"),
    (["run", "--ray", "--engine"], "drop --engine"),
    (["run", "--ray", "--shard", "1/2"], "drop --shard"),
    (["run", "--ray", "--reference-only"], "drop --reference-only"),
    (["run", "--ray", "--ray-tasks", "0"], "'0' is not a number of Ray tasks"),
    (["run", "--ray", "--case", "no-such-case"], "unknown case 'no-such-case'"),
])
def test_ray_runs_refuse_what_they_cannot_do(argv: list[str], why: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 4
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and why in err


def test_an_unreachable_head_is_one_line_not_minutes_of_retries(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("ray", reason="Ray is not installed here")
    assert main(["run", "--ray", "127.0.0.1:1", "--case", "flashinfer-b128-k64"]) == 5
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nothing accepts connections at 127.0.0.1:1" in err


def test_shard_tasks_carry_case_and_expectation_files(tmp_path: Path) -> None:
    from conformance.cli import build_parser
    from suites.named_cases import CASES

    case = tmp_path / "mine.json"
    case.write_text(CASES["flashinfer-b128-k64"].to_json())
    known = tmp_path / "known.toml"
    known.write_text("# none\n")
    args = build_parser().parse_args(["run", "--ray", "--case", str(case), "--case", "mla-gqa-draft-b64", "--expectations",
                                      str(known), "--seed", "7", "--schedules", "1", "--contract-only"])
    arguments = distributed.run_arguments(args)
    shipped = [a for a in arguments if isinstance(a, distributed.ShippedFile)]
    assert [(f.name, f.text) for f in shipped] == [("case-0-mine.json", case.read_text()), ("expectations-0-known.toml", "# none\n")]
    plain = [a for a in arguments if isinstance(a, str)]
    assert "mla-gqa-draft-b64" in plain and str(case) not in plain
    assert plain[plain.index("--seed") + 1] == "7" and plain[plain.index("--schedules") + 1] == "1" and "--contract-only" in plain


def _fake_release_venv(root: Path, version: str) -> Path:
    """A venv whose ``kvconform`` is this checkout's, as if vLLM were not installed."""
    venv = root / f"venv-{version}"
    (venv / "bin").mkdir(parents=True)
    script = venv / "bin" / "kvconform"
    script.write_text("#!/bin/sh\nexec " + sys.executable + ' -c "import sys; sys.modules[\'vllm\'] = None; '
                      'from conformance.cli import main; sys.exit(main())" "$@"\n')
    script.chmod(0o755)
    return venv


@needs_ray
def test_the_matrix_on_a_two_node_ray_cluster_equals_the_serial_matrix(tmp_path: Path) -> None:
    versions = ["0.20.0", "0.21.0"]
    venvs = [arg for v in versions for arg in ("--venv", f"{v}={_fake_release_venv(tmp_path, v)}")]
    common = [str(KVCONFORM), "matrix", "--releases", ",".join(versions), *venvs]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    serial = subprocess.run([*common, "--json", str(tmp_path / "serial.json")], cwd=ROOT, env=env, capture_output=True, text=True)
    assert serial.returncode == 5, serial.stderr  # nothing could be checked: no vLLM
    on_ray = subprocess.run([sys.executable, str(CLUSTER), "--nodes", "2", "--", *common, "--ray", "{address}",
                             "--json", str(tmp_path / "ray.json")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert on_ray.returncode == 5, on_ray.stderr
    assert "2 node(s), 2 CPU(s)" in on_ray.stderr
    a, b = (json.loads((tmp_path / name).read_text()) for name in ("serial.json", "ray.json"))
    assert [r["run"]["exit"] for r in a["releases"]] == [5, 5]
    assert "vLLM is not installed" in a["releases"][0]["run"]["line"]
    assert matrix.comparable(a) == matrix.comparable(b)
    assert a != b  # what comparable() leaves out does differ: when it ran, and where
    assert set(b["ray"]["nodes"]) == set(versions) and all(n["address"] == "127.0.0.1" for n in b["ray"]["nodes"].values())
