"""The adapter's device path without a GPU: an SGLang-shaped pool whose tensors are CPU tensors that
claim to live on ``cuda:0``; ``copy_from`` must be one launch of the fused state-copy kernel (run
through the host emulation of the real kernel source) that leaves every byte as SGLang's
gather-then-scatter ``t[:, dst] = t[:, src]`` does, for one and for several conv tensors."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from recoverssm_rs.sglang import SglangMambaPool  # noqa: E402
from support.device_fakes import FakeCuda  # noqa: E402

needs_cxx = pytest.mark.skipif(shutil.which("g++") is None, reason="host emulation needs a C++ compiler")


def _pool(rng, layers, slots, convs, dtype):
    g = torch.Generator().manual_seed(int(rng.integers(1 << 30)))
    conv = [(torch.randn(layers, slots, *shape, generator=g) * 3).to(dtype) for shape in convs]
    temporal = torch.randn(layers, slots, 2, 4, 4, generator=g)
    return conv, temporal


@needs_cxx
@pytest.mark.parametrize("convs", [[(8, 3)], [(3, 16), (8, 3)]], ids=["one-conv", "two-convs"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("seed", range(3))
def test_copy_from_is_one_launch_equal_to_sglang(fake_ops, emulator, strided_fakes, convs, dtype, seed):
    rng = np.random.default_rng(seed)
    layers, slots = 3, 12
    conv, temporal = _pool(rng, layers, slots, convs, dtype)
    want = [t.clone() for t in (*conv, temporal)]
    ops = SglangMambaPool([FakeCuda(c) for c in conv], FakeCuda(temporal))
    assert ops.device == "cuda:0" and ops.num_layers == layers and ops.planner.num_groups == len(convs)
    for step in range(3):
        n = int(rng.integers(1, 5))
        picked = rng.permutation(np.arange(1, slots))[: 2 * n]
        src, dst = picked[:n], picked[n:]
        for t in want:
            t[:, torch.from_numpy(dst)] = t[:, torch.from_numpy(src)]
        before = len(emulator.calls)
        ops.copy_from(FakeCuda(torch.from_numpy(src)), FakeCuda(torch.from_numpy(dst).to(torch.int32)))
        assert len(emulator.calls) == before + 1, "one launch copies every layer and state"
        assert ops.planner.last_error().ok
        for i, (got, exp) in enumerate(zip((*conv, temporal), want, strict=True)):
            assert torch.equal(got.view(torch.uint8), exp.view(torch.uint8)), f"step {step}, tensor {i}"
    assert fake_ops.uploads <= 3, "slot ids and ones are uploaded once, plus the planner's state metas"


@needs_cxx
def test_device_copy_skips_the_dummy_slot_and_flags_it(fake_ops, emulator, strided_fakes):
    rng = np.random.default_rng(7)
    conv, temporal = _pool(rng, 2, 6, [(8, 3)], torch.bfloat16)
    want = [t.clone() for t in (*conv, temporal)]
    ops = SglangMambaPool([FakeCuda(c) for c in conv], FakeCuda(temporal))
    ops.copy_from(FakeCuda(torch.tensor([2])), FakeCuda(torch.tensor([0])))
    assert len(emulator.calls) == 1
    assert not ops.planner.last_error().ok
    for got, exp in zip((*conv, temporal), want, strict=True):
        assert torch.equal(got, exp), "the dummy slot 0 is never written"


@needs_cxx
@pytest.mark.parametrize("host", [False, True], ids=["cuda-ids", "host-ids"])
def test_device_copy_flags_an_int64_slot_id_beyond_int32(fake_ops, emulator, strided_fakes, host):
    # 2**32 + 2 narrowed by wrapping would read as slot 2 and copy it; saturated it stays out of range
    rng = np.random.default_rng(8)
    conv, temporal = _pool(rng, 2, 6, [(8, 3)], torch.bfloat16)
    want = [t.clone() for t in (*conv, temporal)]
    ops = SglangMambaPool([FakeCuda(c) for c in conv], FakeCuda(temporal))
    src = [2**32 + 2] if host else FakeCuda(torch.tensor([2**32 + 2]))
    ops.copy_from(src, FakeCuda(torch.tensor([3])))
    assert len(emulator.calls) == 1
    assert not ops.planner.last_error().ok
    for got, exp in zip((*conv, temporal), want, strict=True):
        assert torch.equal(got, exp), "nothing is copied"


def test_install_on_a_cuda_pool_routes_every_operation(fake_ops):
    import types

    from recoverssm_rs.sglang import install

    conv, temporal = _pool(np.random.default_rng(1), 2, 6, [(8, 3)], torch.bfloat16)
    cache = types.SimpleNamespace(conv=[FakeCuda(conv[0])], temporal=FakeCuda(temporal))
    pool = types.SimpleNamespace(mamba_cache=cache)
    ops = install(pool)
    assert ops.device == "cuda:0"
    assert pool.copy_from == ops.copy_from and pool.load_cpu_copy == ops.load_cpu_copy
    assert pool.clear_slots == ops.clear_slots, "the clear is one launch without host synchronisation"


@pytest.mark.parametrize(
    ("src", "dst", "match"),
    [
        ([1, 2], [3], r"copy_from: src_indices has 2 slot ids, dst_indices 1: one source per destination"),
        ([[1, 2]], [[3, 4]], r"copy_from: src_indices: expected a 1-D vector"),
        ([1.0], [2.0], r"copy_from: src_indices: expected int32, got torch.float32"),
        (
            [1] * 6,
            [1, 2, 3, 4, 5, 1],
            r"copy_from: 6 copies into a pool of 5 slots \(1 ..= 5\): some slot would be written twice",
        ),
    ],
)
def test_device_copy_shapes_are_checked_by_the_core(fake_ops, recorder, strided_fakes, src, dst, match):
    from recoverssm_rs.errors import PlanError

    conv, temporal = _pool(np.random.default_rng(2), 2, 6, [(8, 3)], torch.bfloat16)
    ops = SglangMambaPool([FakeCuda(conv[0])], FakeCuda(temporal))
    with pytest.raises(PlanError, match=match):
        ops.copy_from(FakeCuda(torch.tensor(src)), FakeCuda(torch.tensor(dst)))
    assert not recorder.calls
    # a refused first call prepares nothing: no device path (state metas, error word), no constants
    assert (fake_ops.uploads, fake_ops.allocs) == (0, 0)
