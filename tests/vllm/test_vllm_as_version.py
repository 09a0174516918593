"""``scripts/vllm_as_version.{py,sh}``: the installed vLLM reports another version (for testing
kvconform against unreleased builds such as ``0.34.0.dev12+g1a2b3c4``) through an overlay on
PYTHONPATH, in every process that inherits it, and nothing in the venv changes.

Each subprocess imports vLLM at most once (~5 s each); the ones that do run side by side.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "vllm_as_version.py"
WRAPPER = ROOT / "scripts" / "vllm_as_version.sh"
PRETEND = "0.34.0.dev12+g1a2b3c4"

# Run as a file (multiprocessing's spawn re-imports the main module by path): the parent starts
# a spawn child first, imports vLLM while the child does, and prints both views, one per line.
PROBE = textwrap.dedent(
    """
    import importlib.metadata as md
    import multiprocessing as mp
    import sys


    def view():
        import vllm
        import vllm.version

        return " ".join([md.version("vllm"), md.distribution("vllm").version, vllm.__version__,
                         vllm.version.__version__, repr(vllm.version.__version_tuple__)])


    def child(queue):
        queue.put(view())


    if __name__ == "__main__":
        spawn = mp.get_context("spawn")
        queue = spawn.Queue()
        proc = spawn.Process(target=child, args=(queue,))
        proc.start()
        print("parent", view(), flush=True)
        print("child", queue.get(timeout=240), flush=True)
        proc.join(60)
        sys.exit(proc.exitcode)
    """
)


def _load_script():
    spec = importlib.util.spec_from_file_location("vllm_as_version_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _real_version() -> str:
    """The installed release's own version, read off its dist-info (this pytest process may
    itself run under an overlay)."""
    metadata = (_load_script().real_dist_info() / "METADATA").read_text(encoding="utf-8")
    return next(line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Version:"))


def _env(pythonpath: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return env


def _make_overlay(directory: Path) -> Path:
    out = subprocess.run([sys.executable, str(SCRIPT), PRETEND, "--dir", str(directory)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [str(directory)]
    return Path(out.stdout.strip())


def test_overlay_is_seen_by_the_process_and_a_spawned_child_and_absent_without_it(tmp_path: Path) -> None:
    overlay = _make_overlay(tmp_path / "overlay")
    assert (overlay / f"vllm-{PRETEND}.dist-info" / "METADATA").is_file()
    assert (overlay / "sitecustomize.py").is_file()
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE, encoding="utf-8")

    with_overlay = subprocess.Popen([sys.executable, str(probe)], env=_env(str(overlay)), cwd=tmp_path,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    without = subprocess.Popen(
        [sys.executable, "-c", "import importlib.metadata as md, sys, vllm\n"
         "print(md.version('vllm'), vllm.__version__, any(type(f).__name__ == 'VllmVersionFinder' for f in sys.meta_path))"],
        env=_env(None), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = with_overlay.communicate(timeout=300)
    real_out, real_err = without.communicate(timeout=300)

    assert with_overlay.returncode == 0, err[-3000:]
    pretend_view = f"{PRETEND} {PRETEND} {PRETEND} {PRETEND} (0, 34, 0, 'dev12', 'g1a2b3c4')"
    assert out.splitlines() == [f"parent {pretend_view}", f"child {pretend_view}"]

    real = _real_version()
    assert real != PRETEND
    assert without.returncode == 0, real_err[-3000:]
    assert real_out.split() == [real, real, "False"]


def test_metadata_is_the_real_one_but_the_version(tmp_path: Path) -> None:
    """What kvconform and vLLM read from the metadata still works: requires, entry points (vLLM's
    own plugins), the name; only the version differs; files is None (no RECORD)."""
    overlay = _make_overlay(tmp_path / "overlay")
    code = ("import importlib.metadata as md, json\n"
            "d = md.distribution('vllm')\n"
            "print(json.dumps({'version': d.version, 'name': d.metadata['Name'], 'requires': d.requires,"
            " 'files': None if d.files is None else len(d.files), 'plugins': sorted(e.name for e in md.entry_points(group='vllm.general_plugins')),"
            " 'scripts': sorted(e.name for e in d.entry_points if e.group == 'console_scripts')}))\n")
    runs = [subprocess.run([sys.executable, "-c", code], env=_env(path), capture_output=True, text=True,
                           timeout=60, cwd=tmp_path) for path in (str(overlay), None)]
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    pretend, real = (json.loads(r.stdout) for r in runs)
    assert pretend["version"] == PRETEND and real["version"] == _real_version()
    assert pretend["files"] is None and real["files"]  # the overlay has no RECORD; the real one does
    for key in ("name", "requires", "plugins", "scripts"):
        assert pretend[key] == real[key], key


def test_wrapper_puts_the_overlay_first_keeps_pythonpath_and_chains_sitecustomize(tmp_path: Path) -> None:
    """No vLLM import: the metadata view, PYTHONPATH's order and a later sitecustomize still run."""
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import sys\nsys.kvconform_chained = True\n", encoding="utf-8")
    overlay_dir = tmp_path / "overlay"
    env = _env(str(other))
    env.update(KVCONFORM_VLLM_AS_DIR=str(overlay_dir), KVCONFORM_PYTHON=sys.executable)
    out = subprocess.run(
        ["bash", str(WRAPPER), PRETEND, sys.executable, "-c",
         "import importlib.metadata as md, os, sys\n"
         "print(os.environ['PYTHONPATH']); print(md.version('vllm')); print(getattr(sys, 'kvconform_chained', False))"],
        env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [f"{overlay_dir}:{other}", PRETEND, "True"]


@pytest.mark.parametrize("bad", ["banana", "v0.34.0", "0.34.0 dev", "0.34.0\nrm", "../0.34.0", "0.34/0", "34", ""])
def test_a_bad_version_is_refused_in_one_line_with_exit_4(tmp_path: Path, bad: str) -> None:
    out = subprocess.run([sys.executable, str(SCRIPT), bad, "--dir", str(tmp_path / "overlay")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 4
    assert out.stdout == ""
    assert len(out.stderr.splitlines()) == 1 and "Traceback" not in out.stderr
    assert "PEP 440" in out.stderr
    assert not (tmp_path / "overlay").exists()


def test_the_wrapper_refuses_a_bad_version_before_running_anything(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    env = _env(None)
    env.update(KVCONFORM_VLLM_AS_DIR=str(tmp_path / "overlay"), KVCONFORM_PYTHON=sys.executable)
    out = subprocess.run(["bash", str(WRAPPER), "latest", "touch", str(marker)], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 4
    assert len(out.stderr.splitlines()) == 1 and "Traceback" not in out.stderr
    assert not marker.exists()
