"""Command line: ``recoverssm <command>`` (or ``python -m recoverssm_rs <command>``).

Commands:
    layout         print a preset's or a parameterised layout as a table
    presets        list the model presets
    demo           serve a toy hybrid model and check every state (see ``demo --help``)
    simulate       replay a request trace through a checkpoint placement policy
    bench, check-kernels, pd-demo
                   development tools of the source checkout (not in the wheel): each says in
                   one line how to run it there (:mod:`recoverssm_rs.tools.dev_commands`)

Each subcommand module exposes ``add_parser(subparsers)``; :data:`SUBCOMMANDS` lists them. No
command is a usage error: the usage on stderr, exit status 2. Every
subcommand spells the shared options the same way (``--json [FILE]``, ``--quiet``: see
:mod:`recoverssm_rs.tools.cli_args`) and checks every option before any work: a bad argument is answered
with one line, ``PROG COMMAND: error: argument --flag: invalid value ...``, exit status 2. A
layout parameter is checked by the core (building the layout); when the core refuses the layout and
exactly one of the parameters given is to blame, the error names that flag, otherwise the layout as
a whole is refused: one line ``PROG: error: LayoutError: ...``, exit status 1, as for any error the
package raises while a command runs. Ctrl-C is one line and exit status 130 — never a traceback.
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

from .. import layouts
from .._core import Layout
from ..errors import RecoverSSMError
from .cli_args import HelpFormatter, Parser, add_json_option, core_reason, fail, write_json
from .demo.cli import add_parser as _add_demo_parser
from .dev_commands import add_parsers as _add_dev_parsers
from .formatting import format_layout
from .simulate import add_parser as _add_simulate_parser

__all__ = ["main", "build_parser", "format_layout", "family_params", "SUBCOMMANDS"]

PROG = "recoverssm"

_FAMILY_FLAGS = {
    "tp_size": "--tp-size",
    "num_spec": "--num-spec",
    "conv_layout": "--conv-layout",
    "dtype": "--dtype",
    "ssm_dtype": "--ssm-dtype",
}
"""Calculator parameters that have their own flag (the others go through --param)."""

_UNSET = "(default: the preset's value, or the calculator's: see --list-params)"


def family_params(family: str) -> list[inspect.Parameter]:
    """The parameters of ``family``'s calculator, as the core declares them."""
    return list(inspect.signature(layouts.FAMILIES[family]).parameters.values())


def _format_params(family: str) -> str:
    calc = layouts.FAMILIES[family]
    doc = (calc.__doc__ or "").strip().splitlines()
    lines = [
        f"{family}: {doc[0] if doc else calc.__name__}",
        "parameters (--param NAME=VALUE; those with a flag also as the flag):",
    ]
    for prm in family_params(family):
        if prm.default is inspect.Parameter.empty:
            note = "required"
        else:
            note = f"default {prm.default!r}"
        if prm.name in _FAMILY_FLAGS:
            note += f"; flag {_FAMILY_FLAGS[prm.name]}"
        lines.append(f"  {prm.name:20s} {note}")
    return "\n".join(lines)


def _parse_value(text: str, default: Any) -> Any:
    """A ``--param`` value: ``true``/``false`` for a parameter whose default is a bool, ``none``,
    an integer, else the text (the core says whether it takes it)."""
    low = text.lower()
    if isinstance(default, bool) and low in ("true", "false"):
        return low == "true"
    if low == "none":
        return None
    try:
        return int(text, 10)
    except ValueError:
        return text


def _flag_of(name: str) -> str:
    return _FAMILY_FLAGS.get(name, f"--param {name}")


def _converting(e: BaseException, given: dict[str, Any]) -> str | None:
    """The parameter whose conversion failed: the core's conversion errors start with its name
    (``num_spec = -1 must be >= 0``)."""
    m = re.match(r"(\w+)\b", str(e))
    return m.group(1) if m and m.group(1) in given else None


def _culprit(build: Callable[..., Layout], given: dict[str, Any], revertible: set[str]) -> str | None:
    """The one parameter given whose value makes the core refuse the layout: the layout builds
    when that parameter alone goes back to its default (or the preset's value) and not when any
    other does. None when no single parameter is to blame (the layout as a whole is refused)."""
    blamed = []
    for name in given:
        if name not in revertible:
            continue
        try:
            build(**{k: v for k, v in given.items() if k != name})
        except (RecoverSSMError, OverflowError, TypeError):
            continue
        blamed.append(name)
    return blamed[0] if len(blamed) == 1 else None


def _layout_from_args(
    args: argparse.Namespace,
    parser: argparse.ArgumentParser,
) -> tuple[Layout, int | None, str | None]:
    family = layouts.PRESETS[args.preset].family if args.preset else args.family
    if family is None:
        parser.error("pass --preset NAME or --family NAME (or --list-params FAMILY)")
    names = {prm.name: prm for prm in family_params(family)}
    given: dict[str, Any] = {}
    for item in args.param or []:
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            parser.error(f"argument --param: invalid value {item!r}: expected NAME=VALUE")
        if key not in names:
            parser.error(
                f"argument --param: unknown parameter {key!r} of family {family}; it takes: {', '.join(names)}"
            )
        if key in _FAMILY_FLAGS:
            parser.error(f"argument --param: set {key} with {_FAMILY_FLAGS[key]}")
        given[key] = _parse_value(value, names[key].default)
    for key in _FAMILY_FLAGS:
        value = getattr(args, key)
        if value is not None:
            given[key] = value
    if args.preset:
        p = layouts.PRESETS[args.preset]
        build: Callable[..., Layout] = p.layout
        num_layers, model = p.num_layers, p.model
        revertible = set(given)  # back to the preset's value
    else:
        missing = [n for n, prm in names.items() if prm.default is inspect.Parameter.empty and n not in given]
        if missing:
            parser.error(f"argument --param: family {family} needs {', '.join(missing)} (see --list-params {family})")
        build, num_layers, model = layouts.FAMILIES[family], None, None
        revertible = {n for n in given if names[n].default is not inspect.Parameter.empty}
    try:
        return build(**given), num_layers, model
    except (RecoverSSMError, OverflowError, TypeError) as e:
        name = _converting(e, given) or _culprit(build, given, revertible)
        if name is None and isinstance(e, RecoverSSMError):
            raise  # a rule of the layout as a whole: main() reports it (exit status 1)
        if name is None:
            parser.error(f"{family}: {e}")
        reason = core_reason(e, given[name], name)
        parser.error(f"argument {_flag_of(name)}: invalid value {given[name]!r}: {reason}")
    raise AssertionError("unreachable")


def _cmd_layout(args: argparse.Namespace) -> int:
    if args.list_params:
        family = args.list_params
        if args.json != "-":
            print(_format_params(family))
        if args.json:
            write_json(
                {
                    "family": family,
                    "parameters": [
                        {
                            "name": prm.name,
                            "required": prm.default is inspect.Parameter.empty,
                            "default": None if prm.default is inspect.Parameter.empty else prm.default,
                            "flag": _flag_of(prm.name),
                        }
                        for prm in family_params(family)
                    ],
                },
                args.json,
                args.parser.prog,
            )
        return 0
    layout, num_layers, model = _layout_from_args(args, args.parser)
    if args.json != "-":
        if model:
            print(f"{args.preset}: {model}")
        print(format_layout(layout, num_layers))
    if args.json:
        doc = layout.to_dict()
        if args.preset:
            doc["preset"] = args.preset
            doc["model"] = model
            doc["num_layers"] = num_layers
        write_json(doc, args.json, args.parser.prog)
    return 0


def _cmd_presets(args: argparse.Namespace) -> int:
    if args.json != "-":
        for name, p in layouts.PRESETS.items():
            print(f"{name:26s} {p.family:6s} {p.model}  ({p.note})")
    if args.json:
        write_json(
            {
                n: {
                    "model": p.model,
                    "family": p.family,
                    "num_layers": p.num_layers,
                    "params": dict(p.params),
                    "defaults": dict(p.defaults),
                    "note": p.note,
                }
                for n, p in layouts.PRESETS.items()
            },
            args.json,
            args.parser.prog,
        )
    return 0


def _add_layout_parser(sub: Any) -> None:
    families = sorted(layouts.FAMILIES)
    p = sub.add_parser(
        "layout",
        formatter_class=HelpFormatter,
        help="print a layout as a table or JSON",
        description="Print a preset's layout, or a calculator family's layout "
        "for the given parameters,\nfor one tensor-parallel rank.",
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--preset", choices=list(layouts.PRESETS), metavar="NAME", help=f"a model preset: {', '.join(layouts.PRESETS)}"
    )
    which.add_argument(
        "--family",
        choices=families,
        metavar="NAME",
        help=f"a calculator family: {', '.join(families)} (parameters: --list-params NAME)",
    )
    which.add_argument(
        "--list-params",
        choices=families,
        metavar="FAMILY",
        dest="list_params",
        help="list the family's parameters (names as in vLLM's state-shape calculators) and exit",
    )
    p.add_argument(
        "--param",
        action="append",
        metavar="NAME=VALUE",
        help="a calculator parameter under vLLM's name, e.g. num_k_heads=16 (repeatable; "
        "overrides a preset's value; --list-params FAMILY lists them)",
    )
    p.add_argument("--tp-size", type=int, dest="tp_size", help=f"tensor-parallel size {_UNSET}")
    p.add_argument("--num-spec", type=int, dest="num_spec", help=f"draft tokens per speculative step {_UNSET}")
    p.add_argument(
        "--conv-layout",
        choices=["SD", "DS"],
        dest="conv_layout",
        help=f"conv window layout: SD = (width, dim), DS = (dim, width) {_UNSET}",
    )
    p.add_argument("--dtype", help=f"state dtype, e.g. bfloat16 {_UNSET}")
    p.add_argument("--ssm-dtype", dest="ssm_dtype", help=f"temporal / recurrent state dtype {_UNSET}")
    add_json_option(p, "the layout")
    p.set_defaults(func=_cmd_layout, parser=p)


def _add_presets_parser(sub: Any) -> None:
    p = sub.add_parser(
        "presets",
        formatter_class=HelpFormatter,
        help="list the model presets",
        description="List the model presets: family, model and layer counts.",
    )
    add_json_option(p, "the presets")
    p.set_defaults(func=_cmd_presets, parser=p)


SUBCOMMANDS: tuple[Callable[[Any], Any], ...] = (
    _add_layout_parser,
    _add_presets_parser,
    _add_demo_parser,
    _add_simulate_parser,
    _add_dev_parsers,
)
"""Each registers one subcommand: ``add_parser(subparsers)``."""


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The command line's parser (one-line errors, defaults in the help)."""
    parser = Parser(
        prog=prog,
        formatter_class=HelpFormatter,
        description="Recurrent-state layouts, copy plans and RecoverSSM for hybrid SSM serving.",
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add_parser in SUBCOMMANDS:
        add_parser(sub)
    parser.set_defaults(commands=list(sub.choices))
    return parser


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    """Entry point of ``recoverssm`` and ``python -m recoverssm_rs``; returns the exit status."""
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if args.version:
        from .. import __version__

        print(__version__)
        return 0
    if not getattr(args, "func", None):
        parser.print_usage(sys.stderr)
        parser.error(f"a command is required, one of: {', '.join(args.commands)}")
    try:
        return int(args.func(args))
    except RecoverSSMError as e:
        fail(prog, f"{type(e).__name__}: {e}")
    except KeyboardInterrupt:
        fail(prog, "interrupted", 130)
    except BrokenPipeError:  # the reader went away (``... | head``): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
