"""Offline vLLM runs for the end-to-end tests, in the vLLM environment (not the test venv).

    python tests/e2e/vllm_driver.py RUN.json OUT.json

``RUN.json``: ``model`` (a folder), ``waves`` (lists of token-id prompts; each wave is one
``LLM.generate`` call, in order, on one engine), ``max_tokens``, ``logprobs``, and ``configs``, run
in order in this process, one engine start each (the engine is shut down before the next): per
configuration ``name``; ``plugin`` (bool: the package's plugin serves the step, else vLLM's own
functions); ``prefix_caching`` (bool; on: ``mamba_cache_mode="align"``); ``speculative`` (optional
``speculative_config``); ``fault`` (optional: ``"skip-copy"`` makes the package skip the state copies
of the first step that has any: the check that a wrong state shows).

The plugin is loaded as vLLM loads it, by the first ``LLM()`` (the wheel's entry point); vLLM's own
functions are those of ``vllm.v1.worker.mamba_utils`` before that. Writes ``OUT.json``: per
configuration, per wave and prompt the greedy token ids, their top logprobs and the prompt's cached
tokens; the engine's start and generate seconds; the plugin's counters over that configuration; how
often the model runner called each step function and how often vLLM's own copy code ran.
"""

from __future__ import annotations

import gc
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


def _counted(funcs: dict[str, Any], counts: dict[str, int]) -> dict[str, Any]:
    """``funcs`` wrapped to count their calls into ``counts``."""
    out = {}
    for name, f in funcs.items():
        counts[name] = 0

        def counted(*a: Any, _f: Any = f, _n: str = name, **k: Any) -> Any:
            counts[_n] += 1
            return _f(*a, **k)

        out[name] = counted
    return out


class SkipOneCopyPlan:
    """While active, the package's first non-empty copy plan is not executed (one step's state
    copies lost)."""

    def __init__(self) -> None:
        self.skipped = {"plans": 0, "copies": 0}

    def __enter__(self) -> SkipOneCopyPlan:
        from recoverssm_rs.planner import CopyPlan

        self.cls, self.execute = CopyPlan, CopyPlan.execute
        skipped, execute = self.skipped, self.execute

        def faulty(plan: Any, stream: Any = None) -> None:
            if skipped["plans"] == 0 and len(plan) > 0:
                skipped["plans"], skipped["copies"] = 1, len(plan)
                return
            execute(plan, stream)

        CopyPlan.execute = faulty  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: Any) -> None:
        self.cls.execute = self.execute  # type: ignore[method-assign]


def run_config(run: dict[str, Any], cfg: dict[str, Any], mamba_utils: Any, funcs: dict[str, dict[str, Any]]) -> Any:
    from recoverssm_rs.vllm import plugin_stats
    from vllm import LLM, SamplingParams

    kwargs: dict[str, Any] = dict(
        model=run["model"],
        skip_tokenizer_init=True,
        dtype="bfloat16",
        enforce_eager=True,
        block_size=64,
        mamba_ssm_cache_dtype="float32",
        max_model_len=1024,
        max_num_seqs=8,
        seed=0,
        enable_prefix_caching=bool(cfg["prefix_caching"]),
    )
    if cfg["prefix_caching"]:
        kwargs["mamba_cache_mode"] = "align"
    if cfg.get("speculative"):
        kwargs["speculative_config"] = cfg["speculative"]
    before = plugin_stats()
    fault = SkipOneCopyPlan() if cfg.get("fault") == "skip-copy" else None
    t0 = time.perf_counter()
    llm = LLM(**kwargs)  # the first one loads the plugins (the wheel's entry point), as for any user
    start_s = time.perf_counter() - t0
    funcs.setdefault("plugin", {n: getattr(mamba_utils, n) for n in STEP_FUNCS})
    # The model runner looks the functions up at every call: this configuration's, counted.
    calls: dict[str, int] = {}
    for name, f in _counted(funcs["plugin" if cfg["plugin"] else "vllm"], calls).items():
        setattr(mamba_utils, name, f)
    for name, f in _counted(funcs["copy"], calls).items():
        setattr(mamba_utils, name, f)
    params = SamplingParams(
        temperature=0.0, max_tokens=run["max_tokens"], logprobs=run["logprobs"], detokenize=False, ignore_eos=True
    )
    waves = []
    t0 = time.perf_counter()
    if fault is not None:
        fault.__enter__()
    try:
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
    finally:
        if fault is not None:
            fault.__exit__()
    run_s = time.perf_counter() - t0
    after = plugin_stats()
    del llm
    gc.collect()
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    cleanup_dist_env_and_memory()
    stats = {k: after[k] - before[k] for k in ("steps", "pre_copies", "post_processes", "fallbacks")}
    stats.update({k: after[k] for k in ("replaced", "vllm_version", "active", "reasons")})
    return {
        "engine_start_s": start_s,
        "run_s": run_s,
        "waves": waves,
        "plugin_stats": stats,
        "calls": calls,
        "fault_skipped": fault.skipped if fault is not None else None,
    }


def main(run_path: str, out_path: str) -> None:
    run = json.loads(open(run_path).read())
    t0 = time.perf_counter()
    import vllm
    from vllm.v1.worker import mamba_utils

    # vLLM's own functions; the plugin's are those in their place once LLM() has loaded the plugins.
    funcs: dict[str, dict[str, Any]] = {
        "vllm": {n: getattr(mamba_utils, n) for n in STEP_FUNCS},
        "copy": {n: getattr(mamba_utils, n) for n in VLLM_COPY_FUNCS},
    }
    from importlib.metadata import entry_points

    out: dict[str, Any] = {
        "vllm_version": vllm.__version__,
        "import_s": time.perf_counter() - t0,
        "entry_points": {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")},
        "configs": {},
    }
    for cfg in run["configs"]:
        out["configs"][cfg["name"]] = run_config(run, cfg, mamba_utils, funcs)
        with open(out_path, "w") as f:  # what ran so far, should a later configuration fail
            json.dump(out, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
