"""No-GPU checks of the RecoverSSM commit kernel (kernels/recover_commit.cu, docs/design.md section 8).

* NVRTC compiles ``recover_commit.cu`` for sm_80 and sm_90 with CuPy's RawModule options; ptxas
  reports no spills, no stack frame (local memory), no barriers and registers for 3 CTAs of 256
  threads per SM. (The combined-module check of tests/cuda/test_kernels.py covers it too.)
* The same source, compiled as host C++ through tests/support/host_shim.h, runs over the whole grid on
  random problems -- GDN and KDA, every (state, key+gate) dtype pair the kernel takes, counts 0 .. Q,
  device counts, boundary rows, padding rows, several layers, SD / DS / no conv windows, misaligned
  bases, padded strides, natural / reversed / shuffled thread orders, folded grids -- and must
  match the torch reference (``recurrence.commit`` with boundary states + ``compact_conv_window``):
  recurrent states to 1e-5 (float32; one rounding step of a 16-bit state), everything else byte for
  byte, with no misaligned and no out-of-range access.
* End to end: a CPU ``StateCache`` verifies a window; the emulated kernel, driven by the cache's own
  table (:meth:`StateCache.commit_meta`) and commit plan, gives what ``StateCache.commit`` gives.
* vLLM's Kimi-K3 KDA RecoverSSM vector, committed by the emulated kernel.
"""

from __future__ import annotations

import ctypes
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from recoverssm_rs import BindingError, PlanError, cuda, layouts
from recoverssm_rs.backend_check import nvrtc_install_hint  # noqa: E402
from recoverssm_rs.cuda import nvrtc
from recoverssm_rs.plan_format import ABI, COMMIT_ROW_DTYPE, CONSTANTS
from recoverssm_rs.speculative import recurrence
from recoverssm_rs.speculative.state_cache import StateCache
from support import emulation, generators, references
from support.fakes import FakeDeviceArray, FakeStream, install_fake_cupy

DATA = Path(__file__).parents[1] / "data" / "kda_recoverssm.npz"
ORDERS = (0, 1, 12345)
needs_cxx = pytest.mark.skipif(
    shutil.which(emulation.HOST_CXX) is None, reason="no C++ compiler for the host emulation"
)
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


# ------------------------------------------------------------------------------------------------
# Records and sources
# ------------------------------------------------------------------------------------------------


def test_commit_records_match_the_kernel():
    meta, row = cuda.COMMIT_META_DTYPE, COMMIT_ROW_DTYPE
    assert (meta.itemsize, row.itemsize) == (128, 32)
    assert [meta.fields[f][1] for f in ("heads", "kg_width", "conv_layout", "conv_hist", "conv_elem")] == [
        80,
        96,
        112,
        124,
        126,
    ]
    assert [row.fields[f][1] for f in row.names] == [0, 4, 8, 16, 24, 28]
    text = (cuda.KERNEL_DIR / "rs_abi.cuh").read_text()
    assert "static_assert(sizeof(CommitMeta) == 128" in text and "static_assert(sizeof(CommitRow) == 32" in text
    assert "#define RS_OFFSET_CommitMeta_conv_hist 124\n" in text and "RS_CHECK_OFFSET(CommitMeta, conv_hist);" in text
    assert "recover_commit.cu" in cuda.KERNEL_FILES and "rs_recover_commit" in cuda.KERNEL_NAMES
    assert "RS_LAUNCH_BOUNDS rs_recover_commit(" in cuda.module_source()


# ------------------------------------------------------------------------------------------------
# NVRTC
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def commit_reports():
    if nvrtc.find_nvrtc() is None:
        pytest.skip(f"NVRTC not installed ({nvrtc_install_hint()})")
    return [
        nvrtc.nvrtc_compile("recover_commit.cu", arch, target="cubin", cache=nvrtc.default_cache_dir())
        for arch in nvrtc.ARCHS
    ]


def test_nvrtc_resources_of_the_commit_kernel(commit_reports):
    assert all(r.ok for r in commit_reports), [r.log for r in commit_reports if not r.ok]
    table = nvrtc.resource_table(commit_reports)
    print("\n" + table)
    ks = [k for r in commit_reports for k in r.kernels]
    assert sorted((k.kernel, k.arch) for k in ks) == [("rs_recover_commit", a) for a in nvrtc.ARCHS]
    for k in ks:
        assert k.clean and k.barriers == 0, table
        assert k.registers <= 85, table


# ------------------------------------------------------------------------------------------------
# Host emulation on random problems
# ------------------------------------------------------------------------------------------------


def _byte_span(x: torch.Tensor) -> tuple[int, int]:
    n = ((x.shape[0] - 1) * x.stride(0) + int(np.prod(x.shape[1:]))) * x.element_size() if x.shape[0] else 0
    return x.data_ptr(), x.data_ptr() + n


def run_problem(p: generators.CommitProblem, seed: int, *, order: int = 0, threads: int = 256, grid=None, grid_yz=None):
    """Emulated kernel vs torch reference on two copies of one arena; returns (before, emu, ref)."""
    before = torch.empty(p.arena_size, dtype=torch.uint8)
    p.fill(before, seed)
    emu, ref = before.clone(), before.clone()
    te, tr = p.tensors(emu), p.tensors(ref)
    kw = dict(num_blocks=p.num_blocks, max_requests=p.max_requests)
    err = emulation.emulate_recover_commit(
        te.meta(),
        p.rows,
        num_accepted=p.num_accepted,
        threads=threads,
        grid=grid,
        grid_yz=grid_yz,
        order=order,
        ranges=[emu.numpy()],
        **kw,
    )
    want = references.reference_recover_commit(tr, p.rows, p.num_accepted, **kw)
    assert err.tolist() == want.tolist()
    # Recurrent states: to the tolerance of their dtype; every other byte of the arena: exact.
    exact = torch.ones(p.arena_size, dtype=torch.bool)
    base = emu.data_ptr()
    for layer, (xe, xr) in enumerate(zip(te.recurrent, tr.recurrent)):
        tol = TOL[xe.dtype]
        if not torch.allclose(xe.float(), xr.float(), atol=tol, rtol=tol):
            d = (xe.float() - xr.float()).abs()
            raise AssertionError(
                f"layer {layer}: max |diff| {float(d.max())} at {np.unravel_index(int(d.argmax()), tuple(d.shape))}"
            )
        lo, hi = _byte_span(xe)
        exact[lo - base : hi - base] = False
    diff = (emu != ref) & exact
    assert not bool(diff.any()), f"{int(diff.sum())} bytes differ outside the recurrent states"
    # Blocks no row wrote (count 0, padding, rejected, unused) are untouched bit for bit.
    written = set()
    acc = None if p.num_accepted is None else p.num_accepted.astype(np.int64)
    for r in p.rows:
        if r["state_block"] <= 0 or references._commit_row_code(
            r, p.num_blocks, p.max_requests, None if acc is None else acc.size
        ):
            continue
        c = int(r["count"]) if acc is None else min(max(int(acc[r["count_index"]]), 0), int(r["count"]))
        if c > 0:
            written.add(int(r["state_block"]))
            if r["boundary_block"] >= 0 and 1 <= r["boundary_len"] <= c:
                written.add(int(r["boundary_block"]))
    for xe, x0 in zip(te.recurrent, p.tensors(before).recurrent):
        for b in range(p.num_blocks):
            if b not in written:
                assert torch.equal(xe[b], x0[b]), f"block {b} changed"
    return before, emu, ref


@needs_cxx
@pytest.mark.parametrize("seed", range(48))
def test_random_problems(seed):
    rng = np.random.default_rng(40_000 + seed)
    p = generators.random_commit_problem(rng)
    threads = (256, 64, 32, 128)[seed % 4]
    grid_yz = None if seed % 5 else (int(rng.integers(1, 3)), int(rng.integers(1, 3)))
    grid = None
    if seed % 3 == 2:  # more CTAs than needed: the extra recurrent / conv CTAs must be harmless
        g = cuda.commit_grid(p.tensors(torch.zeros(p.arena_size, dtype=torch.uint8)).meta(), threads=threads)
        grid = (g[0] + int(rng.integers(0, 3)), max(1, g[1] + int(rng.integers(-1, 4))))
    run_problem(p, seed, order=ORDERS[seed % 3], threads=threads, grid=grid, grid_yz=grid_yz)


@needs_cxx
@pytest.mark.parametrize("dtypes", cuda.COMMIT_DTYPE_PAIRS, ids=lambda d: "-".join(d))
@pytest.mark.parametrize("kind", ["gdn", "kda"])
@pytest.mark.parametrize("conv", ["SD", "DS"])
def test_every_kind_dtype_and_orientation(kind, dtypes, conv):
    for i in range(2):
        rng = np.random.default_rng(hash((kind, dtypes, conv, i)) % 2**32)
        p = generators.random_commit_problem(rng, kind=kind, dtypes=dtypes, conv=conv, device_counts=bool(i))
        run_problem(p, i, order=ORDERS[i % 3])


@needs_cxx
@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_realistic_head_vectorised(kind):
    """H=2 heads of 128 x 128 (float32 state, bfloat16 records), Q=8: matches the reference, and
    the state moves in 16-byte words -- a state 4 bytes off 16-byte alignment takes exactly 4x the
    state accesses (element by element), everything else unchanged (accesses counted by the shim)."""
    H, V, K, Q, MR, nb = 2, 128, 128, 8, 2, 6
    kgw = 2 * K if kind == "kda" else K + 1
    rows = np.zeros(2, dtype=COMMIT_ROW_DTYPE)
    rows[0] = (0, Q, 1, 4, 3, 0)
    rows[1] = (1, 5, 2, -1, 0, 0)
    accesses = []
    for shift in (0, 4):
        specs, off = [], 0
        for name, shape, dt in (
            ("recurrent", (nb, H, V, K), "float32"),
            ("corrections", (MR, H, Q, V), "float32"),
            ("keygate", (MR, H, Q, kgw), "bfloat16"),
            ("conv", (nb, 16, 3 + Q - 1), "bfloat16"),
            ("conv_window", (MR, 16, 3 + Q - 1), "bfloat16"),
        ):
            o = off + (shift if name == "recurrent" else 0)
            specs.append((name, 0, o, shape, dt, int(np.prod(shape[1:]))))
            off += (int(np.prod(shape)) * (4 if dt == "float32" else 2) + 16 + 255) // 256 * 256
        p = generators.CommitProblem(off, specs, kind, "DS", 4, nb, MR, rows, None)
        before, _, _ = run_problem(p, 3)
        t = p.tensors(before)
        stats = emulation.EmulationStats()
        emulation.emulate_recover_commit(
            t.meta(), rows, num_blocks=nb, max_requests=MR, stats=stats, ranges=[before.numpy()]
        )
        assert stats.misaligned == 0 and stats.out_of_range == 0
        accesses.append(stats.accesses)
    state_words = 2 * 2 * (H * V * K // 4) + H * V * K // 4  # 2 rows loaded + stored, 1 boundary store
    assert accesses[1] - accesses[0] == 3 * state_words, accesses


@needs_cxx
def test_count_zero_and_padding_rows_write_nothing():
    rng = np.random.default_rng(11)
    p = generators.random_commit_problem(
        rng, kind="kda", dtypes=("float32", "bfloat16"), conv="SD", device_counts=False
    )
    p.rows["count"] = 0
    p.rows["state_block"][::2] = -1
    before, emu, _ = run_problem(p, 1)
    assert torch.equal(before, emu)


@needs_cxx
def test_rejected_rows_are_reported_and_write_nothing():
    rng = np.random.default_rng(12)
    p = generators.random_commit_problem(
        rng, kind="gdn", dtypes=("float32", "float32"), conv="DS", device_counts=False, max_rows=3
    )
    nb, mr = p.num_blocks, p.max_requests
    assert mr >= 2
    rows = np.zeros(5, dtype=COMMIT_ROW_DTYPE)
    rows[0] = (mr, 1, 1, -1, 0, 0)  # request beyond the workspace
    rows[1] = (0, 1, nb, -1, 0, 0)  # state block beyond the pool
    rows[2] = (0, 1, 2, 2, 1, 0)  # boundary block == state block
    rows[3] = (0, 1, 3, 0, 1, 0)  # boundary block 0 (the null block)
    rows[4] = (0, 1, -1, 5, 1, 0)  # padding: silent
    p.rows = rows
    before, emu, _ = run_problem(p, 2)
    assert torch.equal(before, emu)
    t = p.tensors(emu)
    err = emulation.emulate_recover_commit(t.meta(), rows, num_blocks=nb, max_requests=mr, ranges=[emu.numpy()])
    word = cuda.decode_error_word(err, len(rows))
    assert set(word.names) == {"args", "block"} and (word.first_request, word.last_request) == (0, 3)
    # Device counts: a count index beyond the count vector is rejected too.
    row = np.zeros(1, dtype=COMMIT_ROW_DTYPE)
    row[0] = (0, 1, 1, -1, 0, mr - 1)
    err = emulation.emulate_recover_commit(
        t.meta(), row, num_blocks=nb, max_requests=mr, num_accepted=np.ones(mr - 1, np.int32), ranges=[emu.numpy()]
    )
    assert err.tolist() == [references.ERR_ARGS, 1, 1]
    assert torch.equal(before, emu)


@needs_cxx
def test_a_grid_too_small_for_a_layer_is_a_meta_error():
    for seed in range(20):
        p = generators.random_commit_problem(
            np.random.default_rng(seed),
            kind="kda",
            dtypes=("float32", "float32"),
            conv="SD",
            device_counts=False,
            max_rows=1,
        )
        if p.specs[0][3][1] >= 2:  # two heads or more: the recurrent part needs >= 2 CTAs
            break
    p.rows[0] = (0, 1, 1, -1, 0, 0)
    arena = torch.empty(p.arena_size, dtype=torch.uint8)
    p.fill(arena, 0)
    before = arena.clone()
    meta = p.tensors(arena).meta()
    g = cuda.commit_grid(meta)
    assert g[0] >= 2
    for grid in ((g[0], 0), (g[0] - 1, g[1])):
        err = emulation.emulate_recover_commit(
            meta, p.rows, num_blocks=p.num_blocks, max_requests=p.max_requests, grid=grid, ranges=[arena.numpy()]
        )
        assert err.tolist() == [references.ERR_META, 1, 1]
        assert torch.equal(arena, before)


@needs_cxx
def test_16_bit_conversions_match_torch():
    """Through the kernel itself: f16 -> f32 for every f16 pattern (a float32 state receiving
    k * u with u = 1), and f32 -> bf16 / f16 rounding (a 16-bit state receiving u * k with k = 1) for
    ties, subnormals, overflow and random values -- bit for bit against torch's conversions."""
    # f16 -> f32: GDN, H=64 heads x K=1024 channels = all 65536 patterns, V=1, Q=1, gate 0, u = 1.
    H, K = 64, 1024
    pats = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.float16).reshape(H, K)
    rec = torch.zeros(2, H, 1, K)
    corr = torch.ones(1, H, 1, 1)
    kg = torch.zeros(1, H, 1, K + 1, dtype=torch.float16)
    kg[0, :, 0, :K] = pats
    t = references.CommitTensors([rec], [corr], [kg], None, None, "gdn", "DS", 1)
    rows = np.zeros(1, dtype=COMMIT_ROW_DTYPE)
    rows[0] = (0, 1, 1, -1, 0, 0)
    emulation.emulate_recover_commit(
        t.meta(), rows, num_blocks=2, max_requests=1, ranges=[_byte_span(x) for x in t.all()]
    )
    want = pats.float()
    finite = ~torch.isnan(want)
    assert torch.equal(rec[1, :, 0][finite], want[finite])
    assert torch.isnan(rec[1, :, 0][~finite]).all()
    # f32 -> 16 bit: V values per head, K = 1.
    g = torch.Generator().manual_seed(0)
    for dt in (torch.float16, torch.bfloat16):
        f16 = torch.arange(0, 65536, 7, dtype=torch.int32).to(torch.int16).view(dt).float()
        f16 = f16[torch.isfinite(f16)]
        nxt = (f16.view(torch.int32) + (1 << 13 if dt == torch.float16 else 1 << 16)).view(torch.float32)
        ties = (f16.double() + nxt.double()) / 2  # halfway (where the f16 neighbour is exact)
        vals = torch.cat(
            [
                ties.float(),
                torch.randn(4000, generator=g) * 10.0 ** torch.randint(-9, 6, (4000,), generator=g),
                torch.tensor(
                    [65504.0, 65519.0, 65520.0, 1e6, -1e6, 2.0**-25, 2.0**-24, 3 * 2.0**-26, 5.96e-8, -0.0, 0.0]
                ),
            ]
        )
        vals = vals[torch.isfinite(vals)]
        V = vals.numel()
        rec = torch.zeros(2, 1, V, 1, dtype=dt)
        corr = vals.reshape(1, 1, 1, V).clone()
        kg = torch.zeros(1, 1, 1, 2, dtype=dt)
        kg[..., 0] = 1.0
        t = references.CommitTensors([rec], [corr], [kg], None, None, "gdn", "DS", 1)
        emulation.emulate_recover_commit(
            t.meta(), rows, num_blocks=2, max_requests=1, ranges=[_byte_span(x) for x in t.all()]
        )
        got = rec[1, 0, :, 0]
        want = vals.to(dt)
        bad = got.view(torch.int16) != want.view(torch.int16)
        zero = (got == 0) & (want == 0)  # -0 * 1 + 0 = +0: the commit's own sign of zero
        assert not bool((bad & ~zero).any()), (dt, vals[bad & ~zero][:8], got[bad & ~zero][:8], want[bad & ~zero][:8])


# ------------------------------------------------------------------------------------------------
# End to end with StateCache buffers
# ------------------------------------------------------------------------------------------------

H, K, KC, NSPEC = 2, 8, 4, 3
Q = NSPEC + 1


def make_cache(kind, conv_layout, dtype, ssm_dtype="float32", *, num_layers=2, num_blocks=24, max_requests=6):
    common = dict(
        conv_kernel_size=KC, num_spec=NSPEC, conv_layout=conv_layout, dtype=dtype, ssm_dtype=ssm_dtype, recover_ssm=True
    )
    if kind == "gdn":
        layout = layouts.gdn(num_k_heads=H, num_v_heads=H, head_k_dim=K, head_v_dim=K, **common)
    else:
        layout = layouts.kda(num_heads=H, head_dim=K, **common)
    cache = StateCache(layout, num_layers=num_layers, num_blocks=num_blocks, max_requests=max_requests)
    g = torch.Generator().manual_seed(0)
    bufs = cache.buffers()
    bufs["recurrent"].copy_(torch.randn(bufs["recurrent"].shape, generator=g) * 0.5)
    bufs["conv"].copy_(torch.randn(bufs["conv"].shape, generator=g))
    return cache


def verify_window(cache: StateCache, blocks, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    geo = cache.geometry
    h, k, v = int(geo["heads"]), int(geo["head_k_dim"]), int(geo["head_v_dim"])
    b = len(blocks)
    for layer in range(cache.num_layers):
        dim = int(geo["conv_dim"])
        cache.conv_verify(
            layer,
            blocks,
            torch.randn(b, Q, dim, generator=g).to(cache.conv_state(0).dtype),
            torch.randn(dim, cache.conv_kernel_size, generator=g),
        )
        gshape = (b, Q, h, k) if cache.kind == "kda" else (b, Q, h)
        prep = recurrence.prepare(
            cache.kind,
            torch.randn(b, Q, h, k, generator=g),
            torch.randn(b, Q, h, k, generator=g),
            torch.randn(gshape, generator=g),
            torch.randn(b, Q, h, generator=g),
            torch.rand(h, generator=g).log(),
            torch.rand((h, k) if cache.kind == "kda" else (h,), generator=g) - 2.0,
        )
        cache.verify(layer, blocks, prep.q_hat, prep.k_hat, torch.randn(b, Q, h, v, generator=g), prep.gate, prep.beta)


def emulate_on_cache(cache: StateCache, rows, num_accepted=None, order=0):
    ranges = [_byte_span(x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])) for x in cache.buffers().values()]
    return emulation.emulate_recover_commit(
        cache.commit_meta(),
        rows,
        num_blocks=cache.num_blocks,
        max_requests=cache.max_requests,
        num_accepted=num_accepted,
        order=order,
        ranges=ranges,
    )


def assert_caches_match(cache: StateCache, want: dict[str, torch.Tensor], before: dict[str, torch.Tensor]):
    for name, buf in cache.buffers().items():
        if name == "recurrent":
            tol = TOL[buf.dtype]
            torch.testing.assert_close(buf.float(), want[name].float(), atol=tol, rtol=tol)
            same = (want[name] == before[name]).flatten(2).all(-1)  # blocks the reference left alone
            assert torch.equal(buf[same], before[name][same])
        else:
            assert torch.equal(buf, want[name]), name


CACHE_CONFIGS = [
    ("gdn", "SD", "float32", "float32"),
    ("gdn", "DS", "bfloat16", "bfloat16"),
    ("kda", "DS", "bfloat16", "float32"),
    ("kda", "SD", "float16", "float32"),
]


@needs_cxx
@pytest.mark.parametrize("cfg", CACHE_CONFIGS, ids=["-".join(c) for c in CACHE_CONFIGS])
@pytest.mark.parametrize("align", [False, True])
def test_emulated_kernel_equals_state_cache_commit(cfg, align):
    cache = make_cache(*cfg)
    blocks = np.array([3, 7, -1, 12, 5, 9])
    n = np.array([0, 1, 2, Q, 3, Q])
    kw = {}
    if align:
        # Block size 8: r1 (15 + 1) crosses 16 after 1 token (column 1), r4 (7 + 3) and r5 (5 + 4)
        # cross 8 after 1 and 3 tokens (column 0); r0 would cross after 2 but commits nothing.
        free = [13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 1, 2, 4, 6, 8, 10, 11]
        kw = dict(seq_lens=np.array([6, 15, 0, 16, 7, 5]), block_size=8, block_table=np.array(free).reshape(6, 3))
    verify_window(cache, blocks, seed=1)
    before = {k: v.clone() for k, v in cache.buffers().items()}
    rows = cache.commit(n, blocks, **kw)  # the torch path (CPU)
    if align:
        assert sorted(rows["boundary_len"][rows["boundary_block"] >= 0].tolist()) == [1, 1, 3]
    want = {k: v.clone() for k, v in cache.buffers().items()}
    for k, v in cache.buffers().items():
        v.copy_(before[k])
    err = emulate_on_cache(cache, rows, order=2)
    assert err.tolist() == [0, 0, 0]
    assert_caches_match(cache, want, before)

    # Device counts: plan every request for its whole window, let the kernel clamp the counts.
    acc = np.array([0, 1, 9, -3, 3, 2], dtype=np.int32)
    for k, v in cache.buffers().items():
        v.copy_(before[k])
    cache.commit(acc, blocks, **kw)
    want = {k: v.clone() for k, v in cache.buffers().items()}
    for k, v in cache.buffers().items():
        v.copy_(before[k])
    caps = np.full(len(blocks), Q)
    rows = cache.plan_commit(caps, blocks, caps, **kw)
    err = emulate_on_cache(cache, rows, num_accepted=acc, order=1)
    assert err.tolist() == [0, 0, 0]
    assert_caches_match(cache, want, before)


@needs_cxx
def test_state_cache_kernel_dispatch_with_an_emulated_device(monkeypatch):
    """StateCache's CUDA path (binding, staging, device counts, launch_commit, error word) on CPU
    buffers: the "device" is the host emulation of the kernel."""
    from recoverssm_rs.cuda import module as cuda_module
    from support.device_fakes import bind_host_commit

    cfg = ("kda", "SD", "bfloat16", "float32")
    cache, ref = make_cache(*cfg), make_cache(*cfg)
    bind_host_commit(cache)
    monkeypatch.setattr(StateCache, "_is_device_tensor", staticmethod(lambda x: isinstance(x, torch.Tensor)))
    launches = []

    def fake_launch(kl, index, stream=None):
        v = dict(kl.values())
        acc = None
        if v["num_accepted"]:
            acc = np.frombuffer(ctypes.string_at(v["num_accepted"], 4 * v["num_counts"]), dtype=np.int32)
        launches.append((v["num_layers"], v["num_rows"], None if acc is None else acc.dtype))
        ranges = [_byte_span(x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])) for x in cache.buffers().values()]
        meta = cache._device_commit.meta_dev.numpy()
        spans = [(v["rows"], v["rows"] + 32 * v["num_rows"])]
        if acc is not None:
            spans.append((v["num_accepted"], v["num_accepted"] + 4 * v["num_counts"]))
        emulation.run(kl, order=12345, ranges=ranges + [meta] + spans).check(kl.kernel)

    monkeypatch.setattr(cuda_module, "launch", fake_launch)
    blocks = np.array([3, 7, -1, 12, 5, 9])
    free = [13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 1, 2, 4, 6, 8, 10, 11]
    kw = dict(seq_lens=np.array([6, 15, 0, 16, 7, 5]), block_size=8, block_table=np.array(free).reshape(6, 3))
    for step, acc in enumerate((np.array([0, 1, 2, Q, 3, Q]), np.array([2, 9, 1, -3, 3, 2]))):
        verify_window(ref, blocks, seed=step)
        for k, v in cache.buffers().items():  # the same bytes on both sides: only the commit differs
            v.copy_(ref.buffers()[k])
        before = {k: v.clone() for k, v in ref.buffers().items()}
        ref.commit(acc, blocks, **kw)
        if step == 0:
            rows = cache.commit(acc, blocks, **kw)  # host counts
            assert rows["count"].tolist() == [0, 1, Q, 3, Q]
        else:
            rows = cache.commit(torch.as_tensor(acc, dtype=torch.int64), blocks, **kw)  # "device" counts
            assert rows["count"].tolist() == [Q] * 5  # planned for the whole window
        assert_caches_match(cache, {k: v.clone() for k, v in ref.buffers().items()}, before)
        assert cache.commit_error().ok
    assert launches == [(2, 5, None), (2, 5, np.int32)]
    # launch_commit: rows already "on the device", one of them rejected (state block out of range).
    rows = cache.plan_commit(np.full(6, Q), blocks).copy()
    rows[1]["state_block"] = cache.num_blocks
    before = {k: v.clone() for k, v in cache.buffers().items()}
    cache.launch_commit(torch.from_numpy(rows.view(np.uint8).copy()), num_accepted=torch.zeros(6, dtype=torch.int32))
    word = cache.commit_error()
    assert (word.names, word.first_request, word.last_request) == (["block"], 1, 1)
    for k, v in cache.buffers().items():
        assert torch.equal(v, before[k]), k  # every count 0: nothing written
    # Device counts must cover every request, be integers and live with the cache.
    with pytest.raises(PlanError, match="one count per request"):
        cache.commit(torch.zeros(2, dtype=torch.int32), blocks)
    with pytest.raises(PlanError, match="num_accepted: expected an integer tensor, got torch.float32"):
        cache.commit(torch.zeros(6), blocks)
    with pytest.raises(PlanError, match="num_accepted is on meta, the cache on cpu"):
        cache.commit(torch.zeros(6, dtype=torch.int32, device="meta"), blocks)
    # launch_commit's rows and counts are checked by the core before anything is queued.
    raw = torch.from_numpy(rows.view(np.uint8).copy())
    n_launches = len(launches)
    with pytest.raises(PlanError, match="rows: expected at least 7 commit rows"):
        cache.launch_commit(raw, 7)
    with pytest.raises(PlanError, match="rows: expected a contiguous tensor"):
        cache.launch_commit(raw.view(-1, 32)[:, :16], 1)
    with pytest.raises(PlanError, match="num_accepted is on meta, the cache on cpu"):
        cache.launch_commit(raw, num_accepted=torch.zeros(6, dtype=torch.int32, device="meta"))
    assert len(launches) == n_launches


class _Counted:
    """Forwards to a core object, counting each call into it; core objects given as arguments are
    passed on unwrapped (what the core then calls on them is not a crossing)."""

    def __init__(self, inner, calls: list[str], name: str):
        self._inner, self._calls, self._name = inner, calls, name

    def __getattr__(self, attr):
        value = getattr(self._inner, attr)
        if not callable(value) or isinstance(value, type):
            return value

        def call(*args, **kwargs):
            self._calls.append(f"{self._name}.{attr}")
            args = tuple(a._inner if isinstance(a, _Counted) else a for a in args)
            return value(*args, **kwargs)

        return call


@needs_cxx
def test_a_device_commit_is_one_core_call_and_one_launch(monkeypatch):
    """StateCache.commit on the CUDA path (the kernel emulated over CPU buffers) crosses into the
    core once and launches once, host or device counts, align mode or not; a refused plan crosses
    once, launches nothing and writes nothing."""
    from recoverssm_rs.cuda import commit as cuda_commit
    from recoverssm_rs.cuda import module as cuda_module
    from recoverssm_rs.speculative import state_cache as state_cache_module
    from support.device_fakes import bind_host_commit

    cfg = ("gdn", "DS", "float32", "float32")
    cache, ref = make_cache(*cfg), make_cache(*cfg)
    kernel = bind_host_commit(cache)
    calls: list[str] = []
    launches: list[int] = []
    kernel.launcher = _Counted(kernel.launcher, calls, "CommitLaunch")
    cache.commit_planner = _Counted(cache.commit_planner, calls, "CommitPlanner")
    cache._bound = _Counted(cache._bound, calls, "BoundTensors")
    for mod in (state_cache_module, cuda_commit):
        monkeypatch.setattr(mod, "_core", _Counted(mod._core, calls, "_core"))
    monkeypatch.setattr(StateCache, "_is_device_tensor", staticmethod(lambda x: isinstance(x, torch.Tensor)))

    def fake_launch(kl, index, stream=None):
        launches.append(dict(kl.values())["num_rows"])
        emulation.run(kl).check(kl.kernel)

    monkeypatch.setattr(cuda_module, "launch", fake_launch)
    blocks = np.array([3, 7, -1, 12, 5, 9])
    free = [13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 1, 2, 4, 6, 8, 10, 11]
    align = dict(seq_lens=np.array([6, 15, 0, 16, 7, 5]), block_size=8, block_table=np.array(free).reshape(6, 3))
    acc = np.array([0, 1, 2, Q, 3, Q])
    for step, (counts, kw) in enumerate(
        [(acc, {}), (acc, align), (torch.as_tensor(acc), align), (torch.as_tensor(acc, dtype=torch.int32), {})]
    ):
        verify_window(ref, blocks, seed=step)
        for k, v in cache.buffers().items():
            v.copy_(ref.buffers()[k])
        before = {k: v.clone() for k, v in ref.buffers().items()}
        want_rows = ref.commit(acc, blocks, **kw)
        calls.clear()
        launches.clear()
        rows = cache.commit(counts, blocks, **kw)
        assert calls == ["CommitLaunch.commit"], step
        assert launches == [5], step
        if isinstance(counts, np.ndarray):
            assert rows.tobytes() == want_rows.tobytes()
        else:
            assert rows["count"].tolist() == [Q] * 5  # planned for the whole window
        assert_caches_match(cache, {k: v.clone() for k, v in ref.buffers().items()}, before)
        assert cache.commit_error().ok
    # Refused: the same errors as a host plan, one crossing, no launch, nothing written.
    before = {k: v.clone() for k, v in cache.buffers().items()}
    launches.clear()
    bad = blocks.copy()
    bad[4] = 3
    for args, match in [
        ((acc, bad), "requests 0 and 4 both use state block 3"),
        ((None, blocks), "num_accepted must be an int32 or int64 array"),
        ((torch.zeros(2, dtype=torch.int32), blocks), "one count per request"),
        ((torch.zeros(6), blocks), "num_accepted: expected an integer tensor, got torch.float32"),
        ((torch.zeros(6, dtype=torch.int32, device="meta"), blocks), "num_accepted is on meta, the cache on cpu"),
    ]:
        calls.clear()
        with pytest.raises(PlanError, match=match):
            cache.commit(*args)
        assert calls == ["CommitLaunch.commit"]
    assert launches == []
    for k, v in cache.buffers().items():
        assert torch.equal(v, before[k]), k
    # No rows: one crossing, no launch.
    calls.clear()
    assert len(cache.commit(np.zeros(6, dtype=np.int64), np.full(6, -1))) == 0
    assert calls == ["CommitLaunch.commit"] and launches == []


def test_commit_meta_of_a_cache():
    cache = make_cache("kda", "DS", "bfloat16")
    m = cache.commit_meta()
    assert len(m) == cache.num_layers
    assert (m["heads"].tolist(), m["head_v"][0], m["head_k"][0], m["window"][0], m["kg_width"][0]) == (
        [H, H],
        K,
        K,
        Q,
        2 * K,
    )
    assert (m["kind"][0], m["state_dtype"][0], m["kg_dtype"][0]) == (
        CONSTANTS["RS_RC_KDA"],
        CONSTANTS["RS_DT_F32"],
        CONSTANTS["RS_DT_BF16"],
    )
    assert (m["conv_layout"][0], m["conv_hist"][0], m["conv_elem"][0]) == (cuda.KIND_CONV_DS, KC - 1, 2)
    assert m["rec_base"][1] - m["rec_base"][0] == cache.recurrent_state(0).nbytes
    assert m["rec_block_stride"][0] == cache.recurrent_state(0)[0].nbytes
    assert m["win_row_stride"][0] == cache.buffers()["conv_window"][0, 0].nbytes
    # An unsupported (state, record) pair and bad shapes are refused at bind time.
    rec = torch.zeros(3, 2, 4, 4, dtype=torch.bfloat16)
    corr = torch.zeros(2, 2, 3, 4)
    with pytest.raises(BindingError, match="dtypes"):
        cuda.build_commit_meta([rec], [corr], [torch.zeros(2, 2, 3, 8)], kind="kda")
    with pytest.raises(BindingError, match="2K"):
        cuda.build_commit_meta([rec.float()], [corr], [torch.zeros(2, 2, 3, 5)], kind="kda")
    with pytest.raises(BindingError, match="dense"):
        cuda.build_commit_meta([rec.float().transpose(2, 3)], [corr], [torch.zeros(2, 2, 3, 8)], kind="kda")
    with pytest.raises(BindingError, match="width"):
        cuda.build_commit_meta(
            [rec.float()],
            [corr],
            [torch.zeros(2, 2, 3, 8)],
            [torch.zeros(3, 5, 6)],
            [torch.zeros(2, 5, 6)],
            kind="kda",
            conv_layout="DS",
            conv_kernel_size=4,
        )
    # The core also refuses read-only destinations and misaligned addresses, naming the layer.
    frozen = np.zeros((3, 2, 4, 4), np.float32)
    frozen.flags.writeable = False
    with pytest.raises(BindingError, match="layer 0: recurrent: the commit writes it"):
        cuda.build_commit_meta([frozen], [corr], [torch.zeros(2, 2, 3, 8)], kind="kda")
    odd = np.zeros(3 * 2 * 4 * 4 * 4 + 2, np.uint8)[2:].view(np.float32).reshape(3, 2, 4, 4)
    with pytest.raises(BindingError, match="layer 0: recurrent: address .* multiples of the 4-byte element"):
        cuda.build_commit_meta([odd], [corr], [torch.zeros(2, 2, 3, 8)], kind="kda")
    with pytest.raises(
        BindingError, match="layer 0: conv: expected a CUDA tensor, a CuPy array or a host array, got NoneType"
    ):
        cuda.build_commit_meta([rec.float()], [corr], [torch.zeros(2, 2, 3, 8)], [None], [None], kind="kda")
    with pytest.raises(BindingError, match="conv_kernel_size = 1180591620717411303424 is too large"):
        cuda.build_commit_meta([rec.float()], [corr], [torch.zeros(2, 2, 3, 8)], kind="kda", conv_kernel_size=2**70)
    with pytest.raises(BindingError, match="kind: expected 'gdn' or 'kda'"):
        cuda.build_commit_meta([rec.float()], [corr], [torch.zeros(2, 2, 3, 8)], kind="mamba")
    # CPU caches keep the torch path (no kernel bound).
    assert cache._device_commit is None and cache.commit_error() is None


@needs_cxx
@pytest.mark.parametrize("n", range(5))
def test_kda_vector_through_the_emulated_kernel(n):
    with np.load(DATA) as d:
        f = {k.split("_", 1)[1]: torch.from_numpy(d[k]) for k in d.files if k.startswith(f"accepted{n}_")}
        Qv = int(d["Q"])
    Hh, V, Kk = f["S0"].shape
    prep = recurrence.prepare_kda(f["q"], f["k"], f["raw_g"], f["raw_beta"], f["A_log"], f["dt_bias"])
    rec = torch.zeros(3, Hh, V, Kk)
    rec[2] = f["S0"]
    corr = torch.zeros(1, Hh, Qv, V)
    kg = torch.zeros(1, Hh, Qv, 2 * Kk)
    recurrence.verify(
        rec[2:3],
        *(x.unsqueeze(0) for x in (prep.q_hat, prep.k_hat)),
        f["v"].unsqueeze(0),
        prep.gate.unsqueeze(0),
        prep.beta.unsqueeze(0),
        corr,
        kg,
    )
    win = f["conv_window"].unsqueeze(0).contiguous()  # [1, dim, W] DS
    conv = torch.full((3, *win.shape[1:]), 7.0)
    conv[2] = -1.0
    kconv = win.shape[2] - (Qv - 1) + 1
    t = references.CommitTensors([rec], [corr], [kg], [conv], [win], "kda", "DS", kconv)
    rows = np.zeros(1, dtype=COMMIT_ROW_DTYPE)
    rows[0] = (0, n, 2, -1, 0, 0)
    err = emulation.emulate_recover_commit(
        t.meta(), rows, num_blocks=3, max_requests=1, ranges=[_byte_span(x) for x in t.all()]
    )
    assert err.tolist() == [0, 0, 0]
    torch.testing.assert_close(rec[2], f["S_committed"], atol=1e-5, rtol=1e-5)
    if n == 0:
        assert torch.equal(rec[2], f["S0"]) and torch.equal(conv[2], torch.full_like(conv[2], -1.0))
    else:
        assert torch.equal(conv[2], f["conv_committed"])
    assert torch.equal(rec[:2], torch.zeros_like(rec[:2])) and torch.equal(conv[:2], torch.full_like(conv[:2], 7.0))


# ------------------------------------------------------------------------------------------------
# The launch layer without a GPU
# ------------------------------------------------------------------------------------------------


def _fake_table(heads: int, head_v: int, head_k: int, layers: int) -> np.ndarray:
    meta = np.zeros(layers, dtype=cuda.COMMIT_META_DTYPE)
    meta["heads"], meta["head_v"], meta["head_k"] = heads, head_v, head_k
    return meta


def test_launch_layer_with_a_fake_cupy(monkeypatch):
    calls = install_fake_cupy(monkeypatch).calls
    acc = FakeDeviceArray(0x7000, (9,))
    err = FakeDeviceArray(0x8000, (3,))
    rows = FakeDeviceArray(0x2000, (100000 * 32,), dtype="uint8")
    big = _fake_table(6, 64, 128, 70000)  # 6 heads of 64 value rows: 6 recurrent CTAs per (layer, row)
    small = _fake_table(6, 64, 128, 3)
    cuda.launch_recover_commit(
        0x1000, big, rows, 100000, num_blocks=1 << 40, max_requests=9, num_accepted=acc, err=err, stream=FakeStream()
    )
    cuda.launch_recover_commit(0x1000, small, rows, 5, num_blocks=10, max_requests=9, stream=FakeStream())
    cuda.launch_recover_commit(0x1000, small, rows, 0, num_blocks=10, max_requests=9, stream=FakeStream())
    (n1, g1, b1, a1, _), (n2, g2, _, a2, _) = calls
    assert (n1, g1, b1) == ("rs_recover_commit", (6, 65535, 65535), (256, 1, 1))
    names = [f for f, _ in next(k for k in ABI["kernels"] if k["name"] == "rs_recover_commit")["params"]]
    v1, v2 = dict(zip(names, a1, strict=True)), dict(zip(names, a2, strict=True))
    order = "metas num_layers rows num_rows num_accepted num_counts num_blocks max_requests rec_ctas err".split()
    assert [v1[n] for n in order] == [0x1000, 70000, 0x2000, 100000, 0x7000, 9, 1 << 40, 9, 6, 0x8000]
    assert g2 == (6, 5, 3) and (v2["num_accepted"], v2["num_counts"], v2["err"]) == (0, 0, 0)
    with pytest.raises(PlanError, match="num_accepted: expected int32, got int64"):
        cuda.launch_recover_commit(
            0x1000,
            small,
            rows,
            5,
            num_blocks=10,
            max_requests=9,
            num_accepted=FakeDeviceArray(0x7000, (9,), dtype="int64"),
            stream=FakeStream(),
        )
    with pytest.raises(PlanError, match="at least 100001 commit rows"):
        cuda.launch_recover_commit(0x1000, small, rows, 100001, num_blocks=10, max_requests=9, stream=FakeStream())
    assert len(calls) == 2


def test_commit_grid():
    cache = make_cache("kda", "DS", "bfloat16")
    g = cuda.commit_grid(cache.commit_meta())
    # K = 8: 2 groups of 4 channels per row, 128 rows of 8 per CTA -> one value tile per head.
    assert g == (H, 1)
    big = cache.commit_meta()
    big["head_v"], big["head_k"], big["heads"] = 128, 128, 32
    big["conv_width"], big["conv_dim"], big["conv_elem"] = 10, 12288, 2
    g = cuda.commit_grid(big)
    assert g == (32 * 2, -(-10 * 12288 * 2 // CONSTANTS["COMMIT_CONV_CHUNK_BYTES"]))


def test_commit_benchmark_counts_the_bytes_the_kernel_moves():
    import importlib.util

    spec = importlib.util.spec_from_file_location("commit_gpu", Path(__file__).parents[2] / "benches" / "commit_gpu.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    cache = make_cache("kda", "DS", "bfloat16")
    meta = cache.commit_meta()
    m = meta[0]
    state = int(m["heads"]) * int(m["head_v"]) * int(m["head_k"]) * 4  # float32 state
    per_token = int(m["heads"]) * (int(m["head_v"]) * 4 + int(m["kg_width"]) * 2)  # bf16 records
    conv = int(m["conv_width"]) * int(m["conv_dim"]) * int(m["conv_elem"])
    counts = [0, 2, 99]  # 0 moves nothing; a count past the window folds the window
    want = meta.nbytes + 3 * 32 + len(meta) * (2 * (2 * state + 2 * conv) + (2 + int(m["window"])) * per_token)
    assert bench.commit_bytes(meta, counts) == want
