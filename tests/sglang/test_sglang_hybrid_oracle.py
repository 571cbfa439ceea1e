"""Conformance against SGLang 0.5.23's ``HybridReqToTokenPool``: requests get their rows, mamba
slots and ping-pong track slots from SGLang's own pool (radix-cache extra buffer on); the
scheduler-level operations -- clearing a new request's slot, the speculative commit into the
request's slot and its current track slot, finishing a request while the radix cache keeps its
tracked slot, and a new request's copy-on-write from that cached slot -- run on two identical pools,
one through SGLang's code, one through the adapter installed on its ``mamba_pool``. Every byte
must be equal after every step.

Skipped when the wheel cannot be fetched, unless RECOVERSSM_REQUIRE_ORACLE=1 (CI).
"""

from __future__ import annotations

import os
import random

import pytest

torch = pytest.importorskip("torch")

from recoverssm_rs.sglang import install  # noqa: E402
from support import sglang_oracle, vllm_oracle  # noqa: E402

STEPS = int(os.environ.get("RECOVERSSM_ORACLE_STEPS", "40"))
DRAFT, MAX_REQS, MAMBA_SLOTS = 3, 6, 24


@pytest.fixture(scope="module")
def oracle():
    return vllm_oracle.load_or_skip(sglang_oracle.load, f"SGLang {sglang_oracle.VERSION}")


class _Kv:
    """The request fields SGLang's pools read and write (``Req.kv``)."""

    def __init__(self) -> None:
        self.req_pool_idx = None
        self.mamba_pool_idx = None
        self.kv_allocated_len = 1
        self.mamba_ping_pong_track_buffer = None

    holds_kv = property(lambda self: self.req_pool_idx is not None)
    holds_mamba = property(lambda self: self.mamba_pool_idx is not None)


class _Req:
    def __init__(self, rid: int) -> None:
        self.rid = rid
        self.kv = _Kv()


def _hybrid(ns, family):
    C = ns.configs
    dtype = C.Mamba2StateDType(conv=torch.bfloat16, temporal=torch.float32)
    if family == "kimi":
        shape = C.KimiLinearStateShape.create(tp_world_size=1, num_heads=2, head_dim=8, conv_kernel_size=4)
        params = C.KimiLinearCacheParams(shape=shape, layers=[0, 2], dtype=dtype)
    else:
        shape = C.Mamba2StateShape.create(
            tp_world_size=1, intermediate_size=16, n_groups=1, num_heads=4, head_dim=4, state_size=8, conv_kernel=4
        )
        params = C.Mamba2CacheParams(shape=shape, layers=[0, 2], dtype=dtype)
    with sglang_oracle.stubs():  # the constructor imports its side-state pools
        return ns.pool.HybridReqToTokenPool(
            size=MAX_REQS,
            mamba_size=MAMBA_SLOTS,
            mamba_spec_state_size=MAX_REQS,
            max_context_len=16,
            device="cpu",
            enable_memory_saver=False,
            cache_params=params,
            mamba_layer_ids=[0, 2],
            enable_mamba_extra_buffer=True,
            speculative_num_draft_tokens=DRAFT,
        )


def _buffers(hybrid):
    pool = hybrid.mamba_pool
    c = pool.mamba_cache
    return [*c.conv, c.temporal, c.intermediate_ssm, *pool._intermediate_conv_window_phys]


def _same(a, b, what):
    for i, (x, y) in enumerate(zip(_buffers(a), _buffers(b), strict=True)):
        assert torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8)), f"{what}: buffer {i}"
    assert torch.equal(a.req_index_to_mamba_index_mapping, b.req_index_to_mamba_index_mapping), what
    assert torch.equal(
        a.req_index_to_mamba_ping_pong_track_buffer_mapping, b.req_index_to_mamba_ping_pong_track_buffer_mapping
    ), what


def _fill(rng, a, b, tensors=None):
    for x, y in zip(tensors(a) if tensors else _buffers(a), tensors(b) if tensors else _buffers(b), strict=True):
        g = torch.Generator().manual_seed(rng.randrange(1 << 30))
        v = (torch.randn(x.shape, generator=g) * 4).to(x.dtype)
        x.copy_(v)
        y.copy_(v)


def _scratch(h):
    return [h.mamba_pool.mamba_cache.intermediate_ssm, *h.mamba_pool._intermediate_conv_window_phys]


@pytest.mark.parametrize("family", ["mamba2", "kimi"])
def test_scheduler_trace_equals_sglang(oracle, family):
    rng = random.Random(7 if family == "kimi" else 3)
    theirs, mine = _hybrid(oracle, family), _hybrid(oracle, family)
    _fill(rng, theirs, mine)
    ops = install(mine.mamba_pool)
    scatter = oracle.backend.HybridLinearAttnBackend._scatter_speculative_state_with_mask
    running: list[tuple[_Req, _Req]] = []
    cached: list[int] = []  # track slots kept by the radix cache after their request finished
    done = set()
    for step in range(STEPS):
        kind = rng.choice(["admit", "commit", "commit", "finish"])
        if kind == "admit" and len(running) < MAX_REQS - 1 and theirs.mamba_allocator.available_size() >= 3:
            pair = (_Req(step), _Req(step))
            assert theirs.alloc([pair[0]]) == mine.alloc([pair[1]])
            slot = pair[0].kv.mamba_pool_idx.reshape(1)
            theirs.mamba_pool.clear_slots(slot)  # the scheduler clears a fresh slot (mamba_needs_clear)
            mine.mamba_pool.clear_slots(slot)
            if cached and rng.random() < 0.7:  # prefix hit: copy-on-write from the cached state
                src = torch.tensor([cached.pop(rng.randrange(len(cached)))])
                theirs.copy_mamba_state(src, slot)  # SGLang's path to MambaPool.copy_from
                mine.copy_mamba_state(src, slot)
                theirs.mamba_allocator.free(src)
                mine.mamba_allocator.free(src)
                done.add("cow")
            running.append(pair)
        elif kind == "commit" and running:
            _fill(rng, theirs, mine, _scratch)
            rows = torch.tensor([p[0].kv.req_pool_idx for p in running])
            state_idx = theirs.get_mamba_indices(rows)
            assert torch.equal(state_idx, mine.get_mamba_indices(rows))
            steps = torch.tensor([rng.choice([-1, *range(DRAFT)]) for _ in running], dtype=torch.int32)
            track = torch.stack([p[0].kv.mamba_ping_pong_track_buffer[p[0].kv.mamba_next_track_idx] for p in running])
            track_steps = torch.tensor([rng.choice([-1, *range(DRAFT)]) for _ in running])
            src_rows = torch.arange(len(running)) if rng.random() < 0.5 else None
            c = theirs.mamba_pool.mamba_cache
            for dst, src in [(c.temporal, c.intermediate_ssm), *zip(c.conv, c.intermediate_conv_window)]:
                scatter(dst, src, state_idx, steps, src_rows)
                scatter(dst, src, track, track_steps, src_rows)
            ops.commit_after_verify(state_idx, steps, track, track_steps, src_rows)
            done.add("commit")
        elif kind == "finish" and running:
            a, b = running.pop(rng.randrange(len(running)))
            keep_idx = a.kv.mamba_last_track_idx
            keep = int(a.kv.mamba_ping_pong_track_buffer[keep_idx])
            theirs.free_mamba_cache(a, mamba_ping_pong_track_buffer_to_keep=keep_idx)
            mine.free_mamba_cache(b, mamba_ping_pong_track_buffer_to_keep=keep_idx)
            theirs.free(a)
            mine.free(b)
            cached.append(keep)
            done.add("finish")
        _same(theirs, mine, f"step {step} ({kind})")
    assert {"cow", "commit", "finish"} <= done
