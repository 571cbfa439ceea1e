"""``ModelStateV2`` (vLLM's GPU-resident runner) on a real GPU (skipped without CUDA + CuPy): the
V2 oracle traces (tests/support/vllm_v2_oracle.py: vLLM 0.33.0's own ``MambaHybridModelState``,
its Triton kernels in Triton's interpreter on host copies of the states) against the adapter bound
to CUDA states, its launches real ones -- every state byte, every slot's column and count, and
the RecoverSSM cache (recurrent states within 1e-5: the commit kernel against the torch reference)
after every half-step; then the same trace with each half captured once in a CUDA graph and
replayed at every later step.

Run on a machine with a GPU: ``python -m pytest tests/vllm/test_gpu_model_state_v2.py -q -m gpu``.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")

from support import vllm_oracle, vllm_trace  # noqa: E402

pytestmark = pytest.mark.gpu

CUDA = vllm_trace.CUDA


@pytest.fixture(scope="module")
def mh():
    from support import vllm_v2_oracle

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return vllm_oracle.load_or_skip(vllm_v2_oracle.load, f"vLLM {vllm_oracle.VERSION} (V2 runner)")


def _run(mh, cfg, **kw):
    from support import vllm_v2_oracle

    groups, bs, nsb, layout, seed, steps = cfg
    return vllm_v2_oracle.run_trace(
        mh, groups, block_size=bs, nsb=nsb, conv_layout=layout, seed=seed, steps=steps, device=CUDA, **kw
    )


def _configs(name):
    from test_v2_model_state import RECOVER_TRACES, TRACES

    return {**TRACES, **RECOVER_TRACES}[name]


@pytest.mark.parametrize("name", ["gdn-SD-spec2", "2groups-DS-spec2"])
def test_v2_trace_on_the_gpu_equals_vllm(mh, name):
    stats = _run(mh, _configs(name))
    assert stats.pre_moves > 0 and stats.pp_rows > 0


@pytest.mark.parametrize("name", ["recoverssm-gdn-SD-spec2", "recoverssm-2groups-DS-spec1"])
def test_v2_trace_with_the_commit_in_the_launch_on_the_gpu_equals_vllm(mh, name):
    stats = _run(mh, _configs(name), recoverssm=True)
    assert stats.commits > 0


@pytest.mark.parametrize("name", ["2groups-DS-spec2", "recoverssm-gdn-SD-spec2"])
def test_v2_trace_replayed_from_cuda_graphs_equals_vllm(mh, name):
    """Fixed input tensors, each half captured at the second step and replayed from then on (a
    RecoverSSM step's commit staged before its pre-copy, outside the graph)."""
    stats = _run(mh, _configs(name), static=True, graphs=True, recoverssm=name.startswith("recoverssm"))
    assert stats.steps >= 8
