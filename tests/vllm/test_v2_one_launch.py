"""``ModelStateV2``'s half-steps are one launch each and nothing else: no torch operation on a
device tensor by the adapter, the bookkeeping (vLLM's state advance, the count scatter) inside the
launch; bad values found on the device are skipped and reported in the step's error word."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest
import torch


def _count_ops():
    """A dispatch mode recording every aten operation run while active (views included). Its
    module imports Triton: in interpreter mode, as the oracle tests need it."""
    from support import vllm_oracle

    try:
        vllm_oracle.import_interpreted_triton()
    except vllm_oracle.OracleUnavailable:
        pass  # torch's dispatch mode works without Triton
    from torch.utils._python_dispatch import TorchDispatchMode

    class CountOps(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    return CountOps()


def _small(max_num_reqs: int = 4):
    """``vllm_trace.small_model_state`` (CUDA stand-in states) and a per-slot table: slot ``s``
    holds blocks ``1 + 3s .. 3 + 3s`` in columns 0-2."""
    from support import vllm_trace

    ms, states = vllm_trace.small_model_state(max_num_reqs)
    table = torch.zeros(max_num_reqs, 6, dtype=torch.int32)
    for s in range(max_num_reqs):
        table[s, :3] = torch.arange(1 + 3 * s, 4 + 3 * s)
    return ms, states, table


def _begin_step(ms, table, calls=None):
    """A pre-copy of no rows, which moves nothing: the step a post-process of request rows needs
    (the core refuses one before any pre-copy); ``calls``: a launch record, cleared after it."""
    z = torch.zeros(ms.max_num_reqs + 1, dtype=torch.int32)
    ms.preprocess_state(z[:0], z[:-1], z[:1], [table])
    if calls is not None:
        calls.clear()


def test_each_half_step_is_one_launch_and_no_torch_operation(fake_ops, emulator, launch_args):
    ms, states, table = _small()
    ms.add_request(0, 4)  # a prefix hit: its state in column 0, moved by the first pre-copy
    ms.add_request(2, 0)
    nct = torch.tensor([4, 0, 0, 0], dtype=torch.int32)
    idx = torch.tensor([2, 0], dtype=torch.int32)
    qsl = torch.tensor([0, 3, 5], dtype=torch.int32)
    sampled = torch.tensor([1, 3], dtype=torch.int32)
    per_half = []
    for step in range(4):
        for half in ("pre", "post"):
            calls = len(emulator.calls)
            with _count_ops() as c:
                if half == "pre":
                    ms.preprocess_state(idx, nct, qsl, [table])
                else:
                    ms.postprocess_state(idx, sampled if step % 2 == 0 else 1, nct, [table])
            per_half.append((step, half, len(emulator.calls) - calls, c.ops))
        nct[2] += 3  # the runner advances its own counts between the halves' steps
        nct[0] += 1
        qsl[1:] = torch.tensor([1, 2], dtype=torch.int32)
    # the first pre-copy sets up the device path and uploads the table records once; then nothing
    assert per_half[0][2] == 1 and "aten.copy_.default" in per_half[0][3], per_half[0]
    for step, half, launches, ops in per_half[1:]:
        assert launches == 1 and ops == [], (step, half, launches, ops)
    assert ms.last_error().ok
    # the prefix hit moved column 0 -> 1 in the first pre-copy; slot 2 advanced to column 2
    assert ms.state_idx.tolist() == [1, -1, 2, -1]


def test_bad_device_values_are_skipped_and_reported(fake_ops, emulator, launch_args):
    ms, states, table = _small()
    ms.add_request(1, 4)
    snap = [t.clone() for t in states]
    nct = torch.tensor([0, 4, 0, 0], dtype=torch.int32)
    # row 0: slot 7 is outside the 4 slots; row 1: 40 tokens put the new column (9) outside the row
    ms.preprocess_state(
        torch.tensor([7, 1], dtype=torch.int32), nct, torch.tensor([0, 1, 37], dtype=torch.int32), [table]
    )
    err = ms.last_error()
    assert set(err.names) == {"args", "column"} and (err.first_request, err.last_request) == (0, 1)
    assert all(torch.equal(a, b) for a, b in zip(states, snap))  # nothing copied
    # the post-process reports into the same step's word; the next pre-copy starts a new word
    ms.postprocess_state(torch.tensor([-1, 9], dtype=torch.int32), 1, nct, [table])
    assert set(ms.last_error().names) == {"args", "column"} and ms.last_error().last_request == 1
    ms.preprocess_state(torch.tensor([1], dtype=torch.int32), nct, torch.tensor([0, 1], dtype=torch.int32), [table])
    assert ms.last_error().ok


def test_inputs_and_group_ids_are_checked_by_the_core(fake_ops, recorder, launch_args):
    from recoverssm_rs.errors import PlanError
    from recoverssm_rs.vllm.model_state import ModelStateV2

    ms, _, table = _small()
    nct = torch.zeros(4, dtype=torch.int32)
    qsl = torch.zeros(3, dtype=torch.int32)
    with pytest.raises(PlanError, match="idx_mapping: expected int32, got torch.int64"):
        ms.preprocess_state(torch.zeros(2, dtype=torch.int64), nct, qsl, [table])
    with pytest.raises(PlanError, match="query_start_loc: expected a 1-D vector of at least 3"):
        ms.preprocess_state(torch.zeros(2, dtype=torch.int32), nct, qsl[:2], [table])
    assert recorder.calls == []
    _begin_step(ms, table, recorder.calls)
    with pytest.raises(PlanError, match="num_sampled: expected a 1-D vector of at least 2"):
        ms.postprocess_state(torch.zeros(2, dtype=torch.int32), torch.ones(1, dtype=torch.int32), nct, [table])
    with pytest.raises(PlanError, match="block_tables has no table for KV-cache group 0"):
        ms.preprocess_state(torch.zeros(2, dtype=torch.int32), nct, qsl, {3: table})
    assert recorder.calls == []
    with pytest.raises(PlanError, match=r"group_ids\[0\] = -1"):
        ModelStateV2(ms.planner, [-1], 4)
    with pytest.raises(PlanError, match="2 group ids for a planner of 1 groups"):
        ModelStateV2(ms.planner, [0, 1], 4)
    assert ModelStateV2(ms.planner, {5: None}.keys(), 4, device="cpu").group_ids == [5]


def test_the_core_checks_the_constructor_and_add_request(fake_ops, launch_args):
    """The constructor's arguments (the planner's block_size, the capacity) and ``add_request``'s
    are checked by the core: the package's error naming what is wrong, and nothing written."""
    from recoverssm_rs import Planner
    from recoverssm_rs.errors import BindingError, PlanError
    from recoverssm_rs.vllm.model_state import ModelStateV2

    ms, _, _ = _small()
    no_bs = Planner.from_groups([(lay, ms.planner.core.states[g]) for g, lay in enumerate(ms.planner.core.layouts)])
    with pytest.raises(PlanError, match="without a block_size"):
        ModelStateV2(no_bs, [0], 4)
    with pytest.raises(BindingError, match="planner must be a Planner, got str"):
        ModelStateV2("planner", [0], 4)  # type: ignore[arg-type]
    for bad in (0, 2**24 + 1):
        with pytest.raises(PlanError, match=r"max_num_reqs must be in 1 \.\.= 2\*\*24"):
            ModelStateV2(ms.planner, [0], bad)
    before = (ms.state_idx.clone(), ms.num_accepted.clone())
    for slot, nct, msg in [(4, 1, "slot 4 is out of range"), (0, -1, "num_computed_tokens -1 is out of range")]:
        with pytest.raises(PlanError, match=msg):
            ms.add_request(slot, nct)
    assert torch.equal(ms.state_idx, before[0]) and torch.equal(ms.num_accepted, before[1])
    for nct, column in [(0, -1), (4, 0), (5, 1), (9, 2)]:  # (num_computed_tokens - 1) // block_size 4
        ms.add_request(3, nct)
        assert (int(ms.state_idx[3]), int(ms.num_accepted[3])) == (column, 1)


def test_a_second_pre_copy_without_a_post_process_moves_nothing_again(fake_ops, emulator, launch_args):
    ms, states, table = _small()
    ms.add_request(0, 4)  # state in column 0 (block 1)
    nct = torch.tensor([4, 0, 0, 0], dtype=torch.int32)
    idx, qsl = torch.tensor([0], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32)
    ms.preprocess_state(idx, nct, qsl, [table])
    assert ms.state_idx[0] == 1 and ms.num_accepted[0] == 1
    moved = [t.clone() for t in states]
    states[1][1].fill_(7.0)  # the old column changes: a repeated move would copy it again
    ms.preprocess_state(idx, nct, qsl, [table])
    assert torch.equal(states[1][2], moved[1][2]) and ms.state_idx[0] == 1
    assert ms.last_error().ok


def test_prepare_device_loads_the_kernel_before_any_step(fake_ops, recorder, launch_args, monkeypatch):
    from recoverssm_rs.cuda import module

    loaded = []
    monkeypatch.setattr(module, "function_ptr", lambda name, index: loaded.append((name, index)) or 1)
    ms, _, _ = _small()
    ms.prepare_device()
    assert loaded == [("rs_state_copy_slots", 0)] and recorder.calls == []
    assert fake_ops.uploads == 1  # the planner's state table, once


def test_a_recoverssm_commit_on_a_host_cache_runs_before_the_launch(fake_ops, recorder, launch_args):
    """A host cache commits with the torch reference before the launch; the launch sets the
    committed rows' columns and counts from the staged computed tokens (``-1`` elsewhere): the
    adapter writes none of its slot buffers itself, and the launch carries no commit rows."""
    from recoverssm_rs.errors import PlanError
    from recoverssm_rs.vllm import RecoverSSMCommit

    ms, _, table = _small()
    commits = []
    cache = NS(
        commit=lambda sampled, blocks, qlens, **kw: commits.append((sampled.tolist(), kw["seq_lens"].tolist())),
        fused_commit=lambda: None,
        window=3,
        num_blocks=16,
        max_requests=4,
    )
    before = (ms.state_idx.clone(), ms.num_accepted.clone())
    commit = RecoverSSMCommit(
        cache,
        request_indices=torch.tensor([1]),
        state_blocks=[3],
        num_computed_tokens=torch.tensor([2, 9, 4], dtype=torch.int32),
        block_table=torch.tensor([[4, 5, 6, 7, 8]], dtype=torch.int32),
    )
    idx = torch.tensor([0, 2, -1], dtype=torch.int32)
    sampled = torch.tensor([1, 3, 2], dtype=torch.int32)
    _begin_step(ms, table, recorder.calls)
    # a post-process the core refuses after the commit was staged: nothing commits, nothing runs
    with pytest.raises(PlanError, match="num_sampled: expected a 1-D vector of at least 3"):
        ms.postprocess_state(idx, sampled[:2], torch.zeros(4, dtype=torch.int32), [table], recoverssm=commit)
    assert commits == [] and recorder.calls == []
    ms.postprocess_state(idx, sampled, torch.zeros(4, dtype=torch.int32), [table], recoverssm=commit)
    assert commits == [([3], [9])]
    assert torch.equal(ms.state_idx, before[0]) and torch.equal(ms.num_accepted, before[1])
    # one row staged, as the second stage (the refused post-process staged the first); batch row 1's tokens
    assert ms._stage.tolist()[:5] == [1, 2, -1, 9, -1]
    (call,) = recorder.calls
    assert call["commit_stage"] == ms._stage.data_ptr() and call["commit_computed"] == ms._stage.data_ptr() + 8
    assert call["commit_cols"] == 5 and call["commit_rows"] == 0


def _commit_setup(monkeypatch):
    """The small adapter (slots 0 and 2 running) and a one-layer KDA cache whose commit runs on
    the emulated kernel (its counts taken as device ones), with a reference copy of the cache;
    batch rows 0 -> slot 0, 1 -> slot 2."""
    from recoverssm_rs import layouts
    from recoverssm_rs.speculative.state_cache import StateCache
    from support.device_fakes import bind_host_commit

    monkeypatch.setattr(StateCache, "_is_device_tensor", staticmethod(lambda x: isinstance(x, torch.Tensor)))
    ms, states, table = _small()
    table[2, 3] = 13  # slot 2 owns a fourth column
    ms.add_request(0, 4)
    ms.add_request(2, 9)
    layout = layouts.kda(
        num_heads=2, head_dim=4, conv_kernel_size=3, num_spec=2, recover_ssm=True, dtype="float32", ssm_dtype="float32"
    )
    caches = [StateCache(layout, num_layers=1, num_blocks=12, max_requests=4) for _ in range(2)]
    gen = torch.Generator().manual_seed(3)
    for k, t in caches[0].buffers().items():
        t.copy_(torch.randn(t.shape, generator=gen))
        caches[1].buffers()[k].copy_(t)
    bind_host_commit(caches[0])
    return ms, states, table, caches


def _commit(cache):
    from recoverssm_rs.vllm import RecoverSSMCommit

    return RecoverSSMCommit(
        cache,
        request_indices=torch.tensor([1]),
        state_blocks=[3],
        num_computed_tokens=torch.tensor([2, 9], dtype=torch.int32),
        block_table=torch.tensor([[4, 5, 6, 7, 8]], dtype=torch.int32),
    )


def test_a_recoverssm_post_process_with_the_commit_kernel_is_one_launch(fake_ops, emulator, launch_args, monkeypatch):
    """Staged when the step's metadata is built, a CUDA cache's commit runs inside the
    post-process's one launch: no torch operation, no rs_recover_commit launch; the cache equals
    the reference commit, the committed slot's column and count are vLLM's ``commit_step``."""
    from recoverssm_rs.errors import PlanError

    ms, _, table, caches = _commit_setup(monkeypatch)
    idx, sampled = torch.tensor([0, 2], dtype=torch.int32), torch.tensor([1, 3], dtype=torch.int32)
    uncommitted = caches[0].buffers()["recurrent"].clone()
    commit = _commit(caches[0])
    ms.stage_recoverssm(commit)  # when the step's metadata is built
    ms.preprocess_state(
        idx, torch.tensor([4, 0, 9, 0], dtype=torch.int32), torch.tensor([0, 1, 4], dtype=torch.int32), [table]
    )
    nct = torch.tensor([5, 0, 12, 0], dtype=torch.int32)  # slot 2: 9 + 3 sampled
    calls = len(emulator.calls)
    with _count_ops() as c:
        ms.postprocess_state(idx, sampled, nct, [table], recoverssm=True)  # the staged commit
    assert len(emulator.calls) - calls == 1 and c.ops == []
    assert emulator.calls[-1]["kernel"] == "rs_state_copy_slots" and emulator.calls[-1]["commit_rows"]
    assert ms.last_error().ok
    # the reference: 3 tokens from 9 cross the boundary at 12 (column 2 of the commit's table)
    caches[1].commit([3], [3], seq_lens=[9], block_table=[[4, 5, 6, 7, 8]], block_size=4)
    for k, t in caches[0].buffers().items():
        assert torch.allclose(t, caches[1].buffers()[k], atol=1e-5, rtol=1e-5), k
    assert not torch.equal(caches[0].buffers()["recurrent"], uncommitted)
    assert (int(ms.state_idx[2]), int(ms.num_accepted[2])) == (11 // 4, 1)
    # a captured post-process replayed after the next pre-copy without a new stage commits nothing:
    # the stage's generation is the one the last commit saw
    committed = {k: t.clone() for k, t in caches[0].buffers().items()}
    ms.preprocess_state(idx, nct, torch.tensor([0, 1, 2], dtype=torch.int32), [table])
    slots = (ms.state_idx.clone(), ms.num_accepted.clone())
    emulator.launch(emulator.calls[-2]["launch"], 0, None)  # the post-process's launch, again
    assert all(torch.equal(t, committed[k]) for k, t in caches[0].buffers().items())
    assert torch.equal(ms.state_idx, slots[0])  # committed, slot 2 would be back in column 2
    with pytest.raises(PlanError, match="no RecoverSSM commit is staged for this step"):
        ms.postprocess_state(idx, sampled, nct, [table], recoverssm=True)


def test_staging_is_refused_during_a_graph_capture(fake_ops, launch_args, monkeypatch):
    """A commit staged while a CUDA graph is being captured would be baked into the graph (its
    host-to-device copy replayed with the captured bytes): refused before anything is planned or
    staged; the same commit stages once the capture is over."""
    from recoverssm_rs.errors import PlanError

    ms, _, _, caches = _commit_setup(monkeypatch)
    stage = ms._stage.clone()
    monkeypatch.setattr(fake_ops, "capturing", lambda: True, raising=False)
    with pytest.raises(PlanError, match="a CUDA graph is being captured; stage the commit before the capture"):
        ms.stage_recoverssm(_commit(caches[0]))
    assert torch.equal(ms._stage, stage) and fake_ops.staged == 0
    monkeypatch.setattr(fake_ops, "capturing", lambda: False)
    ms.stage_recoverssm(_commit(caches[0]))
    assert fake_ops.staged == 1 and not torch.equal(ms._stage, stage)


def test_a_committed_row_whose_counts_disagree_is_reported_not_copied(fake_ops, emulator, launch_args, monkeypatch):
    """The commit's boundary write is a committed row's aligned save; a post-step count that is
    not the commit's tokens plus the sampled ones (16, not 12) would ask for a second save racing
    the commit in the same launch: the row is reported (``args``) and its states are not copied."""
    ms, states, table, caches = _commit_setup(monkeypatch)
    snap = [t.clone() for t in states]
    commit = _commit(caches[0])
    ms.stage_recoverssm(commit)
    _begin_step(ms, table)
    nct = torch.tensor([5, 0, 16, 0], dtype=torch.int32)
    ms.postprocess_state(
        torch.tensor([0, 2], dtype=torch.int32),
        torch.tensor([1, 3], dtype=torch.int32),
        nct,
        [table],
        recoverssm=True,
    )
    err = ms.last_error()
    assert err.names == ["args"] and (err.first_request, err.last_request) == (1, 1)
    assert all(torch.equal(a, b) for a, b in zip(states, snap))  # block 13 (column 3) untouched


def test_a_staged_commit_is_checked_and_consumed(fake_ops, recorder, launch_args, monkeypatch):
    """``post(commit=True)`` needs a staged commit, a batch that has its rows, and runs it once."""
    from recoverssm_rs.errors import PlanError
    from support.device_fakes import FakeCuda

    ms, _, table, caches = _commit_setup(monkeypatch)
    step = ms._core_step()
    nct, tables = FakeCuda(torch.zeros(4, dtype=torch.int32)), [FakeCuda(table)]
    rows = {n: FakeCuda(torch.zeros(n, dtype=torch.int32)) for n in (1, 2)}
    ones = {n: FakeCuda(torch.ones(n, dtype=torch.int32)) for n in (1, 2)}
    _begin_step(ms, table, recorder.calls)
    with pytest.raises(PlanError, match="no RecoverSSM commit is staged"):
        step.post(rows[2], ones[2], nct, tables, True)
    ms.stage_recoverssm(_commit(caches[0]))
    with pytest.raises(PlanError, match="names request row 1, but this post-process has 1 rows"):
        step.post(rows[1], ones[1], nct, tables, True)
    with pytest.raises(PlanError, match="needs the sampled counts per row"):
        step.post(rows[2], 1, nct, tables, True)
    step.post(rows[2], ones[2], nct, tables, True)
    _begin_step(ms, table)
    with pytest.raises(PlanError, match="no RecoverSSM commit is staged"):
        step.post(rows[2], ones[2], nct, tables, True)
    # a post-process without the commit forgets a staged one too (it is that step's)
    ms.stage_recoverssm(_commit(caches[0]))
    step.post(rows[2], ones[2], nct, tables, False)
    _begin_step(ms, table)
    with pytest.raises(PlanError, match="no RecoverSSM commit is staged"):
        step.post(rows[2], ones[2], nct, tables, True)


def test_a_commit_row_the_kernel_rejects_is_reported_under_its_batch_row(fake_ops, emulator, launch_args, monkeypatch):
    """A staged row the kernel refuses (here its running block rewritten in the stage buffer after
    the core's checks, beyond the cache's blocks) is not committed and is reported under its batch
    row in the post-process's word."""
    ms, _, table, caches = _commit_setup(monkeypatch)
    before = {k: t.clone() for k, t in caches[0].buffers().items()}
    ms.stage_recoverssm(_commit(caches[0]))
    rows_at = 8  # int32 word of the first CommitRow: 4 slots -> 32 bytes of count, generation, tokens
    assert ms._stage[rows_at + 2] == 3  # its state_block
    ms._stage[rows_at + 2] = 999
    _begin_step(ms, table)
    nct = torch.tensor([5, 0, 12, 0], dtype=torch.int32)
    idx, sampled = torch.tensor([0, 2], dtype=torch.int32), torch.tensor([1, 3], dtype=torch.int32)
    ms.postprocess_state(idx, sampled, nct, [table], recoverssm=True)
    err = ms.last_error()
    assert err.names == ["block"] and (err.first_request, err.last_request) == (1, 1)
    assert all(torch.equal(t, before[k]) for k, t in caches[0].buffers().items())


def test_the_core_passes_each_runner_tensor_through_the_launch_hook_once(fake_ops, recorder, monkeypatch):
    """Each half-step hands the core the runner's objects as they are; the core passes each tensor
    it describes through ``CudaOps.launch_arg`` (read at every call) once: the index map, the
    counts, the offsets and the table of each mamba group -- no other group's table, no integer
    count and no absent ``num_computed_tokens``."""
    from recoverssm_rs.cuda.ops import CudaOps
    from support.device_fakes import FakeCuda

    seen: list[object] = []

    def hook(t):
        seen.append(t)
        return t if isinstance(t, FakeCuda) else FakeCuda(t)

    monkeypatch.setattr(CudaOps, "launch_arg", staticmethod(hook))
    ms, _, table = _small()
    other = torch.zeros(4, 6, dtype=torch.int32)  # group 1's: not a mamba group of this adapter
    idx, nct, qsl = (
        torch.zeros(0, dtype=torch.int32),
        torch.zeros(4, dtype=torch.int32),
        torch.zeros(1, dtype=torch.int32),
    )
    ms.preprocess_state(idx, nct, qsl, [table, other])
    assert [id(t) for t in seen[-4:]] == [id(idx), id(nct), id(qsl), id(table)]
    seen.clear()
    sampled = torch.zeros(0, dtype=torch.int32)
    ms.postprocess_state(idx, sampled, nct, {0: table, 1: other})
    assert [id(t) for t in seen] == [id(idx), id(nct), id(sampled), id(table)]
    seen.clear()
    ms.preprocess_state(idx, nct, qsl, [table])
    ms.postprocess_state(idx, 1, None, [table])
    assert [id(t) for t in seen] == [id(idx), id(nct), id(qsl), id(table), id(idx), id(table)]
    assert len(recorder.calls) == 4


def test_table_records_are_sent_again_after_a_failed_upload(fake_ops, recorder, launch_args):
    """The core records the groups' table records as uploaded only once the write that uploads
    them (``run``) has returned: a half-step whose upload or launch raised hands the records to
    the next half-step again, so the device never keeps records that were not written."""
    from recoverssm_rs.vllm.model_state import ModelStateV2

    ms, _, table = _small()
    got: list[bytes | None] = []

    def failing(kl, records):
        got.append(records)
        raise RuntimeError("the upload failed")

    ms._run = failing  # the adapter's write callback, as the core calls it
    with pytest.raises(RuntimeError, match="the upload failed"):
        _begin_step(ms, table)
    ms._run = lambda kl, records: (got.append(records), ModelStateV2._run(ms, kl, records))
    _begin_step(ms, table)  # not a repeated pre-copy: the refused one did not count
    ms.postprocess_state(torch.zeros(0, dtype=torch.int32), 1, None, [table])
    assert got[0] is not None and got[1] == got[0] and got[2] is None, got
    assert ms._tables.tolist() == list(memoryview(got[0]).cast("q"))
