"""What works without torch (``bash scripts/setup.sh --no-torch``): layouts, copy plans and the host
executor on numpy arrays, and the layout commands of the CLI; the demo names the missing extra.

Each case runs in a fresh interpreter where ``import torch`` fails (``sys.modules["torch"] = None``),
whether or not torch is installed here.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

NO_TORCH = "import sys\nsys.modules['torch'] = None  # `import torch` raises ImportError from here on\n"


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", NO_TORCH + textwrap.dedent(code)], capture_output=True, text=True, timeout=300
    )


def test_layouts_plans_and_the_host_executor_run_without_torch():
    r = _run(
        """
        import numpy as np
        import recoverssm_rs as rs
        from recoverssm_rs import layouts

        gdn = layouts.gdn(num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=16, conv_kernel_size=4,
                          num_spec=3, dtype="float32", ssm_dtype="float32")
        rng = np.random.default_rng(0)
        states = [[rng.standard_normal((64, *s.shape)).astype(s.dtype) for s in gdn.persistent] for _ in range(2)]
        before = [[t.copy() for t in layer] for layer in states]
        planner = rs.Planner(gdn, states)
        bt = np.array([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]], np.int32)
        src, dst, acc = np.array([0, 0], np.int32), np.array([4, 4], np.int32), np.array([2, 4], np.int32)
        plan = planner.plan_align(bt, src, dst, acc)
        assert len(plan) > 0
        plan.execute()
        # request 1 accepted 4 tokens: its temporal state moves from column 0 (block 6) to block 10
        assert np.array_equal(states[0][1][10], before[0][1][9])
        planner.plan_copy(np.array([10, 3]), np.array([20, 21])).execute()
        assert np.array_equal(states[1][0][21], before[1][0][3])
        assert sys.modules["torch"] is None
        print("ok")
        """
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_the_cli_layout_commands_run_without_torch_and_the_demo_names_torch():
    r = _run(
        """
        from recoverssm_rs.__main__ import main
        main(["layout", "--preset", "kimi-k3-like-recoverssm"])
        """
    )
    assert r.returncode == 0 and "per block and layer" in r.stdout, r.stderr
    r = _run(
        """
        from recoverssm_rs.__main__ import main
        main(["demo", "--steps", "2"])
        """
    )
    assert r.returncode != 0 and "needs torch" in r.stderr and "recoverssm_rs[torch]" in r.stderr, r.stderr
