"""The bottleneck report: what the trace says, in plain words and figures."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from drapps.runtime.cost import SLOW
from drapps.telemetry.trace import TraceRow, while_loading

_STAGES = ("fetch_s", "transform_s", "collate_s", "transport_s")
MIN_TICKS = 4
"""Fewer ticks than this say nothing reliable (the first one's rates start from zero)."""


def _saturated_from(rows: Sequence[TraceRow], run: int = 3) -> float | None:
    """Time from which the cores stayed saturated (under 10% idle) for ``run`` ticks."""
    streak = 0
    for i, row in enumerate(rows):
        s = row.state
        streak = streak + 1 if s.idle_cores < 0.1 * max(1, s.cores) else 0
        if streak == run:
            return rows[i - run + 1].t
    return None


def _why_workers_changed(row: TraceRow, before: int) -> str:
    """The reason for one change of the worker count, true of what happened: the policy's move
    (and what held it short), or a change that came from outside the controller."""
    move = int(row.action.moves().get("workers", 0))
    note = row.notes.get("workers")
    if move:
        reason = row.action.reason or f"the policy asked for {move:+d}"
    elif row.state.workers != before:
        reason = "changed outside the controller (resize(), or a worker that was not replaced)"
    else:
        reason = ""
    if note:
        reason = f"{reason}; {note}" if reason else note
    return reason or "no reason was recorded"


def _worker_story(rows: Sequence[TraceRow]) -> list[str]:
    counts = [rows[0].state.workers]
    changes = []
    for row in rows:
        if row.workers_after != counts[-1]:
            why = _why_workers_changed(row, counts[-1])
            changes.append(f"  at {row.t:.1f} s {counts[-1]} -> {row.workers_after}: {why}")
            counts.append(row.workers_after)
    if len(counts) == 1:
        return [f"Workers stayed at {counts[0]}."]
    return ["Workers went " + " -> ".join(map(str, counts)) + " because:", *changes]


def bottleneck_report(
    rows: Sequence[TraceRow],
    stats: dict[str, Any] | None = None,
    *,
    external: str | None = None,
    persistent_workers: bool | None = None,
    epoch_samples: int | None = None,
) -> str:
    """A report a person can act on, from trace rows (and the loader's final stats).

    ``external``: the name of a pipeline drapps only watches (``"tf.data"``): the lines about
    drapps' workers and budget are left out, and the advice is about that pipeline's knobs.
    ``persistent_workers``: the loader's setting, for the advice on short epochs (None: not a
    drapps loader with workers). ``epoch_samples``: samples in an epoch, for the joules per
    epoch (None: unknown, per sample only).
    """
    if not rows:
        return (
            "No telemetry recorded yet: iterate the loader for a few seconds with "
            "workers='auto', trace=... or progress=True."
        )
    rows = while_loading(rows) or rows  # a loop that never ran: report what there is
    states = [r.state for r in rows]
    # Each tick describes the time since the one before; the first, the time since the start.
    first = rows[1].t - rows[0].t if len(rows) > 1 else rows[0].t
    span = max(rows[-1].t - rows[0].t + first, 1e-9)
    if len(rows) < MIN_TICKS:
        return (
            f"Only {len(rows)} tick(s) of telemetry ({span:.1f} s of loading): too short to say "
            "where the time went. Iterate for a few seconds or more (a tick is "
            "control_interval, 0.5 s by default), then ask again."
        )
    wait = statistics.fmean(s.wait_fraction for s in states)
    if wait > 0.10:
        verdict = "the input pipeline is the bottleneck"
    elif wait < 0.03:
        verdict = "the input pipeline kept up; the training step sets the pace"
    else:
        verdict = "the input pipeline is close to the limit"
    timed = [s for s in states if s.latency_p50_s > 0] or states
    lines = [
        f"Over {span:.1f} s the training loop waited {wait:.0%} of the time for data: {verdict}.",
        f"Throughput: median {statistics.median(s.throughput for s in states):.0f} samples/s, "
        f"last {states[-1].throughput:.0f}"
        + (
            f"; batch latency p50 {1000 * statistics.median(s.latency_p50_s for s in timed):.0f}"
            f" ms, p99 {1000 * max(s.latency_p99_s for s in timed):.0f} ms."
            if external is None
            else "."
        ),
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
        lines += _worker_story(rows)
    cores = states[-1].cores
    saturated = _saturated_from(rows)
    cpu_line = (
        f"CPU: {statistics.fmean(s.cpu_util for s in states):.0%} of {cores} cores busy on "
        f"average; the training process used {statistics.fmean(s.main_cpu for s in states):.1f} "
        + (
            f"cores, the workers {statistics.fmean(s.workers_cpu for s in states):.1f}."
            if external is None
            else f"cores ({external}'s threads run in it)."
        )
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
    lines += _energy_story(rows, first, epoch_samples)
    lines += _device_stage_story(states)
    lines += _cache_story(states, (stats or {}).get("cache"))
    lines += _straggler_story(stats or {})
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
        lines += _advice(rows, span, wait, saturated, stats or {}, persistent_workers)
    elif wait > 0.10:
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


def _straggler_story(stats: dict[str, Any]) -> list[str]:
    """How many samples were slow, how many batches held one, and what the dispatcher did."""
    costs = stats.get("sample_costs") or {}
    slow, observed = int(costs.get("slow_samples", 0)), int(costs.get("observed", 0))
    if not slow or not observed:
        return []
    batches = max(1, int(stats.get("batches", 0)))
    held = int(costs.get("slow_batches", 0))
    median = float(costs.get("median_ms", 0.0))
    excess = 1000 * float(costs.get("slow_excess_s", 0.0)) / slow
    line = (
        f"Stragglers: {slow / observed:.1%} of samples took over {SLOW:g}x the median "
        f"({median:.1f} ms), {excess + median:.0f} ms on average; {held} of {batches} batches "
        f"({held / batches:.0%}) held one, each adding {excess:.0f} ms of work to its batch."
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


def _energy_story(rows: Sequence[TraceRow], first: float, epoch_samples: int | None) -> list[str]:
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


def _device_stage_story(states: list[Any]) -> list[str]:
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


def _cache_story(states: list[Any], cache: dict[str, Any] | None) -> list[str]:
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


_CHEAPER = (
    "make the per-sample work cheaper, move batched ops to the GPU (split=, docs/device.md), "
    "or cache decoded samples (cache=drapps.Cache(...); the dataset needs a "
    "cache_fingerprint() method to say it is deterministic, docs/cache.md)"
)


def _advice(
    rows: Sequence[TraceRow],
    span: float,
    wait: float,
    saturated: float | None,
    stats: dict[str, Any],
    persistent_workers: bool | None,
) -> list[str]:
    """The advice that holds for this run, each piece tested against the rows."""
    states = [r.state for r in rows]
    last = states[-1]
    advice = []
    spare = _idle_workers_advice(rows)
    epochs = int(stats.get("epoch", 0)) + 1
    idle = statistics.fmean(s.idle_cores for s in states)
    if persistent_workers is False and epochs >= 3 and wait > 0.10 and idle >= 0.5:
        advice.append(
            f"Advice: {epochs} epochs in {span:.0f} s, each starting new workers "
            f"(persistent_workers=False), while the loop waited {wait:.0%} with {idle:.1f} idle "
            "cores: pass persistent_workers=True to keep the workers between epochs."
        )
    if wait > 0.10 and saturated is not None:
        grew = any(
            r.workers_after > r.state.workers and r.t >= saturated for r in rows if r.action.moves()
        )
        if grew:
            advice.append(
                "Advice: the cores are saturated, and the controller still found more "
                f"workers worth keeping (it ended at {rows[-1].workers_after}); beyond that, "
                + _CHEAPER
                + "."
            )
        else:
            advice.append(
                "Advice: the pipeline is CPU-bound on this machine: more workers will not "
                "help; " + _CHEAPER + "."
            )
    elif wait > 0.10 and last.workers >= last.max_workers and spare is None:
        advice.append(
            f"Advice: workers are at max_workers={last.max_workers} with idle CPU: raise it."
        )
    if spare is not None:
        advice.append(spare)
    elif not advice and wait < 0.03 and last.workers > 1:
        advice.append("Advice: none needed.")
    return advice


_BUSY_ENOUGH = 0.8
"""Share of the time a worker is given work at which the advice counts the pool right-sized."""


def _idle_workers_advice(rows: Sequence[TraceRow]) -> str | None:
    """When, over the run's second half at the last worker count, the loop did not wait and
    the workers sat mostly idle behind a full queue: how many would keep up (batches in
    flight over a worker's busy share)."""
    workers = rows[-1].state.workers
    recent = [
        r.state
        for r in rows[len(rows) // 2 :]
        if r.state.in_flight is not None and r.state.workers == workers
    ]
    if workers < 2 or len(recent) < MIN_TICKS:
        return None
    waited = statistics.fmean(s.wait_fraction for s in recent)
    in_flight = statistics.fmean(s.in_flight or 0.0 for s in recent)
    busy = statistics.fmean(s.busy_share for s in recent)
    need = max(1, math.ceil(in_flight / _BUSY_ENOUGH))
    if waited >= 0.03 or busy >= 0.5 or need >= workers:
        return None
    seconds = recent[-1].t - recent[0].t
    return (
        f"Advice: over the last {seconds:.0f} s the loop waited {waited:.0%}, and the {workers} "
        f"workers had {in_flight:.1f} batches in flight on average ({busy:.0%} of them busy): "
        f"about {need} would keep up, and each one more holds its memory. Pass "
        'workers="auto" (the heuristic policy sheds idle workers and grows them back when '
        f"the loop waits), or workers={need} if the load stays like this."
    )
