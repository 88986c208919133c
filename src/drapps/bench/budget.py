"""A bench run planned against a wall-clock budget, from what its runs cost as it goes.

A run's wall time is a fixed part (a fresh process, its imports, the loader's start, the
warm-up, the teardown) and a part per timed batch. :class:`CostModel` learns both for every
case from its latest run, so it can say what a repeat would cost at another window.
:class:`RepeatPlanner` spends the budget in this order of preference:

1. The first repeat starts with one run of each system (and the preprocessing limit); from
   those the planner chooses the timed window for the whole run: the longest, down to the
   shortest allowed, at which the repeats asked for still fit. If the window shrinks, those
   first runs are timed again at the new window, so every run of a bench has the same one.
2. Where even the shortest window does not fit the repeats asked for, it plans fewer at the
   longest window that fits them. More repeats at a shorter window come first: an interval
   from 3 paired repeats is far narrower than from 2 (Student's t of 4.3 against 12.7), and
   one repeat gives none.
3. Before each further repeat it checks that the repeat fits what is left, with the costs of
   the latest runs scaled by how far the latest predictions fell short (the machine can get
   busier as it goes); within one, before each run, that the rest of the repeat fits. A repeat
   that no longer fits is stopped and left out, so the run ends inside its budget.

The first repeat is always run to its end: a bench with no complete repeat says nothing. Where
that alone passes the budget, it ends as early as it can and the record says so. Every
decision takes its time from ``clock``, so the rules are tested with a fake clock and made-up
costs.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

Levels = tuple[Hashable, ...]
"""A run's keys from the most specific (its case) to the least (its system): a run not yet
seen is predicted from the runs that share its most specific key seen so far."""

MARGIN = 0.1
"""A planned repeat must fit what is left with this share to spare."""
RESERVE_S = 3.0
"""Seconds kept back at the end for the summary and the files."""


@dataclass(frozen=True)
class RunCost:
    """What one run cost: the seconds outside its timed window, and per timed batch."""

    fixed_s: float
    per_batch_s: float

    def at(self, batches: int, measure_s: float | None = None) -> float:
        """The predicted wall time of the run with ``batches`` timed batches (and at least
        ``measure_s`` seconds of them, where asked)."""
        timed = self.per_batch_s * batches
        return self.fixed_s + max(timed, measure_s or 0.0)


class CostModel:
    """The latest cost of every run, and predictions for runs at another window.

    Example:
        >>> model = CostModel()
        >>> model.record(("dataloader-2", "dataloader"), wall_s=5.0, timed_s=2.0, batches=80)
        >>> model.predict(("dataloader-4", "dataloader"), batches=40)
        4.0
    """

    def __init__(self) -> None:
        self._latest: dict[Hashable, RunCost] = {}
        self._members: dict[Hashable, set[Hashable]] = {}
        self._pace: list[float] = []

    def record(self, levels: Levels, wall_s: float, timed_s: float, batches: int) -> None:
        """One run of ``levels[0]`` took ``wall_s``, of which ``timed_s`` over ``batches``."""
        if not levels:
            raise ValueError("levels must name the run, got ()")
        if wall_s < 0 or timed_s < 0 or batches < 0:
            raise ValueError(
                f"wall_s, timed_s and batches must be >= 0, got {wall_s!r}, {timed_s!r}, "
                f"{batches!r}"
            )
        cost = RunCost(max(0.0, wall_s - timed_s), timed_s / batches if batches else 0.0)
        before = self._latest.get(levels[0])
        if before is not None:  # how far the machine moved since this run's last time
            predicted = before.at(batches)
            if predicted > 0:
                self._pace = [*self._pace[-2:], wall_s / predicted]
        self._latest[levels[0]] = cost
        for level in levels:
            self._members.setdefault(level, set()).add(levels[0])

    @property
    def pace(self) -> float:
        """The mean of the last 3 runs' wall time over its prediction from their previous
        run (1.0 before any run ran twice): above 1 the machine got slower. A mean, not a
        median, so that one run much slower than before already counts: the budget is kept
        by reacting early."""
        return statistics.fmean(self._pace) if self._pace else 1.0

    def predict(self, levels: Levels, batches: int, measure_s: float | None = None) -> float | None:
        """The predicted wall time of a run of ``levels[0]`` at ``batches`` timed batches, or
        None while no run shares any of its levels. A run not seen yet takes the mean of the
        runs sharing its most specific level; one sharing none, the costliest seen."""
        for level in levels:
            members = self._members.get(level)
            if members:
                costs = [self._latest[m].at(batches, measure_s) for m in members]
                return self.pace * statistics.fmean(costs)
        if not self._latest:
            return None
        return self.pace * max(c.at(batches, measure_s) for c in self._latest.values())


@dataclass(frozen=True)
class Plan:
    """What a run planned and did against its budget (``results["plan"]``)."""

    budget_s: float | None
    repeats_asked: int
    repeats: int
    """Complete repeats run."""
    window_asked: int
    window: int
    """Timed batches per run."""
    dropped: int
    """Repeats stopped partway because the rest no longer fitted, and left out."""
    repeat_s: float | None
    """Wall seconds of the last complete repeat."""
    elapsed_s: float
    """Wall seconds from the start of the run to the end of its last run."""

    @property
    def over_budget(self) -> bool:
        return self.budget_s is not None and self.elapsed_s > self.budget_s

    @property
    def cut(self) -> bool:
        """Fewer repeats or a shorter window than asked, to fit the budget."""
        return self.repeats < self.repeats_asked or self.window < self.window_asked

    def as_dict(self) -> dict[str, Any]:
        return {
            "budget_s": self.budget_s,
            "repeats_asked": self.repeats_asked,
            "repeats": self.repeats,
            "window_asked": self.window_asked,
            "window": self.window,
            "dropped": self.dropped,
            "repeat_s": self.repeat_s,
            "elapsed_s": self.elapsed_s,
        }

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> Plan:
        return cls(**{k: record[k] for k in cls.__dataclass_fields__})

    def describe(self, why: str) -> list[str]:
        """Sentences for the verdict: what was cut to fit the budget, ``why`` (the words for
        what the machine did), and whether the run still passed it; none when nothing was."""
        said = []
        if self.cut and self.budget_s is not None:
            what = []
            if self.repeats < self.repeats_asked:
                plural = "repeat" if self.repeats == 1 else "repeats"
                what.append(f"{self.repeats} {plural} instead of {self.repeats_asked}")
            if self.window < self.window_asked:
                what.append(f"{self.window} timed batches a run instead of {self.window_asked}")
            took = f"; a repeat took {self.repeat_s:.0f} s" if self.repeat_s else ""
            wider = (
                "no interval can be given from one repeat"
                if self.repeats < 2
                else "intervals are wider"
            )
            said.append(
                f"{' and '.join(what)} to end within the {self.budget_s:.0f} s budget: {why}"
                f"{took}; {wider}."
            )
        if self.dropped:
            plural = "repeat was" if self.dropped == 1 else "repeats were"
            said.append(
                f"{self.dropped} further {plural} stopped partway, when the rest no longer "
                "fitted the budget, and left out."
            )
        if self.over_budget and self.budget_s is not None:
            said.append(
                f"the run took {self.elapsed_s:.0f} s, past its {self.budget_s:.0f} s budget: "
                f"one repeat at {self.window} timed batches did not fit in it."
            )
        return said


class RepeatPlanner:
    """Chooses the timed window and the repeats a bench run can afford, as it runs.

    Args:
        budget_s: wall seconds for the whole run, from ``started``; None: no budget (exactly
            ``repeats``, or up to ``max_repeats`` while the verdict is not settled).
        started: the ``clock`` reading the budget counts from.
        repeats: the repeats asked for.
        max_repeats: repeat past ``repeats``, up to this many, while the verdict is not
            settled and a repeat fits; None: never past ``repeats``.
        window: the timed batches per run asked for.
        shortest_window: the fewest timed batches per run the planner may choose.
        measure_s: each run timed for at least this long (past ``window``), or None.
        clock: monotonic seconds.

    Example:
        >>> now = [0.0]
        >>> planner = RepeatPlanner(150.0, 0.0, repeats=3, max_repeats=None, window=80,
        ...                         shortest_window=30, clock=lambda: now[0])
        >>> planner.start_repeat(0, every=[], settled=False)
        True
        >>> for name in ("a", "b"):  # a repeat of two runs, each 22 s fixed and 0.1 s a batch
        ...     now[0] += 30.0
        ...     planner.record((name,), wall_s=30.0, timed_s=8.0, batches=80)
        >>> planner.choose_window(rest=[], redo=[("a",), ("b",)], every=[("a",), ("b",)])
        False
        >>> planner.window, planner.planned  # 3 repeats of 60 s do not fit 150 s, even shorter
        (80, 2)
    """

    def __init__(
        self,
        budget_s: float | None,
        started: float,
        *,
        repeats: int,
        max_repeats: int | None,
        window: int,
        shortest_window: int,
        measure_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {repeats!r}")
        if shortest_window < 1:
            raise ValueError(f"shortest_window must be >= 1, got {shortest_window!r}")
        self.budget_s, self.started, self.clock = budget_s, started, clock
        self.repeats, self.max_repeats = repeats, max_repeats
        self.window_asked = self.window = window
        self.shortest_window = min(shortest_window, window)
        self.measure_s = measure_s
        self.planned = repeats
        """The repeats the window was chosen for."""
        self.costs = CostModel()
        self.dropped = 0
        self._repeat_started: float | None = None
        self._repeat_s: float | None = None
        self._complete = 0

    def elapsed(self) -> float:
        return self.clock() - self.started

    def left(self) -> float:
        """Seconds left for runs (infinite without a budget)."""
        if self.budget_s is None:
            return math.inf
        return self.budget_s - RESERVE_S - self.elapsed()

    def record(self, levels: Levels, wall_s: float, timed_s: float, batches: int) -> None:
        """A run ended: learn its cost (see :meth:`CostModel.record`)."""
        self.costs.record(levels, wall_s, timed_s, batches)

    def cost(self, items: Sequence[Levels], window: int | None = None) -> float:
        """The predicted wall time of running ``items`` at ``window`` (the current one by
        default); a run with nothing to predict it from counts 0."""
        batches = self.window if window is None else window
        predicted = (self.costs.predict(levels, batches, self.measure_s) for levels in items)
        return sum(p for p in predicted if p is not None)

    def choose_window(
        self, rest: Sequence[Levels], redo: Sequence[Levels], every: Sequence[Levels]
    ) -> bool:
        """Choose the window once the first repeat's first runs (``redo``, timed at the current
        window) have run: the most repeats, then the longest window, such that the first
        repeat's ``rest``, ``redo`` again where the window changes, and the further repeats of
        ``every`` run fit the budget with :data:`MARGIN` to spare. True where the window
        changed (the caller times ``redo`` again)."""
        if self.budget_s is None:
            return False
        left = self.left()
        for repeats in range(self.repeats, 0, -1):
            for window in range(self.window, self.shortest_window - 1, -1):
                finish = self.cost(rest, window)
                if window != self.window:
                    finish += self.cost(redo, window)
                need = finish + (repeats - 1) * self.cost(every, window)
                if need * (1 + MARGIN) <= left:
                    return self._choose(repeats, window)
        # Nothing fits: end the first repeat as soon as it can, which may mean not timing its
        # first runs again (the cost is linear in the window, so one of the ends is quickest).
        keep = self.cost(rest, self.window)
        shorten = self.cost(rest, self.shortest_window) + self.cost(redo, self.shortest_window)
        return self._choose(1, self.window if keep <= shorten else self.shortest_window)

    def _choose(self, repeats: int, window: int) -> bool:
        changed = window != self.window
        self.planned, self.window = repeats, window
        return changed

    def start_repeat(self, repeat: int, every: Sequence[Levels], settled: bool) -> bool:
        """Whether repeat ``repeat`` (from 0) starts: the first always; one past ``repeats``
        only while the verdict is not ``settled``; none past ``max_repeats``; and, with a
        budget, only one that fits what is left with :data:`MARGIN` to spare."""
        self._repeat_started = None
        if repeat > 0:
            if repeat >= max(self.repeats, self.max_repeats or 0):
                return False
            if repeat >= self.repeats and settled:
                return False
            if self.cost(every) * (1 + MARGIN) > self.left():
                return False
        self._repeat_started = self.clock()
        return True

    def end_repeat(self) -> None:
        """The repeat begun last ran to its end."""
        self._complete += 1
        if self._repeat_started is not None:
            self._repeat_s = self.clock() - self._repeat_started
        self._repeat_started = None

    def keep_going(self, repeat: int, rest: Sequence[Levels]) -> bool:
        """Before each run of repeat ``repeat``: whether the repeat's ``rest`` (this run
        included) still ends within the budget. The first repeat always goes on. Where this
        says no, the caller leaves the repeat out (:meth:`drop_repeat`)."""
        return repeat == 0 or self.cost(rest) <= self.left()

    def drop_repeat(self) -> None:
        """The repeat begun last was stopped partway and its runs left out."""
        self.dropped += 1
        self._repeat_started = None

    def plan(self) -> Plan:
        """What was planned and done so far."""
        return Plan(
            budget_s=self.budget_s,
            repeats_asked=self.repeats,
            repeats=self._complete,
            window_asked=self.window_asked,
            window=self.window,
            dropped=self.dropped,
            repeat_s=self._repeat_s,
            elapsed_s=self.elapsed(),
        )
