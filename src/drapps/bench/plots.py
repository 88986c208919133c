"""PNG plots made from a results JSON, as a step separate from the run (``drapps bench-plot``).

Per workload and scenario: throughput and the training loop's wait over time, one line per
system (the repeat with the median throughput; for DataLoader the oracle static count only,
so the plot stays readable). Per workload: a bar chart of end-to-end time per scenario.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from drapps._optional import require
from drapps.bench.report import best_dataloader

WINDOW_S = 1.0
"""Rolling window for the over-time curves."""


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ordered = sorted(runs, key=lambda r: r["samples_per_s"])
    return ordered[len(ordered) // 2]


def rolling(
    timeline: list[list[float]], batch_size: int, window: float = WINDOW_S
) -> tuple[list[float], list[float], list[float]]:
    """(time, samples/s, wait share) over a trailing ``window`` at each batch's end."""
    times, rates, waits = [], [], []
    lo = 0
    for hi, (t, _) in enumerate(timeline):
        while timeline[lo][0] < t - window:
            lo += 1
        span = t - (timeline[lo - 1][0] if lo > 0 else 0.0)
        count = hi - lo + 1
        times.append(t)
        rates.append(count * batch_size / span if span > 0 else 0.0)
        waits.append(min(1.0, sum(w for _, w in timeline[lo : hi + 1]) / span) if span else 0)
    return times, rates, waits


def plot(results: dict[str, Any], out: Path) -> list[Path]:
    """Write the PNGs into ``out``; returns their paths."""
    matplotlib = require("matplotlib")
    matplotlib.use("Agg")
    pyplot = require("matplotlib.pyplot")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for workload in results["workloads"]:
        for scenario in results["scenarios"]:
            rows = [
                r
                for r in results["summary"]
                if r["workload"] == workload and r["scenario"] == scenario
            ]
            best = best_dataloader(rows)
            shown = [r for r in rows if r["system"] != "dataloader" or r is best]
            figure, (top, bottom) = pyplot.subplots(2, 1, figsize=(9, 6), sharex=True)
            for row in shown:
                runs = [
                    r
                    for r in results["runs"]
                    if r["workload"] == workload
                    and r["scenario"] == scenario
                    and r["case"] == row["case"]
                ]
                run = _median_run(runs)
                t, rate, wait = rolling(run["timeline"], run["batch_size"])
                label = row["case"] + (" (oracle static)" if row is best else "")
                top.plot(t, rate, label=label)
                bottom.plot(t, [100 * w for w in wait], label=label)
            top.set_ylabel("samples/s")
            bottom.set_ylabel("loop waited (%)")
            bottom.set_xlabel(f"seconds into the timed window ({WINDOW_S:g} s rolling)")
            top.set_title(f"{workload}, {scenario}: median repeat per system")
            top.legend(fontsize="small")
            figure.tight_layout()
            path = out / f"{workload}-{scenario}-over-time.png"
            figure.savefig(path, dpi=100)
            pyplot.close(figure)
            written.append(path)
        written.append(_end_to_end_bars(results, workload, out, pyplot))
    return written


def _end_to_end_bars(results: dict[str, Any], workload: str, out: Path, pyplot: Any) -> Path:
    scenarios = list(results["scenarios"])
    cases = sorted(
        {r["case"] for r in results["summary"] if r["workload"] == workload},
        key=lambda c: (not c.startswith("dataloader"), c),
    )
    figure, axes = pyplot.subplots(figsize=(max(8, 1.2 * len(cases) * len(scenarios) / 2), 4.5))
    width = 0.8 / max(1, len(cases))
    for i, case in enumerate(cases):
        heights = []
        for scenario in scenarios:
            runs = [
                r["end_to_end_s"]
                for r in results["runs"]
                if (r["workload"], r["scenario"], r["case"]) == (workload, scenario, case)
            ]
            heights.append(statistics.median(runs) if runs else 0.0)
        axes.bar([s + i * width for s in range(len(scenarios))], heights, width, label=case)
    axes.set_xticks([s + 0.4 - width / 2 for s in range(len(scenarios))], scenarios)
    axes.set_ylabel("end-to-end seconds (median)")
    axes.set_title(f"{workload}: time from opening the loader to the last batch")
    axes.legend(fontsize="small", ncols=2)
    figure.tight_layout()
    path = out / f"{workload}-end-to-end.png"
    figure.savefig(path, dpi=100)
    pyplot.close(figure)
    return path
