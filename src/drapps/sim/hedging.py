"""The dispatcher's hedged copies, as the simulator runs them.

The real dispatcher (``drapps.runtime.hedging.Hedging``) copies a part of a batch
the training loop needs soon to a second worker once the part has run ``HEDGE_FACTOR`` times
its typical cost (stretched by the wall time tasks take per second of their own cost), and at
least ``HEDGE_MIN_S``: the first answer wins, the other is dropped, and each part is copied
once at most. This module holds that rule's state for one simulated run; the simulator's engine
owns the workers and asks it which parts of the batches due run overdue, how many tasks a
worker receiving a copy may hold, and whether an answer is the first of two. Like the
runtime's, the rule is looked at as replies come (and as the loop starts to wait for a batch
or takes one), not on a timer of its own. The constants are the runtime's own, imported, so
the two cannot drift apart.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from drapps.runtime.admission import TASKS_PER_WORKER
from drapps.runtime.hedging import HEDGE_AHEAD, HEDGE_FACTOR, HEDGE_MIN_S, STRETCH_DECAY

__all__ = ["HEDGE_AHEAD", "HEDGE_FACTOR", "HEDGE_MIN_S", "TASKS_PER_WORKER", "HedgedCopies"]

Part = tuple[int, int]
"""(batch id, part number)."""
W = TypeVar("W")


class HedgedCopies(Generic[W]):
    """Which parts run overdue, which were copied, and what a part typically takes.

    ``W`` is the engine's worker type: the rule only keeps which worker holds a part.

    Example:
        >>> copies: HedgedCopies[str] = HedgedCopies()
        >>> copies.start(7, 0, "worker-1", 0.0, predicted=0.25)
        >>> copies.overdue(7, now=1.0)  # nothing measured yet: nothing runs late
        []
        >>> copies.made(6, 0, copy=False, wall_s=0.1, share=0.25)  # a task of another batch
        True
        >>> copies.overdue(7, now=0.3), copies.overdue(7, now=0.4)  # 4x what that one took
        ([], [(0, 'worker-1')])
        >>> copies.copy(7, 0)
        >>> copies.made(7, 0, copy=True, wall_s=0.05, share=0.25)  # the copy answers first
        True
        >>> copies.made(7, 0, copy=False, wall_s=2.0, share=1.0)  # the first task: dropped
        False
    """

    def __init__(self) -> None:
        self.wall_per_share: float | None = None
        """Wall seconds a task takes per mean batch's worth of its own cost, a running
        average over the tasks made (the runtime's median sample cost times its stretch)."""
        self._notes = 0
        # batch -> part -> (worker, start, predicted share): parts not copied, under way
        self._running: dict[int, dict[int, tuple[W, float, float]]] = {}
        self._copied: set[Part] = set()  # copied parts whose two answers have not both come
        self._answered: set[Part] = set()  # of those, the ones with one answer

    def reset(self) -> None:
        """Forget every part (what was learnt of the costs stays, as the runtime's does)."""
        self._running.clear()
        self._copied.clear()
        self._answered.clear()

    def start(self, batch: int, part: int, worker: W, began: float, predicted: float) -> None:
        """``worker`` began part ``part`` of ``batch`` (its first task, not a copy), predicted
        to cost ``predicted`` of a mean batch's work."""
        parts = self._running.get(batch)
        if parts is None:
            self._running[batch] = {part: (worker, began, predicted)}
        else:
            parts[part] = (worker, began, predicted)

    def made(self, batch: int, part: int, copy: bool, wall_s: float, share: float) -> bool:
        """A task of part ``part`` of ``batch`` is done (``copy``: the copy), after ``wall_s``
        on its worker for ``share`` of a mean batch's work: learn from it (the mean of the
        first ones, then a running average, as the runtime's stretch), and say whether it
        makes the part. False for the second answer of a copied part: it is dropped.
        (One call per task made, its arguments positional: the simulator's speed on cut
        batches rides on it.)"""
        if share > 0 and wall_s > 0:
            ratio = wall_s / share
            self._notes += 1
            if self.wall_per_share is None:
                self.wall_per_share = ratio
            else:
                weight = max(STRETCH_DECAY, 1 / self._notes)
                self.wall_per_share += weight * (ratio - self.wall_per_share)
        if not copy:
            parts = self._running.get(batch)
            if parts is not None and parts.pop(part, None) is not None and not parts:
                del self._running[batch]
        if not self._copied:
            return True
        key = (batch, part)
        if key not in self._copied:
            return True
        if key in self._answered:  # the second answer: forget the part
            self._answered.discard(key)
            self._copied.discard(key)
            return False
        self._answered.add(key)
        return True

    def overdue(self, batch: int, now: float) -> list[tuple[int, W]]:
        """The parts of ``batch`` not copied whose first task runs overdue at ``now``, and
        the worker on each."""
        parts = self._running.get(batch)
        if not parts or self.wall_per_share is None:
            return []
        factor = HEDGE_FACTOR * self.wall_per_share
        return [
            (part, worker)
            for part, (worker, began, predicted) in parts.items()
            if now - began >= max(HEDGE_MIN_S, factor * predicted)
        ]

    def late(self, began: float, predicted: float, now: float) -> bool:
        """Whether a task begun at ``began``, predicted to cost ``predicted`` of a mean
        batch, runs overdue at ``now``: it has run :data:`HEDGE_FACTOR` times that cost at
        the wall time a task takes per unit of cost, and at least :data:`HEDGE_MIN_S` (never
        before a task was measured)."""
        if self.wall_per_share is None:
            return False
        return now - began >= max(HEDGE_MIN_S, HEDGE_FACTOR * predicted * self.wall_per_share)

    @staticmethod
    def due_batches(head: int, waiting: bool) -> range:
        """The batches whose parts may be copied now: the one the loop waits for, or, before
        it waits, the next :data:`HEDGE_AHEAD` from ``head``."""
        return range(head, head + (1 if waiting else HEDGE_AHEAD))

    @staticmethod
    def room(waiting: bool) -> int:
        """The most tasks a worker receiving a copy may hold: none (an idle worker) before the
        loop waits, one more than usual while it waits."""
        return TASKS_PER_WORKER + 1 if waiting else 0

    def copy(self, batch: int, part: int) -> None:
        """Part ``part`` of ``batch`` was copied to a second worker (once at most: it is no
        longer among the parts :meth:`overdue` looks at)."""
        parts = self._running.get(batch)
        if parts is not None and parts.pop(part, None) is not None and not parts:
            del self._running[batch]
        self._copied.add((batch, part))
