"""vLLM's GPU-resident model runner (``vllm/v1/worker/gpu/``): :class:`ModelStateV2` runs the
align-mode step of its ``MambaHybridModelState`` (``add_request``, ``preprocess_state``,
``postprocess_state``, with the RecoverSSM commit of :class:`RecoverSSMCommit`) over every mamba
group, one launch of ``rs_state_copy_slots`` per half-step, every input checked by the core
(``_core.VllmSlotStep``), nothing read back to the host. What each half does, the request-index
buffers, refused rows and the commit: docs/design.md section 3.9. vLLM itself is never imported.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from .. import _core
from .._core import ErrorWord
from ..cuda import module, ops
from ..engine import EngineAdapter
from ..errors import BackendUnavailableError, BindingError, PlanError, _reading
from ..placement import parse_device
from ..planner import Planner
from .step import VllmMambaStep

__all__ = ["ModelStateV2", "RecoverSSMCommit"]

log = logging.getLogger("recoverssm_rs")

_BUFFERS = ("state_idx", "num_accepted", "scratch", "ctl", "err", "tables", "commit")  # the core's names, its order


@dataclasses.dataclass
class RecoverSSMCommit:
    """A post-process's RecoverSSM commit (vLLM's ``RecoverSSMState.commit_step`` with its
    ``RecoverSSMPostprocessMetadata``), planned by the core on the host
    (:meth:`ModelStateV2.stage_recoverssm`; host inputs, device ones cost a synchronisation).
    Field names are vLLM's.

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


class ModelStateV2(EngineAdapter):
    """vLLM's ``MambaHybridModelState`` align-mode step; most engines build it with :meth:`from_runner`.

    Args:
        planner: the planner of every mamba group (CUDA states, with vLLM's ``block_size``).
        group_ids: the vLLM KV-cache group id of each planner group, in planner order.
        max_num_reqs: the runner's request indices (the size of the per-request buffers).
        device: where the per-request buffers live (default: the planner's device).
    """

    def __init__(self, planner: Planner, group_ids: Sequence[int], max_num_reqs: int, *, device: Any = None) -> None:
        if not isinstance(planner, Planner):
            raise BindingError(f"planner must be a Planner, got {type(planner).__name__}")
        # The arguments checked and the per-request buffers sized by the core (its buffer_specs).
        self.group_ids, m, self.block_size, sizes = _core.VllmSlotStep.buffers(planner.core, group_ids, max_num_reqs)
        super().__init__(planner)
        self.max_num_reqs = m
        self.device = dev = ops.cuda_ops.torch().device(
            parse_device(device if device is not None else planner.device).name
        )
        try:
            bufs = ops.cuda_ops.filled(sizes, dev)
        except RuntimeError as e:  # no usable device (torch's error, named here)
            raise BackendUnavailableError(
                f"ModelStateV2: cannot allocate its per-request buffers on {dev}: {e}"
            ) from None
        self._state, self._acc, self._scratch, self._ctl, self._err, self._tables, self._stage = bufs
        self._generation = 0  # the last stage's generation
        self._step: Any = None  # the core's VllmSlotStep, made at the first half-step
        self._last = "post"  # the half that ran last
        self._stamp = 0  # the host's mirror of the device stamp

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
        """Build the step from vLLM's model-runner objects, as (and with the checks of)
        :meth:`VllmMambaStep.from_runner <recoverssm_rs.vllm.VllmMambaStep.from_runner>`."""
        step = VllmMambaStep.from_runner(
            kv_cache_config, forward_context, copy_funcs, max_num_reqs=max_num_reqs, conv_layout=conv_layout
        )
        return cls(step.planner, step.group_ids, max_num_reqs, device=device)

    @property
    def num_accepted(self) -> Any:
        """The accepted count per request index (vLLM's ``num_accepted_tokens_gpu``), int32."""
        return self._acc[: self.max_num_reqs]

    @property
    def state_idx(self) -> Any:
        """The running column per request index (vLLM's ``mamba_state_idx``; ``-1``: none), int32."""
        return self._state[: self.max_num_reqs]

    def add_request(self, slot: int, num_computed_tokens: int) -> None:
        """A new or resumed request at request index ``slot`` (the keyword kept for compatibility):
        its accepted count becomes 1 and its running column ``(num_computed_tokens - 1) //
        block_size`` (docs/design.md section 3.9)."""
        s, column = _core.VllmSlotStep.new_request(slot, num_computed_tokens, self.max_num_reqs, self.block_size)
        self._acc[s] = 1
        self._state[s] = column

    def _core_step(self) -> Any:
        """The core's half-step builder, made once (the planner's device path prepared first)."""
        if self._step is None:
            self.planner.device_path("ModelStateV2")
            bufs = (self._state, self._acc, self._scratch, self._ctl, self._err, self._tables, self._stage)
            kw = {k: ops.cuda_ops.launch_arg(b) for k, b in zip(_BUFFERS, bufs)}
            self._step = _core.VllmSlotStep(self.core, group_ids=self.group_ids, num_slots=self.max_num_reqs, **kw)
        return self._step

    def prepare_device(self) -> None:
        """Make the device path ready without running a step (state table uploaded, kernel loaded):
        call it before capturing the half-steps in a CUDA graph; capture from the second step on
        (the first uploads the groups' table records).

        Raises:
            PlanError: the planner is bound to host tensors.
            BackendUnavailableError: CuPy or a CUDA device is missing.
        """
        self._core_step()
        module.function_ptr("rs_state_copy_slots", self.cuda("ModelStateV2"))

    def _run(self, kl: Any, records: bytes | None) -> None:
        """A half-step's write, run by the core inside its guarded call (after a host cache's
        reference commit): the table records when a table moved, then the launch on the current
        stream."""
        if records is not None:
            ops.cuda_ops.copy_i64(records, self._tables)
        module.launch(kl, self.placement.index, None)

    def _restamp(self, kl: Any, records: bytes | None) -> None:
        """:meth:`_run` of a pre-copy after a pre-copy (no post-process between): a new stamp and
        its error words cleared first, in the guarded write (a refused call changes neither)."""
        self._ctl.add_(1)
        self._stamp += 1
        w = 3 * (self._stamp & 1)
        self._err[w : w + 3].zero_()
        self._run(kl, records)

    def preprocess_state(
        self,
        idx_mapping: Any,
        num_computed_tokens: Any,
        query_start_loc: Any,
        block_tables: Sequence[Any] | Mapping[int, Any],
    ) -> None:
        """vLLM's ``preprocess_state`` (docs/design.md section 3.9): one launch. A refused row is
        reported in :meth:`last_error` and nothing is written for it.

        Args:
            idx_mapping: ``[R]`` int32, batch row -> request index (``-1``: skipped).
            num_computed_tokens: ``[max_num_reqs]`` int32 computed tokens per request index.
            query_start_loc: ``[>= R + 1]`` int32, the batch rows' token offsets.
            block_tables: by vLLM KV-cache group id (a sequence or a mapping), each mamba group's
                ``[>= max_num_reqs, cols]`` int32 table; the groups' tables share one width.
        """
        step = self._step or self._core_step()
        # One guarded core call: every check (each tensor through the launch-argument hook, read
        # at each call), then the writes (a new stamp first after a pre-copy: self._restamp), then
        # the record.
        run = self._restamp if self._last == "pre" else self._run
        step.pre(block_tables, idx_mapping, num_computed_tokens, query_start_loc, run, ops.cuda_ops.launch_arg)
        self._last = "pre"

    def postprocess_state(
        self,
        idx_mapping: Any,
        num_sampled: Any,
        num_computed_tokens: Any,
        block_tables: Sequence[Any] | Mapping[int, Any],
        *,
        recoverssm: RecoverSSMCommit | bool | None = None,
    ) -> None:
        """vLLM's ``postprocess_state`` in align mode (docs/design.md section 3.9): the accepted
        counts scattered, the RecoverSSM commit (when given) and the aligned save, in one launch.

        Args:
            idx_mapping: ``[R]`` batch row -> request index (``-1``: skipped).
            num_sampled: ``[R]`` int32 tokens sampled per row (vLLM's name; 0 counts as 1), or one
                integer for every row (then no RecoverSSM commit, as vLLM's).
            num_computed_tokens: ``[max_num_reqs]`` computed tokens per request index **after**
                this step, or ``None`` (vLLM's non-last pipeline-parallel ranks: no aligned save).
            block_tables: as :meth:`preprocess_state`.
            recoverssm: ``True`` for the commit :meth:`stage_recoverssm` staged for this step, or a
                :class:`RecoverSSMCommit` to stage now.

        Raises:
            PlanError: a bad input (nothing is written), ``recoverssm=True`` with nothing staged,
                a second post-process for one step, or a post-process before any pre-copy.
        """
        step = self._step or self._core_step()
        commit = recoverssm is not None and recoverssm is not False
        if commit and isinstance(num_sampled, int):
            log.debug("postprocess_state: num_sampled is one integer for every row: no RecoverSSM commit (as vLLM's)")
            commit = False
        elif commit and not isinstance(recoverssm, (bool, type(None))):
            self.stage_recoverssm(recoverssm)  # a refused plan (or not a commit) leaves every buffer as it was
        # As preprocess_state's, a staged host commit run first (reference(num_sampled), by the core).
        step.post(
            idx_mapping, num_sampled, num_computed_tokens, block_tables, commit, self._run, ops.cuda_ops.launch_arg
        )
        self._last = "post"
        self._stamp += 1  # the kernel advanced the device's

    def stage_recoverssm(self, recoverssm: RecoverSSMCommit) -> None:
        """Plan the step's RecoverSSM commit (checked by the core) and stage it, in one host-to-device
        copy, for this step's ``postprocess_state(..., recoverssm=True)``: when the step's metadata
        is built, and under a CUDA graph before every replay; never during a capture
        (docs/design.md section 3.9).

        Raises:
            PlanError: a bad request index, block, count or boundary, or a block written twice,
                naming the request, ``recoverssm`` without a commit's fields or its cache, or a
                capture in progress; nothing is staged.
        """
        if ops.cuda_ops.capturing():
            raise PlanError("stage_recoverssm: a CUDA graph is being captured; stage the commit before the capture")
        # The commit's fields read once, here: the reference commit of a host cache runs on these
        # (the checked and staged values), whatever becomes of the caller's object before the post.
        with _reading("recoverssm", PlanError):
            cache = recoverssm.cache
            values = {f.name: getattr(recoverssm, f.name) for f in dataclasses.fields(RecoverSSMCommit)}
        with _reading("recoverssm.cache (a RecoverSSM state cache)", PlanError):
            kernel = cache.fused_commit()
            shape = {"window": cache.window, "num_blocks": cache.num_blocks, "max_requests": cache.max_requests}
        step = self._core_step()
        generation = self._generation % (2**31 - 1) + 1
        staged = RecoverSSMCommit(**values)
        del values["cache"]
        raw = step.stage_commit(
            kernel,
            functools.partial(_reference_commit, staged, block_size=self.block_size),
            generation=generation,
            **shape,
            **values,  # the commit's fields are the core's keywords
        )
        try:
            ops.cuda_ops.stage_i32(raw, ops.cuda_ops.launch_arg(self._stage))
        except BaseException:
            step.clear_commit()  # forgotten by the core: recoverssm=True is refused until a new stage
            raise
        self._generation = generation

    def last_error(self) -> Any:
        """The step's error word (both halves; rows are batch rows). **Synchronises** the device."""
        return ErrorWord(_core.VllmSlotStep.step_word(self._err.cpu().tolist()), self.max_num_reqs)

    def __repr__(self) -> str:
        return (
            f"ModelStateV2(groups={self.group_ids}, block_size={self.block_size}, "
            f"max_num_reqs={self.max_num_reqs}, device={self.device})"
        )


def _reference_commit(rs: RecoverSSMCommit, num_sampled: Any, *, block_size: int) -> None:
    """The torch reference commit of a host cache (the kernel's work on CUDA caches)."""
    import torch

    rows = torch.as_tensor(rs.request_indices).long()
    if int(rows.shape[0]) == 0:
        return
    computed = torch.as_tensor(rs.num_computed_tokens)[rows]
    rs.cache.commit(
        num_sampled[rows.to(num_sampled.device)],
        rs.state_blocks,
        rs.query_lens,
        seq_lens=computed,
        block_table=rs.block_table,
        block_size=block_size,
    )
