"""Copy plans for recurrent-state copies between cache blocks.

A :class:`CopyPlanner` binds a :class:`~recoverssm_rs.Layout` to an engine's state tensors (per
layer, the persistent states ``[num_blocks, *state_shape]``, torch tensors or numpy arrays, possibly
strided views into one shared buffer). Each step, :meth:`CopyPlanner.plan_align` (speculative
decoding / prefix-cache alignment) or :meth:`CopyPlanner.plan_copy` (forks, cache hits) turns
vectorised inputs into a validated, hazard-ordered, coalesced :class:`CopyPlan`; the Rust core does
all of the work with the GIL released. :meth:`CopyPlan.execute` runs it on the states' device.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from . import _core
from ._core import Layout
from .errors import PlanError
from .plan_format import MOVE_ROW_DTYPE, SEGMENT_DTYPE, STATE_META_DTYPE, TILE_DTYPE

__all__ = ["CopyPlanner", "CopyPlan", "TileTable", "describe_tensor"]

log = logging.getLogger("recoverssm_rs")

DEFAULT_TILE_BYTES = 64 * 1024


def describe_tensor(t: Any) -> tuple[int, str, list[int], list[int], str, bool]:
    """``(data_ptr, dtype, shape, byte_strides, device, writable)`` of a torch tensor or numpy array.

    The core checks these against the layout; this only reads them.
    """
    if isinstance(t, np.ndarray):
        return (
            int(t.ctypes.data),
            t.dtype.name,
            list(t.shape),
            list(t.strides),
            "cpu",
            bool(t.flags.writeable),
        )
    if hasattr(t, "data_ptr") and hasattr(t, "element_size"):  # torch.Tensor
        es = t.element_size()
        return (
            int(t.data_ptr()),
            str(t.dtype),
            list(t.shape),
            [int(s) * es for s in t.stride()],
            str(t.device),
            True,
        )
    raise TypeError(f"state tensors must be torch tensors or numpy arrays, got {type(t).__name__}")


def _host_ints(x: Any, name: str) -> Any:
    """A host integer array for the core (numpy arrays pass through without a copy)."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "device") and hasattr(x, "numpy"):  # torch.Tensor
        if x.device.type != "cpu":
            raise PlanError(
                f"{name} is on {x.device}; host plans read host inputs (copying them to the host "
                "would synchronise the device). Pass CPU arrays, or launch the device-side copy "
                "with the GPU executor, which reads its inputs in device memory."
            )
        try:
            return x.detach().numpy()
        except TypeError:  # a dtype numpy lacks (bfloat16, ...): never an integer array
            raise PlanError(f"{name} must be an int32 or int64 array, got {x.dtype}") from None
    return np.asarray(x)


class TileTable(NamedTuple):
    """Tiles of a plan for the GPU batched-copy kernel, grouped by wave."""

    tiles: np.ndarray
    """``TILE_DTYPE`` records."""
    wave_starts: np.ndarray
    """``uint32 [num_waves + 1]``: tiles of wave ``w`` are ``tiles[wave_starts[w]:wave_starts[w+1]]``."""
    tile_bytes: int


class CopyPlan:
    """The validated copies of one step. Inspect it with zero-copy numpy views; run it with
    :meth:`execute`. Holds its planner (and so the state tensors) alive."""

    __slots__ = ("_plan", "_planner", "_segments", "_rows", "_waves")

    def __init__(self, plan: _core.Plan, planner: CopyPlanner) -> None:
        self._plan = plan
        self._planner = planner
        self._segments: np.ndarray | None = None
        self._rows: np.ndarray | None = None
        self._waves: np.ndarray | None = None

    @property
    def segments(self) -> np.ndarray:
        """Segment records (``SEGMENT_DTYPE``), grouped by wave; a read-only view."""
        if self._segments is None:
            self._segments = np.frombuffer(self._plan.segments(), dtype=SEGMENT_DTYPE)
        return self._segments

    @property
    def rows(self) -> np.ndarray:
        """Compact per-request records (``MOVE_ROW_DTYPE``), sorted by request."""
        if self._rows is None:
            self._rows = np.frombuffer(self._plan.rows(), dtype=MOVE_ROW_DTYPE)
        return self._rows

    @property
    def waves(self) -> np.ndarray:
        """``uint32 [num_waves + 1]``: segments of wave ``w`` are ``segments[waves[w]:waves[w+1]]``."""
        if self._waves is None:
            self._waves = np.frombuffer(self._plan.wave_starts(), dtype=np.uint32)
        return self._waves

    def tiles(self, tile_bytes: int = DEFAULT_TILE_BYTES) -> TileTable:
        """Cut the segments into tiles of about ``tile_bytes`` (a multiple of 16)."""
        t, w = self._plan.tiles(tile_bytes)
        return TileTable(np.frombuffer(t, dtype=TILE_DTYPE), np.frombuffer(w, dtype=np.uint32),
                         tile_bytes)

    @property
    def num_waves(self) -> int:
        """Ordered waves: copies of a wave may run concurrently, waves run in order."""
        return self._plan.num_waves

    @property
    def num_segments(self) -> int:
        return self._plan.num_segments

    @property
    def num_requests(self) -> int:
        """Requests that move something."""
        return self._plan.num_requests

    @property
    def nbytes(self) -> int:
        """Bytes the plan copies."""
        return self._plan.nbytes

    @property
    def planner(self) -> CopyPlanner:
        return self._planner

    def __len__(self) -> int:
        """Number of (layer, state, request) copies planned, before coalescing."""
        return self._plan.num_copies

    def execute(self, stream: Any = None) -> None:
        """Run the plan on the states' device: the Rust host executor for CPU states (GIL
        released; every segment is checked before the first byte moves), the CUDA kernels for
        CUDA states (on ``stream``, default the current torch stream; one launch per wave)."""
        if self._planner.device == "cpu":
            self._plan.execute_host()
            return
        from . import gpu

        gpu.execute_plan(self, stream=stream)

    def __repr__(self) -> str:
        return (
            f"CopyPlan(copies={len(self)}, segments={self.num_segments}, "
            f"requests={self.num_requests}, waves={self.num_waves}, bytes={self.nbytes})"
        )


class CopyPlanner:
    """Plans state copies for one layout bound to an engine's state tensors.

    Args:
        layout: the layer layout.
        states: ``states[layer]`` is the list of that layer's state tensors, in layout order:
            the persistent states (``[num_blocks, *state_shape]`` each), optionally followed by the
            workspace tensors (ignored: they are never copied). All on one device.

    Raises:
        BindingError: a tensor does not match the layout (dtype, per-block shape, dense inner
            dimensions, block stride, alignment, device, overlapping memory); the message names
            the layer and state.
    """

    __slots__ = ("_core", "_states", "_meta", "__weakref__")

    def __init__(self, layout: Layout, states: Sequence[Sequence[Any]]) -> None:
        self._states = [list(layer) for layer in states]
        descs = [[describe_tensor(t) for t in layer] for layer in self._states]
        self._core = _core.Planner(layout, descs, self._states)
        self._meta: np.ndarray | None = None
        log.debug("bound %r: %d layers, %d blocks on %s", layout.backend, self.num_layers,
                  self.num_blocks, self.device)

    @property
    def layout(self) -> Layout:
        return self._core.layout

    @property
    def num_layers(self) -> int:
        return self._core.num_layers

    @property
    def num_blocks(self) -> int:
        return self._core.num_blocks

    @property
    def device(self) -> str:
        """``"cpu"`` or ``"cuda:N"``."""
        return self._core.device

    @property
    def states(self) -> list[list[Any]]:
        """The bound tensors, per layer."""
        return self._states

    @property
    def state_meta(self) -> np.ndarray:
        """Per (layer, persistent state) metadata (``STATE_META_DTYPE``) for the fused kernel."""
        if self._meta is None:
            self._meta = np.frombuffer(self._core.state_meta(), dtype=STATE_META_DTYPE)
        return self._meta

    def plan_align(self, block_table: Any, src_col: Any, dst_col: Any, num_accepted: Any) -> CopyPlan:
        """Plan an align-mode step (speculative decoding with prefix caching).

        Per request ``r``, with ``a = num_accepted[r]`` and ``bt = block_table[r]``:
        conv windows ``bt[dst_col]`` get the window of ``bt[src_col]`` shifted left by ``a - 1``
        columns (in place when both are the same block); temporal states
        ``bt[dst_col] <- bt[src_col + a - 1]``. Rows with a negative column are padding; rows whose
        source and destination are both the null block 0 are skipped; ``src_col == dst_col`` with
        ``a == 1`` is a no-op.

        Args:
            block_table: ``[R, cols]`` int32/int64 block ids (numpy or CPU tensor).
            src_col, dst_col, num_accepted: ``[R]`` int32/int64.

        Raises:
            PlanError: before anything moves, naming the request and state: a column outside the
                row, ``num_accepted`` outside ``1..=1+num_spec``, a block id outside the pool, the
                null block as a destination or a source, two copies writing the same block, or a
                cycle of copies that cannot be ordered without staging.
        """
        return CopyPlan(
            self._core.plan_align(
                _host_ints(block_table, "block_table"),
                _host_ints(src_col, "src_col"),
                _host_ints(dst_col, "dst_col"),
                _host_ints(num_accepted, "num_accepted"),
            ),
            self,
        )

    def plan_copy(self, src_blocks: Any, dst_blocks: Any) -> CopyPlan:
        """Plan whole-block copies ``dst_blocks[i] <- src_blocks[i]`` of every persistent state of
        every layer (forks, prefix-cache hits). Equal ids are no-ops, negative ids padding."""
        return CopyPlan(
            self._core.plan_copy(_host_ints(src_blocks, "src_blocks"),
                                 _host_ints(dst_blocks, "dst_blocks")),
            self,
        )

    def __repr__(self) -> str:
        return (f"CopyPlanner({self.layout.backend!r}, layers={self.num_layers}, "
                f"blocks={self.num_blocks}, device={self.device!r})")
