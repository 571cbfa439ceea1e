"""Checkpoints held in a planner's state blocks, published while the index holds them.

:class:`CheckpointStore` is how an engine would run a :class:`~recoverssm_rs.CheckpointCache`
over its own state pool: a checkpoint the cache writes is copied into a block of its own (one
:meth:`~recoverssm_rs.Planner.plan_copy`, on the package's copy path) and published on the
planner; an eviction retracts it and returns the block. A request starts from a hit by copying the
checkpoint into the request's own block first (copy-on-write): the published block is only read,
and the core refuses any plan that would write it (vLLM #57908).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import PlanError
from . import CheckpointCache, CheckpointPlan

if TYPE_CHECKING:
    from ..planner import Planner

__all__ = ["CheckpointStore"]


class CheckpointStore:
    """A checkpoint cache whose checkpoints live in ``blocks`` of ``planner``'s group ``group``.

    Args:
        cache: the placement and eviction policy.
        planner: the planner bound to the engine's state tensors.
        blocks: the block ids reserved for checkpoints (the store owns them; at least the cache's
            budget, else a write finds no free block).
        group: the planner's group holding the states.
        run: executes a plan (default: ``plan.execute()``).
    """

    def __init__(
        self,
        cache: CheckpointCache,
        planner: Planner,
        blocks: Iterable[int],
        *,
        group: int = 0,
        run: Callable[[Any], None] | None = None,
    ) -> None:
        self.cache = cache
        self.planner = planner
        self.group = group
        self._free = list(blocks)[::-1]
        self._block: dict[int, int] = {}
        self._run = run or (lambda plan: plan.execute())

    def block_of(self, handle: int) -> int | None:
        """The block holding a live checkpoint, or None."""
        return self._block.get(handle)

    def blocks(self) -> dict[int, int]:
        """Every live checkpoint's block: ``{handle: block}``."""
        return dict(self._block)

    @property
    def free_blocks(self) -> int:
        """Reserved blocks not holding a checkpoint."""
        return len(self._free)

    def start(self, prompt: Sequence[int], running_block: int) -> CheckpointPlan:
        """Plans ``prompt`` and, on a hit, copies the checkpoint into ``running_block`` (the
        request's own block, which its prefill then writes): the checkpoint is never written."""
        plan = self.cache.plan(prompt)
        if plan.hit_handle is not None:
            self._run(self.planner.plan_copy([self._block[plan.hit_handle]], [running_block]))
        return plan

    def finish(
        self, prompt: Sequence[int], output: Sequence[int], plan: CheckpointPlan, state_at: Callable[[int], int]
    ) -> tuple[list[tuple[int, int]], list[int]]:
        """Ends a request: each checkpoint the cache writes at position ``p`` is copied from the
        block ``state_at(p)`` (where the request's prefill or decode left that state) into a
        reserved block, then published; each evicted one is retracted and its block freed.
        Returns the cache's ``(written, evicted)``.

        Raises:
            PlanError: no reserved block is free for a write (fewer reserved blocks than the
                budget), or a copy the planner refuses.
        """
        written, evicted = self.cache.finish(prompt, output, plan)
        gone = set(evicted)
        for h in evicted:
            if h in self._block:
                block = self._block.pop(h)
                self.planner.retract([block], group=self.group)
                self._free.append(block)
        for position, h in written:
            if h in gone:
                continue  # written and evicted by the same request: never materialised
            if not self._free:
                raise PlanError(
                    f"checkpoint at position {position}: no reserved block is free (reserve at least the budget)"
                )
            block = self._free.pop()
            self._run(self.planner.plan_copy([state_at(position)], [block]))
            self.planner.publish([block], group=self.group)
            self._block[h] = block
        return written, evicted
