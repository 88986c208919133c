"""The report's sections that appear only where the run has them: energy, the device stage,
the sample cache, stragglers and the workers' start and memory; and the one way the report
writes a duration."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from drapps.runtime.cost import SLOW
from drapps.telemetry.trace import TraceRow

NEGLIGIBLE_SHARE = 0.01
"""Stragglers whose extra work adds up to less than this share of the run are not reported."""
NEGLIGIBLE_S = 0.001
"""Nor are they where each adds less than this to its batch."""


def format_duration(seconds: float) -> str:
    """A duration in the unit that keeps two or three significant digits: "180 µs", "2.5 ms",
    "52 ms", "1.2 s"."""
    if seconds >= 1.0:
        return f"{seconds:.1f} s"
    ms = 1000 * seconds
    if ms >= 10:
        return f"{ms:.0f} ms"
    if ms >= 1:
        return f"{ms:.1f} ms"
    return f"{1000 * ms:.0f} µs"


COPIED_ON_READ = 128 * 2**20
"""Private memory per worker past which the report names copy-on-read as the likely cause."""


def worker_story_of_start_and_memory(stats: dict[str, Any]) -> list[str]:
    """How long the first batch took and each worker's start, and what each worker holds
    of its own (with the usual cause and fix where it is large)."""
    lines = []
    first = stats.get("first_batch_s")
    starts = list(stats.get("worker_starts_s") or ())
    if first is not None:
        line = f"Start: the first batch came {format_duration(first)} after iter()"
        if starts:
            fastest, slowest = format_duration(min(starts)), format_duration(max(starts))
            spread = fastest if fastest == slowest else f"{fastest} to {slowest}"
            how = (
                "each a thread of the training process"
                if stats.get("executor") == "threads"
                else "each forked from the loader's zygote, not the training process"
            )
            line += (
                f"; each worker was ready {spread} after it was asked for ({len(starts)} "
                f"started, {how})"
            )
        lines.append(line + ".")
    private = [int(b) for b in stats.get("worker_private_bytes") or () if b]
    if private:
        median = statistics.median(private)
        line = (
            f"Worker memory: each worker holds {median / 2**20:.0f} MiB of its own (median of "
            f"{len(private)}; pages no other process shares)"
        )
        if median > COPIED_ON_READ:
            line += (
                ". A dataset's Python objects (a list of str paths, a dict per sample) "
                "un-share their pages as workers read them, since each read writes a "
                "reference count: keep per-sample metadata in a NumPy array or an Arrow "
                "column, which workers read without copying"
            )
        lines.append(line + ".")
    return lines


def executor_story(stats: dict[str, Any], rows: Sequence[Any] = ()) -> list[str]:
    """What made the batches and why (none without a worker pool), and each change the
    controller made between processes and threads, with its reason, from the trace's rows."""
    executor, why = stats.get("executor"), stats.get("executor_why")
    if executor is None:
        return []
    lines = _executor_line(executor, why, bool(stats.get("executor_choice")))
    words = ("worker processes", "threads")
    before, tried = None, ""
    for row in rows:
        value, reason = row.applied.get("executor"), row.action.reason
        if value is None:
            continue
        at = f"  at {row.t:.1f} s"
        if before is not None and value != before:
            lines.append(f"{at} {words[int(before)]} -> {words[int(value)]}: {reason}")
        elif reason.startswith("kept ") and tried == "executor":
            lines.append(f"{at} {reason}")
        moves = row.action.moves()
        tried = next(iter(moves)) if moves else tried
        before = value
    return lines


def _executor_line(executor: str, why: str | None, chosen: bool = False) -> list[str]:
    if executor == "threads":
        return [
            f"Executor: threads of the training process, {why}: no batch crosses a process "
            "boundary, and work that holds the GIL runs one thread at a time (pure-Python "
            "transforms are the processes' case)."
        ]
    if executor == "the training process":  # batches cheaper to make than to wait for
        return [f"Executor: the training process itself (as DataLoader's num_workers=0): {why}."]
    words = "worker processes" if executor == "processes" else executor
    if why is None and chosen and executor == "processes":
        return [
            f"Executor: {words}, where workers='auto' starts; it moves them to threads where it "
            "measures threads ahead."
        ]
    if why is None:
        return [f"Executor: {words} (the default)."]
    return [f"Executor: {words}: {why}."]


def straggler_story(stats: dict[str, Any], span: float) -> list[str]:
    """How many samples were slow, how many batches held one, and what the dispatcher did;
    nothing where what they cost is negligible (under :data:`NEGLIGIBLE_SHARE` of the run's
    ``span`` seconds, or :data:`NEGLIGIBLE_S` a sample)."""
    costs = stats.get("sample_costs") or {}
    slow, observed = int(costs.get("slow_samples", 0)), int(costs.get("observed", 0))
    if not slow or not observed:
        return []
    total = float(costs.get("slow_excess_s", 0.0))
    excess = total / slow
    if excess < NEGLIGIBLE_S or total < NEGLIGIBLE_SHARE * span:
        return []
    batches = max(1, int(stats.get("batches", 0)))
    held = int(costs.get("slow_batches", 0))
    median = float(costs.get("median_ms", 0.0)) / 1000
    line = (
        f"Stragglers: {slow / observed:.1%} of samples took over {SLOW:g}x the median "
        f"({format_duration(median)}), {format_duration(excess + median)} on average; {held} "
        f"of {batches} batches ({held / batches:.0%}) held one, each adding "
        f"{format_duration(excess)} of work to its batch."
    )
    cut = int(stats.get("cut_batches", 0))
    if cut:
        line += (
            f" {cut} batches were cut into parts made by several workers, so a slow sample "
            "held only its part."
        )
    elif stats.get("workers", 0):
        line += (
            " Batches were made whole; dispatch='samples' cuts them into parts so a slow "
            "sample holds only its part."
        )
    return [line]


def energy_story(rows: Sequence[TraceRow], first: float, epoch_samples: int | None) -> list[str]:
    """Joules over the run and per sample (and per epoch where the epoch's size is known), and
    how they were counted."""
    joules = samples = seconds = 0.0
    source = None
    for before, row in zip([None, *rows[:-1]], rows, strict=True):
        dt = first if before is None else row.t - before.t
        if row.state.power_w is None:
            continue
        joules += row.state.power_w * dt
        samples += row.state.throughput * dt
        seconds += dt
        source = row.state.energy_source or source
    if not seconds or not joules:
        return []
    line = f"Energy: {joules:.0f} J over {seconds:.1f} s ({joules / seconds:.1f} W on average)"
    if samples >= 1:
        line += f", {1000 * joules / samples:.2f} mJ per sample"
        if epoch_samples:
            line += f", about {joules / samples * epoch_samples:.0f} J per epoch of {epoch_samples}"
    line += f"; counted by {source or 'an unnamed source'}"
    if source and "estimate" in source:
        line += " (no RAPL or NVML counter was readable: an estimate, not a meter reading)"
    return [line + "."]


def device_stage_story(states: list[Any]) -> list[str]:
    """Where the split sat and what the device stage cost, when the pipeline has one."""
    splits = [s.split for s in states if s.split is not None]
    if not splits:
        return []
    staged = [s for s in states if s.device_stage_s > 0]
    line = f"Split: ops from {splits[-1]} on ran in the device stage at the end"
    if len(set(splits)) > 1:
        line += f" (it moved between {min(splits)} and {max(splits)})"
    shares = [s.offload for s in states if s.offload is not None]
    if shares:
        line += f", for {shares[-1]:.0%} of each batch's samples"
        if len(set(shares)) > 1:
            line += f" (the share moved between {min(shares):.0%} and {max(shares):.0%})"
    squeezed = [s.device_squeezed for s in states if s.device_squeezed > 0]
    if squeezed:
        line += (
            f"; short of device memory in {len(squeezed)} ticks, the stage ran batches in pieces"
        )
    if staged:
        per_batch = statistics.fmean(s.device_stage_s for s in staged)
        share = statistics.fmean(s.device_stage_share for s in staged)
        line += f"; the stage took {1000 * per_batch:.1f} ms a batch, {share:.0%} of the time"
    return [line + "."]


def cache_story(states: list[Any], cache: dict[str, Any] | None) -> list[str]:
    """What the sample cache held and served, and which codec it ended on."""
    if not cache:
        return []
    counts = cache["counts"]
    held = sum(cache["held_bytes"].values()) / 2**20
    line = (
        f"Cache: {cache['hit_rate']:.0%} of lookups hit; {sum(cache['entries'].values())} "
        f"entries, {held:.0f} MiB of a {cache['budget'] / 2**20:.0f} MiB budget, codec "
        f"{cache['codec']}"
    )
    codecs = [s.codec for s in states if s.codec is not None]
    if len(set(codecs)) > 1:
        line += f" (it moved through {' -> '.join(dict.fromkeys(codecs))})"
    if not cache["enabled"]:
        line += "; turned off: the dataset did not fit the budget"
    extra = [
        f"{counts[k]} {label}"
        for k, label in (
            ("not_admitted", "samples found no room"),
            ("corrupt", "corrupt entries remade"),
            ("lossy_batches", "batches held lossy samples"),
        )
        if counts.get(k)
    ]
    return [line + (f"; {', '.join(extra)}" if extra else "") + "."]
