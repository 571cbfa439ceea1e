"""NIXL endpoints under hostile inputs: a batch given as any integer table the core accepts (a CPU
tensor, an int32 array) is reported in plain block ids -- the failed requests' invalid blocks and
the notices each source rank receives; a source whose pool memory was freed or re-pointed after it
registered it refuses to hand out its handshake. Skipped when NIXL is not importable, unless
RECOVERSSM_REQUIRE_NIXL=1."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from recoverssm_rs.errors import BindingError
from recoverssm_rs.transfer import StatePool
from recoverssm_rs.transfer import nixl as rnixl
from support.transfer_ref import FAMILIES, layout, nixl_or_skip, paged_states, pool

nixl_or_skip()

GDN = FAMILIES["gdn"]


def _pair(tag):
    lay = layout(GDN, 1, 0, "SD")
    rng = np.random.default_rng(5)
    _, s = paged_states(lay, 2, 8, rng)
    _, d = paged_states(lay, 2, 8, rng)
    src = rnixl.NixlEndpoint(f"hs-src-{tag}", pool(lay, s, 0))
    dst = rnixl.NixlEndpoint(f"hs-dst-{tag}", pool(lay, d, 0))
    dst.connect(src.info())
    return src, dst


_BATCHES = {
    "cpu-tensor": lambda: torch.tensor([[1, 2], [3, 4], [5, 6]]),
    "int32-array": lambda: np.array([[1, 2], [3, 4], [5, 6]], dtype=np.int32),
}


@pytest.mark.parametrize("kind", list(_BATCHES))
def test_the_blocks_of_a_failed_pull_are_plain_ints(kind, monkeypatch):
    src, dst = _pair(f"fail-{kind}")
    monkeypatch.setattr(dst.agent, "transfer", lambda h: "ERR")  # every read fails to post
    res = dst.pull(_BATCHES[kind]())
    assert sorted(res.failed) == [0, 1, 2]
    assert res.invalid_blocks == [2, 4, 6]
    assert all(type(b) is int for b in res.invalid_blocks), res.invalid_blocks


@pytest.mark.parametrize("kind", list(_BATCHES))
def test_the_source_is_told_its_blocks_as_numbers(kind):
    src, dst = _pair(f"note-{kind}")
    assert dst.pull(_BATCHES[kind]()).ok
    notes: list[str] = []
    for _ in range(1000):  # the notices travel over the transport: up to 10 s
        notes += src.notifications()
        if sum(len(n.rsplit(":", 1)[1].split(",")) for n in notes) >= 3:
            break
        time.sleep(0.01)
    assert all(n.startswith(f"recoverssm:{dst.name}:") for n in notes), notes
    assert sorted(b for n in notes for b in n.rsplit(":", 1)[1].split(",")) == ["1", "3", "5"], notes


@pytest.mark.parametrize("change", ["freed", "re-pointed"])
def test_a_source_does_not_advertise_memory_it_no_longer_holds(change):
    lay = layout(GDN, 1, 0, "SD")
    g = torch.Generator().manual_seed(0)
    layers = [
        [torch.randn((8, *s.shape), generator=g).to(getattr(torch, s.dtype)) for s in lay.persistent] for _ in range(2)
    ]
    src = rnixl.NixlEndpoint(f"hs-gone-{change}", StatePool(lay, layers))
    assert src.info().addresses == src.addresses
    t = layers[0][1]
    if change == "freed":
        t.untyped_storage().resize_(0)
    else:
        t.set_(torch.empty_like(t))
    with pytest.raises(BindingError, match="layer 0, state 'temporal'"):
        src.info()


@pytest.mark.parametrize("timeout", [np.float32(30.0), np.int64(30), np.float64(30.0), 30, 30.0])
def test_a_timeout_may_be_any_real_number_type(timeout):
    src, dst = _pair(f"timeout-{type(timeout).__name__}")
    assert dst.pull([(1, 2)], timeout=timeout).ok


@pytest.mark.parametrize("timeout", [np.float32("nan"), np.float32("inf"), np.int64(-1), np.bool_(True), True, "30"])
def test_a_timeout_that_is_not_a_finite_positive_number_is_a_plan_error(timeout):
    from recoverssm_rs.errors import PlanError

    src, dst = _pair(f"bad-timeout-{type(timeout).__name__}-{timeout}")
    with pytest.raises(PlanError, match="timeout"):
        dst.pull([(1, 2)], timeout=timeout)
