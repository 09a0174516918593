#!/usr/bin/env python3
"""Make the installed vLLM report another version, without touching its environment.

    python scripts/vllm_as_version.py 0.34.0.dev12+g1a2b3c4          # prints the PYTHONPATH to use
    PYTHONPATH="$(.venv/bin/python scripts/vllm_as_version.py 0.34.0.dev12+g1a2b3c4)" .venv/bin/kvconform run
    bash scripts/vllm_as_version.sh 0.34.0.dev12+g1a2b3c4 .venv/bin/kvconform run   # the same, in one step

For testing kvconform against what vLLM's CI builds (versions such as ``0.34.0.dev12+g1a2b3c4``)
without building vLLM from source. Writes an overlay directory (default
``${KVCONFORM_CACHE:-~/.cache/kvconform}/vllm-as/<version>/``, or ``--dir``) and prints it as
its only stdout line; put it first on ``PYTHONPATH``. Every Python process that inherits that
``PYTHONPATH`` (pytest-xdist workers, multiprocessing spawn children, subprocesses) then sees:

* ``importlib.metadata.version("vllm")`` == VERSION: the overlay holds
  ``vllm-<VERSION>.dist-info/`` (the real METADATA with only its ``Version:`` line changed,
  plus the real ``entry_points.txt`` and ``top_level.txt``, no RECORD). PYTHONPATH entries come
  before site-packages and importlib.metadata answers with the first distribution it finds.
  ``distribution("vllm").files`` is None (no RECORD); ``requires`` is the real release's.
* ``vllm.__version__``, ``vllm.version.__version__`` / ``__version_tuple__`` and
  ``vllm._version``'s ``version`` / ``version_tuple`` (and ``commit_id`` when VERSION's local
  part is ``g<hash>``) == VERSION, set by the overlay's ``sitecustomize.py`` right after those
  modules run (a meta-path finder wrapping their loaders: nothing imports vLLM early). A
  ``sitecustomize`` further along ``sys.path`` (the venv's or the interpreter's) still runs.

The installed code is still the installed release's: only what it reports changes. The vLLM
seen is the one of the Python that runs this script (the METADATA is copied from it).
``python -S``, ``-I`` or ``-E`` skip the overlay (no sitecustomize / no PYTHONPATH).

Exit status: 0 done; 4 bad usage (e.g. a VERSION that is not a PEP 440 version such as
``0.34.0.dev12+g1a2b3c4``); 3 the overlay cannot be made (no vLLM in this Python, or the
directory cannot be written). Errors are one line on stderr. Standard library only.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from pathlib import Path

EXIT_OK, EXIT_CANNOT, EXIT_USAGE = 0, 3, 4

# PEP 440 public versions (no epoch) with an optional local part: 0.34.0, 0.34.0rc1,
# 0.34.0.post1, 0.34.0.dev12+g1a2b3c4, 0.34.0.dev12+g1a2b3c4.d20260101, 0.34.0+cu129.
VERSION_RE = re.compile(
    r"[0-9]+\.[0-9]+(?:\.[0-9]+)*"
    r"(?:(?:a|b|rc)[0-9]+)?"
    r"(?:\.post[0-9]+)?"
    r"(?:\.dev[0-9]+)?"
    r"(?:\+[a-z0-9]+(?:\.[a-z0-9]+)*)?",
    re.IGNORECASE,
)

# The files copied from the real dist-info as they are (METADATA gets its Version changed).
# entry_points.txt matters: importlib.metadata.entry_points() keeps the first distribution
# of a name, so without it vLLM's own vllm.general_plugins entry points would vanish.
COPIED = ("entry_points.txt", "top_level.txt", "WHEEL")

SITECUSTOMIZE = '''\
"""Written by kvconform's scripts/vllm_as_version.py: the installed vLLM reports {version!r}.

A meta-path finder wraps the loaders of vllm.version and vllm._version so that, right after
each runs, its version attributes read the pretend version (vllm/__init__.py imports
__version__ from vllm.version). Nothing here imports vLLM. A sitecustomize further along
sys.path is run afterwards. Standard library only; cheap at interpreter start.
"""

import sys as _sys

PRETEND_VERSION = {version!r}
PRETEND_VERSION_TUPLE = {version_tuple!r}
PRETEND_COMMIT_ID = {commit_id!r}
_MODULES = ("vllm.version", "vllm._version")


def _patch(module):
    for name, value in (("__version__", PRETEND_VERSION), ("version", PRETEND_VERSION),
                        ("__version_tuple__", PRETEND_VERSION_TUPLE),
                        ("version_tuple", PRETEND_VERSION_TUPLE),
                        ("__commit_id__", PRETEND_COMMIT_ID), ("commit_id", PRETEND_COMMIT_ID)):
        if value is None:
            continue
        if name in ("__version__", "__version_tuple__") or hasattr(module, name):
            setattr(module, name, value)


class _PretendLoader:
    """The real loader, with the version attributes patched after the module runs."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module):
        self._loader.exec_module(module)
        _patch(module)

    def __getattr__(self, name):  # get_source, get_filename, get_resource_reader, ...
        return getattr(self._loader, name)


class VllmVersionFinder:
    """A meta-path finder (importlib.abc.MetaPathFinder's protocol; not subclassed, since
    importing importlib.abc costs every interpreter ~13 ms) for vllm.version and vllm._version."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _MODULES:
            return None
        for finder in _sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PretendLoader(spec.loader)
                return spec
        return None

    def invalidate_caches(self):
        pass


def _install():
    if any(type(f).__name__ == "VllmVersionFinder" for f in _sys.meta_path):
        return
    _sys.meta_path.insert(0, VllmVersionFinder())
    for name in _MODULES:  # already imported (unusual for a sitecustomize): patch in place
        if name in _sys.modules:
            _patch(_sys.modules[name])
    if "vllm" in _sys.modules:
        _sys.modules["vllm"].__version__ = PRETEND_VERSION
        _sys.modules["vllm"].__version_tuple__ = PRETEND_VERSION_TUPLE


def _chain():
    """Run the next sitecustomize on sys.path (the venv's or the interpreter's), if any."""
    import os
    from importlib.machinery import PathFinder
    from importlib.util import module_from_spec

    here = os.path.dirname(os.path.abspath(__file__))
    entries = [os.path.abspath(p or os.curdir) for p in _sys.path]
    # Only the entries after this overlay: an earlier overlay would chain back to this one.
    rest = _sys.path[entries.index(here) + 1:] if here in entries else []
    spec = PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = module_from_spec(spec)
    _sys.modules["_kvconform_chained_sitecustomize"] = module
    spec.loader.exec_module(module)


_install()
try:
    _chain()
except Exception as _exc:  # as site.py does for a failing sitecustomize: say so, go on
    print(f"Error in the sitecustomize chained from {{__file__}}: {{type(_exc).__name__}}: {{_exc}}",
          file=_sys.stderr)
'''


class Cannot(Exception):
    """The overlay cannot be made here (exit 3)."""


def version_tuple(version: str) -> tuple:
    """setuptools-scm's shape: 0.34.0.dev12+g1a2b3c4 -> (0, 34, 0, 'dev12', 'g1a2b3c4')."""
    public, _, local = version.partition("+")
    parts: list = []
    for piece in public.split("."):
        match = re.fullmatch(r"([0-9]+)((?:a|b|rc)[0-9]+)?", piece, re.IGNORECASE)
        if match:
            parts.append(int(match.group(1)))
            if match.group(2):
                parts.append(match.group(2))
        else:
            parts.append(piece)
    if local:
        parts.append(local)
    return tuple(parts)


def commit_id(version: str) -> str | None:
    """The commit of a setuptools-scm local part (+g1a2b3c4[.dYYYYMMDD]), else None."""
    local = version.partition("+")[2]
    match = re.match(r"(g[0-9a-f]{4,40})(?:\.|$)", local)
    return match.group(1) if match else None


def real_dist_info() -> Path:
    """The installed vLLM's dist-info, skipping earlier overlays (found by their marker)."""
    import importlib.metadata as md

    for dist in md.distributions(name="vllm"):
        path = getattr(dist, "_path", None)
        if path is None:
            continue
        path = Path(path)
        if (path.parent / "sitecustomize.py").is_file() and (path / "KVCONFORM_OVERLAY").is_file():
            continue  # an overlay already on sys.path: never copy a copy
        if (path / "METADATA").is_file():
            return path
    raise Cannot(f"no vLLM is installed in this Python ({sys.executable}): run this script with the "
                 "venv's python, e.g. .venv/bin/python scripts/vllm_as_version.py VERSION")


def with_version(metadata: str, version: str) -> str:
    """METADATA with only its Version line changed (the header ends at the first blank line)."""
    lines = metadata.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line in ("\n", "\r\n"):
            break
        if line.startswith("Version:"):
            end = "\r\n" if line.endswith("\r\n") else "\n"
            lines[i] = f"Version: {version}{end}"
            return "".join(lines)
    raise Cannot("the installed vLLM's METADATA has no Version line")


def write_atomic(path: Path, text: str) -> None:
    """Write via a temporary file and a rename: concurrent writers never leave a torn file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; the overlay is read by whoever runs vLLM
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def make_overlay(version: str, directory: Path) -> Path:
    real = real_dist_info()
    metadata = with_version(real.joinpath("METADATA").read_text(encoding="utf-8"), version)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        dist_info = directory / f"vllm-{version}.dist-info"
        # Only one vllm distribution in the overlay: drop any other pretend version's.
        for old in directory.glob("vllm-*.dist-info"):
            if old != dist_info and (old / "KVCONFORM_OVERLAY").is_file():
                for child in old.iterdir():
                    child.unlink()
                old.rmdir()
        dist_info.mkdir(exist_ok=True)
        write_atomic(dist_info / "METADATA", metadata)
        for name in COPIED:
            if (real / name).is_file():
                write_atomic(dist_info / name, (real / name).read_text(encoding="utf-8"))
        write_atomic(dist_info / "INSTALLER", "kvconform-vllm-as-version\n")
        write_atomic(dist_info / "KVCONFORM_OVERLAY",
                     f"pretend version {version} of the vLLM installed at {real}\n")
        write_atomic(directory / "sitecustomize.py", SITECUSTOMIZE.format(
            version=version, version_tuple=version_tuple(version), commit_id=commit_id(version)))
    except OSError as exc:
        raise Cannot(f"cannot write the overlay in {directory}: {exc.strerror or exc}") from None
    return directory


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 4 (argparse's default is 2)
        print(f"vllm_as_version: {message} (usage: vllm_as_version.py VERSION [--dir DIR])", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="vllm_as_version.py",
                     description="Write an overlay that makes the installed vLLM report VERSION; "
                                 "print the PYTHONPATH entry to put first.")
    parser.add_argument("version", metavar="VERSION", help="e.g. 0.34.0.dev12+g1a2b3c4")
    parser.add_argument("--dir", type=Path, default=None,
                        help="where to write the overlay (default: "
                             "${KVCONFORM_CACHE:-~/.cache/kvconform}/vllm-as/VERSION)")
    args = parser.parse_args(argv)
    version = args.version
    if not VERSION_RE.fullmatch(version):
        shown = repr(version[:80]) + ("..." if len(version) > 80 else "")  # repr: one line, always
        print(f"vllm_as_version: {shown} is not a PEP 440 version such as 0.34.0 or "
              "0.34.0.dev12+g1a2b3c4 (digits.digits first)", file=sys.stderr)
        return EXIT_USAGE
    if args.dir is not None:
        directory = args.dir
    else:
        cache = os.environ.get("KVCONFORM_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "kvconform")
        directory = Path(cache) / "vllm-as" / version
    try:
        overlay = make_overlay(version, directory.expanduser().absolute())
    except Cannot as exc:
        print(f"vllm_as_version: {exc}", file=sys.stderr)
        return EXIT_CANNOT
    print(overlay)
    return EXIT_OK


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("vllm_as_version: interrupted", file=sys.stderr)
        sys.exit(130)
