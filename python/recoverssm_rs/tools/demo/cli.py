"""The ``demo`` subcommand: options, their up-front check, and the run's output.

Progress lines go to stderr (none with ``--quiet``), the preset's table and the summary to stdout;
``--json FILE`` also writes the summary as JSON to FILE, ``--json`` (or ``--json -``) prints only the
JSON summary on stdout. A bad option is refused before anything runs with one line naming the
flag, its value and the allowed range (exit status 2).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from typing import Any

from ... import layouts
from ..cli_args import HelpFormatter, add_json_option, add_quiet_option, fail, int_at_least, max_threads, write_json
from .config import DEFAULTS, MAX_BLOCK_SIZE, MAX_STEPS, DemoOptionError, recoverssm_presets

__all__ = ["add_parser"]

_FLAGS = {
    "device": "--device",
    "steps": "--steps",
    "requests": "--requests",
    "layers": "--layers",
    "seed": "--seed",
    "block_size": "--block-size",
    "num_spec": "--num-spec",
    "preset": "--preset",
    "num_threads": "--threads",
}
"""run()'s keyword -> the flag that sets it."""

_DESCRIPTION = """\
Serve a small toy hybrid model (GDN and KDA layers, random weights) the way an engine does:
prefix-cache hits, forks, speculative windows of num_spec + 1 tokens and align-mode commits
that write boundary states. After every step every state, in every layer, is compared with
decoding only the accepted tokens one at a time. Exits 1 on any mismatch.

The preset (--preset) is not run: its layout table and its memory (verify-record workspace
against full-state scratch) are printed next to the run's figures."""


def add_parser(sub: Any) -> None:
    """Register the ``demo`` subcommand on ``sub`` (an argparse subparsers object)."""
    presets = recoverssm_presets()
    p = sub.add_parser(
        "demo",
        formatter_class=HelpFormatter,
        description=_DESCRIPTION,
        help="serve a toy hybrid GDN + KDA model with speculative decoding, prefix caching and "
        "forks, checking every state against token-by-token decoding",
    )
    p.add_argument(
        "--device", default=DEFAULTS["device"], help="torch device: cpu, cuda or cuda:N (cuda needs a GPU and CuPy)"
    )
    p.add_argument("--steps", type=int_at_least(1, MAX_STEPS), default=DEFAULTS["steps"], help="serving steps")
    p.add_argument(
        "--requests",
        type=int_at_least(1),
        default=DEFAULTS["requests"],
        help="the largest batch per step (workspace rows)",
    )
    p.add_argument(
        "--layers",
        type=int_at_least(1),
        default=DEFAULTS["layers"],
        help="layers per kind (the stack has as many GDN as KDA layers)",
    )
    p.add_argument(
        "--seed",
        type=int_at_least(0, 2**64 - 1),
        default=DEFAULTS["seed"],
        help="seeds weights, prompts, drafts, acceptance and scheduling",
    )
    p.add_argument(
        "--block-size",
        type=int_at_least(1, MAX_BLOCK_SIZE),
        default=None,
        dest="block_size",
        help=f"prefix-cache block size in tokens, at least --num-spec + 1 (default: {DEFAULTS['block_size']})",
    )
    p.add_argument(
        "--num-spec",
        type=int_at_least(1),
        default=DEFAULTS["num_spec"],
        dest="num_spec",
        help="draft tokens per decoding window",
    )
    p.add_argument(
        "--preset",
        default=DEFAULTS["preset"],
        metavar="NAME",
        help=f"the RecoverSSM preset whose layout and memory are shown (not run): "
        f"{', '.join(presets)}; with --layout-only any of: "
        f"{', '.join(layouts.PRESETS)}",
    )
    p.add_argument(
        "--threads",
        type=int_at_least(0, max_threads()),
        default=DEFAULTS["num_threads"],
        help="torch CPU threads during the run, at most this machine's CPUs (the tensors "
        "are tiny; 0 keeps torch's setting)",
    )
    add_json_option(p, "the summary")
    add_quiet_option(p)
    p.add_argument(
        "--layout-only",
        action="store_true",
        dest="layout_only",
        help="only print the preset's layout table and check its copy-function "
        "registration (any preset; nothing is served)",
    )
    p.set_defaults(func=_cmd, parser=p)


def _layout_only(args: argparse.Namespace) -> int:
    """Print the preset's layout and validate its copy-function registration."""
    from ...contract import validate_copy_funcs
    from ..formatting import format_layout

    p = layouts.PRESETS[args.preset]
    layout = p.layout()
    group = {
        "mamba_type": layout.backend,
        "shapes": [s.shape for s in layout.states],
        "dtypes": [s.dtype for s in layout.states],
    }
    prefix = validate_copy_funcs([group], {layout.backend: [s.copy for s in layout.persistent]})
    if args.json != "-":
        print(format_layout(layout, p.num_layers))
        for backend, n in prefix.items():
            print(
                f"copy functions: {backend} registers {n} copy functions for {len(layout)} "
                f"states (copyable prefix {n}) - valid"
            )
    if args.json:
        doc = {
            "preset": args.preset,
            "model": p.model,
            "num_layers": p.num_layers,
            "layout": layout.to_dict(),
            "copyable_prefix": dict(prefix),
        }
        write_json(doc, args.json, args.parser.prog)
    return 0


def _options(args: argparse.Namespace) -> dict[str, Any]:
    return dict(
        device=args.device,
        steps=args.steps,
        requests=args.requests,
        layers=args.layers,
        seed=args.seed,
        block_size=DEFAULTS["block_size"] if args.block_size is None else args.block_size,
        num_spec=args.num_spec,
        preset=args.preset,
        num_threads=args.threads or None,
    )


def _refuse(
    parser: argparse.ArgumentParser, e: DemoOptionError, options: dict[str, Any], block_size_given: bool
) -> None:
    """The error of the flag to blame. A block size that does not fit the speculative window is
    ``--block-size``'s error when it was given, else ``--num-spec``'s (the default block size did
    not change)."""
    option, value, extra = e.option, e.value, ""
    if option == "block_size" and not block_size_given:
        option, value, extra = "num_spec", options["num_spec"], f" (with --block-size {options['block_size']})"
    elif option == "block_size":
        extra = f" (with --num-spec {options['num_spec']})"
    parser.error(f"argument {_FLAGS.get(option, option)}: invalid value {value!r}{extra}: {e.reason}")


def _cmd(args: argparse.Namespace) -> int:
    parser: argparse.ArgumentParser = args.parser
    if args.layout_only:
        if args.preset not in layouts.PRESETS:
            parser.error(
                f"argument --preset: invalid value {args.preset!r}: choose one of {', '.join(layouts.PRESETS)}"
            )
        return _layout_only(args)
    if importlib.util.find_spec("torch") is None:  # without importing it: the checks need none
        from ...backend_check import missing_module_message

        fail(parser.prog, missing_module_message(ModuleNotFoundError(name="torch"), "`demo`") or "torch is missing")
    from . import format_summary, run, validate
    from .report import preset_header

    options = _options(args)
    try:
        validate(**options)
    except DemoOptionError as e:
        _refuse(parser, e, options, block_size_given=args.block_size is not None)
    text = args.json != "-"
    if text:
        print(preset_header(args.preset))
        print()
        sys.stdout.flush()

    def progress(msg: str) -> None:
        if not args.quiet:
            print(msg, file=sys.stderr, flush=True)

    summary = run(**options, progress=progress)
    ok = summary["mismatches"] == 0
    if text:
        print(format_summary(summary))
        print(
            "OK: every state matched the token-by-token ground truth"
            if ok
            else "FAILED: states differ from the token-by-token ground truth"
        )
    if args.json:
        write_json(summary, args.json, parser.prog)
    return 0 if ok else 1
