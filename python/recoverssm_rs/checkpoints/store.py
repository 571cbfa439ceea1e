"""Checkpoints held in a planner's state blocks, published while the index holds them.

:class:`CheckpointStore` is how an engine would run a :class:`~recoverssm_rs.CheckpointCache`
over its own state pool: a checkpoint the cache writes is copied into a block of its own (one
:meth:`~recoverssm_rs.Planner.plan_copy`, on the package's copy path) and published on the
planner; an eviction retracts it and returns the block, as soon as the store sees it (a plan's
evictions at admission when the request starts, the others when it ends). A request starts from a hit by copying the
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

    Raises:
        PlanError: ``cache`` already holds checkpoints (the store would have no block for them), or
            ``blocks`` are not distinct, writable blocks of ``group``
            (:meth:`CheckpointCache.check_reserved_blocks`).
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
        if len(cache):
            raise PlanError(
                f"the cache already holds {len(cache)} checkpoint(s) that no block of this store holds; "
                "give the store a new cache"
            )
        self.cache = cache
        self.planner = planner
        self.group = group
        self._free = CheckpointCache.check_reserved_blocks(planner.core, blocks, group=group)[::-1]
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
        request's own block, which its prefill then writes): the checkpoint is never written.

        ``running_block`` is checked first (:meth:`CheckpointCache.check_running_block`), hit or
        miss, and the copy is planned and run before the cache plans the request, so a refused
        block or a copy that fails to run leaves the cache as it was: no use of the hit is
        counted and nothing is evicted at admission. The checkpoints the plan evicted at admission
        (:attr:`CheckpointPlan.evicted`) are retracted and their blocks freed before it returns,
        so the store and the cache agree on every live checkpoint.

        Raises:
            PlanError: ``running_block`` is not a writable block of the store's group: out of
                range, the null block, or published (another checkpoint, a shared block, or the
                hit's own block: copied onto itself the checkpoint would then be written by the
                request's prefill), or one of the store's free reserved blocks (the next
                checkpoint would be copied into the block the request writes).
        """
        CheckpointCache.check_running_block(self.planner.core, running_block, group=self.group, reserved=self._free)
        hit = self.cache.peek(prompt)
        if hit is not None:
            self._run(self.planner.plan_copy([self._block[hit]], [running_block]))
        plan = self.cache.plan(prompt)
        self._release(plan.evicted)
        return plan

    def finish(
        self, prompt: Sequence[int], output: Sequence[int], plan: CheckpointPlan, state_at: Callable[[int], int]
    ) -> tuple[list[tuple[int, int]], list[int]]:
        """Ends a request: each checkpoint the cache writes at position ``p`` is copied from the
        block ``state_at(p)`` (where the request's prefill or decode left that state) into a
        reserved block, then published; each evicted one is retracted and its block freed.
        Returns the cache's ``(written, evicted)`` (the evictions of the request's end; those at its
        admission were the plan's, retracted by :meth:`start`).

        The request's checkpoints are copied by one plan, checked whole before any byte moves; when
        they cannot all be materialised the cache forgets them (:meth:`CheckpointCache.discard`),
        so the cache and the store still agree on every live checkpoint, and no reserved block is
        published. The request has ended either way: its plan is finished (a second ``finish`` of
        it is refused), so those checkpoints are not written later.

        Raises:
            PlanError: no reserved block is free for a write (fewer reserved blocks than the
                budget), or a copy the planner refuses (a bad block from ``state_at``).
        """
        written, evicted = self.cache.finish(prompt, output, plan)
        gone = set(evicted)
        self._release(evicted)
        # Written and evicted by the same request: never materialised.
        todo = [(position, h) for position, h in written if h not in gone]
        if not todo:
            return written, evicted
        dst = self._free[::-1][: len(todo)]  # the blocks pop() would give, in order
        try:
            if len(todo) > len(dst):
                raise PlanError(
                    f"checkpoint at position {todo[len(dst)][0]}: no reserved block is free (reserve at least the budget)"
                )
            self._run(self.planner.plan_copy([state_at(position) for position, _ in todo], dst))
            self.planner.publish(dst, group=self.group)
        except BaseException:
            self.cache.discard([h for _, h in todo])
            raise
        del self._free[len(self._free) - len(todo) :]
        self._block.update((h, block) for (_, h), block in zip(todo, dst))
        return written, evicted

    def _release(self, evicted: Iterable[int]) -> None:
        """Retracts the evicted checkpoints this store holds and frees their blocks (one written
        and evicted by the same request was never given one)."""
        freed = [self._block.pop(h) for h in evicted if h in self._block]
        if freed:
            self.planner.retract(freed, group=self.group)
            self._free.extend(freed)
