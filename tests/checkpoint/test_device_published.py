"""Copy-on-write on vLLM's device half-steps: a pre-copy or post-process launch that would write a
published block is refused before anything is launched (``DeviceStep`` over the core's
``vllm_device_pre_copy`` / ``vllm_device_post_process``), and goes ahead once the block is
retracted."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from recoverssm_rs import Planner  # noqa: E402
from recoverssm_rs.errors import PlanError  # noqa: E402
from recoverssm_rs.vllm.decide import PostProcessInputs, PreCopyInputs  # noqa: E402
from recoverssm_rs.vllm.device_step import DeviceStep  # noqa: E402
from support.device_fakes import FakeCuda, random_states  # noqa: E402
from support.generators import group_layouts  # noqa: E402

COLS = 8
BS = 4


def fake(x, dtype=torch.int32) -> FakeCuda:
    return FakeCuda(torch.as_tensor(np.array(x)).to(dtype))


def step_over_one_request():
    lay = group_layouts()[0]
    states = random_states(lay, COLS + 2, 1, np.random.default_rng(3))
    planner = Planner.from_groups([(lay, [[FakeCuda(t) for t in layer] for layer in states])], block_size=BS)
    table = [np.arange(1, COLS + 1, dtype=np.int64)[None, :]]  # the request's column k is block k + 1
    return planner, DeviceStep(planner, 2), table


def test_a_pre_copy_into_a_published_block_is_refused(fake_ops, recorder):
    planner, step, table = step_over_one_request()
    # 8 tokens computed, 1 scheduled: the running state (column 0) moves to column 2 = block 3.
    pre = PreCopyInputs(table, np.array([8]), np.array([1]), fake([1]), np.array([0]))
    planner.publish(np.array([3]))
    with pytest.raises(PlanError, match=r"published") as e:
        step.launch(pre)
    assert "block 3" in str(e.value) and not recorder.calls, "nothing launched"
    planner.publish(np.array([1, 2, 4, 5]))  # blocks it does not write (the source, others) are fine
    planner.retract(np.array([3]))
    step.launch(pre)
    assert len(recorder.calls) == 1


def test_a_post_process_that_may_save_into_a_published_block_is_refused(fake_ops, recorder):
    planner, step, table = step_over_one_request()
    # 3 computed, 1 + 2 drafts scheduled, the counts on the device: 1, 2 or 3 accepted tokens end
    # at 3, 4 or 5 (the running column 1), and the save at the block boundary (4 tokens) goes to column 0 = block 1.
    post = PostProcessInputs(table, np.array([1]), np.array([3]), np.array([3]), np.array([2]), fake([2]))
    planner.publish(np.array([1]))
    with pytest.raises(PlanError, match=r"published"):
        step.launch(post)
    assert not recorder.calls
    planner.retract(np.array([1]))
    step.launch(post)
    assert len(recorder.calls) == 1
