"""One offline vLLM run for the end-to-end tests, in the vLLM environment (not the test venv).

    python tests/e2e/vllm_driver.py RUN.json OUT.json

``RUN.json``: ``model`` (a folder), ``waves`` (lists of token-id prompts; each wave is one
``LLM.generate`` call, in order, on one engine), ``max_tokens``, ``logprobs``, ``prefix_caching``
(bool; on: ``mamba_cache_mode="align"``), ``speculative`` (optional ``speculative_config``),
``fault`` (optional: ``"skip-copy"`` makes the package skip the state copies of the first step that
has any: the check that a wrong state shows). The plugin is on or off through the environment
(``RECOVERSSM_VLLM_PLUGIN``), as for any vLLM user. Writes ``OUT.json``: per wave and prompt the
greedy token ids, their top logprobs and the prompt's cached tokens; the engine's start and run
seconds; the plugin's :func:`recoverssm_rs.vllm.plugin_stats`; how often the model runner called each
step function and how often vLLM's own copy code ran.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine core and worker in this process
os.environ.setdefault("VLLM_CPU_ATTN_SPLIT_KV", "0")  # split-KV attention depends on the batch
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

STEP_FUNCS = ("preprocess_mamba", "stage_postprocess_inputs_to_gpu", "postprocess_mamba_align_gpu")
VLLM_COPY_FUNCS = ("collect_mamba_copy_meta", "do_mamba_copy_block")


def _count_calls(module: Any, names: tuple[str, ...], counts: dict[str, int]) -> None:
    """Wraps ``module.<name>`` to count its calls (the runner looks them up at every call)."""
    for name in names:
        original = getattr(module, name, None)
        if original is None:
            continue
        counts[name] = 0

        def counted(*a: Any, _f: Any = original, _n: str = name, **k: Any) -> Any:
            counts[_n] += 1
            return _f(*a, **k)

        setattr(module, name, counted)


def _plant_skip_copy(skipped: dict[str, int]) -> None:
    """The package's first non-empty copy plan is not executed (one step's state copies lost)."""
    from recoverssm_rs.planner import CopyPlan

    execute = CopyPlan.execute

    def faulty(self: Any, stream: Any = None) -> None:
        if skipped["plans"] == 0 and len(self) > 0:
            skipped["plans"] = 1
            skipped["copies"] = len(self)
            return
        execute(self, stream)

    CopyPlan.execute = faulty  # type: ignore[method-assign]


def main(run_path: str, out_path: str) -> None:
    run = json.loads(open(run_path).read())
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.plugins import load_general_plugins

    load_general_plugins()  # as LLM() would: the plugin (if on) replaces the step functions now
    from vllm.v1.worker import mamba_utils

    calls: dict[str, int] = {}
    _count_calls(mamba_utils, STEP_FUNCS + VLLM_COPY_FUNCS, calls)
    skipped = {"plans": 0, "copies": 0}
    if run.get("fault") == "skip-copy":
        _plant_skip_copy(skipped)

    kwargs: dict[str, Any] = dict(
        model=run["model"],
        skip_tokenizer_init=True,
        dtype="bfloat16",
        enforce_eager=True,
        block_size=64,
        mamba_ssm_cache_dtype="float32",
        max_model_len=1024,
        max_num_seqs=run.get("max_num_seqs", 8),
        seed=0,
        enable_prefix_caching=bool(run["prefix_caching"]),
    )
    if run["prefix_caching"]:
        kwargs["mamba_cache_mode"] = "align"
    if run.get("speculative"):
        kwargs["speculative_config"] = run["speculative"]
    t0 = time.perf_counter()
    llm = LLM(**kwargs)
    start_s = time.perf_counter() - t0
    params = SamplingParams(temperature=0.0, max_tokens=run["max_tokens"], logprobs=run["logprobs"], detokenize=False)
    waves = []
    t0 = time.perf_counter()
    for wave in run["waves"]:
        outs = llm.generate([{"prompt_token_ids": p} for p in wave], params, use_tqdm=False)
        waves.append(
            [
                {
                    "token_ids": list(o.outputs[0].token_ids),
                    "logprobs": [
                        sorted([int(t), float(lp.logprob)] for t, lp in step.items())
                        for step in (o.outputs[0].logprobs or [])
                    ],
                    "num_cached_tokens": int(o.num_cached_tokens or 0),
                }
                for o in outs
            ]
        )
    run_s = time.perf_counter() - t0
    try:
        from recoverssm_rs.vllm import plugin_stats

        stats: dict[str, Any] | None = plugin_stats()
    except ImportError:
        stats = None
    out = {
        "vllm_version": vllm.__version__,
        "engine_start_s": start_s,
        "run_s": run_s,
        "waves": waves,
        "plugin_stats": stats,
        "calls": calls,
        "fault_skipped": skipped,
    }
    with open(out_path, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
