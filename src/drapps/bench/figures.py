"""The figures every bench output states, computed once from the runs.

Per workload and scenario: each case's median samples/s over its repeats with their min-max;
the best fixed DataLoader count (the highest median); and each case's throughput relative to
it, paired by repeat. Repeat ``r`` runs every case once, interleaved, so the ratio of two cases
within one repeat cancels the machine's drift between repeats; the ratio given is the geometric
mean of those per-repeat ratios, and its interval is Student's t over their logs, turned back
into a ratio.

The terminal table, the Markdown tables, the verdict and the runner's rule for another repeat
all read these figures, so a table and the sentence under it cannot state different numbers.
A ratio of two medians is never printed: on a busy machine the two medians can come from
different repeats, and their ratio then measures the load of those repeats, not the systems.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from drapps.bench.confidence import mean_interval

ADAPTIVE = ("drapps-heuristic", "drapps-rl", "drapps-static")
"""The drapps systems the verdict is about, in order of preference: the adaptive ones, then a
fixed count where no adaptive one ran."""
TF = "tf-autotune"
"""The tf.data system the verdict compares drapps with."""

RATE_STATISTIC = "median of the repeats, with their min-max"
"""How a case's samples/s is summarised, in the words the tables print."""
RATIO_STATISTIC = (
    "geometric mean of the per-repeat ratios (paired by repeat), with its 95% interval"
)
"""How a ratio between two cases is summarised, in the words the tables print."""


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
    """Repeats in which both ran."""

    @property
    def separated(self) -> bool:
        """The interval lies wholly above or below 1.0."""
        return self.pairs >= 2 and (self.low > 1.0 or self.high < 1.0)

    @property
    def interval(self) -> str:
        """``"1.03-1.13x"``; ``"-"`` with fewer than 2 pairs (no interval)."""
        return f"{self.low:.2f}-{self.high:.2f}x" if self.pairs >= 2 else "-"

    def describe(self, subject: str, other: str, busy: bool = False) -> str:
        """``"drapps was 1.08x the best fixed DataLoader (95% interval 1.03-1.13x)"``; on a
        busy machine the figures without a winner. One repeat gives no interval, and says so."""
        if self.pairs < 2:
            interval = "no interval from one repeat"
        else:
            interval = f"95% interval {self.low:.2f}-{self.high:.2f}x"
        if busy:
            return f"{subject} measured {self.ratio:.2f}x {other} ({interval})"
        if not self.separated:
            repeats = "" if self.pairs < 2 else f", {self.pairs} repeats"
            return (
                f"{subject} and {other} were not separable ({self.ratio:.2f}x, {interval}{repeats})"
            )
        return f"{subject} was {self.ratio:.2f}x {other} ({interval})"


@dataclass(frozen=True)
class CaseFigures:
    """One case's throughput over its repeats, and its ratio to the best DataLoader count."""

    case: str
    system: str
    repeats: int
    median: float
    """Median samples/s over the repeats."""
    low: float
    high: float
    """The lowest and highest samples/s of a repeat."""
    vs_best: Comparison | None
    """Paired against the best fixed DataLoader count; None where no DataLoader ran."""


@dataclass(frozen=True)
class ScenarioFigures:
    """Every case of one workload and scenario, and the comparisons the verdict makes."""

    workload: str
    scenario: str
    cases: tuple[CaseFigures, ...]
    """Highest median first."""
    best: str | None
    """The best fixed DataLoader count's case (the highest median), None where none ran."""
    verdict: tuple[Comparison, ...]
    """drapps' system against the best DataLoader count, then against tf.data, where each ran."""

    def get(self, case: str) -> CaseFigures | None:
        """The figures of ``case``, None where it did not run here."""
        return next((c for c in self.cases if c.case == case), None)


def _rates(runs: list[dict[str, Any]], case: str) -> dict[int, float]:
    return {run["repeat"]: run["samples_per_s"] for run in runs if run["case"] == case}


def paired(
    runs: list[dict[str, Any]], workload: str, scenario: str, case: str, against: str
) -> Comparison | None:
    """The paired comparison of two cases, or None when they share no repeat."""
    here = [r for r in runs if (r["workload"], r["scenario"]) == (workload, scenario)]
    mine, theirs = _rates(here, case), _rates(here, against)
    logs = [
        math.log(mine[r] / theirs[r])
        for r in sorted(set(mine) & set(theirs))
        if mine[r] > 0 and theirs[r] > 0
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


def scenario_figures(runs: list[dict[str, Any]], workload: str, scenario: str) -> ScenarioFigures:
    """The figures of one workload and scenario from the raw runs."""
    here = [r for r in runs if (r["workload"], r["scenario"]) == (workload, scenario)]
    by_case: dict[str, list[dict[str, Any]]] = {}
    for run in here:
        by_case.setdefault(run["case"], []).append(run)
    medians = {
        case: statistics.median(r["samples_per_s"] for r in g) for case, g in by_case.items()
    }
    loaders = [case for case, g in by_case.items() if g[0]["system"] == "dataloader"]
    best = max(loaders, key=lambda case: medians[case]) if loaders else None
    cases = tuple(
        CaseFigures(
            case=case,
            system=str(group[0]["system"]),
            repeats=len(group),
            median=medians[case],
            low=min(r["samples_per_s"] for r in group),
            high=max(r["samples_per_s"] for r in group),
            vs_best=None if best is None else paired(here, workload, scenario, case, best),
        )
        for case, group in sorted(by_case.items(), key=lambda item: -medians[item[0]])
    )
    systems = {c.system: c.case for c in reversed(cases)}  # the best-placed case per system
    ours = next((systems[s] for s in ADAPTIVE if s in systems), None)
    found: list[Comparison] = []
    for other in (best, systems.get(TF)):
        if ours is not None and other is not None:
            comparison = paired(here, workload, scenario, ours, other)
            if comparison is not None:
                found.append(comparison)
    return ScenarioFigures(workload, scenario, cases, best, tuple(found))


def figures(runs: list[dict[str, Any]]) -> list[ScenarioFigures]:
    """The figures of every workload and scenario that ran, in the order they first ran."""
    pairs = dict.fromkeys((r["workload"], r["scenario"]) for r in runs)
    return [scenario_figures(runs, workload, scenario) for workload, scenario in pairs]
