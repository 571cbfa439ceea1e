"""The device path of Planner (launch_align / launch_align_decision / last_error) without a GPU.

A CUDA-bound planner is built over CPU torch tensors that claim to live on ``cuda:0`` (the binding
only reads pointers, shapes and device names), and the device path's CUDA seam
(``device_path.cuda_ops``) is replaced by a host fake. The driver launch (``cuda.module.launch``) is
replaced by a recorder that keeps the core-built launch and, where a C++ compiler is available, runs
the *real kernel source* on the launch's packed arguments through the host emulation of
``tests/support/emulation.py`` (the arguments are host addresses) -- so the whole device path
(argument checks, int64 narrowing, metadata table, error word, the core's packing, the kernel itself)
is compared byte for byte with the host plan executed by the Rust host executor.
"""

from __future__ import annotations

import ctypes
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from recoverssm_rs import cuda, layouts  # noqa: E402
from recoverssm_rs.cuda import ops as device_path  # noqa: E402
from recoverssm_rs.cuda.ops import cuda_index  # noqa: E402
from recoverssm_rs.errors import PlanError  # noqa: E402
from recoverssm_rs.planner import Planner  # noqa: E402
from support import generators  # noqa: E402
from support.device_fakes import FakeCuda, bytes_at, random_states  # noqa: E402

HAVE_CXX = shutil.which("g++") is not None or shutil.which("c++") is not None
needs_cxx = pytest.mark.skipif(not HAVE_CXX, reason="host emulation needs a C++ compiler")


def gdn_layout(conv_layout: str = "SD", nspec: int = 3):
    return layouts.gdn(
        num_k_heads=2,
        num_v_heads=4,
        head_k_dim=16,
        head_v_dim=16,
        conv_kernel_size=4,
        num_spec=nspec,
        conv_layout=conv_layout,
    )


def host_states(layout, nb: int, layers: int, seed: int) -> list[list[torch.Tensor]]:
    """Random per-layer state tensors on the CPU (random bytes, so every copied byte is checked)."""
    return random_states(layout, nb, layers, np.random.default_rng(seed))


def cuda_planner(layout, states: list[list[torch.Tensor]], index: int = 0) -> Planner:
    """A planner bound to the given CPU tensors as if they were on cuda:index."""
    return Planner(layout, [[FakeCuda(t, index) for t in layer] for layer in states])


def clone_states(states):
    return [[t.clone() for t in layer] for layer in states]


def fc(x, dtype=torch.int32, index: int = 0) -> FakeCuda:
    return FakeCuda(torch.as_tensor(np.asarray(x)).to(dtype), index)


def assert_same_bytes(got, want):
    for layer, (g, w) in enumerate(zip(got, want)):
        for i, (a, b) in enumerate(zip(g, w)):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), f"layer {layer}, state {i}"


# ------------------------------------------------------------------------------------------------
# Argument checks
# ------------------------------------------------------------------------------------------------


def test_cpu_planner_rejects_the_device_path(fake_ops, recorder):
    layout = gdn_layout()
    planner = Planner(layout, host_states(layout, 6, 1, 0))
    i = fc([0])
    with pytest.raises(PlanError, match=r"bound to cpu tensors.*plan_align\(\.\.\.\).*CopyPlan\.execute\(\)"):
        planner.launch_align(fc([[1, 2]]), i, i, i)
    with pytest.raises(PlanError, match="launch_align_decision.*plan_align"):
        planner.launch_align_decision(fc([[1, 2]]), i, i, i, 4)
    with pytest.raises(PlanError, match="last_error"):
        planner.last_error()
    with pytest.raises(PlanError, match="prepare_device"):
        planner.prepare_device()
    assert not recorder.calls and fake_ops.uploads == 0


def test_a_planner_over_cuda_descriptors_is_cuda_bound():
    layout = gdn_layout()
    planner = cuda_planner(layout, host_states(layout, 6, 2, 0))
    assert planner.device == "cuda:0"
    assert cuda_index(planner.device, "x") == 0
    assert cuda_index(cuda_planner(layout, host_states(layout, 6, 1, 0), index=3).device, "x") == 3


def _good(R=2, cols=3):
    bt = fc(np.arange(1, R * cols + 1).reshape(R, cols))
    return bt, fc(np.zeros(R)), fc(np.full(R, cols - 1)), fc(np.ones(R))


@pytest.mark.parametrize(
    "mutate, message",
    [
        (
            lambda a: a.__setitem__(1, torch.zeros(2, dtype=torch.int32)),
            r"src_col: expected a CUDA tensor on cuda:0, got a tensor on cpu; .*plan_align\(\.\.\.\) and CopyPlan",
        ),
        (lambda a: a.__setitem__(0, torch.ones(2, 3, dtype=torch.int32)), "block_table: expected a CUDA tensor"),
        (
            lambda a: a.__setitem__(2, np.zeros(2, np.int32)),
            "dst_col: expected a CUDA tensor on cuda:0, got a tensor on cpu",
        ),
        (lambda a: a.__setitem__(3, [1, 1]), "num_accepted: expected a CUDA tensor.*got list"),
        (
            lambda a: a.__setitem__(2, fc([2, 2], index=1)),
            "dst_col is on cuda:1 but the planner's states are on cuda:0",
        ),
        (
            lambda a: a.__setitem__(3, fc([1.0, 1.0], torch.float32)),
            "num_accepted: expected int32 or int64, got torch.float32",
        ),
        (lambda a: a.__setitem__(1, fc([[0, 0]])), r"src_col: expected a 1-D \[requests\] tensor, got shape \[1, 2\]"),
        (lambda a: a.__setitem__(2, fc([2, 2, 2])), "dst_col has 3 elements but src_col has 2"),
        (lambda a: a.__setitem__(3, fc([1])), "num_accepted has 1 elements but src_col has 2"),
        (lambda a: a.__setitem__(0, fc([1, 2, 3])), r"block_table: expected a 2-D \[requests, cols\] tensor"),
        (lambda a: a.__setitem__(0, fc([[1, 2, 3]])), "block_table has 1 rows for 2 requests"),
    ],
)
def test_launch_align_argument_checks(fake_ops, recorder, mutate, message):
    layout = gdn_layout()
    planner = cuda_planner(layout, host_states(layout, 8, 1, 0))
    args = list(_good())
    mutate(args)
    with pytest.raises(PlanError, match=message):
        planner.launch_align(*args)
    assert not recorder.calls
    assert fake_ops.uploads == 0 and not fake_ops.contexts  # nothing touched the device


@pytest.mark.parametrize(
    "err, message",
    [
        (fc([0, 0, 0], torch.int64), "err: expected int32, got torch.int64"),
        (fc([0, 0]), r"err: expected a 1-D vector of at least 3 elements, got shape \[2\]"),
        (torch.zeros(3, dtype=torch.int32), "err: expected a CUDA tensor"),
        (fc(np.zeros((3, 1), np.int32)), r"err: expected a 1-D vector of at least 3 elements, got shape \[3, 1\]"),
        (FakeCuda(torch.zeros(6, dtype=torch.int32)[::2]), "err: must be contiguous"),
    ],
)
def test_err_argument_checks(fake_ops, recorder, err, message):
    layout = gdn_layout()
    planner = cuda_planner(layout, host_states(layout, 8, 1, 0))
    with pytest.raises(PlanError, match=message):
        planner.launch_align(*_good(), err=err)
    assert not recorder.calls


@pytest.mark.parametrize(
    "block_size, message",
    [
        (0, r"block_size must be in \[1, 2\*\*31\)"),
        (-4, "block_size must be in"),
        (2**31, "block_size must be in"),
        (True, "must be a host integer"),
        (2.0, "must be a host integer"),
        (torch.tensor(4), "must be a host integer"),
    ],
)
def test_launch_align_decision_checks_block_size(fake_ops, recorder, block_size, message):
    layout = gdn_layout()
    planner = cuda_planner(layout, host_states(layout, 8, 1, 0))
    bt, src, _, acc = _good()
    with pytest.raises(PlanError, match=message):
        planner.launch_align_decision(bt, src, fc([5, 9]), acc, block_size)
    with pytest.raises(PlanError, match="running has 3 elements"):
        planner.launch_align_decision(bt, src, fc([5, 9, 1]), acc, 4)
    assert not recorder.calls


def test_torch_stream_normalisation():
    ops = device_path.CudaOps()

    class TorchLike:
        cuda_stream = 1234

    s = TorchLike()
    assert ops.torch_stream(s, 0) is s
    assert ops.torch_stream(None, 0) is None
    with pytest.raises(PlanError, match="stream must be a torch.cuda.Stream, a CuPy stream or None"):
        ops.torch_stream(object(), 0)


# ------------------------------------------------------------------------------------------------
# What reaches the driver (the core-built launch)
# ------------------------------------------------------------------------------------------------


def test_launch_align_passes_the_planners_metadata(fake_ops, recorder):
    nspec, nb, R, cols = 3, 20, 3, 5
    layout = gdn_layout("DS", nspec)
    states = host_states(layout, nb, 2, 1)
    planner = cuda_planner(layout, states)
    bt = fc(np.arange(1, R * cols + 1).reshape(R, cols), torch.int64)
    src, dst, acc = fc([0, 1, 0], torch.int64), fc([4, 4, 3], torch.int64), fc([1, 2, 4], torch.int64)
    stream = object()
    planner.launch_align(bt, src, dst, acc, stream=stream)
    planner.launch_align(bt, src, dst, acc)
    assert fake_ops.uploads == 1 and fake_ops.allocs == 1  # uploaded once, cached on the planner
    assert [c[1] for c in fake_ops.contexts] == [stream, None] and {c[0] for c in fake_ops.contexts} == {0}
    first, second = recorder.calls
    assert first["kernel"] == second["kernel"] == "rs_state_copy" and not first["decide"]
    assert first["metas"] == second["metas"] and first["err"] == second["err"]
    assert bytes_at(first["metas"], planner.state_meta.nbytes) == planner.state_meta.tobytes()
    assert first["num_meta"] == len(planner.state_meta) == 2 * 2
    assert first["max_accepted"] == nspec + 1
    assert first["num_blocks"] == nb == planner.num_blocks
    assert first["has_temporal"] is True
    assert first["num_requests"] == R
    assert first["chunks"] == cuda.state_chunks(int(planner.state_meta["state_bytes"].max())) >= 1
    assert first["stream"] is stream and second["stream"] is None
    # int64 inputs narrowed on the "device" (never via numpy): the packed pointers are int32 copies.
    for name in ("block_table", "src_col", "dst_or_running", "num_accepted"):
        assert first[name] not in (bt.data_ptr(), src.data_ptr(), dst.data_ptr(), acc.data_ptr()), name
    assert first["bt_cols"] == cols and first["bt_row_stride"] == cols


def test_int32_inputs_pass_through_and_strided_tables_are_fixed(fake_ops, recorder):
    layout = gdn_layout()
    planner = cuda_planner(layout, host_states(layout, 20, 1, 1))
    src, dst, acc = fc([0, 1]), fc([2, 2]), fc([1, 2])
    wide = fc(np.arange(1, 2 * 8 + 1).reshape(2, 8))
    view = FakeCuda(wide.t[:, :3])  # row stride 8: passed as is (the kernel takes the row stride)
    planner.launch_align(view, src, dst, acc)
    call = recorder.calls[-1]
    assert (call["src_col"], call["dst_or_running"], call["num_accepted"]) == (
        src.data_ptr(),
        dst.data_ptr(),
        acc.data_ptr(),
    )
    assert call["block_table"] == view.t.data_ptr() and call["bt_row_stride"] == 8 and call["bt_cols"] == 3
    transposed = FakeCuda(torch.arange(1, 7, dtype=torch.int32).reshape(3, 2).T)  # column stride 2
    planner.launch_align(transposed, src, dst, acc)
    call = recorder.calls[-1]
    assert call["bt_row_stride"] == 3 and call["table"] == transposed.t.tolist()


def test_an_int64_table_with_spare_rows_is_narrowed_to_the_step(fake_ops, recorder):
    layout = gdn_layout()
    planner = cuda_planner(layout, host_states(layout, 40, 1, 1))
    table = fc(np.arange(1, 10 * 3 + 1).reshape(10, 3), torch.int64)  # a persistent [max_reqs, cols] table
    planner.launch_align(table, fc([0, 0]), fc([2, 2]), fc([1, 2]))
    call = recorder.calls[-1]
    assert call["table"] == [[1, 2, 3], [4, 5, 6]] and call["bt_cols"] == 3
    wide32 = fc(np.arange(1, 10 * 3 + 1).reshape(10, 3))
    planner.launch_align(wide32, fc([0, 0]), fc([2, 2]), fc([1, 2]))
    assert recorder.calls[-1]["block_table"] == wide32.data_ptr()  # int32: passed as is (the kernel reads R rows)


def test_the_planner_launch_packs_what_the_launch_layer_packs(fake_ops, recorder):
    # The planner's device path and the launch layer's cuda.launch_state_copy go through the same core
    # builder: for the same tensors they pack the same bytes.
    layout = gdn_layout("DS", 3)
    planner = cuda_planner(layout, host_states(layout, 20, 2, 1))
    wide = fc(np.arange(1, 10 * 8 + 1).reshape(10, 8) % 19 + 1)
    view = FakeCuda(wide.t[:, :5])  # int32, row stride 8, spare rows: passed as is
    src, dst, running, acc, err = fc([0, 1, 0]), fc([4, 4, 3]), fc([5, 9, 14]), fc([1, 2, 4]), fc([0, 0, 0])
    planner.launch_align(view, src, dst, acc, err=err)
    planner.launch_align_decision(view, src, running, acc, 4, err=err)
    own, dec = recorder.calls
    common = dict(max_accepted=4, num_blocks=20, has_temporal=True, chunks=own["chunks"])
    cuda.launch_state_copy(own["metas"], own["num_meta"], view, src, dst, acc, err, **common)
    cuda.launch_state_copy(own["metas"], own["num_meta"], view, src, running, acc, err, block_size=4, **common)
    assert len(recorder.calls) == 4
    assert recorder.calls[2]["launch"].args == own["launch"].args
    assert recorder.calls[3]["launch"].args == dec["launch"].args and dec["decide"] and dec["block_size"] == 4
    assert (own["block_table"], own["bt_row_stride"], own["bt_cols"]) == (view.data_ptr(), 8, 5)


def test_state_chunks_follow_the_largest_state():
    # 32 KiB of a state per CTA, at most 64 CTAs (what measured best for 2 MiB states on an H200).
    assert cuda.state_chunks(2 << 20) == cuda.MAX_STATE_CHUNKS == 64
    assert cuda.state_chunks(8 << 20) == 64
    assert cuda.state_chunks(245760) == 8  # a bf16 [12288, 10] conv window
    assert cuda.state_chunks(1) == cuda.state_chunks(0) == 1


def test_conv_only_layout_has_no_temporal_flag(fake_ops, recorder):
    layout = layouts.short_conv(intermediate_size=64, conv_kernel=4, num_spec=2, conv_layout="DS")
    planner = cuda_planner(layout, host_states(layout, 8, 3, 2))
    planner.launch_align(*_good())
    assert recorder.calls[0]["has_temporal"] is False
    assert recorder.calls[0]["max_accepted"] == 3


def test_own_error_word_is_zeroed_each_call_and_a_callers_word_is_used(fake_ops, recorder):
    layout = gdn_layout()
    planner = cuda_planner(layout, host_states(layout, 20, 1, 3))
    planner.launch_align(*_good())
    own = recorder.calls[0]["err"]
    np.ctypeslib.as_array((ctypes.c_int32 * 3).from_address(own))[:] = [5, 1, 2]  # as if the kernel had flagged
    planner.launch_align(*_good())
    assert recorder.calls[1]["err"] == own
    assert recorder.calls[1]["err_at_launch"].tolist() == [0, 0, 0]  # zeroed before the launch
    mine = fc([7, 7, 7])
    planner.launch_align(*_good(), err=mine)
    assert recorder.calls[2]["err"] == mine.data_ptr()
    assert mine.numpy().tolist() == [7, 7, 7]  # the caller's word is not zeroed by the planner


def test_last_error_before_any_launch_is_ok(fake_ops):
    layout = gdn_layout()
    planner = cuda_planner(layout, host_states(layout, 8, 1, 0))
    word = planner.last_error()
    assert word.ok and word.first_request is None and fake_ops.syncs == 0


def test_zero_requests(fake_ops, recorder):
    layout = gdn_layout()
    planner = cuda_planner(layout, host_states(layout, 8, 1, 0))
    e = fc(np.zeros(0))
    planner.launch_align(fc(np.zeros((0, 4))), e, e, e)
    assert not recorder.calls  # nothing to launch
    assert planner.last_error().ok


# ------------------------------------------------------------------------------------------------
# End to end on the host: the real kernel source (host emulation) vs the host plan
# ------------------------------------------------------------------------------------------------


@needs_cxx
@pytest.mark.parametrize("conv_layout", ["SD", "DS"])
@pytest.mark.parametrize("seed", range(6))
def test_launch_align_emulated_equals_the_host_plan(fake_ops, emulator, conv_layout, seed):
    rng = np.random.default_rng(100 + seed)
    nspec, R, cols, layers = 3, int(rng.integers(1, 9)), 6, 2
    nb = R * cols + 3
    layout = gdn_layout(conv_layout, nspec)
    states = host_states(layout, nb, layers, seed)
    want = clone_states(states)
    bt, src, dst, acc = generators.owned_step(rng, R, cols, nspec + 1, nb)
    Planner(layout, want).plan_align(bt, src, dst, acc).execute()
    planner = cuda_planner(layout, states)
    dtype = torch.int64 if seed % 2 else torch.int32
    planner.launch_align(fc(bt, dtype), fc(src, dtype), fc(dst, dtype), fc(acc, dtype))
    assert len(emulator.calls) == 1
    assert planner.last_error().ok
    assert_same_bytes(states, want)


@needs_cxx
@pytest.mark.parametrize("conv_layout", ["SD", "DS"])
@pytest.mark.parametrize("seed", range(6))
def test_launch_align_decision_emulated_equals_the_host_plan(fake_ops, emulator, conv_layout, seed):
    from support import references

    rng = np.random.default_rng(200 + seed)
    nspec, R, cols, layers = 3, int(rng.integers(1, 9)), 6, 2
    nb = R * cols + 3
    bs = int(rng.choice([1, 2, 4]))
    layout = gdn_layout(conv_layout, nspec)
    states = host_states(layout, nb, layers, seed)
    want = clone_states(states)
    bt = rng.permutation(np.arange(1, nb, dtype=np.int32))[: R * cols].reshape(R, cols)
    src = np.zeros(R, np.int32)
    running = np.zeros(R, np.int32)
    acc = np.zeros(R, np.int32)
    # Host side of the same decision, for the reference plan (padding where nothing is copied).
    h_dst = np.full(R, -1, np.int32)
    h_acc = np.ones(R, np.int32)
    h_src = np.full(R, -1, np.int32)
    for r in range(R):
        while True:
            a = int(rng.integers(1, nspec + 2))
            run = int(rng.integers(0, cols * bs))
            s = max(0, (run - 1) // bs) if run else 0
            dec = references.align_decision(run, a, bs)
            if dec is None or (dec[0] < cols and s + dec[1] - 1 < cols and not (dec[0] == s and dec[1] == 1)):
                break
        src[r], running[r], acc[r] = s, run, a
        if dec is not None:
            h_src[r], h_dst[r], h_acc[r] = s, dec[0], dec[1]
    Planner(layout, want).plan_align(bt, h_src, h_dst, h_acc).execute()
    planner = cuda_planner(layout, states)
    planner.launch_align_decision(fc(bt), fc(src, torch.int64), fc(running), fc(acc), bs)
    call = emulator.calls[0]
    assert call["kernel"] == "rs_state_copy" and call["decide"] and call["block_size"] == bs
    assert planner.last_error().ok
    assert_same_bytes(states, want)


@needs_cxx
def test_invalid_requests_are_skipped_and_reported(fake_ops, emulator):
    nspec, R, cols = 2, 4, 4
    nb = R * cols + 1
    layout = gdn_layout("SD", nspec)
    states = host_states(layout, nb, 1, 9)
    want = clone_states(states)
    bt = np.arange(1, nb, dtype=np.int32).reshape(R, cols)
    src = np.array([0, 0, 0, 1], np.int32)
    dst = np.array([3, 3, 3, 3], np.int32)
    acc = np.array([2, 9, 1, 0], np.int32)  # requests 1 and 3: accepted count out of range
    ok = np.array([0, 2], np.int64)
    Planner(layout, want).plan_align(bt[ok], src[ok], dst[ok], acc[ok]).execute()
    with pytest.raises(PlanError):  # the host plan refuses the whole step instead
        Planner(layout, clone_states(states)).plan_align(bt, src, dst, acc)
    planner = cuda_planner(layout, states)
    planner.launch_align(fc(bt), fc(src), fc(dst), fc(acc))
    word = planner.last_error()
    assert fake_ops.syncs == 1
    assert not word.ok and word.names == ["accepted"]
    assert (word.first_request, word.last_request) == (1, 3)
    assert_same_bytes(states, want)
    # The next launch starts from a clean word.
    planner.launch_align(fc(bt[ok]), fc(src[ok]), fc(dst[ok]), fc(np.ones(2)))
    assert planner.last_error().ok


@needs_cxx
def test_int64_values_beyond_int32_are_flagged_not_wrapped(fake_ops, emulator):
    # Narrowed to int32 on the device, 2**32 + 5 would read as block 5 and 2**32 + 1 as one accepted
    # token: both valid. Saturated, they stay out of range: each request is skipped and flagged, as
    # the host plan refuses them, and nothing is written.
    layout = gdn_layout("SD", 2)
    R, cols = 2, 4
    nb = R * cols + 1
    states = host_states(layout, nb, 1, 3)
    want = clone_states(states)
    bt = np.arange(1, nb, dtype=np.int64).reshape(R, cols)
    bt[0, 3] = 2**32 + 5  # request 0's destination block
    src, dst, acc = np.array([0, 0]), np.array([3, 3]), np.array([1, 2**32 + 1])
    with pytest.raises(PlanError):
        Planner(layout, clone_states(states)).plan_align(bt, src, dst, acc)
    planner = cuda_planner(layout, states)
    planner.launch_align(fc(bt, torch.int64), fc(src, torch.int64), fc(dst, torch.int64), fc(acc, torch.int64))
    word = planner.last_error()
    assert sorted(word.names) == ["accepted", "block"] and (word.first_request, word.last_request) == (0, 1)
    assert_same_bytes(states, want)
    # a column below int32's range is negative, as the int64 value is: a padding row, skipped silently
    planner.launch_align(fc(bt[1:], torch.int64), fc([-(2**32) + 1], torch.int64), fc([3], torch.int64), fc([1]))
    assert planner.last_error().ok
    assert_same_bytes(states, want)


@needs_cxx
def test_null_blocks_are_handled_like_the_host_plan(fake_ops, emulator):
    # Row 0: a null-block row (source and destination both block 0): skipped silently by both.
    # Row 1: an ordinary copy. Row 2: the conv source is the null block: the host rejects the step,
    # the device skips that request's conv copy and reports a block error.
    nspec, cols = 2, 4
    nb = 3 * cols + 1
    layout = gdn_layout("DS", nspec)
    states = host_states(layout, nb, 1, 11)
    bt = np.array([[0, 0, 0, 0], [5, 6, 7, 8], [0, 10, 11, 12]], np.int32)
    src, dst, acc = np.array([0, 0, 0], np.int32), np.array([1, 2, 3], np.int32), np.array([2, 2, 2], np.int32)
    want = clone_states(states)
    Planner(layout, want).plan_align(bt[:2], src[:2], dst[:2], acc[:2]).execute()
    with pytest.raises(PlanError, match="request 2.*null block"):
        Planner(layout, clone_states(states)).plan_align(bt, src, dst, acc)
    planner = cuda_planner(layout, states)
    planner.launch_align(fc(bt[:2]), fc(src[:2]), fc(dst[:2]), fc(acc[:2]))
    assert planner.last_error().ok
    assert_same_bytes(states, want)
    # Row 2 alone: its temporal copy (block 10 -> 12) is valid, its conv source is not.
    planner.launch_align(fc(bt[2:]), fc(src[2:]), fc(dst[2:]), fc(acc[2:]))
    word = planner.last_error()
    assert not word.ok and word.names == ["block"] and (word.first_request, word.last_request) == (0, 0)
    conv, temporal = (s_.view(torch.uint8) for s_ in states[0])
    want_conv, want_temporal = (s_.view(torch.uint8) for s_ in want[0])
    assert torch.equal(conv[12], want_conv[12]), "the conv window of block 12 must not be written"
    assert torch.equal(temporal[12], want_temporal[10]), "the temporal copy 10 -> 12 still happens"
