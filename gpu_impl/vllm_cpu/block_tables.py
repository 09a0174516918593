"""Drive the target release's block-table classes directly, on a CPU-only machine.

The block tables each runner builds for a case are driven by ``runner_tables`` (what
``kvconform run`` reports). This module builds the classes itself, for group mixes no
case reaches (circular buffers, packed kernel strides, DCP ranks other than 0, int32
overflow). ``observe_block_tables(scenario)`` runs one scenario (plain JSON data, see
``reference.config.normalize_scenario``) through:

- MRv1: ``vllm.v1.worker.block_table.MultiGroupBlockTable`` (``add_row``,
  ``append_row``, ``clear_row``, ``move_row``, ``swap_row``, ``commit_block_table``,
  ``compute_slot_mapping``), then what ``gpu_model_runner.py`` does with it
  (``get_device_tensor`` + NULL fill of padded rows, ``_get_slot_mappings``' PAD fill);
- MRv2: ``vllm.v1.worker.gpu.block_table.BlockTables`` (``append_block_ids``,
  ``apply_staged_writes``, ``gather_block_tables``, ``compute_slot_mappings``), with
  vLLM's own ``RequestState`` choosing each request's slot and a step's frees sorted
  as ``finish_requests`` sorts them;
- both: ``vllm.v1.worker.utils.AttentionGroup.map_to_kernel_block_table`` with
  ``kernel_block_size`` / ``kernel_block_table`` / ``kernel_block_offsets`` set by hand
  (``create_metadata_builders`` needs real builders and a full config).

Per step it returns each runner's request locations, valid logical block ids per live
request and group, the attention block tables, their kernel expansion and the slot
mappings, all as lists.

The Triton kernels run in the Triton interpreter, which needs ``CUDA_VISIBLE_DEVICES=""``
and ``TRITON_INTERPRET=1`` *before* triton/vllm are imported, plus process-global
patches (``PIN_MEMORY``, ``is_uva_available``, ``device_type``; research note
vllm-blocktables-runners.md §7). Those clash with a process that already imported vLLM
for the planning driver, so unless this process was prepared by ``main`` the work runs
in one long-lived subprocess (``BlockTableServer``), one per calling process.

A missing or changed vLLM API gives ``{"unsupported": reason}``; an exception vLLM raises
while running a step is recorded as that runner's ``error``.

Replay one scenario: ``python -m gpu_impl.vllm_cpu.block_tables '<scenario json>'``
(or the JSON on stdin). ``--serve`` answers one JSON line per JSON line on stdin.

Importing this module does not import vLLM or torch.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import shlex
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from reference.config import (  # the schedule description, part of the case description
    GROUP_KINDS,
    Scenario,
    ScenarioError,
    first_positions,
    normalize_scenario,
    step_token_layout,
)

REPO = Path(__file__).resolve().parents[2]

Result = dict[str, Any]

# Set before triton/vllm are imported: an empty CUDA_VISIBLE_DEVICES keeps
# vllm.triton_utils.HAS_TRITON True with no active driver (its "distributed env"
# leniency), and the interpreter then runs the real @triton.jit kernels on CPU tensors.
TRITON_CPU_ENV = {"CUDA_VISIBLE_DEVICES": "", "TRITON_INTERPRET": "1"}

PAD_SLOT_ID = -1
NULL_BLOCK_ID = 0

# --------------------------------------------------------------------------- vLLM API


@dataclass(frozen=True)
class _Api:
    """The vLLM callables driven here, resolved once (a missing one is 'unsupported')."""

    torch: Any
    version: str
    MultiGroupBlockTable: Any
    SlotMappingMode: Any
    BlockTables: Any
    get_block_table_width: Any
    AttentionGroup: Any
    FullAttentionSpec: Any
    RequestState: Any


_prepared = False
_api: _Api | str | None = None
_prep_lock = threading.Lock()


def _prepare_process() -> None:
    """Make *this* process able to run the kernels: env first, then the vLLM patches."""
    global _prepared
    with _prep_lock:
        if _prepared:
            return
        from gpu_impl.vllm_cpu import shims

        os.environ.update(TRITON_CPU_ENV)
        shims.prepare_env()  # offline, quiet logging, VLLM_TARGET_DEVICE=cuda (UnspecifiedPlatform)
        _prepared = True


def _patch_vllm() -> None:
    """The process-global patches the research note's CPU recipe needs (§7.1)."""
    from vllm.platforms import current_platform

    # Computed at import time from the platform (Unspecified says True); pinning needs CUDA.
    for name in ("vllm.utils.torch_utils", "vllm.v1.utils"):
        module = sys.modules.get(name) or __import__(name, fromlist=["PIN_MEMORY"])
        module.PIN_MEMORY = False
    # UvaBuffer pins memory; the NonUvaBuffer fallback allocates on device_type ("" here).
    import vllm.v1.worker.gpu.buffer_utils as buffer_utils

    buffer_utils.is_uva_available = lambda: False
    type(current_platform).device_type = "cpu"


def _resolve_api() -> _Api | str:
    """Import and patch vLLM once; a string says why it cannot be driven."""
    global _api
    if _api is not None:
        return _api
    _prepare_process()
    try:
        import vllm  # first: without vLLM, fail before paying for torch

        import torch

        _patch_vllm()
        from vllm.triton_utils import HAS_TRITON
        from vllm.v1.kv_cache_interface import FullAttentionSpec
        from vllm.v1.worker.block_table import MultiGroupBlockTable, SlotMappingMode, get_block_table_width
        from vllm.v1.worker.gpu.block_table import BlockTables
        from vllm.v1.worker.gpu.states import RequestState
        from vllm.v1.worker.utils import AttentionGroup

        if not HAS_TRITON:
            _api = "vllm.triton_utils.HAS_TRITON is False: the Triton interpreter is not usable here"
            return _api
        for cls, method in ((MultiGroupBlockTable, "compute_slot_mapping"), (BlockTables, "gather_block_tables"),
                            (BlockTables, "compute_slot_mappings"), (AttentionGroup, "map_to_kernel_block_table")):
            if not hasattr(cls, method):
                _api = f"{cls.__module__}.{cls.__qualname__}.{method} does not exist in vllm {vllm.__version__}"
                return _api
        _api = _Api(torch, getattr(vllm, "__version__", "?"), MultiGroupBlockTable, SlotMappingMode, BlockTables,
                    get_block_table_width, AttentionGroup, FullAttentionSpec, RequestState)
    except (ImportError, AttributeError) as exc:
        _api = f"{type(exc).__name__}: {exc}"
    return _api


# --------------------------------------------------------------------------- bookkeeping


class _Locations:
    """Lowest-free row/slot bookkeeping (InputBatch rows in MRv1, request-state slots in MRv2)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.of: dict[Any, int] = {}

    def take(self, req: Any) -> int:
        if req in self.of:
            raise ScenarioError(f"add of request {req!r} which is already live")
        used = set(self.of.values())
        free = [i for i in range(self.capacity) if i not in used]
        if not free:
            raise ScenarioError(f"add of request {req!r} with all {self.capacity} rows in use")
        self.of[req] = free[0]
        return free[0]

    def leave(self, req: Any) -> int:
        if req not in self.of:
            raise ScenarioError(f"request {req!r} is not live")
        return self.of.pop(req)

    def at(self, req: Any) -> int:
        if req not in self.of:
            raise ScenarioError(f"request {req!r} is not live")
        return self.of[req]

    def owner(self) -> dict[int, Any]:
        return {loc: req for req, loc in self.of.items()}


def _kernel_group(api: _Api, group: Mapping[str, Any], index: int, max_num_reqs: int, width: int) -> Any:
    """An ``AttentionGroup`` set up the way ``create_metadata_builders`` would for a split."""
    torch = api.torch
    B, K = group["block_size"], group["kernel_block_size"]
    spec = api.FullAttentionSpec(block_size=B, num_kv_heads=1, head_size=64, dtype=torch.float16)
    ag = api.AttentionGroup(None, [f"group{index}"], spec, index)  # backend: map_* never reads it
    if K is not None and K != B:
        ratio = B // K
        ag.kernel_block_size = K
        ag.kernel_block_stride = group["kernel_block_stride"]
        # Persistent per ubatch in vLLM (CUDA graphs capture it); one ubatch here.
        ag.kernel_block_table = torch.zeros(1, max_num_reqs, width * ratio, dtype=torch.int32)
        ag.kernel_block_offsets = torch.arange(ratio, dtype=torch.int32)
    return ag


def _tolist(t: Any) -> list:
    return t.detach().cpu().tolist()


# --------------------------------------------------------------------------- MRv1


class _MRv1:
    """MRv1 ``MultiGroupBlockTable`` driven the way ``InputBatch`` and ``GPUModelRunner`` do."""

    def __init__(self, api: _Api, sc: Scenario) -> None:
        torch, self.api, self.sc = api.torch, api, sc
        modes = [api.SlotMappingMode.NONE if g["mrv1_slot_mapping"] == "none" else api.SlotMappingMode.TOKEN_TO_KV_SLOT
                 for g in sc["groups"]]
        W, r, I = sc["dcp"]
        self.table = api.MultiGroupBlockTable(
            max_num_reqs=sc["max_num_reqs"], max_num_batched_tokens=sc["max_num_batched_tokens"],
            pin_memory=False, device=torch.device("cpu"),
            block_sizes=[g["block_size"] for g in sc["groups"]],
            max_num_blocks=[g["max_num_blocks"] for g in sc["groups"]],
            cp_kv_cache_interleave_size=I, slot_mapping_modes=modes,
        )
        self.num_groups = len(sc["groups"])
        for g in range(self.num_groups):
            # BlockTable reads these from get_dcp_group(), which is not initialised on CPU
            # (it falls back to 1/0); set what a DCP rank's table would hold.
            self.table[g].dcp_world_size, self.table[g].dcp_rank = W, r
        self.widths = [int(self.table[g].get_numpy_array().shape[1]) for g in range(self.num_groups)]
        self.kernel_groups = [_kernel_group(api, grp, g, sc["max_num_reqs"], self.widths[g])
                              for g, grp in enumerate(sc["groups"])]
        self.locations = _Locations(sc["max_num_reqs"])  # InputBatch rows

    def apply(self, op: list) -> None:
        """``InputBatch`` add/remove/condense/swap and ``_update_states`` appends."""
        kind, rows = op[0], self.locations
        if kind == "add":
            self.table.add_row(tuple(list(ids) for ids in op[2]), rows.take(op[1]))
        elif kind == "append":
            self.table.append_row(tuple(list(ids) for ids in op[2]), rows.at(op[1]))
        elif kind in ("remove", "preempt"):
            self.table.clear_row(rows.leave(op[1]))
        elif kind == "move":
            owner = rows.owner()
            if op[1] not in owner or op[2] in owner:
                raise ScenarioError(f"move {op!r} needs a live source row and a free target row")
            self.table.move_row(op[1], op[2])
            rows.of[owner[op[1]]] = op[2]
        elif kind == "swap":
            owner = rows.owner()
            self.table.swap_row(op[1], op[2])
            for a, b in ((op[1], op[2]), (op[2], op[1])):
                if a in owner:
                    rows.of[owner[a]] = b

    @staticmethod
    def ordered(ops: list[list]) -> list[list]:
        """As scheduled: ``_update_states`` applies removals, then adds and appends."""
        return ops

    def end_of_updates(self) -> None:
        """Nothing: MRv1 row ops write the numpy table directly; ``forward`` commits it."""

    def blocks(self) -> dict[str, list[list[int]]]:
        """Valid logical ids per live request: ``get_numpy_array()[row, :num_blocks_per_row[row]]``."""
        out = {}
        for req, row in self.locations.of.items():
            out[req] = [self.table[g].get_numpy_array()[row, : int(self.table[g].num_blocks_per_row[row])].tolist()
                        for g in range(self.num_groups)]
        return out

    def forward(self, step: Mapping[str, Any]) -> dict[str, Any]:
        """``_prepare_inputs`` + ``_build_attention_metadata`` + ``_get_slot_mappings`` for one batch."""
        torch = self.api.torch
        for i, (req, _) in enumerate(step["batch"]):
            if self.locations.of.get(req) != i:
                raise ScenarioError(f"MRv1 batch position {i} is {req!r} but that request is in row "
                                    f"{self.locations.of.get(req)}; MRv1 batches are rows 0..n-1 in order")
        n, padded = len(step["batch"]), step["num_reqs_padded"]
        qsl, positions, _, _ = step_token_layout(step)
        self.table.commit_block_table(n)
        self.table.compute_slot_mapping(
            n, torch.tensor(qsl, dtype=torch.int32), torch.tensor(positions, dtype=torch.int64))
        tables, kernel_tables, slots = [], [], []
        for g in range(self.num_groups):
            blk = self.table[g].get_device_tensor(padded)
            blk[n:padded].fill_(NULL_BLOCK_ID)  # in place, as the runner does
            tables.append(_tolist(blk))
            kernel_tables.append({"group": g, "layers": [f"group{g}"],
                                  "rows": _tolist(self.kernel_groups[g].map_to_kernel_block_table(blk))})
            sm = self.table[g].slot_mapping.gpu[: step["num_tokens_padded"]]
            sm[len(positions):].fill_(PAD_SLOT_ID)  # persists: a later Mamba step reads it (D3)
            slots.append(_tolist(sm))
        return {"tables": tables, "kernel_tables": kernel_tables, "slot_mappings": slots}


# --------------------------------------------------------------------------- MRv2


class _Slots:
    """MRv2 request-state slots as ``{request: slot}`` (read from vLLM's ``RequestState``)."""

    def __init__(self, states: Any) -> None:
        self.of = dict(states.req_id_to_index)

    def at(self, req: Any) -> int:
        if req not in self.of:
            raise ScenarioError(f"request {req!r} is not live")
        return self.of[req]


class _MRv2:
    """MRv2 ``BlockTables`` driven the way ``gpu/model_runner.py`` does."""

    def __init__(self, api: _Api, sc: Scenario) -> None:
        torch, self.api, self.sc = api.torch, api, sc
        groups = sc["groups"]
        W, r, I = sc["dcp"]
        # gpu/model_runner.py::initialize_kv_cache: widths via get_block_table_width with
        # the spec's block_table_token_alignment.
        self.widths = [
            api.get_block_table_width(g["max_num_blocks"], g["block_size"], token_alignment=g["token_alignment"])
            for g in groups
        ]
        self.table = api.BlockTables(
            [g["block_size"] for g in groups], sc["max_num_reqs"], sc["max_num_batched_tokens"], self.widths,
            torch.device("cpu"), cp_size=W, cp_rank=r, cp_interleave=I,
            slot_mapping_enabled=[bool(g["mrv2_slot_mapping"]) for g in groups],
            dcp_sharded=[bool(g["dcp_sharded"]) for g in groups],
            sliding_window_reach=[int(g["sliding_window_reach"]) for g in groups],
        )
        self.num_groups = len(groups)
        self.kernel_groups = [_kernel_group(api, grp, g, sc["max_num_reqs"], self.widths[g])
                              for g, grp in enumerate(groups)]
        # vLLM's own request state picks each request's slot (a stack of free slots).
        import inspect

        dense = ({"use_dense_all_token_ids": False}
                 if "use_dense_all_token_ids" in inspect.signature(api.RequestState).parameters else {})  # 0.32 on
        self.states = api.RequestState(
            max_num_reqs=sc["max_num_reqs"], max_model_len=1, max_num_batched_tokens=sc["max_num_batched_tokens"],
            num_speculative_steps=0, vocab_size=1, device=torch.device("cpu"), num_prefill_lookahead=1, **dense)

    @property
    def locations(self) -> Any:
        return _Slots(self.states)

    @staticmethod
    def ordered(ops: list[list]) -> list[list]:
        """``finish_requests`` frees finished and preempted requests sorted by id, before the adds."""
        leaves = sorted((op for op in ops if op[0] in ("remove", "preempt")), key=lambda op: str(op[1]))
        return leaves + [op for op in ops if op[0] not in ("remove", "preempt")]

    def apply(self, op: list) -> None:
        """``finish_requests`` / ``add_requests`` / ``update_requests``; batch order is not a table op."""
        kind, index = op[0], self.states.req_id_to_index
        if kind == "add":
            if op[1] in index:
                raise ScenarioError(f"add of request {op[1]!r} which is already live")
            if not self.states.free_indices:
                raise ScenarioError(f"add of request {op[1]!r} with all {self.sc['max_num_reqs']} slots in use")
            self.states.add_request(req_id=op[1], prompt_len=1, all_token_ids=[0], num_computed_tokens=0, max_tokens=0)
            self.table.append_block_ids(index[op[1]], tuple(list(ids) for ids in op[2]), overwrite=True)
        elif kind == "append":
            if op[1] not in index:
                raise ScenarioError(f"request {op[1]!r} is not live")
            self.table.append_block_ids(index[op[1]], tuple(list(ids) for ids in op[2]), overwrite=False)
        elif kind in ("remove", "preempt"):
            if self.states.remove_request(op[1]) is None:  # the slot is freed, its row is not cleared
                raise ScenarioError(f"request {op[1]!r} is not live")

    def end_of_updates(self) -> None:
        """``execute_model`` applies the staged writes once all request updates are staged."""
        self.table.apply_staged_writes()

    def blocks(self) -> dict[str, list[list[int]]]:
        """Valid logical ids per live request: ``block_tables[g].gpu[slot, :num_blocks.np[g, slot]]``."""
        out = {}
        for req, slot in self.locations.of.items():
            out[req] = [_tolist(self.table.block_tables[g].gpu[slot, : int(self.table.num_blocks.np[g, slot])])
                        for g in range(self.num_groups)]
        return out

    def forward(self, step: Mapping[str, Any]) -> dict[str, Any]:
        """``prepare_attn`` (gather + slot mappings) and the attention groups' kernel expansion."""
        torch = self.api.torch
        idx = [self.locations.at(req) for req, _ in step["batch"]]
        computed = torch.zeros(self.sc["max_num_reqs"], dtype=torch.int32)  # req_states.num_computed_tokens
        for req, first in first_positions(step).items():
            computed[self.locations.at(req)] = first
        gathered = self.table.gather_block_tables(
            torch.tensor(idx, dtype=torch.int32), num_reqs_padded=step["num_reqs_padded"], num_computed_tokens=computed,
        )
        _, _, qsl_all, positions_all = step_token_layout(step)
        idx_all = idx + [-1] * len(step["dummy_tokens"])  # -1: a dummy request owning no blocks
        slots = self.table.compute_slot_mappings(
            torch.tensor(idx_all, dtype=torch.int32), torch.tensor(qsl_all, dtype=torch.int32),
            torch.tensor(positions_all, dtype=torch.int64), step["num_tokens_padded"],
        )
        tables = [_tolist(t) for t in gathered]  # copies now: the buffers are reused next step
        kernel_tables = [{"group": g, "layers": [f"group{g}"],
                          "rows": _tolist(self.kernel_groups[g].map_to_kernel_block_table(gathered[g]))}
                         for g in range(self.num_groups)]
        return {"tables": tables, "kernel_tables": kernel_tables, "slot_mappings": _tolist(slots)}


# --------------------------------------------------------------------------- running


_VLLM_ERRORS = (ValueError, RuntimeError, IndexError, AssertionError, KeyError)


def observe_tables(driver: Any, step: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What a driver's tables hold after a step's updates: each request's locations and
    blocks, and, where ``step`` runs a batch, its forward pass (slot mappings, kernel tables)."""
    obs: dict[str, Any] = {"locations": dict(driver.locations.of), "blocks": driver.blocks()}
    if step is not None and step["batch"]:
        obs.update(driver.forward(step))
    return obs


def _run_runner(runner: _MRv1 | _MRv2, sc: Scenario) -> dict[str, Any]:
    """Every step of one runner; a vLLM exception ends it with ``error``."""
    steps: list[dict[str, Any]] = []
    out: dict[str, Any] = {"widths": list(runner.widths), "steps": steps}
    for i, step in enumerate(sc["steps"]):
        try:
            for op in runner.ordered(step["ops"]):
                runner.apply(op)
            runner.end_of_updates()
            obs = observe_tables(runner, step)
        except ScenarioError:
            raise
        except _VLLM_ERRORS as exc:
            out["error"] = {"step": i, "message": f"{type(exc).__name__}: {exc}"}
            break
        steps.append(obs)
    return out


def _observe_here(scenario: Mapping[str, Any]) -> Result:
    """Run one scenario in this (prepared) process."""
    sc = normalize_scenario(scenario)
    api = _resolve_api()
    if isinstance(api, str):
        return {"name": sc["name"], "unsupported": api}
    result: Result = {"name": sc["name"], "vllm_version": api.version}
    for name, cls in (("mrv1", _MRv1), ("mrv2", _MRv2)):
        try:
            runner = cls(api, sc)
        except (TypeError, AttributeError) as exc:  # a changed constructor or attribute
            return {"name": sc["name"], "unsupported": f"{name}: {type(exc).__name__}: {exc}"}
        except _VLLM_ERRORS as exc:
            result[name] = {"error": {"step": -1, "message": f"{type(exc).__name__}: {exc}"}, "steps": []}
            continue
        try:
            result[name] = _run_runner(runner, sc)
        except (TypeError, AttributeError) as exc:
            return {"name": sc["name"], "unsupported": f"{name}: {type(exc).__name__}: {exc}"}
    return result


def _answer(scenario: Any) -> Result:
    """One reply: a result, or ``invalid`` for a scenario the driver cannot run."""
    try:
        return _observe_here(scenario)
    except ScenarioError as exc:
        name = scenario.get("name") if isinstance(scenario, Mapping) else None
        return {"name": name, "invalid": str(exc)}


class BlockTableServer:
    """One driver subprocess (``--serve``) that answers scenarios one JSON line at a time.

    The import of torch + vLLM (~8 s) is paid once per server, not per scenario.
    """

    def __init__(self, python: str = sys.executable, timeout_s: float = 120.0) -> None:
        self.timeout_s = timeout_s
        env = dict(os.environ, **TRITON_CPU_ENV)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
        # stderr goes to a file: an unread pipe would fill up and block the server.
        self._stderr = tempfile.TemporaryFile(mode="w+")
        self._proc = subprocess.Popen(
            [python, "-m", "gpu_impl.vllm_cpu.block_tables", "--serve"], cwd=str(REPO), env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, text=True, bufsize=1,
        )
        self._lock = threading.Lock()
        self._used = False

    def _stderr_tail(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read()[-2000:]

    def observe(self, scenario: Mapping[str, Any]) -> Result:
        """Send one scenario, wait for its result."""
        with self._lock:
            if self._proc.poll() is not None:
                raise RuntimeError(f"block-table driver exited ({self._proc.returncode}): {self._stderr_tail()}")
            assert self._proc.stdin is not None and self._proc.stdout is not None
            self._used = True
            self._proc.stdin.write(json.dumps(scenario) + "\n")
            self._proc.stdin.flush()
            ready, _, _ = select.select([self._proc.stdout], [], [], self.timeout_s)
            line = self._proc.stdout.readline() if ready else ""
            if not line:
                self.close()
                raise RuntimeError(
                    f"block-table driver gave no answer within {self.timeout_s} s: {self._stderr_tail()}")
            return json.loads(line)

    def close(self) -> None:
        """Stop the subprocess: it exits when its stdin closes (an unused one is killed at once)."""
        if self._proc.poll() is None:
            with contextlib.suppress(OSError):
                assert self._proc.stdin is not None
                self._proc.stdin.close()
            try:
                # A server that was never asked anything may still be importing vLLM.
                self._proc.wait(timeout=10 if self._used else 0.1)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._stderr.close()

    def __enter__(self) -> "BlockTableServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_server: BlockTableServer | None = None
_server_lock = threading.Lock()


def _shared_server() -> BlockTableServer:
    global _server
    with _server_lock:
        if _server is None or _server._proc.poll() is not None:
            _server = BlockTableServer()
            atexit.register(_server.close)
        return _server


def prewarm() -> None:
    """Start this process's driver subprocess now so its vLLM import overlaps other work."""
    if not _prepared:
        _shared_server()


def observe_block_tables(scenario: Mapping[str, Any]) -> Result:
    """Run ``scenario`` through vLLM's real MRv1 and MRv2 block tables; see the module doc.

    Returns ``{"name", "vllm_version", "mrv1": {...}, "mrv2": {...}}`` where each runner
    has ``widths`` and per step ``locations`` (request -> row/slot), ``blocks`` (request
    -> valid ids per group) and, for a step with a batch, ``tables`` / ``kernel_tables``
    (per group, ``num_reqs_padded`` rows as handed to attention) and ``slot_mappings``
    (per group, ``[:num_tokens_padded]``); ``{"unsupported": reason}`` when vLLM cannot be
    driven; ``{"invalid": reason}`` for a scenario the driver cannot run.
    """
    if _prepared:
        return _answer(scenario)
    return _shared_server().observe(scenario)


def observe_many(scenarios: Sequence[Mapping[str, Any]]) -> list[Result]:
    """``observe_block_tables`` for several scenarios through the one shared subprocess."""
    return [observe_block_tables(s) for s in scenarios]


def scenario_command(scenario: Mapping[str, Any]) -> str:
    """A one-line shell command that reruns ``scenario`` against vLLM and prints the result."""
    return (f"cd {shlex.quote(str(REPO))} && PYTHONPATH=. {shlex.quote(sys.executable)} "
            f"-m gpu_impl.vllm_cpu.block_tables {shlex.quote(json.dumps(scenario, separators=(',', ':')))}")


# --------------------------------------------------------------------------- CLI


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[Any]:
    """Keep vLLM's and torch's prints off the protocol stream; yield the real stdout."""
    sys.stdout.flush()
    real = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    try:
        yield real
    finally:
        real.flush()


def _serve(out: Any) -> int:
    _resolve_api()  # import vLLM now, while the client is still busy elsewhere
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            scenario = json.loads(line)
        except json.JSONDecodeError as exc:
            reply: Result = {"invalid": f"not JSON: {exc}"}
        else:
            reply = _answer(scenario)
        out.write(json.dumps(reply) + "\n")
        out.flush()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``block_tables '<json>'`` (or JSON on stdin) prints the result; ``--serve`` loops."""
    argv = list(sys.argv[1:] if argv is None else argv)
    _prepare_process()  # before anything imports vLLM
    with _stdout_to_stderr() as out:
        if argv[:1] == ["--serve"]:
            return _serve(out)
        text = argv[0] if argv else sys.stdin.read()
        try:
            payload = json.loads(text)
        except json.JSONDecodeError as exc:  # bad input: one line, exit 4
            print(f"block_tables: error: not JSON: {exc}", file=sys.stderr)
            return 4
        replies = [_answer(s) for s in payload] if isinstance(payload, list) else _answer(payload)
        out.write(json.dumps(replies, indent=1) + "\n")
        answers = replies if isinstance(replies, list) else [replies]
        return 1 if any("unsupported" in r or "invalid" in r for r in answers) else 0


__all__ = [
    "BlockTableServer",
    "GROUP_KINDS",
    "ScenarioError",
    "TRITON_CPU_ENV",
    "main",
    "normalize_scenario",
    "observe_block_tables",
    "observe_tables",
    "observe_many",
    "prewarm",
    "scenario_command",
    "step_token_layout",
    "first_positions",
]


if __name__ == "__main__":
    raise SystemExit(main())

