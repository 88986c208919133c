"""PNG plots made from a results JSON, as a step separate from the run (``drapps bench-plot``).

One look should say who won, so every plot draws drapps' systems in their own warm colours and
thick lines, each DataLoader worker count in its own shade of grey with its own marker and
hatch (more workers darker, the best count with the thickest line), and the peers in a cool
palette with no colour used twice; legends sit outside the data.

- ``<workload>-throughput.png``: per scenario, each system's median samples/s as a bar with the
  repeats' min-max (never below 0), sorted, the best DataLoader count marked: the figures the
  tables print (:mod:`drapps.bench.figures`).
- ``<workload>-<scenario>-over-time.png``: throughput and the loop's wait over the timed window,
  the median repeat as a line and the other repeats' range as a band, every DataLoader count
  included; where the scenario starts and stops something (the CPU hog), the time it ran is
  shaded, from the runs' own record of it.
- ``<workload>-end-to-end.png``: time from opening the loader to the last batch per scenario,
  median with min-max.

The data each plot draws is made by functions that need no matplotlib (:func:`styles`,
:func:`throughput_bars`, :func:`load_span`), so the tests check it without drawing.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from drapps._optional import require
from drapps.bench.figures import RATE_STATISTIC, scenario_figures
from drapps.bench.report import best_dataloader, scenario_rows
from drapps.bench.scenarios import SCENARIOS

WINDOW_S = 1.0
"""Rolling window for the over-time curves."""

_DRAPPS = ("#d62728", "#ff7f0e", "#8c564b", "#e377c2", "#bcbd22", "#a0522d")
"""drapps' systems: red first (the adaptive heuristic), then other warm colours."""
_PEERS = ("#1f77b4", "#2ca02c", "#17becf", "#9467bd", "#393b79", "#637939", "#6b6ecf", "#008080")
"""Every other peer, each its own cool colour."""
_BEST = " (best DataLoader)"
"""What a label adds for the best fixed DataLoader count."""
_DATALOADER_BEST = "#333333"
"""The line marking the best DataLoader count's throughput."""
_GREY_LIGHT, _GREY_DARK = 0xC4, 0x2A
"""The ends of the ramp of greys the DataLoader counts are spread over (fewest workers light)."""
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h")
_HATCHES = ("", "//", "..", "xx", "\\\\", "++", "oo", "--", "**")


def _workers_key(case: str) -> tuple[int, str]:
    """DataLoader cases by worker count (``dataloader-10`` after ``dataloader-2``)."""
    tail = case.rsplit("-", 1)[-1]
    return (int(tail), case) if tail.isdigit() else (1 << 30, case)


def _grey(i: int, n: int) -> tuple[str, str]:
    """The ``i``th of ``n`` greys, light to dark, and a hatch colour that shows on it."""
    level = _GREY_LIGHT if n < 2 else round(_GREY_LIGHT + (_GREY_DARK - _GREY_LIGHT) * i / (n - 1))
    return f"#{level:02x}{level:02x}{level:02x}", "#000000" if level > 0x80 else "#ffffff"


def styles(cases: list[str], best: str | None) -> dict[str, dict[str, Any]]:
    """A colour, width, line style, marker and hatch per case, no colour repeated.

    DataLoader's counts spread over a ramp of greys by worker count, each with its own marker
    and hatch, so every count is told apart in a legend; the best count draws thickest.

    >>> cases = ["dataloader-2", "dataloader-4", "drapps-heuristic", "tf-autotune"]
    >>> s = styles(cases, "dataloader-4")
    >>> s["drapps-heuristic"]["color"], s["dataloader-4"]["color"], s["tf-autotune"]["color"]
    ('#d62728', '#2a2a2a', '#1f77b4')
    >>> s["dataloader-2"]["color"], s["dataloader-2"]["marker"], s["dataloader-4"]["marker"]
    ('#c4c4c4', 'o', 's')
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
    loaders = sorted((c for c in cases if c.startswith("dataloader")), key=_workers_key)
    for i, case in enumerate(loaders):
        is_best = case == best
        color, edge = _grey(i, len(loaders))
        chosen[case] = {
            "color": color,
            "edgecolor": edge,
            "linewidth": 2.0 if is_best else 1.2,
            "zorder": 4 if is_best else 2,
            "linestyle": "-" if is_best else ":",
            "marker": _MARKERS[i % len(_MARKERS)],
            "hatch": _HATCHES[i % len(_HATCHES)],
        }
    return chosen


def _line(style: dict[str, Any]) -> dict[str, Any]:
    """A style's keywords for ``plot`` (a marker every so often, no hatch)."""
    line = {k: v for k, v in style.items() if k not in ("hatch", "edgecolor")}
    if "marker" in line:
        line.update(markevery=0.1, markersize=5)
    return line


def _bar(style: dict[str, Any], edge: str = "none") -> dict[str, Any]:
    """A style's keywords for ``bar``/``barh``: its colour, and its hatch drawn in a colour
    that shows on it (else ``edge`` round the bar)."""
    hatch = style.get("hatch") or None
    return {
        "color": style["color"],
        "hatch": hatch,
        "edgecolor": style.get("edgecolor", edge) if hatch else edge,
    }


@dataclass(frozen=True)
class Bar:
    """One bar of the throughput chart: a case's median and the repeats' min-max."""

    label: str
    case: str
    median: float
    below: float
    """Length of the error bar under the median: to the lowest repeat, never below 0."""
    above: float
    """Length of the error bar over the median: to the highest repeat."""


def throughput_bars(results: dict[str, Any], workload: str, scenario: str) -> list[Bar]:
    """The bars of one scenario's throughput chart, lowest median first: each case's median
    samples/s and the min-max of its repeats (samples/s are never negative, so neither is a
    bar's lower end), from the figures the tables print."""
    found = scenario_figures(results["runs"], workload, scenario)
    return [
        Bar(
            label=case.case + (_BEST if case.case == found.best else ""),
            case=case.case,
            median=case.median,
            below=case.median - max(0.0, case.low),
            above=case.high - case.median,
        )
        for case in reversed(found.cases)
    ]


def load_span(run: dict[str, Any], scenario: str) -> tuple[float, float] | None:
    """When the scenario's change (the CPU hog) ran in ``run``, in seconds of its timed window:
    as the run recorded it, or for results from before runs recorded it, from its timeline
    and the batches the scenario changes at; None where the scenario changes nothing."""
    spans = run.get("load_spans")
    if spans:
        return float(spans[0][0]), float(spans[-1][1])
    cls = SCENARIOS.get(scenario) if scenario in SCENARIOS.names() else None
    timeline = run.get("timeline") or []
    changed = cls.changed_batches(len(timeline)) if cls is not None and timeline else None
    if changed is None or spans == []:  # [] recorded: nothing ran
        return None
    first, last = changed
    ends = [t for t, _ in timeline]
    return (ends[first - 1] if first > 0 else 0.0), ends[max(0, last - 1)]


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


def load_spans(
    results: dict[str, Any], workload: str, scenario: str
) -> dict[str, tuple[float, float]]:
    """Per case, when the scenario's change ran in its median repeat (the one the over-time
    plot draws); empty where the scenario changes nothing."""
    spans = {}
    for case, runs in _runs_by_case(results, workload, scenario).items():
        span = load_span(_median_run(runs), scenario)
        if span is not None:
            spans[case] = span
    return spans


def _runs_by_case(
    results: dict[str, Any], workload: str, scenario: str
) -> dict[str, list[dict[str, Any]]]:
    by_case: dict[str, list[dict[str, Any]]] = {}
    for run in results["runs"]:
        if (run["workload"], run["scenario"]) == (workload, scenario):
            by_case.setdefault(run["case"], []).append(run)
    return by_case


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
    per_scenario = {s: throughput_bars(results, workload, s) for s in results["scenarios"]}
    per_scenario = {s: bars for s, bars in per_scenario.items() if bars}
    height = max(2.5, 0.32 * max(len(bars) for bars in per_scenario.values()) + 1.2)
    figure, axes = pyplot.subplots(
        1, len(per_scenario), figsize=(6.5 * len(per_scenario), height), squeeze=False, sharex=True
    )
    for axis, (scenario, bars) in zip(axes[0], per_scenario.items(), strict=True):
        best = next((b for b in bars if b.label.endswith(_BEST)), None)
        look = styles([b.case for b in bars], best.case if best else None)
        for y, bar in enumerate(bars):
            axis.barh(
                y,
                bar.median,
                xerr=[[bar.below], [bar.above]],
                capsize=3,
                error_kw={"elinewidth": 1, "ecolor": "black"},
                **_bar(look[bar.case]),
            )
        axis.set_yticks(range(len(bars)), [b.label for b in bars])
        for tick, bar in zip(axis.get_yticklabels(), bars, strict=True):
            if bar.case.startswith("drapps"):
                tick.set_fontweight("bold")
        if best is not None:
            axis.axvline(best.median, color=_DATALOADER_BEST, linewidth=0.8, ls="--")
        axis.set_xlim(left=0)
        axis.set_title(f"{scenario}")
        axis.set_xlabel(f"samples/s: {RATE_STATISTIC}")
    figure.suptitle(f"{workload}: throughput per system", fontweight="bold")
    return _save(figure, out / f"{workload}-throughput.png", pyplot)


def over_time_curves(
    results: dict[str, Any], workload: str, scenario: str
) -> list[tuple[str, str]]:
    """The curves of one over-time plot as (case, legend label), highest median first: every
    case, each DataLoader count included, the best one's label saying so."""
    found = scenario_figures(results["runs"], workload, scenario)
    return [(c.case, c.case + (_BEST if c.case == found.best else "")) for c in found.cases]


def _best_of(curves: list[tuple[str, str]]) -> str | None:
    return next((case for case, label in curves if label.endswith(_BEST)), None)


def _over_time(
    results: dict[str, Any], workload: str, scenario: str, out: Path, pyplot: Any
) -> Path | None:
    by_case = _runs_by_case(results, workload, scenario)
    if not by_case:
        return None
    curves = over_time_curves(results, workload, scenario)
    look = styles([case for case, _ in curves], _best_of(curves))
    waits = results["config"].get("consumer") != "none"  # with no step the loop always waits
    figure, panels = pyplot.subplots(
        2 if waits else 1, 1, figsize=(11, 6 if waits else 3.6), sharex=True, squeeze=False
    )
    top, bottom = panels[0][0], panels[-1][0]
    for case, label in curves:
        runs = by_case[case]
        run = _median_run(runs)
        t, rate, wait = rolling(run["timeline"], run["batch_size"])
        style = look[case]
        top.plot(t, rate, label=label, **_line(style))
        if waits:
            bottom.plot(t, [100 * w for w in wait], **_line(style))
        if len(runs) > 1 and t:
            grid = np.linspace(min(t), max(t), 100)
            band = []
            for other in runs:
                ot, orate, _ = rolling(other["timeline"], other["batch_size"])
                if ot:
                    band.append(np.interp(grid, ot, orate))
            stack = np.array(band)
            top.fill_between(
                grid, stack.min(0), stack.max(0), color=style["color"], alpha=0.12, linewidth=0
            )
    _shade_load(results, workload, scenario, look, [p[0] for p in panels])
    top.set_ylabel("samples/s")
    if waits:
        bottom.set_ylabel("loop waited (%)")
    bottom.set_xlabel(f"seconds into the timed window ({WINDOW_S:g} s rolling)")
    top.set_title(
        f"{workload}, {scenario}: median repeat per system (band: the repeats' range)",
        fontweight="bold",
    )
    return _save(figure, out / f"{workload}-{scenario}-over-time.png", pyplot, legend=top)


def _shade_load(
    results: dict[str, Any],
    workload: str,
    scenario: str,
    look: dict[str, dict[str, Any]],
    axes: list[Any],
) -> None:
    """Shade from the earliest start to the latest stop of the scenario's change over the
    systems drawn, and mark each system's own span in its colour along the top."""
    spans = load_spans(results, workload, scenario)
    if not spans:
        return
    start = min(s for s, _ in spans.values())
    end = max(e for _, e in spans.values())
    label = SCENARIOS.get(scenario).span_label or "the scenario's change"
    for i, axis in enumerate(axes):
        axis.axvspan(
            start,
            end,
            color="#f2c744",
            alpha=0.18,
            linewidth=0,
            zorder=0,
            label=f"{label} (each system's span on top)" if i == 0 else None,
        )
    step = 0.035
    low, high = axes[0].get_ylim()  # headroom above the data for the spans' strips
    axes[0].set_ylim(low, low + (high - low) / (1 - step * (len(spans) + 0.5)))
    for k, (case, (s, e)) in enumerate(spans.items()):
        y = 1.0 - step * (k + 0.5)
        axes[0].plot(
            [s, e],
            [y, y],
            transform=axes[0].get_xaxis_transform(),
            color=look[case]["color"],
            linewidth=3,
            solid_capstyle="butt",
            zorder=6,
        )


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
            **_bar(look[case], edge="black" if case.startswith("drapps") else "none"),
        )
    axes.set_xticks([s + 0.4 - width / 2 for s in range(len(scenarios))], scenarios)
    axes.set_ylabel("end-to-end seconds (median, min-max)")
    axes.set_title(f"{workload}: time from opening the loader to the last batch (lower is better)")
    return _save(figure, out / f"{workload}-end-to-end.png", pyplot, legend=axes)
