#!/usr/bin/env bash
# The full GPU path: the REAL vLLM 0.33.0 engine on a CUDA GPU, checked against the reference.
#
#   bash scripts/gpu_check.sh                          # every scenario x {MRv1, MRv2} (< 8 min on one H200)
#   bash scripts/gpu_check.sh --scenario fa-b16        # one scenario (repeatable), both runners
#   bash scripts/gpu_check.sh --runner mrv2 --out DIR  # one runner, reports to DIR
#   bash scripts/gpu_check.sh --list                   # the scenarios (no GPU needed)
#
# Each (scenario, runner) runs in its own process (clean GPU memory): vllm.LLM on a tiny
# dummy-weight model with a recording + data-checking KV connector. Reports go to --out,
# else $OUT, else out/gpu-check (git-ignored): <scenario>-<runner>.json per run, summary.json,
# summary.txt, logs/. Sets nothing up: the venv must exist.
#
# KVCONFORM_VENV           venv with vllm==0.33.0 (default: .venv, made by `bash scripts/env.sh`)
# KVCONFORM_GPU_BUDGET_S   total time budget for the runs (default 450); no run starts with < 40 s left
# KVCONFORM_GPU_TIMEOUT_S  per-run limit (default 300)
# KVCONFORM_GPU_JOBS       runs at a time (default 4; a tiny model uses a few GB at most)
#
# Exit: 0 all pass, 1 divergence or failed data check, 2 interrupted, 3 a run gave no
# verdict (error/timeout/skipped), 4 usage, 5 nothing ran (no GPU, no venv: one line on stderr),
# 124 the hard stop (budget + 25 s) fired.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${KVCONFORM_VENV:-$root/.venv}"
prefix="kvconform gpu-check"

for arg in "$@"; do
  case "$arg" in
    --list|-h|--help)
      py="$venv/bin/python"; [ -x "$py" ] || py="$(command -v python3)"
      cd "$root" && exec "$py" -m conformance.gpu_check "$@" ;;
  esac
done

if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "$prefix: nothing ran: no CUDA GPU (nvidia-smi is not on PATH)" >&2
  exit 5
fi
python="$venv/bin/python"
if [ ! -x "$python" ]; then
  echo "$prefix: nothing ran: no venv at $venv (create it with: bash scripts/env.sh true; KVCONFORM_VENV overrides the path)" >&2
  exit 5
fi
budget="${KVCONFORM_GPU_BUDGET_S:-450}"
prev=""
for arg in "$@"; do  # --budget-s on the command line moves the hard stop too
  case "$arg" in --budget-s=*) budget="${arg#--budget-s=}" ;; esac
  [ "$prev" = "--budget-s" ] && budget="$arg"
  prev="$arg"
done
budget_s="${budget%.*}"
hard=$(( ${budget_s:-0} + 25 ))
cd "$root"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
if command -v timeout >/dev/null 2>&1; then
  exec timeout -k 15 "$hard" "$python" -m conformance.gpu_check "$@"
fi
exec "$python" -m conformance.gpu_check "$@"
