"""More hostile input to the SGLang pool adapter: index vectors that cannot be read to the host
(a ``meta`` tensor holds no values) and, on the (emulated) CUDA path, device index vectors of the
wrong kind, are refused with the package's error naming the operation and SGLang's argument,
never a foreign error from torch; nothing is written."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from recoverssm_rs.errors import PlanError  # noqa: E402
from recoverssm_rs.sglang import SglangMambaPool  # noqa: E402

LAYERS, SLOTS, ROWS, DRAFT = 2, 8, 4, 3


def _tensors(seed=0):
    g = torch.Generator().manual_seed(seed)
    conv = [torch.randn(LAYERS, SLOTS, 6, 3, generator=g)]
    temporal = torch.randn(LAYERS, SLOTS, 2, 4, 4, generator=g)
    ssm = torch.randn(LAYERS, ROWS, DRAFT, 2, 4, 4, generator=g)
    window = [torch.randn(LAYERS, ROWS, DRAFT, 6, 3, generator=g)]
    return conv, temporal, ssm, window


def _snapshot(tensors):
    return [t.clone() for t in tensors]


def _unchanged(before, tensors):
    return all(torch.equal(a, b) for a, b in zip(before, tensors, strict=True))


# (operation, argument, call with the argument replaced by v)
ENTRIES = [
    ("copy_from", "src_indices", lambda p, v: p.copy_from(v, [2])),
    ("copy_from", "dst_indices", lambda p, v: p.copy_from([1], v)),
    ("clear_slots", "indices", lambda p, v: p.clear_slots(v)),
    ("get_cpu_copy", "indices", lambda p, v: p.get_cpu_copy(v)),
    ("load_cpu_copy", "indices", lambda p, v: p.load_cpu_copy(p.get_cpu_copy([1]), v)),
    ("commit_after_verify", "state_indices", lambda p, v: p.commit_after_verify(v, [0])),
    ("commit_after_verify", "last_correct_step_indices", lambda p, v: p.commit_after_verify([1], v)),
    ("commit_after_verify", "src_indices", lambda p, v: p.commit_after_verify([1], [0], src_indices=v)),
]


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
