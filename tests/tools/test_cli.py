"""The command line, run as a user runs it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


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

    from recoverssm_dev import check_kernels, pd_demo_cli
    from recoverssm_dev.bench import command as bench_command
    from recoverssm_rs.tools import cli

    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Command line") : text.index("## Performance")]
    blocks = [b.replace("\\\n", " ") for b in re.findall(r"```bash\n(.*?)```", section, re.DOTALL)]
    lines = [line.split("#")[0] for block in blocks for line in block.splitlines()]
    installed = [line for line in lines if line.startswith("recoverssm ")]
    checkout = [line for line in lines if line.startswith(".venv/bin/python ")]
    assert len(installed) >= 5 and len(checkout) >= 4
    scripts = {
        "benches/bench.py": bench_command,
        "scripts/check_kernels.py": check_kernels,
        "scripts/pd_demo.py": pd_demo_cli,
    }
    commands, used = set(), set()
    monkeypatch.chdir(tmp_path)  # output files are probed where they would be written
    for line in installed:
        args = cli.build_parser().parse_args(shlex.split(line)[1:])
        commands.add(args.command)
    for line in checkout:
        _, script, *args = shlex.split(line)
        scripts[script].build_parser().parse_args(args)
        used.add(script)
    assert {"presets", "layout", "demo"} <= commands and used == set(scripts)
    assert not commands & {"bench", "check-kernels", "pd-demo"}  # shown as the checkout's scripts
    assert not list(tmp_path.iterdir())  # nothing left behind


def test_no_command_is_a_usage_error_on_stderr():
    r = run()
    assert r.returncode == 2 and r.stdout == ""
    usage, error = r.stderr.splitlines()
    assert usage.startswith("usage: python -m recoverssm_rs ")
    from recoverssm_rs.tools import cli

    commands = list(cli.build_parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    assert {"layout", "presets", "demo", "bench", "check-kernels", "pd-demo"} <= set(commands)
    assert error == f"python -m recoverssm_rs: error: a command is required, one of: {', '.join(commands)} (see --help)"


@pytest.mark.parametrize(
    ("command", "args", "line"),
    [
        ("bench", ["--quick", "--json", "r.json"], ".venv/bin/python benches/bench.py --quick --json r.json"),
        ("check-kernels", ["--help"], ".venv/bin/python scripts/check_kernels.py --help"),
        ("pd-demo", ["--decode-tp", "2"], ".venv/bin/python scripts/pd_demo.py --decode-tp 2"),
    ],
)
def test_a_checkout_tool_says_in_one_line_how_to_run_it(command, args, line, tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "recoverssm_rs", command, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert r.returncode == 1 and r.stdout == ""
    (got,) = r.stderr.splitlines()
    assert got.startswith(f"python -m recoverssm_rs {command}: error: `{command}` is a development tool")
    assert got.endswith(f"run `{line}`")
    assert (ROOT / line.split()[1]).is_file()  # the script it names is there
    assert not list(tmp_path.iterdir())  # nothing ran


def test_the_development_tools_are_not_in_the_package():
    import recoverssm_rs

    package = Path(recoverssm_rs.__file__).parent
    for moved in ("tools/bench", "tools/check_kernels.py", "tools/pd_demo.py", "tools/pd_processes.py"):
        assert not (package / moved).exists(), moved
    # the wheel ships python/recoverssm_rs alone: nothing in it may need the checkout's package
    users = [p.name for p in package.rglob("*.py") if "recoverssm_dev" in p.read_text(encoding="utf-8")]
    assert not users, users
    for name in ("recoverssm_rs.tools.bench", "recoverssm_rs.tools.pd_demo", "recoverssm_rs.tools.check_kernels"):
        r = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 1 and "ModuleNotFoundError" in r.stderr, name


def test_a_missing_nixl_is_one_line_naming_the_extra_it_installs():
    from recoverssm_dev import pd_demo_cli

    code = (
        "import sys\n"
        "for m in ('nixl', 'nixl_cu12', 'nixl_cu13'): sys.modules[m] = None\n"
        f"sys.path.insert(0, {str(ROOT / 'scripts')!r})\n"
        "from recoverssm_dev.pd_demo_cli import main\n"
        "sys.exit(main(['--requests', '1', '--generate', '1']))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.splitlines() == [f"scripts/pd_demo.py: error: {pd_demo_cli.NO_NIXL}"]
    assert "nixl-cu12" in r.stderr and "nixl-cu13" not in r.stderr


def test_check_kernels_script(capsys):
    from recoverssm_dev import check_kernels
    from recoverssm_rs import cuda
    from recoverssm_rs.cuda import nvrtc

    if nvrtc.find_nvrtc() is None:
        pytest.skip("NVRTC not available")
    # The compile is the one the kernel tests' fixture makes (the same module, options and NVRTC):
    # its cached report is reused (tests/cuda/test_kernels.py checks the compiles themselves).
    assert check_kernels.main(["--arch", "sm_80", "--cache", str(nvrtc.default_cache_dir()), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["archs"] == [80] and not out["failed"]
    kernels = {(k["file"], k["kernel"]) for k in out["kernels"]}
    assert {k for _, k in kernels} == set(cuda.KERNEL_NAMES)
    assert all(k["spill_stores"] == 0 and k["stack_frame"] == 0 for k in out["kernels"])
