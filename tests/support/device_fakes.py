"""Test doubles for the device path without a GPU: CPU tensors that claim to live on ``cuda:N``, a
host stand-in for the device path's torch CUDA calls, and a recorder that replaces the driver launch
(keeping each core-built launch and, optionally, running it through the host emulation). The
fixtures ``fake_ops``, ``recorder`` and ``emulator`` (``conftest.py``) install them."""

from __future__ import annotations

import contextlib
import ctypes
import operator
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from recoverssm_rs import cuda
from recoverssm_rs.cuda import commit as cuda_commit
from recoverssm_rs.cuda import module as cuda_module
from recoverssm_rs.cuda import ops as device_path


class FakeCuda:
    """A CPU torch tensor that claims to be on ``cuda:index`` (enough for the host-side logic).

    What the core reads of a tensor answers as a CUDA tensor's does, through C: ``data_ptr``,
    ``stride``, ``dim``, ``element_size``, ``untyped_storage`` and ``is_inference`` are the host
    tensor's own bound methods (so a ``set_()`` or a storage resize on the host tensor shows through
    them, and the bound-memory guard checks the storage as it does a CUDA tensor's), ``dtype`` and
    ``shape`` C getters of it, ``_base`` the tensor whose version counter a write bumps."""

    def __init__(self, t: torch.Tensor, index: int = 0) -> None:
        self.t = t
        self.device = torch.device("cuda", index)
        self.layout = t.layout
        self.requires_grad = t.requires_grad
        self.data_ptr: Callable[[], int] = t.data_ptr
        self.stride: Callable[..., Any] = t.stride
        self.dim: Callable[[], int] = t.dim
        self.element_size: Callable[[], int] = t.element_size
        self.untyped_storage: Callable[[], Any] = t.untyped_storage
        self.is_inference: Callable[[], bool] = t.is_inference
        self._base = t if t._base is None else t._base

    dtype = property(operator.attrgetter("t.dtype"))
    shape = property(operator.attrgetter("t.shape"))

    def to(self, dtype: Any) -> FakeCuda:
        return FakeCuda(self.t.to(dtype), self.device.index)

    def contiguous(self) -> FakeCuda:
        return FakeCuda(self.t.contiguous(), self.device.index)

    def view(self, *shape: Any) -> FakeCuda:
        return FakeCuda(self.t.view(*shape), self.device.index)

    def __getitem__(self, key: Any) -> FakeCuda:
        return FakeCuda(self.t[key], self.device.index)

    def zero_(self) -> FakeCuda:
        self.t.zero_()
        return self

    # The tensor methods of the device remap of counts (run on the host tensor, results wrapped).
    def _on(self, name: str, *args: Any) -> FakeCuda:
        out = getattr(self.t, name)(*(x.t if isinstance(x, FakeCuda) else x for x in args))
        return self if out is self.t else FakeCuda(out, self.device.index)

    def fill_(self, v: Any) -> FakeCuda:
        return self._on("fill_", v)

    def copy_(self, src: Any) -> FakeCuda:
        return self._on("copy_", src)

    def clamp(self, lo: Any, hi: Any) -> FakeCuda:
        return self._on("clamp", lo, hi)

    def index_select(self, dim: int, index: Any) -> FakeCuda:
        return self._on("index_select", dim, index)

    def masked_fill_(self, mask: Any, v: Any) -> FakeCuda:
        return self._on("masked_fill_", mask, v)

    def __ge__(self, v: Any) -> FakeCuda:  # type: ignore[override]
        return self._on("__ge__", v)

    def __lt__(self, v: Any) -> FakeCuda:  # type: ignore[override]
        return self._on("__lt__", v)

    def __and__(self, v: Any) -> FakeCuda:
        return self._on("__and__", v)

    def __invert__(self) -> FakeCuda:
        return self._on("__invert__")

    def cpu(self) -> torch.Tensor:
        return self.t

    def numpy(self) -> np.ndarray:  # what the recorder hands to the emulation
        return self.t.numpy()


class FakeOps(device_path.CudaOps):
    """Host stand-in for the torch CUDA calls of the device path."""

    def __init__(self) -> None:
        self.uploads = 0
        self.staged = 0
        self.allocs = 0
        self.syncs = 0
        self.contexts: list[tuple[int, Any]] = []

    def context(self, index: int, stream: Any) -> Any:
        self.contexts.append((index, stream))
        return contextlib.nullcontext()

    def torch_stream(self, stream: Any, index: int) -> Any:
        return stream

    def upload(self, raw: np.ndarray, index: int) -> Any:
        self.uploads += 1
        return FakeCuda(torch.from_numpy(np.ascontiguousarray(raw).copy()), index)

    def ids_i64(self, ids: Any, index: int) -> Any:
        return FakeCuda(torch.as_tensor(ids, dtype=torch.int64), index)

    def stage_i32(self, host: Any, dest: Any) -> None:
        self.staged += 1
        data = np.frombuffer(host, dtype=np.int32)
        dest.t[: len(data)] = torch.from_numpy(data.copy())

    def empty_i32(self, n: int, index: int) -> Any:
        self.allocs += 1
        return FakeCuda(torch.full((n,), -1, dtype=torch.int32), index)

    def stack_rows(self, tables: list[Any], rows: int, index: int) -> Any:
        return FakeCuda(torch.stack([t.t[:rows] for t in tables]), index)

    def zeros_i32(self, n: int, index: int) -> Any:
        self.allocs += 1
        return FakeCuda(torch.zeros(n, dtype=torch.int32), index)

    def synchronize(self, index: int) -> None:
        self.syncs += 1


def bytes_at(ptr: int, n: int) -> bytes:
    return ctypes.string_at(ptr, n)


def ints_at(ptr: int, n: int) -> np.ndarray:
    return np.frombuffer(ctypes.string_at(ptr, 4 * n), dtype=np.int32)


def word_at(ptr: int) -> np.ndarray:
    return np.ctypeslib.as_array((ctypes.c_int32 * 3).from_address(ptr)).copy()


class Recorder:
    """Replaces the driver launch; records each core-built launch (and optionally emulates it)."""

    def __init__(self, emulate: bool) -> None:
        self.calls: list[dict[str, Any]] = []
        self.emulate = emulate

    def launch(self, kl: Any, index: int, stream: Any) -> None:
        v = dict(kl.values())
        table = None
        if kl.kernel == "rs_state_copy":  # the rows this step reads, as the kernel sees them now
            rows = [
                ints_at(v["block_table"] + 4 * r * v["bt_row_stride"], v["bt_cols"]).tolist()
                for r in range(v["num_requests"])
            ]
            table = rows
        self.calls.append(
            dict(
                v,
                kernel=kl.kernel,
                launch=kl,
                index=index,
                stream=stream,
                chunks=kl.grid[0],
                table=table,
                has_temporal=bool(v.get("flags", 0) & cuda.FLAG_HAS_TEMPORAL),
                decide=bool(v.get("flags", 0) & cuda.FLAG_DECIDE),
                err_at_launch=word_at(v["err"]),
            )
        )
        if self.emulate:
            from support import emulation

            x = 3 + (v["rec_ctas"] + v["conv_ctas"] if v.get("commit_rows") else 0)  # a commit's CTAs after
            emulation.run(kl, grid=(x, kl.grid[1], kl.grid[2])).check(kl.kernel)


def install(
    monkeypatch: Any, *, ops: bool = True, emulate: bool | None = None
) -> tuple[FakeOps | None, Recorder | None]:
    """Install the fake CUDA ops and/or a launch recorder (``emulate=None``: no recorder)."""
    fake = None
    if ops:
        fake = FakeOps()
        monkeypatch.setattr(device_path, "cuda_ops", fake)
    rec = None
    if emulate is not None:
        rec = Recorder(emulate)
        monkeypatch.setattr(cuda_module, "launch", rec.launch)
    return fake, rec


_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def random_states(layout: Any, nb: int, layers: int, rng: np.random.Generator) -> list[list[torch.Tensor]]:
    """Per-layer persistent state tensors ``[nb, *shape]`` on the CPU, filled with random bytes (so
    every copied byte is checked)."""
    out = []
    for _ in range(layers):
        layer = []
        for s in layout.persistent:
            t = torch.empty((nb, *s.shape), dtype=_DTYPES[s.dtype])
            t.view(torch.uint8).copy_(
                torch.from_numpy(rng.integers(0, 256, size=t.nbytes, dtype=np.uint8)).view(t.view(torch.uint8).shape)
            )
            layer.append(t)
        out.append(layer)
    return out


class HostCommitKernel(cuda_commit.CommitKernel):
    """A state cache's CUDA commit path over its CPU buffers, described as if on ``cuda:0`` (the
    launch goes wherever the test sends ``module.launch``: the kernel's host emulation)."""

    def device_name(self) -> str:
        return "cuda:0"

    def device_arg(self, x: Any) -> Any:
        return FakeCuda(x)

    def staging(self, nbytes: int) -> Any:
        return torch.empty(nbytes, dtype=torch.uint8)


def bind_host_commit(cache: Any) -> HostCommitKernel:
    """Binds ``cache``'s commit to a :class:`HostCommitKernel` (ready: nothing left to compile) and
    returns it."""
    kernel = HostCommitKernel(
        cache.commit_meta(), device="cpu", num_blocks=cache.num_blocks, max_requests=cache.max_requests
    )
    kernel.ready = True
    cache._device_commit = kernel
    return kernel
