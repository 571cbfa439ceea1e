"""Transfer plans executed over NIXL (``pip install nixl-cu12``): each rank registers its pool's
state memory once, peers exchange agent metadata and layout fingerprints at handshake (the
compatibility check runs then, before any byte moves), and the destination rank pulls: the plan's
reads become NIXL READ descriptors, one transfer per (request, source rank), with completion and
errors reported per request. Each source rank then learns which of its blocks were read from one
notice per polling sweep (:meth:`NixlEndpoint.notifications`).

A request whose reads fail or are cancelled is never reported done: its destination blocks are
listed in :attr:`TransferResult.invalid_blocks` (reads land in place, so they may hold part of the
new state) and its staged states are not finished. NIXL is imported lazily: this module imports
without it, and :func:`import_nixl` raises :class:`~recoverssm_rs.errors.BackendUnavailableError`
with the install hint.
"""

from __future__ import annotations

import base64
import importlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._core import LayoutFingerprint, TransferPlan, plan_transfer
from ..errors import BackendUnavailableError, BindingError
from .local import STAGING, read_rows, run_staged, staged_rows
from .pool import StatePool

__all__ = ["NixlEndpoint", "PeerInfo", "TransferResult", "import_nixl", "nixl_available"]

log = logging.getLogger("recoverssm_rs")

_MODULES = ("nixl_cu12", "nixl_cu13", "nixl")
INSTALL_HINT = "pip install nixl-cu12 (CUDA 12 wheels; nixl-cu13 for CUDA 13)"


def import_nixl() -> Any:
    """The NIXL Python API module (``nixl_agent``, ``nixl_agent_config``)."""
    errors = []
    for name in _MODULES:
        try:
            mod = importlib.import_module(name)
        except ImportError as exc:
            errors.append(f"{name}: {exc}")
            continue
        if hasattr(mod, "nixl_agent"):
            return mod
        errors.append(f"{name}: has no nixl_agent")
    raise BackendUnavailableError(f"NIXL is not importable ({'; '.join(errors)}); {INSTALL_HINT}")


def nixl_available() -> bool:
    """Whether :func:`import_nixl` succeeds."""
    try:
        import_nixl()
    except BackendUnavailableError:
        return False
    return True


@dataclass
class PeerInfo:
    """What one rank tells a peer at handshake: its NIXL agent name and metadata, its layout
    fingerprint, its pool geometry and the address of block 0 of each (layer, state) tensor."""

    name: str
    metadata: bytes
    fingerprint: str
    geometry: tuple[int, int, list[int]]
    addresses: list[int]

    def to_bytes(self) -> bytes:
        """JSON form, for a pipe, a queue or a side channel."""
        d = dict(
            name=self.name,
            metadata=base64.b64encode(self.metadata).decode(),
            fingerprint=self.fingerprint,
            geometry=list(self.geometry),
            addresses=self.addresses,
        )
        return json.dumps(d).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> PeerInfo:
        """Reads :meth:`to_bytes`'s form."""
        d = json.loads(data)
        g = d["geometry"]
        return cls(
            d["name"],
            base64.b64decode(d["metadata"]),
            d["fingerprint"],
            (int(g[0]), int(g[1]), list(g[2])),
            [int(a) for a in d["addresses"]],
        )

    def __repr__(self) -> str:
        return f"PeerInfo({self.name!r}, tensors={len(self.addresses)})"


@dataclass
class TransferResult:
    """Outcome of one :meth:`NixlEndpoint.pull`, per request (index into the batch)."""

    done: list[int] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)
    invalid_blocks: list[int] = field(default_factory=list)
    """Destination blocks of failed or cancelled requests: not to be used."""
    nbytes: int = 0
    descriptors: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failed

    def __repr__(self) -> str:
        return (
            f"TransferResult(done={len(self.done)}, failed={len(self.failed)}, bytes={self.nbytes}, "
            f"descriptors={self.descriptors}, seconds={self.seconds:.4f})"
        )


def _disjoint_spans(addrs: list[int], spans: list[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, n in sorted(zip(addrs, spans)):
        if out and a <= out[-1][0] + out[-1][1]:
            s, m = out[-1]
            out[-1] = (s, max(m, a + n - s))
        else:
            out.append((a, n))
    return out


class NixlEndpoint:
    """One rank's pool on a NIXL agent: registers the pool's state memory once, answers
    handshakes (:meth:`info`), connects to the source instance's ranks (:meth:`connect`) and pulls
    requests' states from them (:meth:`pull`).

    Args:
        name: the agent's name (unique among the peers).
        pool: this rank's pool.
        backends: NIXL backends to create (UCX moves CPU and CUDA memory).
        progress_thread: whether the agent runs NIXL's background progress thread (NIXL's
            default). A pulling destination progresses its own reads while :meth:`pull` polls.
            A source rank without the thread must progress its agent itself, by calling
            :meth:`notifications` every millisecond or so while peers connect and pull: UCX's
            connection set-up waits on it (a pull from a source that never progresses is
            cancelled at its timeout), although one-sided reads over CMA or RDMA then need nothing
            from it. The thread busy-polls: on a machine with few cores each idle agent's thread
            takes most of a core from the processes doing the copies.
    """

    def __init__(
        self, name: str, pool: StatePool, *, backends: tuple[str, ...] = ("UCX",), progress_thread: bool = True
    ) -> None:
        nixl = import_nixl()
        self.name = name
        self.pool = pool
        self.agent = nixl.nixl_agent(
            name, nixl.nixl_agent_config(enable_prog_thread=progress_thread, backends=list(backends))
        )
        cuda = pool.device.startswith("cuda")
        self.mem_type = "VRAM" if cuda else "DRAM"
        self.device_id = int(pool.device.split(":")[1]) if cuda and ":" in pool.device else 0
        self.addresses = pool.addresses()
        regions = _disjoint_spans(self.addresses, pool.spans())
        self._reg = self.agent.register_memory(
            np.array([(a, n, self.device_id) for a, n in regions], dtype=np.uint64), self.mem_type
        )
        self.peers: dict[int, tuple[str, PeerInfo]] = {}
        self.source: LayoutFingerprint | None = None
        self._staging: Any = None
        self._staging_size = 0
        self._staging_reg: Any = None
        log.info("nixl endpoint %s: registered %d regions (%s)", name, len(regions), self.mem_type)

    def info(self) -> PeerInfo:
        """This rank's handshake message."""
        return PeerInfo(
            self.name,
            self.agent.get_agent_metadata(),
            self.pool.fingerprint.encode(),
            self.pool.geometry,
            self.addresses,
        )

    def connect(self, peer: PeerInfo | bytes) -> int:
        """Adds a source rank: checks its fingerprint against this pool (LayoutError, naming every
        incompatible state, before anything moves) and loads its agent metadata. Returns its rank."""
        info = PeerInfo.from_bytes(peer) if isinstance(peer, bytes) else peer
        fp = LayoutFingerprint.decode(info.fingerprint)
        fp.check_compatible(self.pool.fingerprint)
        if self.source is not None and fp.with_rank(0) != self.source.with_rank(0):
            raise BindingError(
                f"{info.name}: its fingerprint {fp!r} is not that of the source instance already "
                f"connected ({self.source!r}); one endpoint pulls from one instance"
            )
        remote = self.agent.add_remote_agent(info.metadata)
        self.peers[fp.tp_rank] = (remote.decode() if isinstance(remote, bytes) else str(remote), info)
        self.source = fp
        return fp.tp_rank

    def plan(self, requests: list[tuple[int, int]]) -> TransferPlan:
        """The plan pulling ``requests`` (source block, destination block) into this pool."""
        if self.source is None:
            raise BindingError(f"{self.name}: no source connected; call connect() with each source rank's info")
        first = next(iter(self.peers.values()))[1].geometry
        geoms = [self.peers[r][1].geometry if r in self.peers else first for r in range(self.source.tp_size)]
        return plan_transfer(self.source, geoms, self.pool.fingerprint, self.pool.geometry, requests)

    def _staging_buffer(self, nbytes: int) -> int:
        if self._staging is None or self._staging_size < nbytes:
            if self._staging_reg is not None:
                self.agent.deregister_memory(self._staging_reg)
            if self.mem_type == "VRAM":
                import torch

                self._staging = torch.empty(nbytes, dtype=torch.uint8, device=self.pool.device)
                addr = int(self._staging.data_ptr())
            else:
                self._staging = np.empty(nbytes, dtype=np.uint8)
                addr = int(self._staging.ctypes.data)
            self._staging_size = nbytes
            self._staging_reg = self.agent.register_memory(
                np.array([(addr, nbytes, self.device_id)], dtype=np.uint64), self.mem_type
            )
        return int(self._staging.data_ptr() if self.mem_type == "VRAM" else self._staging.ctypes.data)

    def descriptors(
        self, plan: TransferPlan, *, per_request: bool = True
    ) -> list[tuple[int, int, np.ndarray, np.ndarray]]:
        """The plan's reads as NIXL descriptors: per (request, source rank) -- or per source rank
        for the whole batch when ``per_request`` is False (request reported as -1) -- the local
        and remote Nx3 arrays ``(address, bytes, device)``, merged where they continue each other."""
        reads = read_rows(plan)
        if reads.size == 0:
            return []
        missing = sorted(set(int(r) for r in np.unique(reads[:, 1])) - set(self.peers))
        if missing:
            raise BindingError(f"{self.name}: the plan reads source ranks {missing}, which are not connected")
        stage = self._staging_buffer(plan.staging_bytes) if plan.staging_bytes else 0
        local_bases = np.array(self.addresses, dtype=np.uint64)
        is_staged = reads[:, 4] == STAGING
        dst = np.where(is_staged, np.uint64(stage), local_bases[np.where(is_staged, 0, reads[:, 4])]) + reads[:, 5]
        src = np.zeros(len(reads), dtype=np.uint64)
        for rank, (_, info) in self.peers.items():
            sel = reads[:, 1] == rank
            src[sel] = np.array(info.addresses, dtype=np.uint64)[reads[sel, 2]] + reads[sel, 3]
        # Group by (request, source rank) -- or source rank -- keeping the plan's order within a
        # group, and merge descriptors that continue each other on both sides, in one pass.
        key = (reads[:, 0] if per_request else np.zeros(len(reads), dtype=np.uint64)) * np.uint64(1 << 20) + reads[:, 1]
        order = np.argsort(key, kind="stable")
        key, src, dst, ln = key[order], src[order], dst[order], reads[order, 6]
        brk = np.ones(len(key), dtype=bool)
        brk[1:] = (key[1:] != key[:-1]) | (src[:-1] + ln[:-1] != src[1:]) | (dst[:-1] + ln[:-1] != dst[1:])
        starts = np.flatnonzero(brk)
        key, src, dst, ln = key[starts], src[starts], dst[starts], np.add.reduceat(ln, starts)
        dev = np.full(len(key), self.device_id, dtype=np.uint64)
        peer_dev = np.zeros(len(key), dtype=np.uint64) if self.mem_type == "DRAM" else dev
        local, remote = np.stack([dst, ln, dev], axis=1), np.stack([src, ln, peer_dev], axis=1)
        keys, first = np.unique(key, return_index=True)
        bounds = first.tolist() + [len(key)]
        return [
            ((k >> 20) if per_request else -1, k & ((1 << 20) - 1), local[a:b], remote[a:b])
            for k, a, b in zip(keys.tolist(), bounds[:-1], bounds[1:])
        ]

    def pull(
        self, requests: list[tuple[int, int]], *, timeout: float = 60.0, per_request: bool = True
    ) -> TransferResult:
        """Pulls ``requests``' states from the connected source ranks; blocks until every transfer
        is done, failed, or ``timeout`` seconds passed (the rest are cancelled).

        ``per_request`` (default) posts one transfer per (request, source rank), so completion and
        errors are per request; False posts one transfer per source rank for the whole batch
        (fewer, larger transfers; an error fails every request of the batch)."""
        t0 = time.perf_counter()
        plan = self.plan(requests)
        res = TransferResult(nbytes=plan.nbytes)
        groups = self.descriptors(plan, per_request=per_request)
        pending: dict[int, list[Any]] = {}
        for req, rank, local, remote in groups:
            res.descriptors += len(local)
            if req in res.failed:
                continue
            try:
                h = self.agent.initialize_xfer(
                    "READ",
                    self.agent.get_xfer_descs(local, self.mem_type),
                    self.agent.get_xfer_descs(remote, self.mem_type),
                    self.peers[rank][0],
                )
                state = self.agent.transfer(h)
            except Exception as exc:  # NIXL raises its own error classes
                res.failed[req] = f"source rank {rank}: {type(exc).__name__}: {exc}"
                continue
            if state == "ERR":
                res.failed[req] = f"source rank {rank}: NIXL reported an error posting the read"
            pending.setdefault(req, []).append(h)
        if not per_request:  # one batch: every request shares the batch's transfers and fate
            hs = pending.pop(-1, [])
            pending = {r: hs for r in range(len(requests))} if hs else {}
            if -1 in res.failed:
                why = res.failed.pop(-1)
                res.failed.update({r: why for r in range(len(requests))})
        active = {r: hs for r, hs in pending.items() if r not in res.failed}
        staged = staged_rows(plan)
        rows = read_rows(plan)
        reads_from = np.unique(rows[:, 0] * np.uint64(1 << 20) + rows[:, 1])  # request << 20 | source rank
        deadline = t0 + timeout
        while active:
            seen: dict[int, str] = {}  # one state query per transfer per sweep
            finished: list[int] = []
            for req in list(active):
                states = []
                for h in active[req]:
                    if id(h) not in seen:
                        seen[id(h)] = self.agent.check_xfer_state(h)
                    states.append(seen[id(h)])
                if "ERR" in states:
                    res.failed[req] = "NIXL reported an error during the read"
                    del active[req]
                elif all(s == "DONE" for s in states):
                    del active[req]
                    finished.append(req)
            if finished:
                # The staged states of every request finished in this sweep, in one pass.
                if staged.size:
                    run_staged(staged, self._staging, self.pool.views, finished)
                res.done.extend(finished)
                self._notify(finished, reads_from, requests)
            if active and time.perf_counter() > deadline:
                for req in active:
                    res.failed[req] = f"cancelled after {timeout} s"
                break
        released: set[int] = set()
        for hs in pending.values():
            for h in hs:
                if id(h) in released:
                    continue
                released.add(id(h))
                try:
                    self.agent.release_xfer_handle(h)
                except Exception as exc:  # a handle still in flight: NIXL aborts it
                    log.warning("nixl endpoint %s: releasing a transfer: %s", self.name, exc)
        res.done.sort()
        res.invalid_blocks = sorted(requests[r][1] for r in res.failed)
        res.seconds = time.perf_counter() - t0
        return res

    def _notify(self, finished: list[int], reads_from: np.ndarray, requests: list[tuple[int, int]]) -> None:
        """Tells each source rank which of its blocks were read, in one message per rank for the
        requests finished in one sweep (a notice per transfer costs a round trip each).
        ``reads_from``: the plan's distinct ``request << 20 | source rank`` keys."""
        req, rank_of = reads_from >> np.uint64(20), reads_from & np.uint64((1 << 20) - 1)
        done = np.isin(req, np.array(finished, dtype=np.uint64))
        for rank in np.unique(rank_of[done]).tolist():
            blocks = ",".join(str(requests[r][0]) for r in req[done & (rank_of == rank)].tolist())
            try:
                self.agent.send_notif(self.peers[rank][0], f"recoverssm:{self.name}:{blocks}".encode())
            except Exception as exc:  # the states have landed; only the notice is lost
                log.warning("nixl endpoint %s: notifying source rank %d: %s", self.name, rank, exc)

    def notifications(self) -> list[str]:
        """Completion notices received so far (this rank as a source; also progresses the agent):
        ``recoverssm:<destination name>:<source blocks>``, the blocks (comma-separated) of this
        rank whose reads finished, one notice per destination polling sweep."""
        out: list[str] = []
        for msgs in self.agent.get_new_notifs().values():
            out.extend(m.decode(errors="replace") for m in msgs)
        return out

    def __repr__(self) -> str:
        return f"NixlEndpoint({self.name!r}, {self.pool!r}, peers={sorted(self.peers)})"
