"""Command line: ``python -m recoverssm_rs <command>``.

Commands:
    layout   print a preset's or a parameterised layout as a table (``--json`` for JSON)
    presets  list the model presets
    demo     the package's main job (see ``--help``)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from . import layouts
from ._core import Layout
from .errors import RecoverSSMError

__all__ = ["main", "format_layout"]


def _human(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_layout(layout: Layout, num_layers: int | None = None) -> str:
    """A readable table of ``layout``: state, role, copy kind, shape, dtype and bytes."""
    rows = [("#", "state", "role", "copy", "shape", "dtype", "bytes")]
    for i, s in enumerate(layout.states):
        copy: str = s.copy or "-"
        if s.conv_layout:
            copy = f"conv/{s.conv_layout}"
        per = "block" if s.role == "persistent" else "request"
        rows.append(
            (
                str(i),
                s.name,
                s.role,
                copy,
                "(" + ", ".join(str(d) for d in s.shape) + ")",
                s.dtype,
                f"{s.nbytes:,} per {per}",
            )
        )
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines = [f"{layout.backend}: num_spec={layout.num_spec}, copyable prefix = "
             f"{layout.copyable_prefix_len} of {len(layout)} states"]
    for j, r in enumerate(rows):
        lines.append("  ".join(cell.ljust(widths[c]) for c, cell in enumerate(r)).rstrip())
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    lines.append(
        f"persistent: {_human(layout.persistent_bytes_per_block)} per block and layer; "
        f"workspace: {_human(layout.workspace_bytes_per_request)} per request and layer"
    )
    if num_layers:
        lines.append(
            f"x {num_layers} layers: {_human(layout.persistent_bytes_per_block * num_layers)} per "
            f"block, {_human(layout.workspace_bytes_per_request * num_layers)} workspace per request"
        )
    return "\n".join(lines)


def _parse_value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(text)
    except ValueError:
        return text


def _layout_from_args(args: argparse.Namespace) -> tuple[Layout, int | None, str | None]:
    overrides: dict[str, Any] = {}
    for item in args.param or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"error: --param expects NAME=VALUE, got {item!r}")
        overrides[key.replace("-", "_")] = _parse_value(value)
    for name in ("tp_size", "num_spec", "conv_layout", "dtype", "ssm_dtype"):
        value = getattr(args, name)
        if value is not None:
            overrides[name] = value
    if args.preset:
        if args.preset not in layouts.PRESETS:
            raise SystemExit(
                f"error: unknown preset {args.preset!r}; choose one of: {', '.join(layouts.PRESETS)}"
            )
        p = layouts.PRESETS[args.preset]
        return p.layout(**overrides), p.num_layers, p.model
    if args.family:
        try:
            return layouts.FAMILIES[args.family](**overrides), None, None
        except TypeError as e:  # a missing or unknown parameter name
            raise SystemExit(f"error: {args.family}: {e}") from None
    raise SystemExit("error: pass --preset NAME or --family NAME (see --help)")


def _cmd_layout(args: argparse.Namespace) -> int:
    layout, num_layers, model = _layout_from_args(args)
    if args.json:
        doc = layout.to_dict()
        if args.preset:
            doc["preset"] = args.preset
            doc["model"] = model
            doc["num_layers"] = num_layers
        print(json.dumps(doc, indent=2))
    else:
        if model:
            print(f"{args.preset}: {model}")
        print(format_layout(layout, num_layers))
    return 0


def _cmd_presets(args: argparse.Namespace) -> int:
    if args.json:
        print(json.dumps({n: {"model": p.model, "family": p.family, "num_layers": p.num_layers,
                              "params": dict(p.params), "defaults": dict(p.defaults),
                              "note": p.note} for n, p in layouts.PRESETS.items()}, indent=2))
        return 0
    for name, p in layouts.PRESETS.items():
        print(f"{name:26s} {p.family:6s} {p.model}  ({p.note})")
    return 0


def _add_layout_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", help=f"one of: {', '.join(layouts.PRESETS)}")
    p.add_argument("--family", choices=sorted(layouts.FAMILIES), help="a calculator to call")
    p.add_argument("--param", action="append", metavar="NAME=VALUE",
                   help="a calculator parameter, e.g. num_k_heads=16 (repeatable)")
    p.add_argument("--tp-size", type=int, dest="tp_size")
    p.add_argument("--num-spec", type=int, dest="num_spec")
    p.add_argument("--conv-layout", choices=["SD", "DS"], dest="conv_layout")
    p.add_argument("--dtype")
    p.add_argument("--ssm-dtype", dest="ssm_dtype")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m recoverssm_rs",
        description="Recurrent-state layouts, copy plans and RecoverSSM for hybrid SSM serving.",
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command")
    p = sub.add_parser("layout", help="print a layout as a table or JSON")
    _add_layout_options(p)
    p.set_defaults(func=_cmd_layout)
    p = sub.add_parser("presets", help="list the model presets")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_presets)
    from . import demo

    demo.add_parser(sub)
    from .bench import add_parser as add_bench_parser  # bench: the package's benchmarks

    add_bench_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m recoverssm_rs``; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        from . import __version__

        print(__version__)
        return 0
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args))
    except RecoverSSMError as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
