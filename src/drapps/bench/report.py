"""Benchmark results as a Markdown table (from the JSON the runner writes)."""

from __future__ import annotations

from typing import Any

from drapps.bench.runner import AUTO_CASE, RESIZE_CASE


def _cell(row: dict[str, Any] | None, metric: str = "samples_per_s") -> str:
    if row is None:
        return "-"
    return f"{row[metric]:.0f} ({row[f'{metric}_min']:.0f}-{row[f'{metric}_max']:.0f})"


def _scenario_table(results: dict[str, Any]) -> list[str]:
    """Every case's throughput and loop wait under the run's consumer and scenario."""
    config = results["config"]
    consumer = config["consumer"] + (
        f" ({config['step_ms']:g} ms/batch)" if config["consumer"] == "sleep" else ""
    )
    lines = [
        f"Scenario `{config['scenario']}`, consumer `{consumer}`.",
        "",
        "| loader | samples/s | training loop waited | workers at the end |",
        "|---|---:|---:|---:|",
    ]
    names = {"torch": "DataLoader", "drapps": "drapps", AUTO_CASE: "drapps"}
    static = []
    for row in sorted(results["summary"], key=lambda r: (r["system"], str(r["workers"]))):
        if row["system"] == RESIZE_CASE:
            continue
        label = f"{names[row['system']]}, workers={row['workers']!r}".replace("'", '"')
        ends = ", ".join(str(w) for w in row["final_workers"])
        lines.append(f"| {label} | {_cell(row)} | {row['wait_fraction']:.0%} | {ends} |")
        if row["system"] == "torch":
            static.append(row)
    auto = next((r for r in results["summary"] if r["system"] == AUTO_CASE), None)
    if static and auto:
        best = max(static, key=lambda r: r["samples_per_s"])
        lines += [
            "",
            f"Best static DataLoader: {best['workers']} workers, {best['samples_per_s']:.0f} "
            f'samples/s. drapps workers="auto": {auto["samples_per_s"]:.0f} samples/s, '
            f"{auto['samples_per_s'] / best['samples_per_s']:.2f}x the best static.",
        ]
    return lines


def markdown(results: dict[str, Any]) -> str:
    """The side-by-side table and the resize probe, with the environment they ran on."""
    rows = {(r["system"], r["workers"]): r for r in results["summary"]}
    workers = sorted({w for system, w in rows if system not in (RESIZE_CASE, AUTO_CASE)})
    env = results["environment"]
    config = results["config"]
    lines = [
        f"Workload: {results['workload']}; batch {config['batch_size']}, "
        f"{config['measure_batches']} timed batches after {config['warmup_batches']} warm-up, "
        f"median (min-max) of {config['repeats']} interleaved repeats.",
        f"Machine: {env['cpu']}, {env['usable_cores']} usable cores, "
        f"torch {env['torch']}, Python {env['python']}, commit {env['commit']}.",
        "",
    ]
    config_keys = ("consumer", "scenario", "auto")
    if any(config.get(k) not in (None, "none", "steady", False) for k in config_keys):
        return "\n".join(lines + _scenario_table(results))
    lines += [
        "| workers | DataLoader samples/s | drapps samples/s | drapps / DataLoader "
        "| DataLoader CPU ms/batch | drapps CPU ms/batch |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for n in workers:
        torch_row, drapps_row = rows.get(("torch", n)), rows.get(("drapps", n))
        ratio = "-"
        if torch_row and drapps_row:
            ratio = f"{drapps_row['samples_per_s'] / torch_row['samples_per_s']:.2f}x"
        cpu = "cpu_ms_per_batch"
        lines.append(
            f"| {n} | {_cell(torch_row)} | {_cell(drapps_row)} | {ratio} "
            f"| {_cell(torch_row, cpu)} | {_cell(drapps_row, cpu)} |"
        )
    lines += [
        "",
        "Read a gap smaller than the min-max spreads as noise: the quick size (--quick, what "
        "`make bench` runs) is a smoke test, and CPU ms/batch is the steadier comparison on a "
        "busy machine. The README's figures come from the default size.",
    ]
    probe, static = rows.get((RESIZE_CASE, 2)), rows.get(("drapps", 2))
    if probe is not None:
        every = config["resize_every"]
        lines += [
            "",
            f"Resize probe: drapps starting at 2 workers, resized 2 -> 3 -> 2 ... every {every} "
            f"batches: {_cell(probe)} samples/s"
            + (f" (static 2 workers: {_cell(static)})" if static else "")
            + f"; worst wait for a batch right after a resize "
            f"{probe['wait_after_resize_max_ms']:.1f} ms vs p99 wait "
            f"{probe['wait_p99_ms']:.1f} ms over all its batches.",
        ]
    return "\n".join(lines)
