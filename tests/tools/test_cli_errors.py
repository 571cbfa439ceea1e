"""Every flag of every subcommand (and of the checkout's development tools: ``benches/bench.py``,
``scripts/check_kernels.py``, ``scripts/pd_demo.py``, named here by the command they were), given a
bad value, is refused before any work with one line naming the flag, the value and what it must be
(exit status 2), with the program named as invoked; a layout the core refuses as a whole is one line
and exit status 1; never a traceback.

The cases run in-process (the parse and the checks are quick and cannot hang); the hostile ones,
which crashed, ran for minutes or hung before they were checked up front, run each in its own
process, all at once, under a timeout.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from recoverssm_dev import check_kernels, pd_demo_cli
from recoverssm_dev.bench import command as bench_command
from recoverssm_rs import layouts
from recoverssm_rs.tools import cli
from recoverssm_rs.tools.demo.config import MAX_STEPS

GDN = [
    "--param",
    "num_v_heads=32",
    "--param",
    "head_k_dim=128",
    "--param",
    "head_v_dim=128",
    "--param",
    "conv_kernel_size=4",
]
PROG = "python -m recoverssm_rs"
TMP = "{tmp}"  # a temporary folder, filled in by the tests
ROOT = Path(__file__).resolve().parents[2]
DEV = {
    "bench": (bench_command, "benches/bench.py"),
    "check-kernels": (check_kernels, "scripts/check_kernels.py"),
    "pd-demo": (pd_demo_cli, "scripts/pd_demo.py"),
}
"""The development tools by the command they were: (module with ``main`` / ``build_parser``, script)."""


@dataclass(frozen=True)
class Bad:
    """One bad command line: the flag its one line must name, what the line must contain, the exit
    status; ``hostile``: run in its own process; ``needs``: skip without it."""

    args: list[str]
    flag: str | None
    expect: list[str] = field(default_factory=list)
    code: int = 2
    hostile: bool = False
    needs: str | None = None

    @property
    def id(self) -> str:
        return " ".join(self.args)


def _has_cuda() -> bool:
    try:
        import torch
    except ModuleNotFoundError:
        return False
    return bool(torch.cuda.is_available())


def _has_nvrtc() -> bool:
    from recoverssm_rs.cuda import nvrtc

    return nvrtc.find_nvrtc() is not None


Q = ["--preset", "qwen3-next-80b-a3b"]
BAD = [
    Bad(["--version=1"], "--version", ["'1'"]),
    # ---- layout ----------------------------------------------------------------------------
    Bad(["layout", "--preset", "no-such-model"], "--preset", ["'no-such-model'", "qwen3-next-80b-a3b"]),
    Bad(["layout", "--family", "nope"], "--family", ["'nope'", "gdn"]),
    Bad(["layout", "--list-params", "nope"], "--list-params", ["'nope'", "kda"]),
    Bad(
        ["layout", "--preset", "kimi-k3-like-recoverssm", "--family", "gdn"],
        "--family",
        ["not allowed with argument --preset"],
    ),
    Bad(["layout", "--family", "gdn", "--param", "oops", *GDN], "--param", ["'oops'", "NAME=VALUE"]),
    Bad(["layout", "--family", "gdn", "--param", "num_heads=4", *GDN], "--param", ["'num_heads'", "num_k_heads"]),
    Bad(["layout", "--family", "gdn", *GDN], "--param", ["needs num_k_heads"]),
    Bad(["layout", *Q, "--param", "tp_size=2"], "--param", ["set tp_size with --tp-size"]),
    Bad(
        ["layout", "--family", "gdn", "--param", "num_k_heads=-16", *GDN],
        "--param num_k_heads",
        ["-16", "invalid value -16: must be >= 0"],
    ),
    Bad(
        ["layout", "--family", "gdn", "--param", "num_k_heads=abc", *GDN],
        "--param num_k_heads",
        ["'abc'", "expected an integer"],
    ),
    Bad(
        ["layout", "--family", "gdn", "--param", "num_k_heads=true", *GDN],
        "--param num_k_heads",
        ["'true'", "expected an integer"],
    ),
    Bad(
        ["layout", "--family", "gdn", "--param", "num_k_heads=16", *GDN, "--param", "recover_ssm=maybe"],
        "--param recover_ssm",
        ["'maybe'", "must be a bool"],
    ),
    Bad(["layout", *Q, "--param", "num_k_heads=abc"], "--param num_k_heads", ["'abc'", "integer"]),
    Bad(["layout", *Q, "--tp-size", "abc"], "--tp-size", ["'abc'"]),
    Bad(["layout", *Q, "--tp-size", "-2"], "--tp-size", ["-2", "must be >= 0"]),
    Bad(["layout", *Q, "--tp-size", "0"], "--tp-size", ["0", "tp_size must be >= 1"]),
    Bad(["layout", *Q, "--tp-size", "3"], "--tp-size", ["3", "not divisible by tp_size = 3"]),
    Bad(["layout", *Q, "--tp-size", "1000000"], "--tp-size", ["1000000", "not divisible"]),
    # the family's parameters were all given, yet only --tp-size going back to its default makes the
    # layout build: the error is --tp-size's, as with a preset
    Bad(
        ["layout", "--family", "gdn", "--param", "num_k_heads=16", *GDN, "--tp-size", "3"],
        "--tp-size",
        ["3", "not divisible by tp_size = 3"],
    ),
    Bad(["layout", *Q, "--num-spec", "-1"], "--num-spec", ["-1", "must be >= 0"]),
    Bad(["layout", *Q, "--num-spec", "999999999999"], "--num-spec", ["999999999999", "too large"]),
    Bad(["layout", *Q, "--num-spec", "1000000"], "--num-spec", ["1000000", "must be <= 256"]),
    Bad(
        ["layout", "--family", "gdn", "--param", "num_k_heads=16", *GDN, "--num-spec", "257"], "--num-spec", ["<= 256"]
    ),
    Bad(["layout", *Q, "--conv-layout", "XY"], "--conv-layout", ["'XY'", "'SD'", "'DS'"]),
    Bad(["layout", *Q, "--dtype", "float7"], "--dtype", ["'float7'", "bfloat16"]),
    Bad(["layout", *Q, "--dtype", "float128"], "--dtype", ["'float128'", "bfloat16"]),
    Bad(["layout", *Q, "--ssm-dtype", "int4"], "--ssm-dtype", ["'int4'", "float32"]),
    Bad(["layout", *Q, "--ssm-dtype", ""], "--ssm-dtype", ["''", "float32"]),
    Bad(["layout", *Q, "--json", TMP], "--json", ["is a folder"]),
    Bad(["layout", *Q, "--json", f"{TMP}/no/x.json"], "--json", ["does not exist"]),
    # no parameter alone is to blame: the layout as a whole, exit status 1
    Bad(
        [
            "layout",
            "--family",
            "gdn",
            "--param",
            "num_k_heads=1000000000",
            "--param",
            "num_v_heads=1000000000",
            "--param",
            "head_k_dim=1000000",
            "--param",
            "head_v_dim=100000",
            "--param",
            "conv_kernel_size=4",
            "--num-spec",
            "2",
        ],
        None,
        ["LayoutError: ", "overflows 64 bits"],
        code=1,
    ),
    Bad(["layout"], None, ["--preset NAME or --family NAME"]),
    # ---- presets ---------------------------------------------------------------------------
    Bad(["presets", "--json", TMP], "--json", ["is a folder"]),
    # ---- demo ------------------------------------------------------------------------------
    Bad(["demo", "--steps", "0"], "--steps", ["0", "from 1 to"]),
    Bad(["demo", "--steps", "many"], "--steps", ["'many'", f"from 1 to {MAX_STEPS} inclusive"]),
    Bad(["demo", "--steps", "1e23"], "--steps", ["'1e23'", "an integer"]),
    Bad(["demo", "--steps", str(10**23)], "--steps", [str(10**23), f"from 1 to {MAX_STEPS} inclusive"]),
    Bad(["demo", "--requests", "0"], "--requests", ["0", ">= 1"]),
    Bad(["demo", "--layers", "-1"], "--layers", ["-1", ">= 1"]),
    Bad(["demo", "--num-spec", "0"], "--num-spec", ["0", ">= 1"]),
    Bad(["demo", "--block-size", "3"], "--block-size", ["3", "--num-spec 3", "block_size >= num_spec + 1"]),
    Bad(["demo", "--num-spec", "40"], "--num-spec", ["40", "--block-size 8", "(41 tokens)"]),
    Bad(["demo", "--num-spec", "40", "--block-size", "8"], "--block-size", ["8", "--num-spec 40", "(41 tokens)"]),
    Bad(["demo", "--num-spec", "300", "--block-size", "1024"], "--num-spec", ["300", "<= 256"]),
    Bad(["demo", "--threads", "-1"], "--threads", ["-1", "from 0 to"]),
    Bad(["demo", "--threads", "99999"], "--threads", ["99999", f"from 0 to {os.cpu_count()} inclusive"]),
    Bad(["demo", "--seed", "-1"], "--seed", ["-1", "from 0 to"]),
    Bad(["demo", "--device", "nonsense"], "--device", ["'nonsense'", "must be cpu, cuda or cuda:N"]),
    Bad(["demo", "--device", "tpu"], "--device", ["'tpu'", "must be cpu, cuda or cuda:N"]),
    Bad(
        ["demo", "--preset", "nemotron-h-8b"],
        "--preset",
        ["'nemotron-h-8b'", "not a RecoverSSM preset", "kimi-k3-like-recoverssm"],
    ),
    Bad(["demo", "--json", TMP], "--json", ["is a folder"]),
    Bad(["demo", "--quiet=yes"], "--quiet", ["'yes'"]),
    Bad(["demo", "--layout-only=yes"], "--layout-only", ["'yes'"]),
    Bad(["demo", "--layout-only", "--preset", "nope"], "--preset", ["'nope'", "qwen3-next-80b-a3b"]),
    Bad(
        ["demo", "--layers", "100000000"], "--layers", ["100000000", "more than the", "memory available"], hostile=True
    ),
    Bad(["demo", "--requests", "100000000"], "--requests", ["100000000", "memory available"], hostile=True),
    Bad(["demo", "--requests", "1000000000000"], "--requests", ["num_blocks must be in 2 ..= 2**31 - 1"], hostile=True),
    Bad(["demo", "--block-size", str(10**18)], "--block-size", [str(10**18), "from 1 to 1024 inclusive"], hostile=True),
    Bad(["demo", "--num-spec", "999999999999"], "--num-spec", ["999999999999", "too large"], hostile=True),
    # ---- check-kernels ---------------------------------------------------------------------
    Bad(["check-kernels", "--arch", "abc"], "--arch", ["'abc'", "sm_90"]),
    Bad(["check-kernels", "--arch", "sm_100000"], "--arch", ["'sm_100000'", "10 to 999 inclusive"]),
    Bad(["check-kernels", "--arch", "990"], "--arch", ["sm_990", "compiles for", "sm_80"], needs="nvrtc"),
    Bad(["check-kernels", "--json", TMP], "--json", ["is a folder"]),
    Bad(["check-kernels", "--cache", __file__], "--cache", ["not a folder"]),
    # ---- bench -----------------------------------------------------------------------------
    Bad(["bench", "--quick=1"], "--quick", ["'1'"]),
    Bad(["bench", "--only", "gpu"], "--only", ["'gpu'", "'plan'"]),
    Bad(["bench", "--requests", "0"], "--requests", ["'0'", ">= 1"]),
    Bad(["bench", "--requests", "1,x"], "--requests", ["'1,x'", "integers"]),
    Bad(["bench", "--layers", "-1"], "--layers", ["-1", ">= 1"]),
    Bad(["bench", "--sizes", "3K"], "--sizes", ["'3K'", "4K"]),
    Bad(["bench", "--batches", "0"], "--batches", ["'0'", ">= 1"]),
    Bad(["bench", "--budget", "0"], "--budget", ["'0'", "above 0 and at most 60"]),
    Bad(["bench", "--budget", "nan"], "--budget", ["'nan'", "above 0"]),
    Bad(["bench", "--budget", "1e30"], "--budget", ["'1e30'", "at most 60"]),
    Bad(["bench", "--threads", "0"], "--threads", ["0", f"from 1 to {os.cpu_count()} inclusive"]),
    Bad(["bench", "--threads", "999999"], "--threads", ["999999", f"from 1 to {os.cpu_count()} inclusive"]),
    Bad(["bench", "--gpu=1"], "--gpu", ["'1'"]),
    Bad(["bench", "--gpu-args=--requests 1"], "--gpu-args", ["only with --gpu"]),
    Bad(["bench", "--gpu", "--gpu-args='x"], "--gpu-args", ['"\'x"', "quotation"]),
    Bad(["bench", "--quiet=1"], "--quiet", ["'1'"]),
    Bad(["bench", "--layers", "100000000"], "--layers", ["100000000", "cannot be mapped here"], hostile=True),
    Bad(
        ["bench", "--requests", "1000000000000"], "--requests", ["1000000000000", "cannot be mapped here"], hostile=True
    ),
    Bad(["bench", "--batches", "100000000"], "--batches", ["100000000", "memory available"], hostile=True),
    Bad(["bench", "--json", TMP], "--json", ["is a folder"], hostile=True),
    Bad(["bench", "--json", "/proc/x.json"], "--json", ["'/proc/x.json'", "cannot be created"], hostile=True),
    Bad(["bench", "--json", f"{TMP}/no/r.json"], "--json", ["does not exist"], hostile=True),
    Bad(["bench", "--plot", "x.txt"], "--plot", ["'x.txt'", ".png, .svg or .pdf"], hostile=True),
    Bad(["bench", "--plot", TMP], "--plot", [".png, .svg or .pdf"], hostile=True),
    Bad(["bench", "--plot", f"{TMP}.png/"], "--plot", [".png, .svg or .pdf"], hostile=True),
    # ---- pd-demo ---------------------------------------------------------------------------
    Bad(["pd-demo", "--prefill-tp", "3"], "--prefill-tp", ["3", "not divisible by tp_size = 3"]),
    Bad(["pd-demo", "--decode-tp", "16"], "--decode-tp", ["16", "not divisible by tp_size = 16"]),
    Bad(["pd-demo", "--prefill-layout", "XY"], "--prefill-layout", ["'XY'", "'SD'"]),
    Bad(["pd-demo", "--decode-layout", "XY"], "--decode-layout", ["'XY'", "'DS'"]),
    Bad(["pd-demo", "--prefill-spec", "99999999999"], "--prefill-spec", ["99999999999", "too large"]),
    Bad(["pd-demo", "--decode-spec", "1000"], "--decode-spec", ["1000", "<= 256"]),
    Bad(["pd-demo", "--seed", "-1"], "--seed", ["-1", "from 0 to"]),
    Bad(["pd-demo", "--generate", "0"], "--generate", ["0", "from 1 to 4096 inclusive"]),
    Bad(["pd-demo", "--generate", "100000"], "--generate", ["100000", "from 1 to 4096 inclusive"]),
    Bad(["pd-demo", "--json", TMP], "--json", ["is a folder"]),
    Bad(["pd-demo", "--quiet=1"], "--quiet", ["'1'"]),
    Bad(["pd-demo", "--verbose=1"], "--verbose", ["'1'"]),
    Bad(["pd-demo", "--requests", "-1"], "--requests", ["-1", ">= 1"], hostile=True),
    Bad(["pd-demo", "--requests", "0"], "--requests", ["0", ">= 1"], hostile=True),
    Bad(["pd-demo", "--layers", "0"], "--layers", ["0", ">= 1"], hostile=True),
    Bad(["pd-demo", "--prefill-spec", "-1"], "--prefill-spec", ["-1", ">= 0"], hostile=True),
    Bad(["pd-demo", "--decode-spec", "-2"], "--decode-spec", ["-2", ">= 0"], hostile=True),
    Bad(["pd-demo", "--generate", "-5"], "--generate", ["-5", "from 1 to"], hostile=True),
    Bad(["pd-demo", "--requests", "100000000"], "--requests", ["100000000", "memory available"], hostile=True),
    Bad(["pd-demo", "--decode-spec", "999999999"], "--decode-spec", ["999999999", "<= 256"], hostile=True),
    # ---- simulate (the flags are checked before the trace is read) -------------------------
    Bad(["simulate", "t.jsonl", "--policy", "lru"], "--policy", ["'lru'", "vllm, sglang-lru, marconi, recoverssm"]),
    Bad(["simulate", "t.jsonl", "--block-size", "0"], "--block-size", ["0", "1..="]),
    Bad(["simulate", "t.jsonl", "--granularity", "-1"], "--granularity", ["-1", "1..="]),
    Bad(["simulate", "t.jsonl", "--budget-checkpoints", "0"], "--budget-checkpoints", ["0", "1..="]),
    Bad(["simulate", "t.jsonl", "--budget-bytes", "10"], "--budget-bytes", ["needs state_bytes"]),
    Bad(["simulate", "t.jsonl", "--budget-bytes", "5", "--state-bytes", "0"], "--state-bytes", ["0", ">= 1 byte"]),
    Bad(["simulate", "t.jsonl", "--json", TMP], "--json", ["is a folder"]),
    Bad(["simulate", "t.jsonl", "--plot", "out.gif"], "--plot", ["out.gif", "must end in .png, .svg or .pdf"]),
]
if not _has_cuda():
    BAD.append(Bad(["demo", "--device", "cuda"], "--device", ["'cuda'", "CUDA is not available"]))
    BAD.append(
        Bad(
            ["bench", "--gpu"],
            None,
            ["BackendUnavailableError: bench --gpu: torch sees no CUDA device"],
            code=1,
            needs="torch",
        )
    )

QUICK = [c for c in BAD if not c.hostile]
HOSTILE = [c for c in BAD if c.hostile]


def _fill(args: list[str], tmp: str) -> list[str]:
    return [a.replace(TMP, tmp) for a in args]


def _skip_unless_available(case: Bad) -> None:
    if case.needs == "nvrtc" and not _has_nvrtc():
        pytest.skip("NVRTC not available")
    if case.needs == "torch":
        pytest.importorskip("torch")


def _prog(case: Bad) -> str:
    """How the case's program names itself: ``PROG COMMAND``, ``PROG`` or the development script."""
    command = case.args[0] if not case.args[0].startswith("-") else None
    if command in DEV:
        return DEV[command][1]
    return f"{PROG} {command}" if command else PROG


def _argv(case: Bad, tmp: str) -> list[str]:
    """The case's command line as a process runs it."""
    args = _fill(case.args, tmp)
    if args[0] in DEV:
        return [sys.executable, str(ROOT / DEV[args[0]][1]), *args[1:]]
    return [sys.executable, "-m", "recoverssm_rs", *args]


def _check(case: Bad, code: int | None, out: str, err: str) -> None:
    assert code == case.code, (code, err)
    assert "Traceback" not in err
    assert out == ""  # refused before anything ran
    lines = err.splitlines()
    assert len(lines) == 1, err
    line = lines[0]
    prog = _prog(case)
    if case.code == 2 and case.flag:
        assert line.startswith(f"{prog}: error: argument {case.flag}"), line
    elif case.code == 2 or case.args[0] in DEV:
        assert line.startswith(f"{prog}: error: "), line
    else:
        assert line.startswith(f"{PROG}: error: "), line
        if case.flag:
            assert f"argument {case.flag}" in line
    assert line.count("(see ") <= 1, line  # one hint
    assert not re.search(r"\d ?\.\.[^=.]", line), line  # ranges in words (or the core's inclusive ..=), never 1..8
    assert "host integer" not in line, line
    for text in case.expect:
        assert text in line, (text, line)


@pytest.mark.parametrize("case", QUICK, ids=[c.id for c in QUICK])
def test_a_bad_value_gets_one_line_naming_the_flag(case, capsys, tmp_path):
    _skip_unless_available(case)
    args = _fill(case.args, str(tmp_path))
    with pytest.raises(SystemExit) as e:
        if args[0] in DEV:
            module, script = DEV[args[0]]
            module.main(args[1:], prog=script)
        else:
            cli.main(args, prog=PROG)
    out, err = capsys.readouterr()
    _check(case, e.value.code, out, err)


@pytest.fixture(scope="module")
def hostile_runs(tmp_path_factory):
    """Every hostile command line started at once, each in its own process."""
    tmp = str(tmp_path_factory.mktemp("hostile"))
    procs = {
        c.id: subprocess.Popen(_argv(c, tmp), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for c in HOSTILE
    }
    yield procs
    for p in procs.values():
        if p.poll() is None:
            p.kill()
            p.communicate()


@pytest.mark.parametrize("case", HOSTILE, ids=[c.id for c in HOSTILE])
def test_a_hostile_value_is_refused_up_front_in_its_own_process(case, hostile_runs):
    proc = hostile_runs[case.id]
    out, err = proc.communicate(timeout=90)  # before the checks: tracebacks, minutes, hangs
    _check(case, proc.returncode, out, err)


def _parsers() -> dict[str, argparse.ArgumentParser]:
    """The command line's parsers by command (``""``: the top level), the development tools' in
    place of the commands that say how to run them."""
    parser = cli.build_parser()
    sub = parser._subparsers._group_actions[0]  # type: ignore[union-attr]
    return {"": parser, **sub.choices, **{name: module.build_parser() for name, (module, _) in DEV.items()}}


def test_every_flag_of_every_command_has_a_bad_value_case():
    covered = {(c.args[0] if not c.args[0].startswith("-") else "", c.flag.split()[0]) for c in BAD if c.flag}
    missing = [
        (name, action.option_strings[-1])
        for name, parser in _parsers().items()
        for action in parser._actions
        if action.option_strings
        and action.option_strings[-1] != "--help"
        and (name, action.option_strings[-1]) not in covered
    ]
    assert not missing


def test_errors_name_the_program_as_invoked(capsys):
    from recoverssm_rs.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(["demo", "--layers", "0"])  # the console script's name
    assert e.value.code == 2
    assert capsys.readouterr().err.startswith("recoverssm demo: error: argument --layers: ")
    code = "import sys; from recoverssm_rs.__main__ import main; sys.exit(main())"
    r = subprocess.run(
        [sys.executable, "-c", code, "demo", "--requests", "0"], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines() == [
        "recoverssm demo: error: argument --requests: invalid value 0: must be >= 1 (see --help)"
    ]


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
    assert err == ("recoverssm: error: PlanError: request 3: state block 99 is outside 0..8 second line\n")


def test_list_params_comes_from_the_calculator(capsys):
    import inspect

    for family, calc in layouts.FAMILIES.items():
        assert cli.main(["layout", "--list-params", family]) == 0
        out = capsys.readouterr().out
        names = list(inspect.signature(calc).parameters)
        listed = [line.split()[0] for line in out.splitlines()[2:]]
        assert listed == names
        assert cli.main(["layout", "--list-params", family, "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert [p["name"] for p in doc["parameters"]] == names
        if family == "gdn":
            assert doc["parameters"][0] == {
                "name": "num_k_heads",
                "required": True,
                "default": None,
                "flag": "--param num_k_heads",
            }
            assert "num_k_heads          required" in out
            assert "tp_size              default 1; flag --tp-size" in out
            assert "recover_ssm          default False" in out


def test_every_flag_has_help_and_help_shows_defaults():
    for name, parser in _parsers().items():
        for action in parser._actions:
            if action.option_strings:
                assert action.help, (name, action.option_strings)
        text = parser.format_help()
        assert "``" not in text and ":func:" not in text and ":meth:" not in text, name
        assert "(default: None)" not in text and "(default: False)" not in text, name
    demo_help = _parsers()["demo"].format_help()
    for default in (
        "(default: 384)",
        "(default: cpu)",
        "(default: 8)",
        "(default: 3)",
        "(default: kimi-k3-like-recoverssm)",
    ):
        assert default in demo_help


def test_help_is_wrapped_to_the_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    for name, parser in _parsers().items():
        long = [line for line in parser.format_help().splitlines() if len(line) > 80]
        assert not long, (name, long)


def test_every_command_spells_the_shared_options_alike():
    for name, parser in _parsers().items():
        if not name:
            continue
        by_flag = {a.option_strings[-1]: a for a in parser._actions if a.option_strings}
        assert "--json" in by_flag, name
        js = by_flag["--json"]
        assert js.nargs == "?" and js.const == "-" and js.metavar == "FILE", name
        assert "--no-progress" not in by_flag, name
    for name in ("demo", "bench", "pd-demo"):
        assert "--quiet" in {a.option_strings[-1] for a in _parsers()[name]._actions if a.option_strings}


def test_help_runs_for_every_command():
    def argv(name: str) -> list[str]:
        if name in DEV:
            return [sys.executable, str(ROOT / DEV[name][1]), "--help"]
        return [sys.executable, "-m", "recoverssm_rs", *([name] if name else []), "--help"]

    procs = {
        name: subprocess.Popen(argv(name), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name in _parsers()
    }
    for name, p in procs.items():
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0 and out.startswith("usage: ") and err == "", name


def test_pd_demo_run_checks_its_config_before_any_process():
    from recoverssm_dev.pd_demo import Config, PdOptionError, run

    for cfg, option, text in [
        (Config(requests=-1), "requests", "must be >= 1"),
        (Config(prefill_tp=3), "prefill_tp", "not divisible by tp_size = 3"),
        (Config(decode_spec=-1), "decode_spec", "must be >= 0"),
        (Config(generate=0), "generate", "must be from 1 to 4096 inclusive"),
        (Config(decode_layout="XY"), "decode_layout", "unknown conv layout 'XY'"),
        (Config(layers=True), "layers", "expected an integer"),
    ]:
        with pytest.raises(PdOptionError, match=text) as e:
            run(cfg)
        assert e.value.option == option
