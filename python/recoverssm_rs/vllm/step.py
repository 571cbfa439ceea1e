"""vLLM's V1 model runner, align mode: :class:`VllmMambaStep` runs vLLM's ``preprocess_mamba`` and
``postprocess_mamba_align_gpu`` for every mamba group in two calls per step, on the host executor
(CPU states) or as one fused launch per half-step (CUDA states, :class:`DeviceStep`). What each half
decides and copies, and where it differs from vLLM: docs/design.md sections 3.6 and 3.8. vLLM itself
is never imported: every object is read by attribute.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import numpy as np

from .. import _core
from .._core import Layout, VllmSlots
from ..contract import copy_func_name, validate_copy_funcs
from ..engine import EngineAdapter
from ..errors import BindingError, LayoutError, PlanError, _reading
from ..plan_format import records
from ..planner import Planner
from .decide import PostProcessDecision, PostProcessInputs, PreCopyDecision, PreCopyInputs, plan
from .device_step import DeviceStep

__all__ = ["VllmMambaStep", "mamba_groups", "copy_kind"]

log = logging.getLogger("recoverssm_rs")


def _name(x: Any) -> str:
    """An enum member's name, or the string itself."""
    if isinstance(x, str):
        return x
    n = getattr(x, "name", None)
    return n if isinstance(n, str) else str(x)


def copy_kind(func: Any) -> Literal["conv", "temporal"]:
    """``"conv"`` or ``"temporal"`` for a copy function: vLLM's copy-spec functions are recognised
    by what they do (:func:`~recoverssm_rs.contract.copy_func_name`), names and kinds by the core's
    table (``"get_conv_copy_spec"``, ``"temporal"``, ...).

    Raises:
        LayoutError: neither a conv nor a temporal copy.
    """
    return _core.copy_func_kind(copy_func_name(func))


def mamba_groups(kv_cache_config: Any) -> list[tuple[int, Any, list[str]]]:
    """vLLM's mamba groups as ``(group id, spec, layer names)``, sorted by group id; a group whose
    layers use several specs gives one entry per spec. A spec is recognised by its ``mamba_type``
    and ``shapes``; attention groups are skipped. Read by the core (``_core.vllm_mamba_groups``):
    no mamba group, or a config it cannot read, is a :class:`~recoverssm_rs.LayoutError`."""
    return _core.vllm_mamba_groups(kv_cache_config)


def _spec_record(gid: int, spec: Any) -> tuple[Any, ...]:
    """A mamba spec's fields as the core reads them (``vllm_runner_groups``, which converts the
    shapes, dtypes and sizes and names a bad one); a field missing is a LayoutError naming it."""
    with _reading(f"group {gid}: kv_cache_spec", LayoutError):
        kind = (_name(spec.mamba_type), _name(spec.mamba_cache_mode))
        return (*kind, spec.shapes, spec.dtypes, spec.num_speculative_blocks, spec.block_size)


def _block_table(input_batch: Any, gid: int, n: int) -> Any:
    bt = input_batch.block_table[gid]
    arr = bt.get_numpy_array() if hasattr(bt, "get_numpy_array") else getattr(bt, "block_table", bt)
    return getattr(arr, "np", arr)[:n]


class VllmMambaStep(EngineAdapter):
    """vLLM's align-mode recurrent-state step for every mamba group, in two calls per step
    (:meth:`preprocess`, :meth:`postprocess`); most engines build it with :meth:`from_runner`.

    Args:
        groups: per planner group ``(vLLM group id, layout, states)``; ``states[layer]`` lists that
            layer's ``kv_cache`` tensors (the leading ``len(layout.persistent)`` are bound).
        block_size, num_spec_blocks: the groups' shared scheduling parameters.
        max_num_reqs: the number of request indices (rows of ``mamba_state_idx``).
        device_tables: CUDA states only: the kernel reads the batch's device block tables instead
            of staged host tables (for wide tables; they must equal the host tables).
    """

    def __init__(
        self,
        groups: Sequence[tuple[int, Layout, Sequence[Sequence[Any]]]],
        *,
        block_size: int,
        num_spec_blocks: int,
        max_num_reqs: int,
        device_tables: bool = False,
    ) -> None:
        self._slots_table = VllmSlots(max_num_reqs)
        self._group_ids, pairs = _core.vllm_step_groups(groups)
        super().__init__(Planner.from_groups(pairs, block_size=block_size))
        _core.check_vllm_step(self.core, num_spec_blocks)
        self.device_step = DeviceStep(self.planner, max_num_reqs) if self.placement.is_cuda else None
        """The device path's launches (CUDA states), else ``None``."""
        self._device_tables = bool(device_tables) and self.device_step is not None
        self.mamba_state_idx = np.full(self._slots_table.capacity, -1, dtype=np.int64)
        """vLLM's ``mamba_state_idx``: the running column per request index (``-1``: none)."""
        # The step preprocess prepared (the counts still to come) and its device tables.
        self._step: tuple[PostProcessInputs, Any] | None = None

    @classmethod
    def from_runner(
        cls,
        kv_cache_config: Any,
        forward_context: Mapping[str, Any],
        copy_funcs: Mapping[Any, Sequence[Any]],
        *,
        max_num_reqs: int,
        conv_layout: str | None = None,
        device_tables: bool = False,
    ) -> VllmMambaStep:
        """Build the step from vLLM's model-runner objects: ``kv_cache_config`` (its mamba groups),
        ``forward_context`` (layer name -> an object with ``kv_cache``), ``copy_funcs`` (vLLM's
        ``MambaStateCopyFuncsByType``); ``conv_layout`` defaults to
        ``$VLLM_SSM_CONV_STATE_LAYOUT`` or ``"SD"``.

        Raises:
            LayoutError: the copy-function contract check fails (``validate_copy_funcs``), groups
                disagree on scheduling parameters, or the mode is not ``"align"``.
            BindingError: a layer's tensors do not match its spec (group, layer and state named).
        """
        layout_name = str(conv_layout or os.environ.get("VLLM_SSM_CONV_STATE_LAYOUT") or "SD").upper()
        found = mamba_groups(kv_cache_config)
        validate_copy_funcs([spec for _, spec, _ in found], copy_funcs)
        by_type = {_name(k): [copy_func_name(f) for f in v] for k, v in copy_funcs.items()}

        def kv_cache(gid: int, layer: str) -> list[Any] | None:
            with _reading(f"group {gid}, layer {layer!r}: forward_context", BindingError):
                return list(forward_context[layer].kv_cache) if layer in forward_context else None

        record = [
            (gid, _spec_record(gid, spec), by_type[_name(spec.mamba_type)], [(ly, kv_cache(gid, ly)) for ly in layers])
            for gid, spec, layers in found
        ]
        groups, bs, num_spec = _core.vllm_runner_groups(record, layout_name)
        return cls(
            groups, block_size=bs, num_spec_blocks=num_spec, max_num_reqs=max_num_reqs, device_tables=device_tables
        )

    @property
    def group_ids(self) -> list[int]:
        """The vLLM KV-cache group id of each planner group, in planner order."""
        return list(self._group_ids)

    def release(self, req_ids: Iterable[str]) -> None:
        """Forget finished / preempted / resumed requests (their request indices are freed)."""
        self.mamba_state_idx[self._slots_table.release(req_ids)] = -1

    def tables(self, input_batch: Any, n: int) -> list[Any]:
        """The batch's block table of each planner group (first ``n`` rows)."""
        return [_block_table(input_batch, gid, n) for gid in self._group_ids]

    def device_tables(self, input_batch: Any, n: int) -> list[Any]:
        """The batch's device block table of each planner group (vLLM's ``get_device_tensor(n)``)."""
        return [input_batch.block_table[gid].get_device_tensor(n) for gid in self._group_ids]

    def last_error(self) -> Any:
        """Device path: the step's error word (:meth:`DeviceStep.last_error`; synchronises)."""
        if self.device_step is None:
            raise PlanError("last_error is the device path's report; the host path raises PlanError on a bad step")
        return self.device_step.last_error()

    def pre_copy(
        self,
        block_tables: Sequence[Any],
        slots: Any,
        num_computed: Any,
        num_scheduled: Any,
        num_accepted: Any,
        *,
        fresh: Any = None,
        req_ids: Sequence[str] | None = None,
    ) -> PreCopyDecision:
        """The array form of :meth:`preprocess` (host path): decide, copy, store the new running
        columns at the request indices ``slots``; returns the decision."""
        slots = np.asarray(self._slots_table.check(slots, req_ids), dtype=np.int64)
        idx = self.mamba_state_idx[slots]
        step = PreCopyInputs(block_tables, num_computed, num_scheduled, num_accepted, idx, fresh, req_ids)
        d: PreCopyDecision = self._execute(step, "pre_copy")
        self.mamba_state_idx[slots] = d.curr
        return d

    def post_process(
        self,
        block_tables: Sequence[Any],
        state_col: Any,
        num_computed: Any,
        num_scheduled: Any,
        num_draft: Any,
        num_accepted: Any,
        *,
        req_ids: Sequence[str] | None = None,
    ) -> PostProcessDecision:
        """The array form of :meth:`postprocess` (host path): decide and copy; returns the decision."""
        step = PostProcessInputs(block_tables, state_col, num_computed, num_scheduled, num_draft, num_accepted, req_ids)
        d: PostProcessDecision = self._execute(step, "post_process")
        return d

    def _execute(self, step: PreCopyInputs | PostProcessInputs, what: str = "preprocess") -> Any:
        """The host path: decide and copy (``what``: the caller's name, refused on CUDA states)."""
        d, copies = plan(self.planner, step, host_only=what)
        copies.execute()
        return d

    def preprocess(
        self,
        scheduler_output: Any,
        input_batch: Any,
        requests: Mapping[str, Any],
        *,
        num_accepted: Any = None,
        prev_rows: Any = None,
        stream: Any = None,
    ) -> Any:
        """vLLM's ``preprocess_mamba`` (with ``stage_postprocess_inputs_to_gpu``'s bookkeeping).

        Args:
            scheduler_output, input_batch, requests: vLLM's (read by attribute).
            num_accepted: the previous step's accepted counts per batch row (vLLM's name); default
                ``input_batch.num_accepted_tokens_cpu``; a CUDA tensor stays on the device.
            prev_rows: device path, instead of ``num_accepted``: each batch row's row in the
                previous step (``-1``: new); the last :meth:`postprocess` counts are remapped.
            stream: the device path's stream (``None``: the current torch stream).

        Returns:
            The accepted counts after the reset per batch row: host path an int64 array (also
            written into ``input_batch.num_accepted_tokens_cpu``), device path an int32 CUDA tensor.

        Raises:
            PlanError: naming the request; nothing changes.
        """
        self._step = None  # a rejected step leaves nothing for postprocess
        # vLLM's objects are read first: one of the wrong kind is a PlanError naming it, before
        # anything changes.
        with _reading("scheduler_output", PlanError):
            so, cached = scheduler_output, scheduler_output.scheduled_cached_reqs
            sched, spec = so.num_scheduled_tokens, so.scheduled_spec_decode_tokens
            pre, res = getattr(so, "preempted_req_ids", None), getattr(cached, "resumed_req_ids", None)
            released = [
                ("scheduler_output.finished_req_ids", so.finished_req_ids),
                ("scheduler_output.preempted_req_ids", pre or ()),
                ("scheduler_output.scheduled_cached_reqs.resumed_req_ids", res or ()),
            ]
        with _reading("input_batch.req_ids", PlanError):
            req_ids = list(input_batch.req_ids)
            n = len(req_ids)
        with _reading("input_batch", PlanError):
            host_acc = input_batch.num_accepted_tokens_cpu
            acc = host_acc[:n] if num_accepted is None and prev_rows is None else num_accepted
            tables = self.tables(input_batch, n)
            dev_tables = self.device_tables(input_batch, n) if self._device_tables else None
        # Per request row: computed, scheduled and draft tokens, read by the core.
        c, ns, nd = records(_core.vllm_request_values(req_ids, requests, sched, spec), np.int64).reshape(3, -1)
        # Every list read (by the core) before any request index is freed: a malformed one frees none.
        self.mamba_state_idx[self._slots_table.release_all(released)] = -1
        added: list[str] = []
        try:
            assigned, added = self._slots_table.assign(req_ids)
            slots = np.asarray(assigned, dtype=np.int64)
            step = PreCopyInputs(tables, c, ns, acc, self.mamba_state_idx[slots], req_ids=req_ids)
            if self.device_step is not None:
                curr, out = self.device_step.launch(step, stream=stream, device_tables=dev_tables, prev_rows=prev_rows)
            else:
                if prev_rows is not None:  # the core refuses a remap of host states
                    where = self.placement.name
                    _core.vllm_check_prev_rows(device=where, prev_rows=prev_rows, rows=n, num_accepted_given=False)
                d = self._execute(step)  # the request indices the table just assigned: checked there, once
                curr, out = d.curr, d.num_accepted
            self.mamba_state_idx[slots] = curr
        except Exception:
            self.release(added)  # a rejected step leaves no new request index behind
            raise
        if self.device_step is None:
            host_acc[:n] = out
        self._step = (PostProcessInputs(tables, curr, c, ns, nd, None, req_ids), dev_tables)
        return out

    def postprocess(self, num_accepted: Any, *, stream: Any = None) -> Any:
        """vLLM's ``postprocess_mamba_align_gpu`` for the step :meth:`preprocess` prepared.
        ``num_accepted``: this step's accepted counts per batch row, bonus included (the sampler's
        CUDA tensor on the device path). Returns the accepted counts for the next step (host path:
        int64, store them in ``input_batch.num_accepted_tokens_cpu``; device path: int32 CUDA)."""
        if self._step is None:
            raise PlanError("postprocess needs the step's preprocess first, and runs once per step")
        step, dev_tables = self._step
        if self.device_step is not None:
            step = step._replace(num_accepted=num_accepted)
            out = self.device_step.launch(step, stream=stream, device_tables=dev_tables)[1]
        else:
            out = self.post_process(*step[:-2], num_accepted, req_ids=step.req_ids).num_accepted
        self._step = None  # the step's copies ran: a second postprocess would run them again
        return out

    def __repr__(self) -> str:
        path = "host" if self.device_step is None else f"device {self.placement.name}"
        return (
            f"VllmMambaStep(groups={self._group_ids}, block_size={self.planner.block_size}, "
            f"num_spec_blocks={self.planner.num_spec}, path={path!r}, live={self._slots_table.live})"
        )
