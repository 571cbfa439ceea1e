"""Test doubles for the CUDA launch layer, shared by the tests that check it without a GPU: a
device array that exposes only what the launch layer reads, and a CuPy stand-in whose driver records
each launch (kernel, grid, block, stream and the packed argument bytes, read back through the
``extra`` array the way the CUDA driver reads them) instead of running it."""

from __future__ import annotations

import ctypes
import sys
from types import SimpleNamespace
from typing import Any

import numpy as np
from recoverssm_rs.cuda import module
from recoverssm_rs.plan_format import ABI

_SIZES = {"uint32_t": 4, "int32_t": 4, "int64_t": 8}


class FakeDeviceArray:
    """A CUDA array as the launch layer sees a CuPy array: ``__cuda_array_interface__`` (version 3:
    data, shape, byte strides, typestr), ``shape``, ``dtype`` and ``device.id``. It owns no memory."""

    def __init__(
        self,
        ptr: int,
        shape: tuple[int, ...],
        strides: tuple[int, ...] | None = None,
        dtype: str = "int32",
        device_id: int = 0,
    ) -> None:
        dt = np.dtype(dtype)
        self.shape, self.dtype = tuple(shape), dt
        if strides is None:
            strides = tuple(dt.itemsize * int(np.prod(shape[i + 1 :])) for i in range(len(shape)))
        self.strides = tuple(strides)
        self.device = SimpleNamespace(id=device_id)
        self.__cuda_array_interface__ = {
            "data": (ptr, False),
            "shape": self.shape,
            "strides": self.strides,
            "typestr": dt.str,
            "version": 3,
        }


class FakeStream:
    """A CuPy stream stand-in: a raw handle (``ptr``)."""

    def __init__(self, ptr: int = 0x5EA) -> None:
        self.ptr = ptr


def unpack_args(kernel: str, buf: bytes) -> list[int]:
    """The argument values in ``buf``, unpacked by the kernel's declared C types (natural alignment),
    independently of the core's own unpacking."""
    spec = next(k for k in ABI["kernels"] if k["name"] == kernel)
    off, out = 0, []
    for _, ctype in spec["params"]:
        size = 8 if ctype.endswith("*") else _SIZES[ctype]
        off = (off + size - 1) // size * size
        out.append(int.from_bytes(buf[off : off + size], "little", signed=ctype.startswith("int")))
        off += size
    assert off == len(buf), f"{kernel}: {len(buf)} argument bytes, the declaration takes {off}"
    return out


def install_fake_cupy(monkeypatch: Any) -> SimpleNamespace:
    """Replace ``cupy`` by a stand-in whose driver records each launch as ``(name, grid, block,
    values, stream)`` (values unpacked from the packed buffer), and reset the launch layer's caches.
    Returns ``SimpleNamespace(calls, modules)``."""
    rec = SimpleNamespace(calls=[], modules=[])
    names: dict[int, str] = {}

    class FakeKernel:
        def __init__(self, name: str) -> None:
            self.name = name
            self.kernel = SimpleNamespace(ptr=0xF000 + len(names))
            names[self.kernel.ptr] = name

    class FakeModule:
        def __init__(self, code: str, options: Any) -> None:
            self.code, self.options = code, options
            rec.modules.append(self)

        def compile(self) -> None:
            pass

        def get_function(self, name: str) -> FakeKernel:
            return FakeKernel(name)

    class FakeDevice:
        def __init__(self, index: int) -> None:
            self.index = index

        def __enter__(self) -> FakeDevice:
            return self

        def __exit__(self, *exc: Any) -> bool:
            return False

    def launch_kernel(
        fn: int, gx: int, gy: int, gz: int, bx: int, by: int, bz: int, shmem: int, stream: int, params: int, extra: int
    ) -> None:
        assert shmem == 0 and params == 0
        marks = (ctypes.c_size_t * 5).from_address(extra)
        assert (marks[0], marks[2], marks[4]) == (1, 2, 0), "extra: BUFFER_POINTER, ., BUFFER_SIZE, ., END"
        size = ctypes.c_size_t.from_address(marks[3]).value
        buf = ctypes.string_at(marks[1], size)
        name = names[fn]
        rec.calls.append((name, (gx, gy, gz), (bx, by, bz), unpack_args(name, buf), stream))

    class FakeCupy:
        RawModule = FakeModule

        class cuda:  # noqa: N801 - CuPy's name
            Device = FakeDevice

            class runtime:  # noqa: N801
                @staticmethod
                def getDeviceCount() -> int:  # noqa: N802
                    return 1

                @staticmethod
                def getDevice() -> int:  # noqa: N802
                    return 0

            class driver:  # noqa: N801
                launchKernel = staticmethod(launch_kernel)  # noqa: N815

    monkeypatch.setitem(sys.modules, "cupy", FakeCupy)
    monkeypatch.setattr(module, "_module", None)
    monkeypatch.setattr(module, "_kernels", {})
    monkeypatch.setattr(module, "_functions", {})
    monkeypatch.setattr(module, "_cupy_ok", None)
    return rec
