"""The engine-adapter base: what every engine path shares, in one place.

The engine shells -- vLLM's :class:`~recoverssm_rs.vllm.VllmMambaStep` (its device half
:class:`~recoverssm_rs.vllm.device_step.DeviceStep`), vLLM's
:class:`~recoverssm_rs.vllm.ModelStateV2`, the SGLang pool
:class:`~recoverssm_rs.sglang.SglangMambaPool` -- only translate their engine's objects into the
core's inputs. What they have in common lives here:

* **one device parser** (:func:`~recoverssm_rs.placement.parse_device`, :func:`~recoverssm_rs.placement.cuda_index`): ``"cpu"``, ``"cuda"`` and
  ``"cuda:N"``, read once when an adapter is built;
* **the bound tensors**, bound and checked once by the compiled core's planner
  (:class:`~recoverssm_rs.Planner`, held as :attr:`EngineAdapter.planner`);
* **the guarded write**: one core call checks the bound tensors, runs the write (a launch queued on
  the caller's stream, or a host execution) and records it (:meth:`EngineAdapter.guarded`; the hot
  engine operations pass their launch to the core call that builds it, so the check, the launch and
  the record are one crossing into Rust);
* **the stream and the launch** (:meth:`EngineAdapter.stream`, :meth:`EngineAdapter.launch_kernel`): a torch
  or CuPy stream made current on the states' device and the core-built launch queued on it;
* **the error word** of a shell's launches (:class:`ErrorWordBuffer`, docs/design.md section 6.6).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ._core import ErrorWord
from .cuda import module, ops
from .placement import Placement, cuda_index, parse_device

if TYPE_CHECKING:
    from .planner import Planner

__all__ = ["Placement", "parse_device", "cuda_index", "EngineAdapter", "ErrorWordBuffer"]

log = logging.getLogger("recoverssm_rs")

T = TypeVar("T")


class EngineAdapter:
    """The base of every engine shell: the planner of the engine's state tensors (bound and checked
    by the core), where they live, and the guarded write.

    Args:
        planner: the planner bound to the engine's state tensors.
    """

    def __init__(self, planner: Planner) -> None:
        self.planner = planner
        """The planner of the bound state tensors."""
        self.placement = parse_device(planner.device)
        """Where the states live (parsed once)."""

    @property
    def core(self) -> Any:
        """The compiled core's planner (what the core's engine calls take)."""
        return self.planner.core

    def cuda(self, what: str) -> int:
        """The states' CUDA ordinal; a :class:`PlanError` naming ``what`` for host states."""
        if not self.placement.is_cuda:
            return cuda_index(self.placement.name, what)
        return self.placement.index

    def guarded(self, write: Callable[[], T]) -> T:
        """One guarded write, one core call: the bound tensors checked (a
        :class:`~recoverssm_rs.BindingError`, and ``write`` not called, when one moved), ``write()``
        run, the write recorded (autograd's version counters)."""
        return self.planner.guarded(write)

    def stream(self, stream: Any) -> Any:
        """``stream`` (torch, CuPy or ``None``: the current torch stream) as a torch stream."""
        return ops.cuda_ops.torch_stream(stream, self.placement.index)

    def launch_kernel(self, kl: Any, stream: Any = None) -> None:
        """Queue a core-built launch on ``stream`` (a torch stream or ``None``: the current one) of
        the states' device. Call it inside a guarded write."""
        index = self.placement.index
        with ops.cuda_ops.context(index, stream):
            module.launch(kl, index, stream)


class ErrorWordBuffer:
    """The error word (``int32[3]`` on one CUDA device, allocated on first use) that a shell's
    launches report into, and the requests (rows) the last launches covered."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.buf: Any = None
        self.requests = 0

    @property
    def launched(self) -> bool:
        """Whether the word was allocated (a launch was prepared)."""
        return self.buf is not None

    def alloc(self) -> Any:
        """The word's device buffer (zeroed when allocated)."""
        if self.buf is None:
            self.buf = ops.cuda_ops.zeros_i32(3, self.index)
        return self.buf

    def reset(self, requests: int) -> Any:
        """The word zeroed (on the current stream) for launches over ``requests`` requests."""
        self.alloc().zero_()
        self.requests = requests
        return self.buf

    def read(self) -> ErrorWord:
        """The decoded word (:class:`~recoverssm_rs.ErrorWord`); **synchronises** the device."""
        if self.buf is None:
            return ErrorWord([0, 0, 0], 0)
        ops.cuda_ops.synchronize(self.index)
        return ErrorWord([int(x) for x in self.buf.cpu().tolist()], self.requests)
