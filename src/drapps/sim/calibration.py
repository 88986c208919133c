"""Calibration: fit a simulated pipeline to a real run's trace, and replay runs to check it.

A trace (``Loader(trace=...)``) says, per tick, how much CPU the workers and the training
process used, how long workers spent making batches, how many samples the training loop got,
how long it waited, and what else ran on the cores. From those:

* CPU costs (a worker's per batch, the training process's per step) are CPU seconds per batch:
  contention does not change them, so they are read off directly.
* Other processes' load is the cores busy beyond ours; it becomes the replay's outside load.
* The waits that are not CPU (storage latency per batch; the accelerator's or a sleep's share
  of a step) are what is left of the wall times; they start from that estimate and are then
  refined by replaying the trace in the simulator and keeping the values that reproduce its
  throughput and wait best (a small grid search).

:func:`replay` runs a pipeline under a recorded run's conditions (its worker schedule and
outside load) and reports the error; replaying a *different* run than the one calibrated on is
the honest check.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from drapps.sim.run import SimRun, simulate
from drapps.sim.scenario import Change, PipelineModel, Scenario
from drapps.telemetry.trace import Trace, TraceRow, read_trace

_OUTSIDE_STEP = 0.25  # cores: smaller moves of the outside load are measurement noise


@dataclass(frozen=True)
class RecordedRun:
    """What a trace says happened: conditions to replay, and the measured outcome."""

    interval: float
    """Median seconds between ticks."""
    duration: float
    """Seconds the compared window spans (every tick after the first)."""
    first_workers: int
    schedule: tuple[tuple[int, int], ...]
    """(workers, prefetch) applied after each tick of the window."""
    outside: tuple[Change, ...]
    """Other processes' CPU load over time."""
    throughput: float
    """Measured samples/s over the window."""
    wait_fraction: float
    """Measured share of the window the training loop waited."""
    batch_size: int


@dataclass(frozen=True)
class Replay:
    """A simulated run under a recorded run's conditions, and how far it landed."""

    run: SimRun
    recorded: RecordedRun

    @property
    def throughput_error(self) -> float:
        """Relative error of simulated vs measured throughput (0.1: 10% off)."""
        return abs(self.run.throughput / max(self.recorded.throughput, 1e-9) - 1.0)

    @property
    def wait_error(self) -> float:
        """Absolute error of the wait fraction (0.05: five points of the run's time)."""
        return abs(self.run.wait_fraction - self.recorded.wait_fraction)


def load(trace: Trace | str | os.PathLike[str]) -> Trace:
    data = trace if isinstance(trace, Trace) else read_trace(trace)
    if len(data.rows) < 4:
        raise ValueError(f"a trace needs at least 4 ticks to calibrate from, got {len(data.rows)}")
    return data


def record(trace: Trace | str | os.PathLike[str]) -> RecordedRun:
    """The conditions and outcome of a traced run."""
    data = load(trace)
    rows = data.rows
    window = rows[1:]
    dts = [b.t - a.t for a, b in itertools.pairwise(rows)]
    interval = statistics.median(dts)
    duration = sum(dts)
    batch_size = _batch_size(data)
    samples = sum(r.state.throughput * dt for r, dt in zip(window, dts, strict=True))
    waited = sum(r.state.wait_fraction * dt for r, dt in zip(window, dts, strict=True))
    outside: list[Change] = []
    level = 0.0
    for row in window:
        load_now = _outside_load(row)
        if abs(load_now - level) >= _OUTSIDE_STEP:
            level = round(load_now / _OUTSIDE_STEP) * _OUTSIDE_STEP
            outside.append(Change(at=max(0.0, row.t - rows[0].t - interval), outside_load=level))
    return RecordedRun(
        interval=interval,
        duration=duration,
        first_workers=max(1, rows[0].workers_after),
        schedule=tuple(
            (r.workers_after, int(r.applied.get("prefetch", r.state.prefetch))) for r in window
        ),
        outside=tuple(outside),
        throughput=samples / duration,
        wait_fraction=waited / duration,
        batch_size=batch_size,
    )


def calibrate(trace: Trace | str | os.PathLike[str], *, refine: bool = True) -> PipelineModel:
    """Fit a :class:`PipelineModel` to a traced run (see the module docstring for how).

    Raises:
        ValueError: the trace is too short, or shows no batches delivered or no worker
            activity to fit from (a ``workers=0`` run).
    """
    data = load(trace)
    rows = data.rows
    recorded = record(data)
    pairs = list(itertools.pairwise(rows))
    batches = recorded.throughput * recorded.duration / recorded.batch_size
    if batches < 4:
        raise ValueError(f"the trace shows {batches:.1f} batches delivered: too few to calibrate")

    def total(get: str) -> float:
        return sum(float(b.stages.get(get, 0.0)) - float(a.stages.get(get, 0.0)) for a, b in pairs)

    def integral(field: str) -> float:
        return sum(getattr(b.state, field) * (b.t - a.t) for a, b in pairs)

    worker_cpu = integral("workers_cpu") / batches
    if worker_cpu <= 0:
        raise ValueError("the trace shows no worker CPU: calibration needs a run with workers")
    stage_wall = (total("fetch_s") + total("transform_s") + total("collate_s")) / batches
    transport = total("transport_s") / batches
    main_cpu = integral("main_cpu") / batches
    busy = recorded.duration * (1 - recorded.wait_fraction) / batches  # loop time per batch
    step_cpu = max(0.0, main_cpu - transport)
    last = rows[-1].state
    worker_rss = [float(w.get("pss", w.get("rss", 0.0))) for w in rows[-1].workers.values()]
    queue = [r.state.queue_bytes / r.state.queue_batches for r in rows if r.state.queue_batches]
    spreads = [
        r.state.latency_p99_s / r.state.latency_p50_s for r in rows if r.state.latency_p50_s > 0
    ]
    sigma = math.log(max(1.0, statistics.median(spreads))) / 2.326 if spreads else 0.2
    pipeline = PipelineModel(
        cores=last.cores,
        batch_size=recorded.batch_size,
        cpu_s=worker_cpu,
        read_s=max(0.0, stage_wall - worker_cpu),
        cost_cv=min(1.5, math.sqrt(math.expm1(sigma * sigma))),
        step_s=max(1e-4, busy - main_cpu),
        step_cpu_s=step_cpu,
        transport_s=transport,
        worker_start_s=0.3,
        batch_bytes=max(1, int(statistics.median(queue))) if queue else 2**20,
        memory_budget=max(1, last.memory_budget),
        worker_rss=int(statistics.median(worker_rss)) if worker_rss else 300 * 2**20,
        main_rss=max(0, last.held_bytes - int(sum(worker_rss))),
        total_memory=last.total_bytes,
        other_memory=max(0, last.total_bytes - last.available_bytes - last.held_bytes),
        max_workers=last.max_workers,
    )
    return _refine(pipeline, recorded) if refine else pipeline


def replay(pipeline: PipelineModel, recorded: RecordedRun, *, seed: int = 0) -> Replay:
    """Simulate ``pipeline`` under ``recorded``'s worker schedule and outside load."""
    scenario = Scenario(
        pipeline.replace(
            max_workers=max(pipeline.worker_limit, *(w for w, _ in recorded.schedule))
        ),
        recorded.outside,
        "replay",
    )
    run = simulate(
        scenario,
        duration=recorded.duration,
        interval=recorded.interval,
        seed=seed,
        workers=recorded.first_workers,
        schedule=recorded.schedule,
    )
    return Replay(run, recorded)


def _refine(pipeline: PipelineModel, recorded: RecordedRun) -> PipelineModel:
    """Scale the non-CPU waits (read latency, the step's non-CPU share) to the values whose
    replay matches the recorded throughput and wait best."""
    best, best_error = pipeline, math.inf
    factors = (0.5, 0.7, 0.85, 1.0, 1.15, 1.3, 1.6)
    # Under contention the wall time also holds CPU slowdown: the read wait may be none at all.
    # With no read wait to scale, every read factor gives the same candidate: try it once.
    read_factors = (0.0, *factors) if pipeline.read_s > 0 else (1.0,)
    for read_f, step_f in itertools.product(read_factors, factors):
        candidate = pipeline.replace(
            read_s=pipeline.read_s * read_f, step_s=max(1e-4, pipeline.step_s * step_f)
        )
        result = replay(candidate, recorded)
        error = result.throughput_error + result.wait_error
        if error < best_error:
            best, best_error = candidate, error
    return best


@dataclass(frozen=True)
class TraceFamily:
    """A scenario family made of real runs: each draw is one traced run's calibrated pipeline
    (:func:`calibrate`) under its recorded outside load, the worker cost, read latency and
    step each scaled by a factor up to ``spread`` either way, and the load's changes
    stretched to the episode's length. In a share ``varied`` of the draws the batches' cost
    spread (``cost_cv``) is drawn between 0.1 and 1.5 instead of the run's own: a few traced
    runs show one spread (the bench's images cost within 2% of each other), and a policy
    taught only by them would read any spread as that one. Training on it puts the States of
    a real machine into the simulator, where every action can be tried from them
    (``drapps train-policy --calibrate``). Pass it where a family name goes
    (``PipelineEnv(families=[..., TraceFamily.from_traces(paths)])``).
    """

    runs: tuple[tuple[PipelineModel, tuple[Change, ...], float], ...]
    """Per traced run: the calibrated pipeline, its outside load's changes, the seconds the
    trace spans."""
    spread: float = 1.25
    varied: float = 0.5
    name: str = "traces"

    def __post_init__(self) -> None:
        if not self.runs:
            raise ValueError("a TraceFamily needs at least one traced run")
        if not self.spread >= 1:
            raise ValueError(f"TraceFamily.spread must be >= 1, got {self.spread!r}")
        if not 0 <= self.varied <= 1:
            raise ValueError(f"TraceFamily.varied must be in [0, 1], got {self.varied!r}")

    @classmethod
    def from_traces(
        cls,
        traces: Sequence[Trace | str | os.PathLike[str]],
        spread: float = 1.25,
        varied: float = 0.5,
    ) -> TraceFamily:
        """Calibrate each trace (refined by replay, a few seconds each).

        Raises:
            ValueError: no traces, or one :func:`calibrate` refuses (the message names it).
        """
        runs = []
        for trace in traces:
            try:
                data = load(trace)
                recorded = record(data)
                runs.append((calibrate(data), recorded.outside, recorded.duration))
            except ValueError as exc:
                raise ValueError(f"{trace}: {exc}") from None
        return cls(tuple(runs), spread, varied)

    def __call__(self, rng: np.random.Generator, duration: float) -> Scenario:
        pipeline, outside, spans = self.runs[int(rng.integers(len(self.runs)))]
        low, high = -math.log(self.spread), math.log(self.spread)
        pipeline = pipeline.replace(
            cpu_s=pipeline.cpu_s * math.exp(rng.uniform(low, high)),
            read_s=pipeline.read_s * math.exp(rng.uniform(low, high)),
            step_s=pipeline.step_s * math.exp(rng.uniform(low, high)),
        )
        if rng.uniform() < self.varied:
            pipeline = pipeline.replace(cost_cv=rng.uniform(0.1, 1.5))
        stretch = duration / max(spans, 1e-9)
        changes = tuple(
            dataclasses.replace(c, at=c.at * stretch) if c.at is not None else c for c in outside
        )
        return Scenario(pipeline, changes, self.name)


def _batch_size(trace: Trace) -> int:
    size = trace.header.get("config", {}).get("batch_size")
    if isinstance(size, int) and size >= 1:
        return size
    raise ValueError("the trace header has no batch_size: not a drapps.Loader trace")


def _outside_load(row: TraceRow) -> float:
    """Cores busy with other processes over the tick."""
    s = row.state
    return max(0.0, s.cpu_util * s.cores - s.main_cpu - s.workers_cpu)
