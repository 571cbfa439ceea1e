"""The package's main job, ``python -m recoverssm_rs demo``: an end-to-end serving check.

A toy hybrid model (random weights, seeded) with GDN layers (scalar gate, SD conv windows, float32
records) and KDA layers (per-channel gate, DS conv windows, bfloat16 conv + key/gate records,
float32 recurrent state, as the Kimi-K3-like preset) is served the way an engine serves it:

1. **Scheduling** (every step): finished requests free their blocks; new requests arrive. An
   arrival whose prompt shares a block-aligned prefix with a cached boundary state (a "prefix-cache
   hit") copies that boundary block into its fresh running block and prefills only the rest; other
   arrivals start from a zeroed block. Some running requests **fork**: their running block is copied
   into a new block and both continue with different drafts. All of a step's copies go through
   :meth:`StateCache.copy_blocks` (planned and checked by :meth:`CopyPlanner.plan_copy`). A free
   list hands out running blocks and block-table (prefix-cache) blocks; a small LRU prefix cache
   with reference counts keeps boundary blocks after their request finishes.
2. **Verify**: one batched forward over every active request's window. Prefilling requests feed up
   to ``Q = num_spec + 1`` prompt tokens (query_len <= Q, all accepted); decoding requests feed
   ``[last_token, d_1 .. d_k]`` with ``k = num_spec`` random draft tokens. Per layer: RMS-norm ->
   conv input projection -> :meth:`StateCache.conv_verify` -> SiLU -> split into q, k, v; raw gate
   and raw beta projections -> :func:`recurrence.prepare` -> :meth:`StateCache.verify` -> output
   projection + residual. Logits are the tied embedding.
3. **Sample**: a seeded random pattern accepts ``a`` in ``0..k`` drafts; ``num_accepted = a + 1``
   and the greedy token at position ``a`` (the bonus token) is the next window's first input.
4. **Commit** (align mode): :meth:`StateCache.commit` folds the accepted records into every layer's
   running state and compacts the conv windows; when a window crosses a multiple of
   ``block_size`` the boundary state is written into the request's block-table block, which is
   then registered in the prefix cache.
5. **Ground truth** (after every step, outside the timed serving path): every request keeps, per
   layer, a reference recurrent state and conv history advanced by decoding *only its accepted
   tokens, one at a time*, with the plain recurrence (:func:`recurrence.sequential_decode` with one
   token) and a plain causal conv over the history, fed with that layer's inputs from the step.
   Checked against the cache: every running block (recurrent state and conv window, every layer),
   every boundary block written (at its boundary), every block a copy produced (right after the
   copy), the verify outputs and conv outputs at accepted positions (so, layer by layer, the
   served forward equals token-by-token decoding) and the core's choice of boundary blocks. At the
   end every cached prefix block is re-checked against its reference (nothing overwrote it).

Tolerance: recurrent states and outputs must agree to ``TOLERANCE`` (1e-4) in *scaled* max-abs
error ``max|cache - ref| / max(1, max|ref|)`` (states and outputs here are O(1): unit-norm keys,
beta < 1, decays < 1). The commit reproduces the same float32 operations in a different order, so
the measured error is around 1e-7 (reported as ``max_state_err``). Conv windows and copies are
pure data movement and must match bit for bit (``max_conv_err`` is 0).

:func:`run` reports progress through a callback (and the ``recoverssm_rs.demo`` logger); it
never prints. The CLI prints the progress lines to stderr and the summary to stdout.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from . import recurrence

import numpy as np

__all__ = ["add_parser", "run", "TOLERANCE", "PRESET"]

log = logging.getLogger("recoverssm_rs.demo")

PRESET = "kimi-k3-like-recoverssm"
TOLERANCE = 1e-4
"""Scaled max-abs tolerance for recurrent states and outputs (see the module docstring)."""

DEFAULTS: dict[str, Any] = dict(
    device="cpu", steps=384, requests=8, layers=2, seed=0, block_size=8, num_spec=3,
)

# Toy model dimensions.
_HEADS = 4
_HEAD_DIM = 32
_GDN_K_HEADS = 2  # GQA-style key heads for GDN (expanded to the 4 value heads)
_CONV_K = 4
_HIDDEN = 64
_VOCAB = 64
_ACCEPT_P = 0.65  # probability that each next draft is accepted (seeded pattern)


# ----------------------------------------------------------------------------------------------
# bookkeeping: blocks, prefix cache, requests


class _BlockPool:
    """Free list + reference counts over block ids ``1..num_blocks-1`` (0 is the null block)."""

    def __init__(self, num_blocks: int) -> None:
        self.free = list(range(num_blocks - 1, 0, -1))  # pop() hands out low ids first
        self.refs: dict[int, int] = {}
        self.evict: Callable[[], bool] | None = None
        self.on_free: Callable[[int], object] | None = None
        self.peak_used = 0
        self.num_blocks = num_blocks

    def alloc(self) -> int:
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
        if b <= 0:
            return
        self.refs[b] -= 1
        if self.refs[b] == 0:
            del self.refs[b]
            self.free.append(b)
            if self.on_free is not None:
                self.on_free(b)


class _PrefixCache:
    """Block-aligned token prefix -> boundary block, LRU, holding one reference per entry."""

    def __init__(self, pool: _BlockPool) -> None:
        self.pool = pool
        self.entries: OrderedDict[tuple[int, ...], int] = OrderedDict()
        self.evictions = 0
        pool.evict = self._evict_one

    def register(self, key: tuple[int, ...], block: int) -> bool:
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


@dataclass
class _Request:
    rid: int
    running: int  # running-state block
    folded: list[int]  # tokens folded into the running state
    pending: list[int]  # prompt tokens still to prefill
    max_new: int
    table: list[int] = field(default_factory=list)  # block-table (boundary) blocks, 0 = none
    last: int = -1  # next input token once the prompt is done
    generated: int = 0
    # Reference (ground truth), per layer of the stack: recurrent state [H, V, K] (float32) and
    # conv history [dim, K-1] (conv dtype).
    ref_state: list[Any] = field(default_factory=list)
    ref_hist: list[Any] = field(default_factory=list)
    parent: int | None = None

    @property
    def seq_len(self) -> int:
        return len(self.folded)


# ----------------------------------------------------------------------------------------------
# the toy model


class _Layer:
    def __init__(self, kind: recurrence.Kind, index: int, cache: Any, gen: Any, device: Any) -> None:
        import torch

        self.kind: recurrence.Kind = kind
        self.index = index  # layer index inside its StateCache
        self.cache = cache
        g = cache.geometry
        self.H, self.K, self.V = int(g["heads"]), int(g["head_k_dim"]), int(g["head_v_dim"])
        self.dim = int(g["conv_dim"])
        self.kc = cache.conv_kernel_size
        self.layout = cache.conv_layout
        self.conv_dtype = cache.conv_state(index).dtype
        self.nk = _GDN_K_HEADS if kind == "gdn" else self.H
        H, K, V, D = self.H, self.K, self.V, _HIDDEN
        assert self.dim == 2 * self.nk * K + H * V

        def rnd(*shape: int, scale: float = 1.0) -> Any:
            return (torch.randn(*shape, generator=gen) * scale).to(device)

        self.w_in = rnd(D, self.dim, scale=D**-0.5)
        self.conv_w = rnd(self.dim, self.kc, scale=self.kc**-0.5)
        gate_cols = H * K if kind == "kda" else H
        self.w_g = rnd(D, gate_cols, scale=D**-0.5)
        self.w_b = rnd(D, H, scale=D**-0.5)
        self.A_log = torch.log(torch.rand(H, generator=gen) * 1.5 + 0.5).to(device)
        dt_shape = (H, K) if kind == "kda" else (H,)
        self.dt_bias = (torch.rand(*dt_shape, generator=gen) * 3.0 - 4.0).to(device)
        self.w_out = rnd(H * V, D, scale=0.5 * (H * V) ** -0.5)

    def forward(self, h: Any, blocks: np.ndarray, qlens: np.ndarray) -> tuple[Any, dict[str, Any]]:
        import torch
        import torch.nn.functional as F

        from . import recurrence

        B, Q, _ = h.shape
        H, K, V = self.H, self.K, self.V
        xn = _rms(h)
        # Conv inputs in the cache's conv dtype (a bf16 model produces bf16 activations).
        x = (xn @ self.w_in).to(self.conv_dtype)
        conv_y = self.cache.conv_verify(self.index, blocks, x, self.conv_w)
        y = F.silu(conv_y)
        nkK = self.nk * K
        q = y[..., :nkK].reshape(B, Q, self.nk, K)
        k = y[..., nkK:2 * nkK].reshape(B, Q, self.nk, K)
        v = y[..., 2 * nkK:].reshape(B, Q, H, V)
        if self.nk != H:
            q = q.repeat_interleave(H // self.nk, dim=2)
            k = k.repeat_interleave(H // self.nk, dim=2)
        raw_g = xn @ self.w_g
        raw_g = raw_g.reshape(B, Q, H, K) if self.kind == "kda" else raw_g
        raw_b = xn @ self.w_b
        p = recurrence.prepare(self.kind, q, k, raw_g, raw_b, self.A_log, self.dt_bias)
        o = self.cache.verify(self.index, blocks, p.q_hat, p.k_hat, v, p.gate, p.beta,
                              query_lens=torch.as_tensor(qlens))
        h = h + o.reshape(B, Q, H * V) @ self.w_out
        rec = dict(x=x, conv_y=conv_y, q_hat=p.q_hat, k_hat=p.k_hat, v=v, gate=p.gate,
                   beta=p.beta, out=o)
        return h, rec

    # views of the cache for checks ---------------------------------------------------------
    def conv_head(self, blocks: Any) -> Any:
        """``[n, dim, K-1]`` conv history of ``blocks`` (the first K-1 window columns)."""
        win = self.cache.conv_state(self.index)[blocks]
        if self.layout == "SD":
            win = win.transpose(1, 2)
        return win[:, :, : self.kc - 1]

    def rec_state(self, blocks: Any) -> Any:
        return self.cache.recurrent_state(self.index)[blocks]


def _rms(h: Any) -> Any:
    import torch

    return h * torch.rsqrt((h * h).mean(-1, keepdim=True) + 1e-6)


# ----------------------------------------------------------------------------------------------
# the run


class _Stats:
    def __init__(self) -> None:
        self.checks = 0
        self.mismatches = 0
        self.max_state_err = 0.0
        self.max_output_err = 0.0
        self.max_conv_err = 0.0
        self.max_state_abs = 0.0  # the magnitude the state errors are relative to
        self.first_mismatches: list[str] = []

    def fail(self, what: str) -> None:
        self.mismatches += 1
        if len(self.first_mismatches) < 20:  # the first ones tell the story
            self.first_mismatches.append(what)
            log.warning("mismatch: %s", what)

    def close(self, kind: str, got: Any, ref: Any, what: str) -> None:
        """Scaled max-abs comparison of states / outputs (kind "state" or "output")."""
        import torch

        got = got.float()
        ref = ref.float()
        mag = float(ref.abs().max()) if ref.numel() else 0.0
        err = float((got - ref).abs().max()) / max(1.0, mag) if ref.numel() else 0.0
        self.checks += 1
        if kind == "state":
            self.max_state_err = max(self.max_state_err, err)
            self.max_state_abs = max(self.max_state_abs, mag)
        else:
            self.max_output_err = max(self.max_output_err, err)
        if not (err <= TOLERANCE) or not bool(torch.isfinite(got).all()):
            self.fail(f"{what}: scaled error {err:.3g} > {TOLERANCE:g}")

    def exact(self, got: Any, ref: Any, what: str) -> None:
        """Bit-for-bit comparison (conv windows: pure data movement)."""
        self.checks += 1
        err = float((got.float() - ref.float()).abs().max()) if ref.numel() else 0.0
        self.max_conv_err = max(self.max_conv_err, err)
        if not (got.dtype == ref.dtype and bool((got == ref).all())):
            self.fail(f"{what}: conv window differs (max abs diff {err:.3g})")


@dataclass
class _Copy:
    src: int
    dst: int
    why: str  # "hit" or "fork"
    req: _Request


class _Demo:
    """One run of the demo: the model, the caches, the scheduler state and the ground truth."""

    def __init__(self, *, device: str, steps: int, requests: int, layers: int, seed: int,
                 block_size: int, num_spec: int) -> None:
        import torch

        from . import layouts
        from .state_cache import StateCache

        self.torch = torch
        self.dev = torch.device(device)
        self.steps, self.requests, self.layers = steps, requests, layers
        self.seed, self.block_size, self.num_spec = seed, block_size, num_spec
        self.Q = Q = num_spec + 1
        self.rng = np.random.default_rng(seed)
        gen = torch.Generator().manual_seed(seed)

        # Sizes: prompts, generations, block-table columns, pool.
        self.max_prompt = 3 * block_size + 6
        self.max_new = 6 * Q + 8
        max_seq = self.max_prompt + self.max_new + 2 * Q
        self.cols = max_seq // block_size + 2
        # The worst case of the active requests (a running block and a full block table each)
        # plus room for the prefix cache, which evicts its least recently used unshared entry
        # when the free list runs dry.
        self.num_blocks = 1 + requests * (self.cols + 1) + 4 * requests

        gdn_layout = layouts.gdn(
            num_k_heads=_GDN_K_HEADS, num_v_heads=_HEADS, head_k_dim=_HEAD_DIM,
            head_v_dim=_HEAD_DIM, conv_kernel_size=_CONV_K, num_spec=num_spec, conv_layout="SD",
            dtype="float32", ssm_dtype="float32", recover_ssm=True)
        kda_layout = layouts.kda(
            num_heads=_HEADS, head_dim=_HEAD_DIM, conv_kernel_size=_CONV_K, num_spec=num_spec,
            conv_layout="DS", dtype="bfloat16", ssm_dtype="float32", recover_ssm=True)
        self.caches = {
            kind: StateCache(lay, num_layers=layers, num_blocks=self.num_blocks,
                             max_requests=requests, device=self.dev)
            for kind, lay in (("gdn", gdn_layout), ("kda", kda_layout))
        }
        # The hybrid stack interleaves the kinds: GDN 0, KDA 0, GDN 1, KDA 1, ...
        self.stack = [_Layer(kind, i, self.caches[kind], gen, self.dev)
                      for i in range(layers) for kind in ("gdn", "kda")]
        self.embed = torch.randn(_VOCAB, _HIDDEN, generator=gen).to(self.dev)

        self.pool = _BlockPool(self.num_blocks)
        self.pcache = _PrefixCache(self.pool)
        # Ground truth of every written boundary block: block -> (per-layer states, histories).
        self.snapshots: dict[int, tuple[list[Any], list[Any]]] = {}
        self.pool.on_free = lambda b: self.snapshots.pop(b, None)
        self.stats = _Stats()
        self.counters = dict(
            requests_served=0, requests_finished=0, prefill_tokens=0, decode_windows=0,
            tokens_accepted=0, drafts_proposed=0, drafts_accepted=0, cache_hits=0,
            cache_misses=0, hit_tokens=0, forks=0, copy_blocks_calls=0, plan_copy_copies=0,
            fresh_blocks_zeroed=0, commits=0, boundary_states=0, boundary_layer_states=0,
            prefix_cache_registered=0,
        )
        self.accepted_hist = [0] * (num_spec + 1)
        self.active: list[_Request] = []
        self.donors: list[list[int]] = []  # finished requests' tokens (prompts sharing a prefix)
        self.system_prompt = [int(t) for t in self.rng.integers(0, _VOCAB, size=2 * block_size)]
        self.next_rid = 0
        self.step = -1
        self.step_ms: list[float] = []
        self.check_ms: list[float] = []

    # ---- scheduling ----------------------------------------------------------------------
    def _zero_ref(self) -> tuple[list[Any], list[Any]]:
        torch, dev = self.torch, self.dev
        st = [torch.zeros(ly.H, ly.V, ly.K, device=dev) for ly in self.stack]
        hi = [torch.zeros(ly.dim, ly.kc - 1, dtype=ly.conv_dtype, device=dev) for ly in self.stack]
        return st, hi

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
        suffix = [int(t) for t in rng.integers(0, _VOCAB, size=int(rng.integers(1, bs + 4)))]
        return (base + suffix)[: self.max_prompt]

    def _add(self, req: _Request) -> None:
        self.next_rid += 1
        self.counters["requests_served"] += 1
        self.active.append(req)

    def admit(self, copies: list[_Copy], fresh: list[int]) -> None:
        """A new request; a prefix-cache hit copies the cached boundary block into its block."""
        bs, pool, pcache = self.block_size, self.pool, self.pcache
        prompt = self._new_prompt()
        req = _Request(rid=self.next_rid, running=pool.alloc(), folded=[], pending=prompt,
                       max_new=int(self.rng.integers(self.Q, self.max_new + 1)),
                       table=[0] * self.cols)
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
            req.folded, req.pending = prompt[: m * bs], prompt[m * bs:]
            st, hi = self.snapshots[hit]
            req.ref_state = [s.clone() for s in st]
            req.ref_hist = [h.clone() for h in hi]
            copies.append(_Copy(hit, req.running, "hit", req))
            self.counters["cache_hits"] += 1
            self.counters["hit_tokens"] += m * bs
        else:
            req.ref_state, req.ref_hist = self._zero_ref()
            fresh.append(req.running)
            self.counters["cache_misses"] += 1
        self._add(req)

    def fork(self, parent: _Request, copies: list[_Copy]) -> None:
        """A second continuation of ``parent``: its running block copied into a new block."""
        child = _Request(rid=self.next_rid, running=self.pool.alloc(),
                         folded=list(parent.folded), pending=list(parent.pending),
                         max_new=parent.max_new, table=[0] * self.cols, last=parent.last,
                         generated=parent.generated, parent=parent.rid)
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

    def finish(self, req: _Request) -> None:
        self.active.remove(req)
        self.donors.append(list(req.folded))
        self.pool.decref(req.running)
        for b in req.table:
            self.pool.decref(b)
        self.counters["requests_finished"] += 1

    def zero_blocks(self, blocks: list[int]) -> None:
        """Fresh requests start from a zero state."""
        if not blocks:
            return
        for c in self.caches.values():
            c.reset_blocks(blocks)
        self.counters["fresh_blocks_zeroed"] += len(blocks)

    def schedule(self) -> list[_Copy]:
        """Finish, admit, fork; run the step's copies (one ``copy_blocks`` call per cache)."""
        rng = self.rng
        for req in [r for r in self.active if r.generated >= r.max_new]:
            self.finish(req)
        copies: list[_Copy] = []
        fresh: list[int] = []
        if self.step < 0:  # the initial batch leaves room for arrivals and forks
            for _ in range(max(1, self.requests - 2)):
                self.admit(copies, fresh)
        else:
            while len(self.active) < self.requests and (not self.active or rng.random() < 0.5):
                self.admit(copies, fresh)
                if rng.random() < 0.5:
                    break
            if self.step % 4 == 3 and len(self.active) < self.requests:
                decoding = [r for r in self.active if not r.pending]
                if decoding:
                    self.fork(decoding[int(rng.integers(len(decoding)))], copies)
        self.zero_blocks(fresh)
        if copies:
            src = np.array([c.src for c in copies], dtype=np.int64)
            dst = np.array([c.dst for c in copies], dtype=np.int64)
            for c in self.caches.values():
                self.counters["plan_copy_copies"] += c.copy_blocks(src, dst)
                self.counters["copy_blocks_calls"] += 1
        return copies

    # ---- checks ------------------------------------------------------------------------------
    def check_block(self, rid: int, block: int, states: list[Any], hists: list[Any],
                    what: str) -> None:
        """Every layer's recurrent state and conv history of ``block`` against the reference."""
        idx = self.torch.tensor([block], device=self.dev)
        for li, ly in enumerate(self.stack):
            tag = f"step {self.step} request {rid} layer {li} ({ly.kind}) block {block} {what}"
            self.stats.close("state", ly.rec_state(idx)[0], states[li], f"{tag} recurrent state")
            self.stats.exact(ly.conv_head(idx)[0], hists[li], f"{tag} conv window")

    # ---- one step ----------------------------------------------------------------------------
    def run_step(self) -> None:
        torch, dev, Q, bs = self.torch, self.dev, self.Q, self.block_size
        rng, pool = self.rng, self.pool
        t0 = time.perf_counter()
        copies = self.schedule()
        t_sched = time.perf_counter()
        # Ground truth of the copied blocks, before the step touches them (not timed).
        for c in copies:
            self.check_block(c.req.rid, c.dst, c.req.ref_state, c.req.ref_hist,
                             f"after the {c.why} copy from block {c.src}")
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
                tokens[i, 1:] = rng.integers(0, _VOCAB, size=self.num_spec)
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
        greedy = (_rms(h) @ self.embed.T).argmax(-1).cpu().numpy()  # [B, Q]

        # Commit (align mode), every layer of both caches.
        plans = {kind: c.commit(n_acc, blocks, qlens, seq_lens=seq_lens, block_table=table,
                                block_size=bs) for kind, c in self.caches.items()}
        t1 = time.perf_counter()
        self.step_ms.append((t1 - t0 - (t_verify - t_sched)) * 1e3)

        expect_bnd = self.check_step(active, recs, n_acc, blocks, plans)

        # Bookkeeping: tokens, sampled tokens, boundary blocks -> prefix cache.
        cnt = self.counters
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
            if i in expect_bnd:
                bb, snap = expect_bnd[i]
                self.snapshots[bb] = snap
                if self.pcache.register(tuple(r.folded[: r.seq_len // bs * bs]), bb):
                    cnt["prefix_cache_registered"] += 1
        self.check_ms.append((time.perf_counter() - t1 + t_verify - t_sched) * 1e3)

    def check_step(self, active: list[_Request], recs: list[dict[str, Any]], n_acc: np.ndarray,
                   blocks: np.ndarray, plans: dict[str, np.ndarray],
                   ) -> dict[int, tuple[int, tuple[list[Any], list[Any]]]]:
        """Advance every request's reference by its accepted tokens, one at a time, and compare:
        conv and verify outputs at accepted positions, running blocks, boundary blocks and the
        commit plans' boundaries. Returns ``{row: (boundary block, reference snapshot)}``."""
        from . import recurrence

        torch, dev, bs, stats = self.torch, self.dev, self.block_size, self.stats
        L = len(self.stack)
        # Boundaries, as the engine expects them; the commit plans must agree.
        expect: dict[int, tuple[int, int]] = {}
        for i, r in enumerate(active):
            bnd = (r.seq_len + int(n_acc[i])) // bs * bs
            if bnd > r.seq_len:
                expect[i] = (r.table[bnd // bs - 1], bnd - r.seq_len)
        rows = plans["gdn"]
        got = {int(x["request"]): (int(x["boundary_block"]), int(x["boundary_len"]))
               for x in rows if x["boundary_block"] >= 0}
        stats.checks += 1
        if got != expect or not np.array_equal(plans["gdn"], plans["kda"]):
            stats.fail(f"step {self.step}: commit plan boundaries {got} != expected {expect}")
        self.counters["commits"] += len(rows)
        self.counters["boundary_states"] += len(expect)
        self.counters["boundary_layer_states"] += len(expect) * L

        snaps: dict[int, tuple[list[Any], list[Any]]] = {
            i: ([None] * L, [None] * L) for i in expect}
        n_t = torch.as_tensor(n_acc, device=dev)
        idx = torch.as_tensor(blocks, device=dev)
        for li, ly in enumerate(self.stack):
            rec = recs[li]
            S = torch.stack([r.ref_state[li] for r in active])  # [B, H, V, K] float32
            hist = torch.stack([r.ref_hist[li] for r in active])  # [B, dim, K-1] conv dtype
            # The keys and gates the records hold (rounded through the record dtype).
            kg_dtype = ly.cache.workspace(ly.index)[1].dtype
            k_r = rec["k_hat"].to(kg_dtype).float()
            g_r = rec["gate"].to(kg_dtype).float()
            w = ly.conv_w.float()
            for j in range(int(n_acc.max())):
                live = n_t > j
                # Conv: a plain causal conv over the history, then push the input.
                xj = rec["x"][:, j]  # [B, dim]
                y_ref = (torch.cat([hist.float(), xj.float()[:, :, None]], dim=2) * w).sum(-1)
                hist = torch.where(live[:, None, None],
                                   torch.cat([hist[:, :, 1:], xj[:, :, None]], dim=2), hist)
                # Recurrence: one token of the plain recurrence.
                t = slice(j, j + 1)
                out, states = recurrence.sequential_decode(
                    S, rec["q_hat"][:, t], k_r[:, t], rec["v"][:, t], g_r[:, t],
                    rec["beta"][:, t])
                S = torch.where(live[:, None, None, None], states[:, 1], S)
                for i in live.nonzero().flatten().tolist():
                    tag = (f"step {self.step} request {active[i].rid} layer {li} ({ly.kind}) "
                           f"token {j}")
                    stats.close("output", rec["conv_y"][i, j], y_ref[i], f"{tag} conv output")
                    stats.close("output", rec["out"][i, j], out[i, 0], f"{tag} verify output")
                    if i in expect and expect[i][1] == j + 1:
                        snaps[i][0][li] = S[i].clone()
                        snaps[i][1][li] = hist[i].clone()
            got_S, got_h = ly.rec_state(idx), ly.conv_head(idx)
            for i, r in enumerate(active):
                r.ref_state[li] = S[i].clone()
                r.ref_hist[li] = hist[i].clone()
                tag = (f"step {self.step} request {r.rid} layer {li} ({ly.kind}) running block "
                       f"{r.running}")
                stats.close("state", got_S[i], S[i], f"{tag} recurrent state")
                stats.exact(got_h[i], hist[i], f"{tag} conv window")
        for i, (bb, m) in expect.items():
            self.check_block(active[i].rid, bb, *snaps[i], f"boundary after {m} window tokens")
        return {i: (bb, snaps[i]) for i, (bb, _m) in expect.items()}

    def check_cached(self) -> int:
        """Every cached prefix block still holds its boundary state (nothing overwrote it)."""
        for key, b in self.pcache.entries.items():
            self.check_block(-1, b, *self.snapshots[b], f"cached prefix of {len(key)} tokens")
        return len(self.pcache.entries)

    def progress_line(self) -> str:
        c, s = self.counters, self.stats
        return (f"step {self.step + 1:4d}/{self.steps}: {len(self.active)} active, "
                f"{c['requests_served']} served, {c['tokens_accepted']} tokens accepted, "
                f"{c['cache_hits']} hits, {c['forks']} forks, {c['boundary_states']} boundary "
                f"states, {s.checks} checks, {s.mismatches} mismatches, max state err "
                f"{s.max_state_err:.2e}, step {np.median(self.step_ms):.1f} ms")


def _preset_memory(preset: str, requests: int = 256) -> dict[str, Any]:
    """Workspace vs full-state scratch of a RecoverSSM preset, per request and for ``requests``."""
    import torch

    from . import layouts, recurrence

    p = layouts.PRESETS[preset]
    layout = p.layout()
    g = layout.recover_geometry()
    rdt = layout.states[g["recurrent_state"]].dtype
    records = layout.workspace_bytes_per_request * p.num_layers
    # StateCache also keeps each request's verified conv window in the workspace.
    conv = layout.states[g["conv_state"]].nbytes * p.num_layers
    ws = records + conv
    full = recurrence.full_state_scratch_bytes(
        int(g["heads"]), int(g["head_k_dim"]), int(g["head_v_dim"]), int(g["window"]),
        getattr(torch, rdt)) * p.num_layers
    return {
        "preset": preset, "num_layers": p.num_layers, "window": int(g["window"]),
        "record_bytes_per_request": records, "conv_window_bytes_per_request": conv,
        "record_ratio": full / records,
        "workspace_bytes_per_request": ws, "full_state_scratch_bytes_per_request": full,
        "ratio": full / ws, "requests": requests, "workspace_bytes": ws * requests,
        "full_state_scratch_bytes": full * requests,
    }


def run(
    *,
    device: str = DEFAULTS["device"],
    steps: int = DEFAULTS["steps"],
    requests: int = DEFAULTS["requests"],
    layers: int = DEFAULTS["layers"],
    seed: int = DEFAULTS["seed"],
    block_size: int = DEFAULTS["block_size"],
    num_spec: int = DEFAULTS["num_spec"],
    preset: str = PRESET,
    progress: Callable[[str], None] | None = None,
    progress_every: int | None = None,
    num_threads: int | None = 1,
) -> dict[str, Any]:
    """Serve a toy hybrid GDN + KDA model for ``steps`` steps and check every state against the
    token-by-token ground truth after every step. Returns a JSON-serialisable summary
    (``summary["mismatches"] == 0`` when everything agreed).

    Args:
        device: torch device of every tensor ("cpu", "cuda", ...).
        steps: serving steps (each verifies and commits every active request).
        requests: the largest batch (workspace rows); the run starts with ``requests - 2``
            requests and fills up with arrivals and forks.
        layers: layers per kind (the stack interleaves GDN and KDA layers).
        seed: seeds weights, prompts, drafts, acceptance and scheduling.
        block_size: prefix-cache block size in tokens (>= num_spec + 1).
        num_spec: draft tokens per decoding window (``Q = num_spec + 1``).
        preset: the RecoverSSM layout preset whose workspace-vs-scratch memory is reported.
        progress: called with a progress line every ``progress_every`` steps (default: 8 lines
            per run); lines also go to the ``recoverssm_rs.demo`` logger at INFO.
        num_threads: torch intra-op threads on the CPU during the run (restored afterwards;
            ``None`` keeps the process setting). The demo's tensors are tiny: extra threads do not
            help, and on a loaded machine they spin (a step went from ~8 ms to ~600 ms with 2
            threads on 2 busy cores).
    """
    import torch

    saved = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    try:
        return _run(device=device, steps=steps, requests=requests, layers=layers, seed=seed,
                    block_size=block_size, num_spec=num_spec, preset=preset, progress=progress,
                    progress_every=progress_every)
    finally:
        torch.set_num_threads(saved)


def _run(*, device: str, steps: int, requests: int, layers: int, seed: int, block_size: int,
         num_spec: int, preset: str, progress: Callable[[str], None] | None,
         progress_every: int | None) -> dict[str, Any]:
    if min(steps, requests, layers, num_spec) < 1:
        raise ValueError("steps, requests, layers and num_spec must be >= 1")
    if block_size < num_spec + 1:
        raise ValueError(f"block_size = {block_size} must be >= num_spec + 1 = {num_spec + 1}")
    t_start = time.perf_counter()
    every = progress_every or max(1, steps // 8)

    def say(msg: str) -> None:
        log.info("%s", msg)
        if progress is not None:
            progress(msg)

    preset_memory = _preset_memory(preset)  # fails fast (LayoutError) for a non-RecoverSSM preset
    d = _Demo(device=device, steps=steps, requests=requests, layers=layers, seed=seed,
              block_size=block_size, num_spec=num_spec)
    say(f"demo: {len(d.stack)} layers ({layers} GDN [SD conv, fp32 records] + {layers} KDA "
        f"[DS conv, bf16 conv/records, fp32 state]), {_HEADS} heads x {_HEAD_DIM}, "
        f"Q = {d.Q}, block_size = {block_size}, {d.num_blocks} blocks, up to {requests} "
        f"requests, device {d.dev}")
    for step in range(steps):
        d.step = step
        d.run_step()
        if (step + 1) % every == 0 or step + 1 == steps:
            say(d.progress_line())
    cached = d.check_cached()

    c, s = d.counters, d.stats
    return {
        "config": {
            "device": str(d.dev), "steps": steps, "requests": requests, "layers_per_kind": layers,
            "seed": seed, "block_size": block_size, "num_spec": num_spec, "window": d.Q,
            "heads": _HEADS, "head_dim": _HEAD_DIM, "conv_kernel_size": _CONV_K,
            "num_blocks": d.num_blocks,
            "gdn": {"conv_layout": "SD", "conv_dtype": "float32", "record_dtype": "float32",
                    "state_dtype": "float32"},
            "kda": {"conv_layout": "DS", "conv_dtype": "bfloat16", "record_dtype": "bfloat16",
                    "state_dtype": "float32"},
        },
        "steps": steps,
        **c,
        "requests_active_at_end": len(d.active),
        "mean_accepted_per_window": c["tokens_accepted"] / max(c["decode_windows"], 1),
        "accepted_histogram": d.accepted_hist,
        "peak_blocks_used": d.pool.peak_used,
        "prefix_cache_entries_at_end": cached,
        "prefix_cache_evictions": d.pcache.evictions,
        "checks": s.checks,
        "mismatches": s.mismatches,
        "first_mismatches": s.first_mismatches,
        "tolerance": TOLERANCE,
        "max_state_err": s.max_state_err,
        "max_abs_state": s.max_state_abs,
        "max_output_err": s.max_output_err,
        "max_conv_err": s.max_conv_err,
        "memory": {"demo": {k: cache.memory_report().as_dict() for k, cache in d.caches.items()},
                   "preset": preset_memory},
        "step_ms_median": float(np.median(d.step_ms)),
        "check_ms_median": float(np.median(d.check_ms)),
        "wall_s": time.perf_counter() - t_start,
    }


# ----------------------------------------------------------------------------------------------
# CLI


def _human(n: float) -> str:
    from .cli import _human as h

    return h(int(n))


def format_summary(s: dict[str, Any]) -> str:
    """The human-readable summary of :func:`run`'s result."""
    c = s["config"]
    pm = s["memory"]["preset"]
    lines = [
        "",
        f"summary ({c['device']}, seed {c['seed']}, {2 * c['layers_per_kind']} layers, "
        f"Q = {c['window']}, block_size = {c['block_size']}):",
        f"  steps                 {s['steps']} (median {s['step_ms_median']:.2f} ms serving + "
        f"{s['check_ms_median']:.2f} ms ground-truth check per step; {s['wall_s']:.1f} s in all)",
        f"  requests              {s['requests_served']} served ({s['requests_finished']} finished, "
        f"{s['requests_active_at_end']} active at the end), up to {c['requests']} per step",
        f"  tokens                {s['prefill_tokens']} prefilled, {s['tokens_accepted']} accepted in "
        f"{s['decode_windows']} decoding windows (mean {s['mean_accepted_per_window']:.2f} "
        f"per window of {c['window']}; drafts accepted {s['drafts_accepted']}/"
        f"{s['drafts_proposed']}; histogram of num_accepted {s['accepted_histogram']})",
        f"  copies                {s['cache_hits']} prefix-cache hits ({s['hit_tokens']} tokens "
        f"not prefilled, {s['cache_misses']} misses), {s['forks']} forks -> "
        f"{s['copy_blocks_calls']} copy_blocks calls, {s['plan_copy_copies']} plan_copy copies",
        f"  commits               {s['commits']} request commits, {s['boundary_states']} boundary "
        f"states written ({s['boundary_layer_states']} layer states), "
        f"{s['prefix_cache_registered']} prefix-cache entries registered "
        f"({s['prefix_cache_evictions']} evicted; peak {s['peak_blocks_used']} of "
        f"{c['num_blocks'] - 1} blocks in use)",
    ]
    for kind in ("gdn", "kda"):
        m = s["memory"]["demo"][kind]
        lines.append(
            f"  {'memory (' + kind + ')':22}workspace {_human(m['workspace_bytes'])} vs full-state "
            f"scratch {_human(m['full_state_scratch_bytes'])} ({m['scratch_ratio']:.1f}x)"
        )
    lines += [
        f"  memory ({pm['preset']}, {pm['num_layers']} layers, Q = {pm['window']}): "
        f"verify records {_human(pm['record_bytes_per_request'])} "
        f"({pm['record_ratio']:.0f}x less than full-state scratch) + verified conv windows "
        f"{_human(pm['conv_window_bytes_per_request'])} = workspace "
        f"{_human(pm['workspace_bytes_per_request'])} vs full-state scratch "
        f"{_human(pm['full_state_scratch_bytes_per_request'])} per request "
        f"({pm['ratio']:.1f}x); x {pm['requests']} requests: {_human(pm['workspace_bytes'])} vs "
        f"{_human(pm['full_state_scratch_bytes'])}",
        f"  ground truth          {s['checks']} checks; max error |cache - ref| / max(1, "
        f"max|ref|): states {s['max_state_err']:.2e} (max|state| {s['max_abs_state']:.2f}), "
        f"outputs {s['max_output_err']:.2e}; tolerance {s['tolerance']:g}; conv windows max diff "
        f"{s['max_conv_err']:g} (bit-exact required)",
        f"  mismatches            {s['mismatches']}",
    ]
    for m in s["first_mismatches"]:
        lines.append(f"    {m}")
    return "\n".join(lines)


def _layout_only(args: argparse.Namespace) -> int:
    """The old demo: print the preset's layout and validate its copy-function registration."""
    from . import layouts
    from .cli import format_layout
    from .contract import validate_copy_funcs

    p = layouts.PRESETS[args.preset]
    layout = p.layout()
    group = {"mamba_type": layout.backend, "shapes": [s.shape for s in layout.states],
             "dtypes": [s.dtype for s in layout.states]}
    prefix = validate_copy_funcs([group], {layout.backend: [s.copy for s in layout.persistent]})
    print(format_layout(layout, p.num_layers))
    for backend, n in prefix.items():
        print(f"copy functions: {backend} registers {n} copy functions for {len(layout)} states "
              f"(copyable prefix {n}) - valid")
    return 0


def _cmd(args: argparse.Namespace) -> int:
    if args.layout_only:
        return _layout_only(args)
    if not args.json:
        from . import layouts
        from .cli import format_layout

        p = layouts.PRESETS[args.preset]
        print(f"{args.preset}: {p.model}")
        print(format_layout(p.layout(), p.num_layers))
        print()
        sys.stdout.flush()

    def progress(msg: str) -> None:
        if not args.quiet:
            print(msg, file=sys.stderr, flush=True)

    summary = run(device=args.device, steps=args.steps, requests=args.requests,
                  layers=args.layers, seed=args.seed, block_size=args.block_size,
                  num_spec=args.num_spec, preset=args.preset, progress=progress,
                  num_threads=args.threads or None)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(format_summary(summary))
        print("OK: every state matched the token-by-token ground truth" if summary["mismatches"] == 0
              else "FAILED: states differ from the token-by-token ground truth")
    return 0 if summary["mismatches"] == 0 else 1


def add_parser(sub: Any) -> None:
    """Register the ``demo`` subcommand."""
    from . import layouts

    p = sub.add_parser(
        "demo",
        help="the main job: serve a toy hybrid GDN + KDA model with speculative decoding, prefix "
             "caching and forks, checking every state against token-by-token decoding",
        description=(__doc__ or "").split("\n\n")[0],
    )
    p.add_argument("--device", default=DEFAULTS["device"], help="torch device (default: cpu)")
    p.add_argument("--steps", type=int, default=DEFAULTS["steps"])
    p.add_argument("--requests", type=int, default=DEFAULTS["requests"],
                   help="largest batch per step (workspace rows)")
    p.add_argument("--layers", type=int, default=DEFAULTS["layers"], help="layers per kind")
    p.add_argument("--seed", type=int, default=DEFAULTS["seed"])
    p.add_argument("--block-size", type=int, default=DEFAULTS["block_size"], dest="block_size",
                   help="prefix-cache block size in tokens")
    p.add_argument("--num-spec", type=int, default=DEFAULTS["num_spec"], dest="num_spec",
                   help="draft tokens per window")
    p.add_argument("--preset", default=PRESET, choices=sorted(layouts.PRESETS),
                   help="layout preset printed as a header and used for the memory comparison "
                        "(must be a RecoverSSM preset, except with --layout-only)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads during the run (default 1: the tensors are tiny; 0 "
                        "keeps torch's setting)")
    p.add_argument("--json", action="store_true", help="print only the JSON summary on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--layout-only", action="store_true", dest="layout_only",
                   help="only print the preset's layout and validate its copy functions (the "
                        "old demo)")
    p.set_defaults(func=_cmd)
