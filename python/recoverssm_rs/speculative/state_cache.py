"""RecoverSSM state cache: the persistent block pool and the verify-record workspace of a stack
of GDN / KDA layers, allocated once, and the verify / commit steps of speculative decoding.

Per step and layer, :meth:`StateCache.conv_verify` runs the short causal conv over the window and
:meth:`StateCache.verify` runs the recurrence over the window, both *from* the persistent state
without writing it: the verified conv window and the per-token records ``(u_t, k_t, gate_t)`` go to
the workspace row of each request. After sampling, :meth:`StateCache.commit` folds each request's
accepted records into its state and writes the conv window compacted by the accepted count (and,
in align mode, writes the state and window at the block boundary crossed inside the window into
the prefix-cache block) — for every layer at once, from a commit plan built and checked by the Rust
core. A commit of 0 tokens leaves both states exactly as they were. The workspace is per request
row, not per block, so it costs no cache capacity; nothing is reallocated in steady state.

On CUDA tensors the commit is one launch of the ``rs_recover_commit`` kernel (every layer, request
and head; see :mod:`recoverssm_rs.cuda`) on the caller's stream, without any host synchronisation;
the per-request accepted counts may then stay on the device (pass a CUDA ``num_accepted``). On CPU
tensors (or without CuPy) the torch reference of :mod:`recoverssm_rs.speculative.recurrence` runs.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, TypedDict, Unpack

import numpy as np
import torch

from .. import _core
from .._core import BoundTensors, CommitPlanner, ErrorWord, Layout
from ..cuda.commit import CommitKernel, build_commit_meta
from ..cuda.module import function_ptr
from ..errors import BackendUnavailableError, BindingError
from ..plan_format import COMMIT_ROW_DTYPE, records
from ..planner import Planner
from . import recurrence
from .memory_report import MemoryReport

__all__ = ["StateCache", "MemoryReport"]

log = logging.getLogger("recoverssm_rs")


class AlignCommit(TypedDict, total=False):
    """Align mode of a commit (all three or none; :meth:`StateCache.commit` documents them)."""

    seq_lens: Any
    block_table: Any
    block_size: int | None


_DTYPES = {
    "float64": torch.float64,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}


def _torch_dtype(name: str) -> torch.dtype:
    try:
        return _DTYPES[name]
    except KeyError:
        dtype: torch.dtype = getattr(torch, name)
        return dtype


class StateCache:
    """Persistent block pool + verify-record workspace for ``num_layers`` RecoverSSM layers.

    Args:
        layout: a RecoverSSM layout (e.g. ``layouts.kda(..., recover_ssm=True)``): conv window and
            recurrent state persistent, corrections and key+gate records as workspace.
        num_layers: layers sharing this layout.
        num_blocks: blocks in the pool, including the null block 0.
        max_requests: workspace rows (the largest batch a step may verify).
        device: where to allocate (``"cpu"``, ``"cuda"``, ...).

    Raises:
        LayoutError: the layout is not a RecoverSSM layout (the message says why).
    """

    def __init__(
        self,
        layout: Layout,
        *,
        num_layers: int,
        num_blocks: int,
        max_requests: int,
        device: str | torch.device = "cpu",
    ) -> None:
        _core.check_cache_sizes(num_layers, num_blocks, max_requests)
        geo = _core.recover_geometry(layout)
        self.layout = layout
        self.geometry: dict[str, Any] = geo
        self.kind: str = geo["kind"]
        self.window: int = int(geo["window"])
        self.conv_kernel_size: int = int(geo["conv_kernel_size"])
        self.conv_layout: recurrence.ConvLayout = geo["conv_layout"]
        self.num_layers = int(num_layers)
        self.num_blocks = int(num_blocks)
        self.max_requests = int(max_requests)
        try:
            self.device = torch.device(device)
        except (TypeError, ValueError, RuntimeError) as e:
            raise BindingError(f"device: {e}") from None
        states = layout.states
        conv_spec = states[geo["conv_state"]]
        rec_spec = states[geo["recurrent_state"]]
        corr_spec = states[geo["corrections"]]
        kg_spec = states[geo["keygate"]]
        dev = self.device
        # One allocation per state kind; per-layer tensors are views of it.
        self._conv = torch.zeros(
            (num_layers, num_blocks, *conv_spec.shape), dtype=_torch_dtype(conv_spec.dtype), device=dev
        )
        self._recurrent = torch.zeros(
            (num_layers, num_blocks, *rec_spec.shape), dtype=_torch_dtype(rec_spec.dtype), device=dev
        )
        self._corrections = torch.zeros((num_layers, max_requests, *corr_spec.shape), dtype=torch.float32, device=dev)
        self._keygate = torch.zeros(
            (num_layers, max_requests, *kg_spec.shape), dtype=_torch_dtype(kg_spec.dtype), device=dev
        )
        # The verified conv window of each request row: commit compacts it into the block.
        self._conv_window = torch.zeros(
            (num_layers, max_requests, *conv_spec.shape), dtype=self._conv.dtype, device=dev
        )
        pers = [[self._conv[l], self._recurrent[l]] for l in range(num_layers)]
        if geo["conv_state"] != 0:
            pers = [[r, c] for c, r in pers]
        self.planner = Planner(layout, pers)
        self.commit_planner = CommitPlanner(layout, self.num_blocks)
        self._bound = BoundTensors([(t, f"StateCache {k} buffer") for k, t in self.buffers().items()])
        self._device_commit: CommitKernel | None = None
        if dev.type == "cuda":
            self._device_commit = self._bind_commit_kernel()
        log.debug("StateCache: %s", self)

    # ---- tensors -------------------------------------------------------------------------
    def _layer(self, layer: int) -> int:
        return int(_core.check_index("layer", layer, self.num_layers))

    def conv_state(self, layer: int) -> torch.Tensor:
        """``[num_blocks, *conv_shape]`` conv windows of ``layer``."""
        return self._conv[self._layer(layer)]

    def recurrent_state(self, layer: int) -> torch.Tensor:
        """``[num_blocks, H, V, K]`` recurrent states of ``layer``."""
        return self._recurrent[self._layer(layer)]

    def workspace(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(corrections [max_requests, H, Q, V], keygate [max_requests, H, Q, KG])`` of ``layer``."""
        layer = self._layer(layer)
        return self._corrections[layer], self._keygate[layer]

    def buffers(self) -> dict[str, torch.Tensor]:
        """Every tensor the cache allocated (for inspection: they never change identity)."""
        return {
            "conv": self._conv,
            "recurrent": self._recurrent,
            "corrections": self._corrections,
            "keygate": self._keygate,
            "conv_window": self._conv_window,
        }

    # ---- verify --------------------------------------------------------------------------
    def _rows(self, state_blocks: Any) -> torch.Tensor:
        """Checked running-state blocks as a device index; padding rows (``<= 0``) read block 0."""
        self.commit_planner.check_state_blocks(state_blocks, self.max_requests)
        idx = torch.as_tensor(np.asarray(state_blocks), dtype=torch.long)
        return idx.clamp(min=0).to(self.device)

    def conv_verify(self, layer: int, state_blocks: Any, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """Causal depthwise conv over the window, from each request's conv window.

        ``x`` ``[B, Q, dim]`` are the window's conv inputs, ``weight`` ``[dim, conv_kernel_size]``
        (tap ``j`` multiplies the input ``conv_kernel_size - 1 - j`` positions back). The window
        in each request's block holds the last ``conv_kernel_size - 1`` inputs in its first
        columns and is not written; the verified window ``[h_2 .. h_{K-1}, x_1 .. x_Q]`` goes to
        the request's workspace row, which :meth:`commit` compacts by the accepted count into the
        block. Returns ``[B, Q, dim]`` (float32).
        """
        layer = self._layer(layer)
        blocks = self._rows(state_blocks)
        self._bound.check()
        y, window = recurrence.conv_verify(
            self._conv[layer][blocks], x, weight, self.conv_kernel_size, self.conv_layout, window=self.window
        )
        self._conv_window[layer][: blocks.numel()] = window
        return y

    def verify(
        self,
        layer: int,
        state_blocks: Any,
        q_hat: torch.Tensor,
        k_hat: torch.Tensor,
        v: torch.Tensor,
        gate: torch.Tensor,
        beta: torch.Tensor,
        query_lens: Any = None,
    ) -> torch.Tensor:
        """Run the window from each request's persistent state without writing it; write the
        records into workspace rows ``0..B-1`` of ``layer``. Shapes as
        :func:`recoverssm_rs.speculative.recurrence.verify` (``[B, Q, H, *]``); returns ``[B, Q, H, V]``."""
        layer = self._layer(layer)
        blocks = self._rows(state_blocks)
        self._bound.check()
        b = blocks.numel()
        state = self._recurrent[layer][blocks]
        corr, kg = self.workspace(layer)
        return recurrence.verify(state, q_hat, k_hat, v, gate, beta, corr[:b], kg[:b], query_lens=query_lens)

    # ---- commit --------------------------------------------------------------------------
    def plan_commit(
        self, num_accepted: Any, state_blocks: Any, query_lens: Any = None, **align: Unpack[AlignCommit]
    ) -> np.ndarray:
        """The commit plan (``COMMIT_ROW_DTYPE`` records), checked by the core. See :meth:`commit`."""
        if query_lens is None:
            n = self.commit_planner.check_state_blocks(state_blocks, self.max_requests)
            query_lens = np.full(n, self.window, dtype=np.int64)
        raw = self.commit_planner.plan(
            state_blocks=state_blocks,
            num_accepted=num_accepted,
            query_lens=query_lens,
            max_requests=self.max_requests,
            **align,
        )
        return records(raw, dtype=COMMIT_ROW_DTYPE)

    def commit(
        self, num_accepted: Any, state_blocks: Any, query_lens: Any = None, **align: Unpack[AlignCommit]
    ) -> np.ndarray:
        """Fold each request's accepted records into its state, for every layer.

        Args:
            num_accepted: ``[B]`` accepted counts (clamped to ``[0, query_len]``; docs/design.md section 1).
            state_blocks: ``[B]`` block of each request's running state (as given to verify);
                ``<= 0`` marks padding.
            query_lens: ``[B]`` tokens verified per request (default: the full window).
            seq_lens, block_table, block_size: align mode (all three or none): tokens in each
                running state before the window, the block table ``[B, cols]`` and the block size
                in tokens. When ``seq_len + count`` crosses a multiple of ``block_size``, the state
                (and conv window) at that boundary is written into ``block_table[r, boundary //
                block_size - 1]`` for the prefix cache.

        On CUDA the commit runs as one ``rs_recover_commit`` launch on the current stream: the
        plan's rows go to the device through pinned memory, nothing waits for the device, and
        ``num_accepted`` may be a CUDA integer tensor ``[>= B]`` that the host never reads: each
        request is then planned for its whole window (``query_lens``) and the kernel clamps
        ``num_accepted[r]`` to it; an align-mode boundary is written when the device count reaches
        it (the returned plan then holds the caps as counts and the boundary a full window would
        cross). Rows the kernel rejects are reported by :meth:`commit_error`.

        Returns:
            the commit plan that was executed (``COMMIT_ROW_DTYPE``).

        Raises:
            PlanError: before anything changes (a bad count, block, boundary or a block written
                twice), naming the request.
        """
        if self._commit_kernel_ready():
            d = self._device_commit
            assert d is not None
            # One call into the core (bound tensors, plan, counts, launch), one launch.
            return d.commit(
                self.commit_planner,
                self._bound,
                num_accepted,
                state_blocks,
                query_lens,
                device=str(self._recurrent.device),
                device_counts=self._is_device_tensor(num_accepted),
                max_requests=self.max_requests,
                align=dict(align),
            )
        rows = self.plan_commit(num_accepted, state_blocks, query_lens, **align)
        if len(rows) == 0:
            return rows
        # One guarded core call: the bound tensors checked, the reference commit, the write recorded.
        self._bound.guarded(
            lambda: recurrence.commit_rows(
                rows,
                recurrent=self._recurrent,
                conv=self._conv,
                corrections=self._corrections,
                keygate=self._keygate,
                conv_window=self._conv_window,
                conv_kernel_size=self.conv_kernel_size,
                conv_layout=self.conv_layout,
            )
        )
        return rows

    # ---- commit kernel (CUDA) -------------------------------------------------------------
    def commit_meta(self) -> np.ndarray:
        """The commit kernel's per-layer table (:data:`~recoverssm_rs.cuda.COMMIT_META_DTYPE`) for
        this cache's buffers (their addresses: on CPU it drives the host emulation of the kernel).

        Raises:
            BindingError: the kernel cannot take this layout (e.g. a (state, record) dtype pair it
                is not instantiated for; see :data:`~recoverssm_rs.cuda.COMMIT_DTYPE_PAIRS`), or a
                buffer was resized, freed or re-pointed since the cache was made.
        """
        self._bound.check()
        L = self.num_layers
        return build_commit_meta(
            [self._recurrent[l] for l in range(L)],
            [self._corrections[l] for l in range(L)],
            [self._keygate[l] for l in range(L)],
            [self._conv[l] for l in range(L)],
            [self._conv_window[l] for l in range(L)],
            kind=self.kind,
            conv_layout=self.conv_layout,
            conv_kernel_size=self.conv_kernel_size,
        )

    def _bind_commit_kernel(self) -> CommitKernel | None:
        """Build the kernel's table once (the only host -> device copy that waits) and the
        fixed-address row buffer and error word; ``None`` when the kernel cannot take the layout."""
        try:
            meta = self.commit_meta()
        except BindingError as exc:
            log.warning("StateCache: commit kernel unavailable for this layout (%s); the torch reference commits", exc)
            return None
        return CommitKernel(meta, device=self.device, num_blocks=self.num_blocks, max_requests=self.max_requests)

    @staticmethod
    def _is_device_tensor(x: Any) -> bool:
        """A tensor in device memory (the host must not read it)."""
        return isinstance(x, torch.Tensor) and x.device.type != "cpu"

    def _commit_kernel_ready(self) -> bool:
        """True when commits run on the kernel (a CUDA cache, CuPy and a device; checked once)."""
        d = self._device_commit
        if d is None:
            return False
        if d.ready is None:
            try:
                function_ptr("rs_recover_commit", d.device_index)
                d.ready = True
            except BackendUnavailableError as exc:
                log.warning("StateCache: %s; the torch reference commits", exc)
                d.ready = False
        return bool(d.ready)

    def fused_commit(self) -> tuple[Any, BoundTensors] | None:
        """``(commit launcher, bound tensors)`` when commits run on the kernel (a CUDA cache, CuPy
        and a device), for an engine adapter that runs this cache's commit inside its own launch
        (:meth:`ModelStateV2.stage_recoverssm <recoverssm_rs.vllm.ModelStateV2.stage_recoverssm>`);
        ``None`` when the torch reference commits."""
        d = self._device_commit
        return (d.launcher, self._bound) if self._commit_kernel_ready() and d is not None else None

    def launch_commit(
        self,
        rows: torch.Tensor,
        num_rows: int | None = None,
        *,
        num_accepted: torch.Tensor | None = None,
        stream: Any = None,
    ) -> None:
        """Launch the commit kernel on rows already in device memory (CUDA caches only).

        Nothing is planned, staged, allocated or synchronised: with fixed ``rows`` / ``num_accepted``
        tensors the launch can be captured in a CUDA graph and replayed after rewriting them in
        place. ``rows`` holds ``COMMIT_ROW_DTYPE`` records (e.g. a :meth:`plan_commit` result
        copied to the device; pad with ``state_block = -1`` rows), ``num_rows`` of them (default:
        all); ``num_accepted`` (optional int32 CUDA vector) overrides the counts as in
        :meth:`commit`. The host guarantees the plan's invariants (the Rust planner checks them);
        rows the kernel rejects are reported by :meth:`commit_error`.
        """
        d = self._device_commit
        if d is None:
            raise BackendUnavailableError("launch_commit needs a CUDA StateCache whose layout the commit kernel takes")
        if num_accepted is not None:
            _core.check_commit_counts(str(self._recurrent.device), num_accepted, 1)
        self._bound.guarded(lambda: d.launch(rows, None if num_rows is None else int(num_rows), num_accepted, stream))

    def commit_error(self) -> ErrorWord | None:
        """The error word of the last kernel commit, decoded (a synchronising read; request numbers
        are row indices of that commit's plan). ``None`` when commits do not run on the kernel. A
        commit run inside a ``ModelStateV2`` post-process reports into that adapter's
        ``last_error()`` instead."""
        d = self._device_commit
        if d is None:
            return None
        return d.error()

    # ---- copies & memory -----------------------------------------------------------------
    def reset_blocks(self, blocks: Any) -> None:
        """Zero every persistent state of ``blocks`` (all layers): a fresh request's running
        block. Values ``<= 0`` are skipped; blocks are checked by the core."""
        self.commit_planner.check_state_blocks(blocks)
        idx = torch.as_tensor(np.asarray(blocks), dtype=torch.long)
        idx = idx[idx > 0].to(self.device)

        def zero() -> None:
            self._conv[:, idx] = 0
            self._recurrent[:, idx] = 0

        self._bound.guarded(zero)

    def copy_blocks(self, src_blocks: Sequence[int] | Any, dst_blocks: Sequence[int] | Any) -> int:
        """Copy whole blocks (every persistent state of every layer): forks and prefix-cache hits,
        planned and checked by the copy planner. Returns the number of copies."""
        plan = self.planner.plan_copy(src_blocks, dst_blocks)
        # The planner holds per-layer views made at construction: a pool buffer re-pointed since
        # (``set_``) would leave them on the old memory, so the cache's buffers are checked too.
        self._bound.guarded(plan.execute)
        return len(plan)

    def memory_report(self) -> MemoryReport:
        """Persistent bytes per block, pool and workspace bytes, and the full-state scratch the
        same window would need."""
        l = self.num_layers
        per_block = self.layout.persistent_bytes_per_block * l
        records = self.layout.workspace_bytes_per_request * l
        conv_window = self._conv_window[0, 0].numel() * self._conv_window.element_size() * l
        ws_req = records + conv_window
        g = self.geometry
        rec_dtype = self.layout.states[g["recurrent_state"]].dtype
        full = (
            recurrence.full_state_scratch_bytes(
                int(g["heads"]), int(g["head_k_dim"]), int(g["head_v_dim"]), self.window, _torch_dtype(rec_dtype)
            )
            * l
            * self.max_requests
        )
        return MemoryReport(
            persistent_bytes_per_block=per_block,
            pool_bytes=per_block * self.num_blocks,
            workspace_bytes=ws_req * self.max_requests,
            workspace_bytes_per_request=ws_req,
            record_bytes_per_request=records,
            full_state_scratch_bytes=full,
            window=self.window,
        )

    def __repr__(self) -> str:
        return (
            f"StateCache({self.layout.backend!r}, kind={self.kind!r}, layers={self.num_layers}, "
            f"blocks={self.num_blocks}, max_requests={self.max_requests}, "
            f"window={self.window}, device={str(self.device)!r})"
        )
