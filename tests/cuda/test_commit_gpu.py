"""Real-GPU tests of the RecoverSSM commit kernel (``rs_recover_commit``), skipped without CUDA + CuPy.

Run on a machine with a GPU: ``python -m pytest tests/cuda/test_commit_gpu.py -q -m gpu -s``.

* A CUDA ``StateCache`` commits through the kernel; a CPU ``StateCache`` holding the same bytes
  commits through the torch reference: the results agree (recurrent states to 1e-5 / one 16-bit
  rounding step, conv windows and workspaces bit for bit, untouched blocks bit for bit), with host
  counts, device counts (``num_accepted`` a CUDA tensor the host never reads) and align-mode
  boundaries.
* Random problems of ``tests/support/generators.random_commit_problem`` (misaligned bases, padded strides, every
  dtype pair, both conv orientations) on a CUDA arena against the torch reference.
* The launch is captured in a CUDA graph and replayed with rows / counts rewritten in place.
* ``torch.cuda.set_sync_debug_mode("error")`` around ``StateCache.commit``: no synchronisation.
* A Kimi-K3-sized commit (32 heads x 128 x 128 fp32 state, Q = 8) is timed and its effective
  bandwidth printed.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
cupy = pytest.importorskip("cupy")

from recoverssm_rs import cuda, layouts  # noqa: E402
from recoverssm_rs.plan_format import COMMIT_ROW_DTYPE  # noqa: E402
from recoverssm_rs.speculative import recurrence  # noqa: E402
from recoverssm_rs.speculative.state_cache import StateCache  # noqa: E402
from support import generators, references  # noqa: E402

# Skipped without a CUDA device by tests/conftest.py.
pytestmark = pytest.mark.gpu

TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}
H, K, KC, NSPEC = 2, 16, 4, 3
Q = NSPEC + 1
CONFIGS = [
    ("gdn", "SD", "float32", "float32"),
    ("gdn", "DS", "bfloat16", "bfloat16"),
    ("kda", "DS", "bfloat16", "float32"),
    ("kda", "SD", "float16", "float32"),
    ("kda", "SD", "float32", "float32"),
]
IDS = ["-".join(c) for c in CONFIGS]


def make_layout(kind, conv_layout, dtype, ssm_dtype, heads=H, dim=K, num_spec=NSPEC):
    common = dict(
        conv_kernel_size=KC,
        num_spec=num_spec,
        conv_layout=conv_layout,
        dtype=dtype,
        ssm_dtype=ssm_dtype,
        recover_ssm=True,
    )
    if kind == "gdn":
        return layouts.gdn(num_k_heads=heads, num_v_heads=heads, head_k_dim=dim, head_v_dim=dim, **common)
    return layouts.kda(num_heads=heads, head_dim=dim, **common)


def cache_pair(cfg, *, num_layers=3, num_blocks=24, max_requests=6):
    """A CPU and a CUDA cache of one layout, holding the same random bytes."""
    layout = make_layout(*cfg)
    kw = dict(num_layers=num_layers, num_blocks=num_blocks, max_requests=max_requests)
    cpu = StateCache(layout, **kw)
    dev = StateCache(layout, device="cuda", **kw)
    g = torch.Generator().manual_seed(0)
    b = cpu.buffers()
    b["recurrent"].copy_(torch.randn(b["recurrent"].shape, generator=g) * 0.5)
    b["conv"].copy_(torch.randn(b["conv"].shape, generator=g))
    return cpu, dev


def verify_window(cache: StateCache, blocks, seed: int) -> None:
    """conv_verify + verify of every layer with random inputs (on the cache's device)."""
    g = torch.Generator().manual_seed(seed)
    geo = cache.geometry
    h, k, v, dim = int(geo["heads"]), int(geo["head_k_dim"]), int(geo["head_v_dim"]), int(geo["conv_dim"])
    b = len(blocks)
    d = cache.device
    for layer in range(cache.num_layers):
        cache.conv_verify(
            layer,
            blocks,
            torch.randn(b, Q, dim, generator=g).to(d, cache.conv_state(0).dtype),
            torch.randn(dim, cache.conv_kernel_size, generator=g).to(d),
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
        cache.verify(
            layer,
            blocks,
            *(x.to(d) for x in (prep.q_hat, prep.k_hat)),
            torch.randn(b, Q, h, v, generator=g).to(d),
            prep.gate.to(d),
            prep.beta.to(d),
        )


def sync_from(cpu: StateCache, dev: StateCache) -> None:
    for name, buf in dev.buffers().items():
        buf.copy_(cpu.buffers()[name])
    torch.cuda.synchronize()


def assert_same(cpu: StateCache, dev: StateCache, before: dict) -> None:
    torch.cuda.synchronize()
    for name, want in cpu.buffers().items():
        got = dev.buffers()[name].cpu()
        if name == "recurrent":
            tol = TOL[got.dtype]
            torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)
            same = (want == before[name]).flatten(2).all(-1)  # blocks the reference did not write
            assert torch.equal(got[same], before[name][same]), "an unwritten block changed"
        else:
            assert torch.equal(got, want), name


BLOCKS = np.array([3, 7, -1, 12, 5, 9])
ALIGN = dict(
    seq_lens=np.array([6, 15, 0, 16, 7, 5]),
    block_size=8,
    block_table=np.array([13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 1, 2, 4, 6, 8, 10, 11]).reshape(6, 3),
)


@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
@pytest.mark.parametrize("align", [False, True])
def test_state_cache_kernel_commit_equals_the_cpu_torch_path(cfg, align):
    cpu, dev = cache_pair(cfg)
    kw = ALIGN if align else {}
    for step, n in enumerate((np.array([0, 1, 2, Q, 3, Q]), np.array([Q, 2, 1, 0, 1, 3]))):
        verify_window(cpu, BLOCKS, seed=step)
        sync_from(cpu, dev)  # the same records on both sides: only the commit differs
        before = {k: v.clone() for k, v in cpu.buffers().items()}
        rows_cpu = cpu.commit(n, BLOCKS, **kw)
        rows_dev = dev.commit(n, BLOCKS, **kw)
        assert rows_cpu.tobytes() == rows_dev.tobytes()
        assert dev._device_commit is not None and dev._device_commit.ready, "the kernel did not run"
        assert_same(cpu, dev, before)
        assert dev.commit_error().ok


@pytest.mark.parametrize("cfg", CONFIGS[:3], ids=IDS[:3])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_device_counts_are_never_read_by_the_host(cfg, dtype):
    cpu, dev = cache_pair(cfg)
    acc = np.array([0, 1, 9, -3, 3, 2], dtype=np.int32)  # clamped on the device; r5 stops short of its boundary
    verify_window(cpu, BLOCKS, seed=5)
    sync_from(cpu, dev)
    before = {k: v.clone() for k, v in cpu.buffers().items()}
    cpu.commit(acc, BLOCKS, **ALIGN)
    rows = dev.commit(torch.as_tensor(acc, dtype=dtype, device="cuda"), BLOCKS, **ALIGN)
    assert rows["count"].tolist() == [Q] * len(rows)  # planned for the whole window
    assert_same(cpu, dev, before)


@pytest.mark.parametrize("seed", range(16))
def test_random_problems_on_the_device(seed):
    rng = np.random.default_rng(50_000 + seed)
    p = generators.random_commit_problem(rng, max_rows=8)
    host = torch.empty(p.arena_size, dtype=torch.uint8)
    p.fill(host, seed)
    arena = host.cuda()
    ref = host.clone()
    meta = p.tensors(arena).meta()
    err = torch.zeros(3, dtype=torch.int32, device="cuda")
    acc = None if p.num_accepted is None else torch.from_numpy(p.num_accepted).to(torch.int32).cuda()
    cuda.launch_recover_commit(
        torch.from_numpy(meta.view(np.uint8).copy()).cuda(),
        meta,
        torch.from_numpy(p.rows.view(np.uint8).copy()).cuda(),
        len(p.rows),
        num_blocks=p.num_blocks,
        max_requests=p.max_requests,
        num_accepted=acc,
        err=err,
    )
    torch.cuda.synchronize()
    want = references.reference_recover_commit(
        p.tensors(ref), p.rows, p.num_accepted, num_blocks=p.num_blocks, max_requests=p.max_requests
    )
    assert err.cpu().tolist() == want.tolist()
    got = arena.cpu()
    exact = torch.ones(p.arena_size, dtype=torch.bool)
    tg, tr = p.tensors(got), p.tensors(ref)
    for xg, xr in zip(tg.recurrent, tr.recurrent):
        tol = TOL[xg.dtype]
        torch.testing.assert_close(xg.float(), xr.float(), atol=tol, rtol=tol)
        lo = xg.data_ptr() - got.data_ptr()
        n = ((xg.shape[0] - 1) * xg.stride(0) + int(np.prod(xg.shape[1:]))) * xg.element_size()
        exact[lo : lo + n] = False
    assert not bool(((got != ref) & exact).any())


def _padded_rows(rows: np.ndarray, n: int) -> torch.Tensor:
    out = np.zeros(n, dtype=COMMIT_ROW_DTYPE)
    out["state_block"] = -1  # padding
    out["boundary_block"] = -1
    out[: len(rows)] = rows
    return torch.from_numpy(out.view(np.uint8).copy())


def test_commit_launch_captures_in_a_cuda_graph_and_replays():
    cfg = CONFIGS[2]
    cpu, dev = cache_pair(cfg)
    mr = dev.max_requests
    rows_dev = _padded_rows(np.zeros(0, dtype=COMMIT_ROW_DTYPE), mr).cuda()
    acc_dev = torch.zeros(mr, dtype=torch.int32, device="cuda")
    cuda.get_kernel("rs_recover_commit")  # compile + load outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dev.launch_commit(rows_dev, mr, num_accepted=acc_dev)
    torch.cuda.synchronize()
    rng = np.random.default_rng(3)
    for step in range(3):
        verify_window(cpu, BLOCKS, seed=10 + step)
        sync_from(cpu, dev)
        before = {k: v.clone() for k, v in cpu.buffers().items()}
        acc = rng.integers(-1, Q + 2, size=len(BLOCKS)).astype(np.int32)
        caps = np.full(len(BLOCKS), Q)
        rows = cpu.plan_commit(caps, BLOCKS, caps, **ALIGN)  # the host plans blocks only
        rows_dev.copy_(_padded_rows(rows, mr))
        acc_dev[: len(acc)].copy_(torch.from_numpy(acc))
        graph.replay()
        cpu.commit(acc, BLOCKS, **ALIGN)
        assert_same(cpu, dev, before)
        assert dev.commit_error().ok, f"replay {step}"


def test_commit_never_synchronises():
    cfg = CONFIGS[0]
    cpu, dev = cache_pair(cfg)
    verify_window(cpu, BLOCKS, seed=20)
    sync_from(cpu, dev)
    dev.commit(np.zeros(len(BLOCKS), np.int64), BLOCKS, **ALIGN)  # warm-up: module, pinned pool
    acc_dev = torch.tensor([1, 2, 3, 4, 0, 2], dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        dev.commit(np.array([1, 2, 3, Q, 0, 2]), BLOCKS, **ALIGN)
        dev.commit(acc_dev, BLOCKS, **ALIGN)
        dev.launch_commit(dev._device_commit.rows_dev, 2, num_accepted=acc_dev)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()


def test_commit_follows_the_callers_stream():
    cfg = CONFIGS[0]
    cpu, dev = cache_pair(cfg)
    verify_window(cpu, BLOCKS, seed=30)
    staged = {k: v.cuda() for k, v in cpu.buffers().items()}
    before = {k: v.clone() for k, v in cpu.buffers().items()}
    n = np.array([1, 2, 3, Q, 0, 2])
    cpu.commit(n, BLOCKS)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(20_000_000)  # keep the side stream busy: a launch on another stream would race
        for name, buf in dev.buffers().items():
            buf.copy_(staged[name])
        dev.commit(n, BLOCKS)
    side.synchronize()
    assert_same(cpu, dev, before)


def test_kimi_k3_sized_commit_bandwidth():
    """32 heads x 128 x 128 fp32 states, bf16 records, Q = 8, 8 layers x 64 requests, all accepted;
    prints the effective bandwidth (bytes of states read + written, records and conv windows read and
    written, over the kernel time). Correctness of one layer is checked against the torch path."""
    layout = layouts.kda(
        num_heads=32,
        head_dim=128,
        conv_kernel_size=4,
        num_spec=7,
        conv_layout="DS",
        dtype="bfloat16",
        ssm_dtype="float32",
        recover_ssm=True,
    )
    L, R = 8, 64
    dev = StateCache(layout, num_layers=L, num_blocks=R + 2, max_requests=R, device="cuda")
    b = dev.buffers()
    g = torch.Generator(device="cuda").manual_seed(0)
    b["recurrent"].normal_(0, 0.5, generator=g)
    b["corrections"].normal_(0, 1, generator=g)
    kg = b["keygate"]
    kg[..., :128].normal_(0, 128**-0.5, generator=g)
    kg[..., 128:].uniform_(-3, 0, generator=g)
    b["conv_window"].normal_(0, 1, generator=g)
    blocks = np.arange(1, R + 1)
    n = np.full(R, 8)
    s0 = b["recurrent"][0, 1 : R + 1].clone()
    dev.commit(np.zeros(R, np.int64), blocks)  # warm-up (count 0: nothing changes)
    dev.commit(n, blocks)
    torch.cuda.synchronize()
    want = recurrence.commit(s0, b["corrections"][0, :R], b["keygate"][0, :R], 8)
    torch.testing.assert_close(b["recurrent"][0, 1 : R + 1], want, atol=1e-5, rtol=1e-5)
    assert dev.commit_error().ok
    # Time the launch alone (rows already on the device; it commits the same records again).
    rows_dev = dev._device_commit.rows_dev
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dev.launch_commit(rows_dev, R)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    ms = min(times)
    state = 32 * 128 * 128 * 4
    records = 32 * 8 * (128 * 4 + 256 * 2)
    conv = b["conv"][0, 0].nbytes
    total = L * R * (2 * state + records + 2 * conv)
    print(
        f"\nrs_recover_commit: {L} layers x {R} requests x 32 heads (128 x 128 fp32), Q=8: "
        f"{ms * 1e3:.1f} us, {total / ms / 1e6:.0f} GB/s effective ({total / 2**20:.0f} MiB moved)"
    )
    assert dev.commit_error().ok
