"""Conformance against SGLang 0.5.23 itself: random traces of its mamba-pool operations (slot
allocation and freeing by SGLang's own ``MambaSlotAllocator``, clearing at allocation,
copy-on-write on prefix hits, forks, HiCache host round trips, the speculative commit after
verify with and without track slots and source rows) run on two identical SGLang ``MambaPool``s:
one through SGLang's own methods (the speculative commit through its torch fallback,
``_scatter_speculative_state_with_mask``, composed as ``scatter_mamba_states_after_mtp_verify``
composes its kernels), the other through :mod:`recoverssm_rs.sglang`. Every byte of every state
tensor, and every host copy, must be equal after every operation.

Skipped when the wheel cannot be fetched, unless RECOVERSSM_REQUIRE_ORACLE=1 (CI), which turns the
skip into a failure. RECOVERSSM_ORACLE_STEPS sets the operations per trace.
"""

from __future__ import annotations

import os
import random
import shutil
import zlib

import pytest

torch = pytest.importorskip("torch")

from recoverssm_rs.sglang import install  # noqa: E402
from support import sglang_oracle, vllm_oracle  # noqa: E402

STEPS = int(os.environ.get("RECOVERSSM_ORACLE_STEPS", "40"))


@pytest.fixture(scope="module")
def oracle():
    return vllm_oracle.load_or_skip(sglang_oracle.load, f"SGLang {sglang_oracle.VERSION}")


# name: (family, layers, heads, conv dtype, ssm dtype, draft tokens or None, eagle topk)
POOLS = {
    "mamba2-bf16-chain-dedup": ("mamba2", 3, 4, torch.bfloat16, torch.float32, 4, None),
    "mamba2-fp32-tree-dense": ("mamba2", 2, 2, torch.float32, torch.float32, 3, 4),
    "mamba2-bf16-nospec": ("mamba2", 2, 8, torch.bfloat16, torch.bfloat16, None, None),
    "two-convs-bf16-chain-dedup": ("two-convs", 2, 2, torch.bfloat16, torch.float32, 3, None),
    "kimi-bf16-chain": ("kimi", 2, 2, torch.bfloat16, torch.float32, 3, None),
    "kimi-fp32-1layer": ("kimi", 1, 4, torch.float32, torch.float32, 2, None),
}
SIZE, SPEC_ROWS = 12, 6


def _params(ns, family, layers, heads, conv_dtype, ssm_dtype):
    C = ns.configs
    dtype = C.Mamba2StateDType(conv=conv_dtype, temporal=ssm_dtype)
    if family == "kimi":
        shape = C.KimiLinearStateShape.create(tp_world_size=1, num_heads=heads, head_dim=4, conv_kernel_size=4)
        return C.KimiLinearCacheParams(shape=shape, layers=list(range(layers)), dtype=dtype)
    if family == "two-convs":  # a pool whose conv list holds two tensors (one group each here)
        shape = C.Mamba2StateShape(
            conv=[(heads * 4 + 8, 3), (8, 3)],
            temporal=(heads, 4, 4),
            intermediate_size=heads * 4,
            conv_dim=heads * 4 + 8,
            ssm_state_size=4,
            num_heads=heads,
            head_dim=4,
            state_size=4,
            conv_kernel=4,
        )
        return C.Mamba2CacheParams(shape=shape, layers=list(range(layers)), dtype=dtype)
    shape = C.Mamba2StateShape.create(
        tp_world_size=1,
        intermediate_size=heads * 4,
        n_groups=1,
        num_heads=heads,
        head_dim=4,
        state_size=4,
        conv_kernel=4,
    )
    return C.Mamba2CacheParams(shape=shape, layers=list(range(layers)), dtype=dtype)


def _pool(ns, name):
    family, layers, heads, cdt, sdt, draft, topk = POOLS[name]
    return ns.pool.MambaPool(
        size=SIZE,
        spec_state_size=SPEC_ROWS,
        cache_params=_params(ns, family, layers, heads, cdt, sdt),
        mamba_layer_ids=list(range(layers)),
        device="cpu",
        speculative_num_draft_tokens=draft,
        speculative_eagle_topk=topk,
    )


def _buffers(pool):
    """Every real buffer of the pool (the deduplicated conv-window view's storage, not the view)."""
    c = pool.mamba_cache
    out = [*c.conv, c.temporal]
    if getattr(c, "intermediate_ssm", None) is not None:
        out += [c.intermediate_ssm, *pool._intermediate_conv_window_phys]
    return out


def _bytes(t):
    return t.contiguous().view(-1).view(torch.uint8)


def _same(a, b, what):
    for i, (x, y) in enumerate(zip(_buffers(a), _buffers(b), strict=True)):
        assert torch.equal(_bytes(x), _bytes(y)), f"{what}: buffer {i} differs from SGLang's"


def _randomize(rng, tensors_a, tensors_b, slots=None):
    """The same random contents in both pools' tensors (all slots, or the given ones of axis 1)."""
    for x, y in zip(tensors_a, tensors_b, strict=True):
        g = torch.Generator().manual_seed(rng.randrange(1 << 30))
        shape = list(x.shape)
        if slots is not None:
            shape[1] = len(slots)
        v = (torch.randn(shape, generator=g) * 4).to(x.dtype)
        if slots is None:
            x.copy_(v)
            y.copy_(v)
        else:
            x[:, slots] = v
            y[:, slots] = v


def _sglang_commit(ns, pool, state_idx, steps, track, track_steps, src_rows):
    scatter = ns.backend.HybridLinearAttnBackend._scatter_speculative_state_with_mask
    c = pool.mamba_cache
    pairs = [(c.temporal, c.intermediate_ssm)] + list(zip(c.conv, c.intermediate_conv_window))
    for dst, src in pairs:
        scatter(dst, src, state_idx, steps, src_rows)
        if track is not None:
            scatter(dst, src, track, track_steps, src_rows)


@pytest.mark.parametrize("name", list(POOLS))
@pytest.mark.parametrize("seed", range(int(os.environ.get("RECOVERSSM_SGLANG_SEEDS", "2"))))
def test_trace_equals_sglang(oracle, name, seed):
    rng = random.Random(zlib.crc32(f"{name}-{seed}".encode()))
    theirs, mine = _pool(oracle, name), _pool(oracle, name)
    _randomize(rng, _buffers(theirs), _buffers(mine))
    ops = install(mine)
    assert mine.copy_from == ops.copy_from
    draft = POOLS[name][5]
    alloc = oracle.alloc.MambaSlotAllocator(size=SIZE, device="cpu")
    live: list[int] = []
    done = set()
    for step in range(STEPS):
        kinds = ["alloc", "free", "cow", "fork", "hicache", "write"] + (["commit"] * 2 if draft else [])
        kind = kinds[step] if step < len(kinds) else rng.choice(kinds)  # every kind at least once
        what = f"step {step} ({kind})"
        while alloc.available_size() < 3:  # keep room for allocations: free the oldest slot
            alloc.free(torch.tensor([live.pop(0)]))
        if len(live) < 3:
            kind = "alloc"
        if kind == "alloc":
            k = rng.randint(1, 3)
            got = alloc.alloc(k)
            if got is None:
                continue
            theirs.clear_slots(got)
            mine.clear_slots(got)
            live += got.tolist()
            _same(theirs, mine, what)
            _randomize(
                rng,
                [*theirs.mamba_cache.conv, theirs.mamba_cache.temporal],
                [*mine.mamba_cache.conv, mine.mamba_cache.temporal],
                got.tolist(),
            )
        elif kind == "free":
            victims = rng.sample(live, rng.randint(1, len(live) - 2))
            alloc.free(torch.tensor(victims))
            live = [s for s in live if s not in victims]
        elif kind == "write":
            slots = rng.sample(live, rng.randint(1, len(live)))
            _randomize(
                rng,
                [*theirs.mamba_cache.conv, theirs.mamba_cache.temporal],
                [*mine.mamba_cache.conv, mine.mamba_cache.temporal],
                slots,
            )
        elif kind in ("cow", "fork"):
            n = 1 if kind == "fork" else rng.randint(1, min(3, len(live)))
            dst = alloc.alloc(n)
            if dst is None:
                continue
            src = torch.tensor(rng.sample(live, n))
            theirs.copy_from(src, dst)
            mine.copy_from(src, dst)
            live += dst.tolist()
        elif kind == "hicache":
            slots = torch.tensor(rng.sample(live, rng.randint(1, len(live))))
            a, b = theirs.get_cpu_copy(slots), mine.get_cpu_copy(slots)
            for x, y in zip([*a[0], a[1]], [*b[0], b[1]], strict=True):
                assert x.device.type == "cpu" and torch.equal(_bytes(x), _bytes(y)), what
            back = torch.tensor(rng.sample(live, len(slots)))
            theirs.load_cpu_copy(a, back)
            mine.load_cpu_copy(b, back)
        elif kind == "commit":
            n = rng.randint(1, min(SPEC_ROWS, len(live)))
            _randomize(
                rng,
                [theirs.mamba_cache.intermediate_ssm, *theirs._intermediate_conv_window_phys],
                [mine.mamba_cache.intermediate_ssm, *mine._intermediate_conv_window_phys],
            )
            state_idx = torch.tensor(rng.sample(live, n), dtype=torch.int32)
            # accepted counts 1..draft (step = count - 1), padding rows at -1
            steps = torch.tensor([rng.choice([-1, *range(draft)]) for _ in range(n)], dtype=torch.int32)
            track = track_steps = src_rows = None
            if rng.random() < 0.5:
                spare = [s for s in live if s not in state_idx.tolist()]
                if len(spare) >= n:
                    track = torch.tensor(rng.sample(spare, n), dtype=torch.int64)
                    track_steps = torch.tensor([rng.choice([-1, *range(draft)]) for _ in range(n)])
            if rng.random() < 0.5:
                src_rows = torch.tensor(rng.sample(range(SPEC_ROWS + 1), n))
            _sglang_commit(oracle, theirs, state_idx, steps, track, track_steps, src_rows)
            ops.commit_after_verify(state_idx, steps, track, track_steps, src_rows)
        done.add(kind)
        _same(theirs, mine, what)
    assert {"cow", "fork", "hicache", "write"} <= done
    if draft:
        assert "commit" in done


def _same_but_dummy(a, b, what):
    """Every byte of both pools equal except the dummy slot 0 of the state tensors (SGLang writes
    padded rows there, in no defined order; the package writes nothing)."""
    ca, cb = a.mamba_cache, b.mamba_cache
    for x, y in zip([*ca.conv, ca.temporal], [*cb.conv, cb.temporal], strict=True):
        assert torch.equal(_bytes(x[:, 1:]), _bytes(y[:, 1:])), f"{what}: a state differs from SGLang's"
    scratch_a = [ca.intermediate_ssm, *a._intermediate_conv_window_phys]
    scratch_b = [cb.intermediate_ssm, *b._intermediate_conv_window_phys]
    for x, y in zip(scratch_a, scratch_b, strict=True):
        assert torch.equal(_bytes(x), _bytes(y)), f"{what}: the verify scratch differs"


@pytest.mark.parametrize("name", ["mamba2-bf16-chain-dedup", "two-convs-bf16-chain-dedup", "kimi-fp32-1layer"])
def test_padded_batch_on_the_dummy_slot_equals_sglang(oracle, name):
    """A padded batch (CUDA-graph padding): several padded rows name the dummy slot 0 with accepted
    steps, in the commit and the track pass. SGLang writes them into slot 0; the package writes
    nothing there and every other byte equals SGLang's. A real slot named twice is still refused."""
    from recoverssm_rs.errors import PlanError

    rng = random.Random(zlib.crc32(name.encode()))
    theirs, mine = _pool(oracle, name), _pool(oracle, name)
    _randomize(rng, _buffers(theirs), _buffers(mine))
    ops = install(mine)
    draft = POOLS[name][5]
    state_idx = torch.tensor([3, 0, 5, 0, 0, 0], dtype=torch.int64)[:SPEC_ROWS]
    steps = torch.tensor([draft - 1, 0, 0, draft - 1, 1 % draft, -1], dtype=torch.int64)[:SPEC_ROWS]
    track = torch.tensor([7, 0, -1, 0, 8, 0], dtype=torch.int64)[:SPEC_ROWS]
    track_steps = torch.tensor([0, 1 % draft, 0, 0, draft - 1, 0], dtype=torch.int64)[:SPEC_ROWS]
    _sglang_commit(oracle, theirs, state_idx, steps, track, track_steps, None)
    ops.commit_after_verify(state_idx, steps, track, track_steps, None)
    _same_but_dummy(theirs, mine, f"{name}: padded commit")
    before = [t.clone() for t in _buffers(mine)]
    with pytest.raises(PlanError, match=r"state_indices\[2\] = 3 is written by an earlier request too"):
        ops.commit_after_verify(torch.tensor([3, 0, 3]), torch.tensor([0, 0, 1]))
    assert all(torch.equal(x, y) for x, y in zip(before, _buffers(mine), strict=True)), "a refused commit wrote"


def test_overlapping_copies_equal_sglang_and_cycles_are_refused(oracle):
    """A chain of copies whose destinations are later sources reads every source before it is
    overwritten, as SGLang's gather-then-scatter does; a cycle (SGLang swaps through its gathered
    temporary) is refused, writing nothing."""
    from recoverssm_rs.errors import PlanError

    theirs, mine = _pool(oracle, "mamba2-bf16-chain-dedup"), _pool(oracle, "mamba2-bf16-chain-dedup")
    _randomize(random.Random(5), _buffers(theirs), _buffers(mine))
    install(mine)
    src, dst = torch.tensor([1, 2, 3, 7]), torch.tensor([2, 3, 4, 1])
    theirs.copy_from(src, dst)
    mine.copy_from(src, dst)
    _same(theirs, mine, "chain")
    with pytest.raises(PlanError, match="cycle"):
        mine.copy_from(torch.tensor([1, 2]), torch.tensor([2, 1]))
    _same(theirs, mine, "refused cycle")


@pytest.mark.skipif(shutil.which("g++") is None, reason="host emulation needs a C++ compiler")
@pytest.mark.parametrize("name", ["mamba2-bf16-chain-dedup", "mamba2-fp32-tree-dense", "two-convs-bf16-chain-dedup"])
def test_device_path_equals_sglang_through_the_kernel_emulation(oracle, fake_ops, emulator, strided_fakes, name):
    """The same kind of trace on the device path: the adapter over SGLang's own pool tensors
    claiming to live on ``cuda:0``, every operation one launch (a HiCache round trip one each way)
    run by the host emulation of the kernel source, the indices of the other operations handed
    over as device tensors (never read on the host)."""
    from recoverssm_rs.sglang import SglangMambaPool
    from support.device_fakes import FakeCuda

    rng = random.Random(zlib.crc32(f"device-{name}".encode()))
    theirs, mine = _pool(oracle, name), _pool(oracle, name)
    _randomize(rng, _buffers(theirs), _buffers(mine))
    c = mine.mamba_cache
    ops = SglangMambaPool(
        [FakeCuda(t) for t in c.conv],
        FakeCuda(c.temporal),
        intermediate_ssm=FakeCuda(c.intermediate_ssm),
        intermediate_conv_window=[FakeCuda(w) for w in c.intermediate_conv_window],
    )
    draft = POOLS[name][5]
    alloc = oracle.alloc.MambaSlotAllocator(size=SIZE, device="cpu")
    live: list[int] = []
    for step in range(20):
        kind = ["alloc", "cow", "fork", "commit", "hicache"][step % 5] if len(live) >= 3 else "alloc"
        while alloc.available_size() < 3:
            alloc.free(torch.tensor([live.pop(0)]))
        before = len(emulator.calls)
        if kind == "alloc":
            got = alloc.alloc(rng.randint(1, 3))
            theirs.clear_slots(got)
            ops.clear_slots(FakeCuda(got))
            live += got.tolist()
        elif kind in ("cow", "fork"):
            n = 1 if kind == "fork" else rng.randint(1, min(3, len(live)))
            dst = alloc.alloc(n)
            src = torch.tensor(rng.sample(live, n))
            theirs.copy_from(src, dst)
            ops.copy_from(FakeCuda(src), FakeCuda(dst))
            live += dst.tolist()
        elif kind == "hicache":  # one gather launch out, one scatter launch back
            slots = torch.tensor(rng.sample(live, rng.randint(1, len(live))))
            a, b = theirs.get_cpu_copy(slots), ops.get_cpu_copy(slots)
            for x, y in zip([*a[0], a[1]], [*b[0], b[1]], strict=True):
                assert torch.equal(_bytes(x), _bytes(y)), f"step {step}: host copy"
            back = torch.tensor(rng.sample(live, len(slots)))
            theirs.load_cpu_copy(a, back)
            ops.load_cpu_copy(b, back)
            before += 1
        else:
            n = rng.randint(1, min(SPEC_ROWS, len(live)))
            _randomize(
                rng,
                [theirs.mamba_cache.intermediate_ssm, *theirs._intermediate_conv_window_phys],
                [mine.mamba_cache.intermediate_ssm, *mine._intermediate_conv_window_phys],
            )
            state_idx = torch.tensor(rng.sample(live, n), dtype=torch.int32)
            steps = torch.tensor([rng.choice([-1, *range(draft)]) for _ in range(n)], dtype=torch.int32)
            spare = [s for s in live if s not in state_idx.tolist()]
            track = track_steps = None
            if len(spare) >= n and step % 8 == 3:
                track = torch.tensor(rng.sample(spare, n))
                track_steps = torch.tensor([rng.choice([-1, *range(draft)]) for _ in range(n)])
            src_rows = torch.tensor(rng.sample(range(SPEC_ROWS + 1), n))
            _sglang_commit(oracle, theirs, state_idx, steps, track, track_steps, src_rows)
            fake = [None if x is None else FakeCuda(x) for x in (track, track_steps)]
            ops.commit_after_verify(FakeCuda(state_idx), FakeCuda(steps), *fake, FakeCuda(src_rows))
            assert ops.last_error().ok
        assert len(emulator.calls) == before + 1, f"step {step} ({kind}): one launch"
        _same(theirs, mine, f"step {step} ({kind})")
