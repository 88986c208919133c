"""The report's worker count: the count a run settled on, and why the count moved or stayed."""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence

from drapps.control.heuristic import HeuristicConfig
from drapps.telemetry.trace import TraceRow

MIN_TICKS = 4
"""Fewer ticks than this say nothing reliable: each is a fraction of a second, the first
one taken up by start-up."""
_DEFAULTS = HeuristicConfig()
SETTLED_TICKS = _DEFAULTS.settle + _DEFAULTS.window + 2
"""Ticks a count must be held to count as settled: longer than the heuristic takes to judge a
try (it ignores ``settle`` ticks, then measures ``window``), so a try still being judged when
the run ends is not taken for the count the run settled on."""
FIRST_TRY_TICKS = _DEFAULTS.settle + 1 + _DEFAULTS.window
"""Ticks of flowing data the heuristic measures before its first try."""


def count_during(row: TraceRow) -> int:
    """The worker count of a row's tick: the count asked of the pool where the trace has it
    (the count running dips to 0 between two epochs whose workers are not kept, and climbs
    back as they start), else the count running."""
    target = row.state.target_workers
    return row.state.workers if target is None else target


def count_after(rows: Sequence[TraceRow], i: int) -> int:
    """The worker count after the decision of tick ``i``: the count of the tick after it (a
    move applied, or a ``resize()`` in between), and after the last tick, what its move set."""
    row = rows[i]
    if row.state.target_workers is None:  # an older trace: the count the tick applied
        return row.workers_after
    if i + 1 < len(rows):
        return count_during(rows[i + 1])
    moved = "workers" in row.action.moves() and row.workers_after > 0
    return row.workers_after if moved else row.state.target_workers


def held_counts(rows: Sequence[TraceRow]) -> list[tuple[int, int]]:
    """The worker counts in order, each with the ticks it was held (a count set at the last
    tick closes the list, held 0 ticks)."""
    counts: list[list[int]] = []
    for row in rows:
        if counts and counts[-1][0] == count_during(row):
            counts[-1][1] += 1
        else:
            counts.append([count_during(row), 1])
    after = count_after(rows, len(rows) - 1) if rows else 0
    if rows and after != counts[-1][0]:
        counts.append([after, 0])
    return [(count, ticks) for count, ticks in counts]


def settled_workers(rows: Sequence[TraceRow]) -> int:
    """The count the run settled on: the last one held for :data:`SETTLED_TICKS`; in a run
    that held none that long, the last count, unless it was held under :data:`MIN_TICKS` (a
    try cut short by the run's end), which the count before it is then."""
    counts = held_counts(rows)
    stable = [count for count, ticks in counts if ticks >= SETTLED_TICKS]
    if stable:
        return stable[-1]
    final, ticks = counts[-1]
    return final if ticks >= MIN_TICKS or len(counts) == 1 else counts[-2][0]


def _why_changed(row: TraceRow, before: int, after: int, fixed: bool) -> str:
    """The reason for one change of the worker count, true of what happened: the policy's move
    (and what held it short), the default count's move between its workers and the training
    process, or a change that came from outside the controller."""
    move = int(row.action.moves().get("workers", 0))
    note = row.notes.get("workers")
    if move and not fixed:
        reason = row.action.reason or f"the policy asked for {move:+d}"
    elif not fixed and 0 in (before, after):
        reason = (
            "batches made in the training process (see Executor)"
            if after == 0
            else "the workers came back (see Executor)"
        )
    elif row.state.workers != before or row.state.target_workers is not None:
        reason = (
            "by resize(), or a worker that was not replaced"
            if fixed
            else "changed outside the controller (resize(), or a worker that was not replaced)"
        )
    else:
        reason = ""
    if note:
        reason = f"{reason}; {note}" if reason else note
    return reason or "no reason was recorded"


def worker_story(rows: Sequence[TraceRow], setting: int | str | None) -> list[str]:
    """How the worker count went and why. ``setting``: the loader's ``workers`` (an int is a
    count the user fixed, which drapps never moves; "auto" or None: the controller's)."""
    fixed = isinstance(setting, int) and not isinstance(setting, bool)
    counts = [count_during(rows[0])]
    changes = []
    for i, row in enumerate(rows):
        after = count_after(rows, i)
        if after != counts[-1]:
            why = _why_changed(row, counts[-1], after, fixed)
            changes.append(f"  at {row.t:.1f} s {counts[-1]} -> {after}: {why}")
            counts.append(after)
    if len(counts) == 1:
        if counts[0] == 0:
            why = "(workers=0)" if fixed or setting == 0 else "(see Executor)"
            return [
                f"Workers: none {why}: the training process made every batch itself, so "
                "the loop's wait is the time it spent making them."
            ]
        if fixed:
            return [
                f"Workers: {counts[0]} throughout, the count you gave (drapps keeps a fixed "
                "count, as DataLoader does)."
            ]
        return [f"Workers stayed at {counts[0]}: {_why_stayed(rows)}."]
    lines = ["Workers went " + " -> ".join(map(str, counts)) + " because:", *changes]
    settled = settled_workers(rows)
    if not fixed and settled != counts[-1]:
        held = held_counts(rows)[-1][1] * tick_s(rows)
        lines.append(
            f"The run ended {held:.1f} s into a try of {describe(counts[-1])}; before that "
            f"try it had settled on {settled}."
        )
    return lines


def describe(workers: int) -> str:
    """``"1 worker"``, ``"3 workers"``."""
    return "1 worker" if workers == 1 else f"{workers} workers"


def tick_s(rows: Sequence[TraceRow]) -> float:
    """Seconds between ticks (the median gap; the first row's time for a single row)."""
    gaps = [b.t - a.t for a, b in itertools.pairwise(rows)]
    return statistics.median(gaps) if gaps else rows[0].t


def _why_stayed(rows: Sequence[TraceRow]) -> str:
    """Why the controller kept the count it started with, from what the rows show."""
    notes = [row.notes["workers"] for row in rows if row.notes.get("workers")]
    if notes:
        return notes[-1]
    held = [
        row.action.reason
        for row in rows
        if row.action.reason and row.action.is_noop and not row.action.reason.startswith("kept ")
    ]
    if held:  # a policy that says why it holds (the learned one does), not a kept try's record
        return held[-1]
    states = [row.state for row in rows]
    last = states[-1]
    tick = tick_s(rows)
    flowing = sum(1 for s in states if s.throughput > 0)
    if flowing < FIRST_TRY_TICKS:
        return (
            f"the run was too short to judge another count (the controller measures about "
            f"{FIRST_TRY_TICKS * tick:.1f} s of flowing batches before its first try; they "
            f"flowed for {flowing * tick:.1f} s)"
        )
    wait = statistics.fmean(s.wait_fraction for s in states)
    if wait < _DEFAULTS.wait_low:
        return f"the loop waited {wait:.0%} of the time, so the workers kept up"
    if wait <= _DEFAULTS.wait_high:
        return f"the loop waited {wait:.0%} of the time, too little for another worker to pay"
    if count_during(rows[-1]) >= last.max_workers:
        return f"it is max_workers={last.max_workers}"
    busy = statistics.fmean(s.cpu_util for s in states)
    if busy >= _DEFAULTS.cpu_busy:
        return (
            f"the loop waited {wait:.0%} of the time, but the cores were {busy:.0%} busy: "
            "another worker would only share them"
        )
    return f"the loop waited {wait:.0%} of the time, and the controller found no change to try"
