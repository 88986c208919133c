"""Benchmark results as Markdown, made from the JSON the runner writes."""

from __future__ import annotations

import textwrap
from typing import Any

from drapps.bench.verdict import verdict


def _spread(row: dict[str, Any], metric: str, scale: float = 1.0, digits: int = 0) -> str:
    def fmt(value: float) -> str:
        return f"{value * scale:.{digits}f}"

    return f"{fmt(row[metric])} ({fmt(row[f'{metric}_min'])}-{fmt(row[f'{metric}_max'])})"


def best_dataloader(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The DataLoader case with the highest median throughput: the best hand-tuned count."""
    static = [r for r in rows if r["system"] == "dataloader"]
    return max(static, key=lambda r: r["samples_per_s"]) if static else None


def _interval(row: dict[str, Any]) -> str:
    if "samples_per_s_ci95" not in row:
        return "-"
    return f"{row['samples_per_s_mean']:.0f} +- {row['samples_per_s_ci95']:.0f}"


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
        "| system | samples/s | 95% CI of the mean | vs oracle static | of limit | loop waited "
        "| next() p50 / p99 ms | CPU busy | CPU ms/batch: all / training process "
        "| mJ/sample | peak RSS MiB | first batch s | end-to-end s | workers at end |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    gpu = any(row.get("gpu_idle") is not None for row in rows)
    if gpu:  # a GPU was read through NVML: its idle share beside the loop's wait
        lines[2] = lines[2].replace("| loop waited ", "| loop waited | GPU idle ")
        lines[3] += "---:|"
    best = best_dataloader(rows)
    best_rate = best["samples_per_s"] if best is not None else None
    limit = results.get("limit", {}).get(workload)
    for row in rows:
        ratio = "-" if best_rate is None else f"{row['samples_per_s'] / best_rate:.2f}x"
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
        lines += ["", f"Oracle static (best DataLoader count, in bold): `{best['case']}`."]
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
    """One row per workload and scenario: each system's throughput over the oracle static."""
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
            cells = [
                f"{rows[c]['samples_per_s'] / best['samples_per_s']:.2f}x" if c in rows else "-"
                for c in others
            ]
            lines.append(
                f"| `{workload}`, `{scenario}` | {best['samples_per_s']:.0f} "
                f"({best['case']}) | " + " | ".join(cells) + " |"
            )
    return lines if len(lines) > 2 else []


def brief(results: dict[str, Any]) -> str:
    """What a terminal shows after a run: per workload and scenario a narrow table (each
    system's median samples/s, its 95% interval, its ratio to the best fixed DataLoader, the
    loop's wait where a training step ran, the workers at the end), then the verdict."""
    waits = results["config"]["consumer"] != "none"  # with no step the loop always waits
    lines: list[str] = []
    for workload in results["workloads"]:
        for scenario in results["scenarios"]:
            rows = scenario_rows(results, workload, scenario)
            if not rows:
                continue
            rows.sort(key=lambda r: -r["samples_per_s"])
            best = best_dataloader(rows)
            head = f"  {'system':22s} {'samples/s':>10s} {'95% interval':>16s} {'vs best DL':>10s}"
            lines += [
                f"{workload}, {scenario}:",
                head + (f" {'loop waited':>11s}" if waits else "") + "  workers at end",
            ]
            for row in rows:
                rate = row["samples_per_s"]
                ratio = "-" if best is None else f"{rate / best['samples_per_s']:.2f}x"
                name = row["case"] + (" *" if row is best else "")
                line = f"  {name:22s} {rate:10.0f} {_interval(row):>16s} {ratio:>10s}"
                line += f" {row['wait_fraction']:11.0%}" if waits else ""
                lines.append(f"{line}  {_ends(row)}")
            lines.append("")
    if lines:
        lines.append("* the best fixed DataLoader count in that scenario")
        lines.append("")
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
        "Read a gap smaller than the min-max spreads, or between overlapping 95% intervals of "
        "the mean (Student t over the repeats), as noise.",
    ]
    return "\n".join(lines)
