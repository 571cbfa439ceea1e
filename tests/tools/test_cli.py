"""The command line, run as a user runs it."""

import json
import subprocess
import sys


def run(*args):
    return subprocess.run([sys.executable, "-m", "recoverssm_rs", *args], capture_output=True, text=True, timeout=120)


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


def test_a_layout_error_names_the_one_flag_to_blame_or_the_layout():
    gdn = [
        "layout",
        "--family",
        "gdn",
        "--param",
        "num_k_heads=16",
        "--param",
        "num_v_heads=32",
        "--param",
        "head_k_dim=128",
        "--param",
        "head_v_dim=128",
        "--param",
        "conv_kernel_size=4",
    ]
    # the layout builds when --tp-size alone goes back to its default: that flag's error, exit 2
    r = run(*gdn, "--tp-size", "3")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("python -m recoverssm_rs layout: error: argument --tp-size: invalid value 3: ")
    assert "not divisible by tp_size = 3" in r.stderr and r.stderr.count("\n") == 1
    r = run("layout", "--preset", "qwen3-next-80b-a3b", "--tp-size", "3")
    assert r.returncode == 2 and "argument --tp-size: invalid value 3: " in r.stderr
    # two flags each make it build when reverted: no single one to blame, the layout's error (exit 1)
    r = run("layout", "--preset", "qwen3-next-80b-a3b", "--tp-size", "2", "--param", "num_k_heads=1")
    assert r.returncode == 1, r.stderr
    assert r.stderr.startswith(
        "python -m recoverssm_rs: error: LayoutError: gdn: num_k_heads = 1 is not divisible by tp_size = 2"
    )
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


def test_json_to_a_file_keeps_the_text_on_stdout(tmp_path):
    path = tmp_path / "layout.json"
    r = run("layout", "--preset", "kimi-k3-like-recoverssm", "--json", str(path))
    assert r.returncode == 0, r.stderr
    assert "persistent" in r.stdout and "per block" in r.stdout  # the table
    doc = json.loads(path.read_text())
    assert doc["preset"] == "kimi-k3-like-recoverssm" and doc["num_layers"] == 48
    r = run("presets", "--json", "-")
    from recoverssm_rs import layouts

    assert set(json.loads(r.stdout)) == set(layouts.PRESETS)


def test_the_output_check_leaves_files_as_they_were(tmp_path):
    import argparse

    import pytest
    from recoverssm_rs.tools.cli_args import output_path

    check = output_path((".png",))
    new = tmp_path / "new.png"
    assert check(str(new)) == str(new) and not new.exists()  # probed, not left behind
    old = tmp_path / "old.png"
    old.write_bytes(b"keep")
    assert check(str(old)) == str(old) and old.read_bytes() == b"keep"
    (tmp_path / "ro").mkdir()
    for bad, why in [
        (str(tmp_path), "suffix"),
        (str(tmp_path / "x.txt"), ".png"),
        (str(tmp_path / "d.png"), "is a folder"),
    ]:
        if why == "is a folder":
            (tmp_path / "d.png").mkdir()
        with pytest.raises(argparse.ArgumentTypeError, match=why if why != "suffix" else ".png"):
            check(bad)
    assert output_path(stdout=True)("-") == "-"
    with pytest.raises(argparse.ArgumentTypeError, match="must end in"):
        check("-")


def test_parameterised_layout():
    r = run("layout", "--family", "linear_attention", "--param", "num_heads=8", "--param", "head_dim=64", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["states"][0]["shape"] == [8, 64, 64]


def test_presets_lists_every_preset():
    from recoverssm_rs import layouts

    r = run("presets")
    assert r.returncode == 0
    for name in layouts.PRESETS:
        assert name in r.stdout


def test_the_readme_command_lines_parse(tmp_path, monkeypatch):
    import re
    import shlex
    from pathlib import Path

    from recoverssm_rs.tools import cli

    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = text[text.index("## Command line") : text.index("## Performance")]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL).group(1).replace("\\\n", " ")
    lines = [line.split("#")[0] for line in block.splitlines() if line.startswith("recoverssm ")]
    assert len(lines) >= 8
    commands = set()
    monkeypatch.chdir(tmp_path)  # output files are probed where they would be written
    for line in lines:
        args = cli.build_parser().parse_args(shlex.split(line)[1:])
        commands.add(args.command)
    assert commands == {"presets", "layout", "demo", "check-kernels", "bench", "pd-demo"}
    assert not list(tmp_path.iterdir())  # nothing left behind
