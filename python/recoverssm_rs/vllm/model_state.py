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
host, no buffer of the adapter's is allocated after the first step (they are sized once), and no
Python runs per request, so both halves can run under asynchronous scheduling and inside a CUDA
graph capture (with fixed input tensors between replays).

Each half-step is exactly **one** launch of the package's kernel (``rs_state_copy_slots``) over
every state of every layer of every group, and no torch operation of the adapter's: the kernel
reads ``idx_mapping`` and the runner's counts itself and takes vLLM's bookkeeping (the pre-copy's
state advance and count reset, the post-process's count scatter) along with the copies (the
pre-copy with ``"pre_copy"`` semantics, the post-process decided on the device). The core checks
every input on the host (``_core.VllmSlotStep``); the kernel checks every (request, group) it
copies and reports into the step's error word (:meth:`ModelStateV2.last_error`): a refused row
(a bad slot, a slot two rows name, a decreasing ``query_start_loc``, a bad column or block) is
reported and nothing is written for it -- no state of any group, no column, no count. Everything runs on the current torch stream, in order
with the runner's own work. A batch row whose ``idx_mapping`` entry is ``-1`` (a row filtered out
under pipeline parallelism) is skipped by both halves. With RecoverSSM (:class:`RecoverSSMCommit`),
the post-process also commits the spec-decode rows into the package's
:class:`~recoverssm_rs.speculative.state_cache.StateCache` -- in the same launch on CUDA: the
commit is planned on the host when the step's metadata is built
(:meth:`ModelStateV2.stage_recoverssm`, its rows staged into a fixed buffer of the adapter's) and
the kernel reads each row's sampled count on the device -- and sets the committed rows' columns and
counts as vLLM's ``commit_step`` does.

vLLM itself is never imported: every vLLM object is read by attribute.
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
from ..errors import BackendUnavailableError, BindingError, PlanError
from ..placement import parse_device
from ..planner import Planner

__all__ = ["ModelStateV2", "RecoverSSMCommit"]

log = logging.getLogger("recoverssm_rs")


@dataclasses.dataclass
class RecoverSSMCommit:
    """A post-process's RecoverSSM commit (vLLM's ``RecoverSSMState.commit_step`` with its
    ``RecoverSSMPostprocessMetadata``): the spec-decode rows' accepted records folded into their
    running states by the package's :class:`~recoverssm_rs.speculative.StateCache` commit.

    The commit plan is built and checked by the core on the host (:meth:`ModelStateV2.stage_recoverssm`,
    when the step's metadata is built): ``request_indices``, ``state_blocks``,
    ``num_computed_tokens``, ``block_table`` and ``query_lens`` are read there (host tensors or
    arrays; device ones cost a synchronisation); the sampled counts stay on the device, read by
    the post-process's kernel. Staged before a CUDA graph's replay, the post-process with its
    commit replays as captured.

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
    """vLLM's ``MambaHybridModelState`` align-mode step for a planner of every mamba group.

    Args:
        planner: the planner of every mamba group (CUDA states, with vLLM's ``block_size``).
        group_ids: the vLLM KV-cache group id of each planner group, in planner order (the index
            into the runner's per-group block tables; checked by the core).
        max_num_reqs: the runner's request-state slots.
        device: where the slot buffers live (default: the planner's device).

    Most engines build it with :meth:`from_runner`.
    """

    def __init__(self, planner: Planner, group_ids: Sequence[int], max_num_reqs: int, *, device: Any = None) -> None:
        import torch

        if not isinstance(planner, Planner):
            raise BindingError(f"planner must be a Planner, got {type(planner).__name__}")
        if planner.block_size is None:
            raise PlanError("ModelStateV2 needs the planner's block_size (Planner(..., block_size=...))")
        super().__init__(planner)
        self.group_ids = _core.VllmSlotStep.check_group_ids(group_ids, planner.num_groups)
        self.max_num_reqs = m = _core.VllmSlots.check_capacity(max_num_reqs)
        self.block_size = int(planner.block_size)
        self.device = torch.device(parse_device(device if device is not None else planner.device).name)
        dev = self.device

        def vec(fill: int, n: int, dtype: Any = torch.int32) -> Any:
            try:
                return torch.full((n,), fill, dtype=dtype, device=dev)
            except RuntimeError as e:  # no usable device (torch's error, named here)
                raise BackendUnavailableError(f"ModelStateV2: cannot allocate its slot buffers on {dev}: {e}") from None

        self._state = vec(-1, m)
        self._acc = vec(1, m)
        self._scratch = vec(-1, 3 * m)  # a moved slot's old column, old count and stamp
        self._ctl = vec(0, _core.VllmSlotStep.CTL_WORDS)  # the stamp, the commit generations seen
        # the pre-copy's two words (by stamp parity), the post-process's, the last pre-copy's stamp
        self._err = vec(0, _core.VllmSlotStep.ERR_WORDS)
        self._tables = vec(0, 2 * planner.num_groups, torch.int64)  # TableRef records
        self._stage = vec(
            -1, _core.VllmSlotStep.commit_stage_len(m)
        )  # a staged RecoverSSM commit (the core keeps its plan)
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
        """Build the step from vLLM's model-runner objects, with the checks of
        :meth:`VllmMambaStep.from_runner <recoverssm_rs.vllm.VllmMambaStep.from_runner>` (the
        copy-function contract, shared scheduling parameters, align mode, every layer's tensors
        against its spec)."""
        from .step import VllmMambaStep

        step = VllmMambaStep.from_runner(
            kv_cache_config, forward_context, copy_funcs, max_num_reqs=max_num_reqs, conv_layout=conv_layout
        )
        return cls(step.planner, step.group_ids, max_num_reqs, device=device)

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

    def _core_step(self) -> Any:
        """The core's half-step builder, made once (the planner's device path prepared first)."""
        if self._step is None:
            self.planner.device_path("ModelStateV2")
            arg = ops.cuda_ops.launch_arg
            self._step = _core.VllmSlotStep(
                self.core,
                group_ids=self.group_ids,
                num_slots=self.max_num_reqs,
                state_idx=arg(self._state),
                num_accepted=arg(self._acc),
                scratch=arg(self._scratch),
                ctl=arg(self._ctl),
                err=arg(self._err),
                tables=arg(self._tables),
                commit=arg(self._stage),
            )
        return self._step

    def prepare_device(self) -> None:
        """Make the device path ready without running a step: the planner's state table uploaded,
        the kernel compiled and loaded on the states' device. Call it before capturing the
        half-steps in a CUDA graph (the first half-step does it otherwise, synchronising once);
        the first half-step still uploads the groups' table records, so capture from the second
        step on, or with tables at the same addresses as a step run before.

        Raises:
            PlanError: the planner is bound to host tensors.
            BackendUnavailableError: CuPy or a CUDA device is missing.
        """
        self._core_step()
        module.function_ptr("rs_state_copy_slots", self.cuda("ModelStateV2"))

    def _run(self, kl: Any, records: bytes | None, host_commit: Any) -> None:
        """The write of a half-step, run by the core inside its guarded call (after every check,
        before the write is recorded): a staged host-cache commit (the torch reference) first, the
        table records when a table moved (the first step), then the launch on the current torch
        stream."""
        if host_commit is not None:
            host_commit()
        if records is not None:
            import torch

            self._tables.copy_(torch.frombuffer(bytearray(records), dtype=torch.int64))
        module.launch(kl, self.placement.index, None)

    def preprocess_state(
        self,
        idx_mapping: Any,
        num_computed_tokens: Any,
        query_start_loc: Any,
        block_tables: Sequence[Any] | Mapping[int, Any],
    ) -> None:
        """vLLM's ``preprocess_state``: advance each scheduled slot's running column and move its
        state there across a block boundary, before the forward pass: one launch, the column and
        count updates included.

        Args:
            idx_mapping: ``[R]`` int32 tensor, batch row -> request-state slot (``-1``: skipped).
            num_computed_tokens: ``[max_num_reqs]`` int32 per-slot computed tokens before this step.
            query_start_loc: ``[>= R + 1]`` int32, the batch rows' token offsets.
            block_tables: indexed by vLLM KV-cache group id (a sequence or a mapping), the per-slot
                ``[>= max_num_reqs, cols]`` int32 table of each mamba group (other entries are not
                read); the groups' tables share one width.

        Per row with slot ``s``: the pre-copy moves ``state_idx[s] -> ceil((num_computed[s] +
        query_len) / block_size) - 1`` with offset ``num_accepted[s] - 1`` when the column changes
        and was ``>= 0``, and then the count resets to 1.

        A row with a slot below ``-1`` or ``>= max_num_reqs``, a slot another row names too (only
        ``-1`` may repeat), a decreasing ``query_start_loc``, a column outside the table or a block
        any group refuses is refused on the device: reported in :meth:`last_error`, and nothing is
        written for it (no state, column or count); the other rows run.
        """
        step = self._core_step()
        if self._last == "pre":  # a pre-copy without a post-process since the last: a new stamp
            self._ctl.add_(1)
            self._stamp += 1
            w = 3 * (self._stamp & 1)
            self._err[w : w + 3].zero_()
        arg = ops.cuda_ops.launch_arg
        step.pre(_tables(block_tables), arg(idx_mapping), arg(num_computed_tokens), arg(query_start_loc), self._run)
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
        """vLLM's ``postprocess_state`` in align mode: scatter this step's accepted counts to their
        slots, run the RecoverSSM commit (when given) and save the running state at the last block
        boundary the accepted tokens crossed: one launch (the count scatter included).

        Args:
            idx_mapping: ``[R]`` batch row -> slot (``-1`` rows, e.g. filtered under pipeline
                parallelism, are skipped).
            num_sampled: ``[R]`` int32 tokens sampled per row (0 for a chunked-prefill row: counted
                as 1), or one integer for every row.
            num_computed_tokens: ``[max_num_reqs]`` per-slot computed tokens **after** this step,
                or ``None`` as vLLM's pipeline-parallel ranks other than the last pass it: the
                counts are scattered (and a RecoverSSM commit runs) but no aligned save is made,
                as vLLM skips it.
            block_tables: as :meth:`preprocess_state`.
            recoverssm: the step's RecoverSSM commit (vLLM's ``commit_step``): ``True`` for the
                commit :meth:`stage_recoverssm` staged for this step (the post-process then plans
                and copies nothing on the host), or a :class:`RecoverSSMCommit` to stage now.
                ``recoverssm.cache`` commits each spec-decode row's ``num_sampled`` tokens (align
                mode: the boundary state goes to its ``block_table``); then, as vLLM does, that
                row's running column becomes ``min(max(num_computed + num_sampled - 1, 0) //
                block_size, cols - 1)`` and its count 1 (the state is already the accepted one; the
                commit's boundary write is its aligned save, and a committed row whose counts
                disagree -- ``num_computed_tokens`` after the step not the commit's tokens plus
                ``num_sampled`` -- is reported, not copied). With the cache's commit kernel (a
                CUDA cache) the commit runs inside this launch; on a host cache the torch reference
                commits first (inside the same guarded core call). Skipped when ``num_sampled`` is
                one integer for every row (vLLM's ``commit_step`` commits nothing then): the core
                forgets a staged commit, and the skip is logged.

        Raises:
            PlanError: a bad input (nothing is written), ``recoverssm=True`` with no commit
                staged since the last post-process, or a second post-process for one step (once a
                pre-copy has run, no :meth:`preprocess_state` since the last post-process: the
                windows are not saved again).
        """
        step = self._core_step()
        tables = _tables(block_tables)
        wanted = recoverssm is not None and recoverssm is not False
        commit = wanted and not isinstance(num_sampled, int)
        if wanted and not commit:
            log.debug("postprocess_state: num_sampled is one integer for every row: no RecoverSSM commit (as vLLM's)")
        if commit and isinstance(recoverssm, RecoverSSMCommit):
            self.stage_recoverssm(recoverssm)  # a refused plan leaves every buffer as it was
        arg = ops.cuda_ops.launch_arg
        sampled = num_sampled if isinstance(num_sampled, int) else arg(num_sampled)

        # One guarded core call: every check, then the writes (self._run), then the record.
        def run(kl: Any, records: bytes | None, reference: Any) -> None:
            # A host cache's reference commit (the stage's, handed back by the core) reads the
            # caller's own counts.
            self._run(kl, records, None if reference is None else functools.partial(reference, num_sampled))

        computed = None if num_computed_tokens is None else arg(num_computed_tokens)
        step.post(arg(idx_mapping), sampled, computed, tables, commit, run)
        self._last = "post"
        self._stamp += 1  # the kernel advanced the device's

    def stage_recoverssm(self, recoverssm: RecoverSSMCommit) -> None:
        """Plan the step's RecoverSSM commit and stage it for this step's :meth:`postprocess_state`
        (``recoverssm=True``): call it when the step's metadata is built, before the forward pass,
        and under a CUDA graph before replaying the captured post-process (every step, an empty
        commit too: a replay whose stage was not rewritten commits nothing). The core checks every
        input and plans each spec-decode row for its whole window (the kernel clamps the sampled
        count to it on the device); the rows, the per-row computed tokens and the stage's
        generation go to the adapter's stage buffer in one host-to-device copy. Not while a CUDA
        graph is being captured (the copy would be captured with it).

        Raises:
            PlanError: a bad request index, block, count or boundary, or a block written twice,
                naming the request, or a capture in progress; nothing is staged.
        """
        if _capturing():
            raise PlanError("stage_recoverssm: a CUDA graph is being captured; stage the commit before the capture")
        rs = recoverssm
        cache = rs.cache
        kernel = cache.fused_commit()
        step = self._core_step()
        generation = self._generation % (2**31 - 1) + 1
        raw = step.stage_commit(
            kernel,
            functools.partial(_reference_commit, rs, block_size=self.block_size),
            request_indices=rs.request_indices,
            state_blocks=rs.state_blocks,
            num_computed_tokens=rs.num_computed_tokens,
            block_table=rs.block_table,
            query_lens=rs.query_lens,
            window=cache.window,
            num_blocks=cache.num_blocks,
            max_requests=cache.max_requests,
            generation=generation,
        )
        try:
            ops.cuda_ops.stage_i32(raw, ops.cuda_ops.launch_arg(self._stage))
        except BaseException:
            step.clear_commit()  # forgotten by the core: recoverssm=True is refused until a new stage
            raise
        self._generation = generation

    def last_error(self) -> Any:
        """The step's error word (both halves since the last :meth:`preprocess_state`; rows are
        batch rows). **Synchronises** the device (for checks, not the loop)."""
        words = [int(x) for x in self._err.cpu().tolist()]
        pre = 3 * (words[9] & 1)  # the step's pre-copy word, as its kernel recorded it
        word = [words[pre] | words[6], max(words[pre + 1], words[7]), max(words[pre + 2], words[8])]
        return ErrorWord(word, self.max_num_reqs)

    def __repr__(self) -> str:
        return (
            f"ModelStateV2(groups={self.group_ids}, block_size={self.block_size}, "
            f"max_num_reqs={self.max_num_reqs}, device={self.device})"
        )


def _capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph."""
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


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


def _tables(block_tables: Any) -> Any:
    """The caller's per-group tables as the core reads them (each through
    :meth:`CudaOps.launch_arg <recoverssm_rs.cuda.ops.CudaOps.launch_arg>`)."""
    arg = ops.cuda_ops.launch_arg  # read at each call (a hook replaced after this module's import)
    if isinstance(block_tables, Mapping):
        return {g: arg(t) for g, t in block_tables.items()}
    if isinstance(block_tables, (list, tuple)):
        return [arg(t) for t in block_tables]
    return block_tables  # the core names what it cannot index
