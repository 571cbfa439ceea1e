"""A test-only oracle for vLLM 0.33.0's GPU-resident runner: its ``MambaHybridModelState``
(``vllm/v1/worker/gpu/model_states/mamba_hybrid.py``) loaded by path from the cached wheel (see
:mod:`support.vllm_oracle`) with stand-ins for the runner classes it builds on, its Triton kernels
(``preprocess_mamba_align_fused_kernel``, ``precopy_mamba_align_fused_kernel``, the count scatter /
fill and ``postprocess_mamba_fused_kernel``) run by Triton's interpreter over CPU tensors.

:func:`run_trace` replays a random multi-step trace through vLLM's model state and through
:class:`recoverssm_rs.vllm.ModelStateV2` (its launches through the host emulation of the package's
kernel), side by side, comparing every state byte, every per-slot count and running column after
every half-step. No vLLM code is stored in this repository.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any

import numpy as np
import torch

from . import vllm_oracle, vllm_trace

MEMBER = "vllm/v1/worker/gpu/model_states/mamba_hybrid.py"
NAME = "vllm.v1.worker.gpu.model_states.mamba_hybrid"
#: vLLM's RecoverSSM pieces of the runner: the metadata contract and ``RecoverSSMState`` (its
#: ``commit_step`` and ``_postprocess_recoverssm_align_kernel``), loaded for real.
RECOVER = [
    ("vllm/v1/attention/backends/recoverssm_metadata.py", "vllm.v1.attention.backends.recoverssm_metadata"),
    ("vllm/v1/worker/gpu/model_states/recoverssm.py", "vllm.v1.worker.gpu.model_states.recoverssm"),
]


class _ModelStateBase:
    """Stand-in for vLLM's ``DefaultModelState``: what ``MambaHybridModelState`` reads of it."""

    def __init__(self, vllm_config: Any, model: Any, encoder_cache: Any, device: Any) -> None:
        self.vllm_config, self.model, self.device = vllm_config, model, device
        self.max_num_reqs = vllm_config.scheduler_config.max_num_seqs

    def add_request(self, req_index: int, new_req_data: Any) -> None:
        pass


class _Buffer(vllm_oracle.CpuGpuBuffer):
    def __init__(self, *size: int, dtype: Any, device: Any = None) -> None:
        super().__init__(*size, dtype=dtype)


_LOADED: types.ModuleType | None = None


def load() -> types.ModuleType:
    """vLLM's ``mamba_hybrid`` module (``MambaHybridModelState`` and its count kernels), loaded
    once per process on top of :func:`support.vllm_oracle.load`."""
    global _LOADED
    if _LOADED is not None:
        return _LOADED
    ns = vllm_oracle.load()
    path = vllm_oracle.extracted(MEMBER)
    stubs = vllm_oracle._stubs(ns.envs)
    stubs["vllm.v1.worker.mamba_utils"] = ns.wmu
    stubs["vllm.model_executor.layers.mamba.mamba_utils"] = ns.lmu
    stubs["vllm.v1.worker.gpu.model_states.default"] = vllm_oracle._module(
        "vllm.v1.worker.gpu.model_states.default", DefaultModelState=_ModelStateBase
    )
    for name in [
        "vllm.config.compilation",
        "vllm.v1.attention.backends.gdn_attn",
        "vllm.v1.attention.backends.mamba2_attn",
        "vllm.v1.attention.backends.short_conv_attn",
        "vllm.v1.worker.gpu",
        "vllm.v1.worker.gpu.attn_utils",
        "vllm.v1.worker.gpu.block_table",
        "vllm.v1.worker.gpu.input_batch",
        "vllm.v1.worker.gpu.mm",
        "vllm.v1.worker.gpu.mm.encoder_cache",
        "vllm.v1.worker.gpu.model_states",
        "vllm.v1.worker.gpu.model_states.interface",
    ]:
        stubs.setdefault(name, vllm_oracle._module(name))
    stubs.setdefault("vllm.v1.worker.utils", vllm_oracle._module("vllm.v1.worker.utils", AttentionGroup=object))
    with vllm_oracle.stubbed(stubs, keep=[NAME, *(n for _, n in RECOVER)]):
        recover = {name: vllm_oracle.exec_by_path(name, vllm_oracle.extracted(member)) for member, name in RECOVER}
        mod = vllm_oracle.exec_by_path(NAME, path)
    mod.CpuGpuBuffer = _Buffer  # type: ignore[attr-defined]
    mod.recoverssm_metadata = recover[RECOVER[0][1]]  # type: ignore[attr-defined]
    _LOADED = mod
    return mod


def vllm_model_state(
    mh: types.ModuleType, side: vllm_trace.Side, tables: list[torch.Tensor], max_num_reqs: int, recoverssm: bool = False
) -> Any:
    """vLLM's ``MambaHybridModelState`` over ``side``'s states (align mode, RecoverSSM as asked)."""
    funcs = side.copy_funcs(side.ns)
    cfg = types.SimpleNamespace(
        scheduler_config=types.SimpleNamespace(max_num_seqs=max_num_reqs),
        cache_config=types.SimpleNamespace(
            mamba_cache_mode="align", mamba_block_size=side.sim.bs, use_kda_recoverssm=recoverssm
        ),
        compilation_config=types.SimpleNamespace(static_forward_context=side.forward_context),
    )
    model = types.SimpleNamespace(get_mamba_state_copy_funcs=lambda types_: funcs)
    ms = mh.MambaHybridModelState(cfg, model, None, torch.device("cpu"))
    bts = types.SimpleNamespace(
        block_tables=[types.SimpleNamespace(gpu=t) for t in tables], input_block_tables=list(tables)
    )
    ms.initialize_kv_cache(side.kv_cache_config, bts)
    return ms


@dataclasses.dataclass
class V2Stats:
    steps: int = 0
    pre_moves: int = 0
    post_saves: int = 0
    prefix_hits: int = 0
    pp_rows: int = 0
    preempted: int = 0
    int_counts: int = 0
    lagged: int = 0
    commits: int = 0
    non_last: int = 0


class _Recover:
    """The RecoverSSM layers of a trace: one :class:`~recoverssm_rs.speculative.StateCache` per
    side (KDA, one layer, equal random contents), slot ``s`` owning running block ``1 + s * per``
    and the ``cols`` blocks after it as its block table."""

    def __init__(self, mh: types.ModuleType, m: int, cols: int, nsb: int, seed: int, on: Any) -> None:
        from recoverssm_rs import layouts
        from recoverssm_rs.speculative.state_cache import StateCache

        layout = layouts.kda(
            num_heads=2,
            head_dim=4,
            conv_kernel_size=3,
            num_spec=nsb,
            dtype="float32",
            ssm_dtype="float32",
            recover_ssm=True,
        )
        self.mh, self.per, self.cols = mh, cols + 1, cols
        shape = dict(num_layers=1, num_blocks=1 + m * self.per, max_requests=m)
        # vLLM's side on the host; the adapter's where its states are (``on``: a device placement)
        device = on(torch.zeros(1)).device
        self.caches = [StateCache(layout, **shape), StateCache(layout, **shape, device=device)]
        self.gen = torch.Generator().manual_seed(seed)
        self.tol = 0.0
        self.randomize(["conv", "recurrent"])

    def randomize(self, names: list[str]) -> None:
        """Equal random contents of the named buffers on both sides (the workspace: a verify's records)."""
        for k in names:
            t = self.caches[0].buffers()[k]
            t.copy_(torch.randn(t.shape, generator=self.gen) * 0.5)
            self.caches[1].buffers()[k].copy_(t)

    def step(
        self, cache: Any, slots: list[int], rows: list[int], computed: list[int], qlens: list[int]
    ) -> dict[str, Any]:
        """The commit arguments of the spec-decode ``rows`` (batch rows; ``computed`` per batch row)."""
        sl = torch.tensor([slots[i] for i in rows], dtype=torch.int64)
        base = 1 + sl * self.per
        return dict(
            cache=cache,
            request_indices=torch.tensor(rows, dtype=torch.int64),
            state_blocks=base.numpy(),
            num_computed_tokens=torch.tensor(computed, dtype=torch.int32),
            block_table=(base[:, None] + 1 + torch.arange(self.cols)[None, :]).to(torch.int32),
            query_lens=torch.tensor([qlens[i] for i in rows], dtype=torch.int64).numpy(),
        )

    def vllm_metadata(self, args: dict[str, Any], block_size: int) -> Any:
        """A stand-in for the model's ``RecoverSSMMetadata``: its fold is the package's host commit
        (vLLM's own fold is the model's KDA kernel over its own record format); the column and
        count bookkeeping after it is vLLM's ``commit_step``."""
        rm = self.mh.recoverssm_metadata

        class Meta(rm.RecoverSSMMetadata):  # type: ignore[name-defined,misc]
            def commit_recoverssm_state(self, num_accepted: torch.Tensor) -> Any:
                rows = args["request_indices"]
                args["cache"].commit(
                    num_accepted[rows],
                    args["state_blocks"],
                    args["query_lens"],
                    seq_lens=args["num_computed_tokens"][rows],
                    block_table=args["block_table"],
                    block_size=block_size,
                )
                return rm.RecoverSSMPostprocessMetadata(
                    num_spec_decodes=int(rows.shape[0]),
                    request_indices=rows,
                    block_table=args["block_table"],
                    num_computed_tokens=args["num_computed_tokens"],
                    block_size=block_size,
                )

        return Meta()

    def equal(self) -> str | None:
        for k, t in self.caches[0].buffers().items():
            o = self.caches[1].buffers()[k].cpu()
            if k == "recurrent" and self.tol:
                if not torch.allclose(t, o, atol=self.tol, rtol=self.tol):
                    return f"RecoverSSM cache {k} differs beyond {self.tol}"
            elif not torch.equal(t, o):
                return f"RecoverSSM cache {k} differs"
        return None


def run_trace(
    mh: types.ModuleType,
    groups: list[vllm_trace.GroupCfg],
    *,
    block_size: int,
    nsb: int,
    conv_layout: str,
    seed: int,
    steps: int = 16,
    launches: list[int] | None = None,
    emulator: Any = None,
    recoverssm: bool = False,
    commit_kernel: Any = None,
    static: bool = False,
    device: vllm_trace.DeviceMode | None = None,
    graphs: bool = False,
    non_last_rank: float = 0.0,
) -> V2Stats:
    """One random trace through vLLM's ``MambaHybridModelState`` and ``ModelStateV2``.

    The scheduler is :class:`support.vllm_trace.Sim` (prefix hits, chunked prefill, drafts,
    preemption and resume, finished requests); requests live in request-state slots, the batch is
    a random permutation of the scheduled slots, and under simulated pipeline parallelism some
    rows of the post-process's ``idx_mapping`` are ``-1`` (that request's step is dropped). Under
    asynchronous scheduling the runner sizes a prefill chunk from the host's optimistic mirror of
    the computed tokens, while the model state reads only the device's per-slot counts: some chunks
    therefore end off a block boundary.
    ``launches``: the package launches of each half-step are appended (from ``emulator``).
    ``recoverssm``: vLLM's ``RecoverSSMState.commit_step`` runs in its post-process (the spec-decode
    rows' commit into a RecoverSSM state cache, then its column / count kernel) and the adapter gets
    the same commit (:class:`~recoverssm_rs.vllm.model_state.RecoverSSMCommit`); both caches are
    compared too. ``commit_kernel(cache)``: called on the adapter's cache (e.g. to run its commits
    through an emulated kernel); its recurrent states are then compared within ``1e-5``.
    ``static``: the adapter reads the runner's inputs from tensors fixed for the whole trace
    (``max_num_reqs`` rows, the batch padded with ``-1`` rows; counts always a tensor), as under a
    CUDA graph. ``device``: the adapter's states, RecoverSSM cache and inputs on a real device
    (``place``; ``bind`` what it binds), its launches real ones (a GPU; ``None``: host tensors
    seen as CUDA ones through the seam). ``non_last_rank``: the fraction of steps whose post-process
    is called as vLLM's pipeline-parallel ranks other than the last call it,
    ``postprocess_state(idx_mapping, 0)`` (no computed tokens: vLLM fills the counts with 1 and
    makes no aligned save), on both sides. ``graphs`` (with ``static`` and a CUDA ``device``): from
    the second step on, each half is captured once in a ``torch.cuda.CUDAGraph`` and replayed.
    AssertionError at the first difference."""
    from recoverssm_rs.vllm.model_state import ModelStateV2

    from .device_fakes import FakeCuda

    ns = vllm_oracle.load()
    vllm_oracle.set_conv_layout(ns, conv_layout)
    sim = vllm_trace.Sim(groups, block_size, nsb, conv_layout, seed)
    rng = sim.rng
    m = sim.max_reqs
    states_v = sim.make_states()
    states_o = vllm_trace.Sim.clone_states(states_v)
    on: Any = (lambda t: t) if device is None else device.place  # where the adapter's inputs live
    if device is not None:
        states_o = [[[device.place(t) for t in layer] for layer in g] for g in states_o]
    side_v, side_o = vllm_trace.Side(sim, states_v, ns), vllm_trace.Side(sim, states_o, None)
    tables = [torch.zeros(m, sim.cols, dtype=torch.int32) for _ in groups]
    vms = vllm_model_state(mh, side_v, tables, m, recoverssm)
    rec = _Recover(mh, m, sim.cols, nsb, seed, on) if recoverssm else None
    if rec is not None and commit_kernel is not None:
        commit_kernel(rec.caches[1])
    if rec is not None and (commit_kernel is not None or device is not None):
        rec.tol = 1e-5  # the commit kernel (emulated or real) against the torch reference
    bind: Any = FakeCuda if device is None else device.bind
    context = {
        k: types.SimpleNamespace(kv_cache=[bind(t) for t in v.kv_cache]) for k, v in side_o.forward_context.items()
    }
    ours = ModelStateV2.from_runner(
        side_o.kv_cache_config,
        context,
        side_o.copy_funcs(None),
        max_num_reqs=m,
        conv_layout=conv_layout,
        device="cpu" if bind is FakeCuda else None,  # through the seam: the adapter's buffers on the host
    )
    tables_o = [on(t) for t in tables]  # the adapter's view of the runner's tables
    nct = torch.zeros(m, dtype=torch.int32)  # the runner's per-slot computed tokens (device-resident in vLLM)
    fixed = {
        k: on(torch.zeros(n, dtype=torch.int32))
        for k, n in (("idx", m), ("post_idx", m), ("qsl", m + 1), ("sampled", m))
    }
    nct_o = on(nct)
    slot_of: dict[str, int] = {}
    free = list(range(m - 1, -1, -1))
    running: list[vllm_trace.Req] = []
    finished_next: list[vllm_trace.Req] = []
    stats = V2Stats()

    captured: dict[str, Any] = {}

    def run_half(step: int, half: str, fn: Any) -> None:
        """The adapter's half-step ``fn()``: eager, or under ``graphs`` captured once and replayed."""
        if not graphs or step == 0:
            fn()
            return
        if half not in captured:
            captured[half] = torch.cuda.CUDAGraph()
            with torch.cuda.graph(captured[half]):
                fn()
        captured[half].replay()

    def check(step: int, half: str) -> None:
        err = vllm_trace._equal(states_v, states_o) or (rec.equal() if rec is not None else None)
        assert err is None, f"step {step}, after the {half}: {err}"
        word = ours.last_error()
        assert word.ok, f"step {step}, after the {half}: the adapter reported {word}"
        for r in running:
            s = slot_of[r.rid]
            pair = [(int(vms._mamba_state_idx_gpu[s]), int(vms.num_accepted_tokens_gpu[s]))]
            pair.append((int(ours.state_idx[s]), int(ours.num_accepted[s])))
            assert pair[0] == pair[1], (
                f"step {step}, after the {half}: slot {s} (column, count): vLLM {pair[0]}, ours {pair[1]}"
            )

    def fill_tables() -> None:
        for gi, t in enumerate(tables):
            t.zero_()
            for r in running:
                for col, b in r.cols[gi].items():
                    t[slot_of[r.rid], col] = b
            if tables_o[gi] is not t:
                tables_o[gi].copy_(t)

    for step in range(steps):
        for r in finished_next:
            free.append(slot_of.pop(r.rid))
        finished_next = []
        if running and rng.random() < 0.12:  # preempt one request: its slot and blocks are released
            r = running.pop(int(rng.integers(len(running))))
            sim.release(r, keep=False)
            free.append(slot_of.pop(r.rid))
            sim.waiting.append(r)
            stats.preempted += 1
        while free and rng.random() < 0.6:
            r = sim.waiting.pop(0) if sim.waiting and rng.random() < 0.5 else sim.new_request()
            sim.admit(r)
            stats.prefix_hits += r.computed > 0
            s = free.pop()
            slot_of[r.rid] = s
            running.append(r)
            nct[s] = r.computed
            new_req = types.SimpleNamespace(num_computed_tokens=r.computed)
            vms.add_request(s, new_req)
            ours.add_request(s, r.computed)
        batch = [r for r in running if not (len(running) > 1 and rng.random() < 0.1)]
        batch = [batch[i] for i in rng.permutation(len(batch))]
        sched = {r.rid: sim.schedule(r) for r in batch}
        for r in batch:  # async scheduling: a chunk sized from the host's optimistic mirror ends off a boundary
            n_s, d = sched[r.rid]
            if d == 0 and r.computed + n_s < r.prompt and n_s > 1 and rng.random() < 0.4:
                sched[r.rid] = (n_s - int(rng.integers(1, min(n_s, sim.bs))), 0)
                stats.lagged += 1
        for r in batch:
            sim.ensure_cols(r, sched[r.rid][0])
        fill_tables()
        n = len(batch)
        idx = torch.tensor([slot_of[r.rid] for r in batch], dtype=torch.int32)
        qsl = torch.zeros(m + 1, dtype=torch.int32)
        qsl[1 : n + 1] = torch.tensor(np.cumsum([sched[r.rid][0] for r in batch]), dtype=torch.int32)
        calls = len(emulator.calls) if emulator is not None else 0
        commit: Any = None
        if rec is not None:  # the step's commit, known when its metadata is built
            from recoverssm_rs.vllm.model_state import RecoverSSMCommit

            rows = [i for i, r in enumerate(batch) if sched[r.rid][1] > 0]
            slots = [slot_of[r.rid] for r in batch]
            computed = [r.computed for r in batch]
            qlens = [sched[r.rid][0] for r in batch]
            if rows or static:  # under a graph every step stages one (empty or not)
                commit = RecoverSSMCommit(**rec.step(rec.caches[1], slots, rows, computed, qlens))
                if static or step % 2:  # staged now, or by the post-process itself
                    ours.stage_recoverssm(commit)
                    commit = True
        # pre-copy
        vms.preprocess_state(types.SimpleNamespace(num_reqs=n, idx_mapping=idx, query_start_loc=qsl), tables, None, nct)
        nct_o.copy_(nct)
        if static:
            fixed["idx"].fill_(-1)[:n] = idx
            fixed["qsl"].copy_(qsl)
            run_half(step, "pre", lambda: ours.preprocess_state(fixed["idx"], nct_o, fixed["qsl"], tables_o))
        else:
            ours.preprocess_state(on(idx), nct_o, on(qsl), tables_o)
        if emulator is not None and launches is not None and n:
            launches.append(len(emulator.calls) - calls)
            calls = len(emulator.calls)
        check(step, "pre-copy")
        curr = [(r.computed + sched[r.rid][0] - 1) // sim.bs for r in batch]
        stats.pre_moves += vllm_trace.pre_moves(batch, curr, sim.bs)
        vllm_trace.forward_writes(batch, curr, nsb, states_v, states_o)
        # sampling: 0 for a chunk that does not finish the prompt, else 1 + accepted drafts
        sampled = []
        for r in batch:
            n_s, d = sched[r.rid]
            sampled.append(0 if r.computed + n_s < r.prompt else int(rng.integers(1, d + 2)))
        dropped = {i for i in range(n) if n > 1 and rng.random() < 0.1}  # PP: filtered rows
        stats.pp_rows += len(dropped)
        post_idx = idx.clone()
        for i in dropped:
            post_idx[i] = -1
        for i, r in enumerate(batch):
            if i not in dropped:
                n_s, d = sched[r.rid]
                nct[slot_of[r.rid]] = r.computed + n_s - d + max(sampled[i], 1) - 1
        counts: Any = torch.tensor(sampled, dtype=torch.int32)
        if n and len(set(sampled)) == 1 and step % 2:
            counts = sampled[0]
            stats.int_counts += 1
        if rec is not None:
            rec.randomize(["corrections", "keygate", "conv_window"])  # the verify's records
            if rows:
                vms.recoverssm._step = (
                    rec.vllm_metadata(rec.step(rec.caches[0], slots, rows, computed, qlens), sim.bs),
                )
                stats.commits += not isinstance(counts, int)
        if non_last_rank and rng.random() < non_last_rank:  # a pipeline-parallel rank that is not the last
            vms.postprocess_state(post_idx, 0)
            ours.postprocess_state(on(post_idx), 0, None, tables_o)
            stats.non_last += 1
            nct_o.copy_(nct)
        elif static:
            vms.postprocess_state(post_idx, counts, nct)
            nct_o.copy_(nct)
            fixed["post_idx"].fill_(-1)[:n] = post_idx
            fixed["sampled"].zero_()[:n] = torch.tensor(sampled, dtype=torch.int32)
            post = (fixed["post_idx"], fixed["sampled"], nct_o, tables_o)
            run_half(step, "post", lambda: ours.postprocess_state(*post, recoverssm=commit))
        else:
            vms.postprocess_state(post_idx, counts, nct)
            nct_o.copy_(nct)
            ours.postprocess_state(
                on(post_idx), counts if isinstance(counts, int) else on(counts), nct_o, tables_o, recoverssm=commit
            )
        if emulator is not None and launches is not None and n:
            launches.append(len(emulator.calls) - calls)
        check(step, "post-process")
        for i, r in enumerate(batch):
            r.running = curr[i]  # the slot's running column advanced in the pre-copy either way
            if i in dropped:
                continue
            n_s, d = sched[r.rid]
            new = r.computed + n_s - d + max(sampled[i], 1) - 1
            stats.post_saves += int((new // sim.bs) * sim.bs >= r.computed + n_s - d and d > 0)
            r.computed = new
            if r.computed >= r.prompt + 2 * sim.bs and rng.random() < 0.3:
                running.remove(r)
                sim.release(r, keep=True)
                finished_next.append(r)
        stats.steps += 1
    return stats
