"""Asynchronous offload and restore: copies enqueued on a side stream of the pool's device,
ordered by events (the side stream waits for what the caller's stream had enqueued; the caller's
stream waits for the copies only when it needs their result), never a device-wide sync.

:class:`TorchStreams` is the backend for CUDA pools (``torch.cuda`` streams and events); CPU and
numpy pools have none and their copies complete before the call returns."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from .offload import HostStates

__all__ = ["StreamBackend", "TorchStreams", "TransferHandle"]


class StreamBackend(Protocol):
    """What the asynchronous path needs of a device's streams and events."""

    def current(self) -> Any:
        """The caller's current stream."""

    def new_stream(self) -> Any:
        """A new side stream."""

    def event(self) -> Any:
        """A new event (``record(stream)``, ``query()``, ``synchronize()``)."""

    def use(self, stream: Any) -> Any:
        """A context manager making ``stream`` current."""


class TorchStreams:
    """``torch.cuda`` streams and events of one CUDA device."""

    def __init__(self, device: str) -> None:
        import torch

        self._torch: Any = torch
        self.device = torch.device(device)

    def current(self) -> Any:
        return self._torch.cuda.current_stream(self.device)

    def new_stream(self) -> Any:
        return self._torch.cuda.Stream(self.device)

    def event(self) -> Any:
        return self._torch.cuda.Event()

    def use(self, stream: Any) -> Any:
        return self._torch.cuda.stream(stream)

    def __repr__(self) -> str:
        return f"TorchStreams({self.device})"


class TransferHandle:
    """An offload or a restore enqueued on the side stream: ``states`` and ``blocks`` it moves,
    complete once its event has fired (at once when the pool has no streams).

    :meth:`wait` orders a stream (the caller's current stream by default) after the copies,
    without blocking the host; :meth:`synchronize` blocks the host until they are done (before
    reading an offloaded copy on the host)."""

    def __init__(
        self,
        kind: str,
        states: HostStates | list[HostStates],
        blocks: list[int],
        event: Any,
        streams: Any,
        *,
        entry: int | None = None,
        owner: Any = None,
    ) -> None:
        self.kind = kind
        self.states = states
        self.blocks = blocks
        #: The host tier entry this handle restores (set by :meth:`HostCache.prefetch`).
        self.entry = entry
        #: The :class:`~recoverssm_rs.transfer.HostOffload` that enqueued the copies (a restore
        #: handle finishes a restore into that offload's pool only).
        self.owner = owner
        self._event = event
        self._streams = streams

    def done(self) -> bool:
        """True when the copies have completed (never blocks)."""
        return self._event is None or bool(self._event.query())

    def wait(self, stream: Any = None) -> None:
        """Makes ``stream`` (default: the current stream) wait for the copies on the device."""
        if self._event is None:
            return
        (stream if stream is not None else self._streams.current()).wait_event(self._event)

    def synchronize(self) -> None:
        """Blocks the host until the copies are done (this transfer only)."""
        if self._event is not None:
            self._event.synchronize()

    def __repr__(self) -> str:
        return f"TransferHandle({self.kind}, requests={len(self.blocks)}, done={self.done()})"


class SideStream:
    """The side stream of one pool, created on first use; :meth:`run` enqueues copies on it."""

    def __init__(self, streams: StreamBackend | None) -> None:
        self.streams = streams
        self._side: Any = None

    @contextmanager
    def _on_side(self) -> Iterator[None]:
        s = self.streams
        assert s is not None
        if self._side is None:
            self._side = s.new_stream()
        ready = s.event()
        ready.record(s.current())  # what the caller's stream had enqueued comes first
        self._side.wait_event(ready)
        with s.use(self._side):
            yield

    def run(self, copies: Callable[[], None]) -> Any:
        """Runs ``copies`` on the side stream; the event recorded after them, or None when the
        pool has no streams (the copies ran to completion)."""
        if self.streams is None:
            copies()
            return None
        with self._on_side():
            copies()
        done = self.streams.event()
        done.record(self._side)
        return done

    def __repr__(self) -> str:
        return f"SideStream({self.streams!r})"
