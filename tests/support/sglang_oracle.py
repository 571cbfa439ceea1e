"""A test-only oracle: SGLang 0.5.23's own mamba-pool code, run on CPU.

The released wheel is downloaded once (``pip download sglang==0.5.23 --no-deps``) into
``$XDG_CACHE_HOME/recoverssm_rs/sglang-0.5.23`` (``$RECOVERSSM_SGLANG_CACHE`` overrides the folder,
``$RECOVERSSM_SGLANG_WHEEL`` names a wheel to use instead; ``RECOVERSSM_NO_DOWNLOAD=1`` forbids the
download) through the vLLM oracle's :func:`vllm_oracle.fetch_wheel`. Five of its
files are extracted there and loaded by path:

* ``sglang/srt/mem_cache/memory_pool.py`` -- ``MambaPool`` (allocation of the layer-stacked conv
  list and temporal tensor, ``clear_slots``, ``copy_from``, ``get_cpu_copy`` / ``load_cpu_copy``,
  ``get_state_dim_per_tensor``) and ``HybridReqToTokenPool`` (request rows, their mamba slots and
  the ping-pong track slots of the radix cache);
* ``sglang/srt/mem_cache/allocator/mamba.py`` -- ``MambaSlotAllocator`` (slot ids) and
  ``sglang/srt/mem_cache/allocation_sizing.py`` (how many track slots a request gets);
* ``sglang/srt/configs/mamba_utils.py`` -- ``Mamba2CacheParams`` / ``KimiLinearCacheParams`` and
  their shape calculators;
* ``sglang/srt/layers/attention/hybrid_linear_attn_backend.py`` -- the torch fallback of the
  speculative scatter after verify, ``HybridLinearAttnBackend._scatter_speculative_state_with_mask``.

Imports those files name but the code under test does not exercise without a GPU (kernels, model
runner, server configuration, platform probes) are stand-ins: platform probes answer "not CUDA /
NPU / CPU-AMX" (so the pools take their generic PyTorch paths, and chain drafts get the
deduplicated conv-window layout SGLang uses on CUDA), environment switches are unset,
synchronisation is a no-op, host-to-device staging is a plain copy, and the optional side-state
and int8 checkpoint pools are absent, as SGLang builds them without their configuration. No SGLang code is stored in this repository.

:func:`load` returns the loaded modules, or raises :class:`OracleUnavailable` with the reason.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import vllm_oracle

VERSION = "0.5.23"
FILES = {
    "sglang.srt.configs.mamba_utils": "sglang/srt/configs/mamba_utils.py",
    "sglang.srt.mem_cache.allocator.mamba": "sglang/srt/mem_cache/allocator/mamba.py",
    "sglang.srt.mem_cache.allocation_sizing": "sglang/srt/mem_cache/allocation_sizing.py",
    "sglang.srt.mem_cache.memory_pool": "sglang/srt/mem_cache/memory_pool.py",
    "sglang.srt.layers.attention.hybrid_linear_attn_backend": "sglang/srt/layers/attention/hybrid_linear_attn_backend.py",
}


class OracleUnavailable(vllm_oracle.OracleUnavailable):
    """SGLang's wheel is not available here."""


def cache_dir() -> Path:
    """The folder the wheel is downloaded into and its files extracted to."""
    given = os.environ.get("RECOVERSSM_SGLANG_CACHE")
    if given:
        return Path(given)
    return vllm_oracle.cache_root() / f"sglang-{VERSION}"


def wheel() -> Path:
    """SGLang's wheel: ``$RECOVERSSM_SGLANG_WHEEL``, else the cached one, downloaded on first use."""
    return vllm_oracle.given_or_fetched("RECOVERSSM_SGLANG_WHEEL", "sglang", VERSION, cache_dir(), OracleUnavailable)


def extracted(member: str) -> Path:
    """The path of ``member`` (a path inside the wheel) extracted into the cache, on first use."""
    return vllm_oracle.extract_member(wheel, cache_dir(), member)


# ------------------------------------------------------------------------------------------------
# Stand-ins for the imports the pool code names but does not exercise on CPU
# ------------------------------------------------------------------------------------------------


class _Anything:
    """A placeholder for names imported but not called here (classes, kernels, type hints)."""

    def __init__(self, *a: Any, **k: Any) -> None:
        pass

    def __class_getitem__(cls, item: Any) -> Any:
        return cls


class _Switch:
    def get(self) -> None:
        return None


class _Envs:
    """``sglang.srt.environ.envs``: every switch unset."""

    def __getattr__(self, name: str) -> _Switch:
        return _Switch()


class _Platform:
    def synchronize(self) -> None:
        pass

    def is_cuda_alike(self) -> bool:
        return False


class _MemorySaver:
    @staticmethod
    def create(enable: bool = False) -> _MemorySaver:
        return _MemorySaver()

    def region(self, *a: Any, **k: Any) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


def _no(*a: Any, **k: Any) -> bool:
    return False


def _h2d(args: Any, *, dtype: Any, device: Any) -> Any:
    """``async_h2d`` without pinned memory (there is no device to copy to)."""
    import torch

    return torch.tensor(args, dtype=dtype).to(device)


class _DisabledSideState:
    """The per-layer-embedding side-state pools as SGLang builds them without a config: disabled."""

    enabled = False

    def __init__(self, *a: Any, **k: Any) -> None:
        pass

    def clear(self) -> None:
        pass


def _divide(a: int, b: int) -> int:
    assert a % b == 0, f"{a} is not divisible by {b}"
    return a // b


_NAMED: dict[str, dict[str, Any]] = {
    "sglang.srt.environ": {"envs": _Envs()},
    "sglang.srt.distributed.utils": {"divide": _divide},
    "sglang.srt.utils": {
        "is_cuda": _no,
        "is_npu": _no,
        "is_cpu": _no,
        "is_xpu": _no,
        "is_hip": _no,
        "cpu_has_amx_support": _no,
        "is_gfx95_supported": _no,
        "is_pin_memory_available": _no,
        "ceil_align": lambda x, a: -(-x // a) * a,
        "next_power_of_2": lambda n: 1 << max(0, n - 1).bit_length(),
    },
    "sglang.kernels.ops.quantization.fp8_kernel": {"is_fp8_fnuz": _no},
    "sglang.srt.constants": {"GPU_MEMORY_TYPE_KV_CACHE": "kv_cache"},
    "sglang.srt.platforms": {"current_platform": _Platform()},
    "sglang.srt.utils.torch_memory_saver_adapter": {"TorchMemorySaverAdapter": _MemorySaver},
    "sglang.srt.mem_cache.utils": {"maybe_init_custom_mem_pool": lambda device=None: (False, None, None)},
    "sglang.srt.utils.common": {"async_h2d": _h2d},
    "sglang.srt.mem_cache.ple_state_pool": {"ShortConvPool": _DisabledSideState, "NGramPool": _DisabledSideState},
    "sglang.srt.mem_cache.mamba_checkpoint_pool": {"maybe_init_int8_mamba_checkpoint_pool": lambda **k: None},
    "sglang.srt.layers.attention.linear.utils": {"pp_spec_stable_rows_enabled": _no},
}


def _stub(name: str) -> types.ModuleType:
    m = types.ModuleType(name)
    m.__path__ = []  # a package, so submodules resolve
    m.__dict__.update(_NAMED.get(name, {}))
    m.__getattr__ = lambda attr: _Anything  # type: ignore[method-assign]
    return m


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves every ``sglang`` module that is not one of :data:`FILES` as a stand-in."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if (fullname == "sglang" or fullname.startswith("sglang.")) and fullname not in FILES:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _stub(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        pass


@contextlib.contextmanager
def stubs() -> Iterator[None]:
    """While active, ``sglang`` imports resolve to the loaded files and the stand-ins (SGLang
    imports some modules inside functions: wrap calls that do, such as ``HybridReqToTokenPool``'s
    constructor); afterwards ``sys.modules`` holds no ``sglang`` module again."""
    finder = _StubFinder()
    saved = {k: v for k, v in sys.modules.items() if k == "sglang" or k.startswith("sglang.")}
    if _LOADED is not None:
        sys.modules.update(_LOADED.modules)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for k in [k for k in sys.modules if k == "sglang" or k.startswith("sglang.")]:
            del sys.modules[k]
        sys.modules.update(saved)


_LOADED: types.SimpleNamespace | None = None


def load() -> types.SimpleNamespace:
    """``namespace(pool=..., alloc=..., configs=..., backend=...)``: SGLang's modules, loaded once per
    process (``pool.MambaPool``, ``alloc.MambaSlotAllocator``, ``configs.Mamba2CacheParams``, ...,
    ``backend.HybridLinearAttnBackend._scatter_speculative_state_with_mask``)."""
    global _LOADED
    if _LOADED is not None:
        return _LOADED
    paths = {name: extracted(rel) for name, rel in FILES.items()}
    # memory_pool.py defines Triton kernels at import; Triton is imported the way the vLLM oracle
    # needs it (interpreted), whichever oracle comes first.
    try:
        vllm_oracle.import_interpreted_triton()
    except vllm_oracle.OracleUnavailable as exc:
        raise OracleUnavailable(str(exc)) from None
    loaded = {}
    with stubs():
        for name in FILES:
            loaded[name] = vllm_oracle.exec_by_path(name, paths[name])
    _LOADED = types.SimpleNamespace(
        configs=loaded["sglang.srt.configs.mamba_utils"],
        alloc=loaded["sglang.srt.mem_cache.allocator.mamba"],
        pool=loaded["sglang.srt.mem_cache.memory_pool"],
        backend=loaded["sglang.srt.layers.attention.hybrid_linear_attn_backend"],
        modules=loaded,
    )
    return _LOADED
