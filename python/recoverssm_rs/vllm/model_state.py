"""The adapter for vLLM's GPU-resident model runner (``vllm/v1/worker/gpu/``): the align-mode
recurrent-state step of its ``MambaHybridModelState`` -- ``add_request``, ``preprocess_state`` and
``postprocess_state`` -- over every mamba group, with the runner's state kept on the device.

Like vLLM's runner, :class:`ModelStateV2` keeps its state in device buffers sized by
``max_num_reqs`` and indexed by the runner's **request-state slot** (not the batch row): the running
column per slot (vLLM's ``mamba_state_idx``) and the accepted count per slot (vLLM's
``num_accepted_tokens_gpu``, the vector the model's kernels read, :attr:`ModelStateV2.num_accepted`).
A batch reorder therefore needs no remapping: the slot carries the column and the count. A step
reads only the runner's device tensors (``idx_mapping``, the per-slot ``num_computed_tokens``,
``query_start_loc``, the sampled counts, the per-slot block tables): nothing is read back to the
host, no buffer of the adapter's is allocated after the first step (they are sized once; the torch
operations' temporaries come from torch's caching allocator), and no
Python runs per request, so both halves can run under asynchronous scheduling and inside a CUDA
graph capture (with fixed tensors between replays).

Per half-step the adapter updates its slot buffers with vectorised torch operations (vLLM's
state advance, its count scatter; about 25 small device operations in the pre-copy and 16 in the
post-process, counted as aten operations without views) and then launches the package's fused
copy kernel **once** over every state of every layer of every group, across all ``max_num_reqs``
slots (slots outside the batch are padding): the pre-copy with ``"pre_copy"`` semantics
(:meth:`~recoverssm_rs.Planner.launch`), the post-process decided on the device
(:meth:`~recoverssm_rs.Planner.launch_post_process`), which also writes the counts for the next
step. The kernel checks every (request, group) it copies and reports into the step's error word
(:meth:`ModelStateV2.last_error`). Everything runs on the current torch stream, in order with the
runner's own work. On a GPU the torch operations are kernels of their own: until
the kernel takes ``idx_mapping`` and the slot bookkeeping itself, a half-step launches more
kernels than vLLM's two to four. A batch row whose ``idx_mapping`` entry is ``-1`` (a row filtered
out under pipeline parallelism) is skipped by both halves. With RecoverSSM
(:class:`RecoverSSMCommit`), the post-process commits the spec-decode rows into the package's
:class:`~recoverssm_rs.recoverssm.state_cache.StateCache` between the count scatter and the copy
launch (one ``rs_recover_commit`` launch more on CUDA), as vLLM's ``commit_step`` does.

vLLM itself is never imported: every vLLM object is read by attribute.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from .. import _core
from ..errors import PlanError
from ..planner import Planner

__all__ = ["ModelStateV2", "RecoverSSMCommit"]

log = logging.getLogger("recoverssm_rs")


def _launch_arg(t: Any) -> Any:
    """A buffer as the launch receives it (the identity; the tests' seam for host-backed fakes)."""
    return t


@dataclasses.dataclass
class RecoverSSMCommit:
    """A post-process's RecoverSSM commit (vLLM's ``RecoverSSMState.commit_step`` with its
    ``RecoverSSMPostprocessMetadata``): the spec-decode rows' accepted records folded into their
    running states by the package's :class:`~recoverssm_rs.recoverssm.StateCache` commit.

    The commit plan is built and checked by the core on the host: ``request_indices``,
    ``state_blocks``, ``num_computed_tokens``, ``block_table`` and ``query_lens`` are read there
    (host tensors or arrays; device ones cost a synchronisation), the sampled counts stay on the
    device. The plan is staged per step, so a post-process with a commit is not CUDA-graph
    capturable (:meth:`StateCache.launch_commit
    <recoverssm_rs.recoverssm.state_cache.StateCache.launch_commit>` is the capturable form).

    Attributes:
        cache: the RecoverSSM layers' state cache (its kernel on CUDA, the torch reference on CPU).
        request_indices: ``[S]`` the batch rows of the spec-decode requests (vLLM's
            ``request_indices``).
        state_blocks: ``[S]`` each one's running block in ``cache`` (as given to verify).
        num_computed_tokens: ``[R]`` per batch row, the tokens in its state before this step's
            window (vLLM's ``postprocess_meta.num_computed_tokens``).
        block_table: ``[S, cols]`` each one's blocks in ``cache`` (the aligned boundary's target).
        query_lens: ``[S]`` tokens verified per request (default: the cache's whole window).
    """

    cache: Any
    request_indices: Any
    state_blocks: Any
    num_computed_tokens: Any
    block_table: Any
    query_lens: Any = None


class ModelStateV2:
    """vLLM's ``MambaHybridModelState`` align-mode step for a planner of every mamba group.

    Args:
        planner: the planner of every mamba group (CUDA states, with vLLM's ``block_size``).
        group_ids: the vLLM KV-cache group id of each planner group, in planner order (the index
            into the runner's per-group block tables).
        max_num_reqs: the runner's request-state slots.
        device: where the slot buffers live (default: the planner's device).

    Most engines build it with :meth:`from_runner`.
    """

    def __init__(self, planner: Planner, group_ids: Sequence[int], max_num_reqs: int, *, device: Any = None) -> None:
        import torch

        if planner.block_size is None:
            raise PlanError("ModelStateV2 needs the planner's block_size (Planner(..., block_size=...))")
        if len(group_ids) != planner.num_groups:
            raise PlanError(f"{len(group_ids)} group ids for a planner of {planner.num_groups} groups")
        self.planner = planner
        self.group_ids = [int(g) for g in group_ids]
        self.max_num_reqs = m = _core.VllmSlots.check_capacity(max_num_reqs)
        self.block_size = int(planner.block_size)
        self.device = torch.device(device if device is not None else planner.device)
        dev = self.device

        def vec(fill: int, n: int = m + 1) -> Any:
            return torch.full((n,), fill, dtype=torch.int32, device=dev)

        # One entry past the slots: the sink that rows with idx_mapping == -1 write to.
        self._state = vec(-1)
        self._acc = vec(1)
        self._src = vec(-1)
        self._bias_acc = vec(1)
        self._run = vec(0)
        self._acc_in = vec(1)
        self._err = vec(0, 3)
        self._table: Any = None  # int32 [groups, max_num_reqs, cols], sized on first use

    @classmethod
    def from_runner(
        cls,
        kv_cache_config: Any,
        forward_context: Mapping[str, Any],
        copy_funcs: Mapping[Any, Sequence[Any]],
        *,
        max_num_reqs: int,
        conv_layout: str | None = None,
        device: Any = None,
    ) -> ModelStateV2:
        """Build the step from vLLM's model-runner objects, with the checks of
        :meth:`VllmMambaStep.from_runner <recoverssm_rs.vllm.VllmMambaStep.from_runner>` (the
        copy-function contract, shared scheduling parameters, align mode, every layer's tensors
        against its spec)."""
        from .step import VllmMambaStep

        step = VllmMambaStep.from_runner(
            kv_cache_config, forward_context, copy_funcs, max_num_reqs=max_num_reqs, conv_layout=conv_layout
        )
        return cls(step.planner, step._group_ids, max_num_reqs, device=device)

    # --------------------------------------------------------------------------------------------
    # What the model's kernels read
    # --------------------------------------------------------------------------------------------

    @property
    def num_accepted(self) -> Any:
        """The per-slot accepted counts (vLLM's ``num_accepted_tokens_gpu``), int32 ``[max_num_reqs]``."""
        return self._acc[: self.max_num_reqs]

    @property
    def state_idx(self) -> Any:
        """The per-slot running columns (vLLM's ``mamba_state_idx``; ``-1``: none), int32 ``[max_num_reqs]``."""
        return self._state[: self.max_num_reqs]

    # --------------------------------------------------------------------------------------------
    # The step
    # --------------------------------------------------------------------------------------------

    def add_request(self, slot: int, num_computed_tokens: int) -> None:
        """A new or resumed request in ``slot``: its count becomes 1 and its running column
        ``(num_computed_tokens - 1) // block_size`` (``-1`` for a fresh request; a prefix-cache hit
        or a resumed request names the column holding its state, moved by the next pre-copy)."""
        s = _core.check_index("slot", slot, self.max_num_reqs)
        nct = _core.check_index(f"slot {s}: num_computed_tokens", num_computed_tokens, 1 << 31)
        self._acc[s] = 1
        self._state[s] = (nct - 1) // self.block_size

    def _slots(self, idx_mapping: Any) -> Any:
        import torch

        n = int(idx_mapping.shape[0])
        if n > self.max_num_reqs:
            raise PlanError(f"{n} batch rows, more than max_num_reqs = {self.max_num_reqs}")
        return torch.where(idx_mapping >= 0, idx_mapping, self.max_num_reqs).long()

    def _tables(self, block_tables: Sequence[Any] | Mapping[int, Any]) -> Any:
        """The groups' per-slot tables as the kernel reads them: one group's int32 table itself (a
        view of its first ``max_num_reqs`` rows), else the adapter's ``[groups, max_num_reqs, cols]``
        buffer, rewritten from the groups' tables (a device copy of every table per half-step)."""
        import torch

        tabs = [block_tables[g] for g in self.group_ids]
        _core.check_device_tables(
            device=self.planner.device,
            tables=[_launch_arg(t) for t in tabs],
            groups=self.planner.num_groups,
            rows=self.max_num_reqs,
        )
        if len(tabs) == 1 and tabs[0].dtype == torch.int32:
            return tabs[0][: self.max_num_reqs]
        cols = max(int(t.shape[1]) for t in tabs)
        if self._table is None or self._table.shape[2] != cols:
            self._table = torch.zeros((len(tabs), self.max_num_reqs, cols), dtype=torch.int32, device=self.device)
        for g, t in enumerate(tabs):
            self._table[g, :, : t.shape[1]].copy_(t[: self.max_num_reqs])
        return self._table

    def preprocess_state(
        self,
        idx_mapping: Any,
        num_computed_tokens: Any,
        query_start_loc: Any,
        block_tables: Sequence[Any] | Mapping[int, Any],
    ) -> None:
        """vLLM's ``preprocess_state``: advance each scheduled slot's running column and move its
        state there across a block boundary, before the forward pass.

        Args:
            idx_mapping: ``[R]`` int tensor, batch row -> request-state slot (``-1``: skipped).
            num_computed_tokens: ``[max_num_reqs]`` per-slot computed tokens before this step.
            query_start_loc: ``[>= R + 1]`` the batch rows' token offsets.
            block_tables: indexed by vLLM KV-cache group id (a sequence or a mapping), the per-slot
                ``[>= max_num_reqs, cols]`` int32 table of each mamba group (other entries are not
                read); the groups' tables share one width.

        Per row with slot ``s``: the pre-copy moves ``state_idx[s] -> ceil((num_computed[s] +
        query_len) / block_size) - 1`` with offset ``num_accepted[s] - 1`` when the column changes
        and was ``>= 0``, and then the count resets to 1.
        """
        import torch

        n = int(idx_mapping.shape[0])
        slot = self._slots(idx_mapping)
        self._err.zero_()  # the step's word: the post-process ORs into it too
        if n == 0:
            return
        m = self.max_num_reqs
        old = self._state[slot]
        acc = self._acc[slot]
        qlen = query_start_loc[1 : n + 1] - query_start_loc[:n]
        nct = num_computed_tokens[slot.clamp(max=m - 1)]
        new = torch.div(nct + qlen + (self.block_size - 1), self.block_size, rounding_mode="floor") - 1
        new = new.to(torch.int32)
        moves = (old >= 0) & (old != new)
        self._src.fill_(-1)
        self._src[slot] = torch.where(moves, old, -1).to(torch.int32)
        self._bias_acc[slot] = acc.clamp(min=1)
        self._acc[slot] = torch.where(moves, 1, acc).to(torch.int32)
        self._state[slot] = new
        self.planner.launch(
            _launch_arg(self._tables(block_tables)),
            _launch_arg(self._src[:m]),
            _launch_arg(self._state[:m]),
            _launch_arg(self._bias_acc[:m]),
            semantics="pre_copy",
            err=_launch_arg(self._err),
        )

    def postprocess_state(
        self,
        idx_mapping: Any,
        num_sampled: Any,
        num_computed_tokens: Any,
        block_tables: Sequence[Any] | Mapping[int, Any],
        *,
        recoverssm: RecoverSSMCommit | None = None,
    ) -> None:
        """vLLM's ``postprocess_state`` in align mode: scatter this step's accepted counts to their
        slots, run the RecoverSSM commit (when given) and save the running state at the last block
        boundary the accepted tokens crossed.

        Args:
            idx_mapping: ``[R]`` batch row -> slot (``-1`` rows, e.g. filtered under pipeline
                parallelism, are skipped).
            num_sampled: ``[R]`` tokens sampled per row (0 for a chunked-prefill row: counted as
                1), or one integer for every row.
            num_computed_tokens: ``[max_num_reqs]`` per-slot computed tokens **after** this step.
            block_tables: as :meth:`preprocess_state`.
            recoverssm: the step's RecoverSSM commit (vLLM's ``commit_step``). After the count
                scatter, ``recoverssm.cache`` commits each spec-decode row's ``num_sampled``
                tokens (align mode: the boundary state goes to its ``block_table``); then, as
                vLLM does, that row's running column becomes ``min(max(num_computed + num_sampled
                - 1, 0) // block_size, cols - 1)`` and its count 1 (the state is already the
                accepted one), before the aligned post-copy. Skipped when ``num_sampled`` is one
                integer for every row (vLLM's ``commit_step`` commits nothing then). On CUDA the
                commit is one ``rs_recover_commit`` launch: a post-process with it is two launches.
        """
        import torch

        n = int(idx_mapping.shape[0])
        slot = self._slots(idx_mapping)
        m = self.max_num_reqs
        # The commit reads num_sampled, not the scattered counts: run first, a refused plan
        # leaves every buffer as it was.
        after = None
        if recoverssm is not None and not isinstance(num_sampled, int):
            after = self._commit_recoverssm(recoverssm, slot, num_sampled)
        if n:
            if isinstance(num_sampled, int):
                self._acc.index_fill_(0, slot, max(num_sampled, 1))
            else:
                self._acc[slot] = num_sampled[:n].clamp(min=1).to(torch.int32)
        if after is not None:  # vLLM's commit_step bookkeeping, after the scatter
            s, col = after
            self._state[s] = col
            self._acc[s] = 1
        if n == 0:
            return
        self._acc_in.copy_(self._acc)  # the kernel reads a snapshot and writes the counts back
        self._src.fill_(-1)
        self._src[slot] = self._state[slot]
        self._run[slot] = (num_computed_tokens[slot.clamp(max=m - 1)] - self._acc[slot] + 1).to(torch.int32)
        self.planner.launch_post_process(
            _launch_arg(self._tables(block_tables)),
            _launch_arg(self._src[:m]),
            _launch_arg(self._run[:m]),
            _launch_arg(self._acc_in[:m]),
            err=_launch_arg(self._err),
            num_accepted_out=_launch_arg(self._acc[:m]),
        )

    def _commit_recoverssm(self, rs: RecoverSSMCommit, slot: Any, num_sampled: Any) -> tuple[Any, Any] | None:
        """The RecoverSSM commit of the spec-decode rows; returns their slots and new columns."""
        import torch

        rows = torch.as_tensor(rs.request_indices).long()
        if int(rows.shape[0]) == 0:
            return None
        all_computed = torch.as_tensor(rs.num_computed_tokens)
        n = int(all_computed.shape[0])
        for end in (int(rows.min()), int(rows.max())):  # the core's range rule, at both ends
            _core.check_index("request_indices", end, n)
        computed = all_computed[rows.to(all_computed.device)]  # where given: the planner reads it
        rows_dev = rows.to(num_sampled.device, non_blocking=True)
        sampled = num_sampled[rows_dev]  # the counts stay on the device
        rs.cache.commit(
            sampled,
            rs.state_blocks,
            rs.query_lens,
            seq_lens=computed,
            block_table=rs.block_table,
            block_size=self.block_size,
        )
        last = int(rs.block_table.shape[1]) - 1
        total = computed.to(sampled.device, non_blocking=True) + sampled - 1
        col = torch.div(total.clamp(min=0), self.block_size, rounding_mode="floor")
        return slot[rows_dev], col.clamp(max=last).to(torch.int32)  # a -1 row: the sink

    def last_error(self) -> Any:
        """The step's error word (both halves since the last :meth:`preprocess_state`).
        **Synchronises** the device (for checks, not the loop)."""
        from .. import cuda

        return cuda.decode_error_word(self._err.cpu(), self.max_num_reqs)

    def __repr__(self) -> str:
        return (
            f"ModelStateV2(groups={self.group_ids}, block_size={self.block_size}, "
            f"max_num_reqs={self.max_num_reqs}, device={self.device})"
        )
