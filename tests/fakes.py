"""Test doubles for the CUDA launch layer, shared by the tests that check it without a GPU: a
device array that exposes only what the launch layer reads, and a CuPy stand-in whose kernels
record their launches instead of running them."""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any, Optional

import numpy as np

from recoverssm_rs import gpu


class FakeDeviceArray:
    """A CUDA array as the launch layer sees a CuPy array: ``__cuda_array_interface__`` (version 3:
    data, shape, byte strides, typestr), ``shape``, ``dtype`` and ``device.id``. It owns no memory."""

    def __init__(self, ptr: int, shape: tuple[int, ...], strides: Optional[tuple[int, ...]] = None,
                 dtype: str = "int32", device_id: int = 0) -> None:
        dt = np.dtype(dtype)
        self.shape, self.dtype = tuple(shape), dt
        if strides is None:
            strides = tuple(dt.itemsize * int(np.prod(shape[i + 1:])) for i in range(len(shape)))
        self.strides = tuple(strides)
        self.device = SimpleNamespace(id=device_id)
        self.__cuda_array_interface__ = {"data": (ptr, False), "shape": self.shape, "strides": self.strides,
                                         "typestr": dt.str, "version": 3}


class FakeStream:
    """A CuPy stream stand-in: a context manager that records when it is entered."""

    def __init__(self, entered: Optional[list[Any]] = None) -> None:
        self.entered = entered if entered is not None else []

    def __enter__(self) -> FakeStream:
        self.entered.append(self)
        return self

    def __exit__(self, *exc: Any) -> bool:
        return False


def install_fake_cupy(monkeypatch: Any) -> SimpleNamespace:
    """Replace ``cupy`` by a stand-in whose ``RawModule`` kernels record each launch as
    ``(name, grid, block, args, stream)`` (the innermost stream entered, or None), and reset the
    launch layer's caches. Returns ``SimpleNamespace(calls, entered, modules)``."""
    rec = SimpleNamespace(calls=[], entered=[], modules=[])

    class FakeKernel:
        def __init__(self, name: str) -> None:
            self.name = name

        def __call__(self, grid: Any, block: Any, args: Any) -> None:
            rec.calls.append((self.name, grid, block, args, rec.entered[-1] if rec.entered else None))

    class FakeModule:
        def __init__(self, code: str, options: Any) -> None:
            self.code, self.options = code, options
            rec.modules.append(self)

        def compile(self) -> None:
            pass

        def get_function(self, name: str) -> FakeKernel:
            return FakeKernel(name)

    class FakeCupy:
        RawModule = FakeModule

        class cuda:  # noqa: N801 - CuPy's name
            class runtime:  # noqa: N801
                @staticmethod
                def getDeviceCount() -> int:  # noqa: N802
                    return 1

    monkeypatch.setitem(sys.modules, "cupy", FakeCupy)
    monkeypatch.setattr(gpu, "_module", None)
    monkeypatch.setattr(gpu, "_kernels", {})
    monkeypatch.setattr(gpu, "_cupy_ok", None)
    return rec
