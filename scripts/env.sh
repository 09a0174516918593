#!/usr/bin/env bash
# Make (or reuse) kvconform's virtual environment, then run a command inside it.
#
#   bash scripts/env.sh kvconform run      # the main job: conformance report against the target release
#   bash scripts/env.sh pytest -n 2        # the tests
#
# KVCONFORM_VENV   where the venv lives (default: .venv in the project)
# KVCONFORM_EXTRAS extras to install (default: vllm,test,cli; "test,cli" gives a vLLM-free env)
# KVCONFORM_VLLM   the vLLM release the vllm extra installs (default: the target release,
#                  reference/releases.py TARGET_RELEASE; tests/reference/test_releases.py checks it)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${KVCONFORM_VENV:-$root/.venv}"
extras="${KVCONFORM_EXTRAS:-vllm,test,cli}"
vllm_release="${KVCONFORM_VLLM:-0.33.0}"
python="${KVCONFORM_PYTHON:-python3}"

if [ $# -eq 0 ]; then
  echo "usage: bash scripts/env.sh COMMAND [ARGS...]   (e.g. kvconform run, or pytest -n 2)" >&2
  exit 4
fi

# Reinstall only when the project definition, its location or the extras changed: an
# editable install of vLLM's dependency tree takes minutes, a no-op check should not.
stamp="$venv/.kvconform-stamp"
want="$(cat "$root/pyproject.toml" | sha256sum | cut -c1-16) $root $extras vllm==$vllm_release"
if [ ! -x "$venv/bin/python" ]; then
  echo "kvconform: creating $venv" >&2
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
fi
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
  pins=()
  if [[ ",$extras," == *",vllm,"* ]]; then
    pins=("vllm==$vllm_release")
  fi
  echo "kvconform: installing kvconform[$extras] ${pins[*]:-} into $venv (vLLM 0.33.0 takes ~5 min and ~10 GB the first time)" >&2
  "$venv/bin/python" -m pip install --quiet -e "$root[$extras]" "${pins[@]}"
  if [[ ",$extras," == *",vllm,"* ]]; then
    # A later install can swap torch for an incompatible wheel: check the whole import
    # chain the drivers use (gpu_impl/vllm_api.py), here, not mid-test.
    if ! (cd "$root" && "$venv/bin/python" -c "
from gpu_impl.vllm_cpu import shims
shims.prepare_env()
import torch, vllm
from gpu_impl.vllm_api import api_problem
problem = api_problem('layout')
assert problem is None, problem
") >/dev/null 2>"$venv/.import-error"; then
      echo "kvconform: vLLM $vllm_release cannot be driven from $venv: $(tail -n 1 "$venv/.import-error")" >&2
      exit 3
    fi
  fi
  echo "$want" > "$stamp"
fi
export PATH="$venv/bin:$PATH" VIRTUAL_ENV="$venv"
cd "$root"
exec "$@"
