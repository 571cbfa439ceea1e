"""The vLLM adapter's device path on a real GPU (skipped without CUDA + CuPy): random multi-step
traces (tests/support/vllm_trace.py) run through ``VllmMambaStep`` bound to CUDA states -- one fused
launch per half-step for every group, counts on the device -- and through the adapter's host path
over CPU copies of the same states (which tests/vllm/test_vllm_oracle.py holds equal to vLLM 0.33.0);
every state byte and every count must be equal after every half-step, and no step may synchronise.

Run on a machine with a GPU: ``python -m pytest tests/vllm/test_gpu_vllm_step.py -q -m gpu``.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")

from support import vllm_trace  # noqa: E402
from support.vllm_trace import TRACES  # noqa: E402
from support.vllm_trace import GroupCfg as G  # noqa: E402

pytestmark = pytest.mark.gpu

CUDA = vllm_trace.CUDA

# The oracle's traces without shared pages (a `.cuda()` copy of a view would not share its buffer).
GPU_TRACES = ["gdn-SD-spec2", "gdn-DS-spec2", "3groups-DS-spec2", "2groups-SD-bs2-spec3"]


@pytest.mark.parametrize("name", GPU_TRACES)
def test_device_path_equals_the_host_path(name):
    groups, bs, nsb, layout, seed = TRACES[name]
    stats = vllm_trace.run_trace(
        None, groups, block_size=bs, nsb=nsb, conv_layout=layout, seed=seed, steps=30, device=CUDA
    )
    assert stats.steps == 30 and stats.pre_copies > 0 and stats.post_copies > 0


def test_a_step_never_synchronises():
    """torch's sync-debug mode "error" around every device half-step after the first (which uploads
    the state table and allocates the count buffers)."""
    from recoverssm_rs.vllm.device_step import DeviceStep

    calls = {"n": 0}

    def strict(real):
        def run(self, *a, **k):
            calls["n"] += 1
            if calls["n"] == 1:
                return real(self, *a, **k)
            torch.cuda.set_sync_debug_mode("error")
            try:
                return real(self, *a, **k)
            finally:
                torch.cuda.set_sync_debug_mode("default")

        return run

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(DeviceStep, "launch", strict(DeviceStep.launch))
        vllm_trace.run_trace(
            None, [G("GDN_ATTN", 1)], block_size=4, nsb=2, conv_layout="SD", seed=5, steps=8, device=CUDA
        )
    assert calls["n"] >= 8
