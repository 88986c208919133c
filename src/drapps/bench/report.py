"""Benchmark results as a Markdown table (from the JSON the runner writes)."""

from __future__ import annotations

from typing import Any

from drapps.bench.runner import RESIZE_CASE


def _cell(row: dict[str, Any] | None, metric: str = "samples_per_s") -> str:
    if row is None:
        return "-"
    return f"{row[metric]:.0f} ({row[f'{metric}_min']:.0f}-{row[f'{metric}_max']:.0f})"


def markdown(results: dict[str, Any]) -> str:
    """The side-by-side table and the resize probe, with the environment they ran on."""
    rows = {(r["system"], r["workers"]): r for r in results["summary"]}
    workers = sorted({w for system, w in rows if system != RESIZE_CASE})
    env = results["environment"]
    config = results["config"]
    lines = [
        f"Workload: {results['workload']}; batch {config['batch_size']}, "
        f"{config['measure_batches']} timed batches after {config['warmup_batches']} warm-up, "
        f"median (min-max) of {config['repeats']} interleaved repeats.",
        f"Machine: {env['cpu']}, {env['usable_cores']} usable cores, "
        f"torch {env['torch']}, Python {env['python']}, commit {env['commit']}.",
        "",
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
