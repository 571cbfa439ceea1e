"""The build backend of recoverssm_rs: maturin, with the wheel tag of [tool.maturin] compatibility.

maturin's PEP 517 hook (the one `pip wheel .`, `pip install .` and `python -m build` call) passes
`--compatibility off` unless the build arguments name a compatibility, so it would tag a plain
`linux_x86_64` wheel while `maturin build` tags the same wheel manylinux. This module is maturin's
hook with `--compatibility <[tool.maturin] compatibility>` added to the build arguments, so every
build path tags (and checks) the wheel the same way. Build arguments given by the caller
(`--config-settings build-args=...` or MATURIN_PEP517_ARGS) that name a compatibility win.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping
from typing import Any

import maturin
from maturin import (  # noqa: F401  (the hooks re-exported unchanged)
    build_editable,
    build_sdist,
    get_requires_for_build_editable,
    get_requires_for_build_sdist,
    get_requires_for_build_wheel,
    prepare_metadata_for_build_editable,
    prepare_metadata_for_build_wheel,
)

_KEYS = ("maturin.build-args", "build-args")


if sys.version_info >= (3, 11):  # noqa: UP036 (runs under the installing Python, any version)
    import tomllib
else:  # this module must import on any Python, so that pip can tell the requires-python floor
    import tomli as tomllib  # maturin's own dependency there


def _configured_compatibility() -> str | None:
    with open("pyproject.toml", "rb") as fp:
        return tomllib.load(fp).get("tool", {}).get("maturin", {}).get("compatibility")


def _with_compatibility(config_settings: Mapping[str, Any] | None) -> dict[str, Any] | None:
    settings = dict(config_settings or {})
    given = next((settings[k] for k in _KEYS if k in settings), None)
    if given is None:
        args = shlex.split(os.environ.get("MATURIN_PEP517_ARGS", ""))
    else:
        args = shlex.split(given) if isinstance(given, str) else list(given)
    named = any(a.startswith(("--compatibility", "--manylinux")) for a in args)
    compatibility = _configured_compatibility()
    if named or not compatibility:
        return config_settings if config_settings is None else settings
    for k in _KEYS:
        settings.pop(k, None)
    settings["build-args"] = [*args, "--compatibility", compatibility]
    return settings


def build_wheel(wheel_directory: str, config_settings: Mapping[str, Any] | None = None,
                metadata_directory: str | None = None) -> str:
    """maturin's ``build_wheel`` with the configured compatibility (see the module docstring)."""
    return maturin.build_wheel(wheel_directory, _with_compatibility(config_settings), metadata_directory)
