"""This process's rank in the demo's process group (:class:`RankContext`): data-parallel gradient
averaging, rank 0's objects broadcast to the others, and one trace per step over every rank.
The trainer (``_run``) uses it; the multi-process launcher (``_ranks``) creates it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["RankContext"]


@dataclass(frozen=True)
class RankContext:
    """This process's rank in the demo's process group (world 1: no group at all)."""

    rank: int = 0
    world: int = 1

    @property
    def distributed(self) -> bool:
        return self.world > 1

    def all_reduce_mean(self, params: Any) -> None:
        """Average the gradients of ``params`` over the ranks (what DDP does after backward)."""
        if not self.distributed:
            return
        import torch.distributed as dist

        for p in params:
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= self.world

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if not self.distributed:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    @contextlib.contextmanager
    def step_scope(self, tel: Any, step: int) -> Iterator[None]:
        """Rank 0: the step's root span, its context sent to the others; other ranks: join it."""
        if not self.distributed:
            with tel.step(step):
                yield
            return
        if self.rank == 0:
            with tel.step(step):
                self.broadcast(tel.inject() if callable(getattr(tel, "inject", None)) else {})
                yield
        else:
            carrier = self.broadcast(None)
            join: Any = getattr(tel, "join", None)
            scope: Any = join(carrier) if callable(join) else contextlib.nullcontext()
            with scope:
                yield
