"""The asynchronous offload API: prefetch handles complete at once on host pools, and on a device
pool the copies run on a side stream ordered by events (checked with recording stand-ins for
torch.cuda streams and events, since the CPU copies themselves are synchronous)."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
from recoverssm_rs.errors import PlanError
from recoverssm_rs.transfer import HostCache, HostOffload, StatePool
from support.transfer_ref import FAMILIES, layout, paged_states


def _pool(seed=0, torch_tensors=False):
    lay = layout(FAMILIES["gdn"], 2, 1, "DS")
    _, states = paged_states(lay, 2, 10, np.random.default_rng(seed))
    if torch_tensors:
        states = [[torch.from_numpy(np.ascontiguousarray(t)) for t in layer] for layer in states]
    return states, StatePool(lay, states, tp_rank=0)


def _rows(states, blocks):
    return [[np.asarray(t).view(np.uint8)[blocks].copy() for t in layer] for layer in states]


class Log:
    """Records stream and event calls in order."""

    def __init__(self):
        self.calls: list[tuple] = []
        self.active = "main"


class Stream:
    def __init__(self, log, name):
        self.log, self.name = log, name

    def wait_event(self, ev):
        self.log.calls.append(("wait", self.name, ev.n))


class Event:
    count = 0

    def __init__(self, log):
        Event.count += 1
        self.log, self.n, self.recorded = log, Event.count, None

    def record(self, stream):
        self.recorded = stream.name
        self.log.calls.append(("record", stream.name, self.n))

    def query(self):
        return self.recorded is not None

    def synchronize(self):
        self.log.calls.append(("sync", self.n))


class Streams:
    def __init__(self):
        self.log = Log()
        self.main = Stream(self.log, "main")

    def current(self):
        return Stream(self.log, self.log.active)

    def new_stream(self):
        self.log.calls.append(("new_stream",))
        return Stream(self.log, "side")

    def event(self):
        return Event(self.log)

    @contextlib.contextmanager
    def use(self, stream):
        prev, self.log.active = self.log.active, stream.name
        self.log.calls.append(("enter", stream.name))
        try:
            yield
        finally:
            self.log.active = prev
            self.log.calls.append(("exit", stream.name))


@pytest.mark.parametrize("torch_tensors", [False, True])
def test_host_pool_handles_are_complete_at_once_and_byte_exact(tmp_path, torch_tensors):
    states, p = _pool(torch_tensors=torch_tensors)
    off = HostOffload(p)
    want = _rows(states, [1, 2])
    h = off.offload_async([1, 2])
    assert h.done() and "done=True" in repr(h)
    h.wait()
    h.synchronize()
    r = off.prefetch(h.states, [5, 6])
    assert r.done()
    assert all((a == b).all() for x, y in zip(_rows(states, [5, 6]), want) for a, b in zip(x, y))
    off.restore(h.states, [5, 6], handle=r)  # only waits: nothing copied again
    with pytest.raises(PlanError, match="was not prefetched for these states and blocks"):
        off.restore(h.states, [7, 8], handle=r)
    cache = HostCache(p, 10**9, disk_dir=tmp_path)
    cache.put("a", [3])
    want = _rows(states, [3])
    assert cache.prefetch("missing", [9]) is None and cache.misses == 1
    hh = cache.prefetch("a", [9])
    assert hh is not None and hh.done() and cache.hits == 1
    assert cache.restore("a", [9], handle=hh)
    assert all((a == b).all() for x, y in zip(_rows(states, [9]), want) for a, b in zip(x, y))


def test_device_path_orders_the_side_stream_by_events():
    states, p = _pool()
    fake = Streams()
    off = HostOffload(p, streams=fake)
    want = _rows(states, [1, 2])
    h = off.offload_async([1, 2])
    calls = fake.log.calls
    # The side stream is created once, waits on an event recorded on the caller's stream, runs the
    # copies inside its context, and records the handle's event on itself; no synchronize.
    assert calls[0] == ("new_stream",)
    (_, s0, ready), (_, s1, waited) = calls[1], calls[2]
    assert (s0, s1, ready == waited) == ("main", "side", True)
    assert calls[3:5] == [("enter", "side"), ("exit", "side")]
    assert calls[5][:2] == ("record", "side") and not any(c[0] == "sync" for c in calls)
    assert h.done() and h._event.recorded == "side"
    n = len(calls)
    r = off.prefetch(h.states, [7, 8])
    assert ("new_stream",) not in calls[n:]  # one side stream per pool
    off.restore(h.states, [7, 8], handle=r)  # the caller's stream waits on the copies' event
    assert calls[-1] == ("wait", "main", r._event.n)
    h.synchronize()
    assert calls[-1] == ("sync", h._event.n)
    assert all((a == b).all() for x, y in zip(_rows(states, [7, 8]), want) for a, b in zip(x, y))


def test_checks_run_before_anything_is_enqueued():
    states, p = _pool()
    fake = Streams()
    off = HostOffload(p, streams=fake)
    h = off.offload_async([1])
    n = len(fake.log.calls)
    before = _rows(states, [4])
    with pytest.raises(PlanError):
        off.prefetch(h.states, [4, 5])  # one request saved, two blocks
    with pytest.raises(PlanError):
        off.prefetch(h.states, [99])  # out of range
    with pytest.raises(PlanError):
        off.offload_async([-1])
    assert len(fake.log.calls) == n  # no event recorded, nothing on the side stream
    assert all((a == b).all() for x, y in zip(_rows(states, [4]), before) for a, b in zip(x, y))
