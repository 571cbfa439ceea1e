"""Saved states on disk: :class:`~recoverssm_rs.transfer.HostStates` written as a safetensors
file -- an 8-byte little-endian header length, a JSON header, the tensors' bytes -- whose metadata
carries the source pool's fingerprint (its rank included), the blocks the requests were saved
from, a checksum per request and a digest of the whole record (design section 11).

The core writes and reads the file and decides every rule: the file is written to a temporary
that cannot be pre-placed (a random name, created exclusively with mode 0600, so a link planted
at any name is never followed), synced and renamed (a reader sees the old file or the new one,
never half of one), into a directory that exists and is not world-writable without the sticky
bit; a file that is truncated, extended, nested too deep, tampered with (bytes or metadata) or
saved from another layout is refused with a :class:`~recoverssm_rs.errors.LayoutError` and
nothing is restored; a path that cannot be written or read is a
:class:`~recoverssm_rs.errors.BindingError` naming it."""

from __future__ import annotations

import json
import os
import struct
from typing import TYPE_CHECKING, Any

import numpy as np

from .._core import (
    Layout,
    LayoutFingerprint,
    check_pool,
    check_saved_states,
    encode_saved_states,
    guarded_write,
    load_args,
    read_saved_file,
    saved_request_blocks,
    write_file,
)
from ..errors import BackendUnavailableError, LayoutError
from .offload import HostStates
from .pool import StatePool

if TYPE_CHECKING:
    from .._core import HostCacheIndex

__all__ = ["load_states", "save_states"]


def _host_bytes(t: Any, n: int) -> np.ndarray:
    """The bytes of blocks ``1..n`` of a host state tensor, as one flat uint8 array."""
    if hasattr(t, "data_ptr") and hasattr(t, "element_size"):
        import torch

        out: np.ndarray = t[1 : n + 1].contiguous().view(torch.uint8).reshape(-1).numpy()
        return out
    return np.ascontiguousarray(np.asarray(t)[1 : n + 1]).view(np.uint8).reshape(-1)


def save_states(states: HostStates, path: str | os.PathLike[str]) -> int:
    """Writes ``states`` to ``path`` atomically; returns the bytes written. The host copy's bound
    tensors are checked first (BindingError when one was freed); a directory that is missing,
    not writable, or world-writable without the sticky bit is a BindingError naming it."""
    return _save(states, path)


def _save(states: HostStates, path: Any, tier: HostCacheIndex | None = None, entry: int | None = None) -> int:
    pool = getattr(states, "pool", None)
    check_pool(pool, "states.pool")
    assert isinstance(pool, StatePool)
    n, blocks = saved_request_blocks(states)  # the core checks the counts and the source blocks

    def gather() -> np.ndarray:
        parts = [_host_bytes(t, n) for t in pool.tensors]
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.uint8)

    data: np.ndarray = guarded_write(gather, reads=[pool.guard])  # the core checks, then reads
    meta, tensors = encode_saved_states(pool.fingerprint, pool.num_layers, n, blocks, data, tier=tier, entry=entry)
    header: dict[str, Any] = {"__metadata__": dict(meta)}
    for name, dtype, shape, a, b in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [a, b]}
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)  # safetensors pads the header to 8 bytes with spaces
    return int(write_file(path, [struct.pack("<Q", len(hb)), hb, data]))


def _bad(path: Any, what: str) -> LayoutError:
    return LayoutError(f"saved states file {os.fspath(path)}: {what}")


def _read_header(path: Any, hb: bytes) -> tuple[Any, list[tuple[Any, Any, Any, Any, Any]]]:
    """The metadata and tensor entries ``(name, dtype, shape, begin, end)`` of a JSON header, as
    the file holds them: the core checks their types and values (``check_saved_states``)."""
    # The core checked the framing (and that the JSON nests no deeper than a header does).
    try:
        header = json.loads(hb)
        meta = header.pop("__metadata__")
        tensors = []
        for name, v in header.items():
            a, b = v["data_offsets"]
            tensors.append((name, v["dtype"], v["shape"], a, b))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise _bad(path, f"malformed header ({type(exc).__name__}: {exc})") from None
    return meta, tensors


def _empty(shape: tuple[int, ...], dtype: str, pin_memory: bool) -> Any:
    if not pin_memory:
        try:
            return np.empty(shape, dtype=np.dtype(dtype))
        except TypeError:  # bfloat16, float8: torch only
            pass
    import torch

    return torch.empty(shape, dtype=getattr(torch, dtype), pin_memory=pin_memory)


def load_states(path: str | os.PathLike[str], layout: Layout, *, pin_memory: bool = False) -> HostStates:
    """Reads the states ``path`` holds into a new host buffer. ``layout``: the layout of the pool
    they were saved from (a file saved from another layout is refused; its TP rank comes from the
    file). Restore the result with :meth:`HostOffload.restore`, into the same rank or -- with the
    transfer plans -- another. ``pin_memory``: allocate the host buffer pinned (needs torch and a
    device to pin it for: BackendUnavailableError otherwise); a value that is not a bool is a
    PlanError naming it. Both are checked before the file is read."""
    pin_memory = load_args(pin_memory)
    if pin_memory:
        _check_pinnable()
    return _load(path, layout, pin_memory=pin_memory)


def _check_pinnable() -> None:
    """Raises BackendUnavailableError unless torch can pin host memory here (it needs a device
    to pin it for): asked once, before the file is read."""
    try:
        import torch

        torch.empty(1, dtype=torch.uint8, pin_memory=True)
    except (ImportError, RuntimeError) as exc:
        raise BackendUnavailableError(
            f"load_states: pin_memory=True needs torch and a device to pin host memory for "
            f"({type(exc).__name__}: {exc}); pass pin_memory=False"
        ) from None


def _load(
    path: Any,
    layout: Layout,
    *,
    pin_memory: bool = False,
    tier: HostCacheIndex | None = None,
    entry: int | None = None,
    key: str = "",
) -> HostStates:
    hb, raw = read_saved_file(path)
    meta, tensors = _read_header(path, hb)
    data = np.frombuffer(raw, dtype=np.uint8)
    fp, num_layers, n, blocks, ranges = check_saved_states(
        meta, tensors, data, tier=tier, entry=entry, key=key, path=path
    )
    want = LayoutFingerprint(layout, tp_rank=fp.tp_rank, block_size=fp.block_size)
    if want != fp:
        raise _bad(path, f"saved from a pool of another layout ({fp!r}), not {want!r}")
    layers: list[list[Any]] = []
    specs = list(layout.persistent)
    for layer in range(num_layers):
        row = []
        for i, spec in enumerate(specs):
            a, b = ranges[layer * len(specs) + i]
            t = _empty((n + 1, *spec.shape), spec.dtype, pin_memory)
            if isinstance(t, np.ndarray):
                t[1:].view(np.uint8).reshape(-1)[...] = data[a:b]
            else:
                import torch

                t[1:].view(torch.uint8).reshape(-1).copy_(torch.from_numpy(data[a:b].copy()))
            row.append(t)
        layers.append(row)
    pool = StatePool(layout, layers, tp_rank=fp.tp_rank, block_size=fp.block_size)
    return HostStates(pool, n, source_blocks=list(blocks))
