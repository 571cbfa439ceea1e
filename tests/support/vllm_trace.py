"""Random multi-step align-mode traces run through vLLM's own step code (the oracle) and through
:class:`recoverssm_rs.vllm.VllmMambaStep`, side by side, over two identical copies of the states.

The simulated scheduler follows vLLM's rules: new requests (some with prefix-cache hits at a block
boundary), chunked prefill with block-aligned chunk ends except the prompt's last, speculative
decoding with random draft counts and acceptance, requests skipped for a step (their accepted count
resets to 1, as vLLM's ``add_request`` does), preemption and resume, finished requests. Block
tables are sparse: only the columns a request uses hold blocks, the rest the null block 0.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any

import numpy as np
import torch

from . import vllm_oracle

# mamba type -> (state kinds) ; conv windows are (W, dim) in SD, (dim, W) in DS
KINDS = {"GDN_ATTN": ("conv", "temporal"), "SHORT_CONV": ("conv",), "LINEAR": ("temporal",)}


def paged_views(num_blocks: int, shapes: Any, device: str = "cpu") -> list[torch.Tensor]:
    """One layer's states bound as vLLM binds them: one float32 buffer of ``num_blocks`` pages,
    each page the states of ``shapes`` one after another, and a strided view of it per state (so
    the states share one storage)."""
    sizes = [int(np.prod(s)) for s in shapes]
    raw = torch.zeros(num_blocks * sum(sizes), device=device)
    views, at = [], 0
    for shape, size in zip(shapes, sizes, strict=True):
        inner = [int(np.prod(shape[k + 1 :])) for k in range(len(shape))]
        views.append(raw.as_strided((num_blocks, *shape), (sum(sizes), *inner), at))
        at += size
    return views


@dataclasses.dataclass
class GroupCfg:
    mamba_type: str
    layers: int
    conv_dim: int = 6
    temporal_shape: tuple[int, ...] = (2, 3, 4)
    dtype: torch.dtype = torch.float32


@dataclasses.dataclass
class Req:
    rid: str
    prompt: int
    computed: int = 0
    accepted: int = 1
    cols: list[dict[int, int]] = dataclasses.field(default_factory=list)  # per vLLM group: col -> block
    running: int = -1  # the harness's view (only for choosing columns to allocate)


class Sim:
    """Shared engine state of one trace (block pool, requests, block tables)."""

    def __init__(
        self,
        groups: list[GroupCfg],
        block_size: int,
        nsb: int,
        conv_layout: str,
        seed: int,
        num_blocks: int = 600,
        max_reqs: int = 8,
        max_cols: int = 24,
    ) -> None:
        self.rng = np.random.default_rng(seed)
        self.groups, self.bs, self.nsb, self.layout = groups, block_size, nsb, conv_layout
        self.nb, self.max_reqs, self.cols = num_blocks, max_reqs, max_cols
        self.free = list(range(num_blocks - 1, 0, -1))  # block 0 is the null block
        self.cached: list[list[int]] = [[] for _ in groups]  # per group: blocks of finished requests (read-only)
        self.reqs: dict[str, Req] = {}
        self.next_id = 0
        self.waiting: list[Req] = []
        self.width = 3 + nsb  # conv kernel 4: W = K - 1 + num_spec

    # -- states ----------------------------------------------------------------------------------
    def shapes(self, g: GroupCfg) -> list[tuple[int, ...]]:
        out = []
        for kind in KINDS[g.mamba_type]:
            if kind == "conv":
                out.append((self.width, g.conv_dim) if self.layout == "SD" else (g.conv_dim, self.width))
            else:
                out.append(g.temporal_shape)
        return out

    def make_states(self, shared_pages: bool = False) -> list[list[list[torch.Tensor]]]:
        """Per group, per layer, the kv_cache list (persistent states + one extra uncopied tensor).

        ``shared_pages``: as vLLM's hybrid allocator lays them out, layer ``i`` of every group
        views one buffer of padded pages (``[state0 | state1 | ... | padding]`` per block), and the
        groups' block ids come from one pool (float32 groups only)."""
        gen = torch.Generator().manual_seed(int(self.rng.integers(1 << 30)))
        pages: list[torch.Tensor] = []
        if shared_pages:
            page = max(sum(int(np.prod(s)) for s in self.shapes(g)) for g in self.groups) + 3  # padding
            pages = [torch.randn(self.nb, page, generator=gen) for _ in range(max(g.layers for g in self.groups))]
        out = []
        for g in self.groups:
            layers = []
            for li in range(g.layers):
                if shared_pages:
                    ts, off = [], 0
                    for s in self.shapes(g):
                        inner = [int(np.prod(s[k + 1 :])) for k in range(len(s))]
                        ts.append(pages[li].as_strided((self.nb, *s), (pages[li].stride(0), *inner), off))
                        off += int(np.prod(s))
                else:
                    ts = [torch.randn((self.nb, *s), generator=gen, dtype=g.dtype) for s in self.shapes(g)]
                ts.append(torch.zeros(self.nb, 2))  # e.g. a ReplaySSM ring: never copied
                layers.append(ts)
            out.append(layers)
        return out

    @staticmethod
    def clone_states(states: list[list[list[torch.Tensor]]]) -> list[list[list[torch.Tensor]]]:
        """An identical copy, views of shared buffers staying views of (copied) shared buffers."""
        bases: dict[int, torch.Tensor] = {}
        out = []
        for g in states:
            gl = []
            for layer in g:
                ll = []
                for t in layer:
                    base = t._base if t._base is not None else None
                    if base is None:
                        ll.append(t.clone())
                        continue
                    nb_ = bases.setdefault(id(base), base.clone())
                    ll.append(nb_.as_strided(t.shape, t.stride(), t.storage_offset()))
                gl.append(ll)
            out.append(gl)
        return out

    def alloc(self) -> int:
        return self.free.pop()

    # -- scheduling ------------------------------------------------------------------------------
    def new_request(self) -> Req:
        r = Req(f"req-{self.next_id}", prompt=int(self.rng.integers(1, 5 * self.bs)))
        self.next_id += 1
        r.cols = [dict() for _ in self.groups]
        return r

    def admit(self, r: Req) -> None:
        """A new or resumed request: computed tokens from a prefix-cache hit (or 0)."""
        r.computed, r.accepted, r.running = 0, 1, -1
        r.cols = [dict() for _ in self.groups]
        if self.cached and all(self.cached) and self.rng.random() < 0.4:
            k = int(self.rng.integers(1, max(2, r.prompt // self.bs + 1)))
            if k * self.bs < r.prompt or self.rng.random() < 0.3:
                r.computed = k * self.bs
                r.prompt = max(r.prompt, r.computed + 1)
                for gi in range(len(self.groups)):
                    cache = self.cached[gi]
                    r.cols[gi][k - 1] = cache[int(self.rng.integers(len(cache)))]

    def schedule(self, r: Req) -> tuple[int, int]:
        """``(num_scheduled, num_draft)`` for ``r`` this step."""
        c, bs = r.computed, self.bs
        if c < r.prompt:  # prefill: chunk ends block-aligned except the prompt's last chunk
            left = r.prompt - c
            if self.rng.random() < 0.5:
                return left, 0
            end = (c // bs + int(self.rng.integers(1, 3))) * bs
            return (min(end, r.prompt) - c), 0
        d = int(self.rng.integers(0, self.nsb + 1))
        return 1 + d, d

    def ensure_cols(self, r: Req, n: int) -> None:
        """Allocate the columns the step may touch: the previous running column, the window
        ``curr ..= curr + nsb`` and everything between (boundary columns)."""
        prev = r.running if r.running >= 0 else (r.computed - 1) // self.bs
        curr = (r.computed + n - 1) // self.bs
        lo = max(0, min(prev, curr) - 1)
        for gi in range(len(self.groups)):
            for col in range(lo, curr + self.nsb + 1):
                if col not in r.cols[gi] and not (
                    r.computed > 0 and r.running < 0 and col < (r.computed - 1) // self.bs
                ):
                    r.cols[gi][col] = self.alloc()
        assert curr + self.nsb < self.cols, "trace too long for the block-table width"

    def release(self, r: Req, keep: bool) -> None:
        for gi, cols in enumerate(r.cols):
            for b in cols.values():
                if b in self.cached[gi]:
                    continue  # a prefix-cache hit's block stays cached
                if keep and len(self.cached[gi]) < 40 and self.rng.random() < 0.3:
                    self.cached[gi].append(b)
                else:
                    self.free.append(b)
        r.cols = [dict() for _ in self.groups]


# ------------------------------------------------------------------------------------------------
# vLLM-shaped objects (what the runner passes) for one side
# ------------------------------------------------------------------------------------------------


class BlockTable:
    def __init__(self, rows: int, cols: int) -> None:
        self.t = torch.zeros(rows, cols, dtype=torch.int32)
        self.device: DeviceMode | None = None  # where get_device_tensor places the rows

    def get_device_tensor(self, n: int) -> Any:
        return self.t[:n] if self.device is None else self.device.vector(self.t[:n].numpy())

    def get_numpy_array(self) -> np.ndarray:
        return self.t.numpy()


class Side:
    """One engine's runner-held objects: states, forward context, input batch, requests."""

    def __init__(self, sim: Sim, states: list[list[list[torch.Tensor]]], ns: types.SimpleNamespace | None) -> None:
        self.sim = sim
        self.states = states
        self.layer_names = [[f"g{gi}.l{li}" for li in range(g.layers)] for gi, g in enumerate(sim.groups)]
        self.forward_context = {
            name: types.SimpleNamespace(kv_cache=states[gi][li])
            for gi, names in enumerate(self.layer_names)
            for li, name in enumerate(names)
        }
        self.specs = [
            vllm_oracle.MambaSpec(
                shapes=tuple(sim.shapes(g)),
                dtypes=tuple([g.dtype] * len(KINDS[g.mamba_type])),
                block_size=sim.bs,
                mamba_type=g.mamba_type,
                num_speculative_blocks=sim.nsb,
            )
            for g in sim.groups
        ]
        self.kv_cache_config = types.SimpleNamespace(
            kv_cache_groups=[
                types.SimpleNamespace(kv_cache_spec=spec, layer_names=names)
                for spec, names in zip(self.specs, self.layer_names)
            ]
        )
        self.acc_tensor = torch.ones(sim.max_reqs, dtype=torch.int32)
        self.input_batch = types.SimpleNamespace(
            req_ids=[],
            block_table=[BlockTable(sim.max_reqs, sim.cols) for _ in sim.groups],
            num_accepted_tokens_cpu=self.acc_tensor.numpy(),
            num_accepted_tokens_cpu_tensor=self.acc_tensor,
        )
        self.requests: dict[str, Any] = {}
        self.ns = ns

    def copy_funcs(self, ns: types.SimpleNamespace | None) -> dict[str, tuple[Any, ...]]:
        if ns is None:
            return {t: tuple(f"get_{k}_copy_spec" for k in KINDS[t]) for t in KINDS}
        f = {"conv": ns.lmu.get_conv_copy_spec, "temporal": ns.lmu.get_temporal_copy_spec}
        return {t: tuple(f[k] for k in KINDS[t]) for t in KINDS}

    def load_batch(self, batch: list[Req]) -> None:
        ib = self.input_batch
        ib.req_ids = [r.rid for r in batch]
        for gi, bt in enumerate(ib.block_table):
            bt.t.zero_()
            for i, r in enumerate(batch):
                for col, b in r.cols[gi].items():
                    bt.t[i, col] = b
        for i, r in enumerate(batch):
            ib.num_accepted_tokens_cpu[i] = r.accepted
        self.requests = {
            r.rid: types.SimpleNamespace(
                num_computed_tokens=r.computed,
                block_ids=tuple(
                    [int(x) for x in ib.block_table[gi].t[i].tolist()] for gi in range(len(self.sim.groups))
                ),
            )
            for i, r in enumerate(batch)
        }


def scheduler_output(
    batch: list[Req], sched: dict[str, tuple[int, int]], finished: set[str], preempted: set[str], resumed: set[str]
) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        num_scheduled_tokens={r.rid: sched[r.rid][0] for r in batch},
        scheduled_spec_decode_tokens={r.rid: [0] * sched[r.rid][1] for r in batch if sched[r.rid][1]},
        finished_req_ids=finished,
        preempted_req_ids=preempted,
        scheduled_cached_reqs=types.SimpleNamespace(resumed_req_ids=resumed),
    )


# ------------------------------------------------------------------------------------------------
# The two engines and the trace driver
# ------------------------------------------------------------------------------------------------


class VllmSide:
    """vLLM 0.33's own step functions over one copy of the states."""

    def __init__(self, ns: types.SimpleNamespace, side: Side) -> None:
        self.ns, self.side = ns, side
        sim = side.sim
        self.funcs = side.copy_funcs(ns)
        self.mamba_state_idx: dict[str, int] = {}
        self.bufs = ns.wmu.MambaBuffers.create(
            sim.max_reqs,
            side.kv_cache_config,
            self.funcs,
            lambda n, dtype: vllm_oracle.CpuGpuBuffer(n, dtype=dtype),
            torch.device("cpu"),
            sim.nsb > 0,
        )
        self.cache_config = types.SimpleNamespace(enable_prefix_caching=True)

    def pre(self, so: Any) -> None:
        s, ib = self.side, self.side.input_batch
        self.ns.wmu.preprocess_mamba(
            so,
            s.kv_cache_config,
            self.cache_config,
            self.mamba_state_idx,
            ib,
            s.requests,
            s.forward_context,
            self.funcs,
            self.bufs.preprocess,
            self.bufs.postprocess_align,
        )
        ctx = self.bufs.postprocess_align
        if ctx is not None:
            self.ns.wmu.stage_postprocess_inputs_to_gpu(
                ctx, so, ib.req_ids, len(ib.req_ids), s.requests, self.mamba_state_idx
            )

    def post(self, accepted: np.ndarray) -> np.ndarray:
        s, ib = self.side, self.side.input_batch
        n = len(ib.req_ids)
        if self.bufs.postprocess_align is not None and n:
            self.ns.wmu.postprocess_mamba_align_gpu(
                bufs=self.bufs,
                num_reqs=n,
                num_accepted_tokens_gpu=torch.tensor(accepted, dtype=torch.int32),
                num_accepted_tokens_cpu_tensor=ib.num_accepted_tokens_cpu_tensor,
                input_batch=ib,
                kv_cache_config=s.kv_cache_config,
                forward_context=s.forward_context,
                mamba_state_copy_funcs=self.funcs,
            )
            return ib.num_accepted_tokens_cpu[:n].astype(np.int64).copy()
        return accepted.copy()


class HostAdapterSide:
    """The adapter's host path as the reference side (where vLLM's wheel is not at hand: a GPU
    machine checks the device path against the host path, which the oracle traces hold equal to
    vLLM)."""

    def __init__(self, side: Side, conv_layout: str) -> None:
        from recoverssm_rs.vllm import VllmMambaStep

        self.side = side
        self.step = VllmMambaStep.from_runner(
            side.kv_cache_config,
            side.forward_context,
            side.copy_funcs(None),
            max_num_reqs=side.sim.max_reqs,
            conv_layout=conv_layout,
        )

    def pre(self, so: Any) -> None:
        self.step.preprocess(so, self.side.input_batch, self.side.requests)

    def post(self, accepted: np.ndarray) -> np.ndarray:
        return np.asarray(self.step.postprocess(accepted)) if len(accepted) else accepted.copy()


@dataclasses.dataclass
class DeviceMode:
    """How the device path's trace places its tensors: ``place`` gives the state tensor the trace
    writes (the identity for host-backed fakes, ``.cuda()`` on a GPU), ``bind`` what the adapter
    binds, ``vector`` a device vector of host ints."""

    place: Any
    bind: Any
    vector: Any


#: A GPU run's placement: the adapter's tensors copied to the current CUDA device and bound as
#: they are, vectors made there.
CUDA = DeviceMode(
    place=lambda t: t.cuda(), bind=lambda t: t, vector=lambda a: torch.from_numpy(np.ascontiguousarray(a)).cuda()
)


def pre_moves(batch: list[Req], curr: list[int], block_size: int) -> int:
    """Requests whose state the pre-copy moves: a running column (the stored one, or the column of
    the computed tokens for a new request) that is set and is not this step's ``curr``."""
    return sum(
        1
        for r, c in zip(batch, curr)
        if (r.running if r.running >= 0 else (r.computed - 1) // block_size) not in (-1, c)
    )


def forward_writes(
    batch: list[Req],
    curr: list[int],
    nsb: int,
    states_v: list[list[list[torch.Tensor]]],
    *others: list[list[list[torch.Tensor]]],
) -> None:
    """The forward pass: random bytes into every persistent state of each request's window columns
    ``curr .. curr + nsb`` of every group, the same on every side (the last tensor of a layer, the
    ring, is left alone)."""
    for i, r in enumerate(batch):
        for gi in range(len(states_v)):
            for col in range(curr[i], curr[i] + nsb + 1):
                b = r.cols[gi][col]
                for li, lv in enumerate(states_v[gi]):
                    for si, tv in enumerate(lv[:-1]):
                        v = torch.randn(tv.shape[1:], dtype=tv.dtype)
                        tv[b].copy_(v)
                        for o in others:
                            o[gi][li][si][b].copy_(v)


def _equal(a: list[list[list[torch.Tensor]]], b: list[list[list[torch.Tensor]]]) -> str | None:
    for gi, (ga, gb) in enumerate(zip(a, b)):
        for li, (la, lb) in enumerate(zip(ga, gb)):
            for si, (ta, tb) in enumerate(zip(la, lb)):
                tb = tb.cpu()
                same = (
                    torch.equal(ta.view(torch.uint8), tb.view(torch.uint8))
                    if ta.is_contiguous()
                    else torch.equal(ta, tb) and torch.equal(ta._base.view(torch.uint8), tb._base.view(torch.uint8))
                )
                if not same:
                    diff = (ta != tb).reshape(ta.shape[0], -1).any(1).nonzero().flatten().tolist()
                    return f"group {gi}, layer {li}, state {si}: blocks {diff[:10]} differ"
    return None


@dataclasses.dataclass
class TraceStats:
    steps: int = 0
    pre_copies: int = 0
    post_copies: int = 0
    prefix_hits: int = 0
    preempted: int = 0
    skipped: int = 0
    backwards: int = 0
    busy_steps: int = 0  # steps with at least one request


class AdapterUnderTest:
    """The adapter's side of a trace: its own copy of the states and runner objects, run through the
    host path or, with ``device`` (see :class:`DeviceMode`), the device path: the accepted counts
    then go in as device vectors (every other step; staged from the host copy otherwise; every
    third step as ``prev_rows``, the step remapping its last counts to the reordered batch on the
    device), and with ``device_tables`` the kernel reads the batch's device block tables."""

    def __init__(
        self,
        sim: Sim,
        states_v: list[list[list[torch.Tensor]]],
        conv_layout: str,
        device: DeviceMode | None,
        device_tables: bool,
    ) -> None:
        from recoverssm_rs.vllm import VllmMambaStep

        states = Sim.clone_states(states_v)
        if device is not None:
            states = [[[device.place(t) for t in layer] for layer in g] for g in states]
        self.states, self.device = states, device
        self.side = Side(sim, states, None)
        self.name = "adapter" if device is None else f"adapter (device{', device tables' if device_tables else ''})"
        context = self.side.forward_context
        if device is not None:
            context = {
                k: types.SimpleNamespace(kv_cache=[device.bind(t) for t in v.kv_cache]) for k, v in context.items()
            }
        self.step = VllmMambaStep.from_runner(
            self.side.kv_cache_config,
            context,
            self.side.copy_funcs(None),
            max_num_reqs=sim.max_reqs,
            conv_layout=conv_layout,
            device_tables=device_tables,
        )
        if device is not None and device_tables:
            for bt in self.side.input_batch.block_table:
                bt.device = device
        assert (self.step.device_step is not None) == (device is not None)
        self.prev_order: dict[str, int] = {}  # the last batch's rows

    def pre(self, step: int, so: Any, batch: list[Req]) -> list[int]:
        """The pre-copy; the accepted counts it leaves."""
        ib, n, device = self.side.input_batch, len(batch), self.device
        if device is None:
            self.step.preprocess(so, ib, self.side.requests)
            out = ib.num_accepted_tokens_cpu[:n].tolist()
        else:  # the previous counts as a device vector (every other step: staged from the host copy)
            prev = ib.num_accepted_tokens_cpu[:n]
            acc_in = device.vector(prev.astype(np.int32)) if step % 2 else None
            if step % 3 == 2:  # rows new to the batch (-1) read 1, as vLLM's add_request resets them
                rows = device.vector(np.array([self.prev_order.get(r.rid, -1) for r in batch], dtype=np.int64))
                out = _host(self.step.preprocess(so, ib, self.side.requests, prev_rows=rows))
            else:
                out = _host(self.step.preprocess(so, ib, self.side.requests, num_accepted=acc_in))
        self.prev_order = {r.rid: i for i, r in enumerate(batch)}
        return out

    def post(self, acc: np.ndarray) -> list[int]:
        """The post-process of the sampled counts ``acc``; the counts it returns."""
        if self.device is None:
            return (self.step.postprocess(acc) if len(acc) else acc.copy()).tolist()
        return _host(self.step.postprocess(self.device.vector(acc.astype(np.int32))))


def _host(x: Any) -> list[int]:
    return [int(v) for v in (x.cpu() if hasattr(x, "cpu") else x)]


def run_trace(
    ns: types.SimpleNamespace | None,
    groups: list[GroupCfg],
    *,
    block_size: int,
    nsb: int,
    conv_layout: str,
    seed: int,
    steps: int = 24,
    shared_pages: bool = False,
    device: DeviceMode | None = None,
    device_tables: bool = False,
    adapters: list[tuple[DeviceMode | None, bool]] | None = None,
) -> TraceStats:
    """Run one random trace through vLLM (``ns``: the oracle; ``None``: the adapter's host path
    instead) and the adapter; AssertionError at the first difference.

    ``device``, ``device_tables``: run the adapter's device path instead of its host path (see
    :class:`AdapterUnderTest`). ``adapters``: several adapters instead, each ``(device,
    device_tables)``, each over its own copy of the states, all held equal to the one run of the
    reference (vLLM's side costs nearly all of a trace's time: its Triton kernels are interpreted)."""
    if ns is not None:
        vllm_oracle.set_conv_layout(ns, conv_layout)
    sim = Sim(groups, block_size, nsb, conv_layout, seed)
    rng = sim.rng
    states_v = sim.make_states(shared_pages)
    ours = [
        AdapterUnderTest(sim, states_v, conv_layout, d, dt)
        for d, dt in (adapters if adapters is not None else [(device, device_tables)])
    ]
    side_v = Side(sim, states_v, ns)
    vllm: Any = VllmSide(ns, side_v) if ns is not None else HostAdapterSide(side_v, conv_layout)

    stats = TraceStats()
    running: list[Req] = []
    skipped_last: set[str] = set()
    finished_next: set[str] = set()
    for step in range(steps):
        finished, preempted, resumed = finished_next, set(), set()
        finished_next = set()
        if running and rng.random() < 0.12:  # preempt one request
            r = running.pop(int(rng.integers(len(running))))
            sim.release(r, keep=False)
            preempted.add(r.rid)
            sim.waiting.append(r)
            stats.preempted += 1
        while len(running) < sim.max_reqs and rng.random() < 0.6:
            if sim.waiting and rng.random() < 0.5:
                r = sim.waiting.pop(0)
                resumed.add(r.rid)
            else:
                r = sim.new_request()
            sim.admit(r)
            stats.prefix_hits += r.computed > 0
            running.append(r)
        batch = [r for r in running if not (len(running) > 1 and rng.random() < 0.1)]
        stats.skipped += len(running) - len(batch)
        order = rng.permutation(len(batch))
        batch = [batch[i] for i in order]
        for r in batch:
            if r.rid in skipped_last:
                r.accepted = 1  # re-added to the persistent batch: vLLM's add_request resets it
        skipped_last = {r.rid for r in running} - {r.rid for r in batch}
        sched = {r.rid: sim.schedule(r) for r in batch}
        for r in batch:
            sim.ensure_cols(r, sched[r.rid][0])
        so = scheduler_output(batch, sched, finished, preempted, resumed)
        for side in (side_v, *(a.side for a in ours)):
            side.load_batch(batch)
        n = len(batch)
        # pre-copy
        vllm.pre(so)
        a_v = side_v.input_batch.num_accepted_tokens_cpu[:n].tolist()
        for a in ours:
            a_o = a.pre(step, so, batch)
            assert a_v == a_o, f"step {step}: num_accepted after the pre-copy: vLLM {a_v}, {a.name} {a_o}"
            err = _equal(states_v, a.states)
            assert err is None, f"step {step}, after the pre-copy ({a.name}): {err}"
        curr = [(r.computed + sched[r.rid][0] - 1) // sim.bs for r in batch]
        stats.backwards += sum(1 for r, c in zip(batch, curr) if r.running > c)
        stats.pre_copies += pre_moves(batch, curr, sim.bs)
        forward_writes(batch, curr, nsb, states_v, *(a.states for a in ours))
        # sampling and post-process
        acc = np.array([int(rng.integers(1, sched[r.rid][1] + 2)) for r in batch], dtype=np.int64)
        out_v = vllm.post(acc)
        for a in ours:
            out_o = a.post(acc)
            assert out_v.tolist() == out_o, (
                f"step {step}: num_accepted after the post-process: vLLM {out_v.tolist()}, {a.name} {out_o}"
            )
            err = _equal(states_v, a.states)
            assert err is None, f"step {step}, after the post-process ({a.name}): {err}"
        for i, r in enumerate(batch):
            n_s, d = sched[r.rid]
            stats.post_copies += int(
                ((r.computed + n_s - d + acc[i] - 1) // sim.bs) * sim.bs >= r.computed + n_s - d and d > 0
            )
            r.computed = r.computed + n_s - d + int(acc[i]) - 1
            r.accepted = int(out_v[i])  # every side returned these counts (a device's feed its next step)
            r.running = curr[i]
            if r.computed >= r.prompt + 2 * sim.bs and rng.random() < 0.3:
                running.remove(r)
                sim.release(r, keep=True)
                finished_next.add(r.rid)
        stats.steps += 1
        stats.busy_steps += n > 0
    return stats


#: The traces the conformance tests replay (tests/vllm/): name -> (groups, block_size,
#: num_speculative_blocks, conv layout, seed[, shared pages]).
TRACES = {
    "gdn-SD-spec2": ([GroupCfg("GDN_ATTN", 2)], 4, 2, "SD", 11),
    "gdn-DS-spec2": ([GroupCfg("GDN_ATTN", 2)], 4, 2, "DS", 12),
    "3groups-DS-spec2": (
        [GroupCfg("GDN_ATTN", 1), GroupCfg("SHORT_CONV", 1, conv_dim=5), GroupCfg("LINEAR", 1, temporal_shape=(3, 4))],
        4,
        2,
        "DS",
        13,
    ),
    "2groups-SD-bs2-spec3": ([GroupCfg("GDN_ATTN", 1), GroupCfg("SHORT_CONV", 2, conv_dim=3)], 2, 3, "SD", 14),
    "gdn-SD-nospec-scalar": ([GroupCfg("GDN_ATTN", 2), GroupCfg("SHORT_CONV", 1)], 4, 0, "SD", 15),
    "gdn-DS-nospec-scalar": ([GroupCfg("GDN_ATTN", 1)], 3, 0, "DS", 16),
    # vLLM's hybrid allocator: layer i of every group views one buffer of padded pages
    "3groups-DS-shared-pages": (
        [GroupCfg("GDN_ATTN", 2), GroupCfg("SHORT_CONV", 1, conv_dim=5), GroupCfg("LINEAR", 2, temporal_shape=(3, 4))],
        4,
        2,
        "DS",
        21,
        True,
    ),
    "2groups-SD-shared-pages": (
        [GroupCfg("GDN_ATTN", 1), GroupCfg("LINEAR", 1, temporal_shape=(3, 4))],
        4,
        1,
        "SD",
        22,
        True,
    ),
}


def small_model_state(max_num_reqs: int = 4, *, fake: bool = True) -> tuple[Any, list[torch.Tensor]]:
    """A one-group ``ModelStateV2`` (GDN: conv + temporal, block_size 4, 2 drafts) over 16 blocks of
    host states, built by ``from_runner`` from stand-ins of vLLM's runner objects; ``fake``: the
    states claim to be CUDA tensors (``FakeCuda``). Returns the adapter and its states."""
    from recoverssm_rs.vllm.model_state import ModelStateV2

    states = [torch.randn(16, 5, 3), torch.randn(16, 2, 2)]
    cfg, ctx, funcs = small_runner_objects(states, fake=fake)
    return ModelStateV2.from_runner(cfg, ctx, funcs, max_num_reqs=max_num_reqs, device="cpu"), states


def small_runner_objects(
    states: list[torch.Tensor], *, fake: bool = True
) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """Stand-ins of vLLM's runner objects for one GDN group (conv ``[16, 5, 3]`` + temporal
    ``[16, 2, 2]``, block_size 4, 2 drafts) over ``states``: the KV-cache config, the forward
    context and the copy functions ``from_runner`` takes; ``fake``: the states claim to be CUDA
    tensors (``FakeCuda``)."""
    from .device_fakes import FakeCuda

    spec = types.SimpleNamespace(
        mamba_type="GDN_ATTN",
        shapes=[(5, 3), (2, 2)],
        dtypes=[torch.float32] * 2,
        block_size=4,
        num_speculative_blocks=2,
        mamba_cache_mode="align",
    )
    cfg = types.SimpleNamespace(kv_cache_groups=[types.SimpleNamespace(kv_cache_spec=spec, layer_names=["l0"])])
    bind = FakeCuda if fake else (lambda t: t)
    ctx = {"l0": types.SimpleNamespace(kv_cache=[bind(t) for t in states])}
    funcs = {"GDN_ATTN": ("get_conv_copy_spec", "get_temporal_copy_spec")}
    return cfg, ctx, funcs
