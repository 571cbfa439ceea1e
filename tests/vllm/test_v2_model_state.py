"""``ModelStateV2`` against vLLM 0.33.0's own GPU-resident runner step (``MambaHybridModelState``,
its Triton kernels run by Triton's interpreter on CPU tensors) on random multi-step traces: every
state byte, every per-slot running column and accepted count after every half-step; the package's
side runs its launches through the host emulation of the fused kernel."""

from __future__ import annotations

import pytest
import torch
from support import vllm_oracle, vllm_trace

GroupCfg = vllm_trace.GroupCfg

#: name -> (groups, block_size, num_speculative_blocks, conv layout, seed, steps)
TRACES = {
    "gdn-SD-spec2": ([GroupCfg("GDN_ATTN", 1)], 4, 2, "SD", 51, 12),
    "2groups-DS-spec2": ([GroupCfg("GDN_ATTN", 1), GroupCfg("LINEAR", 1, temporal_shape=(3, 4))], 4, 2, "DS", 52, 12),
    "2groups-SD-nospec": ([GroupCfg("GDN_ATTN", 1), GroupCfg("SHORT_CONV", 1, conv_dim=3)], 3, 0, "SD", 73, 12),
}


@pytest.fixture(scope="module")
def mh():
    from support import vllm_v2_oracle

    return vllm_oracle.load_or_skip(vllm_v2_oracle.load, f"vLLM {vllm_oracle.VERSION} (V2 runner)")


def _trace(mh, cfg, **kw):
    """``vllm_v2_oracle.run_trace`` over a ``TRACES`` / ``RECOVER_TRACES`` entry ``cfg`` (groups,
    block size, speculative blocks, conv layout, seed, steps); ``kw`` adds keywords or replaces
    the entry's (``seed``, ``steps``)."""
    from support import vllm_v2_oracle

    groups, bs, nsb, layout, seed, steps = cfg
    args = {"block_size": bs, "nsb": nsb, "conv_layout": layout, "seed": seed, "steps": steps, **kw}
    return vllm_v2_oracle.run_trace(mh, groups, **args)


@pytest.mark.parametrize("name", list(TRACES))
def test_v2_trace_equals_vllm(mh, fake_ops, emulator, launch_args, name):
    launches: list[int] = []
    stats = _trace(mh, TRACES[name], launches=launches, emulator=emulator)
    # the trace exercised what it is for
    assert stats.pre_moves > 0 and stats.prefix_hits > 0 and stats.pp_rows > 0 and stats.lagged > 0
    assert stats.preempted > 0
    if TRACES[name][2]:  # with speculative blocks
        assert stats.post_saves > 0
    # one launch of the package's kernel per half-step, every group at once
    assert launches and set(launches) == {1}
    assert {c["kernel"] for c in emulator.calls} == {"rs_state_copy_slots"}
    # capturable: every launch of a half reads the same buffers of the adapter's with the same
    # parameters; only the runner's own inputs (its tensors and the batch size) vary here
    for decide in (False, True):
        params = {_params(c) for c in emulator.calls if c["decide"] == decide}
        assert len(params) == 1, f"decide={decide}: the launch parameters change between steps"


#: The runner's inputs of a half-step (fixed tensors under a CUDA graph; fresh ones in these traces).
RUNNER_INPUTS = {"idx_mapping", "num_rows", "num_computed", "query_start_loc", "num_sampled", "sampled_fill"}


def _params(call):
    return tuple(
        sorted(
            (k, v)
            for k, v in call.items()
            if isinstance(v, (int, bool)) and k not in RUNNER_INPUTS and k not in ("index", "err_at_launch")
        )
    )


def _replay_first_launches(monkeypatch):
    """Every launch of a half replaced by that half's first launch (what a captured graph does),
    handed to the launch installed now; returns the first launches (by half: post-process True)
    and, per launch, whether it was a replay."""
    from recoverssm_rs import cuda
    from recoverssm_rs.cuda import module as cuda_module

    captured: dict[bool, object] = {}
    replayed: list[bool] = []
    launch = cuda_module.launch

    def replay(kl, index, stream=None):
        first = captured.setdefault(bool(dict(kl.values())["flags"] & cuda.FLAG_DECIDE), kl)
        replayed.append(first is not kl)
        launch(first, index, stream)

    monkeypatch.setattr(cuda_module, "launch", replay)
    return captured, replayed


def test_v2_trace_replaying_the_first_launches_equals_vllm(mh, fake_ops, emulator, launch_args, monkeypatch):
    """A CUDA graph's view of the step: the runner's inputs in fixed tensors, each half's launch
    recorded at the first step and replayed unchanged at every later one keeps every state byte
    and count equal to vLLM's (the bookkeeping lives in the launch: nothing else runs)."""
    _, replayed = _replay_first_launches(monkeypatch)
    cfg = TRACES["2groups-DS-spec2"]
    _trace(mh, cfg, seed=cfg[4] + 100, steps=8, static=True)
    assert sum(replayed) >= 6


@pytest.mark.parametrize("order", [1, 7])
def test_v2_trace_in_any_thread_order_equals_vllm(mh, fake_ops, emulator, launch_args, monkeypatch, order):
    """The emulated threads in reverse and in a shuffled order: the copy CTAs read each slot's
    values before or after its bookkeeping thread rewrites them (scratch and stamp), the bytes and
    counts stay vLLM's."""
    from support import emulation

    run = emulation.run
    monkeypatch.setattr(emulation, "run", lambda kl, **kw: run(kl, **{**kw, "order": order}))
    cfg = TRACES["gdn-SD-spec2"]
    stats = _trace(mh, cfg, seed=cfg[4] + order, steps=10, emulator=emulator)
    assert stats.pre_moves > 0


def test_add_request_seeds_column_and_count(fake_ops):
    from recoverssm_rs.vllm.model_state import ModelStateV2

    ms = ModelStateV2.__new__(ModelStateV2)
    ms.max_num_reqs, ms.block_size = 4, 4
    ms._acc = torch.full((5,), 3, dtype=torch.int32)
    ms._state = torch.full((5,), 7, dtype=torch.int32)
    ms.add_request(1, 0)
    ms.add_request(2, 8)
    assert ms.state_idx.tolist() == [7, -1, 1, 7] and ms.num_accepted.tolist() == [3, 1, 1, 3]
    from recoverssm_rs.errors import PlanError

    with pytest.raises(PlanError, match="slot 4"):
        ms.add_request(4, 0)


def _small(fake: bool):
    """The one-group adapter of ``vllm_trace.small_model_state`` and its states."""
    return vllm_trace.small_model_state(fake=fake)


def test_minus_one_rows_are_skipped_by_both_halves(fake_ops, emulator, launch_args):
    ms, states = _small(fake=True)
    table = torch.zeros(4, 6, dtype=torch.int32)
    table[1, :4] = torch.tensor([1, 2, 3, 4])
    table[2, :4] = torch.tensor([5, 6, 7, 8])
    ms.add_request(1, 4)  # slot 1: 4 tokens cached, state in column 0 (block 1)
    ms.add_request(2, 4)
    before = [t.clone() for t in states]
    nct = torch.tensor([0, 4, 4, 0], dtype=torch.int32)
    qsl = torch.tensor([0, 1, 2], dtype=torch.int32)
    ms.preprocess_state(torch.tensor([1, -1], dtype=torch.int32), nct, qsl, [table])
    # slot 1 moved column 0 -> 1 (block 1 -> 2); slot 2 (not in the batch) and the rest untouched
    assert ms.state_idx.tolist() == [-1, 1, 0, -1]
    assert torch.equal(states[1][2], before[1][1]) and torch.equal(states[1][6], before[1][6])
    nct[1] = 5
    ms.postprocess_state(
        torch.tensor([-1, 1], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32), nct, [table]
    )
    assert ms.num_accepted.tolist() == [1, 1, 1, 1]
    assert ms.last_error().ok
    assert len(emulator.calls) == 2


def test_bad_inputs_are_refused_before_anything_runs(fake_ops, recorder, launch_args):
    from recoverssm_rs.errors import PlanError

    ms, _ = _small(fake=True)
    table = torch.zeros(4, 6, dtype=torch.int32)
    nct = torch.zeros(4, dtype=torch.int32)
    with pytest.raises(PlanError, match="idx_mapping has 5 request rows, more than max_num_reqs = 4"):
        ms.preprocess_state(torch.zeros(5, dtype=torch.int32), nct, torch.zeros(6, dtype=torch.int32), [table])
    with pytest.raises(PlanError, match="group 0.s device block table has 2 rows for 4 requests"):
        ms.preprocess_state(torch.zeros(1, dtype=torch.int32), nct, torch.zeros(2, dtype=torch.int32), [table[:2]])
    with pytest.raises(PlanError, match="num_computed_tokens -1 is out of range"):
        ms.add_request(0, -1)
    assert recorder.calls == []
    assert repr(ms) == "ModelStateV2(groups=[0], block_size=4, max_num_reqs=4, device=cpu)"


def test_host_states_are_refused_by_the_step():
    from recoverssm_rs.errors import PlanError

    ms, _ = _small(fake=False)
    with pytest.raises(PlanError):
        ms.preprocess_state(
            torch.zeros(1, dtype=torch.int32),
            torch.zeros(4, dtype=torch.int32),
            torch.zeros(2, dtype=torch.int32),
            [torch.zeros(4, 6, dtype=torch.int32)],
        )


#: name -> (groups, block_size, num_speculative_blocks, conv layout, seed, steps), RecoverSSM on
RECOVER_TRACES = {
    "recoverssm-gdn-SD-spec2": ([GroupCfg("GDN_ATTN", 1)], 4, 2, "SD", 61, 12),
    "recoverssm-2groups-DS-spec1": (
        [GroupCfg("GDN_ATTN", 1), GroupCfg("LINEAR", 1, temporal_shape=(3, 4))],
        3,
        1,
        "DS",
        62,
        12,
    ),
}


@pytest.mark.parametrize("name", list(RECOVER_TRACES))
def test_v2_trace_with_recoverssm_equals_vllm(mh, fake_ops, emulator, launch_args, name):
    """vLLM's post-process with RecoverSSM on: its ``commit_step`` (the commit, then its column and
    count kernel, interpreted) between the count scatter and the aligned save. The commit's state
    fold is the package's host reference on both sides (vLLM's fold is the model's own KDA kernel);
    the adapter's commit arguments, the columns, counts and the post-copy after it are checked
    against vLLM's."""
    launches: list[int] = []
    stats = _trace(mh, RECOVER_TRACES[name], launches=launches, emulator=emulator, recoverssm=True)
    assert stats.commits > 0 and stats.int_counts > 0 and stats.pp_rows > 0
    # the copy kernel once per half-step (the commit runs the torch reference on these host
    # caches, before the launch; a CUDA cache's commit runs inside it: the tests below)
    assert launches and set(launches) == {1}


def _fused_commits(monkeypatch):
    """Binds each trace cache's commit to the emulated kernel and counts the post-process launches
    that carry the commit (``commit_rows`` set); returns the kernel names launched and that count."""
    from recoverssm_rs.cuda import module as cuda_module
    from recoverssm_rs.speculative.state_cache import StateCache

    kernels: list[str] = []
    fused = [0]
    launch = cuda_module.launch

    def counting(kl, index, stream=None):
        kernels.append(kl.kernel)
        fused[0] += bool(dict(kl.values()).get("commit_rows"))
        return launch(kl, index, stream)

    monkeypatch.setattr(cuda_module, "launch", counting)
    monkeypatch.setattr(StateCache, "_is_device_tensor", staticmethod(lambda x: isinstance(x, torch.Tensor)))
    return kernels, fused


@pytest.mark.parametrize("order", [0, 5])
def test_v2_trace_with_the_commit_kernel_in_the_launch_equals_vllm(
    mh, fake_ops, emulator, launch_args, monkeypatch, order
):
    """The adapter's cache commits through its CUDA path, inside the post-process's one launch
    (``rs_state_copy_slots`` running the commit kernel's device code, emulated on the host, in the
    natural and a shuffled thread order) while vLLM's side folds with the torch reference: the
    recurrent states agree within 1e-5, everything else byte for byte, no error reported."""
    from support import emulation
    from support.device_fakes import bind_host_commit

    run = emulation.run
    monkeypatch.setattr(emulation, "run", lambda kl, **kw: run(kl, **{**kw, "order": order}))
    kernels, fused = _fused_commits(monkeypatch)
    launches: list[int] = []
    cfg = RECOVER_TRACES["recoverssm-gdn-SD-spec2"]
    stats = _trace(
        mh,
        cfg,
        seed=cfg[4] + order,
        launches=launches,
        emulator=emulator,
        recoverssm=True,
        commit_kernel=bind_host_commit,
    )
    assert stats.commits > 0 and fused[0] >= stats.commits
    # one launch per half-step, the commit included: no rs_recover_commit launch of its own
    assert launches and set(launches) == {1} and set(kernels) == {"rs_state_copy_slots"}


def test_v2_trace_with_recoverssm_replaying_the_first_launches_equals_vllm(
    mh, fake_ops, emulator, launch_args, monkeypatch
):
    """A CUDA graph's view of a RecoverSSM step: fixed input tensors, every step's commit staged
    before its pre-copy (empty or not), each half's first launch replayed unchanged at every later
    step: the commit reads its rows and their count from the stage buffer, so the replays commit
    what each step staged and every byte and count stays vLLM's."""
    from support.device_fakes import bind_host_commit

    _fused_commits(monkeypatch)
    captured, replayed = _replay_first_launches(monkeypatch)
    cfg = RECOVER_TRACES["recoverssm-gdn-SD-spec2"]
    stats = _trace(mh, cfg, steps=10, static=True, recoverssm=True, commit_kernel=bind_host_commit, emulator=emulator)
    assert stats.commits > 0 and sum(replayed) >= 8
    assert dict(captured[True].values())["commit_rows"]  # the captured post-process commits


def test_v2_trace_with_the_adapter_on_copies_of_the_runner_tensors_equals_vllm(
    mh, fake_ops, emulator, launch_args, monkeypatch
):
    """The placement a GPU run uses (``device``; tests/vllm/test_gpu_model_state_v2.py), here with
    host copies through the seam: the adapter gets its own copies of the states, the RecoverSSM
    cache, the tables and every runner input, so a value it reads from vLLM's side's tensors, or
    an update the harness forgets to copy over, shows as a difference."""
    from support import vllm_trace
    from support.device_fakes import FakeCuda, bind_host_commit

    _fused_commits(monkeypatch)
    copies = vllm_trace.DeviceMode(place=lambda t: t.clone(), bind=FakeCuda, vector=None)
    cfg = RECOVER_TRACES["recoverssm-2groups-DS-spec1"]
    stats = _trace(mh, cfg, recoverssm=True, commit_kernel=bind_host_commit, device=copies)
    assert stats.commits > 0 and stats.pp_rows > 0


@pytest.mark.parametrize(
    "rows, blocks, match",
    [
        ([0], [1, 2], "1 request_indices for 2 state_blocks"),  # two blocks for one row: the core refuses
        ([5], [1], "request_indices"),  # a row outside the batch: the core's range rule, not torch's
        ([-1], [1], "request_indices"),
    ],
)
def test_a_refused_recoverssm_commit_writes_nothing(fake_ops, recorder, launch_args, rows, blocks, match):
    """A commit the core refuses raises the package's PlanError before any slot buffer, state or
    cache byte changes."""
    import numpy as np
    from recoverssm_rs import layouts
    from recoverssm_rs.errors import PlanError
    from recoverssm_rs.speculative.state_cache import StateCache
    from recoverssm_rs.vllm import RecoverSSMCommit

    ms, states = _small(fake=True)
    layout = layouts.kda(num_heads=2, head_dim=4, conv_kernel_size=3, num_spec=2, recover_ssm=True)
    cache = StateCache(layout, num_layers=1, num_blocks=12, max_requests=4)
    ms.add_request(1, 4)
    before = [t.clone() for t in (*states, ms._state, ms._acc, *cache.buffers().values())]
    commit = RecoverSSMCommit(
        cache,
        request_indices=torch.tensor(rows),
        state_blocks=np.array(blocks),
        num_computed_tokens=torch.tensor([4], dtype=torch.int32),
        block_table=torch.arange(3, 3 + 3 * len(blocks), dtype=torch.int32).reshape(len(blocks), 3),
    )
    with pytest.raises(PlanError, match=match):
        ms.postprocess_state(
            torch.tensor([1], dtype=torch.int32),
            torch.tensor([3], dtype=torch.int32),
            torch.tensor([0, 6, 0, 0], dtype=torch.int32),
            [torch.zeros(4, 6, dtype=torch.int32)],
            recoverssm=commit,
        )
    after = [*states, ms._state, ms._acc, *cache.buffers().values()]
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    assert recorder.calls == []
    assert "RecoverSSMCommit(" in repr(commit)
