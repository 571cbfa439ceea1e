"""The command line answers every bad argument with one line naming the flag and its value, and a
non-zero exit status; never a traceback. Each case runs as a user runs it, in a subprocess."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest
from recoverssm_rs import layouts
from recoverssm_rs.tools import cli

GDN = ["--param", "num_v_heads=32", "--param", "head_k_dim=128", "--param", "head_v_dim=128",
       "--param", "conv_kernel_size=4"]
PROG = "python -m recoverssm_rs"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "recoverssm_rs", *args],
                          capture_output=True, text=True, timeout=120)


def _has_cuda() -> bool:
    try:
        import torch
    except ModuleNotFoundError:
        return False
    return bool(torch.cuda.is_available())


# (arguments, what the one line must contain: the flag and the value, and the allowed range)
BAD = [
    (["demo", "--steps", "0"], ["argument --steps", "0", ">= 1"]),
    (["demo", "--requests", "0"], ["argument --requests", "0", ">= 1"]),
    (["demo", "--layers", "-1"], ["argument --layers", "-1", ">= 1"]),
    (["demo", "--num-spec", "0"], ["argument --num-spec", "0", ">= 1"]),
    (["demo", "--block-size", "3"],
     ["argument --block-size", "3", "--num-spec 3", "block_size >= num_spec + 1"]),
    (["demo", "--num-spec", "40"],
     ["argument --block-size", "8", "--num-spec 40", "(41 tokens)", "block_size >= num_spec + 1"]),
    (["demo", "--threads", "-1"], ["argument --threads", "-1", ">= 0"]),
    (["demo", "--seed", "-1"], ["argument --seed", "-1", "0.."]),
    (["demo", "--steps", "many"], ["argument --steps", "'many'", ">= 1"]),
    (["demo", "--device", "nonsense"], ["argument --device", "'nonsense'"]),
    (["demo", "--preset", "nemotron-h-8b"],
     ["argument --preset", "'nemotron-h-8b'", "not a RecoverSSM preset",
      "kimi-k3-like-recoverssm"]),
    (["layout", "--preset", "qwen3-next-80b-a3b", "--tp-size", "-2"],
     ["argument --tp-size", "-2", "non-negative"]),
    (["layout", "--preset", "qwen3-next-80b-a3b", "--num-spec", "-1"],
     ["argument --num-spec", "-1", "non-negative"]),
    (["layout", "--preset", "qwen3-next-80b-a3b", "--tp-size", "0"],
     ["argument --tp-size", "0", "tp_size must be >= 1"]),
    (["layout", "--family", "gdn", "--param", "num_k_heads=-16", *GDN],
     ["argument --param num_k_heads", "-16", "non-negative"]),
    (["layout", "--family", "gdn", "--param", "num_k_heads=abc", *GDN],
     ["argument --param num_k_heads", "'abc'", "integer"]),
    (["layout", "--preset", "qwen3-next-80b-a3b", "--param", "num_k_heads=abc"],
     ["argument --param num_k_heads", "'abc'", "integer"]),
    (["layout", "--family", "gdn", "--param", "num_heads=4", *GDN],
     ["argument --param", "'num_heads'", "num_k_heads"]),
    (["layout", "--family", "gdn", *GDN], ["argument --param", "needs num_k_heads"]),
    (["layout", "--family", "gdn", "--param", "oops", *GDN], ["argument --param", "'oops'",
                                                              "NAME=VALUE"]),
    (["layout", "--preset", "qwen3-next-80b-a3b", "--dtype", "float7"],
     ["argument --dtype", "'float7'", "bfloat16"]),
    (["layout", "--preset", "kimi-k3-like-recoverssm", "--family", "gdn"],
     ["argument --family", "not allowed with argument --preset"]),
    (["layout"], ["--preset NAME or --family NAME"]),
    (["layout", "--preset", "no-such-model"], ["argument --preset", "'no-such-model'"]),
]
if not _has_cuda():
    BAD.append((["demo", "--device", "cuda"],
                ["argument --device", "'cuda'", "CUDA is not available"]))


@pytest.mark.parametrize("args, expect", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_a_bad_value_gets_one_line_naming_the_flag(args, expect):
    r = run(*args)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr
    assert r.stdout == ""  # refused before anything ran
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(f"{PROG} {args[0]}: error: ")
    for text in expect:
        assert text in lines[0], (text, lines[0])


def test_a_core_error_while_running_is_one_line_exit_1(monkeypatch, capsys):
    from recoverssm_rs.errors import PlanError

    def broken(args):
        raise PlanError("request 3: state block 99 is outside 0..8\nsecond line")

    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda prog=cli.PROG: parser)
    for action in parser._subparsers._group_actions[0].choices.values():  # type: ignore[union-attr]
        action.set_defaults(func=broken)
    with pytest.raises(SystemExit) as e:
        cli.main(["presets"])
    assert e.value.code == 1
    err = capsys.readouterr().err
    assert err == ("recoverssm: error: PlanError: request 3: state block 99 is outside 0..8 "
                   "second line\n")


def test_list_params_comes_from_the_calculator():
    import inspect

    for family, calc in layouts.FAMILIES.items():
        r = run("layout", "--list-params", family)
        assert r.returncode == 0, r.stderr
        names = list(inspect.signature(calc).parameters)
        listed = [line.split()[0] for line in r.stdout.splitlines()[2:]]
        assert listed == names
    r = run("layout", "--list-params", "gdn")
    assert "num_k_heads          required" in r.stdout
    assert "tp_size              default 1; flag --tp-size" in r.stdout
    assert "recover_ssm          default False" in r.stdout


def test_preset_and_family_together_is_an_error():
    r = run("layout", "--preset", "qwen3-next-80b-a3b", "--family", "kda")
    assert r.returncode == 2 and "not allowed with argument --preset" in r.stderr
    assert r.stdout == ""
    r = run("layout", "--family", "gdn", "--list-params", "gdn")
    assert r.returncode == 2 and "not allowed with argument --family" in r.stderr


def _parsers() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    sub = parser._subparsers._group_actions[0]  # type: ignore[union-attr]
    return {"": parser, **sub.choices}


def test_every_flag_has_help_and_help_shows_defaults():
    for name, parser in _parsers().items():
        for action in parser._actions:
            if action.option_strings:
                assert action.help, (name, action.option_strings)
        text = parser.format_help()
        assert "``" not in text and ":func:" not in text and ":meth:" not in text, name
        assert "old demo" not in text, name
    demo_help = _parsers()["demo"].format_help()
    for default in ("(default: 384)", "(default: cpu)", "(default: 8)", "(default: 3)",
                    "(default: kimi-k3-like-recoverssm)"):
        assert default in demo_help
    assert "(default: None)" not in demo_help and "(default: False)" not in demo_help


def test_help_runs_for_every_command():
    for args in ([], ["layout"], ["presets"], ["demo"]):
        r = run(*args, "--help")
        assert r.returncode == 0 and r.stdout.startswith("usage: ") and r.stderr == ""
