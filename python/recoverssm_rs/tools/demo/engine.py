"""The demo's serving engine: a block pool, a prefix cache, requests and the step loop.

Every step:

1. **Scheduling**: finished requests free their blocks; new requests arrive. An arrival whose
   prompt shares a block-aligned prefix with a cached boundary state (a prefix-cache hit) copies
   that boundary block into its fresh running block and prefills only the rest; other arrivals
   start from a zeroed block. Some running requests **fork**: their running block is copied into a
   new block and both continue with different drafts. The step's copies go through
   :meth:`StateCache.copy_blocks` (planned and checked by the core).
2. **Verify**: one batched forward over every active request's window. Prefilling requests feed
   up to ``Q = num_spec + 1`` prompt tokens (all accepted); decoding requests feed
   ``[last_token, d_1 .. d_k]`` with ``k = num_spec`` random draft tokens.
3. **Sample**: a seeded random pattern accepts ``a`` in ``0..k`` drafts; ``num_accepted = a + 1``
   and the greedy token at position ``a`` (the bonus token) is the next window's first input.
4. **Commit** (align mode): :meth:`StateCache.commit` folds the accepted records into every
   layer's running state and compacts the conv windows; when a window crosses a multiple of
   ``block_size`` the boundary state is written into the request's block-table block, which is
   then registered in the prefix cache.
5. **Ground truth** (outside the timed serving path): :class:`~.oracle.Oracle` checks the step.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .config import sizes
from .model import HEADS, HIDDEN, KINDS, VOCAB, ToyLayer, rms, toy_layouts
from .oracle import Oracle, Snapshot

__all__ = ["BlockPool", "PrefixCache", "Request", "Engine"]

_ACCEPT_P = 0.65  # probability that each next draft is accepted (seeded pattern)


class BlockPool:
    """Free list + reference counts over block ids ``1..num_blocks-1`` (0 is the null block)."""

    def __init__(self, num_blocks: int) -> None:
        self.free = list(range(num_blocks - 1, 0, -1))  # pop() hands out low ids first
        self.refs: dict[int, int] = {}
        self.evict: Callable[[], bool] | None = None
        self.on_free: Callable[[int], object] | None = None
        self.peak_used = 0
        self.num_blocks = num_blocks

    def alloc(self) -> int:
        """A free block (evicting prefix-cache entries when none is free), with one reference."""
        while not self.free:
            if self.evict is None or not self.evict():
                raise RuntimeError("demo block pool exhausted (raise num_blocks)")
        b = self.free.pop()
        self.refs[b] = 1
        self.peak_used = max(self.peak_used, len(self.refs))
        return b

    def incref(self, b: int) -> None:
        self.refs[b] += 1

    def decref(self, b: int) -> None:
        """Drop a reference; the last one frees the block (null and unset ids are ignored)."""
        if b <= 0:
            return
        self.refs[b] -= 1
        if self.refs[b] == 0:
            del self.refs[b]
            self.free.append(b)
            if self.on_free is not None:
                self.on_free(b)

    def __repr__(self) -> str:
        return f"BlockPool(num_blocks={self.num_blocks}, used={len(self.refs)})"


class PrefixCache:
    """Block-aligned token prefix -> boundary block, LRU, holding one reference per entry."""

    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool
        self.entries: OrderedDict[tuple[int, ...], int] = OrderedDict()
        self.evictions = 0
        pool.evict = self._evict_one

    def register(self, key: tuple[int, ...], block: int) -> bool:
        """Cache ``block`` as the state after the tokens ``key``; False if already cached."""
        if key in self.entries:
            return False
        self.entries[key] = block
        self.pool.incref(block)
        return True

    def lookup(self, key: tuple[int, ...]) -> int | None:
        b = self.entries.get(key)
        if b is not None:
            self.entries.move_to_end(key)
        return b

    def _evict_one(self) -> bool:
        for key, b in self.entries.items():
            if self.pool.refs.get(b, 0) == 1:  # only the cache holds it
                del self.entries[key]
                self.pool.decref(b)
                self.evictions += 1
                return True
        return False

    def __repr__(self) -> str:
        return f"PrefixCache(entries={len(self.entries)}, evictions={self.evictions})"


@dataclass
class Request:
    """A request: its blocks, its tokens, and its reference state (the oracle's)."""

    rid: int
    running: int  # running-state block
    folded: list[int]  # tokens folded into the running state
    pending: list[int]  # prompt tokens still to prefill
    max_new: int
    table: list[int] = field(default_factory=list)  # block-table (boundary) blocks, 0 = none
    last: int = -1  # next input token once the prompt is done
    generated: int = 0
    # Reference, per layer of the stack: recurrent state [H, V, K] (float32) and conv history
    # [dim, K-1] (conv dtype).
    ref_state: list[Any] = field(default_factory=list)
    ref_hist: list[Any] = field(default_factory=list)
    parent: int | None = None

    @property
    def seq_len(self) -> int:
        return len(self.folded)


@dataclass
class _Copy:
    src: int
    dst: int
    why: str  # "hit" or "fork"
    req: Request


COUNTERS = (
    "requests_served",
    "requests_finished",
    "prefill_tokens",
    "decode_windows",
    "tokens_accepted",
    "drafts_proposed",
    "drafts_accepted",
    "cache_hits",
    "cache_misses",
    "hit_tokens",
    "forks",
    "copy_blocks_calls",
    "plan_copy_copies",
    "fresh_blocks_zeroed",
    "commits",
    "boundary_states",
    "boundary_layer_states",
    "prefix_cache_registered",
)
"""The engine's event counters (keys of :attr:`Engine.counters`)."""


class Engine:
    """One serving run: the toy model, its two caches, the scheduler state and the oracle.

    Arguments are already validated (:func:`recoverssm_rs.tools.demo.config.validate`).
    """

    def __init__(
        self, *, device: str, steps: int, requests: int, layers: int, seed: int, block_size: int, num_spec: int
    ) -> None:
        import torch

        from ...speculative.state_cache import StateCache

        self.torch = torch
        self.dev = torch.device(device)
        self.steps, self.requests, self.layers = steps, requests, layers
        self.seed, self.block_size, self.num_spec = seed, block_size, num_spec
        self.Q = num_spec + 1
        self.rng = np.random.default_rng(seed)
        gen = torch.Generator().manual_seed(seed)

        # Sizes: prompts, generations, block-table columns, pool.
        size = sizes(requests=requests, block_size=block_size, num_spec=num_spec)
        self.max_prompt, self.max_new = size.max_prompt, size.max_new
        self.cols, self.num_blocks = size.cols, size.num_blocks

        self.caches = {
            kind: StateCache(lay, num_layers=layers, num_blocks=self.num_blocks, max_requests=requests, device=self.dev)
            for kind, lay in toy_layouts(num_spec).items()
        }
        # The hybrid stack interleaves the kinds: GDN 0, KDA 0, GDN 1, KDA 1, ...
        self.stack = [ToyLayer(kind, i, self.caches[kind], gen, self.dev) for i in range(layers) for kind in KINDS]
        self.embed = torch.randn(VOCAB, HIDDEN, generator=gen).to(self.dev)
        self.oracle = Oracle(self.stack, self.dev, block_size)

        self.pool = BlockPool(self.num_blocks)
        self.pcache = PrefixCache(self.pool)
        # Reference of every written boundary block: block -> (per-layer states, histories).
        self.snapshots: dict[int, Snapshot] = {}
        self.pool.on_free = lambda b: self.snapshots.pop(b, None)
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.accepted_hist = [0] * (num_spec + 1)
        self.active: list[Request] = []
        self.donors: list[list[int]] = []  # finished requests' tokens (prompts sharing a prefix)
        self.system_prompt = [int(t) for t in self.rng.integers(0, VOCAB, size=2 * block_size)]
        self.next_rid = 0
        self.step = -1
        self.step_ms: list[float] = []
        self.check_ms: list[float] = []

    def describe(self) -> str:
        """One line: what this run serves."""
        return (
            f"run: a toy hybrid model of {len(self.stack)} layers ({self.layers} GDN [SD conv, "
            f"fp32 records] + {self.layers} KDA [DS conv, bf16 conv/records, fp32 state]), "
            f"{HEADS} heads x {self.stack[0].K}, random weights; Q = {self.Q}, block_size = "
            f"{self.block_size}, {self.num_blocks} blocks, up to {self.requests} requests, "
            f"device {self.dev}"
        )

    # ---- scheduling --------------------------------------------------------------------------
    def _new_prompt(self) -> list[int]:
        rng, bs = self.rng, self.block_size
        r = rng.random()
        if r < 0.4:  # a shared "system prompt"
            base = list(self.system_prompt)
        elif r < 0.75 and self.donors:  # continue from an earlier conversation
            d = self.donors[int(rng.integers(len(self.donors)))]
            base = d[: int(rng.integers(min(bs, len(d)), len(d) + 1))]
        else:
            base = []
        suffix = [int(t) for t in rng.integers(0, VOCAB, size=int(rng.integers(1, bs + 4)))]
        return (base + suffix)[: self.max_prompt]

    def _add(self, req: Request) -> None:
        self.next_rid += 1
        self.counters["requests_served"] += 1
        self.active.append(req)

    def admit(self, copies: list[_Copy], fresh: list[int]) -> None:
        """A new request; a prefix-cache hit copies the cached boundary block into its block."""
        bs, pool, pcache = self.block_size, self.pool, self.pcache
        prompt = self._new_prompt()
        req = Request(
            rid=self.next_rid,
            running=pool.alloc(),
            folded=[],
            pending=prompt,
            max_new=int(self.rng.integers(self.Q, self.max_new + 1)),
            table=[0] * self.cols,
        )
        # Longest cached block-aligned prefix, leaving at least one token to prefill.
        hit, m = None, (len(prompt) - 1) // bs
        while m > 0 and (hit := pcache.lookup(tuple(prompt[: m * bs]))) is None:
            m -= 1
        if hit is not None:
            for j in range(m):  # share the prefix's cached blocks (never written again)
                b = pcache.lookup(tuple(prompt[: (j + 1) * bs]))
                if b is not None:
                    req.table[j] = b
                    pool.incref(b)
            req.folded, req.pending = prompt[: m * bs], prompt[m * bs :]
            st, hi = self.snapshots[hit]
            req.ref_state = [s.clone() for s in st]
            req.ref_hist = [h.clone() for h in hi]
            copies.append(_Copy(hit, req.running, "hit", req))
            self.counters["cache_hits"] += 1
            self.counters["hit_tokens"] += m * bs
        else:
            req.ref_state, req.ref_hist = self.oracle.zero()
            fresh.append(req.running)
            self.counters["cache_misses"] += 1
        self._add(req)

    def fork(self, parent: Request, copies: list[_Copy]) -> None:
        """A second continuation of ``parent``: its running block copied into a new block."""
        child = Request(
            rid=self.next_rid,
            running=self.pool.alloc(),
            folded=list(parent.folded),
            pending=list(parent.pending),
            max_new=parent.max_new,
            table=[0] * self.cols,
            last=parent.last,
            generated=parent.generated,
            parent=parent.rid,
        )
        # Columns below the written boundaries hold prefix states: shared. A column the parent
        # allocated ahead (not written yet) is not: each request writes its own.
        for j in range(parent.seq_len // self.block_size):
            b = child.table[j] = parent.table[j]
            if b > 0:
                self.pool.incref(b)
        child.ref_state = [s.clone() for s in parent.ref_state]
        child.ref_hist = [h.clone() for h in parent.ref_hist]
        copies.append(_Copy(parent.running, child.running, "fork", child))
        self.counters["forks"] += 1
        self._add(child)

    def finish(self, req: Request) -> None:
        self.active.remove(req)
        self.donors.append(list(req.folded))
        self.pool.decref(req.running)
        for b in req.table:
            self.pool.decref(b)
        self.counters["requests_finished"] += 1

    def schedule(self) -> list[_Copy]:
        """Finish, admit, fork; run the step's copies (one ``copy_blocks`` call per cache)."""
        rng = self.rng
        for req in [r for r in self.active if r.generated >= r.max_new]:
            self.finish(req)
        copies: list[_Copy] = []
        fresh: list[int] = []
        # Arrivals: one when nothing runs, else one with probability 1/2; after each arrival
        # another with probability 1/4.
        while len(self.active) < self.requests and (not self.active or rng.random() < 0.5):
            self.admit(copies, fresh)
            if rng.random() < 0.5:
                break
        if self.step % 4 == 3 and len(self.active) < self.requests:
            decoding = [r for r in self.active if not r.pending]
            if decoding:
                self.fork(decoding[int(rng.integers(len(decoding)))], copies)
        if fresh:  # fresh requests start from a zero state
            for c in self.caches.values():
                c.reset_blocks(fresh)
            self.counters["fresh_blocks_zeroed"] += len(fresh)
        if copies:
            src = np.array([c.src for c in copies], dtype=np.int64)
            dst = np.array([c.dst for c in copies], dtype=np.int64)
            for c in self.caches.values():
                self.counters["plan_copy_copies"] += c.copy_blocks(src, dst)
                self.counters["copy_blocks_calls"] += 1
        return copies

    # ---- one step ----------------------------------------------------------------------------
    def run_step(self, step: int) -> None:
        """Schedule, verify, sample and commit every active request; then check the step."""
        torch, dev, Q, bs = self.torch, self.dev, self.Q, self.block_size
        rng, pool, oracle = self.rng, self.pool, self.oracle
        self.step = oracle.step = step
        t0 = time.perf_counter()
        copies = self.schedule()
        t_sched = time.perf_counter()
        # Ground truth of the copied blocks, before the step touches them (not timed).
        for c in copies:
            oracle.check_block(
                c.req.rid, c.dst, c.req.ref_state, c.req.ref_hist, f"after the {c.why} copy from block {c.src}"
            )
        t_verify = time.perf_counter()
        active = self.active

        # The batch: prefill chunks (all accepted) and speculative windows.
        B = len(active)
        tokens = np.zeros((B, Q), dtype=np.int64)
        qlens = np.zeros(B, dtype=np.int64)
        n_acc = np.zeros(B, dtype=np.int64)
        is_prefill = np.zeros(B, dtype=bool)
        for i, r in enumerate(active):
            if r.pending:
                chunk = r.pending[:Q]
                tokens[i, : len(chunk)] = chunk
                qlens[i] = n_acc[i] = len(chunk)
                is_prefill[i] = True
            else:
                tokens[i, 0] = r.last
                tokens[i, 1:] = rng.integers(0, VOCAB, size=self.num_spec)
                qlens[i] = Q
                a = 0  # drafts accepted: a seeded pattern
                while a < self.num_spec and rng.random() < _ACCEPT_P:
                    a += 1
                n_acc[i] = a + 1
            # The block-table block of a boundary this window may cross (at most one: bs >= Q).
            end = r.seq_len + int(qlens[i])
            if end // bs * bs > r.seq_len and r.table[end // bs - 1] == 0:
                r.table[end // bs - 1] = pool.alloc()
        blocks = np.array([r.running for r in active], dtype=np.int64)
        seq_lens = np.array([r.seq_len for r in active], dtype=np.int64)
        width = max([j + 1 for r in active for j, b in enumerate(r.table) if b] or [1])
        table = np.array([r.table[:width] for r in active], dtype=np.int64).reshape(B, width)

        # Verify: one batched forward over every window.
        h = self.embed[torch.as_tensor(tokens, device=dev)]
        recs = []
        for ly in self.stack:
            h, rec = ly.forward(h, blocks, qlens)
            recs.append(rec)
        greedy = (rms(h) @ self.embed.T).argmax(-1).cpu().numpy()  # [B, Q]

        # Commit (align mode), every layer of both caches.
        plans = {
            kind: c.commit(n_acc, blocks, qlens, seq_lens=seq_lens, block_table=table, block_size=bs)
            for kind, c in self.caches.items()
        }
        t1 = time.perf_counter()
        self.step_ms.append((t1 - t0 - (t_verify - t_sched)) * 1e3)

        boundaries = oracle.check_step(active, recs, n_acc, blocks, plans)
        cnt = self.counters
        cnt["commits"] += len(plans[KINDS[0]])
        cnt["boundary_states"] += len(boundaries)
        cnt["boundary_layer_states"] += len(boundaries) * len(self.stack)

        # Bookkeeping: tokens, sampled tokens, boundary blocks -> prefix cache.
        for i, r in enumerate(active):
            n = int(n_acc[i])
            if is_prefill[i]:
                r.folded.extend(r.pending[:n])
                r.pending = r.pending[n:]
                cnt["prefill_tokens"] += n
                if not r.pending:
                    r.last = int(greedy[i, n - 1])  # the first generated token
            else:
                r.folded.extend(int(t) for t in tokens[i, :n])
                r.last = int(greedy[i, n - 1])  # the bonus token
                r.generated += n
                cnt["decode_windows"] += 1
                cnt["tokens_accepted"] += n
                cnt["drafts_proposed"] += self.num_spec
                cnt["drafts_accepted"] += n - 1
                self.accepted_hist[n - 1] += 1
            if i in boundaries:
                bb, snap = boundaries[i]
                self.snapshots[bb] = snap
                if self.pcache.register(tuple(r.folded[: r.seq_len // bs * bs]), bb):
                    cnt["prefix_cache_registered"] += 1
        self.check_ms.append((time.perf_counter() - t1 + t_verify - t_sched) * 1e3)

    def check_cached(self) -> int:
        """Re-check every cached prefix block against its reference; returns how many."""
        return self.oracle.check_cached(self.pcache.entries.items(), self.snapshots)

    def __repr__(self) -> str:
        return (
            f"Engine(layers={len(self.stack)}, requests={self.requests}, "
            f"block_size={self.block_size}, num_spec={self.num_spec}, step={self.step}, "
            f"active={len(self.active)})"
        )
