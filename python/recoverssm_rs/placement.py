"""The one device parser: where an engine's states live (``"cpu"``, ``"cuda"``, ``"cuda:N"``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import PlanError

__all__ = ["Placement", "parse_device", "cuda_index"]


@dataclass(frozen=True, slots=True)
class Placement:
    """Where states live: ``kind`` ``"cpu"`` or ``"cuda"``, and the CUDA ordinal (0 for the host)."""

    kind: str
    index: int

    @property
    def is_cuda(self) -> bool:
        return self.kind == "cuda"

    @property
    def name(self) -> str:
        """``"cpu"`` or ``"cuda:N"`` (the core's spelling)."""
        return "cpu" if self.kind == "cpu" else f"cuda:{self.index}"


def parse_device(device: Any) -> Placement:
    """The one device parser: ``"cpu"``, ``"cuda"`` (ordinal 0), ``"cuda:N"``, or a
    ``torch.device``.

    Raises:
        PlanError: anything else, naming it.
    """
    kind, sep, idx = str(device).partition(":")
    if kind in ("cpu", "cuda") and (not sep or (kind == "cuda" and idx.isdigit())):
        return Placement(kind, int(idx) if idx else 0)
    raise PlanError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")


def cuda_index(device: Any, what: str) -> int:
    """The CUDA ordinal of the states' ``device``; a :class:`PlanError` naming ``what`` for host
    states."""
    p = parse_device(device)
    if not p.is_cuda:
        raise PlanError(
            f"{what} is part of the device path (CUDA states), but this planner is bound to {p.name} tensors; for host "
            "states plan the step with planner.plan_align(...) or planner.plan(...) (host inputs) and run it with "
            "CopyPlan.execute()"
        )
    return p.index
