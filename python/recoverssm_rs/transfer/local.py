"""Running transfer plans inside one process: the packed plan rows as numpy arrays, the staged
local copies, and an executor that moves states between pools it holds directly (tests, host
offload, and engines that bring their own transport)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .._core import LayoutFingerprint, TransferPlan, plan_transfer
from ..errors import BindingError
from .pool import StatePool

__all__ = ["READ_FIELDS", "STAGED_FIELDS", "STAGING", "read_rows", "staged_rows", "run_staged",
           "LocalTransfer"]

#: Columns of :func:`read_rows`.
READ_FIELDS = ("request", "src_rank", "src_tensor", "src_offset", "dst_tensor", "dst_offset", "len")
#: Columns of :func:`staged_rows`.
STAGED_FIELDS = ("request", "src_offset", "src_row_stride", "src_col_stride", "dst_tensor",
                 "dst_offset", "dst_row_stride", "dst_col_stride", "rows", "cols", "elem")
#: ``dst_tensor`` of a read that lands in the staging buffer.
STAGING = np.iinfo(np.uint64).max


def read_rows(plan: TransferPlan) -> np.ndarray:
    """The plan's reads as a ``[num_reads, 7]`` uint64 array (columns :data:`READ_FIELDS`)."""
    return np.frombuffer(plan.reads(), dtype="<u8").reshape(-1, len(READ_FIELDS))


def staged_rows(plan: TransferPlan) -> np.ndarray:
    """The plan's staged copies as a ``[num_staged, 11]`` uint64 array (:data:`STAGED_FIELDS`)."""
    return np.frombuffer(plan.staged(), dtype="<u8").reshape(-1, len(STAGED_FIELDS))


def _strided(view: Any, offset: int, shape: tuple[int, ...], strides: tuple[int, ...]) -> Any:
    if isinstance(view, np.ndarray):
        return np.lib.stride_tricks.as_strided(view[offset:], shape=shape, strides=strides)
    return view[offset:].as_strided(shape, strides)


_ELEM = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _matrix(buf: np.ndarray, offset: int, rows: int, cols: int, rs: int, cs: int, elem: int) -> np.ndarray:
    """A ``rows x cols`` view of ``elem``-byte items of a flat uint8 numpy buffer (whole items
    copy far faster than their bytes)."""
    dt = _ELEM.get(elem)
    if dt is None or (buf.ctypes.data + offset) % elem or rs % elem or cs % elem:
        return np.lib.stride_tricks.as_strided(buf[offset:], shape=(rows, cols, elem), strides=(rs, cs, 1))
    return np.ndarray(shape=(rows, cols), dtype=dt, buffer=buf, offset=offset, strides=(rs, cs))


def run_staged(rows: np.ndarray, staging: Any, views: list[Any], requests: Any = None) -> None:
    """Finishes staged states: copies each staged row's matrix from ``staging`` (a flat uint8
    buffer) into the destination tensor's byte view. ``requests`` limits it to those requests."""
    for r in rows:
        if requests is not None and int(r[0]) not in requests:
            continue
        _, so, srs, scs, dt, do, drs, dcs, n_rows, n_cols, elem = (int(x) for x in r)
        if isinstance(staging, np.ndarray) and isinstance(views[dt], np.ndarray):
            src = _matrix(staging, so, n_rows, n_cols, srs, scs, elem)
            dst = _matrix(views[dt], do, n_rows, n_cols, drs, dcs, elem)
            if src.ndim != dst.ndim:  # one side unaligned: copy bytes on both
                src = _strided(staging, so, (n_rows, n_cols, elem), (srs, scs, 1))
                dst = _strided(views[dt], do, (n_rows, n_cols, elem), (drs, dcs, 1))
            dst[...] = src
            continue
        src = _strided(staging, so, (n_rows, n_cols, elem), (srs, scs, 1))
        dst = _strided(views[dt], do, (n_rows, n_cols, elem), (drs, dcs, 1))
        dst[...] = src


def _copy(dst: Any, src: Any) -> None:
    if isinstance(dst, np.ndarray) and not isinstance(src, np.ndarray):
        dst[...] = src.cpu().numpy()
    elif not isinstance(dst, np.ndarray) and isinstance(src, np.ndarray):
        import torch

        dst.copy_(torch.from_numpy(src), non_blocking=False)
    elif isinstance(dst, np.ndarray):
        dst[...] = src
    else:
        dst.copy_(src, non_blocking=True)


class LocalTransfer:
    """Moves persistent states between pools held in this process: from ``sources`` (the
    source instance's ranks, by rank) to ``destination``, with the core's plans.

    Every check (compatibility, geometries, block ids, duplicate destinations) runs in the core
    before the first byte moves; a rejected batch writes nothing.
    """

    def __init__(self, sources: Mapping[int, StatePool] | list[StatePool], destination: StatePool) -> None:
        self.sources = dict(sources) if isinstance(sources, Mapping) else {p.fingerprint.tp_rank: p for p in sources}
        if not self.sources:
            raise BindingError("LocalTransfer: no source pool given; pass the source instance's pools by rank")
        self.destination = destination
        self.source_fingerprint: LayoutFingerprint = next(iter(self.sources.values())).fingerprint

    def plan(self, requests: list[tuple[int, int]]) -> TransferPlan:
        """The plan moving ``requests`` (source block, destination block)."""
        src = self.source_fingerprint
        geoms = [self.sources[r].geometry if r in self.sources else next(iter(self.sources.values())).geometry
                 for r in range(src.tp_size)]
        return plan_transfer(src, geoms, self.destination.fingerprint, self.destination.geometry, requests)

    def run(self, requests: list[tuple[int, int]]) -> TransferPlan:
        """Plans and moves ``requests``; returns the plan that ran."""
        plan = self.plan(requests)
        missing = [r for r in plan.source_ranks if r not in self.sources]
        if missing:
            raise BindingError(f"LocalTransfer: the plan reads source ranks {missing}, which were not given")
        self.execute(plan)
        return plan

    def execute(self, plan: TransferPlan) -> None:
        """Runs ``plan``'s reads, then its staged copies."""
        reads = read_rows(plan)
        dviews = self.destination.views
        staging: Any = None
        if plan.staging_bytes:
            staging = _empty_like_view(dviews[0], plan.staging_bytes)
        for _, rank, st, so, dt, do, n in reads.tolist():
            src = self.sources[rank].views[st][so:so + n]
            dst = staging[do:do + n] if dt == STAGING else dviews[dt][do:do + n]
            _copy(dst, src)
        if plan.num_staged:
            run_staged(staged_rows(plan), staging, dviews)

    def __repr__(self) -> str:
        return f"LocalTransfer(sources={sorted(self.sources)}, destination={self.destination!r})"


def _empty_like_view(view: Any, nbytes: int) -> Any:
    if isinstance(view, np.ndarray):
        return np.empty(nbytes, dtype=np.uint8)
    import torch

    return torch.empty(nbytes, dtype=torch.uint8, device=view.device)
