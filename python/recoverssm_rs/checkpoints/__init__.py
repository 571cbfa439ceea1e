"""Where recurrent checkpoints are kept: placement and eviction policies, traces and their replay.

A recurrent layer's state exists only where a checkpoint was saved, so a prefix-cache hit for a
hybrid model needs a checkpoint at exactly the hit's position. :class:`CheckpointCache` (compiled
core) decides per request which checkpoint to start from, which positions to save, and which
checkpoints to evict under a budget, under one of four policies (:data:`POLICIES`):

- ``vllm``: vLLM 0.33's align mode (states at block boundaries: replay boundary and shared-prefix
  junction; least-recently-freed eviction);
- ``sglang-lru``: SGLang 0.5.23's mamba radix cache (a state at each request's end; LRU);
- ``marconi``: Marconi (MLSys 2025; exact branch points and request ends; recency + FLOP
  efficiency);
- ``recoverssm``: chunk-granular junctions and replay boundaries plus request ends, evicted by
  value (greedy-dual over tokens saved).

A trace is a JSON-lines file, one request per line in arrival order: ``{"id": str, "arrival":
float, "prompt": [token ids], "output": [token ids]}`` (:func:`read_trace`, :func:`write_trace`);
:func:`simulate` replays one through a policy; :mod:`.workloads` generates traces.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._core import CheckpointCache, CheckpointPlan, check_checkpoint_trace, simulate_checkpoints
from ..errors import PlanError

__all__ = [
    "POLICIES",
    "CheckpointCache",
    "CheckpointPlan",
    "TraceRequest",
    "read_trace",
    "write_trace",
    "simulate",
]

log = logging.getLogger("recoverssm_rs")

POLICIES: tuple[str, ...] = ("vllm", "sglang-lru", "marconi", "recoverssm")
"""The policies' names, as ``--policy`` and :class:`CheckpointCache` take them."""


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace: ``prompt`` and ``output`` are token ids; a later turn of a
    conversation is a request whose prompt starts with an earlier request's prompt + output."""

    id: str
    arrival: float
    prompt: Sequence[int]
    output: Sequence[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The trace line's object."""
        return {"id": self.id, "arrival": self.arrival, "prompt": list(self.prompt), "output": list(self.output)}

    def __repr__(self) -> str:
        return (
            f"TraceRequest(id={self.id!r}, arrival={self.arrival}, prompt=<{len(self.prompt)} tokens>, "
            f"output=<{len(self.output)} tokens>)"
        )


Row = tuple[int, Any, Any, Any, Any]
"""What the core reads per request: (line, id, arrival, prompt, output)."""


def _rows_of_file(path: str | os.PathLike[str]) -> list[Row]:
    rows: list[Row] = []
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise PlanError(
                    f"trace line {number}: not valid UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})"
                ) from None
            if not text.strip():
                continue
            try:
                rec = json.loads(text)
            except json.JSONDecodeError as e:
                raise PlanError(f"trace line {number}: not valid JSON ({e.msg} at column {e.colno})") from None
            except RecursionError:
                raise PlanError(f"trace line {number}: not valid JSON (nested too deeply)") from None
            if not isinstance(rec, dict):
                raise PlanError(f"trace line {number}: must be a JSON object, got {type(rec).__name__}")
            rows.append((number, rec.get("id"), rec.get("arrival"), rec.get("prompt"), rec.get("output")))
    return rows


def _rows(requests: Iterable[TraceRequest]) -> list[Row]:
    return [(i + 1, r.id, r.arrival, r.prompt, r.output) for i, r in enumerate(requests)]


def read_trace(path: str | os.PathLike[str]) -> list[TraceRequest]:
    """The requests of a JSON-lines trace, checked by the core (a bad line raises
    :class:`~recoverssm_rs.errors.PlanError` naming the line and the field)."""
    rows = _rows_of_file(path)
    check_checkpoint_trace(rows, source=os.fspath(path))
    return [TraceRequest(str(r[1]), float(r[2]), list(r[3]), list(r[4])) for r in rows]


def write_trace(path: str | os.PathLike[str], requests: Iterable[TraceRequest]) -> int:
    """Writes ``requests`` as a JSON-lines trace; returns how many."""
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for r in requests:
            f.write(json.dumps(r.to_json(), separators=(",", ":")) + "\n")
            n += 1
    return n


def simulate(
    trace: str | os.PathLike[str] | Iterable[TraceRequest],
    policy: str,
    *,
    block_size: int = 1056,
    granularity: int = 64,
    budget_checkpoints: int | None = None,
    budget_bytes: int | None = None,
    state_bytes: int | None = None,
) -> dict[str, Any]:
    """Replays ``trace`` (a JSON-lines path, or requests) through ``policy``, one request at a time
    in arrival order. Returns the totals (``policy``, ``requests``, ``prompt_tokens``,
    ``reused_tokens``, ``hit_requests``, ``checkpoint_writes``, ``evictions``,
    ``peak_checkpoints``, ``upper_bound_tokens``, and ``peak_bytes`` when ``state_bytes`` is given)
    and per-request lists (``reused``, ``bound``, ``writes``). The budget is a count of checkpoints,
    or ``budget_bytes`` with ``state_bytes``; none: unlimited."""
    rows = _rows_of_file(trace) if isinstance(trace, (str, os.PathLike)) else _rows(trace)
    out = simulate_checkpoints(
        rows,
        policy,
        source=os.fspath(trace) if isinstance(trace, (str, os.PathLike)) else None,
        block_size=block_size,
        granularity=granularity,
        budget=budget_checkpoints,
        budget_bytes=budget_bytes,
        state_bytes=state_bytes,
    )
    if state_bytes is not None:
        out["state_bytes"] = state_bytes
        out["peak_bytes"] = out["peak_checkpoints"] * state_bytes
    log.debug("simulated %s: %d requests, %d tokens reused", policy, out["requests"], out["reused_tokens"])
    return out
