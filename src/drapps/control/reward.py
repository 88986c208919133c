"""Reward: one number per tick, the same function in the simulator and the real loader."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from drapps.control.state import State


@dataclass(frozen=True)
class RewardWeights:
    """How much each penalty weighs against log-throughput."""

    wait: float = 2.0
    """Per unit of consumer wait fraction (the accelerator starving)."""
    imbalance: float = 1.0
    """Per unit of resource imbalance (idle cores while the consumer starves, or workers
    crowding out the training process)."""
    memory: float = 4.0
    """Per unit of memory overrun (queue over budget, or the machine under 5% available)."""
    footprint: float = 1.0
    """Per unit of the machine's memory the pipeline holds (``State.held_bytes`` over total
    memory): a worker that adds no throughput still costs its memory. Without it, a learned
    policy trained in the simulator learns to hold every worker it may."""
    idle: float = 0.5
    """Per unit of idle workers: those beyond one that sit behind a full queue (1 minus
    ``State.busy_share``), over the pool's bound. Memory held for nothing, however much
    the machine has: on a large machine the footprint alone is too small for a learned
    policy to tell apart from noise, and a policy trained without this term kept every
    worker it had grown once the loop was fed (8 on 2 cores, reading from a full cache)."""
    start: float = 0.0
    """Per worker added (``State.workers_added``): a worker started costs its fork and cold
    start, and holds its pages from that tick on, so a worker kept for half a second raises
    the pipeline's peak memory as much as one kept for the run, while the footprint term,
    charged per tick, sees it for half a second. Without it, a learned policy added a worker
    whenever the queue ran low with a core idle and shed it at the next decision, the loop
    never waiting. Off by default: the shipped policy was trained without it
    (``docs/controller.md`` says what it did at 0.2)."""
    energy: float = 0.0
    """Per unit of ``log1p(power_w)`` (off by default). At 1.0 it and the throughput term
    together reward ``log`` of samples per joule, so a worker that adds watts but no
    samples costs reward; between 0 and 1 it trades speed for energy. A State without a
    power figure pays nothing."""

    def __post_init__(self) -> None:
        for weight in fields(self):
            if getattr(self, weight.name) < 0:
                raise ValueError(
                    f"RewardWeights.{weight.name} must be >= 0, got {getattr(self, weight.name)!r}"
                )


def imbalance(state: State) -> float:
    """0..1: idle CPU while the consumer waits, or workers using cores while the machine is
    saturated and the consumer does not wait (CPU taken from the training loop for nothing)."""
    cores = max(1, state.cores)
    if state.wait_fraction > 0.05:
        return min(1.0, state.idle_cores / cores)
    if state.cpu_util > 0.95:
        return min(1.0, state.workers_cpu / cores) * (1.0 - state.wait_fraction)
    return 0.0


def memory_overrun(state: State) -> float:
    """0..1+: how far the queue is over budget, or the machine below 5% available memory."""
    over_budget = max(0.0, state.queue_bytes / max(1, state.memory_budget) - 1.0)
    low_memory = max(0.0, 1.0 - state.available_bytes / max(1.0, 0.05 * state.total_bytes))
    return over_budget + low_memory


def idle_workers(state: State) -> float:
    """0..1: workers beyond one left without work (behind a full queue) over the pool's
    bound; 0 where batches in flight were not measured."""
    if state.in_flight is None:
        return 0.0
    spare = max(0, state.workers - 1) * (1.0 - state.busy_share)
    return min(1.0, spare / max(1, state.max_workers))


def reward(state: State, weights: RewardWeights = RewardWeights()) -> float:
    """log1p(throughput) minus weighted consumer wait, imbalance, memory overrun, memory
    footprint, idle workers, workers added and (when weighted) power."""
    power = math.log1p(state.power_w) if weights.energy and state.power_w else 0.0
    return (
        math.log1p(state.throughput)
        - weights.wait * state.wait_fraction
        - weights.imbalance * imbalance(state)
        - weights.memory * memory_overrun(state)
        - weights.footprint * state.held_bytes / max(1, state.total_bytes)
        - weights.idle * idle_workers(state)
        - weights.start * state.workers_added
        - weights.energy * power
    )
