"""vLLM's V2 post-process refuses a negative ``num_sampled`` given as one integer for every row
(vLLM counts 0 as 1 and never passes a negative count): a PlanError naming ``num_sampled``, and
nothing is written -- no state byte, column, count or error word -- and the step's post-process
may still run. (A negative count in a per-row device tensor is read by the kernel alone, which
takes it as 1, as vLLM's own scatter kernel does.)

A host step or host plan refuses a runner tensor (block table, request indices, counts) whose
storage was freed or shrunk (``untyped_storage().resize_()``): ``numpy()`` would hand out a new
uninitialised buffer, or a view reading past the storage's end; the PlanError names the argument
and nothing is read or written."""

from __future__ import annotations

import pytest
import torch
from recoverssm_rs.errors import PlanError
from test_v2_refusals import _adapter, _same, _snapshot, _v


@pytest.mark.parametrize("fill", [-1, -2, -(2**31)])
@pytest.mark.parametrize("nct", ["save", "no-save"])
def test_a_negative_count_for_every_row_is_refused_and_writes_nothing(fake_ops, emulator, launch_args, fill, nct):
    ms, states, table = _adapter()
    ms.preprocess_state(_v(1, 2), _v(0, 4, 4, 0), _v(0, 4, 5), [table])
    ms._acc[1] = 3
    computed = _v(0, 8, 5, 0) if nct == "save" else None
    before, words, launches = _snapshot(ms, states), ms._err.clone(), len(emulator.calls)
    with pytest.raises(PlanError, match=rf"num_sampled = {fill} \(one count for every row\).*>= 0"):
        ms.postprocess_state(_v(1, 2), fill, computed, [table])
    assert _same(before, _snapshot(ms, states)) and torch.equal(words, ms._err)
    assert len(emulator.calls) == launches, "nothing launched"
    # Refused before anything ran: the step's post-process still runs (0 counts as 1, as vLLM's).
    ms.postprocess_state(_v(1, 2), 0, computed, [table])
    assert ms.last_error().ok and ms.num_accepted.tolist()[1:3] == [1, 1]


# ---- runner tensors whose storage was freed or shrunk (host path) -------------------------------


def _gone(t: torch.Tensor, how: str) -> torch.Tensor:
    """``t`` with its storage freed (``resize_(0)``) or shrunk to 4 bytes: ``t.numpy()`` would
    hand out a new uninitialised buffer, or a view reading past the 4 bytes."""
    t.untyped_storage().resize_(0 if how == "freed" else 4)
    return t


HOW = ["freed", "shrunk"]


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("which", ["block_tables", "slots", "num_computed", "num_scheduled", "num_accepted"])
def test_a_v1_host_step_refuses_a_runner_tensor_whose_storage_is_gone(how, which):
    from test_hostile_step import _side, _snapshot, _step, _unchanged

    _, side = _side()
    step = _step(side)
    step.mamba_state_idx[:] = [0, -1, -1, -1]

    def args():
        return dict(
            block_tables=torch.arange(1, 9, dtype=torch.int64).reshape(1, 8),
            slots=torch.tensor([0], dtype=torch.int64),
            num_computed=torch.tensor([4], dtype=torch.int64),
            num_scheduled=torch.tensor([4], dtype=torch.int64),
            num_accepted=torch.tensor([1], dtype=torch.int64),
        )

    a = args()
    a[which] = _gone(a[which], how)
    a["block_tables"] = [a["block_tables"]]
    before = _snapshot(side)
    needle = "was freed" if how == "freed" else "holds 4 bytes"
    named = "group 0: tables" if which == "block_tables" else which
    with pytest.raises(PlanError, match=rf"^{named}: its storage {needle}.*nothing was read"):
        step.pre_copy(**a)
    assert step.mamba_state_idx.tolist() == [0, -1, -1, -1] and _unchanged(side, before)
    # The same call over tensors that hold their bytes runs (the state moves to column 1).
    ok = args()
    ok["block_tables"] = [ok["block_tables"]]
    step.pre_copy(**ok)
    assert step.mamba_state_idx.tolist() == [1, -1, -1, -1]
