"""More hostile input to the SGLang pool adapter: index vectors that cannot be read to the host
(a ``meta`` tensor holds no values) and, on the (emulated) CUDA path, device index vectors of the
wrong kind, are refused with the package's error naming the operation and SGLang's argument,
never a foreign error from torch; nothing is written."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from recoverssm_rs.errors import PlanError  # noqa: E402
from recoverssm_rs.sglang import SglangMambaPool  # noqa: E402
from support.device_fakes import FakeCuda  # noqa: E402
from test_sglang_hostile import ENTRIES as _FIRST_PART_ENTRIES  # noqa: E402
from test_sglang_hostile import _tensors  # noqa: E402


def _snapshot(tensors):
    return [t.clone() for t in tensors]


def _unchanged(before, tensors):
    return all(torch.equal(a, b) for a, b in zip(before, tensors, strict=True))


# (operation, argument, call with the argument replaced by v): the first part's entries without the
# track pair
ENTRIES = [e for e in _FIRST_PART_ENTRIES if e[1] not in ("track_indices", "steps_to_track")]


@pytest.mark.parametrize(("op", "arg", "call"), ENTRIES, ids=[f"{e[0]}-{e[1]}" for e in ENTRIES])
def test_a_meta_tensor_of_ids_is_refused_naming_the_argument(op, arg, call):
    """A ``meta`` tensor has no values to read: torch's ``NotImplementedError`` from copying it to
    the host was what the call raised."""
    conv, temporal, ssm, window = _tensors()
    p = SglangMambaPool(conv, temporal, intermediate_ssm=ssm, intermediate_conv_window=window)
    tensors = [*conv, temporal, ssm, *window]
    before = _snapshot(tensors)
    with pytest.raises(PlanError, match=rf"^{op}: {arg}: .*meta"):
        call(p, torch.tensor([1]).to("meta"))
    assert _unchanged(before, tensors)


def _device_pool():
    conv, temporal, ssm, window = _tensors(1)
    tensors = [*conv, temporal, ssm, *window]
    p = SglangMambaPool(
        [FakeCuda(conv[0])],
        FakeCuda(temporal),
        intermediate_ssm=FakeCuda(ssm),
        intermediate_conv_window=[FakeCuda(window[0])],
    )
    return p, tensors


def _dev(values, dtype=torch.int64, index=0):
    return FakeCuda(torch.tensor(values, dtype=dtype), index)


# (label, call, the start of the message): device index vectors the slot kernel cannot read
DEVICE_BAD = [
    ("clear bool", lambda p: p.clear_slots(_dev([True], torch.bool)), "clear_slots: indices: expected int64"),
    ("clear float", lambda p: p.clear_slots(_dev([1.0], torch.float32)), "clear_slots: indices: expected int64"),
    ("clear 2-D", lambda p: p.clear_slots(_dev([[1, 2]])), "clear_slots: indices: expected a 1-D"),
    ("clear other device", lambda p: p.clear_slots(_dev([1], index=1)), "clear_slots: indices is on cuda:1"),
    (
        "commit slots int16",
        lambda p: p.commit_after_verify(_dev([1], torch.int16), _dev([0])),
        "commit_after_verify: state_indices: expected int64",
    ),
    (
        "commit steps bool",
        lambda p: p.commit_after_verify(_dev([1]), _dev([True], torch.bool)),
        "commit_after_verify: last_correct_step_indices: expected int64",
    ),
    (
        "commit steps length",
        lambda p: p.commit_after_verify(_dev([1, 2]), _dev([0])),
        "commit_after_verify: last_correct_step_indices has 1 elements, state_indices has 2",
    ),
    (
        "commit rows float",
        lambda p: p.commit_after_verify(_dev([1]), _dev([0]), src_indices=_dev([0.0], torch.float32)),
        "commit_after_verify: src_indices: expected int64",
    ),
    (
        "commit track slots other device",
        lambda p: p.commit_after_verify(_dev([1]), _dev([0]), _dev([2], index=1), _dev([0])),
        "commit_after_verify: track_indices is on cuda:1",
    ),
    (
        "commit track steps length",
        lambda p: p.commit_after_verify(_dev([1]), _dev([0]), _dev([2]), _dev([0, 1])),
        "commit_after_verify: steps_to_track has 2 elements, state_indices has 1",
    ),
    (
        "commit track without steps",
        lambda p: p.commit_after_verify(_dev([1]), _dev([0]), _dev([2])),
        "commit_after_verify: track_indices and steps_to_track go together",
    ),
]


@pytest.mark.parametrize(("label", "call", "message"), DEVICE_BAD, ids=[b[0] for b in DEVICE_BAD])
def test_the_slot_kernel_s_refusals_name_the_operation_and_sglang_s_argument(fake_ops, recorder, label, call, message):
    """On CUDA, ``clear_slots`` and ``commit_after_verify`` hand their device vectors to the slot
    kernel's launch, whose refusals named its own vectors (``slots``, ``steps``, ...) without the
    operation: now the operation and SGLang's argument name, as on the host path. Nothing is
    launched or written."""
    p, tensors = _device_pool()
    before = _snapshot(tensors)
    with pytest.raises(PlanError, match="^" + message.replace("[", r"\[")):
        call(p)
    assert not recorder.calls, "nothing launched"
    assert _unchanged(before, tensors)


@pytest.mark.parametrize("view", [torch.float16, torch.int32], ids=["other-itemsize", "same-itemsize"])
def test_get_cpu_copy_keeps_the_bound_dtype_of_a_tensor_retyped_in_place(view):
    """``t.data = t.view(dtype)`` keeps the memory the pool was bound with (the guard accepts it,
    and every write uses the bound description), but ``get_cpu_copy`` viewed its buffer with the
    Python tensor's current dtype: another item size raised torch's ``RuntimeError``, the same one
    returned host copies of the wrong dtype (which ``load_cpu_copy`` then refused). The host copies
    now have the dtype and shape the pool was bound with, and load back."""
    conv, temporal, _, _ = _tensors(2)
    p = SglangMambaPool(conv, temporal)
    want = [conv[0][:, [1, 3]].clone(), temporal[:, [1, 3]].clone()]
    temporal.data = temporal.view(view)
    (conv_cpu,), temporal_cpu = p.get_cpu_copy([1, 3])
    assert conv_cpu.dtype == temporal_cpu.dtype == torch.float32
    assert torch.equal(conv_cpu, want[0]) and torch.equal(temporal_cpu, want[1])
    p.clear_slots([1, 3])
    p.load_cpu_copy(([conv_cpu], temporal_cpu), [1, 3])
    assert torch.equal(temporal.view(torch.float32)[:, [1, 3]], want[1])


def test_a_planner_over_another_pool_s_layers_is_refused_as_the_pool_s_guard():
    """``Planner.from_groups(a's layer groups, also_guard=b)`` was accepted, and the core's
    ``copy_from`` of ``b`` (which takes only a planner guarding ``b``) then copied ``a``'s slots:
    ``also_guard`` now requires the groups to be the pool's own layer views."""
    from recoverssm_rs import Planner
    from recoverssm_rs.errors import BindingError

    a_conv, a_temporal, _, _ = _tensors(3)
    b_conv, b_temporal, _, _ = _tensors(4)
    a, b = SglangMambaPool(a_conv, a_temporal), SglangMambaPool(b_conv, b_temporal)
    with pytest.raises(BindingError, match=r"^also_guard: group 0, layer 0, state 0 is not .*conv\[0\]"):
        Planner.from_groups(a.tensors.layer_groups(), also_guard=b.tensors)
    groups = b.tensors.layer_groups()
    swapped = [(lay, [layers[1], layers[0]]) for lay, layers in groups]  # b's views, layers swapped
    with pytest.raises(BindingError, match=r"^also_guard: group 0, layer 0, state 0 is not"):
        Planner.from_groups(swapped, also_guard=b.tensors)
    Planner.from_groups(b.tensors.layer_groups(), also_guard=b.tensors)  # its own views: accepted


@pytest.mark.parametrize(
    ("label", "call", "message"),
    [
        (
            "track shorter",
            lambda p: p.commit_after_verify([1, 2], [0, 0], [3], [1]),
            "commit_after_verify: track_indices has 1 elements, state_indices 2",
        ),
        (
            "track longer",
            lambda p: p.commit_after_verify([1], [0], [3, 4], [1, 1]),
            "commit_after_verify: track_indices has 2 elements, state_indices 1",
        ),
        (
            "steps_to_track alone",
            lambda p: p.commit_after_verify([1], [0], None, [1]),
            "commit_after_verify: steps_to_track given without track_indices",
        ),
    ],
    ids=["track-shorter", "track-longer", "steps_to_track-alone"],
)
def test_the_host_commit_refuses_track_vectors_the_device_commit_refuses(label, call, message):
    """The track pass is per request (``track_indices[r]``, ``steps_to_track[r]``): on CUDA the
    slot kernel's launch refuses track vectors of another length than ``state_indices`` and
    ``steps_to_track`` without ``track_indices``; the host commit ran the first (tracking the
    requests it had) and ignored the second. Now the host refuses both, writing nothing."""
    conv, temporal, ssm, window = _tensors(5)
    p = SglangMambaPool(conv, temporal, intermediate_ssm=ssm, intermediate_conv_window=window)
    tensors = [*conv, temporal, ssm, *window]
    before = _snapshot(tensors)
    with pytest.raises(PlanError, match="^" + message):
        call(p)
    assert _unchanged(before, tensors), label
