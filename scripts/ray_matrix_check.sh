#!/usr/bin/env bash
# The release matrix on a Ray cluster equals the serial matrix (CI, .ci/run).
#
#   bash scripts/ray_matrix_check.sh [RELEASES] [KVCONFORM_BIN]
#
# RELEASES (default 0.20.0,0.21.0,0.22.0): each gets its venv from scripts/release_env.sh first.
# KVCONFORM_BIN: the bin folder of a venv with kvconform[distributed] (default: .venv/bin).
# Runs `kvconform matrix` once serially, once with --ray on a head and a worker node on
# 127.0.0.1 (scripts/ray_loopback_cluster.py), and compares the two histories without what
# may differ (conformance.matrix.comparable: when, how long, on which node). Writes both
# under $KVCONFORM_RAY_CHECK_OUT (default: ~/.cache/kvconform/ray-matrix-check).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
releases="${1:-0.20.0,0.21.0,0.22.0}"
bin="${2:-$root/.venv/bin}"
out="${KVCONFORM_RAY_CHECK_OUT:-$HOME/.cache/kvconform/ray-matrix-check}"
mkdir -p "$out"
for version in ${releases//,/ }; do
  bash scripts/release_env.sh "$version" > /dev/null
done
export CUDA_VISIBLE_DEVICES=""
start=$(date +%s)
"$bin/kvconform" matrix --releases "$releases" --json "$out/serial.json" --markdown "$out/serial.md" > "$out/serial.log" 2>&1 \
  && serial=0 || serial=$?
middle=$(date +%s)
"$bin/python" scripts/ray_loopback_cluster.py --nodes 2 -- \
  "$bin/kvconform" matrix --releases "$releases" --ray "{address}" --json "$out/ray.json" --markdown "$out/ray.md" > "$out/ray.log" 2>&1 \
  && ray=0 || ray=$?
end=$(date +%s)
grep "^kvconform: matrix: vLLM .*(on " "$out/ray.log" || true
echo "kvconform: matrix of $releases: serial exit $serial in $(( middle - start )) s; on Ray (2 nodes on 127.0.0.1) exit $ray in $(( end - middle )) s"
if [ "$serial" != 0 ] || [ "$ray" != 0 ]; then
  echo "kvconform: both matrices must pass (exit 0): serial $serial, Ray $ray" >&2
  tail -n 20 "$out/serial.log" "$out/ray.log" >&2
  exit 1
fi
"$bin/python" - "$out/serial.json" "$out/ray.json" <<'PY'
import json, sys
from conformance.matrix import comparable

serial, ray = (comparable(json.load(open(path))) for path in sys.argv[1:3])
if serial != ray:
    for a, b in zip(serial["releases"], ray["releases"]):
        if a != b:
            keys = sorted(k for k in set(a["run"]) | set(b["run"]) if a["run"].get(k) != b["run"].get(k))
            print(f"kvconform: vLLM {a['version']}: the Ray matrix differs from the serial one in run fields {keys} "
                  f"or its checks", file=sys.stderr)
    sys.exit("kvconform: the release history on Ray is not the serial one")
print(f"kvconform: the release history on Ray equals the serial one ({len(serial['releases'])} releases, "
      f"{sum(len(r['run'].get('divergences', [])) for r in serial['releases'])} divergences, "
      f"{len(serial['transitions'])} transitions)")
PY
