"""The fused-copy launches pass their parameters in the kernels' declared order (checked without
a GPU by capturing the launch)."""

import numpy as np
import pytest

from fakes import FakeDeviceArray
from recoverssm_rs import gpu


@pytest.fixture
def captured(monkeypatch):
    calls = []
    monkeypatch.setattr(gpu, "_launch", lambda name, grid, args, stream: calls.append((name, grid, args)))
    return calls


def test_explicit_entry_parameter_order(captured):
    gpu.launch_state_copy(1000, 3, FakeDeviceArray(9000, (5, 6)), 2000, 3000, 4000, 5000,
                          max_accepted=4, num_blocks=77, has_temporal=True, num_requests=5)
    ((name, grid, args),) = captured
    assert name == "rs_state_copy" and grid == gpu.state_copy_grid(5, 3)
    # metas, num_meta, block_table, bt_row_stride, bt_cols, src_col, dst_col, num_accepted,
    # num_requests, max_accepted, num_blocks, flags, err
    assert [int(a) for a in args] == [1000, 3, 9000, 6, 6, 2000, 3000, 4000, 5, 4, 77,
                                      gpu.FLAG_HAS_TEMPORAL, 5000]
    assert [a.dtype for a in args] == [np.uint64, np.uint32, np.uint64, np.int64, np.int32, np.uint64,
                                       np.uint64, np.uint64, np.int32, np.int32, np.int64, np.uint32,
                                       np.uint64]


def test_align_entry_parameter_order(captured):
    gpu.launch_state_copy_align(1000, 3, FakeDeviceArray(9000, (5, 6)), 2000, 3000, 4000, 5000, block_size=16,
                                max_accepted=4, num_blocks=77, has_temporal=False, num_requests=5)
    ((name, _, args),) = captured
    assert name == "rs_state_copy_align"
    # ..., src_col, running, num_accepted, block_size, num_requests, max_accepted, num_blocks, flags, err
    assert [int(a) for a in args] == [1000, 3, 9000, 6, 6, 2000, 3000, 4000, 16, 5, 4, 77, 0, 5000]
    assert args[8].dtype == np.int32


def test_kernel_sources_declare_that_order():
    src = gpu.kernel_source("state_copy.cu")
    explicit = src[src.index("rs_state_copy("):]
    explicit = explicit[: explicit.index(")")]
    assert [p.split()[-1].lstrip("*") for p in explicit.split("(", 1)[1].split(",")] == [
        "metas", "num_meta", "block_table", "bt_row_stride", "bt_cols", "src_col", "dst_col",
        "num_accepted", "num_requests", "max_accepted", "num_blocks", "flags", "err"]


def test_external_streams_are_made_once_per_handle(monkeypatch):
    made = []

    class FakeCuda:
        @staticmethod
        def ExternalStream(ptr, device):  # noqa: N802 - CuPy's name
            made.append((ptr, device))
            return ("stream", ptr, device)

    class FakeCupy:
        cuda = FakeCuda

    class TorchStream:
        def __init__(self, ptr, index):
            self.cuda_stream = ptr
            self.device = type("D", (), {"index": index})()

    monkeypatch.setattr(gpu, "_cupy", lambda: FakeCupy)
    monkeypatch.setattr(gpu, "_EXTERNAL", {})
    a1 = gpu._external(TorchStream(0x1000, 0))
    a2 = gpu._external(TorchStream(0x1000, 0))
    b = gpu._external(TorchStream(0x2000, 1))
    assert a1 is a2 and a1 == ("stream", 0x1000, 0) and b == ("stream", 0x2000, 1)
    assert made == [(0x1000, 0), (0x2000, 1)]
