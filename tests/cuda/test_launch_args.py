"""How a device step reaches the core: ``Planner.device_step`` takes the step's tensors positionally
(the launch path builds no dictionary) or by keyword, and every spelling gives the same launch;
the launch methods' options are plain keywords; a tensor's dtype and device are described afresh on
every call (the spellings the core remembers are keyed by the dtype and device themselves)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from recoverssm_rs import layouts  # noqa: E402
from recoverssm_rs.errors import PlanError  # noqa: E402
from recoverssm_rs.planner import Planner  # noqa: E402
from support.device_fakes import FakeCuda, random_states  # noqa: E402


def _planner() -> Planner:
    layout = layouts.gdn(num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=16, conv_kernel_size=4, num_spec=3)
    states = random_states(layout, 8, 2, np.random.default_rng(0))
    return Planner(layout, [[FakeCuda(t) for t in layer] for layer in states], block_size=4)


def fc(x, dtype=torch.int32, index: int = 0) -> FakeCuda:
    return FakeCuda(torch.as_tensor(np.asarray(x)).to(dtype), index)


def _step(R: int = 2, cols: int = 4):
    bt = fc(np.arange(1, R * cols + 1).reshape(R, cols))
    return bt, fc(np.zeros(R)), fc(np.full(R, cols - 1)), fc(np.ones(R))


NAMES = ("block_table", "src_col", "second", "num_accepted")


def test_positional_and_keyword_steps_pack_the_same_launch(fake_ops, recorder):
    planner = _planner()
    planner.device_path("test")  # the device path bound (the table "uploaded"), no kernel loaded
    core = planner.core
    step = _step()
    err, out = fc(np.zeros(3)), fc(np.zeros(2))
    for opts in ({}, {"pre_copy": True}, {"block_size": 4}):
        kw = dict(zip(NAMES, step), err=err, num_accepted_out=out, **opts)
        by_name, n1, narrow1 = core.device_step(**kw)
        by_place, n2, narrow2 = core.device_step(*step, err, out, **opts)
        mixed, n3, narrow3 = core.device_step(*step, err=err, num_accepted_out=out, **opts)
        assert (n1, narrow1) == (n2, narrow2) == (n3, narrow3) == (2, False)
        assert by_name.values() == by_place.values() == mixed.values() and by_name.args == by_place.args == mixed.args
    # err / num_accepted_out may be left off or given as None
    assert core.device_step(*step)[0].values() == core.device_step(*step, None, None)[0].values()
    assert core.check_device_step(*step) == core.check_device_step(**dict(zip(NAMES, step))) == 2


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda c, s: c.device_step(*s[:3], None), r"num_accepted: expected a CUDA tensor.*got NoneType"),
        (lambda c, s: c.device_step(s[0], s[1], [0, 0], s[3]), r"second: expected a CUDA tensor.*got list"),
        (lambda c, s: c.device_step(*s, "x"), r"err: expected a CUDA tensor.*got str"),
        (lambda c, s: c.device_step(*s, pre_copy=1), r"pre_copy must be a bool, got int"),
    ],
)
def test_device_step_refuses_mixed_or_wrong_arguments(fake_ops, recorder, call, message):
    planner = _planner()
    planner.device_path("test")  # the device path bound (the table "uploaded"), no kernel loaded
    with pytest.raises(PlanError, match=message):
        call(planner.core, _step())


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda c, s: c.device_step(*s[:3]), r"missing 1 required positional argument: 'num_accepted'"),
        (lambda c, s: c.device_step(*s, None, None, None), r"6 positional arguments but 7 were given"),
        (lambda c, s: c.device_step(*s, errr=None), r"unexpected keyword argument 'errr'"),
    ],
)
def test_device_step_signature_is_python_s(fake_ops, recorder, call, message):
    """A call that does not fit the typed signature is Python's TypeError, as for any function."""
    planner = _planner()
    planner.device_path("test")
    with pytest.raises(TypeError, match=message):
        call(planner.core, _step())


def test_dtype_and_device_are_read_on_every_call(fake_ops, recorder):
    """After many launches with int32 inputs on cuda:0, an input on cuda:1 or of another dtype is
    still seen as such (nothing is remembered per tensor)."""
    planner = _planner()
    bt, src, dst, acc = _step()
    for _ in range(3):
        planner.launch_align(bt, src, dst, acc)
    with pytest.raises(PlanError, match="dst_col is on cuda:1 but the planner's states are on cuda:0"):
        planner.launch_align(bt, src, fc([3, 3], index=1), acc)
    with pytest.raises(PlanError, match="num_accepted: expected int32 or int64, got torch.float32"):
        planner.launch_align(bt, src, dst, fc([1.0, 1.0], torch.float32))
    # a real (exact torch.Tensor) host tensor is described as one: it is on the cpu
    with pytest.raises(PlanError, match="src_col: expected a CUDA tensor on cuda:0, got a tensor on cpu"):
        planner.launch_align(bt, torch.zeros(2, dtype=torch.int32), dst, acc)
    n = len(recorder.calls)
    planner.launch_align(bt, src, dst, fc([1, 1], torch.int64))  # narrowed on the device, launched
    assert len(recorder.calls) == n + 1


def test_launch_options_are_keywords_and_extra_options_reach_the_core(fake_ops, recorder):
    planner = _planner()
    step = _step()
    err = fc(np.zeros(3))
    planner.launch_align(*step, err=err, stream=None, num_accepted_out=None)
    assert recorder.calls[-1]["err"] == err.data_ptr()
    with pytest.raises(TypeError, match="unexpected keyword argument 'errr'"):
        planner.launch_align(*step, errr=err)  # type: ignore[call-arg]
    # a launch method written over `_launch(what, opts, ..., **core_options)`
    planner._launch("launch_post_process", {"err": err}, *step, block_size=4)
    assert recorder.calls[-1]["decide"] and recorder.calls[-1]["err"] == err.data_ptr()
    with pytest.raises(TypeError, match=r"x\(\) got an unexpected keyword argument 'strem'"):
        planner._launch("x", {"strem": None}, *step)  # type: ignore[typeddict-unknown-key]
