"""Running a policy in the simulator through the real Controller, and what a run measured."""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from drapps.control.controller import Bounds, Controller, Tick
from drapps.control.knobs import (
    CodecKnob,
    ExecutorKnob,
    Knob,
    LookaheadKnob,
    OffloadKnob,
    PriorityKnob,
    SplitKnob,
)
from drapps.control.policy import Policy, make_policy
from drapps.control.reward import RewardWeights
from drapps.sim.engine import Simulator
from drapps.sim.scenario import Scenario

CONVERGED = 0.10
"""A run has converged after a change once its smoothed throughput stays within this share of
where it settles (the mean of the segment's last 30%); see :meth:`SimRun.convergence_s`."""


@dataclass(frozen=True)
class SimRun:
    """One simulated run: every controller tick and the run's totals."""

    scenario: Scenario
    policy: str
    ticks: tuple[Tick, ...]
    duration: float
    samples: int
    wait_s: float
    hedges: int = 0
    """Overdue parts copied to a second worker (see :mod:`drapps.sim.hedging`)."""
    hedges_won: int = 0
    """Copies that came back before the part's first task."""

    @property
    def throughput(self) -> float:
        """Samples/s over the whole run."""
        return self.samples / self.duration

    @property
    def wait_fraction(self) -> float:
        """Share of the run the training loop waited for data."""
        return self.wait_s / self.duration

    @property
    def mean_reward(self) -> float:
        return statistics.fmean(t.reward for t in self.ticks) if self.ticks else 0.0

    @property
    def final_workers(self) -> int:
        return self.ticks[-1].workers if self.ticks else 0

    def convergence_s(self) -> list[float]:
        """Seconds from the start and from each timed change until throughput settles.

        Throughput is smoothed over enough ticks to hold 8 batches (at least 4 ticks): a
        tick of a slow pipeline holds less than one batch, and its throughput is 0 or a spike.
        """
        times = [0.0, *sorted(c.at for c in self.scenario.changes if c.at is not None)]
        times = [t for t in times if t < self.duration]
        batch = self.scenario.pipeline.batch_size
        out = []
        for k, start in enumerate(times):
            end = times[k + 1] if k + 1 < len(times) else self.duration
            segment = [t.state.throughput for t in self.ticks if start < t.state.t <= end]
            if len(segment) < 8:
                continue
            settled = statistics.fmean(segment[-max(3, len(segment) * 3 // 10) :])
            interval = (end - start) / len(segment)
            per_tick = max(settled * interval / batch, 1e-9)
            width = max(4, math.ceil(8 / per_tick))
            smooth = [
                statistics.fmean(segment[max(0, i - width + 1) : i + 1])
                for i in range(len(segment))
            ]
            inside = [abs(v - settled) <= CONVERGED * max(settled, 1e-9) for v in smooth]
            first = len(inside) - 1
            while first > 0 and inside[first - 1]:
                first -= 1
            out.append((first + 1) * interval)
        return out

    def summary(self) -> dict[str, Any]:
        convergence = self.convergence_s()
        return {
            "scenario": self.scenario.name,
            "policy": self.policy,
            "throughput": self.throughput,
            "wait_fraction": self.wait_fraction,
            "mean_reward": self.mean_reward,
            "final_workers": self.final_workers,
            "final_split": self.ticks[-1].applied.get("split") if self.ticks else None,
            "convergence_s": max(convergence) if convergence else None,
            "hedges": self.hedges,
            "hedges_won": self.hedges_won,
        }


def simulate(
    scenario: Scenario,
    policy: Policy | str = "heuristic",
    *,
    duration: float = 60.0,
    interval: float = 0.5,
    seed: int = 0,
    workers: int | str = "auto",
    weights: RewardWeights | None = None,
    schedule: Sequence[tuple[int, int]] | None = None,
    on_tick: Callable[[Tick], None] | None = None,
    move_split: bool = True,
    move_codec: bool = True,
    move_offload: bool = True,
    move_executor: bool = True,
) -> SimRun:
    """Run ``policy`` on ``scenario`` for ``duration`` simulated seconds.

    Args:
        scenario: the pipeline and its changes.
        policy: a Policy or a registered policy name; used when ``workers="auto"``.
        duration: simulated seconds.
        interval: controller tick, seconds (the Loader's ``control_interval``).
        seed: seeds every random cost of the run.
        workers: ``"auto"`` (start at one per core, the policy moves workers and prefetch, as
            ``Loader(workers="auto")``), a fixed count, or 0 (batches made in the training
            loop, DataLoader's default).
        weights: reward weights.
        schedule: replay: the ``(workers, prefetch)`` a recorded run applied after each tick,
            applied in its place (``workers`` is then the run's first worker count).
        on_tick: called with every tick.
        move_split: with ``workers="auto"`` and a pipeline with ``device_ops``, let the
            policy move the split (False holds it where the pipeline starts it).
        move_codec: with ``workers="auto"`` and a pipeline with a cache, let the policy pick
            the codec (False holds the one the cache starts with).
        move_offload: with ``workers="auto"`` and a pipeline with an ``offload`` share, let
            the policy move it (False holds it where the pipeline starts it).
        move_executor: with ``workers="auto"`` and a pipeline with an ``executor``, let the
            policy choose worker processes or threads (False holds the one it starts with).
    """
    if not duration > 0 or not interval > 0:
        raise ValueError(f"duration and interval must be > 0, got {duration!r}, {interval!r}")
    p = scenario.pipeline
    auto = workers == "auto"
    if not auto and (isinstance(workers, bool) or not isinstance(workers, int)):
        raise ValueError(f"workers must be 'auto' or an int, got {workers!r}")
    start = min(p.cores, p.worker_limit) if auto else int(workers)
    if schedule is not None and (auto or start < 1):
        raise ValueError(f"a replay needs the run's first worker count, got workers={workers!r}")
    sim = Simulator(scenario, workers=start, seed=seed)
    name = policy if isinstance(policy, str) else type(policy).__name__
    if schedule is not None:
        name, policy = "replay", "static"
    elif not auto:
        name, policy = f"static-{start}", "static"
    decider = make_policy(policy) if isinstance(policy, str) else policy
    controlled = auto and schedule is None
    controller = Controller(
        sim.observe,
        decider,
        sim,
        Bounds(
            min_workers=1,
            max_workers=p.worker_limit,
            max_prefetch=4 * p.worker_limit,
            adjust_workers=controlled,
            adjust_prefetch=controlled,
        ),
        interval=interval,
        weights=weights,
        knobs=[
            *split_knobs(sim, adjustable=controlled and move_split),
            *offload_knobs(sim, adjustable=controlled and move_offload),
            *codec_knobs(sim, adjustable=controlled and move_codec),
            *lookahead_knobs(sim, adjustable=controlled),
            *priority_knobs(sim, adjustable=controlled),
            *executor_knobs(sim, adjustable=controlled and move_executor),
        ],
    )
    ticks = []
    steps = round(duration / interval)
    for k in range(steps):
        sim.run_until((k + 1) * interval)
        tick = controller.step()
        ticks.append(tick)
        if schedule is not None:
            target, depth = schedule[min(k, len(schedule) - 1)]
            if target != sim.workers:
                sim.resize(target)
            if depth != sim.prefetch:
                sim.set_prefetch(depth)
        if on_tick is not None:
            on_tick(tick)
    totals = sim.totals
    return SimRun(
        scenario,
        name,
        tuple(ticks),
        steps * interval,
        totals.samples,
        totals.wait_s,
        hedges=totals.hedges,
        hedges_won=totals.hedges_won,
    )


def split_knobs(sim: Simulator, *, adjustable: bool) -> list[Knob]:
    """The split knob of a simulated pipeline with movable ops (none without them)."""
    movable = len(sim.pipeline.device_ops)
    if not movable:
        return []
    return [SplitKnob(sim.set_split, low=0, high=movable, adjustable=adjustable)]


def offload_knobs(sim: Simulator, *, adjustable: bool) -> list[Knob]:
    """The offload knob of a simulated pipeline given a share (none otherwise)."""
    if sim.pipeline.offload is None or not sim.pipeline.device_ops:
        return []
    return [OffloadKnob(sim.set_offload, adjustable=adjustable)]


def lookahead_knobs(sim: Simulator, *, adjustable: bool) -> list[Knob]:
    """The lookahead knob of a simulated worker pool, as a real pool has (none inline); it
    only acts while the pool cuts batches into parts."""
    if sim.workers == 0:
        return []
    high = max(64, 8 * sim.pipeline.worker_limit)
    return [LookaheadKnob(sim.set_lookahead, low=1, high=high, adjustable=adjustable)]


def priority_knobs(sim: Simulator, *, adjustable: bool) -> list[Knob]:
    """The workers' priority knob of a simulated worker pool, as a pool of processes has
    (none inline): moved by its rule, or by a policy trained on it."""
    if sim.workers == 0:
        return []
    return [PriorityKnob(sim.set_priority, adjustable=adjustable)]


EXECUTORS = ("process", "thread")
"""The executor knob's values, by index."""


def executor_knobs(sim: Simulator, *, adjustable: bool) -> list[Knob]:
    """The executor knob of a simulated pipeline given an ``executor`` (none otherwise, and
    none for batches made in the training loop), as ``Loader(workers="auto")`` has on a
    map-style dataset: 0 worker processes, 1 threads."""
    if sim.pipeline.executor is None or sim.workers == 0:
        return []
    return [ExecutorKnob(functools.partial(_set_executor, sim), adjustable=adjustable)]


def _set_executor(sim: Simulator, value: int) -> None:
    sim.set_executor(EXECUTORS[int(value)])


def codec_knobs(sim: Simulator, *, adjustable: bool) -> list[Knob]:
    """The codec knob of a simulated pipeline with a sample cache (none without one)."""
    cache = sim.pipeline.cache
    if cache is None:
        return []
    return [CodecKnob(sim.set_codec, choices=tuple(cache.names), adjustable=adjustable)]


def oracle_static(
    scenario: Scenario,
    *,
    duration: float = 60.0,
    interval: float = 0.5,
    seed: int = 0,
    weights: RewardWeights | None = None,
) -> SimRun:
    """The best fixed worker count for this scenario, found by trying them (hindsight: no real
    loader can know it in advance). Every count up to 16, then a geometric grid; its ticks
    scored with ``weights``."""
    limit = scenario.pipeline.worker_limit
    counts = sorted({*range(1, min(limit, 16) + 1), *_grid(16, limit)})
    runs = [
        simulate(
            scenario,
            "static",
            duration=duration,
            interval=interval,
            seed=seed,
            workers=n,
            weights=weights,
        )
        for n in counts
    ]
    return max(runs, key=lambda run: (run.throughput, -run.wait_fraction))


def _grid(low: int, high: int) -> list[int]:
    out, value = [], float(low)
    while value < high:
        value *= 1.25
        out.append(min(high, round(value)))
    return out
