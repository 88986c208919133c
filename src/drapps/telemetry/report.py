"""The bottleneck report: what the trace says, in plain words and figures."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from drapps.telemetry._advice import FED, WAITS, advise, cores_used, saturated_from
from drapps.telemetry._sections import (
    cache_story,
    device_stage_story,
    energy_story,
    executor_story,
    format_duration,
    straggler_story,
    worker_story_of_start_and_memory,
)
from drapps.telemetry._worker_count import MIN_TICKS, worker_story
from drapps.telemetry.trace import TraceRow, while_loading

__all__ = ["MIN_TICKS", "bottleneck_report"]

_STAGES = ("fetch_s", "transform_s", "collate_s", "transport_s")


_LONGER = (
    "needs a few seconds of telemetry: iterate for longer (it is sampled every "
    "control_interval, 0.5 s by default), then ask again."
)


def _verdict(wait: float) -> str:
    """What a loop that waited ``wait`` of its time for data makes the input pipeline."""
    if wait > WAITS:
        return "the input pipeline is the bottleneck"
    if wait < FED:
        return "the input pipeline kept up; the training step sets the pace"
    return "the input pipeline is close to the limit"


def _short_run(stats: dict[str, Any], workers: int | str | None) -> str:
    """What a run too short for the telemetry says, from the loader's own counters: what the
    loop received, how fast, how much of the time it waited, and what made the batches."""
    batches, samples = stats.get("batches", 0), stats.get("samples", 0)
    loading = stats.get("loading_s") or 0.0
    if not batches or loading <= 0:
        return f"No batch delivered yet: the report {_LONGER}"
    wait = min(1.0, stats.get("wait_s", 0.0) / loading)
    verdict = _verdict(wait)
    lines = [
        f"A short run: {batches} batches ({samples} samples) in {loading:.2f} s of loading, "
        f"{samples / loading:.0f} samples/s. The training loop waited {wait:.0%} of the "
        f"time for data: {verdict}."
    ]
    count, executor = stats.get("workers", 0), stats.get("executor")
    if not count and executor is not None:
        # Workers stop as an epoch without persistent workers ends: the count they ran at.
        count = stats.get("target_workers", 0)
    if not count or executor is None:
        made = "The batches were made in the training process"
    else:
        kind = {"processes": "worker processes", "threads": "worker threads"}.get(
            executor, executor
        )
        made = f"The batches were made by {count} {kind}"
    if isinstance(workers, int) and not isinstance(workers, bool):
        made += f" (num_workers={workers}, as set)"
    elif workers == "auto":
        made += ' (workers="auto" chose them)'
    first = stats.get("first_batch_s")
    if first is not None:
        made += f"; the first batch came {format_duration(first)} after iter()"
    lines.append(made + ".")
    stages = {k[:-2]: float(stats.get(k) or 0.0) for k in _STAGES[:3]}
    total = sum(stages.values())
    if total > 0:
        shares = ", ".join(f"{k} {v / total:.0%}" for k, v in stages.items())
        lines.append(f"Of the time spent making samples: {shares}.")
    lines.append(f"Where the time went (CPU, memory, the workers, what to change) {_LONGER}")
    return "\n".join(lines)


def bottleneck_report(
    rows: Sequence[TraceRow],
    stats: dict[str, Any] | None = None,
    *,
    external: str | None = None,
    persistent_workers: bool | None = None,
    epoch_samples: int | None = None,
    workers: int | str | None = None,
) -> str:
    """A report a person can act on, from trace rows (and the loader's final stats).

    ``external``: the name of a pipeline drapps only watches (``"tf.data"``): the lines about
    drapps' workers and budget are left out, and the advice is about that pipeline's knobs.
    ``persistent_workers``: the loader's setting, for the advice on short epochs (None: not a
    drapps loader with workers). ``epoch_samples``: samples in an epoch, for the joules per
    epoch (None: unknown, per sample only). ``workers``: the loader's setting, "auto" (the
    controller's count), an int (a count the user fixed: the report says so, and never that
    drapps moved it) or None (not known, as for a trace read back).
    """
    if len(rows) < MIN_TICKS:
        if external is None:
            return _short_run(stats or {}, workers)
        return f"Only {len(rows)} tick(s) of telemetry so far: the report {_LONGER}"
    rows = while_loading(rows) or rows  # a loop that never ran: report what there is
    states = [r.state for r in rows]
    # Each tick describes the time since the one before; the first, the time since the start.
    first = rows[1].t - rows[0].t if len(rows) > 1 else rows[0].t
    span = max(rows[-1].t - rows[0].t + first, 1e-9)
    wait = statistics.fmean(s.wait_fraction for s in states)
    verdict = _verdict(wait)
    timed = [s for s in states if s.latency_p50_s > 0]
    latency = "."
    if external is None and timed:
        p50 = statistics.median(s.latency_p50_s for s in timed)
        p99 = max(s.latency_p99_s for s in timed)
        # Batches made in the training process have no dispatch-to-arrival time: where some
        # were (workers="auto" moved into the loop), the figures are the workers' batches'.
        loop_made = any(s.latency_p50_s == 0 and s.throughput > 0 for s in states)
        whose = " of the batches workers made" if loop_made else ""
        latency = f"; batch latency{whose} p50 {format_duration(p50)}, p99 {format_duration(p99)}."
    lines = [
        f"Over {span:.1f} s the training loop waited {wait:.0%} of the time for data: {verdict}.",
        f"Throughput: median {statistics.median(s.throughput for s in states):.0f} samples/s, "
        f"last {states[-1].throughput:.0f}" + latency,
    ]
    stages = rows[-1].stages
    total = sum(stages.get(k, 0.0) for k in _STAGES)
    if total > 0:
        shares = {k[:-2]: stages.get(k, 0.0) / total for k in _STAGES}
        top = max(shares, key=lambda k: shares[k])
        rest = ", ".join(f"{k} {v:.0%}" for k, v in shares.items() if k != top)
        line = f"{top.capitalize()} is {shares[top]:.0%} of the time a batch takes ({rest})."
        if top == "fetch" and shares["transform"] < 0.05:
            line += (
                " Fetch is dataset[i], with any decoding done in __getitem__; passed as "
                "transform= (a drapps.ops Pipeline), that work is timed, cacheable and movable."
            )
        lines.append(line)
    if external is None:
        lines += worker_story(rows, workers)
    cores = states[-1].cores
    saturated = saturated_from(rows)
    _, others = cores_used(states)
    cpu_line = (
        f"CPU: {statistics.fmean(s.cpu_util for s in states):.0%} of {cores} cores busy on "
        f"average; the training process used {statistics.fmean(s.main_cpu for s in states):.1f} "
        + (
            f"cores, the workers {statistics.fmean(s.workers_cpu for s in states):.1f}"
            if external is None
            else f"cores ({external}'s threads run in it)"
        )
        + (f", other processes {others:.1f}." if others >= 0.05 else ".")
    )
    if saturated is not None:
        cpu_line += f" The machine's cores were saturated from {saturated:.1f} s."
    lines.append(cpu_line)
    gib = 2**30
    memory = (
        f"Memory: peak {max(s.held_bytes for s in states) / gib:.2f} GiB held by our processes"
        + (
            f" (their resident sets add up to {max(s.rss_bytes for s in states) / gib:.2f} "
            "GiB, counting the pages workers share with the training process in each), "
            if any(s.pss_bytes is not None for s in states)
            else ", "
        )
        + f"as little as {min(s.available_bytes for s in states) / gib:.1f} GiB available"
    )
    if external is None:
        memory += (
            f"; ready batches peaked at {max(s.queue_bytes for s in states) / 2**20:.0f} MiB "
            f"of a {states[-1].memory_budget / 2**20:.0f} MiB budget"
        )
    lines.append(memory + ".")
    gpu = [s.gpu_util for s in states if s.gpu_util is not None]
    if gpu:
        power = [float(s.gpu_power_w) for s in states if s.gpu_power_w is not None]
        watts = f", drawing {statistics.fmean(power):.0f} W" if power else ""
        lines.append(f"GPU: {statistics.fmean(gpu):.0%} utilised on average{watts}.")
    lines += energy_story(rows, first, epoch_samples)
    lines += device_stage_story(states)
    lines += cache_story(states, (stats or {}).get("cache"))
    lines += straggler_story(stats or {}, span)
    if external is None:
        lines += executor_story(stats or {}, rows)
        lines += worker_story_of_start_and_memory(stats or {})
    if stats:
        faults = [
            f"{stats[k]} {label}"
            for k, label in (
                ("samples_skipped", "samples skipped"),
                ("worker_restarts", "worker restarts"),
                ("timeouts", "timeouts"),
            )
            if stats.get(k)
        ]
        if faults:
            lines.append("Faults: " + ", ".join(faults) + ".")
    if external is None:
        lines += advise(rows, span, wait, stats or {}, persistent_workers, workers)
    elif wait > WAITS:
        lines.append(
            f"Advice: {external} is what the loop waits for. "
            + (
                "Its CPU is saturated: make the per-sample work cheaper or .cache() after "
                "the deterministic part."
                if saturated is not None
                else "Run its maps with num_parallel_calls=tf.data.AUTOTUNE, end it with "
                ".prefetch(tf.data.AUTOTUNE), and .cache() after the deterministic part."
            )
        )
    return "\n".join(lines)
