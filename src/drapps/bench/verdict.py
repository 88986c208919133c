"""The bench's verdict: who was faster, by how much, how sure, and whether the machine let us tell.

Ratios are paired by repeat: repeat ``r`` runs every case once, interleaved, so the ratio of two
systems within one repeat cancels the machine's drift between repeats. The interval is Student's
t over the repeats' log ratios, turned back into a ratio. A comparison whose interval holds 1.0
is *not separable*: the verdict says so instead of printing a ratio that noise could reverse.

A busy machine makes every ratio doubtful, so the runner records the CPU time that processes
outside the benchmark took during each repeat (:class:`OutsideLoad`); past
:data:`BUSY_SHARE` of the usable cores, or when the machine's own per-core speed swung by more
than :data:`SPEED_SWING`, the verdict says the machine was busy instead of naming a loser.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any

import psutil

from drapps.bench.confidence import mean_interval

BUSY_SHARE = 0.15
"""Outside CPU above this share of the usable cores, in any repeat, means a busy machine."""
SPEED_SWING = 1.5
"""A per-core preprocessing speed whose max/min over the repeats exceeds this means a busy (or
throttled) machine."""
ADAPTIVE = ("drapps-heuristic", "drapps-rl", "drapps-static")
"""The drapps systems the verdict is about, in order of preference: the adaptive ones, then a
fixed count where no adaptive one ran."""


@dataclass(frozen=True)
class Comparison:
    """``system`` against ``against`` in one workload and scenario, paired by repeat."""

    workload: str
    scenario: str
    system: str
    against: str
    ratio: float
    """Geometric mean over the repeats of system / against samples/s."""
    low: float
    high: float
    """The 95% interval of the ratio (equal to ``ratio`` with fewer than 2 pairs)."""
    pairs: int

    @property
    def separated(self) -> bool:
        """The interval lies wholly above or below 1.0."""
        return self.pairs >= 2 and (self.low > 1.0 or self.high < 1.0)

    def describe(self, subject: str, other: str, busy: bool = False) -> str:
        """``"drapps was 1.08x the best fixed DataLoader (95% interval 1.03-1.13x)"``; on a
        busy machine the figures without a winner."""
        interval = f"95% interval {self.low:.2f}-{self.high:.2f}x"
        if busy:
            return f"{subject} measured {self.ratio:.2f}x {other} ({interval})"
        if not self.separated:
            return (
                f"{subject} and {other} were not separable "
                f"({self.ratio:.2f}x, {interval}, {self.pairs} repeats)"
            )
        return f"{subject} was {self.ratio:.2f}x {other} ({interval})"


def paired(
    runs: list[dict[str, Any]], workload: str, scenario: str, case: str, against: str
) -> Comparison | None:
    """The paired comparison of two cases, or None when either has no run."""
    rates: dict[str, dict[int, float]] = {case: {}, against: {}}
    for run in runs:
        if (run["workload"], run["scenario"]) == (workload, scenario) and run["case"] in rates:
            rates[run["case"]][run["repeat"]] = run["samples_per_s"]
    common = sorted(set(rates[case]) & set(rates[against]))
    logs = [
        math.log(rates[case][r] / rates[against][r])
        for r in common
        if rates[case][r] > 0 and rates[against][r] > 0
    ]
    if not logs:
        return None
    interval = mean_interval(logs)
    mean, half = interval if interval is not None else (statistics.fmean(logs), 0.0)
    return Comparison(
        workload,
        scenario,
        case,
        against,
        math.exp(mean),
        math.exp(mean - half),
        math.exp(mean + half),
        len(logs),
    )


def _best_dataloader(runs: list[dict[str, Any]], workload: str, scenario: str) -> str | None:
    """report.best_dataloader's rule (the highest median) on raw runs: the runner asks between
    repeats, before any summary exists."""
    by_case: dict[str, list[float]] = {}
    for run in runs:
        if (run["workload"], run["scenario"], run["system"]) == (workload, scenario, "dataloader"):
            by_case.setdefault(run["case"], []).append(run["samples_per_s"])
    if not by_case:
        return None
    return max(by_case, key=lambda case: statistics.median(by_case[case]))


def _case_of(runs: list[dict[str, Any]], workload: str, scenario: str, system: str) -> str | None:
    for run in runs:
        if (run["workload"], run["scenario"], run["system"]) == (workload, scenario, system):
            return str(run["case"])
    return None


def comparisons(runs: list[dict[str, Any]]) -> list[tuple[Comparison, str, str]]:
    """The comparisons a verdict makes, with the words for each side: drapps' system against
    the best fixed DataLoader count and against tf.data AUTOTUNE, per workload and scenario."""
    found = []
    pairs = list(dict.fromkeys((r["workload"], r["scenario"]) for r in runs))
    for workload, scenario in pairs:
        ours = next(
            (c for s in ADAPTIVE if (c := _case_of(runs, workload, scenario, s)) is not None),
            None,
        )
        if ours is None:
            continue
        best = _best_dataloader(runs, workload, scenario)
        if best is not None:
            comparison = paired(runs, workload, scenario, ours, best)
            if comparison is not None:
                found.append((comparison, "drapps", f"the best fixed DataLoader ({best})"))
        tf = _case_of(runs, workload, scenario, "tf-autotune")
        if tf is not None:
            comparison = paired(runs, workload, scenario, ours, tf)
            if comparison is not None:
                found.append((comparison, "drapps", "tf.data AUTOTUNE"))
    return found


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
    """A few sentences a person can act on, made from ``results`` alone."""
    runs = results["runs"]
    found = comparisons(runs)
    cores = results["environment"]["usable_cores"]
    repeats = max((r["repeat"] for r in runs), default=-1) + 1
    plural = "repeat" if repeats == 1 else "repeats"
    lines = [f"Verdict ({cores} usable cores, {repeats} interleaved {plural}):"]
    if not found:
        return [*lines, "- no drapps system and DataLoader ran side by side; nothing to compare."]
    busy = busy_reasons(results)
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
