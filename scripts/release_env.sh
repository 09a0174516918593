#!/usr/bin/env bash
# Make (or reuse) a cached venv holding one vLLM release and kvconform; print its path last.
#
#   bash scripts/release_env.sh 0.21.0          # -> ~/.cache/kvconform/venv-release-0.21.0
#   "$(bash scripts/release_env.sh 0.22.0 | tail -n 1)/bin/kvconform" run --case flashinfer-b128-k64
#
# The lightest install that runs vLLM's layout code on a CPU (about 2.8 GB instead of the
# ~10 GB of `pip install vllm==X`): a CPU build of torch, the vLLM wheel without its
# dependency tree, and only the packages the modules the drivers import need (LAYOUT_DEPS,
# then whatever a fresh `import` of those modules still reports missing, one at a time).
# vLLM's compiled kernels (vllm._C) do not load without CUDA; the layout code does not
# need them.
#
# KVCONFORM_RELEASE_CACHE  where the venvs live (default: ~/.cache/kvconform)
# KVCONFORM_RELEASE_TORCH  the torch release to install (default: 2.13.0, whose CPU build
#                          this machine has on disk; pip takes it from there)
# KVCONFORM_WHEELS         a folder of already-downloaded vLLM wheels (pip --find-links)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
version="${1:-}"
if ! [[ "$version" =~ ^0\.[0-9]+\.[0-9]+$ ]]; then
  echo "usage: bash scripts/release_env.sh VERSION   (a vLLM release such as 0.21.0; got '${version}')" >&2
  exit 4
fi
cache="${KVCONFORM_RELEASE_CACHE:-$HOME/.cache/kvconform}"
venv="$cache/venv-release-$version"
torch_release="${KVCONFORM_RELEASE_TORCH:-2.13.0}"
python="${KVCONFORM_PYTHON:-python3}"
stamp="$venv/.kvconform-release-stamp"
# A changed pyproject.toml or a changed script (e.g. another module to import) updates the venv.
want="vllm==$version torch==$torch_release $root $(cat "$root/pyproject.toml" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-16)"
# What vLLM's layout, runner and connector modules import at module level (read off
# vLLM 0.21.0 and 0.22.0); anything a release needs beyond this is found below.
LAYOUT_DEPS=(regex cachetools psutil numpy requests tqdm py-cpuinfo transformers tokenizers aiohttp openai
  pydantic prometheus_client pillow llguidance xgrammar msgspec gguf pyyaml pyzmq einops cloudpickle pybase64
  cbor2 openai-harmony uvloop)
MODULES=(vllm vllm.config vllm.v1.core.kv_cache_utils vllm.v1.kv_cache_interface vllm.v1.worker.gpu_model_runner
  vllm.v1.worker.block_table vllm.v1.attention.backends.flashinfer vllm.v1.attention.backends.flash_attn
  vllm.distributed.kv_transfer.kv_connector.v1.mooncake.mooncake_connector
  # A family's own layer class (0.30 on; an older release skips it): compressed-tensors, loguru.
  vllm.models.kimi_k3.nvidia.mla)

pip() { "$venv/bin/python" -m pip --quiet --disable-pip-version-check "$@"; }

if [ "$(cat "$stamp" 2>/dev/null | head -n 1 || true)" = "$want" ]; then
  echo "$venv"
  exit 0
fi
mkdir -p "$cache"
# One install at a time per cache (Ray tasks of `kvconform matrix --ray` may start several on
# one node): the others wait, then find the venv made or make theirs with the cache quiet
# (the hardlink pass below reads every venv).
if command -v flock > /dev/null; then
  exec 9> "$cache/.release-env.lock"
  flock 9
  if [ "$(cat "$stamp" 2>/dev/null | head -n 1 || true)" = "$want" ]; then
    echo "$venv"
    exit 0
  fi
fi
start=$(date +%s)
if [ ! -x "$venv/bin/python" ]; then
  echo "kvconform: creating $venv" >&2
  "$python" -m venv "$venv"
fi
echo "kvconform: installing torch $torch_release (CPU) and vLLM $version without its dependency tree into $venv" >&2
pip install "torch==$torch_release"
links=()
if [ -n "${KVCONFORM_WHEELS:-}" ]; then links=(--find-links "$KVCONFORM_WHEELS"); fi
pip install --no-deps "${links[@]}" "vllm==$version"
pip install "${LAYOUT_DEPS[@]}" "torch==$torch_release"
pip install --no-deps -e "$root"
pip install "pytest>=8" "pytest-xdist>=3.5" "hypothesis>=6.100" "rich>=13" "torch==$torch_release"

# Whatever this release imports beyond LAYOUT_DEPS: install it and try again.
declare -A PACKAGE_OF=([cv2]=opencv-python-headless [yaml]=pyyaml [zmq]=pyzmq [cpuinfo]=py-cpuinfo [PIL]=pillow
  [google]=protobuf [sklearn]=scikit-learn [dotenv]=python-dotenv [flashinfer]=flashinfer-python [tvm_ffi]=apache-tvm-ffi [pynvml]=nvidia-ml-py
  [opentelemetry]=opentelemetry-api [multipart]=python-multipart [email_validator]=email-validator)
for attempt in $(seq 1 30); do
  if out=$(cd "$root" && CUDA_VISIBLE_DEVICES="" "$venv/bin/python" -c "
import importlib, sys
from gpu_impl.vllm_cpu import shims
shims.prepare_env()
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split('.')[0] == 'vllm':
            continue  # a vLLM module this release does not have: the drivers' probe says so
        raise
" "${MODULES[@]}" 2>&1); then
    break
  fi
  missing=$(printf '%s\n' "$out" | grep -oP "No module named '\K[^'.]+" | tail -n 1 || true)
  if [ -z "$missing" ] || [ "$attempt" = 30 ]; then
    echo "kvconform: vLLM $version does not import in $venv: $(printf '%s\n' "$out" | tail -n 1)" >&2
    exit 3
  fi
  package="${PACKAGE_OF[$missing]:-$missing}"
  if [ "$missing" = "${last_missing:-}" ]; then
    echo "kvconform: vLLM $version needs the module '$missing', which installing '$package' did not provide" >&2
    exit 3
  fi
  last_missing="$missing"
  # The release's own pin when it names the package (flashinfer-python==0.6.11.post2 for
  # 0.22.0); without its dependency tree: what that package imports is found the same way.
  spec=$("$venv/bin/python" -c "
import importlib.metadata as md, re, sys
want = re.sub(r'[-_.]+', '-', sys.argv[1]).lower()
for req in md.requires('vllm') or []:
    name = re.split(r'[<>=!~;\[ ]', req, maxsplit=1)[0]
    if re.sub(r'[-_.]+', '-', name).lower() == want and 'extra ==' not in req:
        print(req.split(';')[0].replace(' ', '')); break
else:
    print(sys.argv[1])
" "$package")
  echo "kvconform: vLLM $version also needs $spec" >&2
  pip install --no-deps "$spec"
done
# Release venvs share most files (torch, triton, numpy are the same wheels, extracted at other times: -c compares content only): where
# util-linux's hardlink is available, identical files become one copy on disk (about 2 GB
# saved per extra release). pip replaces files rather than writing into them, so an upgrade
# in one venv never changes another.
if command -v hardlink > /dev/null; then
  hardlink -q -c "$cache"/venv-release-* > /dev/null 2>&1 || true
fi
size=$(du -sh "$venv" | cut -f1)
printf '%s\n%s\n' "$want" "installed in $(( $(date +%s) - start )) s, $size" > "$stamp"
echo "kvconform: vLLM $version ready in $venv ($size, $(( $(date +%s) - start )) s)" >&2
echo "$venv"
