"""Float, bool and object inputs at every public host entry point: each is refused with the
package's own error naming the argument, never truncated to an integer, and nothing is written."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import recoverssm_rs as rs  # noqa: E402
from recoverssm_rs import layouts  # noqa: E402
from recoverssm_rs.vllm import (  # noqa: E402
    PostProcessInputs,
    PreCopyInputs,
    VllmMambaStep,
    align_post_process,
    align_pre_copy,
)

LAYOUT = rs.Layout(
    "X",
    [
        rs.StateSpec("c", (3, 4), "float32", copy="conv", conv_layout="SD"),
        rs.StateSpec("t", (4,), "float32", copy="temporal"),
    ],
    num_spec=2,
)
TABLE = np.arange(1, 11, dtype=np.int64).reshape(2, 5)


def _states():
    g = torch.Generator().manual_seed(0)
    return [[torch.randn(16, 3, 4, generator=g), torch.randn(16, 4, generator=g)]]


def _planner():
    states = _states()
    return rs.Planner(LAYOUT, states, block_size=4), states


def _refused(call, *names, kind=rs.PlanError, states=None):
    before = [t.clone() for layer in states or [] for t in layer]
    with pytest.raises(kind) as e:
        call()
    assert isinstance(e.value, rs.RecoverSSMError)
    for n in names:
        assert n in str(e.value), (n, str(e.value))
    after = [t for layer in states or [] for t in layer]
    assert all(torch.equal(a, b) for a, b in zip(before, after))


GOOD = {"src": np.array([0, 1]), "dst": np.array([1, 2]), "acc": np.array([1, 2])}


@pytest.mark.parametrize(
    ("arg", "value"),
    [
        ("num_accepted", np.array([1.5, 1.0])),
        ("src_col", np.array([0.9, 1.0])),
        ("dst_col", [1, True]),
        ("block_table", TABLE.astype(np.float64)),
        ("src_col", np.array([0, 1], dtype=object)),
    ],
)
def test_planner_steps_refuse_non_integers(arg, value):
    p, states = _planner()
    kw = {"block_table": TABLE, "src_col": GOOD["src"], "dst_col": GOOD["dst"], "num_accepted": GOOD["acc"]}
    kw[arg] = value
    _refused(lambda: p.plan_align(**kw).execute(), arg, states=states)
    kw = {"block_tables": [kw.pop("block_table")], **kw}
    _refused(lambda: p.plan(**kw).execute(), "tables" if arg == "block_table" else arg, states=states)


def test_block_copies_refuse_floats():
    p, states = _planner()
    _refused(lambda: p.plan_copy(np.array([1.0]), np.array([2])).execute(), "src_blocks", states=states)
    _refused(lambda: p.plan_copy([1], [2.7]).execute(), "dst_blocks", states=states)


DECIDE = {
    "num_computed": np.array([8, 4]),
    "num_scheduled": np.array([3, 3]),
    "num_accepted": np.array([1, 1]),
    "mamba_state_idx": np.array([1, 0]),
}


@pytest.mark.parametrize("arg", list(DECIDE))
def test_vllm_decisions_refuse_floats(arg):
    kw = {**DECIDE, arg: DECIDE[arg] + 0.5}
    _refused(lambda: align_pre_copy(PreCopyInputs([TABLE], **kw), block_size=4, num_spec_blocks=2), arg)
    post = {
        "state_col": np.array([2, 1]),
        "num_computed": DECIDE["num_computed"],
        "num_scheduled": DECIDE["num_scheduled"],
        "num_draft": np.array([2, 2]),
        "num_accepted": np.array([1, 1]),
    }
    name = arg if arg in post else "state_col"
    post[name] = post[name] + 0.5
    _refused(lambda: align_post_process(PostProcessInputs([TABLE], **post), block_size=4, num_spec_blocks=2), name)
    _refused(lambda: align_pre_copy(PreCopyInputs([TABLE], **DECIDE), block_size=4.0, num_spec_blocks=2), "block_size")


def test_the_vllm_step_refuses_floats_on_the_host_path():
    states = _states()
    step = VllmMambaStep([(0, LAYOUT, states)], block_size=4, num_spec_blocks=2, max_num_reqs=4)
    bt = TABLE[:1]
    _refused(lambda: step.pre_copy([bt], [0], [8.5], [3], [1]), "num_computed", states=states)
    _refused(lambda: step.pre_copy([bt], [0.0], [8], [3], [1]), "slots", states=states)
    _refused(lambda: step.pre_copy([bt], [0], [8], [3], [1.5]), "num_accepted", states=states)
    _refused(lambda: step.post_process([bt], [2], [8], [3], [2], [1.5]), "num_accepted", states=states)
    assert (step.mamba_state_idx == -1).all()


def test_the_state_cache_refuses_floats():
    lay = layouts.kda(num_heads=2, head_dim=8, num_spec=3, conv_kernel_size=4, recover_ssm=True)
    _refused(
        lambda: rs.StateCache(lay, num_layers=2.0, num_blocks=8, max_requests=2), "num_layers", kind=rs.BindingError
    )
    cache = rs.StateCache(lay, num_layers=1, num_blocks=8, max_requests=2)
    before = {k: v.clone() for k, v in cache.buffers().items()}
    _refused(lambda: cache.reset_blocks(np.array([1.0, 2.0])), "state_blocks")
    _refused(lambda: cache.copy_blocks([1.0], [2]), "src_blocks")
    _refused(lambda: cache.commit(np.array([1.5]), np.array([3])), "num_accepted")
    _refused(lambda: cache.commit(np.array([1]), np.array([3.0])), "state_blocks")
    _refused(lambda: cache.conv_state(0.0), "layer")
    for k, v in cache.buffers().items():
        assert torch.equal(v, before[k]), k


@pytest.mark.parametrize("name", [{"a": 1}, ["qwen3-next"], None, "qwen3-next"])
def test_an_unknown_preset_lists_the_known_ones(name):
    with pytest.raises(rs.LayoutError, match="unknown preset .*; choose one of: qwen3-next-80b-a3b"):
        layouts.preset(name)


@pytest.mark.parametrize("tables", [None, object()])
def test_plan_needs_a_list_of_tables(tables):
    p, states = _planner()
    _refused(lambda: p.plan(tables, GOOD["src"], GOOD["dst"], GOOD["acc"]), "tables", states=states)


@pytest.mark.parametrize("value", [np.array([2, 2]), 2.0, -1])
def test_the_steps_speculative_blocks_are_integers(value):
    with pytest.raises(rs.PlanError, match="num_spec_blocks"):
        VllmMambaStep([(0, LAYOUT, _states())], block_size=4, num_spec_blocks=value, max_num_reqs=4)
