"""The command line, run as a user runs it."""

import json
import subprocess
import sys


def run(*args):
    return subprocess.run([sys.executable, "-m", "recoverssm_rs", *args],
                          capture_output=True, text=True, timeout=120)


def test_layout_preset_json_lists_roles():
    r = run("layout", "--preset", "kimi-k3-like-recoverssm", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [s["role"] for s in doc["states"]] == ["persistent", "persistent", "workspace", "workspace"]
    assert doc["copyable_prefix_len"] == 2 and doc["num_layers"] == 48


def test_layout_table():
    r = run("layout", "--preset", "qwen3-next-80b-a3b", "--tp-size", "2")
    assert r.returncode == 0, r.stderr
    assert "temporal" in r.stdout and "(16, 128, 128)" in r.stdout and "per block" in r.stdout


def test_parameterised_layout_error_exits_non_zero():
    r = run("layout", "--family", "gdn", "--param", "num_k_heads=16", "--param", "num_v_heads=32",
            "--param", "head_k_dim=128", "--param", "head_v_dim=128", "--param", "conv_kernel_size=4",
            "--tp-size", "3")
    # the core's message names two parameters the user gave: a layout error, exit 1
    assert r.returncode == 1, r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith("python -m recoverssm_rs: error: LayoutError: ")
    assert "not divisible by tp_size = 3" in r.stderr
    # with a preset only --tp-size was given: the error names that flag
    r = run("layout", "--preset", "qwen3-next-80b-a3b", "--tp-size", "3")
    assert r.returncode == 2
    assert "argument --tp-size: invalid value 3: " in r.stderr
    assert "not divisible by tp_size = 3" in r.stderr


def test_parameterised_layout():
    r = run("layout", "--family", "linear_attention", "--param", "num_heads=8",
            "--param", "head_dim=64", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["states"][0]["shape"] == [8, 64, 64]


def test_presets_lists_every_preset():
    from recoverssm_rs import layouts

    r = run("presets")
    assert r.returncode == 0
    for name in layouts.PRESETS:
        assert name in r.stdout
