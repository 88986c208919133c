"""The report's advice: each piece tested against the run's rows before it is given."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from drapps.control.knobs import STREAM_COUNT_HELD
from drapps.control.state import State
from drapps.telemetry._worker_count import (
    MIN_TICKS,
    count_after,
    count_during,
    settled_workers,
)
from drapps.telemetry.trace import TraceRow

WAITS = 0.10
"""The loop's wait above which the input pipeline is the bottleneck."""
FED = 0.03
"""The loop's wait below which the input pipeline kept up."""
CACHE_WORTH_S = 100e-6
"""Seconds of fetch and transform a sample below which a cache has nothing to save: reading
an entry back costs about as much."""
_BUSY_ENOUGH = 0.8
"""Share of the time a worker is given work at which the advice counts the pool right-sized."""


def cores_used(states: Sequence[State]) -> tuple[float, float]:
    """Cores used on average by this job's processes (the training process and its workers)
    and by every other process on the cores it may run on."""
    ours = statistics.fmean(s.main_cpu + s.workers_cpu for s in states)
    busy = statistics.fmean(s.cpu_util * s.cores for s in states)
    return ours, max(0.0, busy - ours)


def saturated_from(rows: Sequence[TraceRow], run: int = 3) -> float | None:
    """Time from which the cores stayed saturated (under 10% idle) for ``run`` ticks."""
    streak = 0
    for i, row in enumerate(rows):
        s = row.state
        streak = streak + 1 if s.idle_cores < 0.1 * max(1, s.cores) else 0
        if streak == run:
            return rows[i - run + 1].t
    return None


def advise(
    rows: Sequence[TraceRow],
    span: float,
    wait: float,
    stats: dict[str, Any],
    persistent_workers: bool | None,
    setting: int | str | None,
) -> list[str]:
    """The advice that holds for this run. ``setting``: the loader's ``workers`` (an int is a
    count the user fixed)."""
    states = [r.state for r in rows]
    last = states[-1]
    fixed = isinstance(setting, int) and not isinstance(setting, bool)
    saturated = saturated_from(rows)
    advice = []
    spare = _idle_workers_advice(rows, tuned=setting == "auto")
    epochs = int(stats.get("epoch", 0)) + 1
    idle = statistics.fmean(s.idle_cores for s in states)
    # Each epoch's new workers cost about its first batch's wait (None: not measured): worth
    # advice where that adds up to a twentieth of the run.
    starts = stats.get("first_batch_s")
    restarts = starts is None or epochs * starts >= 0.05 * span
    if persistent_workers is False and epochs >= 3 and wait > WAITS and idle >= 0.5 and restarts:
        advice.append(
            f"Advice: {epochs} epochs in {span:.0f} s, each starting new workers "
            f"(persistent_workers=False), while the loop waited {wait:.0%} with {idle:.1f} idle "
            "cores: pass persistent_workers=True to keep the workers between epochs."
        )
    # A stream's count is fixed from iter(): under "auto" too, the controller cannot move it.
    stream = rows[-1].notes.get("workers") == STREAM_COUNT_HELD
    if wait > WAITS and saturated is not None:
        advice.append(_saturated_advice(rows, saturated, stats, fixed))
    elif wait > WAITS and (fixed or stream):
        if (more := _more_workers_advice(rows, wait, idle, fixed, stream)) is not None:
            advice.append(more)
    elif wait > WAITS and not fixed and count_during(rows[-1]) >= last.max_workers and not spare:
        advice.append(
            f"Advice: workers are at max_workers={last.max_workers} with idle CPU: raise it."
        )
    if spare is not None:
        advice.append(spare)
    elif not advice and wait < FED:
        advice.append("Advice: none needed.")
    elif not advice and FED <= wait <= WAITS:
        advice.append(
            f"Advice: the loop waited for data {wait:.0%} of the time: that is the most a "
            "faster input pipeline could win back."
        )
    return advice


def _more_workers_advice(
    rows: Sequence[TraceRow], wait: float, idle: float, fixed: bool, stream: bool
) -> str | None:
    """Advice for a count the controller does not move (one the user ``fixed``, or a
    ``stream``'s), the loop waiting: workers that mostly wait (on reads, on storage) need no
    core each, so about as many as the loop's wait leaves it short; workers that compute, one
    more per idle core."""
    count = count_during(rows[-1])
    cores = statistics.fmean(r.state.workers_cpu for r in rows)
    measured = any(r.workers for r in rows)  # worker processes (threads' CPU is the loop's)
    waiting = measured and count >= 1 and cores / count < 0.5
    if not waiting and idle < 1.0:
        return None
    if count == 0:
        if not fixed:
            return None
        return (
            f"Advice: the training loop spent {wait:.0%} of its time making batches while "
            f"{idle:.1f} cores sat idle: worker processes would make them beside your step "
            f"(num_workers={max(1, math.floor(idle))}, or leave num_workers out and drapps "
            "chooses)."
        )
    if waiting:
        more = max(count + 1, math.ceil(round(count / max(0.1, 1.0 - wait), 6)))
        why = (
            f"Advice: the loop waited {wait:.0%} while the {count} workers used {cores:.1f} "
            f"cores between them: they wait (on reads, on storage) more than they compute, "
            f"and more of them would wait at once"
        )
    else:
        more = count + max(1, math.floor(idle))
        why = f"Advice: the loop waited {wait:.0%} of the time while {idle:.1f} cores sat idle"
    if stream and not fixed:
        return (
            f"{why}. An iterable dataset's worker count is fixed from iter() (each worker "
            f'streams the shard get_worker_info() gives it), so workers="auto" keeps {count}: '
            f"pass num_workers={more}."
        )
    if stream:
        return f"{why}: num_workers={more}."
    if waiting:
        return (
            f"{why}: num_workers={more}, or leave num_workers out and drapps chooses (for a "
            "map-style dataset it also makes a worker's waiting samples at once, in threads)."
        )
    return (
        f"{why}: more workers would make batches faster (num_workers={more}, or leave "
        "num_workers out and drapps chooses)."
    )


def _saturated_advice(
    rows: Sequence[TraceRow], saturated: float, stats: dict[str, Any], fixed: bool
) -> str:
    """Advice for a loop that waits on saturated cores: whose processes took them, and what
    would make each batch cheaper."""
    states = [r.state for r in rows]
    ours, others = cores_used(states)
    if others >= max(0.5, ours):
        return (
            f"Advice: other processes kept the cores busy ({others:.1f} of "
            f"{states[-1].cores} on average, this job's {ours:.1f}), so the workers got what "
            "was left: more workers would only compete with them. Give this job cores of its "
            "own, or run it while the machine is free."
        )
    start, settled = count_during(rows[0]), settled_workers(rows)
    grew = any(
        count_after(rows, i) > count_during(r) and r.t >= saturated
        for i, r in enumerate(rows)
        if "workers" in r.action.moves()
    )
    if not fixed and grew and settled > start:
        return (
            f"Advice: the cores are saturated; the controller kept more workers (it settled "
            f"at {settled}, from {start}), and beyond that: {_cheaper(rows, stats)}."
        )
    return (
        "Advice: the pipeline is CPU-bound on this machine, so more workers will not help: "
        f"{_cheaper(rows, stats)}."
    )


def _cheaper(rows: Sequence[TraceRow], stats: dict[str, Any]) -> str:
    """What makes a batch cost less CPU, from where its time goes: making samples (fetch and
    transform), or collating and moving them."""
    stages = rows[-1].stages
    total = sum(stages.get(k, 0.0) for k in ("fetch_s", "transform_s", "collate_s", "transport_s"))
    making = stages.get("fetch_s", 0.0) + stages.get("transform_s", 0.0)
    if total > 0 and making < 0.5 * total:
        return (
            f"making samples is {making / total:.0%} of a batch's time and collating and "
            f"moving them {1 - making / total:.0%}, so a cheaper collate_fn or smaller samples "
            "are what would help"
        )
    advice = (
        "make the per-sample work cheaper or move batched ops to the GPU (split=, docs/device.md)"
    )
    samples = int(stats.get("samples", 0))
    if total > 0 and (not samples or making / samples >= CACHE_WORTH_S):
        advice = (
            "make the per-sample work cheaper, move batched ops to the GPU (split=, "
            "docs/device.md), or cache decoded samples (cache=drapps.Cache(...); the dataset "
            "needs a cache_fingerprint() method to say it is deterministic, docs/cache.md)"
        )
    return advice


def _idle_workers_advice(rows: Sequence[TraceRow], tuned: bool) -> str | None:
    """When, over the run's second half at the last worker count, the loop did not wait and
    the workers sat mostly idle behind a full queue: how many would keep up (batches in
    flight over a worker's busy share). ``tuned``: the count was the controller's."""
    workers = count_during(rows[-1])
    recent = [
        r.state
        for r in rows[len(rows) // 2 :]
        if r.state.in_flight is not None and r.state.workers == count_during(r) == workers
    ]
    if workers < 2 or len(recent) < MIN_TICKS:
        return None
    waited = statistics.fmean(s.wait_fraction for s in recent)
    in_flight = statistics.fmean(s.in_flight or 0.0 for s in recent)
    busy = statistics.fmean(s.busy_share for s in recent)
    need = max(1, math.ceil(in_flight / _BUSY_ENOUGH))
    if waited >= FED or busy >= 0.5 or need >= workers:
        return None
    seconds = recent[-1].t - recent[0].t
    change = (
        f"workers={need} would fix the count there if the load stays like this."
        if tuned
        else 'Pass workers="auto" (the heuristic policy sheds idle workers and grows them back '
        f"when the loop waits), or workers={need} if the load stays like this."
    )
    return (
        f"Advice: over the last {seconds:.0f} s the loop waited {waited:.0%}, and the {workers} "
        f"workers had {in_flight:.1f} batches in flight on average ({busy:.0%} of them busy): "
        f"about {need} would keep up, and each one more holds its memory. {change}"
    )
