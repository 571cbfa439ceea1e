"""``scripts/check_kernels.py``: compile the package's CUDA kernels (the combined module the launch
layer loads) with the NVRTC found on this machine (no GPU or driver needed) and report each kernel's
registers, stack, spills and barriers, once per architecture.

Exit status 0 when every kernel compiles for every architecture without spills or local memory,
1 when one does not or when no NVRTC library can be found, 2 for a bad argument (an architecture
this NVRTC does not compile for is refused before compiling anything).
"""

from __future__ import annotations

import argparse
import ctypes
import os
from typing import Any

from recoverssm_rs.errors import RecoverSSMError
from recoverssm_rs.tools.cli_args import HelpFormatter, Parser, add_json_option, fail, write_json

__all__ = ["PROG", "build_parser", "main"]

PROG = "scripts/check_kernels.py"
"""The program's name in its messages."""


def _arch(text: str) -> int:
    try:
        value = int(text.removeprefix("sm_"), 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: expected an architecture like 80 or sm_90") from None
    if not 10 <= value <= 999:
        raise argparse.ArgumentTypeError(
            f"invalid value {text!r}: expected an architecture like 80 or sm_90 (10 to 999 inclusive)"
        )
    return value


def _cache_dir(text: str) -> str:
    if not text or (os.path.exists(text) and not os.path.isdir(text)):
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: not a folder (a folder to keep compile reports in)")
    return text


def build_parser(prog: str = PROG) -> Parser:
    """The checker's argument parser (one-line errors, defaults in the help)."""
    from recoverssm_rs.cuda import nvrtc

    p = Parser(
        prog=prog,
        formatter_class=HelpFormatter,
        description="Compile the package's CUDA kernels (the module the launch layer loads) with the "
        "NVRTC found on this machine (no GPU or driver needed) and report each kernel's "
        "registers, stack, spills and barriers per architecture.\n\n"
        "Exit status 0 when every kernel compiles without spills or local memory, 1 "
        "otherwise or when no NVRTC library is found (install the NVRTC wheel of your CUDA major, "
        "or set RECOVERSSM_NVRTC to a libnvrtc path), 2 for a bad argument.",
    )
    p.add_argument(
        "--arch",
        type=_arch,
        action="append",
        dest="archs",
        metavar="ARCH",
        help=f"architecture to compile for, e.g. 90 or sm_90, one this NVRTC supports "
        f"(repeatable; default: {', '.join('sm_' + str(a) for a in nvrtc.ARCHS)})",
    )
    p.add_argument(
        "--cache",
        type=_cache_dir,
        metavar="DIR",
        help="reuse the compile reports kept in DIR, keyed by the source, the options and the NVRTC "
        "library, and keep new ones there (default: compile afresh; the test suite keeps its reports "
        "in ~/.cache/recoverssm_rs/nvrtc)",
    )
    add_json_option(p, "the report")
    return p


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    """Run the checker with the command-line arguments ``argv``; returns the exit status (a refusal
    is one line ``PROG: error: ...`` on stderr)."""
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    try:
        return _run(parser, args)
    except RecoverSSMError as e:
        fail(prog, f"{type(e).__name__}: {e}")
    except KeyboardInterrupt:
        fail(prog, "interrupted", 130)


def _supported_archs() -> list[int] | None:
    """The architectures this NVRTC compiles for (``nvrtcGetSupportedArchs``), or None where the
    library cannot say."""
    from recoverssm_rs.cuda import nvrtc

    lib = nvrtc._nvrtc()
    if not hasattr(lib, "nvrtcGetSupportedArchs"):
        return None
    n = ctypes.c_int()
    if lib.nvrtcGetNumSupportedArchs(ctypes.byref(n)) != 0 or n.value <= 0:
        return None
    archs = (ctypes.c_int * n.value)()
    if lib.nvrtcGetSupportedArchs(archs) != 0:
        return None
    return list(archs)


def _table(rows: list[Any]) -> str:
    """One line per kernel and architecture, the columns as wide as their widest cell."""
    head = ("kernel", "arch", "regs", "stack", "spill st", "spill ld", "bar")
    cells = [head] + [
        (
            k.kernel,
            f"sm_{k.arch}",
            str(k.registers),
            str(k.stack_frame),
            str(k.spill_stores),
            str(k.spill_loads),
            str(k.barriers),
        )
        for k in rows
    ]
    widths = [max(len(r[c]) for r in cells) for c in range(len(head))]
    lines = [
        "  ".join(cell.ljust(w) if c == 0 else cell.rjust(w) for c, (cell, w) in enumerate(zip(r, widths)))
        for r in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from recoverssm_rs.cuda import nvrtc
    from recoverssm_rs.cuda.module import module_source
    from recoverssm_rs.errors import BackendUnavailableError

    archs = tuple(dict.fromkeys(args.archs or nvrtc.ARCHS))
    path = nvrtc.find_nvrtc()
    if path is None:
        from recoverssm_rs.backend_check import nvrtc_install_hint

        raise BackendUnavailableError(
            f"{parser.prog}: no NVRTC library found ({nvrtc_install_hint()}, "
            "or set RECOVERSSM_NVRTC to a libnvrtc path)"
        )
    supported = _supported_archs()
    if supported is not None:
        bad = [a for a in archs if a not in supported]
        if bad:
            major, minor = nvrtc.nvrtc_version()
            parser.error(
                f"argument --arch: invalid value sm_{bad[0]}: NVRTC {major}.{minor} compiles for "
                f"{', '.join('sm_' + str(a) for a in supported)}"
            )
    reports = [
        nvrtc.nvrtc_compile("<module>", arch, target="cubin", source=module_source(), cache=args.cache)
        for arch in archs
    ]
    failed = [r for r in reports if not r.ok]
    kernels = sorted((k for r in reports for k in r.kernels), key=lambda k: (k.kernel, k.arch))
    unclean = [k for k in kernels if not k.clean]
    major, minor = nvrtc.nvrtc_version()
    if args.json != "-":
        print(f"NVRTC {major}.{minor} ({path}); the combined module the launch layer loads")
        print(_table(kernels))
        for r in failed:
            print(f"FAILED sm_{r.arch}:\n{r.log}")
        print(
            "ok: every kernel compiles without spills or local memory"
            if not failed and not unclean
            else f"{len(failed)} failed compiles, {len(unclean)} kernels with spills or local memory"
        )
    if args.json:
        write_json(
            {
                "nvrtc": str(path),
                "version": [major, minor],
                "archs": list(archs),
                "failed": [{"arch": r.arch, "log": r.log} for r in failed],
                "kernels": [k.__dict__ for k in kernels],
            },
            args.json,
            parser.prog,
        )
    return 0 if not failed and not unclean else 1
