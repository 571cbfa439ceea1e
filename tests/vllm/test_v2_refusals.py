"""``ModelStateV2`` refuses bad runner inputs and leaves every piece of state as it was.

The half-steps read the runner's device tensors in one launch (nothing is read back to the host),
so a bad *value* in them is refused on the device: the kernel reports the row into the step's
error word (:meth:`ModelStateV2.last_error`) and writes nothing for it -- no state byte of any
group, no running column, no count -- while the batch's other rows run. Bad *calls* (a second
post-process for one step) are refused by the core before anything is launched. Each test compares
every bound state tensor and the adapter's columns, counts and scratch before and after; the
launches run through the host emulation of the kernel."""

from __future__ import annotations

import types

import pytest
import torch
from recoverssm_rs.errors import PlanError
from support import vllm_oracle, vllm_trace

I32 = torch.int32


def _v(*xs: int) -> torch.Tensor:
    return torch.tensor(xs, dtype=I32)


def _snapshot(ms, states):
    """Every bound state tensor and the adapter's per-slot buffers."""
    return [t.clone() for t in states] + [ms._state.clone(), ms._acc.clone(), ms._scratch.clone()]


def _same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _adapter():
    """One GDN group (block_size 4, 2 drafts, 16 blocks, 4 slots); slots 1 and 2 hold requests with
    4 cached tokens (their states in column 0), table columns 1.. of their own blocks."""
    ms, states = vllm_trace.small_model_state(fake=True)
    table = torch.zeros(4, 6, dtype=I32)
    table[1, :4] = _v(1, 2, 3, 4)
    table[2, :4] = _v(5, 6, 7, 8)
    ms.add_request(1, 4)
    ms.add_request(2, 4)
    return ms, states, table


def _word(ms):
    w = ms.last_error()
    return set(w.names), w.first_request


@pytest.mark.parametrize("slot", [-2, -7, -(2**31)])
def test_a_slot_below_minus_one_is_refused_not_skipped(fake_ops, emulator, launch_args, slot):
    ms, states, table = _adapter()
    nct = _v(0, 4, 4, 0)
    before = _snapshot(ms, states)
    ms.preprocess_state(_v(slot), nct, _v(0, 1), [table])
    assert _same(before, _snapshot(ms, states))
    assert _word(ms) == ({"args"}, 0)
    # The other rows of a batch run: row 1 (slot 1) moves, row 0 is refused.
    ms, states, table = _adapter()
    before = _snapshot(ms, states)
    ms.preprocess_state(_v(slot, 1), nct, _v(0, 1, 2), [table])
    assert ms.state_idx.tolist() == [-1, 1, 0, -1]
    assert torch.equal(states[1][2], before[1][1])
    assert _word(ms) == ({"args"}, 0)
    # In the post-process too (every buffer as it was).
    before = _snapshot(ms, states)
    ms.postprocess_state(_v(slot), _v(3), _v(0, 7, 4, 0), [table])
    assert _same(before, _snapshot(ms, states))
    assert _word(ms)[0] == {"args"}


def test_two_rows_on_one_slot_are_both_refused(fake_ops, emulator, launch_args):
    ms, states, table = _adapter()
    before = _snapshot(ms, states)
    ms.preprocess_state(_v(1, 1), _v(0, 4, 4, 0), _v(0, 1, 2), [table])
    assert _same(before, _snapshot(ms, states))  # neither row moved slot 1's state or column
    assert _word(ms) == ({"args"}, 0)
    # -1 (a row filtered out under pipeline parallelism) repeats freely; the real rows run.
    ms.preprocess_state(_v(-1, 1, -1, 2), _v(0, 4, 4, 0), _v(0, 1, 2, 3, 4), [table])
    assert ms.last_error().ok and ms.state_idx.tolist() == [-1, 1, 1, -1]
    # The post-process: a shared slot writes no count (a shift in place would set it to 1).
    before = _snapshot(ms, states)
    ms.postprocess_state(_v(2, 2), _v(3, 1), _v(0, 4, 8, 0), [table])
    assert _same(before, _snapshot(ms, states))
    assert _word(ms)[0] == {"args"}


def test_a_decreasing_query_start_loc_is_refused_not_a_reset(fake_ops, emulator, launch_args):
    ms, states, table = _adapter()
    ms.add_request(1, 12)  # slot 1's state in column 2
    nct = _v(0, 12, 4, 0)
    before = _snapshot(ms, states)
    # query_start_loc [5, 0]: a query length of -5 would put the new column at 1 (a reset)
    ms.preprocess_state(_v(1), nct, _v(5, 0), [table])
    assert _same(before, _snapshot(ms, states)) and ms.state_idx.tolist() == [-1, 2, 0, -1]
    assert _word(ms) == ({"args"}, 0)


@pytest.mark.parametrize("block", [0, 16, 99, -3])
def test_a_bad_destination_block_leaves_the_column(fake_ops, emulator, launch_args, block):
    """The move's destination is the null block or outside the states: reported, and the slot's
    column, count and every state stay (the kernel decides every group before it moves a column)."""
    ms, states, table = _adapter()
    table[1, 1] = block
    ms._acc[1] = 2  # a count the move would reset to 1
    before = _snapshot(ms, states)
    ms.preprocess_state(_v(1, 2), _v(0, 4, 4, 0), _v(0, 1, 2), [table])
    names, row = _word(ms)
    assert names == {"block"} and row == 0
    after = _snapshot(ms, states)
    assert after[2].tolist() == [-1, 0, 1, -1]  # slot 1 kept column 0; slot 2 moved
    assert after[3][1] == 2
    assert torch.equal(after[0][1:5], before[0][1:5]) and torch.equal(after[1][1:5], before[1][1:5])


def _two_groups():
    """Two GDN groups (ids 0 and 1, the same scheduling parameters), 16 blocks each, 4 slots."""
    from recoverssm_rs.vllm.model_state import ModelStateV2
    from support.device_fakes import FakeCuda

    def spec(shapes):
        return types.SimpleNamespace(
            mamba_type="GDN_ATTN",
            shapes=shapes,
            dtypes=[torch.float32] * 2,
            block_size=4,
            num_speculative_blocks=2,
            mamba_cache_mode="align",
        )

    groups = [
        types.SimpleNamespace(kv_cache_spec=spec([(5, 3), (2, 2)]), layer_names=["l0"]),
        types.SimpleNamespace(kv_cache_spec=spec([(5, 2), (3, 2)]), layer_names=["l1"]),
    ]
    states = [torch.randn(16, 5, 3), torch.randn(16, 2, 2), torch.randn(16, 5, 2), torch.randn(16, 3, 2)]
    ctx = {
        "l0": types.SimpleNamespace(kv_cache=[FakeCuda(t) for t in states[:2]]),
        "l1": types.SimpleNamespace(kv_cache=[FakeCuda(t) for t in states[2:]]),
    }
    funcs = {"GDN_ATTN": ("get_conv_copy_spec", "get_temporal_copy_spec")}
    cfg = types.SimpleNamespace(kv_cache_groups=groups)
    return ModelStateV2.from_runner(cfg, ctx, funcs, max_num_reqs=4, device="cpu"), states


def test_a_row_one_group_refuses_is_written_by_no_group(fake_ops, emulator, launch_args):
    ms, states = _two_groups()
    good = torch.zeros(4, 6, dtype=I32)
    good[1, :4] = _v(1, 2, 3, 4)
    bad = good.clone()
    bad[1, 1] = 0  # group 1's destination is the null block
    ms.add_request(1, 4)
    before = _snapshot(ms, states)
    ms.preprocess_state(_v(1), _v(0, 4, 0, 0), _v(0, 1), [good, bad])
    assert _same(before, _snapshot(ms, states))  # group 0's copy did not run either
    assert _word(ms) == ({"block"}, 0)
    # the same step with good tables moves both groups
    ms.preprocess_state(_v(1), _v(0, 4, 0, 0), _v(0, 1), [good, good])
    assert ms.last_error().ok and ms.state_idx.tolist() == [-1, 1, -1, -1]
    assert torch.equal(states[1][2], before[1][1]) and torch.equal(states[3][2], before[3][1])


def test_a_bad_block_in_a_save_writes_no_count(fake_ops, emulator, launch_args):
    """A post-process whose shift in place names a block outside the states: no count is reset."""
    ms, states, table = _adapter()
    ms.preprocess_state(_v(1), _v(0, 4, 4, 0), _v(0, 4), [table])  # slot 1: 4 + 4 tokens -> column 1
    assert ms.last_error().ok and ms.state_idx.tolist() == [-1, 1, 0, -1]
    table[1, 1] = 40
    before = _snapshot(ms, states)
    # 3 accepted tokens ending on the boundary at 12 tokens: the save shifts column 1 in place
    ms.postprocess_state(_v(1), _v(3), _v(0, 12, 4, 0), [table])
    assert _same(before, _snapshot(ms, states))
    assert _word(ms)[0] == {"block"}


def test_a_second_post_process_for_one_step_is_refused(fake_ops, emulator, launch_args):
    ms, states, table = _adapter()
    ms.preprocess_state(_v(1), _v(0, 4, 4, 0), _v(0, 5), [table])
    ms.postprocess_state(_v(1), _v(3), _v(0, 11, 4, 0), [table])
    launched = len(emulator.calls)
    before = _snapshot(ms, states)
    with pytest.raises(PlanError, match="no preprocess_state since the last post-process"):
        ms.postprocess_state(_v(1), _v(3), _v(0, 11, 4, 0), [table])
    assert _same(before, _snapshot(ms, states)) and len(emulator.calls) == launched
    # a pre-copy repeated (a step whose post-process was skipped) still opens one post-process
    ms.preprocess_state(_v(1), _v(0, 11, 4, 0), _v(0, 0), [table])
    ms.preprocess_state(_v(1), _v(0, 11, 4, 0), _v(0, 0), [table])
    ms.postprocess_state(_v(1), _v(1), _v(0, 11, 4, 0), [table])
    with pytest.raises(PlanError, match="repeated post-process"):
        ms.postprocess_state(_v(1), _v(1), _v(0, 11, 4, 0), [table])
    # the next step runs as usual
    ms.preprocess_state(_v(1), _v(0, 11, 4, 0), _v(0, 1), [table])
    ms.postprocess_state(_v(1), _v(1), _v(0, 12, 4, 0), [table])
    assert ms.last_error().ok


def _everything(ms, states):
    """Every piece of the adapter's state: the bound states, its device buffers (columns, counts,
    scratch, control words, error words, table records, commit stage) and its host mirrors."""
    bufs = (ms._state, ms._acc, ms._scratch, ms._ctl, ms._err, ms._tables, ms._stage)
    return [t.clone() for t in (*states, *bufs)], (ms._stamp, ms._last, ms._generation)


def test_a_post_process_before_any_pre_copy_is_refused(fake_ops, emulator, launch_args):
    """vLLM's V2 runner runs each step's pre-copy before its post-process (its dummy runs call
    neither): a post-process of request rows before the first pre-copy has no step of its own and
    is refused by the core, before anything is launched, with every piece of state as it was."""
    ms, states, table = _adapter()
    twin, twin_states, _ = _adapter()
    for a, b in zip(states, twin_states, strict=True):
        b.copy_(a)
    before = _everything(ms, states)
    with pytest.raises(PlanError, match="no preprocess_state has run yet") as e:
        ms.postprocess_state(_v(1), _v(3), _v(0, 7, 4, 0), [table])
    assert "postprocess_state" in str(e.value) and "first step" in str(e.value)
    with pytest.raises(PlanError, match="no preprocess_state has run yet"):
        ms.postprocess_state(_v(1, 2), 1, None, [table])  # one count for every row, no save: the same
    after = _everything(ms, states)
    assert _same(before[0], after[0]) and before[1] == after[1] and emulator.calls == []
    # The first step then runs as on an adapter that never saw the refused calls.
    for m in (ms, twin):
        m.preprocess_state(_v(1, 2), _v(0, 4, 4, 0), _v(0, 1, 2), [table])
        m.postprocess_state(_v(1, 2), _v(1, 1), _v(0, 5, 5, 0), [table])
    a, b = _everything(ms, states), _everything(twin, twin_states)
    assert _same(a[0], b[0]) and a[1] == b[1] and ms.last_error().ok
    # A post-process of no rows (an empty batch, whose pre-copy an engine may skip) writes nothing
    # of any request: taken before the first pre-copy.
    ms, states, table = _adapter()
    before = _everything(ms, states)
    ms.postprocess_state(_v(), _v(), _v(0, 4, 4, 0), [table])
    assert _same(before[0][:4], _everything(ms, states)[0][:4]) and ms.last_error().ok


def test_a_refused_post_process_call_keeps_the_step_open(fake_ops, emulator, launch_args):
    """A post-process the core refuses (a bad argument) launches nothing and the step's own
    post-process still runs afterwards."""
    ms, _, table = _adapter()
    ms.preprocess_state(_v(1), _v(0, 4, 4, 0), _v(0, 1), [table])
    with pytest.raises(PlanError, match="num_computed_tokens"):
        ms.postprocess_state(_v(1), _v(1), _v(0, 5), [table])
    ms.postprocess_state(_v(1), _v(1), _v(0, 5, 4, 0), [table])
    assert ms.last_error().ok


def test_no_computed_tokens_scatters_counts_without_a_save(fake_ops, emulator, launch_args):
    """``postprocess_state(idx_mapping, num_sampled, None, ...)``: a pipeline-parallel rank that is
    not the last (vLLM calls it with ``num_sampled=0`` and no computed tokens): every row's count
    becomes ``max(num_sampled, 1)``, no state moves."""
    ms, states, table = _adapter()
    ms.preprocess_state(_v(1, 2), _v(0, 4, 4, 0), _v(0, 4, 5), [table])
    ms._acc[1] = 3
    before = _snapshot(ms, states)
    ms.postprocess_state(_v(1, -1), 0, None, [table])
    after = _snapshot(ms, states)
    assert ms.last_error().ok
    assert _same(before[:2], after[:2]) and torch.equal(before[2], after[2])
    assert ms.num_accepted.tolist() == [1, 1, 1, 1]
    # counts per row: max(num_sampled, 1); the states stay (no aligned save)
    ms.preprocess_state(_v(2), _v(0, 4, 9, 0), _v(0, 1), [table])
    before = _snapshot(ms, states)
    ms.postprocess_state(_v(2), _v(2), None, [table])
    after = _snapshot(ms, states)
    assert ms.num_accepted.tolist() == [1, 1, 2, 1] and _same(before[:3], after[:3])


@pytest.fixture(scope="module")
def mh():
    from support import vllm_v2_oracle

    return vllm_oracle.load_or_skip(vllm_v2_oracle.load, f"vLLM {vllm_oracle.VERSION} (V2 runner)")


def test_non_last_pipeline_rank_post_process_equals_vllm(mh, fake_ops, emulator, launch_args):
    """vLLM's V2 runner on a pipeline-parallel rank that is not the last calls
    ``postprocess_state(idx_mapping, 0)``: it fills the counts and skips the aligned save. A random
    trace with such steps mixed in keeps every state byte, column and count equal to vLLM's."""
    from support import vllm_v2_oracle

    groups = [vllm_trace.GroupCfg("GDN_ATTN", 1)]
    stats = vllm_v2_oracle.run_trace(
        mh, groups, block_size=4, nsb=2, conv_layout="SD", seed=91, steps=10, emulator=emulator, non_last_rank=0.5
    )
    assert stats.non_last > 0 and stats.pre_moves > 0 and stats.post_saves > 0


@pytest.mark.parametrize(
    "bad",
    [
        lambda t: (_v(1).long(), _v(0, 4, 4, 0), _v(0, 1), [t]),  # idx_mapping int64
        lambda t: (_v(1), _v(0, 4), _v(0, 1), [t]),  # num_computed_tokens shorter than the slots
        lambda t: (_v(1), _v(0, 4, 4, 0), _v(0, 1), []),  # no table for the group
    ],
)
def test_a_refused_repeated_pre_copy_changes_nothing(fake_ops, emulator, launch_args, bad):
    """A pre-copy after a pre-copy (a step whose post-process was skipped) opens a new stamp; one
    the core refuses changes nothing -- no control or error word, no host mirror -- and launches
    nothing; the step then runs as on an adapter that never saw the refused call."""
    ms, states, table = _adapter()
    twin, twin_states, _ = _adapter()
    for a, b in zip(states, twin_states, strict=True):
        b.copy_(a)
    for m in (ms, twin):
        m.preprocess_state(_v(1), _v(0, 4, 4, 0), _v(0, 1), [table])
    before, launched = _everything(ms, states), len(emulator.calls)
    with pytest.raises(PlanError):
        ms.preprocess_state(*bad(table))
    after = _everything(ms, states)
    assert _same(before[0], after[0]) and before[1] == after[1] and len(emulator.calls) == launched
    for m in (ms, twin):
        m.preprocess_state(_v(1), _v(0, 4, 4, 0), _v(0, 1), [table])
        m.postprocess_state(_v(1), _v(1), _v(0, 5, 4, 0), [table])
    a, b = _everything(ms, states), _everything(twin, twin_states)
    assert _same(a[0], b[0]) and a[1] == b[1] and ms.last_error().ok
