"""The build backend of recoverssm_rs: maturin, tagging every wheel for the glibc named by
``[tool.maturin] compatibility`` (``manylinux_2_28``, the tag of vLLM's own wheel) and linking it
with zig so that it runs there.

A wheel linked on a machine with a newer glibc refers to that glibc's symbol versions (2.34 on
Debian 12), and maturin's audit rightly refuses to tag it ``manylinux_2_28``. zig (maturin's
``--zig``, through cargo-zigbuild) links against the symbol versions of the target glibc whatever
the build machine has.

maturin's own PEP 517 hook (the one ``pip wheel .``, ``pip install .``, ``pip install -e .`` and
``python -m build`` call) passes ``--compatibility off`` unless the build arguments name a
compatibility, so it would tag a plain ``linux_x86_64`` wheel. This module is maturin's hook with,
added to the build arguments:

- ``--compatibility <[tool.maturin] compatibility>``, unless the caller's build arguments
  (``--config-settings build-args=...`` or ``MATURIN_PEP517_ARGS``) name one;
- ``--zig``, when that compatibility is ``manylinux_X_Y`` and this machine's glibc is newer than
  X.Y. The zig used is, in order: ``CARGO_ZIGBUILD_ZIG_PATH``; the one of the ``ziglang`` package
  (a build requirement in pyproject.toml, so an isolated build always has it); ``zig`` on PATH.
  Without any (``--no-build-isolation`` in an environment without ziglang) the build stops with
  :class:`ZigNotFound`, which says what to install, rather than build a wheel with a tag an index
  refuses or that does not install where the tag promises. ``--config-settings
  build-args="--compatibility linux"`` builds a local-only ``linux_x86_64`` wheel without zig.

``maturin build`` reads the same setting from pyproject.toml; without ``--zig`` on a newer glibc
its audit refuses the tag (use ``maturin build --release --zig``, or ``bash scripts/build_wheel.sh``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shlex
import shutil
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import maturin
from maturin import (  # noqa: F401  (the hooks re-exported unchanged)
    build_sdist,
    get_requires_for_build_editable,
    get_requires_for_build_sdist,
    get_requires_for_build_wheel,
    prepare_metadata_for_build_editable,
    prepare_metadata_for_build_wheel,
)

_KEYS = ("maturin.build-args", "build-args")
_MANYLINUX = re.compile(r"^manylinux_(\d+)_(\d+)$")
_ALIASES = {"manylinux2014": "manylinux_2_17"}
ZIG_PATH_ENV = "CARGO_ZIGBUILD_ZIG_PATH"


if sys.version_info >= (3, 11):  # noqa: UP036 (runs under the installing Python, any version)
    import tomllib
else:  # this module must import on any Python, so that pip can tell the requires-python floor
    import tomli as tomllib  # maturin's own dependency there


class ZigNotFound(RuntimeError):
    """The wheel's glibc target is older than this machine's and no zig is there to link for it."""


def _pyproject() -> dict[str, Any]:
    with open("pyproject.toml", "rb") as fp:
        return tomllib.load(fp)


def _configured_compatibility() -> str | None:
    return _pyproject().get("tool", {}).get("maturin", {}).get("compatibility")


def ziglang_requirement() -> str:
    """The ziglang requirement of pyproject.toml's build-system (without its marker)."""
    for req in _pyproject().get("build-system", {}).get("requires", []):
        if re.match(r"ziglang\b", req):
            return req.split(";", 1)[0].strip()
    return "ziglang"


def target_glibc(compatibility: str) -> tuple[int, int] | None:
    """(major, minor) of the glibc a ``manylinux_X_Y`` (or ``manylinux2014``) tag names, else None."""
    m = _MANYLINUX.match(_ALIASES.get(compatibility, compatibility))
    return (int(m.group(1)), int(m.group(2))) if m else None


def host_glibc() -> tuple[int, int] | None:
    """(major, minor) of this machine's glibc; None where there is none (musl, macOS)."""
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (AttributeError, ValueError, OSError):
        return None
    m = re.fullmatch(r"glibc (\d+)\.(\d+).*", text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def find_zig() -> str | None:
    """The zig to link with: $CARGO_ZIGBUILD_ZIG_PATH, the ziglang package's, or zig on PATH."""
    given = os.environ.get(ZIG_PATH_ENV)
    if given:
        return given
    spec = importlib.util.find_spec("ziglang")
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            exe = Path(loc) / "zig"
            if exe.is_file() and os.access(exe, os.X_OK):
                return str(exe)
    return shutil.which("zig")


def build_args(
    config_settings: Mapping[str, Any] | None, host: tuple[int, int] | None = None, zig: str | None = None
) -> tuple[dict[str, Any] | None, str | None]:
    """The settings to hand maturin's hook, and the zig it must use (None: no zig needed).

    ``host`` and ``zig`` default to :func:`host_glibc` and :func:`find_zig` (arguments for tests).
    Raises :class:`ZigNotFound` when the target glibc is older than ``host`` and no zig is known.
    """
    settings = dict(config_settings or {})
    given = next((settings[k] for k in _KEYS if k in settings), None)
    if given is None:
        args = shlex.split(os.environ.get("MATURIN_PEP517_ARGS", ""))
    else:
        args = shlex.split(given) if isinstance(given, str) else list(given)
    compatibility = _named_compatibility(args)
    added: list[str] = []
    if compatibility is None:
        compatibility = _configured_compatibility()
        if compatibility:
            added += ["--compatibility", compatibility]
    target = target_glibc(compatibility or "")
    host = host_glibc() if host is None else host
    need_zig = target is not None and host is not None and host > target and "--zig" not in args
    if need_zig:
        zig = find_zig() if zig is None else zig
        if zig is None:
            raise ZigNotFound(
                f"the wheel is tagged {compatibility} (glibc {target[0]}.{target[1]}, [tool.maturin] "
                f"compatibility in pyproject.toml) but this machine has glibc {host[0]}.{host[1]}: linking "
                f"for the older glibc needs zig, and none was found (pip install '{ziglang_requirement()}', "
                f"or set {ZIG_PATH_ENV}); --config-settings build-args='--compatibility linux' builds a "
                f"wheel for this machine only"
            )
        added.append("--zig")
    else:
        zig = None
    if not added:
        return (None if config_settings is None else settings), None
    for k in _KEYS:
        settings.pop(k, None)
    settings["build-args"] = [*args, *added]
    return settings, zig


def _named_compatibility(args: list[str]) -> str | None:
    for i, a in enumerate(args):
        for flag in ("--compatibility", "--manylinux"):
            if a == flag:
                return args[i + 1] if i + 1 < len(args) else ""
            if a.startswith(flag + "="):
                return a.split("=", 1)[1]
    return None


@contextlib.contextmanager
def _zig_env(zig: str | None) -> Iterator[None]:
    """cargo-zigbuild finds zig through $CARGO_ZIGBUILD_ZIG_PATH (else `python3 -m ziglang` of
    whatever python3 is first on PATH, which need not be this environment's)."""
    if zig is None or os.environ.get(ZIG_PATH_ENV) == zig:
        yield
        return
    old = os.environ.get(ZIG_PATH_ENV)
    os.environ[ZIG_PATH_ENV] = zig
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(ZIG_PATH_ENV, None)
        else:
            os.environ[ZIG_PATH_ENV] = old


def build_wheel(
    wheel_directory: str, config_settings: Mapping[str, Any] | None = None, metadata_directory: str | None = None
) -> str:
    """maturin's ``build_wheel`` with the configured compatibility and zig (see the module docstring)."""
    settings, zig = build_args(config_settings)
    with _zig_env(zig):
        return maturin.build_wheel(wheel_directory, settings, metadata_directory)


def build_editable(
    wheel_directory: str, config_settings: Mapping[str, Any] | None = None, metadata_directory: str | None = None
) -> str:
    """maturin's ``build_editable`` (``pip install -e .``, scripts/setup.sh), tagged and linked as
    :func:`build_wheel`: the extension a checkout tests is the one a wheel ships."""
    settings, zig = build_args(config_settings)
    with _zig_env(zig):
        return maturin.build_editable(wheel_directory, settings, metadata_directory)
