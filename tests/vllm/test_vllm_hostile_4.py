"""vLLM's V2 post-process refuses a negative ``num_sampled`` given as one integer for every row
(vLLM counts 0 as 1 and never passes a negative count): a PlanError naming ``num_sampled``, and
nothing is written -- no state byte, column, count or error word -- and the step's post-process
may still run. (A negative count in a per-row device tensor is read by the kernel alone, which
takes it as 1, as vLLM's own scatter kernel does.)"""

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
