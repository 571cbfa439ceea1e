"""The ``check-kernels`` subcommand: compile the package's CUDA kernels with the NVRTC found on this
machine (no GPU or driver needed) and report each kernel's registers, stack, spills and barriers.

Exit status 0 when every kernel compiles for every architecture without spills or local memory,
1 when one does not, 2 when no NVRTC library can be found.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from .cli_args import HelpFormatter

__all__ = ["add_parser"]


def _arch(text: str) -> int:
    try:
        value = int(text.removeprefix("sm_"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an architecture like 80 or sm_90, got {text!r}") from None
    if value < 50:
        raise argparse.ArgumentTypeError(f"expected an architecture of at least 50, got {value}")
    return value


def add_parser(sub: Any) -> None:
    """Register ``check-kernels`` on ``sub`` (an argparse subparsers object)."""
    from ..cuda import nvrtc

    p = sub.add_parser(
        "check-kernels", formatter_class=HelpFormatter,
        help="compile the CUDA kernels with this machine's NVRTC and report their resources",
        description="Compile the package's CUDA kernels with the NVRTC found on this machine (no GPU or "
                    "driver needed) and report each kernel's registers, stack, spills and barriers. Exit "
                    "status 0 when every kernel compiles without spills or local memory, 1 otherwise, 2 "
                    "when no NVRTC library is found.")
    p.add_argument("--arch", type=_arch, action="append", dest="archs", metavar="ARCH",
                   help=f"architecture to compile for, e.g. 90 or sm_90 (repeatable; default: "
                        f"{', '.join('sm_' + str(a) for a in nvrtc.ARCHS)})")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_cmd, parser=p)


def _cmd(args: argparse.Namespace) -> int:
    from ..cuda import nvrtc

    archs = tuple(args.archs or nvrtc.ARCHS)
    try:
        path = nvrtc.find_nvrtc()
        if path is None:
            raise nvrtc.NvrtcUnavailableError("no NVRTC library found")
        reports = nvrtc.compile_all(archs, ptx=False)
    except nvrtc.NvrtcUnavailableError as exc:
        args.parser.exit(2, f"{args.parser.prog}: error: {exc} (install nvidia-cuda-nvrtc-cu12, or set "
                            "RECOVERSSM_NVRTC to a libnvrtc path)\n")
    failed = [r for r in reports if not r.ok]
    unclean = [k for r in reports for k in r.kernels if not k.clean]
    if args.json:
        print(json.dumps({
            "nvrtc": str(path), "version": list(nvrtc.nvrtc_version()), "archs": list(archs),
            "failed": [{"file": r.file, "arch": r.arch, "log": r.log} for r in failed],
            "kernels": [k.__dict__ for r in reports for k in r.kernels],
        }, indent=1))
    else:
        major, minor = nvrtc.nvrtc_version()
        print(f"NVRTC {major}.{minor} ({path})")
        print(nvrtc.resource_table(reports))
        for r in failed:
            print(f"FAILED {r.file} sm_{r.arch}:\n{r.log}")
        print("ok: every kernel compiles without spills or local memory" if not failed and not unclean
              else f"{len(failed)} failed compiles, {len(unclean)} kernels with spills or local memory")
    return 0 if not failed and not unclean else 1
