#!/usr/bin/env bash
# Run a command with the installed vLLM reporting another version (nothing in the venv changes).
#
#   bash scripts/vllm_as_version.sh 0.34.0.dev12+g1a2b3c4 .venv/bin/kvconform run
#   bash scripts/vllm_as_version.sh 0.34.0.dev12+g1a2b3c4 .venv/bin/python -m pytest -n 2 tests/vllm
#
# For testing kvconform against unreleased vLLM builds (vLLM CI's 0.34.0.devN+gHASH) without
# building one. scripts/vllm_as_version.py writes the overlay (a vllm-VERSION.dist-info and a
# sitecustomize.py; default ${KVCONFORM_CACHE:-~/.cache/kvconform}/vllm-as/VERSION); this runs
# COMMAND with it first on PYTHONPATH (an existing PYTHONPATH is kept after it), so every
# Python process COMMAND starts (xdist workers, spawn children) sees the pretend version:
# importlib.metadata.version("vllm") and vllm.__version__ both read VERSION.
#
# KVCONFORM_VLLM_AS_DIR  where to write the overlay (default above)
# KVCONFORM_PYTHON       the Python whose vLLM is meant (default: COMMAND's own python when
#                        COMMAND is a venv's bin/ program, else $VIRTUAL_ENV's, else this
#                        checkout's .venv, else python3)
# Exit status: COMMAND's; 4 bad usage or VERSION; 3 the overlay cannot be made.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

if [ $# -lt 2 ]; then
  echo "usage: bash scripts/vllm_as_version.sh VERSION COMMAND [ARGS...]   (e.g. 0.34.0.dev12+g1a2b3c4 .venv/bin/kvconform run)" >&2
  exit 4
fi
version="$1"; shift

python="${KVCONFORM_PYTHON:-}"
if [ -z "$python" ]; then
  cmd_path="$(command -v -- "$1" 2>/dev/null || true)"
  if [ -n "$cmd_path" ] && [ -x "$(dirname -- "$cmd_path")/python" ] && [ -f "$(dirname -- "$cmd_path")/../pyvenv.cfg" ]; then
    python="$(dirname -- "$cmd_path")/python"
  elif [ -n "${VIRTUAL_ENV:-}" ] && [ -x "$VIRTUAL_ENV/bin/python" ]; then
    python="$VIRTUAL_ENV/bin/python"
  elif [ -x "$root/.venv/bin/python" ]; then
    python="$root/.venv/bin/python"
  else
    python="python3"
  fi
fi

dir_args=()
if [ -n "${KVCONFORM_VLLM_AS_DIR:-}" ]; then
  dir_args=(--dir "$KVCONFORM_VLLM_AS_DIR")
fi
overlay="$("$python" "$root/scripts/vllm_as_version.py" "$version" "${dir_args[@]}")" || exit $?

export PYTHONPATH="$overlay${PYTHONPATH:+:$PYTHONPATH}"
echo "vllm_as_version: vLLM reports $version (overlay $overlay first on PYTHONPATH)" >&2
exec "$@"
