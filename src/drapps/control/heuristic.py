"""The heuristic policy: memory-aware hill climbing on the worker count, with hysteresis.

Design and reasoning: ``docs/controller.md``. In short: while the training loop waits, try one
more worker and keep it only if throughput rose (or the wait fell) by a margin; when the loop
does not wait and batches pile up, try one fewer and keep that only if nothing got worse. A
failed try backs off (doubling) before the same direction is tried again, unless conditions
change markedly. Memory pressure overrides everything and sheds workers and prefetch.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass

from drapps.control.action import NOOP, Action
from drapps.control.policy import register_policy
from drapps.control.state import State


@dataclass(frozen=True)
class HeuristicConfig:
    """Thresholds of the heuristic policy (in ticks of the controller's interval)."""

    wait_high: float = 0.10
    """Consumer wait fraction above which the pipeline is starving the training loop."""
    wait_low: float = 0.03
    """Consumer wait fraction below which the pipeline has capacity to spare."""
    min_gain: float = 0.05
    """Relative throughput gain a new worker must bring to be kept."""
    window: int = 4
    """Ticks averaged to judge the current state (and a probe's baseline)."""
    settle: int = 2
    """Ticks ignored after a change while the pool and queue settle."""
    backoff: int = 8
    """Ticks before a direction that failed is tried again (doubles on each failure)."""
    max_backoff: int = 120
    """Longest backoff, in ticks."""
    memory_floor: float = 0.10
    """Share of machine memory that must stay available; below it workers are shed."""
    context_change: float = 0.15
    """Change in wait fraction (or in idle cores / cores) that cancels a backoff."""
    bursty: float = 2.5
    """p99/p50 batch latency above which arrivals count as bursty (prefetch absorbs bursts)."""
    max_prefetch_per_worker: int = 4
    """Most prefetch depth the policy asks for, per worker."""

    def __post_init__(self) -> None:
        if not 0 <= self.wait_low < self.wait_high <= 1:
            raise ValueError(
                f"need 0 <= wait_low < wait_high <= 1, got {self.wait_low!r}, {self.wait_high!r}"
            )
        for name in ("window", "settle", "backoff", "max_backoff"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")


@dataclass
class _Probe:
    direction: int
    started: int
    workers: int
    throughput: float
    wait: float
    idle_share: float


@dataclass
class _Backoff:
    until: int = 0
    length: int = 0
    wait: float = 0.0
    idle_share: float = 0.0


@register_policy("heuristic")
class HeuristicPolicy:
    """Grows workers while the consumer waits and it pays, shrinks when they sit idle."""

    def __init__(self, config: HeuristicConfig | None = None) -> None:
        self.config = config or HeuristicConfig()
        self._tick = 0
        self._recent: deque[State] = deque(maxlen=self.config.window)
        self._probe: _Probe | None = None
        self._backoff = {+1: _Backoff(), -1: _Backoff()}
        self._flowing = 0  # ticks that delivered data since the start

    def decide(self, state: State) -> Action:
        self._tick += 1
        self._recent.append(state)
        c = self.config
        low_memory = state.available_bytes < c.memory_floor * state.total_bytes
        if low_memory or state.queue_bytes > state.memory_budget:
            self._probe = None
            self._recent.clear()
            why = "available memory is below the floor" if low_memory else "queue over budget"
            if state.workers > 1:
                return Action(workers=-1, prefetch=-1, reason=f"{why}: shedding a worker")
            if state.prefetch > 1:
                return Action(prefetch=-1, reason=f"{why}: lowering prefetch")
            return NOOP
        if self._probe is not None:
            return self._judge_probe(state)
        if self._flowing <= c.settle:
            # Start-up (worker start, cold caches) starves every loop: judging it would grow
            # the pool for a transient. Wait for data to flow for a few ticks first.
            self._flowing += state.throughput > 0
            self._recent.clear()
            return NOOP
        if len(self._recent) < c.window:
            return NOOP
        wait = self._mean("wait_fraction")
        idle = self._mean("idle_cores")
        queue = self._mean("queue_batches")
        if (
            wait > c.wait_high
            and state.workers < state.max_workers
            and self._may_try(+1, state, wait)
        ):
            return self._start(
                +1,
                state,
                f"training loop waited {wait:.0%} of the time with "
                f"{idle:.1f} idle cores: trying {state.workers + 1} workers",
            )
        if (
            wait < c.wait_low
            and state.workers > 1
            and queue >= 0.5 * state.prefetch
            and self._may_try(-1, state, wait)
        ):
            return self._start(
                -1,
                state,
                f"training loop waited {wait:.0%} with {queue:.1f} "
                f"batches ready: trying {state.workers - 1} workers",
            )
        return self._tune_prefetch(state, wait, queue)

    def _tune_prefetch(self, state: State, wait: float, queue: float) -> Action:
        """More prefetch absorbs bursty batch times; a queue that stays full needs less."""
        c = self.config
        p50 = self._mean("latency_p50_s")
        p99 = self._mean("latency_p99_s")
        if (
            wait > c.wait_low
            and p50 > 0
            and p99 > c.bursty * p50
            and queue < 1.0
            and state.prefetch < c.max_prefetch_per_worker * state.workers
        ):
            self._recent.clear()  # let the deeper queue fill before judging again
            return Action(
                prefetch=+1,
                reason=f"batch times are bursty (p99 {1000 * p99:.0f} ms vs p50 "
                f"{1000 * p50:.0f} ms) and the queue runs dry: prefetching one more batch",
            )
        full = queue >= state.prefetch - 0.5
        if wait < c.wait_low and full and state.prefetch > 2 * state.workers:
            self._recent.clear()
            return Action(
                prefetch=-1,
                reason=f"the queue stays full ({queue:.1f} of {state.prefetch}): one batch less",
            )
        return NOOP

    def _mean(self, name: str) -> float:
        """Mean of a State field over the recent window."""
        return statistics.fmean(getattr(s, name) for s in self._recent)

    def _may_try(self, direction: int, state: State, wait: float) -> bool:
        """Whether a try in ``direction`` is allowed: its backoff is over, or ``wait`` (the
        window's mean) or the idle share moved away from the failed try's baseline."""
        backoff = self._backoff[direction]
        if self._tick >= backoff.until:
            return True
        idle_share = state.idle_cores / max(1, state.cores)
        changed = (
            abs(wait - backoff.wait) > self.config.context_change
            or abs(idle_share - backoff.idle_share) > self.config.context_change
        )
        return changed

    def _start(self, direction: int, state: State, reason: str) -> Action:
        self._probe = _Probe(
            direction=direction,
            started=self._tick,
            workers=state.workers + direction,
            throughput=self._mean("throughput"),
            wait=self._mean("wait_fraction"),
            idle_share=self._mean("idle_cores") / max(1, state.cores),
        )
        self._recent.clear()
        return Action(workers=direction, reason=reason)

    def _judge_probe(self, state: State) -> Action:
        probe, c = self._probe, self.config
        assert probe is not None
        if state.workers != probe.workers:
            self._probe = None  # the controller clipped or overrode the step: nothing to judge
            self._recent.clear()
            return NOOP
        elapsed = self._tick - probe.started
        if probe.direction < 0 and state.wait_fraction > c.wait_high:
            # The shrink was tried because the loop did not wait; a tick in which it starves
            # is answer enough. Waiting out settle + window would starve it for seconds
            # (a quarter of the throughput lost for ~3 s a probe, measured by the bench).
            summary = (
                f"{probe.workers} workers: the training loop waited {state.wait_fraction:.0%} "
                f"(with {probe.workers + 1}: {probe.wait:.0%})"
            )
            return self._fail(probe, summary)
        if elapsed <= c.settle:
            self._recent.clear()
            return NOOP
        if len(self._recent) < c.window:
            return NOOP
        throughput = self._mean("throughput")
        wait = self._mean("wait_fraction")
        before = probe.workers - probe.direction
        change = throughput / probe.throughput - 1 if probe.throughput > 0 else 0.0
        if probe.direction > 0:
            kept = change >= c.min_gain or (
                wait <= probe.wait - c.context_change and change > -c.min_gain
            )
        else:
            kept = change > -c.min_gain and wait <= max(c.wait_low, probe.wait + c.wait_low)
        self._probe = None
        summary = (
            f"{probe.workers} workers: {throughput:.0f} samples/s, waited {wait:.0%} "
            f"(with {before}: {probe.throughput:.0f} samples/s, waited {probe.wait:.0%})"
        )
        if kept:
            self._backoff[probe.direction].length = 0
            return Action(reason=f"kept {summary}")
        return self._fail(probe, summary)

    def _fail(self, probe: _Probe, summary: str) -> Action:
        """Undo a probe and back off from its direction (doubling on each failure)."""
        c = self.config
        self._probe = None
        backoff = self._backoff[probe.direction]
        backoff.length = min(c.max_backoff, max(c.backoff, 2 * backoff.length))
        backoff.until = self._tick + backoff.length
        # Conditions as they were where we return to: a later change from these re-opens the try.
        backoff.wait, backoff.idle_share = probe.wait, probe.idle_share
        self._recent.clear()
        before = probe.workers - probe.direction
        return Action(workers=-probe.direction, reason=f"back to {before}: {summary}")
