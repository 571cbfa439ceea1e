"""Real-GPU tests of the CUDA kernels through recoverssm_rs.cuda (skipped without CUDA + CuPy).

Run on a machine with a GPU: ``python -m pytest tests/cuda/test_gpu.py -q -m gpu``. Every kernel result is
compared byte for byte with the numpy reference of tests/support/references.py (the same reference
the host emulation is checked against); the fused kernel is also captured in a CUDA graph and
replayed, and launched under torch's sync-debug mode "error".
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
cupy = pytest.importorskip("cupy")

from recoverssm_rs import cuda  # noqa: E402
from support import generators, references  # noqa: E402

# Skipped without a CUDA device by tests/conftest.py.
pytestmark = pytest.mark.gpu

DATA = Path(__file__).parents[1] / "data"


def to_dev(records: np.ndarray) -> torch.Tensor:
    """Records (any dtype) as a uint8 CUDA tensor."""
    raw = np.ascontiguousarray(records).view(np.uint8).reshape(-1).copy()
    return torch.from_numpy(raw).cuda()


def i32_dev(x) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(np.asarray(x, dtype=np.int32))).cuda()


def bt_dev(bt: np.ndarray) -> torch.Tensor:
    """The block table as a strided view of a wider device tensor (exercises bt_row_stride)."""
    rows, cols = bt.shape
    full = np.full((rows, cols + 5), -3, dtype=np.int32)
    full[:, :cols] = bt
    return torch.from_numpy(full).cuda()[:, :cols]


def run_waves(segs_d, tiles_d, starts, max_ctas=None):
    for w in range(len(starts) - 1):
        cuda.launch_copy_tiles(segs_d, tiles_d, int(starts[w]), int(starts[w + 1] - starts[w]), max_ctas=max_ctas)


@pytest.mark.parametrize("seed", range(12))
def test_copy_tiles_matches_reference(seed):
    rng = np.random.default_rng(5000 + seed)
    host = rng.integers(0, 256, size=1 << 21, dtype=np.uint8)
    dev = torch.from_numpy(host.copy()).cuda()
    base = dev.data_ptr()
    rel = generators.random_segment_plan(
        rng, arena_size=host.size, max_segments=16, max_bytes=512 * 1024, descending=seed % 4 == 3
    )
    segs = generators.absolute_segments(rel, base)
    tiles, starts = references.make_tiles(segs, tile_bytes=int(rng.choice([64, 4096, 65536])), rng=rng)
    run_waves(to_dev(segs), to_dev(tiles), starts, max_ctas=None if seed % 2 else 7)
    torch.cuda.synchronize()
    ref = host.copy()
    references.reference_execute_segments(ref, segs, base=base)
    got = dev.cpu().numpy()
    assert np.array_equal(got, ref), f"{np.count_nonzero(got != ref)} bytes differ"


def test_copy_tiles_large_unaligned_temporal_copies():
    # Sixteen 2 MiB copies at every (src mod 16, dst mod 16) class that shares an element size.
    n = 2 << 20
    host = np.random.default_rng(1).integers(0, 256, size=40 * n, dtype=np.uint8)
    dev = torch.from_numpy(host.copy()).cuda()
    base = dev.data_ptr()
    segs = np.zeros(16, dtype=cuda.SEGMENT_DTYPE)
    for i in range(16):
        src = 2 * i * n + (i % 4) * 4
        dst = (2 * i + 1) * n + (i // 4) * 4 + 8
        segs[i] = (base + src, base + dst, n - 64, 1, 0, 0, cuda.MODE_DISJOINT, 4)
    tiles, starts = references.make_tiles(segs, tile_bytes=128 * 1024)
    run_waves(to_dev(segs), to_dev(tiles), starts)
    torch.cuda.synchronize()
    ref = host.copy()
    references.reference_execute_segments(ref, segs, base=base)
    assert np.array_equal(dev.cpu().numpy(), ref)


def state_case(seed, **kw):
    rng = np.random.default_rng(seed)
    p = generators.random_state_problem(rng, **kw)
    host = rng.integers(0, 256, size=p.arena_size, dtype=np.uint8)
    dev = torch.from_numpy(host.copy()).cuda()
    return rng, p, host, dev


@pytest.mark.parametrize("seed", range(16))
def test_state_copy_matches_reference(seed):
    rng, p, host, dev = state_case(6000 + seed, max_state_bytes=256 * 1024)
    base = dev.data_ptr()
    metas = p.metas(base)
    err = torch.zeros(3, dtype=torch.int32, device="cuda")
    cuda.launch_state_copy(
        to_dev(metas),
        len(metas),
        bt_dev(p.block_table),
        i32_dev(p.src_col),
        i32_dev(p.dst_col),
        i32_dev(p.num_accepted),
        err,
        max_accepted=p.max_accepted,
        num_blocks=p.num_blocks,
        has_temporal=p.has_temporal,
        chunks=int(rng.choice([1, 4, 16])),
    )
    torch.cuda.synchronize()
    ref = host.copy()
    want = references.reference_state_copy(
        ref,
        metas,
        p.block_table,
        p.src_col,
        p.dst_col,
        p.num_accepted,
        max_accepted=p.max_accepted,
        num_blocks=p.num_blocks,
        base=base,
    )
    assert err.cpu().numpy().tolist() == want.tolist()
    assert np.array_equal(dev.cpu().numpy(), ref)


@pytest.mark.parametrize("seed", range(8))
def test_state_copy_align_matches_reference(seed):
    rng, p, host, dev = state_case(7000 + seed)
    base = dev.data_ptr()
    metas = p.metas(base)
    R, cols = p.block_table.shape
    bs = int(rng.choice([1, 2, 4, 16]))
    running = rng.integers(0, (cols + 1) * bs + 1, size=R).astype(np.int32)
    err = torch.zeros(3, dtype=torch.int32, device="cuda")
    cuda.launch_state_copy(
        to_dev(metas),
        len(metas),
        bt_dev(p.block_table),
        i32_dev(p.src_col),
        i32_dev(running),
        i32_dev(p.num_accepted),
        err,
        block_size=bs,
        max_accepted=p.max_accepted,
        num_blocks=p.num_blocks,
        has_temporal=p.has_temporal,
    )
    torch.cuda.synchronize()
    ref = host.copy()
    want = references.reference_state_copy(
        ref,
        metas,
        p.block_table,
        p.src_col,
        running,
        p.num_accepted,
        block_size=bs,
        max_accepted=p.max_accepted,
        num_blocks=p.num_blocks,
        base=base,
    )
    assert err.cpu().numpy().tolist() == want.tolist()
    assert np.array_equal(dev.cpu().numpy(), ref)


def test_state_copy_gdn_sized_states():
    # GDN-like: 4 layers x (SD conv [4, 8192] bf16, temporal 32x128x128 fp32 = 2 MiB), 6 requests,
    # two of them shifting their conv window in place.
    layers, width, dim, tbytes, nb, R, cols = 4, 4, 8192, 32 * 128 * 128 * 4, 32, 6, 4
    conv_bytes = width * dim * 2
    sizes = [conv_bytes, tbytes] * layers
    offsets = np.cumsum([0] + [s * nb for s in sizes])
    rng = np.random.default_rng(11)
    host = rng.integers(0, 256, size=int(offsets[-1]), dtype=np.uint8)
    dev = torch.from_numpy(host.copy()).cuda()
    base = dev.data_ptr()
    metas = np.zeros(2 * layers, dtype=cuda.STATE_META_DTYPE)
    for i, size in enumerate(sizes):
        kind = cuda.KIND_CONV_SD if i % 2 == 0 else cuda.KIND_TEMPORAL
        metas[i] = (
            base + int(offsets[i]),
            size,
            size,
            kind,
            2 if kind else 4,
            width if kind else 0,
            dim if kind else 0,
            i // 2,
            i % 2,
            nb,
            0,
            0,
        )
    bt = (1 + np.arange(R * cols, dtype=np.int32)).reshape(R, cols)
    src = np.array([0, 1, 0, 2, 1, 0], np.int32)
    dst = np.array([1, 2, 0, 3, 1, 2], np.int32)
    acc = np.array([1, 2, 3, 2, 2, 3], np.int32)  # requests 2 and 4 shift in place
    err = torch.zeros(3, dtype=torch.int32, device="cuda")
    cuda.launch_state_copy(
        to_dev(metas),
        len(metas),
        bt_dev(bt),
        i32_dev(src),
        i32_dev(dst),
        i32_dev(acc),
        err,
        max_accepted=4,
        num_blocks=nb,
        has_temporal=True,
    )
    torch.cuda.synchronize()
    ref = host.copy()
    references.reference_state_copy(ref, metas, bt, src, dst, acc, max_accepted=4, num_blocks=nb, base=base)
    assert err.cpu().tolist() == [0, 0, 0]
    assert np.array_equal(dev.cpu().numpy(), ref)


def test_state_copy_vllm_vectors():
    path = DATA / "align_copy.npz"
    if not path.exists():
        pytest.skip("conformance vectors missing")
    d = np.load(path)
    for case in range(int(d["num_cases"])):
        p = f"case{case}_"
        sd = str(d[p + "orientation"]) == "SD"
        before, after, spec = [], [], []
        for layer in (0, 1):
            cb = np.ascontiguousarray(d[p + f"layer{layer}_conv_before"], np.float32).view(np.uint32) >> 16
            ca = np.ascontiguousarray(d[p + f"layer{layer}_conv_after"], np.float32).view(np.uint32) >> 16
            tb = np.ascontiguousarray(d[p + f"layer{layer}_temporal_before"], np.float32)
            ta = np.ascontiguousarray(d[p + f"layer{layer}_temporal_after"], np.float32)
            cb, ca = cb.astype(np.uint16), ca.astype(np.uint16)
            width, dim = (cb.shape[1], cb.shape[2]) if sd else (cb.shape[2], cb.shape[1])
            spec += [
                (cuda.KIND_CONV_SD if sd else cuda.KIND_CONV_DS, 2, width, dim, cb[0].nbytes),
                (cuda.KIND_TEMPORAL, 4, 0, 0, tb[0].nbytes),
            ]
            before += [cb, tb]
            after += [ca, ta]
        nb = before[0].shape[0]
        offs = np.cumsum([0] + [(t.nbytes + 255) // 256 * 256 for t in before])
        host = np.zeros(int(offs[-1]), np.uint8)
        for t, o in zip(before, offs):
            host[o : o + t.nbytes] = t.reshape(-1).view(np.uint8)
        dev = torch.from_numpy(host).cuda()
        metas = np.zeros(4, dtype=cuda.STATE_META_DTYPE)
        for i, (kind, elem, width, dim, nbytes) in enumerate(spec):
            metas[i] = (dev.data_ptr() + int(offs[i]), nbytes, nbytes, kind, elem, width, dim, i // 2, i % 2, nb, 0, 0)
        err = torch.zeros(3, dtype=torch.int32, device="cuda")
        cuda.launch_state_copy(
            to_dev(metas),
            4,
            bt_dev(d[p + "block_table"]),
            i32_dev(d[p + "src_col"]),
            i32_dev(d[p + "dst_col"]),
            i32_dev(d[p + "num_accepted"]),
            err,
            max_accepted=int(spec[0][2]),
            num_blocks=nb,
            has_temporal=True,
        )
        got = dev.cpu().numpy()
        assert err.cpu().tolist() == [0, 0, 0]
        for t, o, want in zip(before, offs, after):
            assert np.array_equal(got[o : o + t.nbytes].view(t.dtype).reshape(t.shape), want), f"case {case}"


def _graph_problem():
    rng, p, host, dev = state_case(8123, invalid=0.0, max_requests=8, max_state_bytes=64 * 1024)
    base = dev.data_ptr()
    metas = p.metas(base)
    tensors = dict(
        metas=to_dev(metas),
        bt=bt_dev(p.block_table),
        src=i32_dev(p.src_col),
        dst=i32_dev(p.dst_col),
        acc=i32_dev(p.num_accepted),
        err=torch.zeros(3, dtype=torch.int32, device="cuda"),
    )
    return rng, p, host, dev, metas, tensors


def _launch(p, t, metas):
    cuda.launch_state_copy(
        t["metas"],
        len(metas),
        t["bt"],
        t["src"],
        t["dst"],
        t["acc"],
        t["err"],
        max_accepted=p.max_accepted,
        num_blocks=p.num_blocks,
        has_temporal=p.has_temporal,
    )


def test_state_copy_captures_in_a_cuda_graph_and_replays():
    rng, p, host, dev, metas, t = _graph_problem()
    for name in cuda.KERNEL_NAMES:  # compile + load outside the capture
        cuda.get_kernel(name)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _launch(p, t, metas)
    torch.cuda.synchronize()
    assert np.array_equal(dev.cpu().numpy(), host)  # capturing ran nothing
    for step in range(3):
        # New inputs written in place into the captured buffers, then replay.
        arena = rng.integers(0, 256, size=host.size, dtype=np.uint8)
        acc = rng.integers(1, p.max_accepted + 1, size=len(p.src_col)).astype(np.int32)
        acc = np.where(p.src_col + acc - 1 < p.block_table.shape[1], acc, 1).astype(np.int32)
        dev.copy_(torch.from_numpy(arena))
        t["acc"].copy_(torch.from_numpy(acc))
        t["err"].zero_()
        graph.replay()
        torch.cuda.synchronize()
        ref = arena.copy()
        want = references.reference_state_copy(
            ref,
            metas,
            p.block_table,
            p.src_col,
            p.dst_col,
            acc,
            max_accepted=p.max_accepted,
            num_blocks=p.num_blocks,
            base=dev.data_ptr(),
        )
        assert t["err"].cpu().tolist() == want.tolist()
        assert np.array_equal(dev.cpu().numpy(), ref), f"replay {step}"


def test_launches_never_synchronise():
    rng, p, host, dev, metas, t = _graph_problem()
    rel = generators.random_segment_plan(rng, arena_size=host.size, max_bytes=8192)
    segs = generators.absolute_segments(rel, dev.data_ptr())
    tiles, starts = references.make_tiles(segs, tile_bytes=1024)
    segs_d, tiles_d = to_dev(segs), to_dev(tiles)
    for name in cuda.KERNEL_NAMES:
        cuda.get_kernel(name)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        _launch(p, t, metas)
        run_waves(segs_d, tiles_d, starts)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()


def test_launches_follow_the_callers_stream():
    # Work queued on a side stream before and after the launch sees it in order.
    rng, p, host, dev, metas, t = _graph_problem()
    src_host = rng.integers(0, 256, size=host.size, dtype=np.uint8)
    staged = torch.from_numpy(src_host).cuda()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(20_000_000)  # keep the side stream busy so a wrong stream would race
        dev.copy_(staged)
        _launch(p, t, metas)
        out = dev.clone()
    side.synchronize()
    ref = src_host.copy()
    references.reference_state_copy(
        ref,
        metas,
        p.block_table,
        p.src_col,
        p.dst_col,
        p.num_accepted,
        max_accepted=p.max_accepted,
        num_blocks=p.num_blocks,
        base=dev.data_ptr(),
    )
    assert np.array_equal(out.cpu().numpy(), ref)


@pytest.mark.parametrize("conv_layout", ["SD", "DS"])
def test_execute_plan_of_the_rust_planner(conv_layout):
    try:
        from recoverssm_rs import layouts
        from recoverssm_rs.planner import Planner
    except ImportError as exc:
        pytest.skip(f"planner unavailable: {exc}")
    rng = np.random.default_rng(31)
    nspec, R, cols = 3, 5, 6
    nb = R * cols + 2
    layout = layouts.gdn(
        num_k_heads=4,
        num_v_heads=8,
        head_k_dim=64,
        head_v_dim=64,
        conv_kernel_size=4,
        num_spec=nspec,
        conv_layout=conv_layout,
    )
    dtypes = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}
    sizes = [s.nbytes * nb for _ in range(3) for s in layout.persistent]
    offs = np.cumsum([0] + [(n + 255) // 256 * 256 for n in sizes])
    host = rng.integers(0, 256, size=int(offs[-1]), dtype=np.uint8)
    arena = torch.from_numpy(host.copy()).cuda()
    states, k = [], 0
    for _ in range(3):
        layer = []
        for s in layout.persistent:
            layer.append(arena[int(offs[k]) : int(offs[k]) + s.nbytes * nb].view(dtypes[s.dtype]).view(nb, *s.shape))
            k += 1
        states.append(layer)
    planner = Planner(layout, states)
    bt = rng.permutation(np.arange(1, nb, dtype=np.int32))[: R * cols].reshape(R, cols)
    acc = np.array([1, 2, 3, 4, 2], np.int32)
    src = np.array([0, 1, 2, 0, 3], np.int32)
    dst = np.array([1, 1, 5, 4, 3], np.int32)  # requests 1 and 4 shift in place
    plan = planner.plan_align(bt, src, dst, acc)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    plan.execute(stream=side)
    side.synchronize()
    ref = host.copy()
    references.reference_state_copy(
        ref, planner.state_meta, bt, src, dst, acc, max_accepted=nspec + 1, num_blocks=nb, base=arena.data_ptr()
    )
    assert np.array_equal(arena.cpu().numpy(), ref)


# ------------------------------------------------------------------------------------------------
# Planner's device path (launch_align / launch_align_decision) and CopyPlan.execute on CUDA,
# against the host plan run by the Rust host executor on CPU copies of the same bytes.
# ------------------------------------------------------------------------------------------------

_TORCH_DT = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def _planner_mod():
    try:
        from recoverssm_rs import layouts
        from recoverssm_rs.planner import Planner
    except ImportError as exc:  # pragma: no cover - the core is built in every supported setup
        pytest.skip(f"planner unavailable: {exc}")
    return layouts, Planner


def _gdn(conv_layout, nspec=3):
    layouts, _ = _planner_mod()
    return layouts.gdn(
        num_k_heads=4,
        num_v_heads=8,
        head_k_dim=64,
        head_v_dim=64,
        conv_kernel_size=4,
        num_spec=nspec,
        conv_layout=conv_layout,
    )


class _Pair:
    """The same random states twice: in one CUDA arena and in one CPU arena (same offsets), each
    bound to a planner. Comparing the whole arenas also catches writes outside the states."""

    def __init__(self, layout, nb, layers, seed):
        _, Planner = _planner_mod()
        rng = np.random.default_rng(seed)
        sizes = [s.nbytes * nb for _ in range(layers) for s in layout.persistent]
        self.offs = np.cumsum([0] + [(n + 255) // 256 * 256 + 256 for n in sizes])
        self.host = rng.integers(0, 256, size=int(self.offs[-1]), dtype=np.uint8)
        self.dev_arena = torch.from_numpy(self.host.copy()).cuda()
        self.cpu_arena = torch.from_numpy(self.host.copy())
        self.layout, self.nb, self.layers = layout, nb, layers
        self.dev = Planner(layout, self._carve(self.dev_arena))
        self.cpu = Planner(layout, self._carve(self.cpu_arena))

    def _carve(self, arena):
        states, k = [], 0
        for _ in range(self.layers):
            layer = []
            for s in self.layout.persistent:
                n = s.nbytes * self.nb
                layer.append(
                    arena[int(self.offs[k]) : int(self.offs[k]) + n].view(_TORCH_DT[s.dtype]).view(self.nb, *s.shape)
                )
                k += 1
            states.append(layer)
        return states

    def reset(self, rng):
        """New random bytes in both arenas."""
        fresh = rng.integers(0, 256, size=self.host.size, dtype=np.uint8)
        self.dev_arena.copy_(torch.from_numpy(fresh))
        self.cpu_arena.copy_(torch.from_numpy(fresh))

    def assert_equal(self):
        torch.cuda.synchronize()
        got, want = self.dev_arena.cpu().numpy(), self.cpu_arena.numpy()
        assert np.array_equal(got, want), f"{np.count_nonzero(got != want)} bytes differ"


def _dev(x, dtype=torch.int32):
    return torch.as_tensor(np.asarray(x)).to(dtype).cuda()


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("conv_layout", ["SD", "DS"])
@pytest.mark.parametrize("seed", range(4))
def test_launch_align_equals_the_host_plan(conv_layout, dtype, seed):
    rng = np.random.default_rng(9000 + seed)
    nspec, cols, R = 3, 6, int(rng.integers(1, 12))
    pair = _Pair(_gdn(conv_layout, nspec), R * cols + 3, 3, seed)
    bt, src, dst, acc = generators.owned_step(rng, R, cols, nspec + 1, pair.nb)
    pair.cpu.plan_align(bt, src, dst, acc).execute()
    pair.dev.launch_align(
        bt_dev(bt) if dtype == torch.int32 else _dev(bt, dtype), _dev(src, dtype), _dev(dst, dtype), _dev(acc, dtype)
    )
    assert pair.dev.last_error().ok
    pair.assert_equal()


@pytest.mark.parametrize("conv_layout", ["SD", "DS"])
@pytest.mark.parametrize("seed", range(4))
def test_launch_align_decision_equals_the_host_plan(conv_layout, seed):
    rng = np.random.default_rng(9100 + seed)
    nspec, cols, R = 3, 6, int(rng.integers(1, 12))
    bs = int(rng.choice([1, 2, 4, 16]))
    pair = _Pair(_gdn(conv_layout, nspec), R * cols + 3, 2, seed)
    bt = rng.permutation(np.arange(1, pair.nb, dtype=np.int32))[: R * cols].reshape(R, cols)
    src, running, acc = (np.zeros(R, np.int32) for _ in range(3))
    h_src, h_dst, h_acc = np.full(R, -1, np.int32), np.full(R, -1, np.int32), np.ones(R, np.int32)
    for r in range(R):
        while True:  # a running position / accepted count whose decision is valid for this row
            a = int(rng.integers(1, nspec + 2))
            run = int(rng.integers(0, cols * bs))
            s = max(0, (run - 1) // bs)
            dec = references.align_decision(run, a, bs)
            if dec is None or (dec[0] < cols and s + dec[1] - 1 < cols and (dec[0], dec[1]) != (s, 1)):
                break
        src[r], running[r], acc[r] = s, run, a
        if dec is not None:
            h_src[r], h_dst[r], h_acc[r] = s, dec[0], dec[1]
    pair.cpu.plan_align(bt, h_src, h_dst, h_acc).execute()
    pair.dev.launch_align_decision(_dev(bt), _dev(src, torch.int64), _dev(running), _dev(acc), bs)
    assert pair.dev.last_error().ok
    pair.assert_equal()


def test_launch_align_reports_invalid_requests():
    nspec, R, cols = 2, 4, 4
    pair = _Pair(_gdn("SD", nspec), R * cols + 1, 1, 5)
    bt = np.arange(1, R * cols + 1, dtype=np.int32).reshape(R, cols)
    src, dst = np.array([0, 0, 0, 1], np.int32), np.full(R, 3, np.int32)
    acc = np.array([2, 9, 1, 0], np.int32)  # requests 1 and 3 are invalid: skipped, reported
    ok = np.array([0, 2])
    pair.cpu.plan_align(bt[ok], src[ok], dst[ok], acc[ok]).execute()
    pair.dev.launch_align(_dev(bt), _dev(src), _dev(dst), _dev(acc))
    word = pair.dev.last_error()
    assert word.names == ["accepted"] and (word.first_request, word.last_request) == (1, 3)
    pair.assert_equal()
    err = torch.zeros(3, dtype=torch.int32, device="cuda")  # a caller-owned word
    pair.dev.launch_align(_dev(bt), _dev(src), _dev(dst), _dev(acc), err=err)
    assert cuda.decode_error_word(err.cpu(), R).names == ["accepted"]


def test_launch_align_is_one_launch_and_never_synchronises(monkeypatch):
    rng = np.random.default_rng(77)
    nspec, cols, R = 3, 6, 9
    pair = _Pair(_gdn("DS", nspec), R * cols + 3, 4, 77)
    bt, src, dst, acc = generators.owned_step(rng, R, cols, nspec + 1, pair.nb)
    pair.cpu.plan_align(bt, src, dst, acc).execute()
    inputs = [_dev(bt, torch.int64), _dev(src, torch.int64), _dev(dst), _dev(acc, torch.int64)]
    pair.dev.prepare_device()  # upload + compile outside the checked region
    launches = []
    from recoverssm_rs.cuda import module

    real = module.launch
    monkeypatch.setattr(module, "launch", lambda kl, *a: (launches.append(kl.kernel), real(kl, *a)))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        pair.dev.launch_align(*inputs)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert launches == ["rs_state_copy"]
    assert pair.dev.last_error().ok
    pair.assert_equal()


def test_launch_align_follows_the_given_stream():
    rng = np.random.default_rng(78)
    nspec, cols, R = 3, 6, 5
    pair = _Pair(_gdn("SD", nspec), R * cols + 3, 2, 78)
    bt, src, dst, acc = generators.owned_step(rng, R, cols, nspec + 1, pair.nb)
    inputs = [_dev(bt), _dev(src), _dev(dst), _dev(acc)]
    fresh = rng.integers(0, 256, size=pair.host.size, dtype=np.uint8)
    staged = torch.from_numpy(fresh).cuda()
    pair.dev.prepare_device()
    pair.cpu_arena.copy_(torch.from_numpy(fresh))
    pair.cpu.plan_align(bt, src, dst, acc).execute()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(20_000_000)  # a launch on the wrong stream would run before the copy below
        pair.dev_arena.copy_(staged)
    pair.dev.launch_align(*inputs, stream=side)
    with torch.cuda.stream(side):
        out = pair.dev_arena.clone()
    side.synchronize()
    assert np.array_equal(out.cpu().numpy(), pair.cpu_arena.numpy())


def test_launch_align_captures_in_a_cuda_graph_and_replays():
    rng = np.random.default_rng(79)
    nspec, cols, R = 3, 6, 7
    pair = _Pair(_gdn("DS", nspec), R * cols + 3, 3, 79)
    bt, src, dst, acc = generators.owned_step(rng, R, cols, nspec + 1, pair.nb)
    t_bt, t_src, t_dst, t_acc = _dev(bt), _dev(src), _dev(dst), _dev(acc)
    pair.dev.prepare_device()
    torch.cuda.synchronize()
    before = pair.dev_arena.cpu().numpy().copy()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        pair.dev.launch_align(t_bt, t_src, t_dst, t_acc)
    torch.cuda.synchronize()
    assert np.array_equal(pair.dev_arena.cpu().numpy(), before)  # capturing ran nothing
    for step in range(3):
        new_bt, new_src, new_dst, new_acc = generators.owned_step(rng, R, cols, nspec + 1, pair.nb)
        pair.reset(rng)
        for t, x in ((t_bt, new_bt), (t_src, new_src), (t_dst, new_dst), (t_acc, new_acc)):
            t.copy_(torch.from_numpy(np.ascontiguousarray(x)))
        pair.cpu.plan_align(new_bt, new_src, new_dst, new_acc).execute()
        graph.replay()
        assert pair.dev.last_error().ok, f"replay {step}"
        pair.assert_equal()
    # A replay with an invalid request flags it in the planner's word (zeroed by the graph itself).
    t_acc[0] = nspec + 5
    graph.replay()
    assert pair.dev.last_error().names == ["accepted"]


@pytest.mark.parametrize("conv_layout", ["SD", "DS"])
def test_copy_plan_execute_on_cuda_equals_the_host_executor(conv_layout):
    rng = np.random.default_rng(80)
    nspec, cols, R = 3, 6, 10
    pair = _Pair(_gdn(conv_layout, nspec), R * cols + 3, 3, 80)
    bt, src, dst, acc = generators.owned_step(rng, R, cols, nspec + 1, pair.nb)
    pair.cpu.plan_align(bt, src, dst, acc).execute()
    pair.dev.plan_align(bt, src, dst, acc).execute()
    pair.assert_equal()
    # Whole-block copies (forks / cache hits), including a chain that needs two waves.
    s_blocks = np.array([1, 2, 5, 9], np.int64)
    d_blocks = np.array([2, 3, 6, 10], np.int64)
    pair.cpu.plan_copy(s_blocks, d_blocks).execute()
    plan = pair.dev.plan_copy(s_blocks, d_blocks)
    assert plan.num_waves >= 2
    plan.execute()
    pair.assert_equal()
