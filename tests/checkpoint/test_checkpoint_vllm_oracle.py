"""The ``vllm`` checkpoint policy against vLLM 0.33.0's own prefix-cache functions (see
``tests/support/vllm_checkpoint_oracle.py``: the attention and Mamba hit searches and the sparse
retention mask of ``MambaManager``, composed request by request), on random traces whose prompts
share prefixes and extend earlier turns: the model must reuse the same tokens and write the same
checkpoint positions for every request. Unlimited pools (the oracle does not run the pool's
eviction)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from recoverssm_rs.checkpoints import CheckpointCache  # noqa: E402
from support import vllm_oracle  # noqa: E402
from support.checkpoint_traces import trace  # noqa: E402

ORACLE = Path(__file__).resolve().parents[1] / "support" / "vllm_checkpoint_oracle.py"


def test_the_vllm_model_matches_vllms_own_functions(tmp_path):
    vllm_oracle.load_or_skip(vllm_oracle.wheel, "vLLM 0.33.0")
    rng = random.Random(20261206)
    cases = [{"block": rng.choice([2, 3, 4, 8]), "requests": trace(rng, rng.randint(2, 14))} for _ in range(60)]
    path = tmp_path / "cases.json"
    path.write_text(json.dumps(cases))
    r = subprocess.run(
        [sys.executable, str(ORACLE), str(path)], capture_output=True, text=True, timeout=600, check=False
    )
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    compared = 0
    for case, want in zip(cases, got, strict=True):
        cache = CheckpointCache("vllm", block_size=case["block"], granularity=case["block"])
        for i, req in enumerate(case["requests"]):
            plan = cache.plan(req["prompt"])
            written, _ = cache.finish(req["prompt"], req["output"], plan)
            ctx = f"block {case['block']}, request {i} of {case['requests']}"
            assert plan.hit_position == want["reused"][i], ctx
            assert [p for p, _ in written] == want["written"][i], ctx
            compared += 1
    assert sum(sum(w["reused"]) for w in got) > 0, "the traces must produce hits to compare"
    assert compared > 200
