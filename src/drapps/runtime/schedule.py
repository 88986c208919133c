"""The dispatch schedule: which work goes to the next free worker, looking ahead over the plan.

The plan fixes which samples form batch ``b`` (a function of seed and epoch); how the work is
cut and in what order it starts is free. The schedule

- cuts a batch into **parts** when samples' costs are heavy-tailed (``dispatch="auto"``) or
  always (``"samples"``): its samples are spread over several workers so that a slow one holds
  only its own part, each part of about the same predicted cost (longest first into the
  lightest part), and the training process collates the parts in plan order; two parts per
  worker while the training loop has slack, one while it waits most of the time;
- starts work **least slack first** over a lookahead of the plan: a part due in ``k`` batches
  may start ``k`` batch-intervals late (the mean batch cost over the workers), less its
  predicted cost, so a predicted-slow part of a later batch starts before the quick parts of
  the next one and is ready when its batch is due.

Uniform costs leave every batch whole and the order first-in first-out: today's dealing.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from drapps.runtime.cost import SampleCosts
from drapps.runtime.plan import EpochPlan

DISPATCH_MODES = ("auto", "batches", "samples")
TAIL_RATIO = 8.0
"""p99 / p50 of samples' costs from which ``dispatch="auto"`` cuts batches into parts."""
PARTS_PER_WORKER = 2
"""Parts a batch is cut into per worker while the training loop has slack: a slow part is then
a small share of its batch, and a worker that finishes early takes another part rather than
idling."""
STARVED_SHARE, FED_SHARE = 0.5, 0.25
"""Shares of wall time the training loop waits from which batches are cut into one part per
worker (the loader is the bottleneck: the training process receives and stitches every part on
cores the workers need, so fewer parts make more samples), and back to :data:`PARTS_PER_WORKER`
(the loader keeps up: smaller parts keep next()'s tail short). Between them the parts per worker
stay."""
_SLACK_WINDOW_S = 1.0  # seconds of the loop's wait the share is read over
_TAIL_EVERY = 64  # samples observed between two readings of the tail


@dataclass(frozen=True)
class Work:
    """One task the schedule hands out: a whole batch, or one part of it."""

    batch_id: int
    part: int | None
    """None: the whole batch, collated by its worker; else this part's number."""
    positions: tuple[int, ...]
    """The samples' places in the batch."""
    cost: float = 0.0
    """Predicted seconds."""
    parts: int = 1
    """Parts its batch was cut into."""


@dataclass
class _BatchParts:
    """The works one batch was cut into for several workers (one whole-batch work where it is not
    cut), and which of them were sent."""

    works: list[Work]
    sent: set[int | None] = field(default_factory=set)
    """The part numbers handed out (None: the whole batch)."""
    pending: list[Work] = field(init=False)
    """The works not sent yet, the one to start first in front: every work of a batch is due
    at once, so the costliest (the least slack) goes first, ties by part number."""

    def __post_init__(self) -> None:
        self.pending = sorted(self.works, key=lambda w: (-w.cost, _part_key(w)))


class Schedule:
    """The order in which one epoch's work is handed out (owned by the dispatcher thread).

    Args:
        costs: the predictor of per-sample costs (fed by the dispatcher as replies come).
        mode: ``"auto"`` (cut batches when costs are heavy-tailed), ``"batches"`` (never) or
            ``"samples"`` (always).
        lookahead: batches past the next one to be delivered whose work may start early
            (None: twice the prefetch depth the dispatcher passes to :meth:`peek`).
        splittable: whether batches may be cut at all (see
            :func:`drapps.runtime.worker.splittable`).
        fifo_batches: whole batches start in plan order (a fixed worker count deals them
            round-robin, as DataLoader does).
        always_parts: a batch of one sample is a part too (batches filled from made samples
            take every sample from a part).
    """

    def __init__(
        self,
        costs: SampleCosts,
        *,
        mode: str = "auto",
        lookahead: int | None = None,
        splittable: bool = True,
        fifo_batches: bool = False,
        always_parts: bool = False,
    ) -> None:
        if mode not in DISPATCH_MODES:
            raise ValueError(f"dispatch must be one of {DISPATCH_MODES}, got {mode!r}")
        self.costs = costs
        self.mode = mode
        self.lookahead = lookahead
        self._splittable = splittable
        self._fifo_batches = fifo_batches
        self._always_parts = always_parts
        self._plan: EpochPlan | None = None
        self._frontier = 0  # the lowest batch not opened yet
        self._opened: set[int] = set()  # opened batches at or past the frontier
        self._parts: dict[int, _BatchParts] = {}  # opened or looked-at batches' works
        self._retry: list[tuple[int, int, Work]] = []
        self._tail_at = -_TAIL_EVERY
        self._heavy = False
        self._batch_len = 1
        self._window: tuple[float, float] | None = None  # (time, seconds waited) at its start
        self.parts_per_worker = PARTS_PER_WORKER
        """Parts per worker a batch is cut into now (see :meth:`note_wait`)."""
        self.cut_batches = 0
        """Batches cut into parts so far."""
        self.samples_at_once = 1
        """How many of a task's samples a worker makes at once now (the pool's
        ``sample_threads``): above 1 a slow sample holds only itself, and a batch is not cut
        for it (``mode="auto"``)."""

    def reset(self, plan: EpochPlan, start: int) -> None:
        self._plan, self._frontier = plan, start
        self._opened.clear()
        self._parts.clear()
        self._retry.clear()

    @property
    def frontier(self) -> int:
        """The lowest batch of the epoch not handed out yet."""
        return self._frontier

    def set_lookahead(self, lookahead: int | None) -> None:
        self.lookahead = lookahead

    @property
    def cutting(self) -> bool:
        """Whether batches are being cut into parts now."""
        return self._splittable and (
            self.mode == "samples"
            or (self.mode == "auto" and self.samples_at_once <= 1 and self.heavy_tailed())
        )

    @property
    def batch_len(self) -> int:
        """Samples in the last batch looked at (1 before any)."""
        return self._batch_len

    def lookahead_for(self, depth: int) -> int:
        """The lookahead in force at prefetch depth ``depth``."""
        return max(1, self.lookahead if self.lookahead is not None else 2 * depth)

    def heavy_tailed(self) -> bool:
        """Whether recent samples' costs are heavy-tailed (re-read every few dozen samples)."""
        if self.costs.observed - self._tail_at >= _TAIL_EVERY:
            self._tail_at = self.costs.observed
            self._heavy = self.costs.tail_ratio() >= TAIL_RATIO
        return self._heavy

    def note_wait(self, waited_s: float, now: float) -> None:
        """The training loop's seconds waited in next() so far, read at ``now`` (monotonic):
        over each window, a loop that waited :data:`STARVED_SHARE` of it or more gets batches
        cut one part per worker from now on; one that waited :data:`FED_SHARE` or less,
        :data:`PARTS_PER_WORKER`. Batches already cut keep their parts."""
        if self._window is None or now < self._window[0]:
            self._window = (now, waited_s)
            return
        start, waited_then = self._window
        if now - start < _SLACK_WINDOW_S:
            return
        share = (waited_s - waited_then) / (now - start)
        self._window = (now, waited_s)
        if share >= STARVED_SHARE:
            self.parts_per_worker = 1
        elif share <= FED_SHARE:
            self.parts_per_worker = PARTS_PER_WORKER

    def requeue(self, work: Work) -> None:
        """``work`` was lost (its worker died): it goes out again before anything else."""
        heapq.heappush(self._retry, (work.batch_id, -1 if work.part is None else work.part, work))

    def retrying(self, work: Work) -> bool:
        return bool(self._retry) and self._retry[0][2] is work

    def peek(
        self, head: int, workers: int, depth: int, may_open: Callable[[int], bool]
    ) -> Work | None:
        """The work to start next, or None (nothing allowed now).

        Args:
            head: the next batch the training loop will take.
            workers: the workers taking tasks now.
            depth: the prefetch depth (the lookahead's default is twice it).
            may_open: whether a batch not started yet may start (prefetch depth, memory).
        """
        if self._retry:
            return self._retry[0][2]
        plan = self._plan
        if plan is None:
            return None
        interval = self.costs.mean * self._batch_len / max(1, workers)
        best: tuple[float, int, int, Work] | None = None
        # Each batch's first pending work is its least slack: one score per batch.
        for batch_id, parts in self._parts.items():
            if batch_id not in self._opened and batch_id >= self._frontier:
                continue  # looked at, not opened
            if parts.pending:
                work = parts.pending[0]
                best = _better(best, self._score(work, head, interval), work)
        end = min(len(plan), max(head, self._frontier) + self.lookahead_for(depth))
        if self._fifo_batches and not self.heavy_tailed():
            end = min(end, self._frontier + 1)
        for batch_id in range(self._frontier, end):
            if batch_id in self._opened:
                continue
            if not may_open(batch_id):
                break
            work = self._parts_for(batch_id, workers).pending[0]
            best = _better(best, self._score(work, head, interval), work)
        return None if best is None else best[3]

    def take(self, work: Work) -> None:
        """``work`` was handed to a worker."""
        if self.retrying(work):
            heapq.heappop(self._retry)
            return
        batch_id = work.batch_id
        parts = self._parts[batch_id]
        parts.sent.add(work.part)
        parts.pending.remove(work)
        if batch_id >= self._frontier:
            self._opened.add(batch_id)
            while self._frontier in self._opened:
                self._opened.discard(self._frontier)
                self._frontier += 1
        if len(parts.sent) == len(parts.works):
            del self._parts[batch_id]

    def parts_of(self, batch_id: int) -> list[Work]:
        """The works ``batch_id`` was cut into (a batch just opened)."""
        parts = self._parts.get(batch_id)
        return [] if parts is None else list(parts.works)

    def _score(self, work: Work, head: int, interval: float) -> tuple[float, int, int]:
        """Least slack first: when the work must start to be ready as its batch comes due."""
        return ((work.batch_id - head) * interval - work.cost, work.batch_id, _part_key(work))

    def _parts_for(self, batch_id: int, workers: int) -> _BatchParts:
        """``batch_id``'s parts, the batch cut now if it was not looked at yet."""
        parts = self._parts.get(batch_id)
        if parts is not None:
            return parts
        assert self._plan is not None
        indices = self._plan.batch(batch_id)
        n = self._batch_len = len(indices)
        cutting = self.cutting
        if not cutting or (n < 2 and not self._always_parts):
            # Whole batches of light-tailed costs start in plan order: no prediction needed.
            cost = float(self.costs.predict(indices).sum()) if cutting else 0.0
            works = [Work(batch_id, None, tuple(range(n)), cost)]
        else:
            costs = self.costs.predict(indices) if self.costs.observed else np.zeros(n)
            groups = balance(costs, min(n, max(2, self.parts_per_worker * workers)))
            works = [
                Work(batch_id, part, tuple(g), float(costs[g].sum()), len(groups))
                for part, g in enumerate(groups)
            ]
            self.cut_batches += 1
        parts = self._parts[batch_id] = _BatchParts(works)
        return parts


def _part_key(work: Work) -> int:
    return -1 if work.part is None else work.part


def _better(
    best: tuple[float, int, int, Work] | None, score: tuple[float, int, int], work: Work
) -> tuple[float, int, int, Work]:
    if best is None or score < best[:3]:
        return (*score, work)
    return best


def balance(costs: np.ndarray, parts: int) -> list[list[int]]:
    """Positions ``0..len(costs)-1`` in ``parts`` groups of near-equal total cost: each position,
    costliest first, joins the group with the least so far (ties: the lower group); each group
    in position order. With equal costs the groups are dealt round: 0, k, 2k, ... in the first.

    Example:
        >>> balance(np.array([1.0, 1.0, 9.0, 1.0]), 2)
        [[2], [0, 1, 3]]
    """
    costs = np.maximum(costs, 1e-12)  # unknown (zero) costs still deal round
    order = np.argsort(-costs, kind="stable")
    loads = [(0.0, g) for g in range(parts)]
    groups: list[list[int]] = [[] for _ in range(parts)]
    for position in order:
        load, g = heapq.heappop(loads)
        groups[g].append(int(position))
        heapq.heappush(loads, (load + float(costs[position]), g))
    return [sorted(g) for g in groups if g]
