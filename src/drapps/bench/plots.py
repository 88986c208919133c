"""PNG plots made from a results JSON, as a step separate from the run (``drapps bench-plot``).

One look should say who won, so every plot draws drapps' systems in their own warm colours and
thick lines, DataLoader in greys (its best count darker), and the peers in a cool palette with
no colour used twice; intervals are drawn, and legends sit outside the data.

- ``<workload>-throughput.png``: per scenario, each system's median samples/s as a bar with its
  95% interval (min-max with fewer than 2 repeats), sorted, the best DataLoader count marked.
- ``<workload>-<scenario>-over-time.png``: throughput and the loop's wait over the timed window,
  the median repeat as a line and the other repeats' range as a band; DataLoader at its best
  count only, so the plot stays readable.
- ``<workload>-end-to-end.png``: time from opening the loader to the last batch per scenario,
  median with min-max.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import numpy as np

from drapps._optional import require
from drapps.bench.report import best_dataloader, scenario_rows

WINDOW_S = 1.0
"""Rolling window for the over-time curves."""

_DRAPPS = ("#d62728", "#ff7f0e", "#8c564b", "#e377c2", "#bcbd22", "#a0522d")
"""drapps' systems: red first (the adaptive heuristic), then other warm colours."""
_PEERS = ("#1f77b4", "#2ca02c", "#17becf", "#9467bd", "#393b79", "#637939", "#6b6ecf", "#008080")
"""Every other peer, each its own cool colour."""
_DATALOADER_BEST, _DATALOADER = "#333333", "#b0b0b0"


def styles(cases: list[str], best: str | None) -> dict[str, dict[str, Any]]:
    """A colour, width and line style per case, none repeated within one family.

    >>> cases = ["dataloader-2", "dataloader-4", "drapps-heuristic", "tf-autotune"]
    >>> s = styles(cases, "dataloader-4")
    >>> s["drapps-heuristic"]["color"], s["dataloader-4"]["color"], s["tf-autotune"]["color"]
    ('#d62728', '#333333', '#1f77b4')
    """
    chosen: dict[str, dict[str, Any]] = {}
    ours = sorted((c for c in cases if c.startswith("drapps")), key=lambda c: (c != best, c))
    ours.sort(key=lambda c: not c.startswith("drapps-heuristic"))
    peers = sorted(c for c in cases if not c.startswith(("drapps", "dataloader")))
    for i, case in enumerate(ours):
        chosen[case] = {"color": _DRAPPS[i % len(_DRAPPS)], "linewidth": 2.6, "zorder": 5}
        if i >= len(_DRAPPS):
            chosen[case]["linestyle"] = "--"
    for i, case in enumerate(peers):
        chosen[case] = {"color": _PEERS[i % len(_PEERS)], "linewidth": 1.4, "zorder": 3}
        if i >= len(_PEERS):
            chosen[case]["linestyle"] = "--"
    for case in cases:
        if case.startswith("dataloader"):
            is_best = case == best
            chosen[case] = {
                "color": _DATALOADER_BEST if is_best else _DATALOADER,
                "linewidth": 1.8 if is_best else 1.0,
                "zorder": 4 if is_best else 2,
                "linestyle": "-" if is_best else ":",
            }
    return chosen


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ordered = sorted(runs, key=lambda r: r["samples_per_s"])
    return ordered[len(ordered) // 2]


def rolling(
    timeline: list[list[float]], batch_size: int, window: float = WINDOW_S
) -> tuple[list[float], list[float], list[float]]:
    """(time, samples/s, wait share) over a trailing ``window`` at each batch's end, from the
    first batch that ends half a window in (a rate over a few milliseconds means nothing)."""
    times, rates, waits = [], [], []
    lo = 0
    settle = min(window / 2, timeline[-1][0] / 2) if timeline else 0.0
    for hi, (t, _) in enumerate(timeline):
        while timeline[lo][0] < t - window:
            lo += 1
        if t < settle:
            continue
        span = t - (timeline[lo - 1][0] if lo > 0 else 0.0)
        count = hi - lo + 1
        times.append(t)
        rates.append(count * batch_size / span if span > 0 else 0.0)
        waits.append(min(1.0, sum(w for _, w in timeline[lo : hi + 1]) / span) if span else 0)
    return times, rates, waits


def _interval(row: dict[str, Any]) -> tuple[float, float]:
    """(below, above) the median: the 95% interval of the mean where there is one, else the
    min-max spread."""
    if "samples_per_s_ci95" in row:
        mean, half = row["samples_per_s_mean"], row["samples_per_s_ci95"]
        low, high = mean - half, mean + half
    else:
        low, high = row["samples_per_s_min"], row["samples_per_s_max"]
    median = row["samples_per_s"]
    return max(0.0, median - low), max(0.0, high - median)


def plot(results: dict[str, Any], out: Path) -> list[Path]:
    """Write the PNGs into ``out``; returns their paths."""
    matplotlib = require("matplotlib")
    matplotlib.use("Agg")
    pyplot = require("matplotlib.pyplot")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for workload in results["workloads"]:
        written.append(_throughput_bars(results, workload, out, pyplot))
        for scenario in results["scenarios"]:
            path = _over_time(results, workload, scenario, out, pyplot)
            if path is not None:
                written.append(path)
        written.append(_end_to_end_bars(results, workload, out, pyplot))
    return written


def _save(figure: Any, path: Path, pyplot: Any, legend: Any = None) -> Path:
    """Put ``legend``'s axis legend outside the data, then write the PNG and free the figure."""
    if legend is not None:
        legend.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", frameon=False)
    figure.tight_layout()
    figure.savefig(path, dpi=100, bbox_inches="tight")
    pyplot.close(figure)
    return path


def _throughput_bars(results: dict[str, Any], workload: str, out: Path, pyplot: Any) -> Path:
    per_scenario = {s: scenario_rows(results, workload, s) for s in results["scenarios"]}
    per_scenario = {s: rows for s, rows in per_scenario.items() if rows}
    height = max(2.5, 0.32 * max(len(rows) for rows in per_scenario.values()) + 1.2)
    figure, axes = pyplot.subplots(
        1, len(per_scenario), figsize=(6.5 * len(per_scenario), height), squeeze=False, sharex=True
    )
    for axis, (scenario, rows) in zip(axes[0], per_scenario.items(), strict=True):
        rows.sort(key=lambda r: r["samples_per_s"])
        best = best_dataloader(rows)
        look = styles([r["case"] for r in rows], best["case"] if best else None)
        errors = np.array([_interval(r) for r in rows]).T
        axis.barh(
            range(len(rows)),
            [r["samples_per_s"] for r in rows],
            xerr=errors,
            color=[look[r["case"]]["color"] for r in rows],
            capsize=3,
            error_kw={"elinewidth": 1, "ecolor": "black"},
        )
        axis.set_yticks(
            range(len(rows)),
            [r["case"] + (" (best DataLoader)" if r is best else "") for r in rows],
        )
        for tick, row in zip(axis.get_yticklabels(), rows, strict=True):
            if row["case"].startswith("drapps"):
                tick.set_fontweight("bold")
        if best is not None:
            axis.axvline(best["samples_per_s"], color=_DATALOADER_BEST, linewidth=0.8, ls="--")
        axis.set_title(f"{scenario}")
        axis.set_xlabel("samples/s (median; bars: 95% interval of the mean)")
    figure.suptitle(f"{workload}: throughput per system", fontweight="bold")
    return _save(figure, out / f"{workload}-throughput.png", pyplot)


def _over_time(
    results: dict[str, Any], workload: str, scenario: str, out: Path, pyplot: Any
) -> Path | None:
    rows = scenario_rows(results, workload, scenario)
    if not rows:
        return None
    best = best_dataloader(rows)
    shown = [r for r in rows if r["system"] != "dataloader" or r is best]
    look = styles([r["case"] for r in shown], best["case"] if best else None)
    waits = results["config"].get("consumer") != "none"  # with no step the loop always waits
    figure, panels = pyplot.subplots(
        2 if waits else 1, 1, figsize=(11, 6 if waits else 3.6), sharex=True, squeeze=False
    )
    top, bottom = panels[0][0], panels[-1][0]
    for row in shown:
        runs = [
            r
            for r in results["runs"]
            if r["workload"] == workload and r["scenario"] == scenario and r["case"] == row["case"]
        ]
        run = _median_run(runs)
        t, rate, wait = rolling(run["timeline"], run["batch_size"])
        style = look[row["case"]]
        label = row["case"] + (" (best DataLoader)" if row is best else "")
        top.plot(t, rate, label=label, **style)
        if waits:
            bottom.plot(t, [100 * w for w in wait], **style)
        if len(runs) > 1 and t:
            grid = np.linspace(min(t), max(t), 100)
            curves = []
            for other in runs:
                ot, orate, _ = rolling(other["timeline"], other["batch_size"])
                if ot:
                    curves.append(np.interp(grid, ot, orate))
            stack = np.array(curves)
            top.fill_between(
                grid, stack.min(0), stack.max(0), color=style["color"], alpha=0.12, linewidth=0
            )
    top.set_ylabel("samples/s")
    if waits:
        bottom.set_ylabel("loop waited (%)")
    bottom.set_xlabel(f"seconds into the timed window ({WINDOW_S:g} s rolling)")
    top.set_title(
        f"{workload}, {scenario}: median repeat per system (band: the repeats' range)",
        fontweight="bold",
    )
    return _save(figure, out / f"{workload}-{scenario}-over-time.png", pyplot, legend=top)


def _end_to_end_bars(results: dict[str, Any], workload: str, out: Path, pyplot: Any) -> Path:
    scenarios = list(results["scenarios"])
    cases = sorted(
        {r["case"] for r in results["summary"] if r["workload"] == workload},
        key=lambda c: (not c.startswith("drapps"), not c.startswith("dataloader"), c),
    )
    bests = [best_dataloader(scenario_rows(results, workload, s)) for s in scenarios]
    best_cases = {b["case"] for b in bests if b is not None}
    look = styles(cases, next(iter(best_cases)) if len(best_cases) == 1 else None)
    figure, axes = pyplot.subplots(
        figsize=(min(14, max(8, 0.9 * len(cases) * len(scenarios))), 4.5)
    )
    width = 0.8 / max(1, len(cases))
    for i, case in enumerate(cases):
        heights, below, above = [], [], []
        for scenario in scenarios:
            times = [
                r["end_to_end_s"]
                for r in results["runs"]
                if (r["workload"], r["scenario"], r["case"]) == (workload, scenario, case)
            ]
            middle = statistics.median(times) if times else 0.0
            heights.append(middle)
            below.append(middle - min(times) if times else 0.0)
            above.append(max(times) - middle if times else 0.0)
        axes.bar(
            [s + i * width for s in range(len(scenarios))],
            heights,
            width,
            yerr=[below, above],
            capsize=2,
            label=case,
            color=look[case]["color"],
            edgecolor="black" if case.startswith("drapps") else "none",
        )
    axes.set_xticks([s + 0.4 - width / 2 for s in range(len(scenarios))], scenarios)
    axes.set_ylabel("end-to-end seconds (median, min-max)")
    axes.set_title(f"{workload}: time from opening the loader to the last batch (lower is better)")
    return _save(figure, out / f"{workload}-end-to-end.png", pyplot, legend=axes)
