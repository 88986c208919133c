"""Hedged copies: which overdue parts of a batch are copied to a second worker, and when.

A sample read from storage with a heavy-tailed latency (a cold object store, a busy network
filesystem) is usually fast the second time it is asked for: the copy races the original and
the first answer wins (the dispatcher drops the other as a duplicate), so one slow read no
longer holds the batch ("The Tail at Scale"'s hedged requests). :class:`Hedging` owns the
parts copied in the epoch, the measured stretch (wall seconds per second of the samples' own
cost) and the hedging counters; the dispatcher asks it for copies on each pass and sends them.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterator
from typing import Any

from drapps.runtime.admission import TASKS_PER_WORKER
from drapps.runtime.cost import SampleCosts
from drapps.runtime.inbox import urgency
from drapps.runtime.plan import EpochPlan
from drapps.runtime.pool import Task, Worker

HEDGE_FACTOR = 4.0
"""A part runs overdue at this many times its predicted cost (times the stretch)..."""
HEDGE_MIN_S = 0.02
"""...and at least this long."""
HEDGE_AHEAD = 2
"""Batches from the head whose overdue parts an idle worker may copy early."""
STALL_POLL_S = 0.005
"""How often a stalled sample is looked at again once it is due."""
STRETCH_DECAY = 0.05
"""Weight of each reply in the running wall-over-cost ratio."""
TICK_S = 0.5
"""The longest the dispatcher waits between two looks."""

InFlight = dict[tuple[int, int | None], Worker]
"""Which worker makes each (batch id, part) sent in this epoch and not answered yet."""


class Hedging:
    """Copies of overdue parts, for batches cut into parts among workers."""

    def __init__(self, costs: SampleCosts) -> None:
        self.costs = costs
        self.copied: set[tuple[int, int | None]] = set()
        """Parts copied to a second worker this epoch (each is copied once at most)."""
        self.stretch = 1.0
        """Wall seconds a task takes per second of its samples' own cost: above 1 with more
        busy workers than cores (costs leave out the time a worker waited for a core)."""
        self._stretches = 0  # replies the stretch has learnt from
        self.counters = {"hedges": 0, "hedges_ahead": 0, "hedges_stalled": 0}

    def reset(self, plan: EpochPlan, start: int) -> None:
        """A new epoch: none of its parts is copied yet."""
        self.copied.clear()

    def copies(
        self,
        *,
        head: int,
        waiting: bool,
        cut: Collection[int],
        in_flight: InFlight,
        live: list[Worker],
    ) -> Iterator[tuple[Worker, Task]]:
        """Copies of overdue parts with the spare worker each goes to, already queued there
        (:func:`assign_copy`); the caller sends them.

        ``head`` is the batch the loop needs next, ``waiting`` whether it waits for it now,
        ``cut`` the batches cut into parts. A part queued behind a task that overran is
        copied like an overdue one, and so is one whose worker has been on one sample for
        ``HEDGE_FACTOR`` times that sample's cost (its
        :class:`~drapps.runtime.progress.SampleClock`) and as long as the copy would take,
        before the part as a whole looks overdue. The copy makes the same samples with the
        same seeds, so the batch is the same either way. While the training loop waits, a
        part of the batch it waits for goes to the worker with the fewest tasks (two over
        the usual two at most) that is not stalled itself; before that, a part of one of the
        next ``HEDGE_AHEAD`` batches goes to an idle worker only, so a slow read is raced
        before its batch is due, on capacity that would otherwise wait.
        """
        due_batches = range(head, head + (1 if waiting else HEDGE_AHEAD))
        if not any(b in cut for b in due_batches) or not self.costs.observed:
            return  # no cost measured yet: nothing says a part runs late
        now = time.monotonic()
        for (batch_id, part), holder in list(in_flight.items()):
            if batch_id not in due_batches or part is None or (batch_id, part) in self.copied:
                continue
            task = next(
                (t for t in holder.assigned if (t.batch_id, t.part) == (batch_id, part)), None
            )
            started = holder.head_started()
            if task is None or task.work is None or started is None:
                continue
            # The task the holder is on now: this part, or the one it is queued behind.
            running = holder.assigned[0].work or task.work
            typical = self.costs.median * len(running.positions)
            due = max(HEDGE_MIN_S, HEDGE_FACTOR * max(typical, running.cost) * self.stretch)
            overdue = now - started >= due
            if not overdue and not self.stalled(holder, now):
                continue
            # While the loop waits, a copy may go to a worker holding one task more than
            # usual (it takes the copy first), so the parts queued behind a stalled one are
            # copied too; never to a worker that is stalled itself.
            room = TASKS_PER_WORKER + 1 if waiting else 0
            others = [
                w
                for w in live
                if w is not holder and len(w.assigned) <= room and not self.stalled(w, now)
            ]
            if not others:
                return
            spare = min(others, key=lambda w: len(w.assigned))
            if not overdue and now - self._stall_start(holder) < self._copy_s(spare, task, now):
                continue  # the copy would likely come after the read it races
            copy = Task(
                task.generation, task.epoch, batch_id, task.indices, now, task.split, task.work
            )
            assign_copy(spare, copy)
            self.copied.add((batch_id, part))
            self.counters["hedges"] += 1
            self.counters["hedges_ahead"] += not waiting
            self.counters["hedges_stalled"] += not overdue
            yield spare, copy

    def stalled(self, worker: Worker, now: float) -> bool:
        """Whether the one sample ``worker`` is making has run ``HEDGE_FACTOR`` times its
        predicted cost (times the stretch), and at least ``HEDGE_MIN_S``: a slow read holds
        its part, and every part queued behind it, well before the part looks overdue."""
        due = self._stall_due(worker)
        return due is not None and now >= due

    def next_look_s(self, head: int, in_flight: InFlight) -> float:
        """Seconds until a part of the batch the loop waits for may count as stalled (the
        dispatcher wakes then rather than at the next reply, which may be far)."""
        soonest = TICK_S
        now = time.monotonic()
        for (batch_id, part), holder in in_flight.items():
            if batch_id == head and (batch_id, part) not in self.copied:
                due = self._stall_due(holder)
                if due is not None:
                    # Past its due, look again soon: the copy waits until it would win.
                    soonest = min(soonest, max(due - now, STALL_POLL_S))
        return soonest

    def note_stretch(self, wall_s: float, costs: list[float]) -> None:
        """Learn how long a task takes on the wall per second of its samples' own cost."""
        cost = sum(costs)
        if cost > 1e-3 and wall_s > 0:
            ratio = min(max(wall_s / cost, 1.0), 64.0)
            self._stretches += 1  # the mean of the first replies, then a running average
            self.stretch += max(STRETCH_DECAY, 1 / self._stretches) * (ratio - self.stretch)

    def report(self) -> dict[str, Any]:
        """The stretch and the counters, for the pipeline's snapshot."""
        return {"stretch": round(self.stretch, 2), **self.counters}

    def _stall_due(self, worker: Worker) -> float | None:
        """When the sample ``worker`` is making will count as stalled (None: none is made)."""
        sample = worker.clock.read() if worker.clock is not None else None
        if sample is None or not worker.assigned or not self.costs.observed:
            return None  # no cost measured yet: nothing to judge it by
        head = worker.assigned[0]
        predicted = self.costs.median
        if (head.batch_id, head.part) == (sample.batch_id, sample.part) and sample.position < len(
            head.indices
        ):
            index = head.indices[sample.position]
            predicted = max(predicted, float(self.costs.predict([index])[0]))
        return sample.started + max(HEDGE_MIN_S, HEDGE_FACTOR * predicted * self.stretch)

    def _stall_start(self, worker: Worker) -> float:
        """When the sample ``worker`` is making began (now: none)."""
        sample = worker.clock.read() if worker.clock is not None else None
        return time.monotonic() if sample is None else sample.started

    def _copy_s(self, worker: Worker, task: Task, now: float) -> float:
        """How long a copy of ``task`` sent to ``worker`` now would take: what is left of the
        task it is on (it takes the copy next), then the copy, both at the measured stretch.
        A copy for one stalled sample is sent once the sample has waited that long: a read
        with a heavy-tailed latency that has lasted ``t`` is likely to last about as long
        again, so the copy then tends to win, and where copies come late (busy workers,
        cores that are all in use) fewer are made."""
        work = task.work
        own = self.costs.median * len(task.indices)
        copy = max(own, work.cost if work is not None else 0.0) * self.stretch
        if not worker.assigned:
            return copy
        head = worker.assigned[0]
        head_cost = max(head.work.cost if head.work is not None else 0.0,
                        self.costs.median * len(head.indices))  # fmt: skip
        left = head_cost * self.stretch - (now - (worker.head_started() or now))
        return max(0.0, left) + copy


def assign_copy(spare: Worker, copy: Task) -> None:
    """Queue ``copy`` on ``spare`` where the worker takes it: after the task it is on, before
    the later batches it holds (see :class:`~drapps.runtime.inbox.Inbox`)."""
    first = urgency(copy.generation, copy.batch_id)
    place = 1 + sum(
        1 for t in list(spare.assigned)[1:] if urgency(t.generation, t.batch_id) <= first
    )
    spare.assigned.insert(min(place, len(spare.assigned)), copy)
