"""Benchmark results as Markdown and as the terminal's brief, made from the JSON the runner
writes. Every throughput and ratio they print comes from :mod:`drapps.bench.figures`, as the
verdict's do."""

from __future__ import annotations

import textwrap
from typing import Any

from drapps.bench.figures import (
    RATE_STATISTIC,
    RATIO_STATISTIC,
    CaseFigures,
    ScenarioFigures,
    scenario_figures,
)
from drapps.bench.verdict import verdict


def _spread(row: dict[str, Any], metric: str, scale: float = 1.0, digits: int = 0) -> str:
    def fmt(value: float) -> str:
        return f"{value * scale:.{digits}f}"

    return f"{fmt(row[metric])} ({fmt(row[f'{metric}_min'])}-{fmt(row[f'{metric}_max'])})"


def best_dataloader(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The DataLoader case with the highest median throughput: the best hand-tuned count (the
    summary rows' form of :attr:`drapps.bench.figures.ScenarioFigures.best`)."""
    static = [r for r in rows if r["system"] == "dataloader"]
    return max(static, key=lambda r: r["samples_per_s"]) if static else None


def _interval(row: dict[str, Any]) -> str:
    if "samples_per_s_ci95" not in row:
        return "-"
    return f"{row['samples_per_s_mean']:.0f} +- {row['samples_per_s_ci95']:.0f}"


def _figures(results: dict[str, Any], workload: str, scenario: str) -> ScenarioFigures:
    return scenario_figures(results.get("runs", []), workload, scenario)


def ratio_cell(case: CaseFigures | None, best: str | None, interval: bool = True) -> str:
    """``"0.93x (0.91-0.94)"``: the case's paired ratio to the best DataLoader count, with its
    interval where it has one (not for the best count itself); ``"-"`` without a ratio."""
    if case is None or case.vs_best is None:
        return "-"
    ratio = f"{case.vs_best.ratio:.2f}x"
    if not interval or case.case == best or case.vs_best.pairs < 2:
        return ratio
    return f"{ratio} ({case.vs_best.low:.2f}-{case.vs_best.high:.2f})"


def _ends(row: dict[str, Any]) -> str:
    ends = row["final_workers"]
    return str(ends[0]) if len(set(map(str, ends))) == 1 else ", ".join(map(str, ends))


def _cpu_per_batch(row: dict[str, Any]) -> str:
    if "cpu_ms_per_batch" not in row:  # results from before it was recorded
        return "-"
    return f"{row['cpu_ms_per_batch']:.0f} / {row['loop_cpu_ms_per_batch']:.1f}"


def _energy(row: dict[str, Any]) -> str:
    if "mj_per_sample" not in row:  # results from before it was recorded
        return "-"
    return f"{row['mj_per_sample']:.2f}"


def _gpu_idle(row: dict[str, Any]) -> str:
    idle = row.get("gpu_idle")
    return "-" if idle is None else f"{idle:.0%}"


def scenario_rows(results: dict[str, Any], workload: str, scenario: str) -> list[dict[str, Any]]:
    """The summary rows of one workload and scenario (a new list, free to sort)."""
    return [
        r for r in results["summary"] if r["workload"] == workload and r["scenario"] == scenario
    ]


def scenario_table(results: dict[str, Any], workload: str, scenario: str) -> list[str]:
    rows = scenario_rows(results, workload, scenario)
    rows.sort(key=lambda r: (r["system"] != "dataloader", r["system"], str(r["workers"])))
    lines = [
        f"#### `{workload}`, `{scenario}`",
        "",
        "| system | samples/s | 95% CI of the mean | vs oracle static (95% interval) | of limit "
        "| loop waited "
        "| next() p50 / p99 ms | CPU busy | CPU ms/batch: all / training process "
        "| mJ/sample | peak RSS MiB | first batch s | end-to-end s | workers at end |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    gpu = any(row.get("gpu_idle") is not None for row in rows)
    if gpu:  # a GPU was read through NVML: its idle share beside the loop's wait
        lines[2] = lines[2].replace("| loop waited ", "| loop waited | GPU idle ")
        lines[3] += "---:|"
    best = best_dataloader(rows)
    found = _figures(results, workload, scenario)
    limit = results.get("limit", {}).get(workload)
    for row in rows:
        ratio = ratio_cell(found.get(row["case"]), found.best)
        share = "-" if limit is None else f"{row['samples_per_s'] / limit['samples_per_s']:.2f}"
        case = row["case"]
        name = f"**{case}**" if row is best else case
        lines.append(
            f"| {name} | {_spread(row, 'samples_per_s')} | {_interval(row)} | {ratio} | {share} "
            f"| {row['wait_fraction']:.0%} "
            + (f"| {_gpu_idle(row)} " if gpu else "")
            + f"| {row['wait_p50_ms']:.1f} / {row['wait_p99_ms']:.0f} "
            f"| {row['cpu_util']:.0%} | {_cpu_per_batch(row)} | {_energy(row)} "
            f"| {row['peak_rss_mib']:.0f} "
            f"| {row['first_batch_s']:.2f} | {row['end_to_end_s']:.1f} | {_ends(row)} |"
        )
    if best is not None:
        lines += [
            "",
            f"Oracle static (best DataLoader count, in bold): `{best['case']}`. samples/s: "
            f"{RATE_STATISTIC}; vs oracle static: {RATIO_STATISTIC}.",
        ]
    sources = sorted({row["energy_source"] for row in rows if row.get("energy_source")})
    if sources:
        lines += ["", f"Energy over the timed batches, counted by {'; '.join(sources)}."]
    return lines


def limit_line(workload: str, limit: dict[str, Any]) -> str:
    """How the machine's preprocessing limit for ``workload`` was measured, and its value."""
    return (
        f"Preprocessing limit of `{workload}` here: {limit['samples_per_s']:.0f} samples/s = "
        f"{limit['per_core_samples_per_s']:.0f} samples/s on one core "
        f"({limit['per_core_min']:.0f}-{limit['per_core_max']:.0f}; the per-sample pipeline "
        f"timed in-process, no loader, no hog) x {limit['cores']} usable cores. *of limit* is "
        "each system's share of it (under a scenario's hog the attainable limit is lower)."
    )


def headline(results: dict[str, Any]) -> list[str]:
    """One row per workload and scenario: each system's throughput over the oracle static,
    paired by repeat (the verdict's figures)."""
    others = sorted(
        {r["case"] for r in results["summary"] if r["system"] != "dataloader"},
        key=lambda c: (not c.startswith("tf"), c),
    )
    lines = [
        "| workload, scenario | oracle static samples/s | "
        + " | ".join(f"{c} / oracle" for c in others)
        + " |",
        "|---|---:|" + "---:|" * len(others),
    ]
    for workload in results["workloads"]:
        for scenario in results["scenarios"]:
            rows = {r["case"]: r for r in scenario_rows(results, workload, scenario)}
            best = best_dataloader(list(rows.values()))
            if best is None:
                continue
            found = _figures(results, workload, scenario)
            cells = [ratio_cell(found.get(c), found.best) for c in others]
            lines.append(
                f"| `{workload}`, `{scenario}` | {best['samples_per_s']:.0f} "
                f"({best['case']}) | " + " | ".join(cells) + " |"
            )
    if len(lines) <= 2:
        return []
    return [*lines, "", f"Each ratio: {RATIO_STATISTIC}."]


def brief(results: dict[str, Any]) -> str:
    """What a terminal shows after a run: per workload and scenario a narrow table (each
    system's median samples/s with the repeats' min-max, its paired ratio to the best fixed
    DataLoader with that ratio's 95% interval, the loop's wait where a training step ran, the
    workers at the end), a line saying which statistic each column is, then the verdict,
    which states the same figures."""
    waits = results["config"]["consumer"] != "none"  # with no step the loop always waits
    lines: list[str] = []
    repeats = 0
    for workload in results["workloads"]:
        for scenario in results["scenarios"]:
            rows = {r["case"]: r for r in scenario_rows(results, workload, scenario)}
            found = _figures(results, workload, scenario)
            if not found.cases:
                continue
            head = (
                f"  {'system':22s} {'samples/s':>9s} {'min-max':>11s} {'vs best DL':>10s} "
                f"{'95% interval':>12s}"
            )
            lines += [
                f"{workload}, {scenario}:",
                head + (f" {'loop waited':>11s}" if waits else "") + "  workers at end",
            ]
            for case in found.cases:
                repeats = max(repeats, case.repeats)
                spread = f"{case.low:.0f}-{case.high:.0f}"
                comparison = case.vs_best
                interval = (
                    "-" if comparison is None or case.case == found.best else comparison.interval
                )
                name = case.case + (" *" if case.case == found.best else "")
                line = (
                    f"  {name:22s} {case.median:9.0f} {spread:>11s} "
                    f"{ratio_cell(case, found.best, interval=False):>10s} {interval:>12s}"
                )
                row = rows.get(case.case)
                if waits:
                    line += f" {row['wait_fraction']:11.0%}" if row else f" {'-':>11s}"
                lines.append(f"{line}  {_ends(row) if row else '-'}")
            lines.append("")
    if lines:
        rates = (
            "one repeat's"
            if repeats == 1
            else f"the median of {repeats} repeats, with their min-max"
        )
        legend = (
            f"samples/s: {rates}. vs best DL: "
            "the ratio to the best fixed DataLoader count (*, the highest median), paired by "
            "repeat: the geometric mean of the per-repeat ratios, and its 95% interval. The "
            "verdict states the same figures."
        )
        lines += [textwrap.fill(legend, 100), ""]
    said = [textwrap.fill(line, 100, subsequent_indent="  ") for line in verdict(results)]
    return "\n".join([*lines, *said])


def markdown(results: dict[str, Any]) -> str:
    """Every workload and scenario's table, with the method and machine they ran on."""
    config, env = results["config"], results["environment"]
    lines = [
        f"Consumer `{config['consumer']}`"
        + (
            " (step per batch: "
            + ", ".join(f"{w} {ms:g} ms" for w, ms in config["step_ms"].items())
            + ")"
            if config["consumer"] == "sleep"
            else ""
        )
        + f"; {config['measure_batches']} timed batches"
        + (f" and at least {config['measure_s']:g} s" if config.get("measure_s") else "")
        + f" after {config['warmup_batches']} "
        f"warm-up per run, each run a fresh process; median (min-max) of {config['repeats']} "
        f"interleaved repeats; size `{config['size']}`.",
        f"Machine: {env['cpu']}, {env['usable_cores']} usable cores, {env['memory_gib']} GiB; "
        f"torch {env['torch']}, Python {env['python']}, commit {env['commit']}.",
        "",
    ]
    for name, summary in results["workloads"].items():
        lines.append(f"- workload `{name}`: {summary}")
    for name, summary in results["scenarios"].items():
        lines.append(f"- scenario `{name}`: {summary}")
    for name, reason in results.get("skipped", {}).items():
        lines.append(f"- skipped `{name}`: {reason}")
    lines += ["", *verdict(results)]
    summary = headline(results)
    if summary:
        lines += ["", *summary]
    for workload, limit in results.get("limit", {}).items():
        lines += ["", limit_line(workload, limit)]
    for workload in results["workloads"]:
        for scenario in results["scenarios"]:
            lines += ["", *scenario_table(results, workload, scenario)]
    lines += [
        "",
        "samples/s is over the timed window; *loop waited* is the share of it the training "
        "loop spent blocked in next(); CPU busy is all processes' CPU time over the usable "
        "cores (the scenario's own hog left out); peak RSS sums all processes (shared pages "
        "count once per process); end-to-end runs from opening the loader to the last batch. "
        f"samples/s is the {RATE_STATISTIC}; a ratio to the oracle static is the "
        f"{RATIO_STATISTIC}, as in the verdict. Read a ratio whose interval holds 1.00, or a "
        "gap between overlapping 95% intervals of the mean (Student t over the repeats), as "
        "noise.",
    ]
    return "\n".join(lines)
