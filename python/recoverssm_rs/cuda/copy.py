"""Launches of the copy kernels: ``rs_copy_tiles`` (one wave of a planned batched copy, see
:func:`execute_plan`) and ``rs_state_copy`` (the fused align-mode copy of every persistent state of
every layer, with explicit columns or the align decision taken on the device).

The core checks every argument and packs the launch (``_core.copy_tiles_launch``,
``_core.FusedCopy``); this module describes the arguments and hands the result to the driver.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _core
from ..errors import PlanError
from ..plan_format import CONSTANTS
from . import module

if TYPE_CHECKING:
    from ..planner import CopyPlan

__all__ = ["MAX_STATE_CHUNKS", "state_chunks", "launch_copy_tiles", "launch_state_copy", "execute_plan"]

#: Most CTAs per state copy of the fused kernel (64 for 2 MiB states; see the core's constants).
MAX_STATE_CHUNKS = CONSTANTS["MAX_STATE_CHUNKS"]
state_chunks = _core.state_chunks


def launch_copy_tiles(
    segments_dev: Any,
    tiles_dev: Any,
    first_tile: int,
    num_tiles: int,
    stream: Any = None,
    *,
    max_ctas: int | None = None,
    device_index: int = 0,
) -> None:
    """Launch ``rs_copy_tiles`` for one wave: tiles ``[first_tile, first_tile + num_tiles)`` of the
    device arrays of ``SEGMENT_DTYPE`` / ``TILE_DTYPE`` records (tensors, CuPy arrays or addresses).
    Launch waves in order on one stream; ``num_tiles == 0`` launches nothing. ``max_ctas`` caps the
    grid (the kernel walks the tiles grid-stride)."""
    kl = _core.copy_tiles_launch(
        segments=module.address(segments_dev),
        tiles=module.address(tiles_dev),
        first_tile=first_tile,
        num_tiles=num_tiles,
        max_ctas=max_ctas,
    )
    if kl is not None:
        module.launch(kl, device_index, stream)


def launch_state_copy(
    meta_dev: Any,
    num_meta: int,
    block_table: Any,
    src_col: Any,
    dst_or_running: Any,
    num_accepted: Any,
    err: Any,
    *,
    max_accepted: int,
    num_blocks: int,
    has_temporal: bool,
    block_size: int | None = None,
    chunks: int = MAX_STATE_CHUNKS,
    stream: Any = None,
    num_accepted_out: Any = None,
) -> None:
    """Launch ``rs_state_copy`` on the caller's stream; never synchronises.

    Args:
        meta_dev: device array (or address) of ``num_meta`` ``STATE_META_DTYPE`` records.
        block_table: int32 CUDA tensor / CuPy array ``[>= R, cols]``, column axis contiguous.
        src_col, dst_or_running, num_accepted: int32 device vectors of ``R`` elements;
            ``dst_or_running`` is ``dst_col``, or ``running`` with a ``block_size`` (the align
            decision on the device, see :meth:`~recoverssm_rs.Planner.launch_align_decision`).
        err: int32 device vector of 3 elements, zeroed by the caller before the step; decode a host
            copy with :class:`~recoverssm_rs.cuda.ErrorWord`.
        max_accepted: ``1 + num_spec``. num_blocks: blocks of the pool (ids in ``[1, num_blocks)``).
        has_temporal: some state in ``meta_dev`` is temporal.
        chunks: CTAs per state copy (grid x).
        stream: a CuPy stream or a ``torch.cuda.Stream``; ``None``: the current torch stream.
        num_accepted_out: optional int32 device vector of ``R`` elements, sharing no byte with an
            input: each request's accepted count after the step (1 where its running state moved
            or shifted, ``num_accepted[r]`` elsewhere).

    Raises:
        PlanError: an argument the kernel cannot take (the core's message names it).
    """
    fused = _core.FusedCopy(
        device=block_table,
        metas=module.address(meta_dev),
        num_meta=num_meta,
        max_accepted=max_accepted,
        num_blocks=num_blocks,
        has_temporal=bool(has_temporal),
        chunks=chunks,
        err=module.address(err),
    )
    kl = fused.launch(
        block_table=block_table,
        src_col=src_col,
        second=dst_or_running,
        num_accepted=num_accepted,
        err=err,
        block_size=block_size,
        num_accepted_out=num_accepted_out,
    )
    if kl is not None:
        module.launch(kl, fused.device_index, stream)


def execute_plan(plan: CopyPlan, stream: Any = None, *, tile_bytes: int = 64 * 1024) -> None:
    """Run a :class:`~recoverssm_rs.CopyPlan` whose states are CUDA tensors.

    The plan's segments and tiles (``plan.tiles(tile_bytes)``) are staged in pinned host memory,
    copied to the device asynchronously, and executed by one ``rs_copy_tiles`` launch per wave, all
    on ``stream`` (a ``torch.cuda.Stream``; default: the current torch stream). Nothing waits for
    the device. The staging buffers return to torch's caching allocators, which keep them alive
    until the stream has used them.
    """
    import torch

    if stream is not None and not hasattr(stream, "cuda_stream"):
        raise PlanError(f"stream must be a torch.cuda.Stream or None, got {type(stream).__name__}")
    segments = np.ascontiguousarray(plan.segments)
    table = plan.tiles(tile_bytes)
    tiles = np.ascontiguousarray(table.tiles)
    starts = [int(x) for x in table.wave_starts]
    if len(tiles) == 0:
        return
    device = torch.device(plan.planner.device)
    index = device.index or 0
    nseg = segments.nbytes
    ctx = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
    with torch.cuda.device(device), ctx:
        host = torch.empty(nseg + tiles.nbytes, dtype=torch.uint8, pin_memory=True)
        staged = host.numpy()
        staged[:nseg] = segments.view(np.uint8).reshape(-1)
        staged[nseg:] = tiles.view(np.uint8).reshape(-1)
        dev = torch.empty(host.shape[0], dtype=torch.uint8, device=device)
        dev.copy_(host, non_blocking=True)
        handle = module.stream_handle(None, index)  # the current stream (``stream`` when given)
        base = dev.data_ptr()
        for w in range(len(starts) - 1):
            kl = _core.copy_tiles_launch(
                segments=base, tiles=base + nseg, first_tile=starts[w], num_tiles=starts[w + 1] - starts[w]
            )
            if kl is not None:
                module.launch(kl, index, handle)
