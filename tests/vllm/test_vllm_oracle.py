"""Conformance against vLLM 0.33.0 itself: random multi-step align-mode traces run through vLLM's
own step code (downloaded wheel, Triton kernels interpreted on CPU; see tests/support/vllm_oracle.py)
and through recoverssm_rs.vllm.VllmMambaStep must leave every state byte and every num_accepted
equal after every pre-copy and every post-process.

Skipped when the wheel cannot be fetched or Triton is missing, unless RECOVERSSM_REQUIRE_ORACLE=1
(CI), which turns the skip into a failure. RECOVERSSM_ORACLE_STEPS sets the steps per trace.

Sizing: a trace's cost grows faster than its length (requests pile up, and every interpreted Triton
launch covers them all: 20 steps cost about 7x what 8 do), while what it can catch comes from its
configuration (groups, block size, speculative blocks, conv layout, shared pages), all kept. At 12
steps every trace still moves states in the pre-copy (3-39 copies) and, with speculative blocks,
saves them in the post-process (2-23 copies); prefix hits, preemption, skipped rows and backward
moves are required of one trace (``test_traces_cover_the_features``) whose seed has all four
within 12 steps.
"""

from __future__ import annotations

import os
import types

import pytest

pytest.importorskip("torch")

from support import vllm_oracle, vllm_trace  # noqa: E402
from support.vllm_trace import TRACES  # noqa: E402
from support.vllm_trace import GroupCfg as G  # noqa: E402

STEPS = int(os.environ.get("RECOVERSSM_ORACLE_STEPS", "12"))


@pytest.fixture(scope="module")
def oracle():
    return vllm_oracle.load_or_skip(vllm_oracle.load, f"vLLM {vllm_oracle.VERSION}")


# The adapter's device path (FakeCuda states: the fused launches run through the host emulation of
# the real kernel) rides along the host path on these traces, against the same run of vLLM's side
# (nearly all of a trace's time): name -> for each device run, whether the kernel reads the batch's
# device block tables instead of staged host tables.
DEVICE_RUNS = {
    "gdn-SD-spec2": [False],
    "gdn-DS-spec2": [True],
    "3groups-DS-spec2": [False, True],
    "2groups-SD-bs2-spec3": [False],
    "gdn-DS-nospec-scalar": [False],
    "3groups-DS-shared-pages": [False],
}


@pytest.mark.parametrize("name", list(TRACES))
def test_trace_equals_vllm(oracle, fake_ops, emulator, name):
    import torch
    from support.device_fakes import FakeCuda

    groups, bs, nsb, layout, seed, *shared = TRACES[name]
    mode = vllm_trace.DeviceMode(place=lambda t: t, bind=FakeCuda, vector=lambda a: FakeCuda(torch.from_numpy(a)))
    device_runs = DEVICE_RUNS.get(name, [])
    stats = vllm_trace.run_trace(
        oracle,
        groups,
        block_size=bs,
        nsb=nsb,
        conv_layout=layout,
        seed=seed,
        steps=STEPS,
        shared_pages=bool(shared),
        adapters=[(None, False)] + [(mode, tables) for tables in device_runs],
    )
    assert stats.steps == STEPS and stats.pre_copies > 0
    if nsb:
        assert stats.post_copies > 0
    # The device runs: one fused launch per half-step for every group, and nothing waited for the
    # device: each run's state table went up once, each half-step staged its inputs in one
    # asynchronous copy.
    launches = [c["kernel"] for c in emulator.calls]
    assert launches == ["rs_state_copy"] * len(launches) and len(launches) == 2 * stats.busy_steps * len(device_runs)
    if device_runs:
        assert {c["decide"] for c in emulator.calls} == {False, True}
        assert all(c["num_accepted_out"] != 0 for c in emulator.calls)
        # one error word for the whole step of each run
        assert len({c["err"] for c in emulator.calls}) == len(device_runs)
    assert fake_ops.syncs == 0 and fake_ops.uploads == len(device_runs) and fake_ops.staged == len(launches)


def test_every_device_run_names_a_trace():
    assert set(DEVICE_RUNS) <= set(TRACES) and any(True in runs for runs in DEVICE_RUNS.values())


def test_shared_pages_share_memory_across_groups():
    sim = vllm_trace.Sim([G("GDN_ATTN", 1), G("LINEAR", 1, temporal_shape=(3, 4))], 4, 1, "SD", seed=0)
    states = sim.make_states(shared_pages=True)
    gdn_conv, linear_temporal = states[0][0][0], states[1][0][0]
    assert gdn_conv.untyped_storage().data_ptr() == linear_temporal.untyped_storage().data_ptr()
    assert gdn_conv.stride(0) == linear_temporal.stride(0) > gdn_conv[0].numel() + states[0][0][1][0].numel()
    clone = vllm_trace.Sim.clone_states(states)
    assert clone[0][0][0].untyped_storage().data_ptr() == clone[1][0][0].untyped_storage().data_ptr()
    assert clone[0][0][0].untyped_storage().data_ptr() != gdn_conv.untyped_storage().data_ptr()


def test_traces_cover_the_features(oracle):
    """One longer trace hits prefix hits, preemption, skipped requests and backward moves."""
    stats = vllm_trace.run_trace(
        oracle,
        [G("GDN_ATTN", 1), G("SHORT_CONV", 1)],
        block_size=2,
        nsb=3,
        conv_layout="SD",
        seed=7,
        steps=max(STEPS, 12),
    )
    assert stats.prefix_hits > 0 and stats.preempted > 0 and stats.skipped > 0 and stats.backwards > 0, stats


def test_the_oracle_catches_a_wrong_adapter(oracle, monkeypatch):
    """With the post-process copies dropped, the first trace step that saves a state differs."""
    from recoverssm_rs import vllm as adapter
    from recoverssm_rs.vllm.decide import PostProcessInputs, plan

    real = adapter.VllmMambaStep.post_process

    def no_copies(self, *a, **k):
        d, _copies = plan(self.planner, PostProcessInputs(*a, **k))
        return d

    monkeypatch.setattr(adapter.VllmMambaStep, "post_process", no_copies)
    with pytest.raises(AssertionError, match="after the post-process"):
        vllm_trace.run_trace(oracle, [G("GDN_ATTN", 1)], block_size=4, nsb=2, conv_layout="SD", seed=11, steps=STEPS)
    monkeypatch.setattr(adapter.VllmMambaStep, "post_process", real)


def test_pre_copy_decisions_equal_vllms_over_random_rows(oracle, monkeypatch):
    """vLLM's preprocess_mamba decision (its Python loop; the fused launch captured, not run) and
    align_pre_copy agree on every row of random batches: new rows, prefix hits, stored columns
    before, at and after the new running column, any accepted count."""
    import numpy as np
    from recoverssm_rs.vllm.decide import PreCopyInputs, align_pre_copy

    rng = np.random.default_rng(5)
    for bs, nsb in [(4, 2), (1, 0), (16, 3), (3, 1)]:
        sim = vllm_trace.Sim([G("GDN_ATTN", 1)], bs, nsb, "SD", seed=0, num_blocks=8, max_reqs=256, max_cols=64)
        side = vllm_trace.Side(sim, sim.make_states(), oracle)
        vllm = vllm_trace.VllmSide(oracle, side)
        ctx = vllm.bufs.postprocess_align
        captured = {}
        if ctx is not None:
            ctx.is_initialized = True
            monkeypatch.setattr(ctx, "run_fused_precopy", lambda **k: captured.update(k))
        else:
            monkeypatch.setattr(oracle.wmu, "do_mamba_copy_block", lambda bufs: None)
        r = 256
        c = rng.integers(0, 40 * bs, r)
        n = rng.integers(1, 3 * bs + 2, r)
        a = rng.integers(1, nsb + 2, r)
        curr = (c + n - 1) // bs
        stored = np.where(rng.random(r) < 0.6, np.clip(curr + rng.integers(-2, 2, r), 0, None), -1)
        ids = [f"r{i}" for i in range(r)]
        bt = np.arange(1, r * 64 + 1, dtype=np.int64).reshape(r, 64) % 7 + 1  # every column live
        side.input_batch.req_ids = ids
        side.input_batch.num_accepted_tokens_cpu[:r] = a
        side.requests = {
            i: types_ns(num_computed_tokens=int(x), block_ids=(bt[k].tolist(),)) for k, (i, x) in enumerate(zip(ids, c))
        }
        vllm.mamba_state_idx = {i: int(s) for i, s in zip(ids, stored) if s >= 0}
        so = vllm_trace.scheduler_output(
            [types_ns(rid=i) for i in ids], {i: (int(x), 0) for i, x in zip(ids, n)}, set(), set(), set()
        )
        vllm.pre(so)
        d = align_pre_copy(PreCopyInputs([bt], c, n, a, stored), block_size=bs, num_spec_blocks=nsb)
        assert [vllm.mamba_state_idx[i] for i in ids] == d.curr.tolist()
        assert side.input_batch.num_accepted_tokens_cpu[:r].tolist() == d.num_accepted.tolist()
        if ctx is not None:
            assert ctx.precopy_src_col_buf.np[:r].tolist() == d.src_col.tolist()
            assert ctx.precopy_token_bias_buf.np[:r].tolist() == d.bias.tolist()
            assert ctx.mamba_state_idx_buf.np[:r].tolist() == d.curr.tolist()
        moved = d.src_col >= 0
        assert moved.any() and (~moved).any() and (moved & (d.prev > d.curr)).any()


def types_ns(**k):
    return types.SimpleNamespace(**k)
