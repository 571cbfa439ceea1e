"""The bound-memory guard (``_core.BoundTensors``, the planner's own guard is the same code): every
route torch has to re-point a bound view of a shared pool, or to move or shrink the pool's storage,
is refused by ``check()`` naming the tensor; addresses beyond a C ``long`` are still compared
exactly; a described tensor's element size is its torch dtype's, whatever an object claims."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from recoverssm_rs import BindingError, Layout, StateSpec, _core  # noqa: E402
from recoverssm_rs.planner import Planner  # noqa: E402


def _pool_and_views() -> tuple[Any, list[Any], Any]:
    pool = torch.zeros(4, 8, 16)
    views = [pool[i] for i in range(4)]
    guard = _core.BoundTensors([(v, f"layer {i}") for i, v in enumerate(views)])
    guard.check()
    return pool, views, guard


ROUTES = {
    "set_() to other memory": lambda pool, v: v.set_(torch.zeros(8, 16)),
    "set_() to an empty tensor": lambda pool, v: v.set_(),
    "set_() to another offset of the same storage": lambda pool, v: v.set_(
        pool.untyped_storage(), v.storage_offset() + 16, (8, 16), (16, 1)
    ),
    "as_strided_() to another offset": lambda pool, v: v.as_strided_((8, 16), (16, 1), v.storage_offset() + 1),
    ".data = other": lambda pool, v: setattr(v, "data", torch.zeros(8, 16)),
    "resize_() of the view past its storage": lambda pool, v: v.resize_(64, 64),
    "resize_() of the pool (its storage moves)": lambda pool, v: pool.resize_(8, 8, 16),
    "the storage freed": lambda pool, v: pool.untyped_storage().resize_(0),
    "the storage shrunk": lambda pool, v: pool.untyped_storage().resize_(pool.untyped_storage().nbytes() // 2),
}


@pytest.mark.parametrize("route", list(ROUTES))
def test_every_re_pointing_route_is_refused(route):
    pool, views, guard = _pool_and_views()
    ROUTES[route](pool, views[2])
    with pytest.raises(BindingError, match="nothing was written") as e:
        guard.check()
    assert "layer" in str(e.value)


def test_an_untouched_pool_passes_and_writes_bump_versions():
    pool, views, guard = _pool_and_views()
    views[1].add_(1)  # an ordinary in-place write re-points nothing
    guard.check()
    before = pool._version
    guard.mark_written()
    assert pool._version == before + 1


class _FarArray:
    """A device array at an address beyond a C ``long`` (``2**63`` and up)."""

    def __init__(self, address: int) -> None:
        self.address = address

    def data_ptr(self) -> int:
        return self.address


def test_addresses_beyond_a_c_long_are_compared_exactly():
    far = _FarArray(2**63 + 4096)
    guard = _core.BoundTensors([(far, "far")])
    guard.check()
    far.address += 256
    with pytest.raises(BindingError, match=r"far: .*0x8000000000001000 when bound, now 0x8000000000001100"):
        guard.check()


class _Lying:
    """A host tensor's stand-in that gives its real dtype but claims another element size."""

    def __init__(self, t: Any) -> None:
        self.t = t
        self.dtype = t.dtype
        self.shape = t.shape
        self.device = t.device
        self.layout = t.layout
        self.requires_grad = False

    def stride(self) -> tuple[int, ...]:
        return tuple(self.t.stride())

    def data_ptr(self) -> int:
        return int(self.t.data_ptr())

    def element_size(self) -> int:
        return 2


def test_a_described_tensors_element_size_is_its_dtypes():
    layout = Layout("X", [StateSpec("s", (8,), "float64", copy="temporal")])
    lying = _Lying(torch.zeros(6, 8, dtype=torch.float64))
    lying.t[1] = torch.arange(8)
    # Described first: a float64 element is 8 bytes whatever it claims, so its rows are 64 bytes
    # apart (with its 2 they would be 16, less than a state) and a copy moves whole rows.
    Planner(layout, [[lying]]).plan_copy(np.array([1]), np.array([4])).execute()
    assert torch.equal(lying.t[4], lying.t[1])
    real = torch.zeros(6, 8, dtype=torch.float64)
    real[2] = 7
    Planner(layout, [[real]]).plan_copy(np.array([2]), np.array([3])).execute()
    assert torch.equal(real[3], real[2])
