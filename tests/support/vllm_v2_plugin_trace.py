"""A test-only trace for the vLLM plugin's V2 part: vLLM 0.33.0's own ``MambaHybridModelState``
(loaded by :mod:`support.vllm_v2_oracle`) and the class the plugin installs in its place
(:func:`recoverssm_rs.vllm.plugin_v2.install_v2`), both driven through vLLM's own interface
(``add_request``, ``preprocess_state(input_batch, ...)``, ``postprocess_state(idx_mapping, ...)``)
over equal copies of the states, every state byte and every slot's running column and accepted count
compared after every half-step. No vLLM code is stored in this repository."""

from __future__ import annotations

import types
from typing import Any

import numpy as np
import torch

from . import vllm_oracle, vllm_trace, vllm_v2_oracle


def run(
    vllm_cls: Any,
    served_cls: Any,
    groups: list[vllm_trace.GroupCfg],
    *,
    block_size: int,
    nsb: int,
    conv_layout: str,
    seed: int,
    steps: int = 16,
    non_last_rank: float = 0.1,
) -> vllm_v2_oracle.V2Stats:
    """One random trace (the scheduler of :func:`support.vllm_v2_oracle.run_trace`: prefix hits,
    chunked prefill, drafts, preemption, pipeline-parallel ``-1`` rows and non-last ranks, batch
    permutations). AssertionError at the first difference."""
    ns = vllm_oracle.load()
    vllm_oracle.set_conv_layout(ns, conv_layout)
    sim = vllm_trace.Sim(groups, block_size, nsb, conv_layout, seed)
    rng, m = sim.rng, sim.max_reqs
    states_v = sim.make_states()
    states_o = vllm_trace.Sim.clone_states(states_v)
    sides = vllm_trace.Side(sim, states_v, ns), vllm_trace.Side(sim, states_o, ns)
    tables = [[torch.zeros(m, sim.cols, dtype=torch.int32) for _ in groups] for _ in sides]
    both = [
        vllm_v2_oracle.vllm_model_state(types.SimpleNamespace(MambaHybridModelState=cls), side, t, m)
        for cls, side, t in zip((vllm_cls, served_cls), sides, tables)
    ]
    nct = torch.zeros(m, dtype=torch.int32)
    slot_of: dict[str, int] = {}
    free = list(range(m - 1, -1, -1))
    running: list[vllm_trace.Req] = []
    finished_next: list[vllm_trace.Req] = []
    stats = vllm_v2_oracle.V2Stats()

    def check(step: int, half: str) -> None:
        err = vllm_trace._equal(states_v, states_o)
        assert err is None, f"step {step}, after the {half}: {err}"
        v, o = both
        for r in running:
            s = slot_of[r.rid]
            pv = (int(v._mamba_state_idx_gpu[s]), int(v.num_accepted_tokens_gpu[s]))
            po = (int(o._mamba_state_idx_gpu[s]), int(o.num_accepted_tokens_gpu[s]))
            assert pv == po, f"step {step}, after the {half}: slot {s} (column, count): vLLM {pv}, plugin {po}"

    for step in range(steps):
        for r in finished_next:
            free.append(slot_of.pop(r.rid))
        finished_next = []
        if running and rng.random() < 0.12:
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
            for ms in both:
                ms.add_request(s, types.SimpleNamespace(num_computed_tokens=r.computed))
        batch = [r for r in running if not (len(running) > 1 and rng.random() < 0.1)]
        batch = [batch[i] for i in rng.permutation(len(batch))]
        sched = {r.rid: sim.schedule(r) for r in batch}
        for r in batch:
            sim.ensure_cols(r, sched[r.rid][0])
        for side_tables in tables:
            for gi, t in enumerate(side_tables):
                t.zero_()
                for r in running:
                    for col, b in r.cols[gi].items():
                        t[slot_of[r.rid], col] = b
        n = len(batch)
        idx = torch.tensor([slot_of[r.rid] for r in batch], dtype=torch.int32)
        qsl = torch.zeros(m + 1, dtype=torch.int32)
        qsl[1 : n + 1] = torch.tensor(np.cumsum([sched[r.rid][0] for r in batch]), dtype=torch.int32)
        for ms, t in zip(both, tables):
            ms.preprocess_state(types.SimpleNamespace(num_reqs=n, idx_mapping=idx, query_start_loc=qsl), t, None, nct)
        check(step, "pre-copy")
        curr = [(r.computed + sched[r.rid][0] - 1) // sim.bs for r in batch]
        stats.pre_moves += vllm_trace.pre_moves(batch, curr, sim.bs)
        vllm_trace.forward_writes(batch, curr, nsb, states_v, states_o)
        sampled = []
        for r in batch:
            n_s, d = sched[r.rid]
            sampled.append(0 if r.computed + n_s < r.prompt else int(rng.integers(1, d + 2)))
        dropped = {i for i in range(n) if n > 1 and rng.random() < 0.1}
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
        if rng.random() < non_last_rank:
            for ms in both:
                ms.postprocess_state(post_idx, 0)
            stats.non_last += 1
        else:
            for ms in both:
                ms.postprocess_state(post_idx, counts, nct)
        check(step, "post-process")
        for i, r in enumerate(batch):
            r.running = curr[i]
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
