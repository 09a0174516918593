#!/usr/bin/env bash
# Make (or reuse) the venv in which LMCache's own multi-process code runs on CPU for
# gpu_impl/connectors/lmcache_mp.py; print its path last.
#
#   bash scripts/lmcache_env.sh                  # create/reuse the venv, print its path
#   bash scripts/lmcache_env.sh CMD [ARGS...]    # ... then run CMD with the venv on PATH
#   bash scripts/lmcache_env.sh python -m pytest tests/connectors/test_lmcache_mp.py
#
# vLLM 0.33.0's LMCacheMPConnector is mostly LMCache's code (the connector class itself
# resolves to lmcache.integration.vllm.lmcache_mp_connector when lmcache is installed,
# and all interpretation of the registered tensors happens in LMCache's server). The
# lmcache wheel pins numpy<=2.2.6, protobuf<7 and a CUDA stack (cupy-cuda13x,
# cuda-python) that the main venv's vLLM tree does not share, so it gets its own venv,
# built like scripts/release_env.sh builds a release venv: a CPU build of torch, the vLLM
# wheel and the lmcache wheel without their dependency trees, and only the packages the
# modules below import (then whatever a fresh import still reports missing, one at a
# time). LMCache's compiled CUDA ops (lmcache.cuda_ops) do not load without CUDA; the
# adapter runs LMCache's torch (CPU) paths instead. First run: ~6 min and ~3.3 GB (2.3 GB
# beside the release venvs, whose identical files hardlink shares); later runs check a stamp.
#
# KVCONFORM_LMCACHE_VENV  where the venv lives (default: ~/.cache/kvconform/venv-lmcache-0.5.6)
# KVCONFORM_PYTHON        the interpreter that creates it (default: python3)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
lmcache_version="0.5.6"
vllm_version="0.33.0"
torch_release="2.13.0"  # the CPU build this machine has on disk (pip takes it from there)
cache="$HOME/.cache/kvconform"
venv="${KVCONFORM_LMCACHE_VENV:-$cache/venv-lmcache-$lmcache_version}"
python="${KVCONFORM_PYTHON:-python3}"
stamp="$venv/.kvconform-lmcache-stamp"
want="lmcache==$lmcache_version vllm==$vllm_version torch==$torch_release $root $(cat "$root/pyproject.toml" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-16)"

fail() { echo "kvconform-lmcache: $*" >&2; exit 3; }
pip() { "$venv/bin/python" -m pip --quiet --disable-pip-version-check "$@"; }

# Pinned: what vLLM 0.33.0's layout/connector modules and LMCache 0.5.6's multi-process
# modules import at module level, at versions both accept (lmcache: numpy<=2.2.6,
# protobuf<7, prometheus_client<=0.24.1, transformers>=5.4).
DEPS=(numpy==2.2.6 regex cachetools psutil requests tqdm py-cpuinfo "transformers==5.20.2" tokenizers aiohttp
  openai pydantic "prometheus_client==0.24.1" pillow msgspec gguf pyyaml pyzmq einops cloudpickle pybase64 cbor2
  openai-harmony uvloop "protobuf==6.33.5" sortedcontainers blake3 safetensors nvtx aiofile aiofiles httpx
  "opentelemetry-api==1.40.0" "opentelemetry-sdk==1.40.0" fastapi uvicorn)
MODULES=(vllm.config vllm.v1.worker.gpu_model_runner vllm.v1.attention.backends.flash_attn
  vllm.v1.attention.backends.flashinfer
  vllm.distributed.kv_transfer.kv_connector.v1.lmcache_mp_connector
  lmcache.integration.vllm.vllm_multi_process_adapter
  lmcache.v1.multiprocess.server lmcache.v1.gpu_connector.utils)

if [ "$(head -n 1 "$stamp" 2>/dev/null || true)" != "$want" ]; then
  start=$(date +%s)
  mkdir -p "$(dirname "$venv")"
  if [ ! -x "$venv/bin/python" ]; then
    echo "kvconform-lmcache: creating $venv" >&2
    "$python" -m venv "$venv" || fail "could not create a venv at $venv with $python"
  fi
  echo "kvconform-lmcache: installing torch $torch_release (CPU), vLLM $vllm_version and lmcache $lmcache_version without their dependency trees into $venv" >&2
  pip install "torch==$torch_release" || fail "pip install torch==$torch_release failed"
  pip install --no-deps "vllm==$vllm_version" "lmcache==$lmcache_version" \
    || fail "pip install --no-deps vllm==$vllm_version lmcache==$lmcache_version failed"
  pip install "${DEPS[@]}" "torch==$torch_release" || fail "pip install of the pinned dependencies failed"
  pip install --no-deps -e "$root"
  pip install "pytest>=8" "hypothesis>=6.100" "rich>=13" "torch==$torch_release"

  # Whatever these modules import beyond DEPS: install it (no dependency tree) and retry.
  declare -A PACKAGE_OF=([cv2]=opencv-python-headless [yaml]=pyyaml [zmq]=pyzmq [cpuinfo]=py-cpuinfo [PIL]=pillow
    [google]=protobuf [dotenv]=python-dotenv [flashinfer]=flashinfer-python [tvm_ffi]=apache-tvm-ffi
    [pynvml]=nvidia-ml-py [opentelemetry]=opentelemetry-api [multipart]=python-multipart [_cffi_backend]=cffi)
  last_missing=""
  for attempt in $(seq 1 40); do
    if out=$(cd "$root" && CUDA_VISIBLE_DEVICES="" "$venv/bin/python" -c "
import importlib, sys
from gpu_impl.vllm_cpu import shims
shims.prepare_env()
for name in sys.argv[1:]:
    importlib.import_module(name)
" "${MODULES[@]}" 2>&1); then
      break
    fi
    missing=$(printf '%s\n' "$out" | grep -oP "No module named '\K[^'.]+" | tail -n 1 || true)
    if [ -z "$missing" ] || [ "$attempt" = 40 ]; then
      fail "the LMCache modules do not import in $venv: $(printf '%s\n' "$out" | tail -n 1)"
    fi
    package="${PACKAGE_OF[$missing]:-$missing}"
    [ "$missing" != "$last_missing" ] || fail "'$missing' is still missing after installing '$package'"
    last_missing="$missing"
    echo "kvconform-lmcache: also installing $package" >&2
    pip install --no-deps "$package" || fail "pip install --no-deps $package failed"
  done
  # Identical files (torch, triton, numpy wheels) become one copy with the release venvs.
  if command -v hardlink > /dev/null; then
    hardlink -q -c "$cache"/venv-release-* "$venv" > /dev/null 2>&1 || true
  fi
  size=$(du -sh "$venv" | cut -f1)
  printf '%s\n%s\n' "$want" "installed in $(( $(date +%s) - start )) s, $size" > "$stamp"
  echo "kvconform-lmcache: ready in $venv ($size, $(( $(date +%s) - start )) s)" >&2
fi
if [ $# -eq 0 ]; then
  echo "$venv"
  exit 0
fi
export PATH="$venv/bin:$PATH" VIRTUAL_ENV="$venv"
cd "$root"
exec "$@"
