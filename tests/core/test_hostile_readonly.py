"""Memory that must not be written. A numpy array over immutable memory (``np.frombuffer`` of
``bytes``) or made read-only after it was bound (``flags.writeable = False``) is refused by every
entry point that writes states -- at binding, and at every later write, with nothing written. A
torch tensor over immutable memory (``torch.frombuffer`` of ``bytes``, ``torch.from_numpy`` of a
read-only array) cannot be told apart through torch's API: the last tests pin that limit (the
documented one, docs/integration.md section 2), so that a torch that exposes a mark is noticed."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import recoverssm_rs as rs
from recoverssm_rs import layouts
from recoverssm_rs.transfer import HostCache, HostOffload, LocalTransfer, StatePool
from recoverssm_rs.vllm import VllmMambaStep

LAY = rs.Layout(
    "X",
    [
        rs.StateSpec("c", (3, 4), "float32", copy="conv", conv_layout="SD"),
        rs.StateSpec("t", (4,), "float32", copy="temporal"),
    ],
    num_spec=2,
)
TL = layouts.gdn(
    num_k_heads=2,
    num_v_heads=2,
    head_k_dim=8,
    head_v_dim=8,
    conv_kernel_size=4,
    tp_size=1,
    dtype="float16",
    ssm_dtype="float32",
)


def _frozen(shape: tuple[int, ...], dtype: str, seed: int = 0) -> np.ndarray:
    """An array over immutable ``bytes`` (read-only: numpy will not write it)."""
    data = np.random.default_rng(seed).standard_normal(int(np.prod(shape))).astype(dtype)
    return np.frombuffer(data.tobytes(), dtype=dtype).reshape(shape)


def _states(make: Callable[..., np.ndarray]) -> list[list[np.ndarray]]:
    return [[make((16, 3, 4), "float32"), make((16, 4), "float32")]]


def _pool_states(make: Callable[..., np.ndarray], seed: int = 0) -> list[list[np.ndarray]]:
    return [[make((6, *s.shape), s.dtype, seed + 2 * i + j) for j, s in enumerate(TL.persistent)] for i in range(2)]


def _writable(shape: tuple[int, ...], dtype: str, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(int(np.prod(shape))).astype(dtype).reshape(shape)


BINDINGS: dict[str, Callable[[], Any]] = {
    "Planner": lambda: rs.Planner(LAY, _states(_frozen), block_size=4),
    "Planner.from_groups": lambda: rs.Planner.from_groups([(LAY, _states(_frozen))]),
    "VllmMambaStep": lambda: VllmMambaStep(
        [(0, LAY, _states(_frozen))], block_size=4, num_spec_blocks=2, max_num_reqs=4
    ),
    "StatePool": lambda: StatePool(TL, _pool_states(_frozen)),
    "LocalTransfer destination": lambda: LocalTransfer(
        [StatePool(TL, _pool_states(_writable))], StatePool(TL, _pool_states(_frozen))
    ),
}


@pytest.mark.parametrize("name", list(BINDINGS))
def test_an_array_over_immutable_bytes_is_refused_at_binding(name):
    assert not _frozen((2,), "float32").flags.writeable
    with pytest.raises(rs.BindingError, match=r"layer 0, state 0 \('\w+'\): the tensor is read-only"):
        BINDINGS[name]()


def test_the_sglang_pool_refuses_an_array_over_immutable_bytes():
    pytest.importorskip("torch")
    from recoverssm_rs.sglang import SglangMambaPool

    with pytest.raises(rs.BindingError, match="read-only"):
        SglangMambaPool([_frozen((1, 8, 4, 3), "float32")], _frozen((1, 8, 2, 3, 3), "float32"))


class _Bound:
    """Writable arrays bound by one entry point, then made read-only; ``call`` writes them."""

    def __init__(self, arrays: list[np.ndarray], call: Callable[[], Any]) -> None:
        self.arrays, self.call = arrays, call


def _planner_copy() -> _Bound:
    states = _states(_writable)
    planner = rs.Planner(LAY, states, block_size=4)
    return _Bound([t for layer in states for t in layer], lambda: planner.plan_copy([1], [2]).execute())


def _planner_align() -> _Bound:
    states = _states(_writable)
    planner = rs.Planner(LAY, states, block_size=4)
    table = np.arange(1, 11, dtype=np.int64).reshape(2, 5)
    return _Bound(
        [t for layer in states for t in layer],
        lambda: planner.plan_align(table, np.array([0, 1]), np.array([1, 2]), np.array([1, 2])).execute(),
    )


def _local_transfer() -> _Bound:
    src, dst = _pool_states(_writable, 0), _pool_states(_writable, 10)
    move = LocalTransfer([StatePool(TL, src)], StatePool(TL, dst))
    return _Bound([t for layer in dst for t in layer], lambda: move.run([(1, 2), (3, 4)]))


def _host_restore() -> _Bound:
    src, dst = _pool_states(_writable, 0), _pool_states(_writable, 10)
    saved = HostOffload(StatePool(TL, src)).offload([1, 3])
    offload = HostOffload(StatePool(TL, dst))
    return _Bound([t for layer in dst for t in layer], lambda: offload.restore(saved, [2, 4]))


def _host_cache_restore() -> _Bound:
    dst = _pool_states(_writable, 10)
    cache = HostCache(StatePool(TL, dst), 10**6)
    cache.put("a", [1])
    return _Bound([t for layer in dst for t in layer], lambda: cache.restore("a", [2]))


AFTER_BINDING: dict[str, Callable[[], _Bound]] = {
    "Planner.plan_copy": _planner_copy,
    "Planner.plan_align": _planner_align,
    "LocalTransfer.run": _local_transfer,
    "HostOffload.restore": _host_restore,
    "HostCache.restore": _host_cache_restore,
}


@pytest.mark.parametrize("name", list(AFTER_BINDING))
def test_an_array_made_read_only_after_binding_is_refused_and_nothing_is_written(name):
    bound = AFTER_BINDING[name]()
    frozen = bound.arrays[-1]
    frozen.flags.writeable = False
    before = [a.copy() for a in bound.arrays]
    with pytest.raises(rs.BindingError, match=r"was made read-only after it was bound .*nothing was written"):
        bound.call()
    assert all(np.array_equal(a, b, equal_nan=True) for a, b in zip(before, bound.arrays)), name
    frozen.flags.writeable = True  # writable again: the same call runs and writes
    bound.call()
    assert any(not np.array_equal(a, b, equal_nan=True) for a, b in zip(before, bound.arrays)), name


def _torch_over_immutable_memory() -> list[Any]:
    torch = pytest.importorskip("torch")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch warns that the buffer is not writable
        return [
            torch.frombuffer(bytes(16 * 4 * 4), dtype=torch.float32).reshape(16, 4),
            torch.from_numpy(_frozen((16, 4), "float32")),
        ]


def test_torch_exposes_no_read_only_mark_of_a_tensor_over_immutable_memory():
    """The documented limit: neither the tensor, its storage, its numpy view nor its array
    interface says that its memory is immutable."""
    torch = pytest.importorskip("torch")
    control = torch.zeros(16, 4)
    for t in _torch_over_immutable_memory():
        assert t.numpy().flags.writeable and not t.numpy().__array_interface__["data"][1]
        assert not t.is_inference() and not t.requires_grad
        assert not hasattr(t, "is_readonly") and not hasattr(t.untyped_storage(), "is_readonly")
        assert t.dtype == control.dtype and t.device == control.device


def test_a_torch_tensor_over_immutable_memory_is_bound_like_any_other():
    """Not detectable (the test above): the package binds it; docs/integration.md tells the user
    to copy such data before binding it."""
    t = _torch_over_immutable_memory()[1]
    layout = rs.Layout("X", [rs.StateSpec("t", (4,), "float32", copy="temporal")], num_spec=1)
    planner = rs.Planner(layout, [[t]], block_size=4)
    assert planner.num_blocks == 16
