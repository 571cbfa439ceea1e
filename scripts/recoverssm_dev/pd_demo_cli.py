"""``scripts/pd_demo.py``: the P/D demo's options, their up-front check, and the run's output.

Every option is checked before a process starts (:func:`recoverssm_dev.pd_demo.validate`: the
demo's ranges, both sides' layouts built by the core, the memory the run takes); a bad one is one
line naming the flag, the value and what it must be, exit status 2. A missing NIXL is one line and
exit status 1, as is a child process's failure. Progress lines go to stderr (none with
``--quiet``); NIXL's INFO logging only with ``--verbose``. Ctrl-C ends both child processes and is
one line, exit status 130.
"""

from __future__ import annotations

import argparse
import sys

from recoverssm_rs.errors import RecoverSSMError
from recoverssm_rs.tools.cli_args import (
    HelpFormatter,
    Parser,
    add_json_option,
    add_quiet_option,
    fail,
    int_at_least,
    write_json,
)

from .pd_demo import MAX_GENERATE, Config, PdOptionError, format_summary, passed, run, validate

__all__ = ["NO_NIXL", "PROG", "build_parser", "main"]

PROG = "scripts/pd_demo.py"
"""The program's name in its messages."""

NO_NIXL = "the P/D demo needs NIXL, which is not installed: pip install 'recoverssm_rs[nixl]' (it installs nixl-cu12)"
"""The line that answers a missing NIXL (exit status 1)."""

_FLAGS = {
    "requests": "--requests",
    "layers": "--layers",
    "prefill_tp": "--prefill-tp",
    "decode_tp": "--decode-tp",
    "prefill_layout": "--prefill-layout",
    "decode_layout": "--decode-layout",
    "prefill_spec": "--prefill-spec",
    "decode_spec": "--decode-spec",
    "generate": "--generate",
    "seed": "--seed",
}
"""Config field -> the flag that sets it."""

_DESCRIPTION = (
    "Prefill and decode in two OS processes with their own TP size, conv layout and num_spec: "
    "a toy GDN + KDA stack (8 heads of 8) is prefilled on one side, its states pulled over NIXL "
    "with re-sharding, decoded in speculative windows on the other and checked against "
    "one-instance decoding (exit status 1 on any mismatch).\n\n"
    "Needs NIXL: pip install 'recoverssm_rs[nixl]' (nixl-cu12). The transfer time printed includes the connection "
    "set-up: it is not a bandwidth (benches/transfer.py measures that)."
)


def _configure(p: argparse.ArgumentParser) -> None:
    d = Config()
    p.add_argument("--requests", type=int_at_least(1), default=d.requests, help="requests prefilled and decoded")
    p.add_argument("--layers", type=int_at_least(1), default=d.layers, help="layers (alternating GDN, KDA)")
    p.add_argument(
        "--prefill-tp",
        type=int_at_least(1),
        default=d.prefill_tp,
        dest="prefill_tp",
        metavar="N",
        help="tensor-parallel ranks of the prefill instance (must divide the toy model's 8 heads)",
    )
    p.add_argument(
        "--decode-tp",
        type=int_at_least(1),
        default=d.decode_tp,
        dest="decode_tp",
        metavar="N",
        help="tensor-parallel ranks of the decode instance (must divide the toy model's 8 heads)",
    )
    p.add_argument(
        "--prefill-layout",
        default=d.prefill_layout,
        dest="prefill_layout",
        choices=["SD", "DS"],
        help="conv window layout on the prefill side",
    )
    p.add_argument(
        "--decode-layout",
        default=d.decode_layout,
        dest="decode_layout",
        choices=["SD", "DS"],
        help="conv window layout on the decode side",
    )
    p.add_argument(
        "--prefill-spec",
        type=int_at_least(0),
        default=d.prefill_spec,
        dest="prefill_spec",
        metavar="N",
        help="draft tokens per window the prefill side's conv windows hold (num_spec)",
    )
    p.add_argument(
        "--decode-spec",
        type=int_at_least(0),
        default=d.decode_spec,
        dest="decode_spec",
        metavar="N",
        help="draft tokens per speculative window on the decode side (num_spec)",
    )
    p.add_argument(
        "--generate",
        type=int_at_least(1, MAX_GENERATE),
        default=d.generate,
        help="tokens generated per request (the decode side's work; 0 would check nothing)",
    )
    p.add_argument(
        "--seed", type=int_at_least(0, 2**64 - 3), default=d.seed, help="seed of the weights, prompts and acceptance"
    )
    add_json_option(p, "the summary")
    add_quiet_option(p)
    p.add_argument(
        "--verbose",
        action="store_true",
        help="also NIXL's INFO logging and the package's log lines (on stderr), and a failing child's traceback",
    )
    p.set_defaults(func=_cmd, parser=p)


def build_parser(prog: str = PROG) -> Parser:
    """The demo's argument parser (one-line errors, defaults in the help)."""
    p = Parser(prog=prog, formatter_class=HelpFormatter, description=_DESCRIPTION)
    _configure(p)
    return p


def _cmd(args: argparse.Namespace) -> int:
    parser: argparse.ArgumentParser = args.parser
    cfg = Config(**{k: getattr(args, k) for k in _FLAGS})
    try:
        validate(cfg)
    except PdOptionError as e:
        if e.option is None:
            parser.error(e.reason)
        parser.error(f"argument {_FLAGS[e.option]}: invalid value {e.value!r}: {e.reason}")
    from recoverssm_rs.transfer.nixl import nixl_available

    if not nixl_available():  # before starting processes; the extra's package, as it installs it
        fail(parser.prog, NO_NIXL)

    def progress(msg: str) -> None:
        if not args.quiet:
            print(msg, file=sys.stderr, flush=True)

    s = run(cfg, progress=progress, verbose=args.verbose)
    if "error" in s:
        fail(parser.prog, s["error"])
    progress(f"pd-demo: done in {s['wall_seconds']:.1f} s")
    if args.json != "-":
        print(format_summary(s))
    if args.json:
        write_json(s, args.json, parser.prog)
    return 0 if passed(s) else 1


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    """Run the demo with the command-line arguments ``argv``; returns the exit status."""
    parser = build_parser(prog)
    try:
        args = parser.parse_args(argv)
        return int(args.func(args))
    except RecoverSSMError as e:
        fail(prog, f"{type(e).__name__}: {e}")
    except KeyboardInterrupt:
        fail(prog, "interrupted", 130)
