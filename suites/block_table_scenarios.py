"""Seeded random request schedules for block-table scenarios (plain JSON).

A scenario is what ``gpu_impl.vllm_cpu.block_tables`` runs through vLLM's real MRv1
``MultiGroupBlockTable`` / MRv2 ``BlockTables`` and ``reference.block_tables`` models:
KV cache groups (attention with a kernel split, sliding window, Mamba, circular buffer,
packed kernel strides), DCP world/rank/interleave, and steps of ops (add, append,
remove, preempt, move, swap) with per-step batches and padding.

``make_scenario`` simulates a scheduler + ``InputBatch`` so every schedule is valid for
both runners; ``sample_scenarios(seed, n)`` draws the group mix too, so a run seed
(``--kvconform-seed``) reaches the block-table sweep like the layout sweep. Pure Python:
no vLLM, no torch.
"""

from __future__ import annotations

import random
from typing import Any, Sequence


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _attention(block_size: int, kernel: int | None = None, **extra: Any) -> dict[str, Any]:
    return {"kind": "attention", "block_size": block_size, "kernel_block_size": kernel, **extra}


def _mamba(block_size: int) -> dict[str, Any]:
    # One state block per request, at column 0 for every position < block_size.
    return {"kind": "mamba", "block_size": block_size, "max_num_blocks": 1}


class _Schedule:
    """Simulates a scheduler + InputBatch to emit a dense, valid schedule for both runners.

    As MRv1's ``_update_states`` orders a step: finished/preempted requests leave, new
    ones take the lowest free rows (``InputBatch.add_request``), then the holes left are
    condensed with ``move`` (last live row into the lowest hole, as
    ``InputBatch.condense``) and rows may be swapped (``swap_states``); a step's batch is
    rows ``0..n-1`` in order; blocks cover every scheduled token of every group.
    """

    def __init__(self, rng: random.Random, groups: list[dict[str, Any]], dcp_world: int, max_model_len: int,
                 max_num_reqs: int, token_budget: int, features: set[str], max_encoder_len: int = 0) -> None:
        self.rng, self.groups, self.W, self.L = rng, groups, dcp_world, max_model_len
        self.max_num_reqs, self.budget, self.features = max_num_reqs, token_budget, features
        # Encoder-decoder schedules: each request's encoder input tokens, which its cross-attention
        # blocks hold from its first step (no prefix caching: every request starts at token 0).
        self.cross = any(g["kind"] == "cross" for g in groups)
        self.max_encoder_len = max_encoder_len
        self.encoder_lens: dict[str, int] = {}
        self.rows: list[str | None] = [None] * max_num_reqs
        self.computed: dict[str, int] = {}
        self.target: dict[str, int] = {}
        self.nblocks: dict[str, list[int]] = {}
        self.preempted: list[str] = []
        self.next_req = 0
        self.used_ids: set[int] = set()

    # --- blocks
    def _tokens_per_block(self, g: int) -> int:
        grp = self.groups[g]
        sharded = grp.get("dcp_sharded", grp["kind"] != "mamba")
        return grp["block_size"] * (self.W if sharded else 1)

    def _needed(self, g: int, tokens: int, req: str = "") -> int:
        grp = self.groups[g]
        if grp["kind"] == "mamba":
            return 1
        if grp["kind"] == "cross":
            # One static allocation for the encoder tokens, whatever the decoder has reached
            # (KVCacheCoordinator.get_num_blocks_to_allocate: CrossAttentionManager).
            return _cdiv(self.encoder_lens[req], grp["block_size"])
        if grp["kind"] == "circular":
            # A ring is one block per request however long it runs (CircularBufferManager).
            return min(_cdiv(tokens, self._tokens_per_block(g)), grp["max_num_blocks"])
        return _cdiv(tokens, self._tokens_per_block(g))

    def _new_ids(self, g: int, n: int) -> list[int]:
        ids = []
        while len(ids) < n:  # distinct, scattered ids (id * B stays far below 2**31)
            b = self.rng.randrange(1, 50_000)
            if b not in self.used_ids:
                self.used_ids.add(b)
                ids.append(b)
        if self.groups[g].get("sliding_window_reach") and n > 1 and self.rng.random() < 0.3:
            ids[0] = 0  # the sliding-window manager already freed it: the null block
        return ids

    def _live(self) -> list[str]:
        return [r for r in self.rows if r is not None]

    # --- ops
    def _leave(self, ops: list[list], req: str, kind: str) -> None:
        ops.append([kind, req])
        self.rows[self.rows.index(req)] = None
        if kind == "preempt":
            self.preempted.append(req)

    def _condense(self, ops: list[list]) -> None:
        while True:
            holes = [i for i, r in enumerate(self.rows) if r is None]
            live = [i for i, r in enumerate(self.rows) if r is not None]
            if not holes or not live or holes[0] > live[-1]:
                return
            ops.append(["move", live[-1], holes[0]])
            self.rows[holes[0]], self.rows[live[-1]] = self.rows[live[-1]], None

    def _admit(self, budget_left: int) -> tuple[str, int] | None:
        if None not in self.rows or budget_left < 1:
            return None
        if self.preempted and self.rng.random() < 0.7:
            req = self.preempted.pop(0)
            start = 0  # resumed requests recompute from scratch here (no prefix hit)
        else:
            req = f"r{self.next_req}"
            self.next_req += 1
            self.target[req] = self.rng.randint(self.L // 4, self.L)
            # A prefix-cache hit: the request arrives with computed tokens and their blocks.
            start = self.rng.choice([0, 0, self.rng.randint(1, self.target[req] - 1)])
            if self.cross:
                start = 0  # encoder-decoder models run without prefix caching
                # Mostly short inputs (the slot mappings stay small), now and then up to the
                # encoder budget (Whisper's 1500 frames at the default 2048).
                longest = max(1, self.max_encoder_len)
                self.encoder_lens[req] = self.rng.choice([self.rng.randint(1, min(64, longest)),
                                                          self.rng.randint(1, longest)])
        self.computed[req] = start
        return req, start

    def step(self) -> dict[str, Any]:
        rng, ops = self.rng, []
        for req in self._live():
            if self.computed[req] >= self.target[req]:
                self._leave(ops, req, "remove")
            elif "preempt" in self.features and rng.random() < 0.2:
                self._leave(ops, req, "preempt")
        chunks: dict[str, int] = {}
        budget = self.budget
        live = self._live()
        for req in live:
            chunks[req] = self._chunk(req, budget - (len(live) - len(chunks) - 1))
            budget -= chunks[req]
        for _ in range(rng.randint(0, 2) if live else rng.randint(1, 3)):
            admitted = self._admit(budget)
            if admitted is None:
                break
            req, start = admitted
            chunks[req] = self._chunk(req, budget)
            budget -= chunks[req]
            ids = [self._new_ids(g, self._needed(g, start + chunks[req], req)) for g in range(len(self.groups))]
            self.nblocks[req] = [len(x) for x in ids]
            ops.append(["add", req, ids])
            self.rows[self.rows.index(None)] = req
        for req in live:
            total = self.computed[req] + chunks[req]
            need = [self._needed(g, total, req) - self.nblocks[req][g] for g in range(len(self.groups))]
            if any(n > 0 for n in need):
                ids = [self._new_ids(g, max(n, 0)) for g, n in enumerate(need)]
                self.nblocks[req] = [a + len(b) for a, b in zip(self.nblocks[req], ids)]
                ops.append(["append", req, ids])
        # MRv1's _update_states: removals, appends, adds into the lowest free rows, then
        # InputBatch.condense moves the last live rows into the holes left.
        self._condense(ops)
        live = self._live()
        if "swap" in self.features and len(live) >= 2 and rng.random() < 0.6:
            a, b = rng.sample(range(len(live)), 2)  # InputBatch reorder: swap_states
            ops.append(["swap", a, b])
            self.rows[a], self.rows[b] = self.rows[b], self.rows[a]
        batch = []
        for req in self._live():
            c = self.computed[req]
            batch.append([req, list(range(c, c + chunks[req]))])
            self.computed[req] = c + chunks[req]
        return self._padded({"ops": ops, "batch": batch})

    def _chunk(self, req: str, budget: int) -> int:
        left = min(self.target[req], self.L) - self.computed[req]
        want = 1 if self.computed[req] > 0 and self.rng.random() < 0.5 else self.rng.randint(1, 40)
        return max(1, min(want, left, max(budget, 1)))

    def _padded(self, step: dict[str, Any]) -> dict[str, Any]:
        if "pad" not in self.features or not step["batch"]:
            return step
        n = len(step["batch"])
        tokens = sum(len(p) for _, p in step["batch"])
        step["num_reqs_padded"] = min(self.max_num_reqs, n + self.rng.choice([0, 1, 2]))
        dummy = self.rng.choice([[], [1], [2, 3]])
        spare = self.budget + 16 - tokens  # max_num_batched_tokens = budget + 16
        if sum(dummy) <= spare:
            step["dummy_tokens"] = dummy
        extra = self.rng.choice([0, 3, 9])
        step["num_tokens_padded"] = min(tokens + sum(step.get("dummy_tokens", [])) + extra, self.budget + 16)
        return step


def make_scenario(name: str, seed: int, groups: list[dict[str, Any]], *, dcp: Sequence[int] = (1, 0, 1),
                  max_model_len: int = 1024, num_steps: int = 4, max_num_reqs: int = 4,
                  features: Sequence[str] = ("preempt", "swap", "pad"), max_encoder_len: int = 0) -> dict[str, Any]:
    """A seeded random schedule over ``groups`` (max_num_blocks filled in from max_model_len;
    a ``cross`` group's requests get encoder inputs of up to ``max_encoder_len`` tokens)."""
    rng = random.Random(seed)
    W = dcp[0]
    groups = [dict(g) for g in groups]
    for g in groups:
        if g["kind"] != "mamba":
            sharded = g.get("dcp_sharded", True)
            g.setdefault("max_num_blocks", _cdiv(max_model_len, g["block_size"] * (W if sharded else 1)))
    budget = 96
    sim = _Schedule(rng, groups, W, max_model_len, max_num_reqs, budget, set(features), max_encoder_len)
    steps = [sim.step() for _ in range(num_steps)]
    out = {"name": name, "seed": seed, "max_num_reqs": max_num_reqs, "max_num_batched_tokens": budget + 16,
           "dcp": list(dcp), "groups": groups, "steps": steps}
    if sim.encoder_lens:
        out["encoder_lens"] = dict(sim.encoder_lens)
    return out


def sample_scenarios(seed: int, count: int) -> list[dict[str, Any]]:
    """``count`` scenarios with random group mixes, DCP and features, from one seed."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        max_model_len = rng.choice((512, 1024, 2048))
        b = rng.choice((16, 32, 64, 128, 256))
        k = rng.choice([None] + [x for x in (16, 32, 64, 128) if x < b])
        groups = [_attention(b, k)]
        mix = rng.choice(("single", "swa", "mamba", "hybrid3", "circular", "stride"))
        if mix in ("swa", "hybrid3"):
            groups.append(_attention(rng.choice((16, 32, 64)), None, sliding_window_reach=rng.randint(8, 300)))
        if mix in ("mamba", "hybrid3"):
            # One state block covers every position (mamba_block_size >= max_model_len).
            groups.append(_mamba(max_model_len * rng.choice((1, 2))))
        if mix == "circular":
            groups.append({"kind": "circular", "block_size": 16})
        if mix == "stride" and k is not None:
            groups[0]["kernel_block_stride"] = rng.randint(b // k, 2 * b // k + 3)
        world = rng.choice((1, 1, 2, 4))
        dcp = (world, rng.randrange(world), rng.choice((1, 2, 8)))
        features = tuple(f for f in ("preempt", "swap", "pad") if rng.random() < 0.8)
        out.append(
            make_scenario(
                f"sampled-s{seed}-{i}-{mix}-b{b}-k{k}-dcp{world}",
                rng.randrange(2**31),
                groups,
                dcp=dcp,
                max_model_len=max_model_len,
                num_steps=rng.randint(2, 6),
                max_num_reqs=rng.randint(2, 5),
                features=features,
            )
        )
    return out


CASE_SCHEDULE_STEPS = 4
"""Steps per schedule of a case: admissions, chunked prefills, decodes, preemption and
condensing all happen within four steps of ``make_scenario``'s scheduler."""


def case_scenarios(case_name: str, groups: list[dict[str, Any]], *, max_model_len: int, dcp_world: int,
                   seed: int, count: int, max_encoder_len: int = 0) -> list[dict[str, Any]]:
    """``count`` seeded schedules over a case's KV cache groups (``reference.block_tables.
    scenarios.case_groups``), for its runners' own block tables (DCP rank 0, interleave 1:
    what the CPU driver's runners are). Seeded by ``seed`` and the case name, so a case's
    schedules do not depend on which other cases run."""
    import zlib

    base = zlib.crc32(case_name.encode()) ^ seed
    # A Mamba group keeps one state block per request (mamba_cache_mode "none"), which
    # covers the positions below its block size: requests stay within it (vLLM sizes
    # that block to max_model_len itself; a case may set a smaller one).
    longest = min([max_model_len] + [g["block_size"] for g in groups if g["kind"] == "mamba"])
    return [
        make_scenario(f"{case_name}#s{seed}.{i}", (base + 7919 * i) % 2**31, groups, dcp=(dcp_world, 0, 1),
                      max_model_len=longest, num_steps=CASE_SCHEDULE_STEPS, max_encoder_len=max_encoder_len)
        for i in range(count)
    ]


__all__ = ["case_scenarios", "make_scenario", "sample_scenarios"]
