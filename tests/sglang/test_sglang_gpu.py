"""The SGLang adapter's device path on a real GPU (skipped without CUDA by tests/conftest.py):
every operation on CUDA pools, with the indices on the device, leaves every byte as the host path
does on copies of the same tensors (dense and deduplicated windows, bf16 and fp32); a pool tensor
replaced under the adapter is refused at every entry point, nothing queued."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from recoverssm_rs.sglang import SglangMambaPool  # noqa: E402

pytestmark = pytest.mark.gpu

LAYERS, SLOTS, ROWS, DRAFT, K1 = 4, 16, 6, 4, 3


def _host_tensors(dtype, dedup, seed):
    g = torch.Generator().manual_seed(seed)
    conv = [(torch.randn(LAYERS, SLOTS, dim, K1, generator=g) * 3).to(dtype) for dim in (24, 8)]
    temporal = torch.randn(LAYERS, SLOTS, 4, 32, 32, generator=g)
    ssm = torch.randn(LAYERS, ROWS, DRAFT, 4, 32, 32, generator=g)
    shape = (DRAFT + K1 - 1,) if dedup else (DRAFT,)
    phys = []
    for dim in (24, 8):
        inner = (dim,) if dedup else (dim, K1)
        phys.append((torch.randn(LAYERS, ROWS, *shape, *inner, generator=g) * 3).to(dtype))
    return conv, temporal, ssm, phys


def _pool(tensors, device, dedup):
    conv, temporal, ssm, phys = [[t.to(device) for t in x] if isinstance(x, list) else x.to(device) for x in tensors]
    windows = []
    for p in phys:
        if dedup:
            s = p.stride()
            windows.append(p.as_strided((LAYERS, ROWS, DRAFT, p.shape[-1], K1), (s[0], s[1], s[2], 1, s[2])))
        else:
            windows.append(p)
    return SglangMambaPool(conv, temporal, intermediate_ssm=ssm, intermediate_conv_window=windows)


def _same(host, dev, what):
    for i, (a, b) in enumerate(zip((*host.conv, host.temporal), (*dev.conv, dev.temporal), strict=True)):
        assert torch.equal(a.view(torch.uint8), b.cpu().view(torch.uint8)), f"{what}: tensor {i}"


@pytest.mark.parametrize("dedup", [False, True], ids=["dense", "dedup"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_every_operation_equals_the_host_path(dtype, dedup):
    tensors = _host_tensors(dtype, dedup, 1)
    host, dev = _pool(tensors, "cpu", dedup), _pool(tensors, "cuda", dedup)

    def both(name, *args):
        getattr(host, name)(*[None if a is None else torch.tensor(a) for a in args])
        getattr(dev, name)(*[None if a is None else torch.tensor(a, device="cuda") for a in args])
        torch.cuda.synchronize()
        _same(host, dev, name)

    both("copy_from", [1, 2, 3], [7, 8, 9])
    both("clear_slots", [4, 10])
    both("commit_after_verify", [1, 5, 11], [3, -1, 0], [12, 13, 14], [1, 2, -1], [2, 0, 5])
    assert dev.last_error().ok
    want = host.get_cpu_copy(torch.tensor([5, 12]))
    got = dev.get_cpu_copy(torch.tensor([5, 12], device="cuda"))
    for a, b in zip([*want[0], want[1]], [*got[0], got[1]], strict=True):
        assert b.device.type == "cpu" and torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    host.load_cpu_copy(want, torch.tensor([2, 15]))
    dev.load_cpu_copy(got, torch.tensor([2, 15], device="cuda"))
    torch.cuda.synchronize()
    _same(host, dev, "load_cpu_copy")


REBINDS = {
    "set_": lambda t: t.set_(torch.zeros_like(t)),
    "data": lambda t: setattr(t, "data", torch.zeros_like(t)),
    "resize_": lambda t: t.resize_(2 * t.shape[0], *t.shape[1:]),
    "storage resize_(0)": lambda t: t.untyped_storage().resize_(0),
}
CALLS = {
    "copy_from": lambda p, host, ids: p.copy_from(ids([1, 3]), ids([2, 4])),
    "fork": lambda p, host, ids: p.fork(ids([1]), ids([5])),
    "clear_slots": lambda p, host, ids: p.clear_slots(ids([1, 2])),
    "get_cpu_copy": lambda p, host, ids: p.get_cpu_copy(ids([1])),
    "load_cpu_copy": lambda p, host, ids: p.load_cpu_copy(host, ids([2])),
    "commit_after_verify": lambda p, host, ids: p.commit_after_verify(ids([1, 2]), ids([0, 1])),
}


@pytest.mark.parametrize("rebind", list(REBINDS))
@pytest.mark.parametrize("op", list(CALLS))
def test_a_replaced_temporal_state_is_refused_at_every_entry_point(rebind, op):
    """The temporal state re-pointed, grown or freed under the adapter: every operation is refused
    by its name before anything is queued, and the memory it was bound with (kept alive by the
    planner's per-layer views, which ``copy_from`` launches over) is untouched."""
    from recoverssm_rs.errors import BindingError

    dev = _pool(_host_tensors(torch.bfloat16, False, 2), "cuda", False)
    host = dev.get_cpu_copy(torch.tensor([5], device="cuda"))
    before = dev.temporal.clone()
    REBINDS[rebind](dev.temporal)
    with pytest.raises(BindingError, match=r"^temporal: .*nothing was written"):
        CALLS[op](dev, host, lambda x: torch.tensor(x, device="cuda"))
    torch.cuda.synchronize()
    if rebind != "storage resize_(0)":
        bound = torch.stack([layer[1] for layer in dev.planner.states[0]])  # group 0: conv[0], temporal
        assert torch.equal(bound.view(torch.uint8), before.view(torch.uint8))
