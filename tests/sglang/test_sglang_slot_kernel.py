"""The slot kernel of the SGLang adapter without a GPU (``rs_slot_scatter`` through the host
emulation of the real kernel source): on CUDA-claiming pools, ``clear_slots`` and
``commit_after_verify`` are one launch each for every layer and state tensor, read their indices
only on the device (the index tensors here cannot be read on the host), and leave every byte as the
host path does -- which the oracle traces hold equal to SGLang's own code. Also: the HiCache
copies as one launch each way, one launch per operation for every operation of the device path,
and the kernel's refusals."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from recoverssm_rs.errors import PlanError  # noqa: E402
from recoverssm_rs.sglang import SglangMambaPool  # noqa: E402
from support.device_fakes import FakeCuda  # noqa: E402

needs_cxx = pytest.mark.skipif(shutil.which("g++") is None, reason="host emulation needs a C++ compiler")

LAYERS, SLOTS, ROWS, DRAFT, K1 = 3, 10, 5, 4, 3


def _random(shape, dtype, g):
    return (torch.randn(*shape, generator=g) * 3).to(dtype)


def _tensors(seed, dtype, convs, dedup, temporal_shape=(2, 4, 4)):
    """Pool tensors and verify scratch shaped as SGLang's (``dedup``: the chain-draft conv windows
    as SGLang's overlapping ``as_strided`` view of a ``[layers, rows, draft + K-1 - 1, dim]``
    buffer)."""
    g = torch.Generator().manual_seed(seed)
    conv = [_random((LAYERS, SLOTS, dim, K1), dtype, g) for dim in convs]
    temporal = _random((LAYERS, SLOTS, *temporal_shape), torch.float32, g)
    ssm = _random((LAYERS, ROWS, DRAFT, *temporal_shape), torch.float32, g)
    windows = []
    for dim in convs:
        if dedup:
            phys = _random((LAYERS, ROWS, DRAFT + K1 - 1, dim), dtype, g)
            s = phys.stride()
            windows.append(phys.as_strided((LAYERS, ROWS, DRAFT, dim, K1), (s[0], s[1], s[2], 1, s[2])))
        else:
            windows.append(_random((LAYERS, ROWS, DRAFT, dim, K1), dtype, g))
    return conv, temporal, ssm, windows


def _pools(seed, dtype=torch.bfloat16, convs=(8,), dedup=False, temporal_shape=(2, 4, 4)):
    """A host pool and a CUDA-claiming pool over clones of the same tensors."""
    conv, temporal, ssm, windows = _tensors(seed, dtype, convs, dedup, temporal_shape)
    host = SglangMambaPool(conv, temporal, intermediate_ssm=ssm, intermediate_conv_window=windows)
    dconv = [c.clone() for c in conv]
    dtemporal = temporal.clone()
    dev = SglangMambaPool(
        [FakeCuda(c) for c in dconv],
        FakeCuda(dtemporal),
        intermediate_ssm=FakeCuda(ssm),
        intermediate_conv_window=[FakeCuda(w) for w in windows],
    )
    return host, dev, [*dconv, dtemporal]


def _equal(host, states, what):
    for i, (a, b) in enumerate(zip((*host.conv, host.temporal), states, strict=True)):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), f"{what}: tensor {i}"


def _dev(x, dtype=torch.int64):
    return FakeCuda(torch.as_tensor(x, dtype=dtype))


@needs_cxx
@pytest.mark.parametrize("convs", [(8,), (6, 8)], ids=["one-conv", "two-convs"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_clear_slots_is_one_launch_equal_to_the_host_path(fake_ops, emulator, convs, dtype):
    rng = np.random.default_rng(len(convs))
    host, dev, states = _pools(3, dtype, convs)
    for step in range(3):
        slots = rng.permutation(np.arange(1, SLOTS))[: int(rng.integers(1, 5))]
        host.clear_slots(torch.from_numpy(slots))
        before = len(emulator.calls)
        dev.clear_slots(_dev(slots, torch.int32 if step % 2 else torch.int64))
        assert len(emulator.calls) == before + 1, "one launch zeroes every layer and state tensor"
        assert emulator.calls[-1]["kernel"] == "rs_slot_scatter"
        assert dev.last_error().ok
        _equal(host, states, f"step {step}")
    assert all(bool((s[:, torch.from_numpy(slots)] == 0).all()) for s in states)


@needs_cxx
@pytest.mark.parametrize("dedup", [False, True], ids=["dense", "dedup"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("seed", range(3))
def test_commit_is_one_launch_equal_to_the_host_path(fake_ops, emulator, dedup, dtype, seed):
    """Accepted steps 0..draft-1 and -1 padding, with and without track slots and source rows."""
    rng = np.random.default_rng(seed)
    host, dev, states = _pools(10 + seed, dtype, (6, 8), dedup)
    for step in range(4):
        n = int(rng.integers(1, ROWS + 1))
        slots = rng.permutation(np.arange(1, SLOTS))[:n]
        steps = rng.integers(-1, DRAFT, size=n)
        track = track_steps = rows = None
        if step % 2:
            spare = np.setdiff1d(np.arange(1, SLOTS), slots)
            track = rng.permutation(spare)[:n] if len(spare) >= n else None
            track_steps = None if track is None else rng.integers(-1, DRAFT, size=n)
        if step >= 2:
            rows = rng.permutation(ROWS)[:n]
        host.commit_after_verify(
            torch.from_numpy(slots),
            torch.from_numpy(steps),
            None if track is None else torch.from_numpy(track),
            None if track_steps is None else torch.from_numpy(track_steps),
            None if rows is None else torch.from_numpy(rows),
        )
        before = len(emulator.calls)
        dev.commit_after_verify(
            _dev(slots),
            _dev(steps, torch.int32),
            None if track is None else _dev(track),
            None if track_steps is None else _dev(track_steps),
            None if rows is None else _dev(rows),
        )
        assert len(emulator.calls) == before + 1, "one launch commits every layer, tensor and pass"
        assert dev.last_error().ok
        _equal(host, states, f"step {step}")


@needs_cxx
def test_a_track_slot_that_is_also_a_commit_slot_ends_with_the_track_state(fake_ops, emulator):
    host, dev, states = _pools(5)
    args = ([2, 3], [1, 0], [3, 4], [2, 2], None)
    host.commit_after_verify(*[None if a is None else torch.tensor(a) for a in args])
    dev.commit_after_verify(*[None if a is None else _dev(a) for a in args])
    assert len(emulator.calls) == 1 and dev.last_error().ok
    _equal(host, states, "commit then track")


@needs_cxx
def test_the_kernel_skips_and_reports_what_the_host_refuses(fake_ops, emulator):
    host, dev, states = _pools(6)
    want = [s.clone() for s in states]
    dev.clear_slots(_dev([0, 2, SLOTS]))  # the dummy slot and one past the pool
    err = dev.last_error()
    assert not err.ok and "block" in err.names
    for w in want:
        w[:, 2] = 0
    for a, b in zip(states, want, strict=True):
        assert torch.equal(a, b), "only the valid slot is cleared"
    dev.commit_after_verify(_dev([4, 5, 6]), _dev([DRAFT, 0, 1]), src_indices=_dev([0, ROWS, 1]))
    err = dev.last_error()
    assert {"accepted", "column"} <= set(err.names)
    with pytest.raises(PlanError):  # the host path refuses the same call, writing nothing
        host.commit_after_verify(torch.tensor([4, 5, 6]), torch.tensor([DRAFT, 0, 1]))


def test_launch_arguments_are_checked_by_the_core(fake_ops, recorder):
    _, dev, _ = _pools(7)
    with pytest.raises(
        PlanError, match="^commit_after_verify: last_correct_step_indices has 1 elements, state_indices has 2"
    ):
        dev.commit_after_verify(_dev([1, 2]), _dev([0]))
    with pytest.raises(PlanError, match="track"):
        dev.commit_after_verify(_dev([1]), _dev([0]), _dev([2]))
    with pytest.raises(PlanError, match="^clear_slots: indices: expected a 1-D"):
        dev.clear_slots(_dev([[1, 2]]))
    assert not recorder.calls


@needs_cxx
def test_every_device_operation_is_one_launch(fake_ops, emulator, strided_fakes):
    """The launches each operation of the device path queues, counted through the emulation."""
    _, dev, _ = _pools(8, convs=(6, 8), dedup=True)
    ops = {
        "copy_from": lambda: dev.copy_from(_dev([1, 2]), _dev([3, 4])),
        "fork": lambda: dev.fork(_dev([5]), _dev([6])),
        "clear_slots": lambda: dev.clear_slots(_dev([7, 8, 9])),
        "commit_after_verify": lambda: dev.commit_after_verify(_dev([1, 2]), _dev([0, 3])),
        "commit_after_verify+track": lambda: dev.commit_after_verify(
            _dev([1, 2]), _dev([0, 3]), _dev([3, 4]), _dev([1, -1]), _dev([4, 0])
        ),
    }
    for name, op in ops.items():
        before = len(emulator.calls)
        op()
        assert len(emulator.calls) - before == 1, name
    assert [c["kernel"] for c in emulator.calls] == ["rs_state_copy"] * 2 + ["rs_slot_scatter"] * 3


@needs_cxx
@pytest.mark.parametrize("convs", [(8,), (6, 8)], ids=["one-conv", "two-convs"])
def test_hicache_round_trip_is_one_launch_each_way_equal_to_the_host_path(fake_ops, emulator, convs):
    """``get_cpu_copy``: one upload of the indices, one gather launch, one device-to-host copy;
    ``load_cpu_copy``: one upload of the host copy and indices, one scatter launch."""
    host, dev, states = _pools(9, torch.bfloat16, convs)
    slots = torch.tensor([4, 1, 7])
    want = host.get_cpu_copy(slots)
    before = len(emulator.calls)
    got = dev.get_cpu_copy(slots)
    assert len(emulator.calls) == before + 1 and dev.last_error().ok
    for a, b in zip([*want[0], want[1]], [*got[0], got[1]], strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    back = torch.tensor([2, 9, 5])
    host.load_cpu_copy(want, back)
    before = len(emulator.calls)
    dev.load_cpu_copy(got, back)
    assert len(emulator.calls) == before + 1 and dev.last_error().ok
    _equal(host, states, "after the round trip")


@needs_cxx
def test_the_core_s_hicache_load_checks_each_host_copy_s_dtype_and_shape(fake_ops, emulator):
    """``SglangPool.host_copy``, the core's one call of a load on CUDA, checks the host copies
    itself: copies of the right byte count but another dtype or shape are refused naming the state
    before anything is allocated, staged or launched, and the pool keeps every byte."""
    _, dev, states = _pools(12, torch.bfloat16, (8,))
    (conv_cpu,), temporal_cpu = dev.get_cpu_copy([1, 2])
    before, launches = [t.clone() for t in states], len(emulator.calls)

    def never(*_):
        pytest.fail("a refused load allocated or ran something")

    refused = {
        r"conv\[0\]: the host copy is float16 \[3, 2, 8, 3\], the pool needs bfloat16 \[3, 2, 8, 3\]": (
            [conv_cpu.view(torch.float16)],
            temporal_cpu,
        ),
        r"conv\[0\]: the host copy is bfloat16 \[3, 2, 3, 8\]": ([conv_cpu.transpose(2, 3)], temporal_cpu),
        r"temporal: the host copy is int32 \[3, 2, 2, 4, 4\], the pool needs float32": (
            [conv_cpu],
            temporal_cpu.view(torch.int32),
        ),
        r"temporal: the host copy is float32 \[3, 2, 4, 2, 4\]": ([conv_cpu], temporal_cpu.reshape(3, 2, 4, 2, 4)),
    }
    for match, copies in refused.items():
        with pytest.raises(PlanError, match=f"^load_cpu_copy: {match}"):
            dev.tensors.host_copy(
                "load_cpu_copy", [3, 4], alloc=never, run=never, err=dev.slot_error.alloc(), mamba_cache_cpu=copies
            )
    assert len(emulator.calls) == launches
    assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(before, states, strict=True))


@needs_cxx
def test_states_larger_than_a_chunk_are_cut_over_several_ctas(fake_ops, emulator):
    """A 72 KiB temporal state per slot takes three CTAs (32 KiB each) of the emulated grid; a
    strided bf16 window of 6000 x 3 elements (36 KiB) takes two."""
    host, dev, states = _pools(11, torch.bfloat16, (6000,), dedup=True, temporal_shape=(3, 48, 128))
    host.commit_after_verify(torch.tensor([2, 6]), torch.tensor([3, 1]), torch.tensor([7, 8]), torch.tensor([0, 2]))
    dev.commit_after_verify(_dev([2, 6]), _dev([3, 1]), _dev([7, 8]), _dev([0, 2]))
    assert emulator.calls[-1]["launch"].grid[0] == 3 and dev.last_error().ok
    _equal(host, states, "commit")
    host.clear_slots(torch.tensor([6, 8]))
    dev.clear_slots(_dev([6, 8]))
    _equal(host, states, "clear")
    got = dev.get_cpu_copy(torch.tensor([2, 7]))
    want = host.get_cpu_copy(torch.tensor([2, 7]))
    for a, b in zip([*want[0], want[1]], [*got[0], got[1]], strict=True):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@needs_cxx
@pytest.mark.parametrize(
    ("slots", "steps", "track", "track_steps"),
    [
        ([4, -2, 6], [1, 0, 2], None, None),  # a slot below -1
        ([4, 5, 6], [1, -3, 2], None, None),  # a step below -1
        ([4, 5], [1, 0], [-7, 8], [0, 1]),  # a track slot below -1
        ([4, 5], [1, 0], [7, 8], [0, -2]),  # a track step below -1
    ],
    ids=["slot", "step", "track-slot", "track-step"],
)
def test_the_kernel_refuses_values_below_the_no_slot_marker(fake_ops, emulator, slots, steps, track, track_steps):
    """-1 marks a padded row (written nothing, no error); any other negative slot or step is
    reported ("args") and its row writes nothing, while the other rows run -- as the host path,
    which refuses the whole call."""
    host, dev, states = _pools(12)
    bad_pass = 0 if min(slots + steps) < -1 else 1
    # The host path: refused, naming the value; nothing written.
    before = [s.clone() for s in (*host.conv, host.temporal)]
    with pytest.raises(PlanError, match=r"the only negative value allowed is -1"):
        host.commit_after_verify(*[None if a is None else torch.tensor(a) for a in (slots, steps, track, track_steps)])
    assert all(torch.equal(a, b) for a, b in zip(before, (*host.conv, host.temporal), strict=True))
    # The kernel: the refused row reported and skipped; the same call with that row padded (-1)
    # on the host gives every other byte.
    dev.commit_after_verify(*[None if a is None else _dev(a) for a in (slots, steps, track, track_steps)])
    err = dev.last_error()
    assert not err.ok and err.names == ["args"], err
    padded = [list(v) if v is not None else None for v in (slots, steps, track, track_steps)]
    pair = (padded[0], padded[1]) if bad_pass == 0 else (padded[2], padded[3])
    for r in range(len(pair[0])):
        if pair[0][r] < -1 or pair[1][r] < -1:
            pair[0][r] = pair[1][r] = -1
    host.commit_after_verify(*[None if a is None else torch.tensor(a) for a in padded])
    _equal(host, states, "the refused row wrote nothing")
    dev.commit_after_verify(_dev([-1, 3]), _dev([2, -1]))  # -1 in either vector: padding, no error
    assert dev.last_error().ok
