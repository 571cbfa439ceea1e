"""The SGLang pool adapter under hostile or careless input: index vectors of the wrong kind
(float, bool) or value (negative, the dummy slot, repeated) are refused by the core with the
package's error naming the operation, the argument and the value, never cast or wrapped; a pool
tensor re-pointed, grown or its storage freed is refused by its name at every entry point, HiCache
copies and forks included, on the host and on the (emulated) CUDA path, where the planner's
per-layer views still hold the memory the tensor was bound with;
``load_cpu_copy`` checks everything before it writes; the constructor refuses pools whose tensors
disagree on the layer count or share memory. Every refused call leaves every byte of the pool (its
states and its verify scratch) as it was."""

from __future__ import annotations

import shutil
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from recoverssm_rs.errors import BindingError, PlanError, RecoverSSMError  # noqa: E402
from recoverssm_rs.sglang import SglangMambaPool  # noqa: E402
from support import isolated  # noqa: E402
from support.device_fakes import FakeCuda  # noqa: E402

LAYERS, SLOTS, ROWS, DRAFT = 2, 8, 4, 3

needs_cxx = pytest.mark.skipif(shutil.which("g++") is None, reason="host emulation needs a C++ compiler")


def _pool(seed=0):
    conv, temporal, ssm, window = _tensors(seed)
    return SglangMambaPool(conv, temporal, intermediate_ssm=ssm, intermediate_conv_window=window)


def _tensors(seed=0):
    g = torch.Generator().manual_seed(seed)
    conv = [torch.randn(LAYERS, SLOTS, 6, 3, generator=g)]
    temporal = torch.randn(LAYERS, SLOTS, 2, 4, 4, generator=g)
    ssm = torch.randn(LAYERS, ROWS, DRAFT, 2, 4, 4, generator=g)
    window = [torch.randn(LAYERS, ROWS, DRAFT, 6, 3, generator=g)]
    return conv, temporal, ssm, window


def _bound_layers(p, state):
    """The per-layer views of state ``state`` (0: conv, 1: temporal) that the planner bound: the
    memory the pool's tensors had when the adapter was built."""
    return [layer[state] for layer in p.planner.core.states[0]]


def _all(p):
    """Every tensor of the pool: states and verify scratch."""
    return [*p.conv, p.temporal, p.intermediate_ssm, *p.intermediate_conv_window]


def _refused(p, call, error=PlanError, match=None):
    """``call(p)`` is refused with ``error`` (matching ``match``) and writes nothing."""
    before = [t.clone() for t in _all(p)]
    with pytest.raises(error, match=match):
        call(p)
    changed = [i for i, (a, b) in enumerate(zip(before, _all(p), strict=True)) if not torch.equal(a, b)]
    assert not changed, f"a refused call wrote tensors {changed}"


# (operation, argument, call with the argument replaced by v)
ENTRIES = [
    ("copy_from", "src_indices", lambda p, v: p.copy_from(v, [2])),
    ("copy_from", "dst_indices", lambda p, v: p.copy_from([1], v)),
    ("clear_slots", "indices", lambda p, v: p.clear_slots(v)),
    ("get_cpu_copy", "indices", lambda p, v: p.get_cpu_copy(v)),
    ("load_cpu_copy", "indices", lambda p, v: p.load_cpu_copy(p.get_cpu_copy([1]), v)),
    ("commit_after_verify", "state_indices", lambda p, v: p.commit_after_verify(v, [0])),
    ("commit_after_verify", "last_correct_step_indices", lambda p, v: p.commit_after_verify([1], v)),
    ("commit_after_verify", "track_indices", lambda p, v: p.commit_after_verify([1], [0], v, [0])),
    ("commit_after_verify", "steps_to_track", lambda p, v: p.commit_after_verify([1], [0], [2], v)),
    ("commit_after_verify", "src_indices", lambda p, v: p.commit_after_verify([1], [0], src_indices=v)),
]
WRONG_KINDS = {
    "float tensor": torch.tensor([1.0]),
    "bool tensor": torch.tensor([True]),
    "float array": np.array([1.0]),
    "bool array": np.array([True]),
    "float list": [1.0],
    "bool list": [True],
    "uint8 tensor": torch.tensor([1], dtype=torch.uint8),
}


@pytest.mark.parametrize(("op", "arg", "call"), ENTRIES, ids=[f"{e[0]}-{e[1]}" for e in ENTRIES])
@pytest.mark.parametrize("kind", list(WRONG_KINDS))
def test_float_and_bool_indices_are_refused_not_cast(op, arg, call, kind):
    _refused(_pool(), lambda p: call(p, WRONG_KINDS[kind]), match=rf"^{op}: {arg}")


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda p: p.clear_slots([-1]), r"clear_slots: indices\[0\] = -1: a negative slot id is refused"),
        (lambda p: p.clear_slots(torch.tensor([3, -2])), r"clear_slots: indices\[1\] = -2"),
        (lambda p: p.copy_from([-1], [2]), r"copy_from: src_indices\[0\] = -1"),
        (lambda p: p.copy_from([1], [-1]), r"copy_from: dst_indices\[0\] = -1"),
        (lambda p: p.get_cpu_copy([-1]), r"get_cpu_copy: indices\[0\] = -1"),
        (lambda p: p.load_cpu_copy(p.get_cpu_copy([1]), [-1]), r"load_cpu_copy: indices\[0\] = -1"),
        (lambda p: p.commit_after_verify([-2], [0]), r"state_indices\[0\] = -2: the only negative value allowed is -1"),
        (lambda p: p.commit_after_verify([1], [-2]), r"last_correct_step_indices\[0\] = -2"),
        (lambda p: p.commit_after_verify([1], [0], [-5], [0]), r"track_indices\[0\] = -5"),
    ],
)
def test_negative_indices_are_refused_not_wrapped(call, match):
    _refused(_pool(), call, match=match)


def test_the_no_slot_marker_writes_nothing():
    p = _pool()
    before = [t.clone() for t in _all(p)]
    p.commit_after_verify([-1, 3], [0, -1], [-1, 4], [1, -1])
    assert all(torch.equal(a, b) for a, b in zip(before, _all(p), strict=True))


def _raw(t):
    """The torch tensor itself (a ``FakeCuda`` wraps one)."""
    return t.t if isinstance(t, FakeCuda) else t


# Every way a pool tensor can be replaced under the adapter (on the torch tensor, as SGLang's
# code or a careless caller would): re-pointed, its storage grown elsewhere or freed.
REBINDS = {
    "set_": lambda t: t.set_(torch.zeros_like(t)),
    "data": lambda t: setattr(t, "data", torch.zeros_like(t)),
    "resize_": lambda t: t.resize_(2 * t.shape[0], *t.shape[1:]),
    "storage resize_(0)": lambda t: t.untyped_storage().resize_(0),
}
LABELS = {"conv": r"conv\[0\]", "temporal": "temporal", "intermediate_ssm": "intermediate_ssm"}
# Every entry point, each with the arguments it would otherwise run with.
REBIND_CALLS = {
    "copy_from": lambda p, host, ids: p.copy_from(ids([1, 3]), ids([2, 4])),
    "fork": lambda p, host, ids: p.fork(ids([1]), ids([5])),
    "clear_slots": lambda p, host, ids: p.clear_slots(ids([1, 2])),
    "get_cpu_copy": lambda p, host, ids: p.get_cpu_copy([1]),
    "load_cpu_copy": lambda p, host, ids: p.load_cpu_copy(host, [2]),
    "commit_after_verify": lambda p, host, ids: p.commit_after_verify(ids([1, 2]), ids([0, 1])),
}


def _snapshot(p):
    """A copy of every tensor of the pool as it is now (``None`` for one whose memory was freed)."""
    return [None if _raw(t).untyped_storage().nbytes() == 0 else _raw(t).clone() for t in _all(p)]


def _same_bytes(a, b):
    """Byte equality (a tensor grown by ``resize_`` holds uninitialised values, NaN among them)."""
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def _unchanged(snapshot, p):
    return all(a is None or _same_bytes(a, _raw(b)) for a, b in zip(snapshot, _all(p), strict=True))


def _rebind(p, which, rebind):
    tensor = {"conv": p.conv[0], "temporal": p.temporal, "intermediate_ssm": p.intermediate_ssm}[which]
    REBINDS[rebind](_raw(tensor))


def _bound_memory_unchanged(p, before, which, rebind):
    """The memory the conv and temporal tensors were bound with, which the planner's per-layer
    views keep alive, still holds ``before`` (one freed by a storage resized to 0 is skipped)."""
    for i, (name, b) in enumerate(zip(("conv", "temporal"), before, strict=True)):
        if rebind == "storage resize_(0)" and which == name:
            continue
        layers = [_raw(v) for v in _bound_layers(p, i)]
        assert _same_bytes(torch.stack(layers), b), f"the memory bound as {name} was written"


@pytest.mark.parametrize("rebind", list(REBINDS))
@pytest.mark.parametrize("which", list(LABELS))
@pytest.mark.parametrize("op", list(REBIND_CALLS))
def test_a_replaced_pool_tensor_is_refused_at_every_entry_point(rebind, which, op):
    p = _pool()
    host = p.get_cpu_copy([1])
    before = [p.conv[0].clone(), p.temporal.clone()]
    _rebind(p, which, rebind)
    replaced = _snapshot(p)
    with pytest.raises(BindingError, match=rf"^{LABELS[which]}: .*nothing was written"):
        REBIND_CALLS[op](p, host, lambda x: x)
    # Nothing written: neither the tensors as they are now nor the memory they were bound with.
    assert _unchanged(replaced, p)
    _bound_memory_unchanged(p, before, which, rebind)


@needs_cxx
@pytest.mark.parametrize("rebind", list(REBINDS))
@pytest.mark.parametrize("which", list(LABELS))
@pytest.mark.parametrize("op", list(REBIND_CALLS))
def test_a_replaced_pool_tensor_is_refused_on_the_cuda_path(fake_ops, emulator, strided_fakes, rebind, which, op):
    """The same on the CUDA path (``FakeCuda`` tensors, the kernels emulated): refused by the
    tensor's name before any launch. ``copy_from`` and ``fork`` launch through the planner, whose
    per-layer views keep the memory a re-pointed tensor was bound with: that memory is untouched."""
    conv, temporal, ssm, window = _tensors()
    p = SglangMambaPool(
        [FakeCuda(conv[0])],
        FakeCuda(temporal),
        intermediate_ssm=FakeCuda(ssm),
        intermediate_conv_window=[FakeCuda(window[0])],
    )
    host = p.get_cpu_copy([1])
    before = [conv[0].clone(), temporal.clone()]
    _rebind(p, which, rebind)
    replaced = _snapshot(p)
    launches = len(emulator.calls)
    ids = lambda x: FakeCuda(torch.tensor(x))  # noqa: E731
    with pytest.raises(BindingError, match=rf"^{LABELS[which]}: .*nothing was written"):
        REBIND_CALLS[op](p, host, ids)
    assert len(emulator.calls) == launches, "nothing launched"
    assert _unchanged(replaced, p)
    _bound_memory_unchanged(p, before, which, rebind)


def test_the_planner_over_the_pool_checks_the_pool_first():
    """The adapter's planner binds each layer's views (which keep the old memory): the pool's guard,
    given as ``also_guard``, is what sees the stacked tensor re-pointed, in the planner's own checks
    and guarded writes too; ``also_guard`` takes only the core's pool."""
    from recoverssm_rs import Planner

    p = _pool()
    p.planner.core.check()
    p.temporal.set_(torch.zeros_like(p.temporal))
    with pytest.raises(BindingError, match="^temporal: the tensor no longer points"):
        p.planner.core.check()
    with pytest.raises(BindingError, match="^temporal: "):
        p.planner.core.guarded(lambda: pytest.fail("written"))
    groups = [(lay, [[t[i] for t in (p.conv[0], p.temporal)] for i in range(LAYERS)]) for lay in p.layouts]
    with pytest.raises(BindingError, match="also_guard must be a SglangPool, got object"):
        Planner.from_groups(groups, also_guard=object())


def test_the_core_copies_only_with_the_pool_s_own_planner(fake_ops, emulator, strided_fakes):
    """The core's copy of a pool takes the planner built over that pool's layers: another pool's
    planner (whose states the slot ids would index) is refused on both paths, nothing written or
    launched."""
    a, b = _pool(0), _pool(1)
    snapshots = _snapshot(a), _snapshot(b)
    for p in (a, b):
        with pytest.raises(PlanError, match="copy_from: the planner is not this pool's"):
            p.tensors.copy_from((b if p is a else a).planner.core, [1], [2])
    assert _unchanged(snapshots[0], a) and _unchanged(snapshots[1], b)
    conv, temporal, _, _ = _tensors(2)
    c = SglangMambaPool([FakeCuda(conv[0])], FakeCuda(temporal))
    ids = FakeCuda(torch.tensor([1], dtype=torch.int32))
    before = [conv[0].clone(), temporal.clone()]
    with pytest.raises(PlanError, match="copy_from: the planner is not this pool's"):
        c.tensors.copy_launch(a.planner.core, lambda what: pytest.fail("prepared"), c.upload, ids, ids)
    c.tensors.copy_launch(
        c.planner.core,
        c.planner.launch_runner,
        c.upload,
        ids,
        FakeCuda(torch.tensor([2], dtype=torch.int32)),
    )
    assert torch.equal(conv[0][:, 2], before[0][:, 1]) and torch.equal(temporal[:, 2], before[1][:, 1])
    assert len(emulator.calls) == 1
    # a host pool's planner has no device path to launch on: refused by the caller's name
    with pytest.raises(PlanError, match="copy_from"):
        a.planner.launch_runner("copy_from")


def test_get_cpu_copy_after_the_temporal_storage_was_freed_is_an_error_not_a_crash():
    """Run apart (forked from the zygote of ``support.isolated``): before the guard covered HiCache
    copies, this read freed memory (a segfault)."""
    code = textwrap.dedent(
        """
        import torch
        from recoverssm_rs.errors import BindingError
        from recoverssm_rs.sglang import SglangMambaPool
        p = SglangMambaPool([torch.randn(2, 8, 6, 3)], torch.randn(2, 8, 2, 4, 4))
        p.temporal.untyped_storage().resize_(0)
        try:
            p.get_cpu_copy([1, 2])
        except BindingError as e:
            print("refused:", e)
        """
    )
    run = isolated.shared().run(code, timeout=120)
    assert run.returncode == 0 and not run.timed_out, run.describe(2000)
    assert "refused: temporal" in run.stdout and "resized or freed" in run.stdout, run.stdout


def test_load_cpu_copy_checks_everything_before_it_writes():
    p = _pool()
    conv_cpu, temporal_cpu = p.get_cpu_copy([1, 2])
    # The conv copy is good, the temporal one is not on the host: nothing is written, conv included.
    _refused(
        p,
        lambda p: p.load_cpu_copy((conv_cpu, temporal_cpu.to("meta")), [3, 4]),
        match="temporal: the host copy is on meta",
    )
    _refused(p, lambda p: p.load_cpu_copy((conv_cpu, temporal_cpu), [3, 3]), match=r"indices\[1\] = 3 is named twice")
    _refused(p, lambda p: p.load_cpu_copy((conv_cpu,), [3, 4]), match="mamba_cache_cpu has 1 parts")
    _refused(p, lambda p: p.load_cpu_copy(([], temporal_cpu), [3, 4]), match="conv_cpu has 0 tensors, the pool 1")
    _refused(p, lambda p: p.load_cpu_copy(None, [3, 4]), match="mamba_cache_cpu must be a list")
    _refused(p, lambda p: p.load_cpu_copy(([None], temporal_cpu), [3, 4]), match=r"conv\[0\] \(host copy\)")


def test_a_load_from_a_view_of_the_pool_gives_the_right_bytes():
    p = _pool()
    want = [t[:, [1, 2]].clone() for t in (*p.conv, p.temporal)]
    # Host copies that are views of the pool's own slots 1..2, loaded into the overlapping slots 2..3.
    p.load_cpu_copy(([p.conv[0][:, 1:3]], p.temporal[:, 1:3]), [2, 3])
    for t, w in zip((*p.conv, p.temporal), want, strict=True):
        assert torch.equal(t[:, [2, 3]], w)


@needs_cxx
@pytest.mark.parametrize("cuda", [False, True], ids=["host", "cuda"])
def test_strided_host_copies_load_their_elements_in_order(cuda, fake_ops, emulator, strided_fakes):
    """Host copies that are not dense (every other element of a wider buffer, permuted axes) load
    element for element, on host states (the core writes the slots) and on CUDA (the core stages
    them for the slot kernel); a get gives them back."""
    conv, temporal, _, _ = _tensors(3)
    wrap = FakeCuda if cuda else (lambda t: t)
    p = SglangMambaPool([wrap(conv[0])], wrap(temporal))
    g = torch.Generator().manual_seed(4)
    cc = torch.randn(LAYERS, 3, 6, 6, generator=g)[..., ::2]
    tc = torch.randn(4, LAYERS, 2, 3, 4, generator=g).permute(1, 3, 2, 4, 0)
    assert not cc.is_contiguous() and not tc.is_contiguous()
    ids = [1, 4, 5]
    p.load_cpu_copy(([cc], tc), ids)
    assert torch.equal(conv[0][:, ids], cc) and torch.equal(temporal[:, ids], tc)
    (got_conv,), got_temporal = p.get_cpu_copy(ids)
    assert torch.equal(got_conv, cc) and torch.equal(got_temporal, tc)


def test_a_host_copy_of_no_slots_is_empty_and_loads_back_as_nothing():
    """No slots: the core's buffer has no bytes (an empty tensor, whose address may be null), and
    the host copies are empty, shaped as SGLang's ``index_select`` of no index."""
    p = _pool()
    before = [t.clone() for t in (*p.conv, p.temporal)]
    conv_cpu, temporal_cpu = p.get_cpu_copy(torch.tensor([], dtype=torch.int64))
    assert [c.shape for c in conv_cpu] == [(LAYERS, 0, 6, 3)] and temporal_cpu.shape == (LAYERS, 0, 2, 4, 4)
    p.load_cpu_copy((conv_cpu, temporal_cpu), torch.tensor([], dtype=torch.int64))
    assert all(torch.equal(t, b) for t, b in zip((*p.conv, p.temporal), before, strict=True))


def test_the_constructor_refuses_mismatched_layers_and_aliased_tensors():
    conv, temporal = torch.zeros(2, 8, 6, 3), torch.zeros(3, 8, 2, 4, 4)
    with pytest.raises(BindingError, match="temporal has 3 layers, conv.0. has 2"):
        SglangMambaPool([conv], temporal)
    with pytest.raises(BindingError, match=r"conv\[1\] and conv\[0\] share memory"):
        SglangMambaPool([conv, conv], torch.zeros(2, 8, 2, 4, 4))
    with pytest.raises(BindingError, match=r"conv\[1\] and conv\[0\] share memory"):
        SglangMambaPool([conv, conv.view(2, 8, 3, 6)], torch.zeros(2, 8, 2, 4, 4))
    ssm = torch.zeros(2, 4, 3, 2, 4, 4)
    with pytest.raises(BindingError, match="intermediate_ssm has 3 layers"):
        SglangMambaPool([conv], torch.zeros(2, 8, 2, 4, 4), intermediate_ssm=torch.zeros(3, 4, 3, 2, 4, 4))
    SglangMambaPool(
        [conv], torch.zeros(2, 8, 2, 4, 4), intermediate_ssm=ssm, intermediate_conv_window=[torch.zeros(2, 4, 3, 6, 3)]
    )


HOSTILE = {
    "None": None,
    "str": "abc",
    "dict": {"a": 1},
    "object": object(),
    "float": 1.5,
    "nested": [[1, [2]], [3]],
    "0-d array": np.array(3),
    "huge int": 2**70,
    "huge list": [2**70],
    "2-D": [[1, 2]],
}


@pytest.mark.parametrize(("op", "arg", "call"), ENTRIES, ids=[f"{e[0]}-{e[1]}" for e in ENTRIES])
def test_no_foreign_error_from_any_index_argument(op, arg, call):
    foreign = []
    for label, value in HOSTILE.items():
        p = _pool()
        before = [t.clone() for t in _all(p)]
        try:
            call(p, value)
        except RecoverSSMError as e:
            assert str(e).startswith(f"{op}: "), f"{arg}={label}: {e}"
            assert all(torch.equal(a, b) for a, b in zip(before, _all(p), strict=True)), f"{arg}={label} wrote"
        except Exception as e:  # noqa: BLE001 - the point of the test
            foreign.append(f"{arg}={label}: {type(e).__name__}: {e}")
    assert not foreign, "\n".join(foreign)
