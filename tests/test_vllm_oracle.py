"""Conformance against vLLM 0.33.0 itself: random multi-step align-mode traces run through vLLM's
own step code (downloaded wheel, Triton kernels interpreted on CPU; see tests/support/vllm_oracle.py)
and through recoverssm_rs.vllm.VllmMambaStep must leave every state byte and every num_accepted
equal after every pre-copy and every post-process.

Skipped when the wheel cannot be fetched or Triton is missing, unless RECOVERSSM_REQUIRE_ORACLE=1
(CI), which turns the skip into a failure. RECOVERSSM_ORACLE_STEPS sets the steps per trace.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("torch")

from support import vllm_oracle, vllm_trace  # noqa: E402
from support.vllm_trace import GroupCfg as G  # noqa: E402

STEPS = int(os.environ.get("RECOVERSSM_ORACLE_STEPS", "20"))


@pytest.fixture(scope="module")
def oracle():
    try:
        return vllm_oracle.load()
    except vllm_oracle.OracleUnavailable as exc:
        if os.environ.get("RECOVERSSM_REQUIRE_ORACLE") == "1":
            pytest.fail(f"RECOVERSSM_REQUIRE_ORACLE=1 but vLLM's oracle is unavailable: {exc}")
        pytest.skip(f"vLLM {vllm_oracle.VERSION}'s oracle is unavailable: {exc}")


TRACES = {
    # name: (groups, block_size, num_speculative_blocks, conv layout, seed[, shared pages])
    "gdn-SD-spec2": ([G("GDN_ATTN", 2)], 4, 2, "SD", 11),
    "gdn-DS-spec2": ([G("GDN_ATTN", 2)], 4, 2, "DS", 12),
    "3groups-DS-spec2": ([G("GDN_ATTN", 1), G("SHORT_CONV", 1, conv_dim=5), G("LINEAR", 1, temporal_shape=(3, 4))],
                         4, 2, "DS", 13),
    "2groups-SD-bs2-spec3": ([G("GDN_ATTN", 1), G("SHORT_CONV", 2, conv_dim=3)], 2, 3, "SD", 14),
    "gdn-SD-nospec-scalar": ([G("GDN_ATTN", 2), G("SHORT_CONV", 1)], 4, 0, "SD", 15),
    "gdn-DS-nospec-scalar": ([G("GDN_ATTN", 1)], 3, 0, "DS", 16),
    # vLLM's hybrid allocator: layer i of every group views one buffer of padded pages
    "3groups-DS-shared-pages": ([G("GDN_ATTN", 2), G("SHORT_CONV", 1, conv_dim=5), G("LINEAR", 2, temporal_shape=(3, 4))],
                                4, 2, "DS", 21, True),
    "2groups-SD-shared-pages": ([G("GDN_ATTN", 1), G("LINEAR", 1, temporal_shape=(3, 4))], 4, 1, "SD", 22, True),
}


@pytest.mark.parametrize("name", list(TRACES))
def test_trace_equals_vllm(oracle, name):
    groups, bs, nsb, layout, seed, *shared = TRACES[name]
    stats = vllm_trace.run_trace(oracle, groups, block_size=bs, nsb=nsb, conv_layout=layout, seed=seed, steps=STEPS,
                                 shared_pages=bool(shared))
    assert stats.steps == STEPS and stats.pre_copies > 0
    if nsb:
        assert stats.post_copies > 0


def test_shared_pages_share_memory_across_groups():
    sim = vllm_trace.Sim([G("GDN_ATTN", 1), G("LINEAR", 1, temporal_shape=(3, 4))], 4, 1, "SD", seed=0)
    states = sim.make_states(shared_pages=True)
    gdn_conv, linear_temporal = states[0][0][0], states[1][0][0]
    assert gdn_conv.untyped_storage().data_ptr() == linear_temporal.untyped_storage().data_ptr()
    assert gdn_conv.stride(0) == linear_temporal.stride(0) > gdn_conv[0].numel() + states[0][0][1][0].numel()
    clone = vllm_trace.Sim.clone_states(states)
    assert clone[0][0][0].untyped_storage().data_ptr() == clone[1][0][0].untyped_storage().data_ptr()
    assert clone[0][0][0].untyped_storage().data_ptr() != gdn_conv.untyped_storage().data_ptr()


def test_traces_cover_the_features(oracle):
    """One longer trace hits prefix hits, preemption, skipped requests and backward moves."""
    stats = vllm_trace.run_trace(oracle, [G("GDN_ATTN", 1), G("SHORT_CONV", 1)], block_size=2, nsb=3,
                                 conv_layout="SD", seed=4, steps=max(STEPS, 40))
    assert stats.prefix_hits > 0 and stats.preempted > 0 and stats.skipped > 0 and stats.backwards > 0, stats


def test_the_oracle_catches_a_wrong_adapter(oracle, monkeypatch):
    """With the post-process copies dropped, the first trace step that saves a state differs."""
    from recoverssm_rs import vllm as adapter

    real = adapter.VllmMambaStep.post_process

    def no_copies(self, *a, **k):
        d, _plan = self.planner.post_process(*a, **k)
        return d

    monkeypatch.setattr(adapter.VllmMambaStep, "post_process", no_copies)
    with pytest.raises(AssertionError, match="after the post-process"):
        vllm_trace.run_trace(oracle, [G("GDN_ATTN", 1)], block_size=4, nsb=2, conv_layout="SD", seed=11, steps=STEPS)
    monkeypatch.setattr(adapter.VllmMambaStep, "post_process", real)
