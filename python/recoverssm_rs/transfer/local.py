"""Running transfer plans inside one process: the packed plan rows as numpy arrays, the staged
local copies, and an executor that moves states between pools it holds directly (tests, host
offload, and engines that bring their own transport)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .._core import LayoutFingerprint, TransferPlan, check_pool, guarded_transfer, plan_transfer, source_pools
from ..plan_format import CONSTANTS, record_columns
from .pool import StatePool

__all__ = ["READ_FIELDS", "STAGED_FIELDS", "STAGING", "read_rows", "staged_rows", "run_staged", "LocalTransfer"]

#: Columns of :func:`read_rows`: the fields of the core's ``Read`` record, in order.
READ_FIELDS, _READ_TYPE = record_columns("Read")
#: Columns of :func:`staged_rows`: the fields of the core's ``StagedCopy`` record, in order.
STAGED_FIELDS, _STAGED_TYPE = record_columns("StagedCopy")
#: ``dst_tensor`` of a read that lands in the staging buffer (the core's ``STAGING``).
STAGING: int = CONSTANTS["STAGING"]


def read_rows(plan: TransferPlan) -> np.ndarray:
    """The plan's reads as a ``[num_reads, 7]`` uint64 array (columns :data:`READ_FIELDS`)."""
    return np.frombuffer(plan.reads(), dtype=_READ_TYPE).reshape(-1, len(READ_FIELDS))


def staged_rows(plan: TransferPlan) -> np.ndarray:
    """The plan's staged copies as a ``[num_staged, 11]`` uint64 array (:data:`STAGED_FIELDS`)."""
    return np.frombuffer(plan.staged(), dtype=_STAGED_TYPE).reshape(-1, len(STAGED_FIELDS))


def _strided(view: Any, offset: int, shape: tuple[int, ...], strides: tuple[int, ...]) -> Any:
    if isinstance(view, np.ndarray):
        return np.lib.stride_tricks.as_strided(view[offset:], shape=shape, strides=strides)
    return view[offset:].as_strided(shape, strides)


_ELEM = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def run_staged(rows: np.ndarray, staging: Any, views: Sequence[Any], requests: Any = None) -> None:
    """Finishes staged states: copies each staged row's matrix from ``staging`` (a flat uint8
    buffer) into the destination tensor's byte view. ``requests`` limits it to those requests.

    With numpy buffers the rows that share a destination tensor and a matrix shape (every request's
    copy of one layer's state) run as one numpy copy over all their requests."""
    if requests is not None:
        rows = rows[np.isin(rows[:, 0], np.fromiter(requests, dtype=np.uint64))]
    if rows.size == 0:
        return
    targets = np.unique(rows[:, 4]).tolist()
    if isinstance(staging, np.ndarray) and all(isinstance(views[t], np.ndarray) for t in targets):
        _run_staged_numpy(rows, staging, views)
        return
    for r in rows:
        _, so, srs, scs, dt, do, drs, dcs, n_rows, n_cols, elem = (int(x) for x in r)
        src = _strided(staging, so, (n_rows, n_cols, elem), (srs, scs, 1))
        dst = _strided(views[dt], do, (n_rows, n_cols, elem), (drs, dcs, 1))
        dst[...] = src


#: Columns of a staged row that one vectorised copy shares: the destination tensor, both sides'
#: strides, the matrix shape and the item size.
_GROUP = [2, 3, 4, 6, 7, 8, 9, 10]


def _run_staged_numpy(rows: np.ndarray, staging: np.ndarray, views: Sequence[np.ndarray]) -> None:
    keys, inverse = np.unique(rows[:, _GROUP], axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    for g, key in enumerate(keys.tolist()):
        srs, scs, dt, drs, dcs, n_rows, n_cols, elem = key
        sel = rows[inverse == g]
        so, do = sel[:, 1], sel[:, 5]
        dst_buf = views[dt]
        # The inner axis: one contiguous on both sides, else the longer one (long inner runs).
        if n_cols > 1 and scs == dcs == elem:
            rows_inner = False
        elif n_rows > 1 and srs == drs == elem:
            rows_inner = True
        else:
            rows_inner = n_rows >= n_cols
        shape, s_str, d_str = (
            ((n_cols, n_rows), (scs, srs), (dcs, drs)) if rows_inner else ((n_rows, n_cols), (srs, scs), (drs, dcs))
        )
        dtype = _ELEM.get(elem)
        aligned = dtype is not None and not any(
            (int(b.ctypes.data) | int(np.bitwise_or.reduce(o)) | x | y) % elem
            for b, o, (x, y) in ((staging, so, s_str), (dst_buf, do, d_str))
        )
        if aligned:
            item: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())
        else:
            dtype, item = np.uint8, ((elem,), (1,))
        src, s_idx = _batched(staging, so, shape + item[0], s_str + item[1], dtype)
        dst, d_idx = _batched(dst_buf, do, shape + item[0], d_str + item[1], dtype)
        dst[d_idx] = src[s_idx]


def _batched(
    buf: np.ndarray, offsets: np.ndarray, shape: tuple[int, ...], strides: tuple[int, ...], dtype: Any
) -> tuple[np.ndarray, Any]:
    """A view of ``buf`` holding one ``shape`` / ``strides`` matrix per offset on its first axis,
    and the index selecting them: a slice when the offsets are evenly spaced, else an index array
    (offsets as multiples of their greatest common divisor). numpy checks that every matrix lies
    inside ``buf``."""
    first = int(offsets[0])
    steps = np.diff(offsets.astype(np.int64))
    if offsets.size == 1 or (steps[0] > 0 and (steps == steps[0]).all()):
        step = int(steps[0]) if offsets.size > 1 else 0
        view = np.ndarray((offsets.size, *shape), dtype=dtype, buffer=buf, offset=first, strides=(step, *strides))
        return view, slice(None)
    g = int(np.gcd.reduce(offsets)) or 1
    idx = (offsets // np.uint64(g)).astype(np.intp)
    view = np.ndarray((int(idx.max()) + 1, *shape), dtype=dtype, buffer=buf, offset=0, strides=(g, *strides))
    return view, idx


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

    Every check runs before the first byte moves, and a rejected batch writes nothing: each source
    pool must hold the rank it is given as, no rank may be given twice, and all must be ranks of
    one instance (the core's ``source_pools``: swapped shards, two pools for one rank, an SD pool
    with a DS pool or mixed TP sizes are refused here, as :class:`~recoverssm_rs.transfer.nixl.NixlEndpoint` refuses them at ``connect``);
    compatibility, geometries, block ids and duplicate destinations are checked by the core's
    planner; every pool's bound tensors are checked (:meth:`StatePool.check`) before each run; and
    when the source and destination share memory (one pool, or two over the same tensors) no
    request may write a block another request reads (PlanError: the result would depend on the
    order of the copies).
    """

    def __init__(self, sources: Mapping[int, StatePool] | Sequence[StatePool], destination: StatePool) -> None:
        # The core checks both arguments (BindingError naming them): every source a StatePool of
        # the rank it is given as, no rank twice (two pools listed for one rank), one instance.
        fingerprint, pairs = source_pools(sources)
        check_pool(destination, "destination")
        self.source_fingerprint: LayoutFingerprint = fingerprint
        self._sources: dict[int, StatePool] = dict(pairs)
        self._destination = destination

    @property
    def destination(self) -> StatePool:
        """The destination pool (read-only: checked once, at construction)."""
        return self._destination

    @property
    def sources(self) -> Mapping[int, StatePool]:
        """The source pools by rank (read-only: checked once, at construction)."""
        return dict(self._sources)

    def plan(self, requests: list[tuple[int, int]]) -> TransferPlan:
        """The plan moving ``requests`` (source block, destination block)."""
        src = self.source_fingerprint
        first = next(iter(self._sources.values())).geometry
        geoms = [self._sources[r].geometry if r in self._sources else first for r in range(src.tp_size)]
        return plan_transfer(src, geoms, self.destination.fingerprint, self.destination.geometry, requests)

    def run(self, requests: list[tuple[int, int]]) -> TransferPlan:
        """Plans and moves ``requests``; returns the plan that ran."""
        plan = self.plan(requests)
        self.execute(plan)
        return plan

    def execute(self, plan: TransferPlan) -> None:
        """Runs ``plan``'s reads, then its staged copies, as one guarded core call: the core
        checks that every source rank the plan reads was given and that the pools' bound tensors
        still own their memory (BindingError, nothing written, otherwise), runs the copies, and
        records the destination's write."""
        guards = {r: p.guard for r, p in self._sources.items()}
        tp_size = self.source_fingerprint.tp_size
        guarded_transfer(plan, guards, tp_size, self.destination.guard, lambda: self._copy(plan))

    def _copy(self, plan: TransferPlan) -> None:
        reads = read_rows(plan)
        dviews = self.destination.views
        staging: Any = None
        if plan.staging_bytes:
            staging = _empty_like_view(dviews[0], plan.staging_bytes)
        for _, rank, st, so, dt, do, n in reads.tolist():
            src = self._sources[rank].views[st][so : so + n]
            dst = staging[do : do + n] if dt == STAGING else dviews[dt][do : do + n]
            _copy(dst, src)
        if plan.num_staged:
            run_staged(staged_rows(plan), staging, dviews)

    def __repr__(self) -> str:
        return f"LocalTransfer(sources={sorted(self._sources)}, destination={self.destination!r})"


def _empty_like_view(view: Any, nbytes: int) -> Any:
    if isinstance(view, np.ndarray):
        return np.empty(nbytes, dtype=np.uint8)
    import torch

    return torch.empty(nbytes, dtype=torch.uint8, device=view.device)
