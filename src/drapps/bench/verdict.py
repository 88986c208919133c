"""The bench's verdict: who was faster, by how much, how sure, and whether the machine let us tell.

Its ratios are :mod:`drapps.bench.figures`' (the tables print the same ones): paired by
repeat, the geometric mean of the per-repeat ratios with Student's t interval over their logs.
A comparison whose interval holds 1.0 is *not separable*: the verdict says so instead of
printing a ratio that noise could reverse. Where the run's budget cut its repeats or its timed
window, the verdict says so first.

A busy machine makes every ratio doubtful, so the runner records the CPU time that processes
outside the benchmark took during each repeat (:class:`OutsideLoad`); past
:data:`BUSY_SHARE` of the usable cores, or when the machine's own per-core speed swung by more
than :data:`SPEED_SWING`, the verdict says the machine was busy instead of naming a loser.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import psutil

from drapps.bench.budget import Plan
from drapps.bench.figures import TF, Comparison, figures

BUSY_SHARE = 0.15
"""Outside CPU above this share of the usable cores, in any repeat, means a busy machine."""
SPEED_SWING = 1.5
"""A per-core preprocessing speed whose max/min over the repeats exceeds this means a busy (or
throttled) machine."""


def _words(comparison: Comparison, best: str | None) -> str:
    if comparison.against == best:
        return f"the best fixed DataLoader ({best})"
    return "tf.data AUTOTUNE" if comparison.against.startswith(TF) else comparison.against


def comparisons(runs: list[dict[str, Any]]) -> list[tuple[Comparison, str, str]]:
    """The comparisons a verdict makes, with the words for each side: drapps' system against
    the best fixed DataLoader count and against tf.data AUTOTUNE, per workload and scenario
    (:func:`drapps.bench.figures.figures`, which the tables read too)."""
    return [
        (comparison, "drapps", _words(comparison, found.best))
        for found in figures(runs)
        for comparison in found.verdict
    ]


def settled(runs: list[dict[str, Any]]) -> bool:
    """Every comparison the verdict makes is separated (more repeats would not change it)."""
    found = comparisons(runs)
    return bool(found) and all(c.separated for c, _, _ in found)


class OutsideLoad:
    """CPU time that processes outside the benchmark take on the usable cores.

    The machine's busy time on the usable cores (from ``/proc/stat``, steal included) minus the
    CPU time of this process and every child it has waited for (each case's process, its
    workers, its scenario's hog) over the same window.
    """

    def __init__(self) -> None:
        self._cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        self._start: tuple[float, float, float] | None = None

    def _now(self) -> tuple[float, float, float]:
        per_cpu = psutil.cpu_times(percpu=True)
        chosen = [per_cpu[i] for i in self._cpus if i < len(per_cpu)] or per_cpu
        busy = sum(t.user + t.nice + t.system + getattr(t, "steal", 0.0) for t in chosen)
        busy += sum(getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0) for t in chosen)
        mine = os.times()
        ours = mine.user + mine.system + mine.children_user + mine.children_system
        return time.monotonic(), busy, ours

    def start(self) -> None:
        self._start = self._now()

    def share(self) -> float:
        """Outside CPU since :meth:`start` as a share of the usable cores (0 when idle)."""
        if self._start is None:
            raise RuntimeError("OutsideLoad.share() before start()")
        t0, busy0, ours0 = self._start
        t1, busy1, ours1 = self._now()
        cores = max(1, len(self._cpus) or psutil.cpu_count() or 1)
        if t1 <= t0:
            return 0.0
        return max(0.0, (busy1 - busy0) - (ours1 - ours0)) / ((t1 - t0) * cores)


def busy_reasons(results: dict[str, Any]) -> list[str]:
    """Why this run's machine was too busy to trust a ratio (empty when it was not)."""
    reasons = []
    shares = results.get("outside_load", [])
    if shares and max(shares) > BUSY_SHARE:
        reasons.append(
            f"processes outside the benchmark used up to {max(shares):.0%} of the usable cores "
            f"during the runs (median {statistics.median(shares):.0%})"
        )
    for workload, limit in results.get("limit", {}).items():
        low, high = limit["per_core_min"], limit["per_core_max"]
        if low > 0 and high / low > SPEED_SWING:
            reasons.append(
                f"its own per-core speed on `{workload}` swung from {low:.0f} to "
                f"{high:.0f} samples/s between repeats"
            )
    return reasons


def verdict(results: dict[str, Any]) -> list[str]:
    """A few sentences a person can act on, made from ``results`` alone: what the budget cut
    (:class:`drapps.bench.budget.Plan`), whether the machine was busy, then drapps against the
    best fixed DataLoader count and tf.data, the same figures the tables print."""
    runs = results["runs"]
    found = comparisons(runs)
    cores = results["environment"]["usable_cores"]
    repeats = max((r["repeat"] for r in runs), default=-1) + 1
    plural = "repeat" if repeats == 1 else "repeats"
    lines = [f"Verdict ({cores} usable cores, {repeats} interleaved {plural}):"]
    busy = busy_reasons(results)
    if "plan" in results:
        why = "the machine was busy" if busy else "the machine was slower than the budget allows"
        lines += [f"- {line}" for line in Plan.from_dict(results["plan"]).describe(why)]
    if not found:
        return [*lines, "- no drapps system and DataLoader ran side by side; nothing to compare."]
    if busy:
        lines.append(
            "- the machine was busy: "
            + "; ".join(busy)
            + ". No winner is named: run again on a quiet machine."
        )
    scenarios = results.get("scenarios", {})
    order = list(scenarios)
    met = dict.fromkeys((c.workload, c.scenario) for c, _, _ in found)
    for workload, scenario in sorted(
        met, key=lambda p: order.index(p[1]) if p[1] in order else len(order)
    ):
        said = [
            c.describe(subject, other, busy=bool(busy))
            for c, subject, other in found
            if (c.workload, c.scenario) == (workload, scenario)
        ]
        what = scenarios.get(scenario, "")
        label = f"`{workload}`, `{scenario}`" + (f" ({what})" if what else "")
        lines.append(f"- {label}: " + "; ".join(said) + ".")
    halves = [max(c.high / c.ratio, c.ratio / c.low) - 1 for c, _, _ in found if c.pairs >= 2]
    if halves:
        lines.append(
            f"- differences under {100 * max(halves):.0f}% are noise on this run "
            "(the widest 95% interval's half-width)."
        )
    return lines
