"""The package's main job, ``python -m recoverssm_rs demo``.

Prints the Kimi-K3-like RecoverSSM layout and checks it the way an engine's start-up check does:
the layout contract, and the engine's registration of two copy functions for four states.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from . import layouts
from .cli import format_layout
from .contract import validate_copy_funcs

__all__ = ["add_parser", "run"]

PRESET = "kimi-k3-like-recoverssm"


def run(*, preset: str = PRESET, tp_size: int = 1, num_spec: int | None = None) -> dict[str, Any]:
    """Build and validate the preset's layout; returns a summary."""
    p = layouts.PRESETS[preset]
    overrides: dict[str, Any] = {"tp_size": tp_size}
    if num_spec is not None:
        overrides["num_spec"] = num_spec
    layout = p.layout(**overrides)
    group = {
        "mamba_type": layout.backend,
        "shapes": [s.shape for s in layout.states],
        "dtypes": [s.dtype for s in layout.states],
    }
    funcs = {layout.backend: [s.copy for s in layout.persistent]}
    prefix = validate_copy_funcs([group], funcs)
    return {"preset": preset, "layout": layout, "num_layers": p.num_layers, "copy_prefix": prefix}


def _cmd(args: argparse.Namespace) -> int:
    result = run(preset=args.preset, tp_size=args.tp_size, num_spec=args.num_spec)
    layout = result["layout"]
    if args.json:
        print(json.dumps({**result, "layout": layout.to_dict()}, indent=2))
        return 0
    print(format_layout(layout, result["num_layers"]))
    for backend, n in result["copy_prefix"].items():
        print(f"copy functions: {backend} registers {n} copy functions for {len(layout)} states "
              f"(copyable prefix {n}) - valid")
    return 0


def add_parser(sub: Any) -> None:
    """Register the ``demo`` subcommand."""
    p = sub.add_parser("demo", help="the main job: the Kimi-K3-like RecoverSSM layout, validated")
    p.add_argument("--preset", default=PRESET, choices=sorted(layouts.PRESETS))
    p.add_argument("--tp-size", type=int, default=1, dest="tp_size")
    p.add_argument("--num-spec", type=int, default=None, dest="num_spec")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd)
