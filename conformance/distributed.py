"""``--ray``: the release matrix and the shards of one run as tasks on a Ray cluster.

An optional extra (``pip install 'kvconform[distributed]'``). Each task runs on whichever node
has a free CPU, in that node's own kvconform installation (every node runs ``ray start`` from a
venv with kvconform installed, so tasks import this module there):

- ``kvconform matrix --ray``: one task per release. It checks the release exactly as the serial
  matrix does (``conformance.matrix.check_release``: ``kvconform run`` and the connector checks,
  each in its own process of that release's venv), in the venv ``--venv`` names where that node
  has it, else the one ``scripts/release_env.sh`` makes on that node. The driver builds the same
  release history from what the tasks return (``conformance.matrix.history``).
- ``kvconform run --ray``: one task per shard (``--shard K/N``, ``conformance.shards``). Each
  runs ``python -m conformance.cli run ... --shard K/N`` in that node's Python, so against that
  node's vLLM; case and expectation files travel with the task. The driver merges the shards'
  reports (``conformance.merge``: every part validated, all shards there) into one report.

Ray is imported only here, and only when ``--ray`` is given: without it installed, ``--ray``
says so in one line (exit 4).
"""

from __future__ import annotations

import logging
import os
import re
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

ROOT = Path(__file__).resolve().parents[1]

RAY_MISSING = "--ray needs Ray, which is not installed in this Python: pip install 'kvconform[distributed]'"
"""The one line ``--ray`` gives where Ray is not installed."""

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")

SHARD_TASK_TAIL_LINES = 5
"""Lines of a failed shard's stderr that its one-line failure quotes (the last ones)."""


class RayUnavailable(Exception):
    """Ray is not installed, or the cluster cannot be reached (one line)."""


class RayMissing(RayUnavailable):
    """Ray is not installed in this Python."""


class RayUsageError(ValueError):
    """A ``--ray`` address that is not one (one line naming it)."""


def parse_address(text: str) -> str | None:
    """``--ray``'s optional ADDRESS: None for Ray's default (``RAY_ADDRESS``, else a new local
    Ray instance), ``auto`` (the cluster ``ray start`` made on this machine), ``HOST:PORT`` of a
    cluster's head, or a Ray Client address ``ray://HOST:PORT``."""
    if text in ("", "local"):
        return None
    if text == "auto":
        return text
    match = re.fullmatch(r"(ray://)?(\[[0-9a-fA-F:]+\]|[A-Za-z0-9.-]+):(\d{1,5})", text)
    if match is None or not 1 <= int(match.group(3)) <= 65535:
        raise RayUsageError(f"--ray {text!r} is not a Ray address: expected HOST:PORT (e.g. 127.0.0.1:6379), "
                            "ray://HOST:PORT, auto, or nothing for a local Ray instance")
    return text


def _is_loopback(address: str | None) -> bool:
    """A cluster on this machine's loopback: a local instance, or a head on 127.0.0.1."""
    if address is None:
        address = os.environ.get("RAY_ADDRESS")
    if address in (None, "", "local"):
        return True
    if address == "auto":
        return False
    host = address.removeprefix("ray://").rpartition(":")[0]
    return host in LOOPBACK_HOSTS


def _import_ray(address: str | None) -> Any:
    if _is_loopback(address):
        # Ray turns 127.0.0.1 into the address of this machine's first network interface
        # (ray._private.services.resolve_ip_for_localhost), so a driver of a cluster on
        # loopback would knock at an address the cluster does not listen on. This setting
        # makes "localhost" mean 127.0.0.1 (ray._private.ray_constants.ENABLE_RAY_CLUSTER).
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # never report usage to anyone
    try:
        import ray
    except ImportError:
        raise RayMissing(RAY_MISSING) from None
    return ray


@dataclass(frozen=True)
class Cluster:
    """A Ray connection made by ``connect``."""

    ray: Any
    """The ``ray`` module, initialised."""
    address: str
    """Where it is: the address given, or ``local`` for a Ray instance started for this run."""
    cpus: int
    """CPUs the cluster has in all (the default number of shard tasks)."""
    nodes: int
    """Nodes alive when the run started."""

    def describe(self) -> str:
        return f"Ray cluster {self.address} ({self.nodes} node(s), {self.cpus} CPU(s))"


CONNECT_TIMEOUT_S = 5.0
"""How long a cluster's head may take to accept a connection before ``--ray`` gives up."""


def _reachable(address: str) -> str | None:
    """None if something accepts TCP connections at HOST:PORT, else why not. Ray itself retries
    an unreachable head for minutes, printing a line every few seconds."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        return f"nothing accepts connections at {address} ({exc.strerror or type(exc).__name__}); is the cluster's head running there?"
    return None


def connect(address: str | None) -> Cluster:
    """Connect to the cluster at ``address`` (``parse_address``'s result), or start a local one."""
    ray = _import_ray(address)
    explicit = address if address not in (None, "auto") else (os.environ.get("RAY_ADDRESS") if address is None else None)
    if explicit and explicit not in ("auto", "local"):
        problem = _reachable(explicit)
        if problem is not None:
            raise RayUnavailable(f"could not connect to Ray: {problem}")
    options: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.ERROR}
    if address is None and not os.environ.get("RAY_ADDRESS"):
        # A Ray instance for this run only: no dashboard, a small object store (tasks return JSON).
        options.update(include_dashboard=False, object_store_memory=200 * 1024 * 1024)
    try:
        ray.init(address=address, **options)
    except Exception as exc:  # noqa: BLE001 - Ray raises ConnectionError, RuntimeError, ValueError...
        where = address or os.environ.get("RAY_ADDRESS") or "a local Ray instance"
        raise RayUnavailable(f"could not connect to {where}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
    alive = [n for n in ray.nodes() if n.get("Alive")]
    cpus = int(ray.cluster_resources().get("CPU", 0))
    return Cluster(ray, address or os.environ.get("RAY_ADDRESS") or "local", max(cpus, 1), len(alive))


def _node() -> dict[str, str]:
    """Where a task ran: the Ray node id, its address, its host name."""
    import ray

    return {"node": ray.get_runtime_context().get_node_id()[:12], "address": ray.util.get_node_ip_address(),
            "host": socket.gethostname()}


def _gather(cluster: Cluster, refs: Sequence[Any], on_done: Callable[[int, Any], None]) -> list[Any]:
    """Every task's result, in ``refs`` order; ``on_done(i, result)`` as each one finishes.
    An interrupt cancels the tasks still running."""
    ray = cluster.ray
    results: list[Any] = [None] * len(refs)
    index = {ref: i for i, ref in enumerate(refs)}
    pending = list(refs)
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                try:
                    result = ray.get(ref)
                except Exception as exc:  # noqa: BLE001 - a task that died (its node lost, an import error there)
                    result = {"error": f"the task failed on the cluster: {type(exc).__name__}: {_last_line(str(exc))}"}
                results[index[ref]] = result
                on_done(index[ref], result)
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)
    return results


def where(result: Mapping[str, Any]) -> str:
    """Where a task ran, for a person: host and Ray node."""
    seen = result.get("where") or {}
    return f"{seen.get('host', '?')}, node {seen.get('node', '?')}"


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


# --------------------------------------------------------------------------- the release matrix


def check_release_task(version: str, venv_hint: str | None, no_expectations: bool, profile: str = "named") -> dict[str, Any]:
    """A Ray task: one release checked on this node (``conformance.matrix.check_release``)."""
    from conformance import matrix

    node = _node()
    try:
        hinted = Path(venv_hint) if venv_hint else None
        venv = hinted if hinted is not None and (hinted / "bin" / "kvconform").exists() else matrix.release_venv(version)
        with tempfile.TemporaryDirectory(prefix="kvconform-matrix-") as tmp:
            release = matrix.check_release(version, venv, Path(tmp), no_expectations=no_expectations, profile=profile)
    except RuntimeError as exc:  # scripts/release_env.sh failed on this node
        return {"error": str(exc), "where": node}
    return {"release": release, "where": node}


def matrix_on_ray(versions: Sequence[str], venvs: Mapping[str, Path], address: str | None, *,
                  no_expectations: bool = False, profile: str = "named", say: Callable[[str], None]) -> dict[str, Any]:
    """The release history of ``versions``, one Ray task per release (raises RayUnavailable,
    or RuntimeError naming the release and node whose venv could not be made)."""
    cluster = connect(address)
    try:
        say(f"kvconform: matrix: {len(versions)} release(s) as Ray tasks on {cluster.describe()}")
        task = cluster.ray.remote(num_cpus=1, max_retries=0)(check_release_task)
        refs = [task.remote(v, str(venvs[v]) if v in venvs else None, no_expectations, profile) for v in versions]

        def done(i: int, result: Mapping[str, Any]) -> None:
            host = where(result)
            if "release" in result:
                from conformance.matrix import release_line

                say(f"{release_line(result['release'])} (on {host})")
            else:
                say(f"kvconform: matrix: vLLM {versions[i]} (on {host}): {result['error']}")

        results = _gather(cluster, refs, done)
    finally:
        cluster.ray.shutdown()
    failed = [(v, r) for v, r in zip(versions, results) if "release" not in r]
    if failed:
        version, result = failed[0]
        raise RuntimeError(f"vLLM {version} on {(result.get('where') or {}).get('host', 'the cluster')}: {result['error']}")
    from conformance.matrix import history

    doc = history([r["release"] for r in results], no_expectations=no_expectations)
    doc["ray"] = {"address": cluster.address, "nodes": {v: r["where"] for v, r in zip(versions, results)}}
    return doc


# --------------------------------------------------------------------------- shards of one run


@dataclass(frozen=True)
class ShippedFile:
    """A file a shard's command line names, carried to the node that runs it."""

    name: str
    """Its name in the task's temporary folder (its original base name, numbered)."""
    text: str
    """Its contents."""


def run_arguments(args: Any) -> list[Any]:
    """``kvconform run``'s arguments for one shard, rebuilt from the parsed command line:
    named cases as names, case and expectation files as ``ShippedFile``s (a node has its own
    file system). Without --shard, --json, --ray: each task adds its own shard and report."""
    out: list[Any] = []

    def file_or_name(value: str, kind: str, i: int) -> Any:
        path = Path(value)
        if path.is_file():
            return ShippedFile(f"{kind}-{i}-{path.name}", path.read_text(encoding="utf-8"))
        return value

    for i, case in enumerate(args.case or ()):
        out += ["--case", file_or_name(case, "case", i)]
    for i, path in enumerate(args.expectations or ()):
        out += ["--expectations", file_or_name(path, "expectations", i)]
    for backend in args.backend or ():
        out += ["--backend", backend]
    for model in args.model or ():
        out += ["--model", model]
    out += ["--profile", args.profile, "--seed", str(args.seed), "--workers", str(args.workers)]
    if args.schedules is not None:
        out += ["--schedules", str(args.schedules)]
    for flag in ("contract_only", "no_shipped_expectations", "no_expectations"):
        if getattr(args, flag):
            out.append("--" + flag.replace("_", "-"))
    return out


def run_shard_task(arguments: Sequence[Any], shard: str) -> dict[str, Any]:
    """A Ray task: ``kvconform run ARGUMENTS --shard SHARD`` on this node, in its own process;
    its exit code, its report's text (None if it wrote none) and the tail of its stderr."""
    node = _node()
    with tempfile.TemporaryDirectory(prefix="kvconform-shard-") as tmp:
        argv = []
        for arg in arguments:
            if isinstance(arg, ShippedFile):
                path = Path(tmp) / arg.name
                path.write_text(arg.text, encoding="utf-8")
                arg = str(path)
            argv.append(arg)
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "conformance.cli", "run", *argv, "--shard", shard, "--json", str(report)]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        text = report.read_text(encoding="utf-8") if report.exists() else None
    tail = [line for line in proc.stderr.splitlines() if line.strip()][-SHARD_TASK_TAIL_LINES:]
    return {"exit": proc.returncode, "report": text, "stderr": tail, "where": node}


def run_on_ray(arguments: Sequence[Any], tasks: int | None, address: str | None, workdir: Path, *,
               selection_size: int, say: Callable[[str], None]) -> tuple[list[Path], list[dict[str, Any]]]:
    """Run the shards of one selection as Ray tasks (``tasks`` of them, default one per CPU of
    the cluster, never more than the cases); each part's report written to ``workdir``. Returns
    the reports' paths and every task's outcome (exit, stderr, where; the report left out)."""
    cluster = connect(address)
    try:
        count = max(1, min(tasks or cluster.cpus, selection_size))
        say(f"kvconform: {selection_size} case(s) as {count} shard(s) on {cluster.describe()}")
        task = cluster.ray.remote(num_cpus=1, max_retries=0)(run_shard_task)
        refs = [task.remote(list(arguments), f"{k}/{count}") for k in range(1, count + 1)]

        def done(i: int, result: Mapping[str, Any]) -> None:
            host = where(result)
            say(f"kvconform: shard {i + 1}/{count} (on {host}): exit {result.get('exit', '?')}"
                + (f": {result['error']}" if "error" in result else ""))

        results = _gather(cluster, refs, done)
    finally:
        cluster.ray.shutdown()
    paths = []
    for k, result in enumerate(results, start=1):
        if result.get("report") is not None:
            path = workdir / f"shard-{k}-of-{count}.json"
            path.write_text(result["report"], encoding="utf-8")
            paths.append(path)
    outcomes = [{key: value for key, value in r.items() if key != "report"} | {"shard": f"{k}/{count}"}
                for k, r in enumerate(results, start=1)]
    return paths, outcomes


def outcome_line(outcome: Mapping[str, Any]) -> str:
    """One line for a shard task that wrote no report: where, its exit, its last words."""
    host = where(outcome)
    last = outcome.get("error") or (outcome.get("stderr") or ["(no output)"])[-1]
    return f"shard {outcome['shard']} on {host}: exit {outcome.get('exit', '?')}: {last}"


__all__ = ["Cluster", "RAY_MISSING", "RayMissing", "RayUnavailable", "RayUsageError", "ShippedFile", "check_release_task", "connect",
           "matrix_on_ray", "outcome_line", "parse_address", "run_arguments", "run_on_ray", "run_shard_task", "where"]
