"""The guard's reads of a bound storage: its address through a one-byte tensor over it, its size
through ``len()``; a storage of no byte read through its own methods and left as it is."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from recoverssm_rs import BindingError  # noqa: E402
from recoverssm_rs._core import BoundTensors  # noqa: E402
from recoverssm_rs.sglang import SglangMambaPool  # noqa: E402


def test_an_empty_storage_is_bound_as_it_is_and_checks():
    """A tensor over a storage of no byte (SGLang's empty temporal state of a short-conv pool):
    binding it does not grow its storage (torch's ``set_`` of a one-byte view would), and every
    check passes; it failed every check before."""
    empty = torch.zeros(2, 9, 0)
    guard = BoundTensors([(empty, "empty")])
    guard.check()
    assert empty.untyped_storage().nbytes() == 0
    pool = SglangMambaPool([torch.zeros(2, 9, 6, 3)], torch.zeros(2, 9, 0))
    pool.conv[0][:, 1] = 1.0
    pool.copy_from(torch.tensor([1]), torch.tensor([2]))
    assert bool((pool.conv[0][:, 2] == 1.0).all()) and pool.temporal.untyped_storage().nbytes() == 0


@pytest.mark.parametrize("change", ["freed", "shrunk", "grown"])
def test_a_storage_changed_after_binding_is_refused(change):
    base = torch.zeros(64)
    view = base[8:16]
    guard = BoundTensors([(view, "v")])
    s = view.untyped_storage()
    if change == "freed":
        s.resize_(0)
    elif change == "shrunk":
        s.resize_(16)
    else:
        s.resize_(1024)
    with pytest.raises(BindingError, match="^v: its storage was resized or freed"):
        guard.check()


def test_a_guarded_write_bumps_each_base_once():
    base = torch.zeros(4, 8)
    a, b = base[0], base[1]
    guard = BoundTensors([(a, "a"), (b, "b")])
    before = base._version
    assert guard.guarded(lambda: 7) == 7
    assert base._version == before + 1  # views share their base's counter: one bump for both
