"""Transfer plans executed over NIXL (``pip install nixl-cu12``): each rank registers its pool's
state memory once, peers exchange agent metadata and layout fingerprints at handshake (the
compatibility check runs then, before any byte moves), and the destination rank pulls: the plan's
reads become NIXL READ descriptors, one transfer per (request, source rank), with completion and
errors reported per request. Each source rank then learns which of its blocks were read from one
notice per polling sweep (:meth:`NixlEndpoint.notifications`).

Every pull ends in a :class:`TransferResult`: a peer that fails (an error posting or polling a
read, a source process that died) fails only the requests reading from it, within the pull's
``timeout``. A failed or cancelled request is never reported done: its destination blocks are
listed in :attr:`TransferResult.invalid_blocks` and hold the bytes they held before the pull
(their direct reads' targets are saved before posting and written back), and its staged states
are not finished. Handshake messages are checked by the core (:class:`PeerInfo`); the pool's bound
tensors are checked before every pull and before a handshake is handed out.

An endpoint's UCX transport uses only the network interfaces it is given (``interfaces``:
loopback by default, so nothing listens on an external address unless asked).

NIXL is imported lazily: this module imports without it, and :func:`import_nixl` raises
:class:`~recoverssm_rs.errors.BackendUnavailableError` with the install hint.
"""

from __future__ import annotations

import fcntl
import importlib
import logging
import os
import socket
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._core import (
    LayoutFingerprint,
    PeerInfo,
    TransferPlan,
    check_pool,
    check_sources,
    endpoint_args,
    guarded_write,
    plan_transfer,
    pull_args,
    transfer_plan_arg,
)
from ..errors import BackendUnavailableError, BindingError, LayoutError
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


#: ``interfaces`` value that leaves UCX's own choice (every interface, or ``UCX_NET_DEVICES``).
ALL_INTERFACES = "all"


def _interface_of(address: str) -> str:
    """The name of the network interface holding IPv4 ``address`` (BindingError if none does)."""
    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s.fileno(), siocgifaddr, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
            if socket.inet_ntoa(raw[20:24]) == address:
                return name
    raise BindingError(f"interfaces: no network interface has the address {address}")


def net_devices(interfaces: str | Sequence[str]) -> str | None:
    """The ``UCX_NET_DEVICES`` value for ``interfaces``: interface names (``"lo"``, ``"eth0"``,
    ``"mlx5_0:1"``) or IPv4 addresses (mapped to their interface), comma-separated or as a list;
    None for :data:`ALL_INTERFACES` (UCX's default: every interface). The list is checked by the
    core (BindingError naming ``interfaces``)."""
    # The core's rules for the list (the other arguments are placeholders that pass).
    items = endpoint_args("net_devices", ["UCX"], True, interfaces)[3]
    if items == [ALL_INTERFACES]:
        return None
    out = []
    for x in items:
        try:
            socket.inet_aton(x)
        except OSError:
            out.append(x)
            continue
        out.append(_interface_of(x))
    return ",".join(out)


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
        interfaces: the network interfaces the UCX backend may listen and connect on (its
            ``UCX_NET_DEVICES`` while it is created): interface names or IPv4 addresses, a
            comma-separated string or a list. Default ``"lo"`` (loopback: peers on this machine
            only; shared memory and CMA need no interface); a real deployment names its
            interface (``"eth0"``, ``"mlx5_0:1"``, ``"10.0.0.5"``), or passes ``"all"`` for
            UCX's default of every interface.
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
        self,
        name: str,
        pool: StatePool,
        *,
        backends: tuple[str, ...] = ("UCX",),
        progress_thread: bool = True,
        interfaces: str | Sequence[str] = "lo",
    ) -> None:
        check_pool(pool)
        # The arguments, checked by the core before an agent exists (BindingError naming one).
        name, backend_names, progress_thread, items = endpoint_args(name, backends, progress_thread, interfaces)
        nixl = import_nixl()
        self.name = name
        self.pool = pool
        self.interfaces = net_devices(items)
        pool.check()
        self.agent = nixl.nixl_agent(name, nixl.nixl_agent_config(enable_prog_thread=progress_thread, backends=[]))
        for backend in backend_names:
            self._create_backend(backend)
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

    def _create_backend(self, backend: str) -> None:
        """Creates ``backend`` with ``UCX_NET_DEVICES`` set to :attr:`interfaces` meanwhile (UCX
        reads its configuration from the environment when a backend's context is created)."""
        key, old = "UCX_NET_DEVICES", os.environ.get("UCX_NET_DEVICES")
        if self.interfaces is not None:
            os.environ[key] = self.interfaces
        try:
            self.agent.create_backend(backend, {})
        except Exception as exc:  # NIXL raises its own error classes
            raise BackendUnavailableError(
                f"{self.name}: NIXL backend {backend} could not be created on interfaces "
                f"{self.interfaces or 'all'}: {type(exc).__name__}: {exc}"
            ) from exc
        finally:
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old

    def info(self) -> PeerInfo:
        """This rank's handshake message. The pool's bound tensors are checked first
        (BindingError naming one freed, resized or re-pointed since the endpoint registered its
        memory): a peer is never told to read memory the pool no longer holds."""
        self.pool.check()
        return PeerInfo(
            self.name, self.agent.get_agent_metadata(), self.pool.fingerprint, self.pool.geometry, self.addresses
        )

    def connect(self, peer: PeerInfo | bytes) -> int:
        """Adds a source rank; returns its rank. The message is checked by the core (LayoutError
        for a malformed, truncated or overflowing one), its fingerprint against this pool
        (LayoutError naming every incompatible state) and against the source ranks already
        connected (BindingError for another instance, another conv layout or TP size); a NIXL
        failure loading the peer's metadata is a BindingError. Nothing moves before it returns."""
        if isinstance(peer, (bytes, bytearray, memoryview)):
            info = PeerInfo.from_bytes(bytes(peer))
        elif isinstance(peer, PeerInfo):
            info = peer
        else:
            raise LayoutError(f"connect: a peer's handshake is bytes or a PeerInfo, got {type(peer).__name__}")
        fp = info.fingerprint
        fp.check_compatible(self.pool.fingerprint)
        others = [(r, p.fingerprint) for r, (_, p) in sorted(self.peers.items()) if r != fp.tp_rank]
        check_sources([*others, (fp.tp_rank, fp)])
        try:
            remote = self.agent.add_remote_agent(info.metadata)
        except Exception as exc:  # NIXL raises its own error classes
            raise BindingError(
                f"{self.name}: the metadata of peer {info.name!r} (source rank {fp.tp_rank}) was refused by "
                f"NIXL: {type(exc).__name__}: {exc}"
            ) from exc
        self.peers[fp.tp_rank] = (remote.decode() if isinstance(remote, bytes) else str(remote), info)
        self.source = fp
        return int(fp.tp_rank)

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
        and remote Nx3 arrays ``(address, bytes, device)``, merged where they continue each other.
        A ``plan`` that is not a TransferPlan, or a ``per_request`` that is not a bool, is a
        PlanError."""
        transfer_plan_arg(plan)
        per_request = pull_args(1.0, per_request, True)[1]
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
        self,
        requests: list[tuple[int, int]],
        *,
        timeout: float = 60.0,
        per_request: bool = True,
        restore_failed: bool = True,
    ) -> TransferResult:
        """Pulls ``requests``' states from the connected source ranks; blocks until every transfer
        is done, failed, or ``timeout`` seconds passed (the rest are cancelled).

        ``per_request`` (default) posts one transfer per (request, source rank), so completion and
        errors are per request; False posts one transfer per source rank for the whole batch
        (fewer, larger transfers; an error fails every request of the batch).

        A peer failure never raises: the requests it fails are in :attr:`TransferResult.failed`
        with a reason, their destination blocks in :attr:`TransferResult.invalid_blocks`, holding
        the bytes they held before the pull (``restore_failed``, default: their spans are saved
        before posting, which costs a local copy of the batch's bytes; an engine that frees every
        invalid block may pass False, and the failed blocks may then hold part of the new state).
        Raises only the package's errors, before anything moves: a bad batch or argument (PlanError:
        ``timeout`` must be a finite number of seconds > 0 and at most a week, ``per_request`` and
        ``restore_failed`` bools), a source rank not connected or a bound tensor freed or
        re-pointed (BindingError)."""
        t0 = time.perf_counter()
        timeout, per_request, restore_failed = pull_args(timeout, per_request, restore_failed)
        plan = self.plan(requests)
        # One guarded core call: the pool's bound tensors are checked (BindingError, nothing
        # posted), the reads run, and the pool's write is recorded.
        res: TransferResult = guarded_write(
            lambda: self._pull(plan, t0, timeout, per_request, restore_failed), writes=[self.pool.guard]
        )
        return res

    def _pull(
        self,
        plan: TransferPlan,
        t0: float,
        timeout: float,
        per_request: bool,
        restore_failed: bool,
    ) -> TransferResult:
        res = TransferResult(nbytes=plan.nbytes)
        blocks = plan.blocks  # the batch's block pairs as the core read them (plain ints)
        groups = self.descriptors(plan, per_request=per_request)
        saved = self._save_targets(read_rows(plan)) if restore_failed else {}
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
            pending = {r: hs for r in range(len(blocks))} if hs else {}
            if -1 in res.failed:
                why = res.failed.pop(-1)
                res.failed.update({r: why for r in range(len(blocks))})
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
                        seen[id(h)] = self._poll(h)
                    states.append(seen[id(h)])
                errs = [x for x in states if x not in ("DONE", "PROC")]
                if errs:
                    why = errs[0] if errs[0] != "ERR" else "NIXL reported an error during the read"
                    res.failed[req] = why
                    del active[req]
                elif all(s == "DONE" for s in states):
                    del active[req]
                    finished.append(req)
            if finished:
                # The staged states of every request finished in this sweep, in one pass.
                if staged.size:
                    run_staged(staged, self._staging, self.pool.views, finished)
                res.done.extend(finished)
                self._notify(finished, reads_from, blocks)
            if active and time.perf_counter() > deadline:
                for req in active:
                    res.failed[req] = f"cancelled after {timeout} s"
                break
        # A failed request's other transfers may still be landing: wait (up to the deadline) until
        # none is in progress before its blocks get their old bytes back.
        draining = {id(h): h for r in res.failed for h in pending.get(r, ())}
        while draining and time.perf_counter() <= deadline:
            draining = {k: h for k, h in draining.items() if self._poll(h) == "PROC"}
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
        for req in res.failed:  # their blocks get back the bytes they held before the pull
            for dst, before in saved.get(req, ()):
                _copy_back(dst, before)
        res.done.sort()
        res.invalid_blocks = sorted(blocks[r][1] for r in res.failed)
        res.seconds = time.perf_counter() - t0
        return res

    def _poll(self, handle: Any) -> str:
        """A transfer's state: ``DONE``, ``PROC``, ``ERR``, or a reason when NIXL raised (a peer
        that disconnected raises from ``check_xfer_state``)."""
        try:
            return str(self.agent.check_xfer_state(handle))
        except Exception as exc:  # NIXL raises its own error classes
            return f"the read failed: {type(exc).__name__}: {exc}"

    def _save_targets(self, rows: np.ndarray) -> dict[int, list[tuple[Any, Any]]]:
        """Per request, ``(destination view, copy of its bytes)`` for the span of each destination
        tensor its in-place reads write (staged reads land in the staging buffer)."""
        direct = rows[rows[:, 4] != STAGING]
        out: dict[int, list[tuple[Any, Any]]] = {}
        if direct.size == 0:
            return out
        key = direct[:, 0] * np.uint64(1 << 32) + direct[:, 4]
        order = np.argsort(key, kind="stable")
        key, lo, hi = key[order], direct[order, 5], direct[order, 5] + direct[order, 6]
        starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
        lo, hi = np.minimum.reduceat(lo, starts), np.maximum.reduceat(hi, starts)
        views = self.pool.views
        for k, a, b in zip(key[starts].tolist(), lo.tolist(), hi.tolist()):
            dst = views[k & 0xFFFFFFFF][a:b]
            out.setdefault(k >> 32, []).append((dst, dst.copy() if isinstance(dst, np.ndarray) else dst.clone()))
        return out

    def _notify(self, finished: list[int], reads_from: np.ndarray, blocks: list[tuple[int, int]]) -> None:
        """Tells each source rank which of its blocks were read, in one message per rank for the
        requests finished in one sweep (a notice per transfer costs a round trip each).
        ``reads_from``: the plan's distinct ``request << 20 | source rank`` keys; ``blocks``: the
        plan's block pairs."""
        req, rank_of = reads_from >> np.uint64(20), reads_from & np.uint64((1 << 20) - 1)
        done = np.isin(req, np.array(finished, dtype=np.uint64))
        for rank in np.unique(rank_of[done]).tolist():
            read = ",".join(str(blocks[r][0]) for r in req[done & (rank_of == rank)].tolist())
            try:
                self.agent.send_notif(self.peers[rank][0], f"recoverssm:{self.name}:{read}".encode())
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
        return (
            f"NixlEndpoint({self.name!r}, {self.pool!r}, peers={sorted(self.peers)}, "
            f"interfaces={self.interfaces or ALL_INTERFACES!r})"
        )


def _copy_back(dst: Any, before: Any) -> None:
    if isinstance(dst, np.ndarray):
        dst[...] = before
    else:
        dst.copy_(before)
