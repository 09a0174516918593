"""A Ray cluster of several nodes on this machine's loopback (127.0.0.1), for tests and CI.

    python scripts/ray_loopback_cluster.py [--nodes 2] [--cpus-per-node 1] [--port 6390] -- COMMAND ...

starts a head node and ``--nodes - 1`` worker nodes, every socket on 127.0.0.1, runs COMMAND
with ``RAY_ADDRESS=127.0.0.1:PORT`` (and ``{address}`` in its arguments replaced by that
address), stops the nodes it started (only those: other Ray instances on the machine are left
alone) and exits with COMMAND's exit code. Run it with the Python of a venv that has
``kvconform[distributed]``: the nodes' tasks import kvconform from there.

A real cluster needs none of this (``ray start`` on each machine). On one machine, Ray turns
127.0.0.1 into the address of the first network interface
(``ray._private.services.resolve_ip_for_localhost``), so nodes would listen on, and talk to,
that address. ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` keeps "localhost" at 127.0.0.1 in every Ray
process, but the same setting makes ``ray start`` refuse to add a worker node; ``node`` below
runs ``ray start`` with that one check told otherwise.
"""

from __future__ import annotations

import argparse
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import types
from typing import Sequence

LOOPBACK = "127.0.0.1"
START_TIMEOUT_S = 120
STARTED = "Ray runtime started."


def node(argv: Sequence[str]) -> int:
    """``ray start ARGV`` (in this process), on loopback only."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # every child resolves localhost to 127.0.0.1
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    import ray._private.ray_constants as ray_constants
    import ray.scripts.scripts as ray_scripts

    # The CLI alone is told that multi-node clusters are enabled, so that it starts a worker node.
    ray_scripts.ray_constants = types.SimpleNamespace(**{**vars(ray_constants), "ENABLE_RAY_CLUSTER": True})
    sys.argv = ["ray", "start", *argv]
    try:
        ray_scripts.main()
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def _start(args: list[str], label: str) -> subprocess.Popen:
    """One node (``ray start ... --block``: the process lives as long as the node), once it says it started."""
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "node", *args, "--block"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    seen: list[str] = []
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            if proc.poll() is not None:
                break
            continue
        seen.append(line.rstrip())
        if STARTED in line:
            return proc
    _stop([proc])
    raise RuntimeError(f"the Ray {label} did not start within {START_TIMEOUT_S} s: {' | '.join(seen[-5:]) or 'no output'}")


def _stop(procs: Sequence[subprocess.Popen]) -> None:
    """Each node's ``ray start --block`` stops its own processes on SIGTERM; what is left is killed."""
    for proc in reversed(procs):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in reversed(procs):
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the node's raylet, store, GCS... in its session
        except (ProcessLookupError, PermissionError):
            pass


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["node"]:
        return node(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=2, help="nodes in all, the head included (default 2)")
    parser.add_argument("--cpus-per-node", type=int, default=1)
    parser.add_argument("--port", type=int, default=0, help="the head's port (default: a free one)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ...")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or args.nodes < 1 or args.cpus_per_node < 1:
        parser.error("expected --nodes >= 1, --cpus-per-node >= 1 and a command after --")
    port = args.port or _free_port()
    address = f"{LOOPBACK}:{port}"
    common = [f"--num-cpus={args.cpus_per_node}", "--object-store-memory=100000000", "--disable-usage-stats",
              f"--node-ip-address={LOOPBACK}"]
    procs: list[subprocess.Popen] = []
    try:
        procs.append(_start(["--head", f"--port={port}", "--include-dashboard=false", *common], "head node"))
        for i in range(1, args.nodes):
            procs.append(_start([f"--address={address}", *common], f"worker node {i}"))
        print(f"ray_loopback_cluster: {args.nodes} node(s) on {address}", file=sys.stderr, flush=True)
        env = dict(os.environ, RAY_ADDRESS=address, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_USAGE_STATS_ENABLED="0")
        return subprocess.run([part.replace("{address}", address) for part in command], env=env).returncode
    except RuntimeError as exc:
        print(f"ray_loopback_cluster: {exc}", file=sys.stderr)
        return 3
    finally:
        _stop(procs)


if __name__ == "__main__":
    sys.exit(main())
