"""Binding state tensors to a layout (Planner construction): every BindingError rule with its
message (backend, layer, state, what is wrong), the accepted forms (torch tensors, numpy arrays,
interleaved page views, RecoverSSM layouts with their workspace tensors), and lifetime (the
planner keeps the tensors alive)."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from recoverssm_rs import BindingError, Layout, StateSpec, _core, layouts  # noqa: E402
from recoverssm_rs.planner import Planner  # noqa: E402
from support.fakes import FakeDeviceArray  # noqa: E402

NB = 10
CONV = (4, 3)  # SD: width 4, dim 3
TEMP = (2, 3)


def layout(workspace: bool = False) -> Layout:
    states = [
        StateSpec("conv", CONV, "float32", "persistent", "conv", "SD"),
        StateSpec("temporal", TEMP, "float32", "persistent", "temporal"),
    ]
    if workspace:
        states.append(StateSpec("records", (5,), "float32", "workspace"))
    return Layout("GDN_ATTN", states, num_spec=2)


def conv(nb=NB, **kw):
    return torch.zeros(nb, *CONV, **kw)


def temp(nb=NB, **kw):
    return torch.zeros(nb, *TEMP, **kw)


def good(num_layers=2):
    return [[conv(), temp()] for _ in range(num_layers)]


def bind_error(states, *parts, lay=None):
    """Binding raises BindingError whose message contains every string of ``parts``."""
    with pytest.raises(BindingError) as e:
        Planner(lay or layout(), states)
    msg = str(e.value)
    assert msg.startswith("GDN_ATTN: "), msg
    for p in parts:
        assert p in msg, msg
    return msg


def step(planner, bt, sc, dc, na):
    plan = planner.plan_align(
        np.array(bt, np.int32), np.array(sc, np.int32), np.array(dc, np.int32), np.array(na, np.int32)
    )
    plan.execute()
    return plan


def test_torch_tensors_bind():
    states = good()
    p = Planner(layout(), states)
    assert (p.num_layers, p.num_blocks, p.device) == (2, NB, "cpu")
    assert p.states[0][1][0] is states[1][0]


def test_wrong_dtype():
    states = good()
    states[1][0] = conv(dtype=torch.float64)
    bind_error(states, "layer 1, state 0 ('conv')", "dtype is float64 but the layout declares float32")
    states = good()
    states[0][1] = temp(dtype=torch.bfloat16)
    bind_error(states, "layer 0, state 1 ('temporal')", "dtype is bfloat16")


def test_unsupported_dtype_names_layer_and_state():
    states = good()
    states[1][1] = temp(dtype=torch.complex64)
    bind_error(states, "layer 1, state 1 ('temporal')", "complex64")


def test_wrong_per_block_shape():
    states = good()
    states[1][0] = torch.zeros(NB, 4, 4)
    bind_error(states, "layer 1, state 0 ('conv')", "per-block shape [4, 4] does not match the layout's [4, 3]")
    states = good()
    states[0][1] = torch.zeros(NB, 3, 2)  # same number of elements, other shape
    bind_error(states, "layer 0, state 1 ('temporal')", "per-block shape [3, 2]")


def test_wrong_ndim():
    states = good()
    states[0][1] = torch.zeros(NB, 6)
    bind_error(states, "layer 0, state 1 ('temporal')", "expected a 3-D tensor [num_blocks, 2, 3], got shape [10, 6]")
    states = good()
    states[1][0] = torch.zeros(NB, 1, 4, 3)
    bind_error(states, "layer 1, state 0 ('conv')", "expected a 3-D tensor")


def test_non_dense_inner_dimensions():
    states = good()
    states[1][1] = torch.zeros(NB, 3, 2).transpose(1, 2)  # shape [NB, 2, 3], not C-ordered
    assert tuple(states[1][1].shape[1:]) == TEMP
    bind_error(
        states,
        "layer 1, state 1 ('temporal')",
        "inner dimensions must be dense",
        "stride of dim 2 is 8 bytes, expected 4",
    )
    states = good()
    states[0][0] = torch.zeros(NB, 4, 6)[:, :, ::2]  # every other channel
    bind_error(states, "layer 0, state 0 ('conv')", "inner dimensions must be dense")


def test_block_stride_smaller_than_the_state():
    buf = torch.zeros(NB * 6 + 16)
    states = good()
    states[1][1] = buf.as_strided((NB, *TEMP), (4, 3, 1))  # blocks 16 bytes apart, 24 bytes each
    bind_error(
        states,
        "layer 1, state 1 ('temporal')",
        "the block stride (16 bytes) is smaller than one block's state (24 bytes)",
    )
    states = good()
    states[0][1] = torch.zeros(1, *TEMP).expand(NB, *TEMP)  # every block the same memory
    bind_error(states, "layer 0, state 1 ('temporal')", "the block stride is 0 bytes")
    states = good()
    states[0][1] = np.zeros((NB, *TEMP), np.float32)[::-1]
    bind_error(states, "layer 0, state 1 ('temporal')", "the block stride is -24 bytes")


def test_fewer_than_two_blocks():
    bind_error(
        [[conv(1), temp(1)]],
        "layer 0, state 0 ('conv')",
        "has 1 blocks",
        "needs the null block 0 and at least one more",
    )
    bind_error([[conv(0), temp(0)]], "layer 0, state 0 ('conv')", "has 0 blocks")


def test_different_numbers_of_blocks():
    states = good()
    states[1][1] = temp(12)
    bind_error(states, "layer 1, state 1 ('temporal')", "has 12 blocks but layer 0, state 0 has 10", "one block table")


def test_unsupported_device():
    states = good()
    states[1][1] = temp(device="meta")
    bind_error(states, "layer 1, state 1 ('temporal')", "unsupported device 'meta'", "'cpu' or 'cuda'")


def test_tensors_on_different_devices():
    """Descriptors only (the core never touches memory while binding): a CUDA tensor after CPU
    tensors, and two CUDA devices."""
    lay = layout()
    host = good()

    def on(device, t):
        if device == "cpu":
            return t
        return FakeDeviceArray(
            t.data_ptr(),
            tuple(t.shape),
            tuple(s * t.element_size() for s in t.stride()),
            dtype="float32",
            device_id=int(device[-1]),
        )

    for first, second in (("cpu", "cuda:0"), ("cuda:0", "cuda:1")):
        states = [[on(first, t) for t in host[0]], [on(second, t) for t in host[1]]]
        with pytest.raises(BindingError) as e:
            _core.Planner([(lay, states)])
        msg = str(e.value)
        assert (
            "layer 1, state 0 ('conv')" in msg and f"on '{second}' but earlier state tensors are on '{first}'" in msg
        ), msg
    if torch.cuda.is_available():  # pragma: no cover - only with a GPU
        states = good()
        states[1][0] = states[1][0].cuda()
        bind_error(states, "layer 1, state 0 ('conv')", "'cuda:0'", "'cpu'")


def test_read_only_numpy_array():
    states = [[np.zeros((NB, *CONV), np.float32), np.zeros((NB, *TEMP), np.float32)] for _ in range(2)]
    states[1][0].setflags(write=False)
    bind_error(states, "layer 1, state 0 ('conv')", "read-only")


def test_misaligned_data_pointer():
    raw = np.zeros(NB * 24 + 1, np.uint8)
    t = np.frombuffer(raw.data, np.float32, NB * 6, offset=1).reshape(NB, *TEMP)
    states = good()
    states[0][1] = t
    bind_error(states, "layer 0, state 1 ('temporal')", "is not aligned to the element size 4")


def test_wrong_number_of_tensors_per_layer():
    lay = layouts.kda(num_heads=2, head_dim=8, conv_kernel_size=4, recover_ssm=True, num_spec=3)
    assert len(lay.states) == 4 and lay.copyable_prefix_len == 2
    per = [torch.zeros(NB, *s.shape, dtype=getattr(torch, s.dtype)) for s in lay.persistent]
    ws = [torch.zeros(4, *s.shape, dtype=getattr(torch, s.dtype)) for s in lay.workspace]
    with pytest.raises(BindingError) as e:
        Planner(lay, [per + ws, per[:1]])
    msg = str(e.value)
    assert "layer 1: got 1 state tensors; expected the 2 persistent states (conv, recurrent) or all 4 states" in msg, (
        msg
    )
    with pytest.raises(BindingError, match="layer 0: got 3 state tensors"):
        Planner(lay, [per + ws[:1]])
    bind_error([], "no layers given")
    with pytest.raises(
        BindingError,
        match=r"layer 0, state 1 \('temporal'\): state tensors must be torch tensors or numpy "
        "arrays, got list",
    ):
        Planner(layout(), [[conv(), [0.0] * 6]])


def test_two_layers_aliasing_one_tensor():
    c, t = conv(), temp()
    msg = bind_error([[c, t], [c, t]], "share memory")
    assert "layer 0, state 0 ('conv') and layer 1, state 0 ('conv')" in msg, msg
    # a partial overlap: layer 1's conv starts one element into layer 0's
    buf = torch.zeros(NB * 12 + 1)
    c0 = buf[: NB * 12].view(NB, *CONV)
    c1 = buf[1:].view(NB, *CONV)
    bind_error([[c0, temp()], [c1, temp()]], "layer 0, state 0 ('conv') and layer 1, state 0 ('conv') share memory")
    # states of one layer overlapping each other
    buf = torch.zeros(NB, 12)
    bind_error(
        [[buf.view(NB, *CONV), buf[:, 6:].unflatten(1, TEMP)]],
        "layer 0, state 0 ('conv') and layer 0, state 1 ('temporal') share memory",
    )


def page_views(offsets, page_floats):
    """Views into one float32 buffer ``[NB, page_floats]``: per layer (conv, temporal) at the
    given element offsets inside each page."""
    buf = torch.arange(NB * page_floats, dtype=torch.float32).view(NB, page_floats)
    out = []
    for oc, ot in offsets:
        out.append([buf[:, oc : oc + 12].unflatten(1, CONV), buf[:, ot : ot + 6].unflatten(1, TEMP)])
    return buf, out


def test_interleaved_page_views_that_do_not_overlap_are_accepted():
    # per page: L0 conv, L0 temporal, L1 conv, L1 temporal, padding
    buf, states = page_views([(0, 12), (18, 30)], 40)
    before = buf.clone()
    p = Planner(layout(), states)
    step(p, [[3, 7]], [0], [1], [1])
    want = before.clone()
    want[7, :36] = before[3, :36]
    assert torch.equal(buf, want)  # every state of block 7 is block 3's; padding untouched
    # different block strides, still disjoint: temporal of layer 1 in its own buffer
    other = temp()
    Planner(layout(), [states[0], [states[1][0], other]])


def test_interleaved_page_views_that_overlap_are_rejected():
    # layer 1's conv starts 2 floats before layer 0's temporal ends
    _, states = page_views([(0, 12), (16, 28)], 40)
    bind_error(states, "layer 0, state 1 ('temporal') and layer 1, state 0 ('conv') share memory")
    # different block strides (the exact, sorting check): conv blocks at [40b, 40b + 12) floats,
    # temporal blocks at [o + 20b, o + 20b + 6)
    buf = torch.zeros(NB * 40)
    c0 = buf.as_strided((NB, *CONV), (40, 3, 1), 0)
    t_bad = buf.as_strided((NB, *TEMP), (20, 3, 1), 16)  # block 1 at [36, 42) meets conv block 1 [40, 52)
    bind_error([[c0, t_bad]], "layer 0, state 0 ('conv') and layer 0, state 1 ('temporal') share memory")
    t_ok = buf.as_strided((NB, *TEMP), (20, 3, 1), 12)  # [12, 18), [32, 38), [52, 58), ...: disjoint
    Planner(layout(), [[c0, t_ok]])


def test_recoverssm_layout_with_workspace_tensors():
    lay = layouts.kda(num_heads=2, head_dim=8, conv_kernel_size=4, recover_ssm=True, num_spec=3)
    torch_dtype = {s.name: getattr(torch, s.dtype) for s in lay.states}
    states = []
    for _ in range(2):
        per = [torch.randn(NB, *s.shape).to(torch_dtype[s.name]) for s in lay.persistent]
        ws = [torch.randn(6, *s.shape).to(torch_dtype[s.name]) for s in lay.workspace]
        states.append(per + ws)
    ws_before = [[t.clone() for t in layer[2:]] for layer in states]
    per_before = [[t.clone() for t in layer[:2]] for layer in states]
    p = Planner(lay, states)
    assert len(p.states[0][0]) == 2 and len(p.state_meta) == 2 * 2  # only persistent states are bound
    plan = step(p, [[1, 2, 3, 4, 5]], [0], [4], [3])
    assert len(plan) == 2 * 2
    for l in range(2):
        # conv: window shifted by 2 into block 5; recurrent: the 3rd accepted token's state (block 3)
        assert torch.equal(states[l][0][5][:-2], per_before[l][0][1][2:])
        assert torch.equal(states[l][1][5], per_before[l][1][3])
        for t, b in zip(states[l][2:], ws_before[l]):
            assert torch.equal(t, b)  # workspace never copied
    # Persistent-only binding is the same binding.
    q = Planner(lay, [layer[:2] for layer in states])
    assert np.array_equal(q.state_meta, p.state_meta)


def test_numpy_arrays_bind_and_execute():
    rng = np.random.default_rng(1)
    states = [
        [rng.standard_normal((NB, *CONV)).astype(np.float32), rng.standard_normal((NB, *TEMP)).astype(np.float32)]
        for _ in range(2)
    ]
    before = [[a.copy() for a in layer] for layer in states]
    p = Planner(layout(), states)
    step(p, [[2, 4, 6]], [0], [2], [2])  # conv 2 -> 6 shifted by 1, temporal 4 -> 6
    for l in range(2):
        assert np.array_equal(states[l][0][6][:3], before[l][0][2][1:])
        assert np.array_equal(states[l][0][6][3], before[l][0][6][3])
        assert np.array_equal(states[l][1][6], before[l][1][4])
        for j in range(2):
            others = [b for b in range(NB) if b != 6]
            assert np.array_equal(states[l][j][others], before[l][j][others])
    # a numpy pool of page views (np.lib.stride_tricks / plain slicing)
    buf = np.zeros((NB, 20), np.float32)
    views = [[buf[:, 0:12].reshape(NB, *CONV), buf[:, 12:18].reshape(NB, *TEMP)]]
    assert not views[0][0].flags.c_contiguous
    Planner(layout(), views)


def test_planner_keeps_the_tensors_alive():
    def make():
        states = [
            [
                torch.arange(NB * 12, dtype=torch.float32).view(NB, *CONV) + 1000 * l,
                torch.arange(NB * 6, dtype=torch.float32).view(NB, *TEMP) - 1000 * l,
            ]
            for l in range(2)
        ]
        return states, [weakref.ref(t) for layer in states for t in layer]

    states, refs = make()
    want = [[t.clone() for t in layer] for layer in states]
    p = Planner(layout(), states)
    del states
    gc.collect()
    assert all(r() is not None for r in refs)
    plan = p.plan_align(
        np.array([[1, 8]], np.int32), np.array([0], np.int32), np.array([1], np.int32), np.array([1], np.int32)
    )
    del p  # the plan holds its planner
    gc.collect()
    plan.execute()
    got = plan.planner.states[0]
    for l in range(2):
        for j in range(2):
            want[l][j][8] = want[l][j][1]
            assert torch.equal(got[l][j], want[l][j])
    del plan, got
    gc.collect()
    assert all(r() is None for r in refs)  # and nothing leaks


def test_core_planner_holds_its_keepalive():
    lay = layout()
    arrays = [[np.zeros((NB, *CONV), np.float32), np.arange(NB * 6, dtype=np.float32).reshape(NB, *TEMP)]]
    ref = weakref.ref(arrays[0][1])
    core = _core.Planner([(lay, arrays)])
    del arrays
    gc.collect()
    assert ref() is not None
    plan = core.plan_copy(src_blocks=np.array([2], np.int64), dst_blocks=np.array([9], np.int64))
    plan.execute_host()
    assert np.array_equal(ref()[9], ref()[2])
    del core, plan
    gc.collect()
    assert ref() is None
