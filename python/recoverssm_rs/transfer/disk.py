"""Saved states on disk: :class:`~recoverssm_rs.transfer.HostStates` written as a safetensors
file -- an 8-byte little-endian header length, a JSON header, the tensors' bytes -- whose metadata
carries the source pool's fingerprint (its rank included), the blocks the requests were saved
from and a checksum per request (design section 11). Files are written to a temporary name,
synced and renamed (a reader sees the old file or the new one, never half of one); a file that is
truncated, extended, tampered with or saved from another layout is refused with a
:class:`~recoverssm_rs.errors.LayoutError` and nothing is restored. The format's rules and the
checksums live in the core (``saved_states_header``, ``check_saved_states``)."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np

from .._core import (
    Layout,
    LayoutFingerprint,
    check_saved_states,
    saved_states_checksums,
    saved_states_header,
)
from ..errors import LayoutError
from .offload import HostStates
from .pool import StatePool

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
    tensors are checked first (BindingError when one was freed)."""
    pool, n = states.pool, states.num_requests
    pool.check()
    fp, layers = pool.fingerprint, pool.num_layers
    blocks = list(states.source_blocks) if states.source_blocks is not None else list(range(1, n + 1))
    _, tensors = saved_states_header(fp, layers, n, blocks, [0] * n)
    data = np.empty(tensors[-1][4] if tensors else 0, dtype=np.uint8)
    for (_, _, _, a, b), t in zip(tensors, pool.tensors):
        data[a:b] = _host_bytes(t, n)
    meta, tensors = saved_states_header(fp, layers, n, blocks, saved_states_checksums(fp, layers, n, data))
    header: dict[str, Any] = {"__metadata__": dict(meta)}
    for name, dtype, shape, a, b in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [a, b]}
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)  # safetensors pads the header to 8 bytes with spaces
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(hb)))
            f.write(hb)
            f.write(data.data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()
    fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return 8 + len(hb) + int(data.size)


def _bad(path: Any, what: str) -> LayoutError:
    return LayoutError(f"saved states file {os.fspath(path)}: {what}")


def _read_header(path: Any, raw: bytes) -> tuple[dict[str, str], list[tuple[str, str, list[int], int, int]], int]:
    if len(raw) < 8:
        raise _bad(path, f"{len(raw)} bytes: too short for a header (truncated)")
    (n,) = struct.unpack("<Q", raw[:8])
    if n > len(raw) - 8:
        raise _bad(path, f"the header length {n} runs past the file's {len(raw)} bytes (truncated)")
    try:
        header = json.loads(raw[8 : 8 + n])
        meta = header.pop("__metadata__")
        if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
            raise TypeError("__metadata__ is not a map of strings")
        tensors = []
        for name, v in header.items():
            a, b = v["data_offsets"]
            shape = v["shape"]
            if not (isinstance(shape, list) and all(type(x) is int for x in shape)) or not type(a) is type(b) is int:
                raise TypeError(f"tensor {name!r}: shape and data_offsets must be integers")
            if not isinstance(v["dtype"], str):
                raise TypeError(f"tensor {name!r}: dtype must be a string")
            tensors.append((name, v["dtype"], shape, a, b))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise _bad(path, f"malformed header ({type(exc).__name__}: {exc})") from None
    tensors.sort(key=lambda t: (t[3], t[4]))
    return meta, tensors, 8 + n


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
    transfer plans -- another. ``pin_memory``: allocate the host buffer pinned (needs torch)."""
    raw = Path(path).read_bytes()
    meta, tensors, start = _read_header(path, raw)
    data = np.frombuffer(raw, dtype=np.uint8, offset=start)
    fp, num_layers, n, blocks = check_saved_states(meta, tensors, data)
    want = LayoutFingerprint(layout, tp_rank=fp.tp_rank, block_size=fp.block_size)
    if want != fp:
        raise _bad(path, f"saved from a pool of another layout ({fp!r}), not {want!r}")
    layers: list[list[Any]] = []
    specs = list(layout.persistent)
    for layer in range(num_layers):
        row = []
        for i, spec in enumerate(specs):
            _, _, shape, a, b = tensors[layer * len(specs) + i]
            t = _empty((n + 1, *shape[1:]), spec.dtype, pin_memory)
            if isinstance(t, np.ndarray):
                t[1:].view(np.uint8).reshape(-1)[...] = data[a:b]
            else:
                import torch

                t[1:].view(torch.uint8).reshape(-1).copy_(torch.from_numpy(data[a:b].copy()))
            row.append(t)
        layers.append(row)
    pool = StatePool(layout, layers, tp_rank=fp.tp_rank, block_size=fp.block_size)
    return HostStates(pool, n, source_blocks=list(blocks))
