"""A test-only oracle: vLLM 0.33.0's own align-mode step code, run on CPU.

The released wheel is downloaded once (``pip download vllm==0.33.0 --no-deps``) into a cache
(``$RECOVERSSM_VLLM_CACHE``, default ``$XDG_CACHE_HOME/recoverssm_rs/vllm-0.33.0``, where
``XDG_CACHE_HOME`` defaults to ``~/.cache``) that every test reading vLLM's code shares through
:func:`wheel` and :func:`extracted` (``$RECOVERSSM_VLLM_WHEEL`` names a wheel to use instead;
``RECOVERSSM_NO_DOWNLOAD=1`` forbids the download); the two modules the
step needs (``vllm/v1/worker/mamba_utils.py`` and ``vllm/model_executor/layers/mamba/mamba_utils.py``)
are extracted there and loaded by path, with small stand-ins for the imports they do not exercise
(config classes, logging, type-only imports). Their Triton kernels (the fused pre-copy and
post-process, and ``batch_memcpy``) run in Triton's interpreter (``TRITON_INTERPRET=1``) over CPU
tensors. No vLLM code is stored in this repository.

:func:`load` returns the loaded modules, or raises :class:`OracleUnavailable` with the reason.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import importlib.util
import os
import subprocess
import sys
import tempfile
import types
import zipfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

VERSION = "0.33.0"
FILES = {
    "vllm.v1.worker.mamba_utils": "vllm/v1/worker/mamba_utils.py",
    "vllm.model_executor.layers.mamba.mamba_utils": "vllm/model_executor/layers/mamba/mamba_utils.py",
}

T = TypeVar("T")


class OracleUnavailable(RuntimeError):
    """vLLM's wheel or Triton's interpreter is not available here (the SGLang oracle's error is a
    subclass)."""


def load_or_skip(load: Callable[[], T], name: str) -> T:
    """``load()``, or the calling test skipped with the reason when the oracle is unavailable; a
    failure instead under ``RECOVERSSM_REQUIRE_ORACLE=1`` (as CI sets it). ``name``: the oracle's
    project and version, for the message."""
    import pytest

    try:
        return load()
    except OracleUnavailable as exc:
        if os.environ.get("RECOVERSSM_REQUIRE_ORACLE") == "1":
            pytest.fail(f"RECOVERSSM_REQUIRE_ORACLE=1 but {name}'s oracle is unavailable: {exc}")
        pytest.skip(f"{name}'s oracle is unavailable: {exc}")


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/recoverssm_rs`` (``XDG_CACHE_HOME`` defaults to ``~/.cache``): every oracle's
    wheel is cached in a folder of its own under it."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "recoverssm_rs"


def cache_dir() -> Path:
    """The folder the wheel is downloaded into and its files extracted to (see the module docstring)."""
    given = os.environ.get("RECOVERSSM_VLLM_CACHE")
    if given:
        return Path(given)
    return cache_root() / f"vllm-{VERSION}"


def fetch_wheel(dist: str, version: str, folder: Path, unavailable: type[Exception] = RuntimeError) -> Path:
    """``dist==version``'s wheel (no dependencies) in ``folder``, downloaded with pip on first use.

    Raises ``unavailable`` when it cannot be had (no network, or ``RECOVERSSM_NO_DOWNLOAD=1`` and
    nothing cached).
    """
    found = sorted(folder.glob(f"{dist}-{version}-*.whl"))
    if found:
        return found[0]
    if os.environ.get("RECOVERSSM_NO_DOWNLOAD", "0") not in ("", "0"):
        raise unavailable(f"RECOVERSSM_NO_DOWNLOAD is set and {folder} holds no {dist}-{version} wheel")
    folder.mkdir(parents=True, exist_ok=True)
    # One download for all test processes (pytest-xdist workers): the others wait on the lock (a
    # file beside the cache folder, which holds only wheels and their extracted files), then find
    # the wheel.
    with open(folder.parent / f".{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = sorted(folder.glob(f"{dist}-{version}-*.whl"))
        return found[0] if found else _download(dist, version, folder, unavailable)


def _download(dist: str, version: str, folder: Path, unavailable: type[Exception]) -> Path:
    """``dist==version``'s wheel downloaded into ``folder`` (see :func:`fetch_wheel`)."""
    # Into a folder of its own first, then moved into place: an interrupted download leaves no
    # partial wheel in the cache.
    with tempfile.TemporaryDirectory(dir=folder, prefix=".download-") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            f"{dist}=={version}",
            "--no-deps",
            "--only-binary",
            ":all:",
            "--timeout",
            "60",
            "--retries",
            "2",
            "-d",
            tmp,
            "--quiet",
        ]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise unavailable(f"could not run {' '.join(cmd)}: {exc}") from None
        got = sorted(Path(tmp).glob(f"{dist}-{version}-*.whl"))
        if r.returncode != 0 or not got:
            raise unavailable(f"`{' '.join(cmd)}` failed: {(r.stderr or r.stdout).strip()[-500:]}")
        os.replace(got[0], folder / got[0].name)
    return folder / got[0].name


def given_or_fetched(env: str, dist: str, version: str, folder: Path, unavailable: type[Exception]) -> Path:
    """The wheel named by ``$env`` (which must exist), else :func:`fetch_wheel`'s."""
    given = os.environ.get(env)
    if given:
        if not Path(given).is_file():
            raise unavailable(f"{env}={given}: no such file")
        return Path(given)
    return fetch_wheel(dist, version, folder, unavailable)


def extract_member(wheel: Callable[[], Path], folder: Path, member: str) -> Path:
    """The path of ``member`` (a path inside the wheel ``wheel()`` gives) extracted under
    ``folder/extracted``, on first use (written under a temporary name, then renamed)."""
    dest = folder / "extracted" / member
    if not dest.is_file():
        with zipfile.ZipFile(wheel()) as z:
            data = z.read(member)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, dest)
    return dest


def wheel() -> Path:
    """vLLM's wheel: ``$RECOVERSSM_VLLM_WHEEL``, else the cached one, downloaded on first use.

    Raises :class:`OracleUnavailable` when it cannot be had (no network, or
    ``RECOVERSSM_NO_DOWNLOAD=1`` and nothing cached).
    """
    return given_or_fetched("RECOVERSSM_VLLM_WHEEL", "vllm", VERSION, cache_dir(), OracleUnavailable)


def extracted(member: str) -> Path:
    """The path of ``member`` (a path inside the wheel) extracted into the cache, on first use."""
    return extract_member(wheel, cache_dir(), member)


def _extract() -> dict[str, Path]:
    return {name: extracted(rel) for name, rel in FILES.items()}


# ------------------------------------------------------------------------------------------------
# Stand-ins for the imports the step code names but does not exercise here
# ------------------------------------------------------------------------------------------------


class _Logger:
    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: None


class _Anything:
    """A placeholder class for type-only imports."""

    def __init__(self, *a: Any, **k: Any) -> None:
        pass


def _module(name: str, **attrs: Any) -> types.ModuleType:
    m = types.ModuleType(name)
    m.__path__ = []  # a package, so submodules resolve
    m.__dict__.update(attrs)
    m.__getattr__ = lambda attr: _Anything  # type: ignore[method-assign]
    return m


@dataclasses.dataclass(frozen=True)
class MambaSpec:
    """What vLLM's ``MambaSpec`` carries for the step (hashable: it keys ``get_mamba_groups``)."""

    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[Any, ...]
    block_size: int
    mamba_type: str
    num_speculative_blocks: int
    mamba_cache_mode: str = "align"


class UniformTypeKVCacheSpecs:  # isinstance checks only
    pass


class CpuGpuBuffer:
    """vLLM's pinned-host / device buffer pair, both on the CPU here."""

    def __init__(self, *size: int, dtype: Any) -> None:
        import torch

        self.cpu = torch.zeros(*size, dtype=dtype)
        self.np = self.cpu.numpy()
        self.gpu = torch.zeros_like(self.cpu)

    def copy_to_gpu(self, n: int | None = None) -> Any:
        if n is None:
            self.gpu.copy_(self.cpu)
            return self.gpu
        self.gpu[:n].copy_(self.cpu[:n])
        return self.gpu[:n]


def _stubs(envs: types.ModuleType) -> dict[str, types.ModuleType]:
    import torch
    import triton
    import triton.language as tl

    def cdiv(a: int, b: int) -> int:
        return -(a // -b)

    mods = {
        "vllm": _module("vllm"),
        "vllm.envs": envs,
        "vllm.config": _module("vllm.config"),
        "vllm.config.cache": _module("vllm.config.cache"),
        "vllm.config.mamba": _module("vllm.config.mamba"),
        "vllm.config.model": _module("vllm.config.model"),
        "vllm.distributed": _module("vllm.distributed", divide=lambda a, b: a // b),
        "vllm.logger": _module("vllm.logger", init_logger=lambda name: _Logger()),
        "vllm.utils": _module("vllm.utils"),
        "vllm.utils.torch_utils": _module(
            "vllm.utils.torch_utils", STR_DTYPE_TO_TORCH_DTYPE={"float32": torch.float32}
        ),
        "vllm.utils.math_utils": _module("vllm.utils.math_utils", cdiv=cdiv),
        "vllm.utils.gpu_sync_debug": _module("vllm.utils.gpu_sync_debug", gpu_sync_allowed=contextlib.nullcontext),
        "vllm.triton_utils": _module("vllm.triton_utils", tl=tl, triton=triton),
        "vllm.v1": _module("vllm.v1"),
        "vllm.v1.attention": _module("vllm.v1.attention"),
        "vllm.v1.attention.backends": _module("vllm.v1.attention.backends"),
        "vllm.v1.attention.backends.registry": _module("vllm.v1.attention.backends.registry"),
        "vllm.v1.core": _module("vllm.v1.core"),
        "vllm.v1.core.sched": _module("vllm.v1.core.sched"),
        "vllm.v1.core.sched.output": _module("vllm.v1.core.sched.output"),
        "vllm.v1.kv_cache_interface": _module(
            "vllm.v1.kv_cache_interface", MambaSpec=MambaSpec, UniformTypeKVCacheSpecs=UniformTypeKVCacheSpecs
        ),
        "vllm.v1.utils": _module("vllm.v1.utils", CpuGpuBuffer=CpuGpuBuffer),
        "vllm.v1.worker": _module("vllm.v1.worker"),
        "vllm.v1.worker.gpu_input_batch": _module("vllm.v1.worker.gpu_input_batch"),
        "vllm.model_executor": _module("vllm.model_executor"),
        "vllm.model_executor.layers": _module("vllm.model_executor.layers"),
        "vllm.model_executor.layers.mamba": _module("vllm.model_executor.layers.mamba"),
    }
    for name, mod in mods.items():  # `import vllm.envs as envs` reads the parent's attribute
        parent, _, child = name.rpartition(".")
        if parent in mods:
            setattr(mods[parent], child, mod)
    return mods


_LOADED: types.SimpleNamespace | None = None


def import_interpreted_triton() -> None:
    """Imports Triton in interpreter mode (``TRITON_INTERPRET=1``, read when Triton is first
    imported): every oracle that loads Triton kernels calls this first, so that whichever oracle a
    test process loads first, the kernels run interpreted on CPU tensors.

    Raises:
        OracleUnavailable: Triton is not importable, or was imported earlier without the
            interpreter.
    """
    import sys as _sys

    if "triton" in _sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        raise OracleUnavailable("Triton was imported before TRITON_INTERPRET=1 was set")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        raise OracleUnavailable(f"Triton is not importable ({exc}); pip install triton") from None


def exec_by_path(name: str, path: Path | str) -> types.ModuleType:
    """The file at ``path`` executed as module ``name`` (registered in ``sys.modules`` first, as an
    import does): how every oracle loads a file of a wheel without importing its package."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@contextlib.contextmanager
def stubbed(stubs: dict[str, types.ModuleType], keep: Iterable[str] = ()) -> Iterator[None]:
    """While active, ``sys.modules`` holds ``stubs``; afterwards every one of those names and of
    ``keep`` (the modules loaded meanwhile) is as it was before: the oracle's modules do not leak
    into other imports."""
    saved = {k: sys.modules.get(k) for k in [*stubs, *keep]}
    try:
        sys.modules.update(stubs)
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


def load() -> types.SimpleNamespace:
    """``namespace(wmu=..., lmu=..., envs=...)``: vLLM's modules, loaded once per process.

    ``envs.VLLM_SSM_CONV_STATE_LAYOUT`` selects SD / DS; call :func:`set_conv_layout` to switch.
    """
    global _LOADED
    if _LOADED is not None:
        return _LOADED
    import_interpreted_triton()
    paths = _extract()
    envs = _module("vllm.envs", VLLM_SSM_CONV_STATE_LAYOUT="SD")
    names = ["vllm.model_executor.layers.mamba.mamba_utils", "vllm.v1.worker.mamba_utils"]
    with stubbed(_stubs(envs), keep=FILES):
        loaded = {name: exec_by_path(name, paths[name]) for name in names}
    _LOADED = types.SimpleNamespace(
        wmu=loaded["vllm.v1.worker.mamba_utils"], lmu=loaded["vllm.model_executor.layers.mamba.mamba_utils"], envs=envs
    )
    return _LOADED


def set_conv_layout(ns: types.SimpleNamespace, layout: str) -> None:
    """Switch vLLM's conv-state layout (``VLLM_SSM_CONV_STATE_LAYOUT``) to ``"SD"`` or ``"DS"``."""
    ns.envs.VLLM_SSM_CONV_STATE_LAYOUT = layout
    ns.lmu.get_conv_state_layout.cache_clear()
