"""The heuristic policy: memory-aware hill climbing on the worker count, the split point and
the offload share.

Design and reasoning: ``docs/controller.md``. In short: while the training loop waits, try one
more worker and keep it only if throughput rose (or the wait fell) by a margin; when the loop
does not wait and batches pile up, try one fewer and keep that only if nothing got worse. A
failed try backs off (doubling) before the same direction is tried again, unless conditions
change markedly. Memory pressure overrides everything and sheds workers and prefetch.

With a ``split`` knob (a Pipeline cut between the workers and the device stage) the same probe
moves the cut: while the loop waits and the CPU is saturated (over 90%) or another worker does
not help (none left, or the last try failed), and the device has room (GPU under half busy, or
no GPU: the training process's own idle CPU), one more op moves into the device stage; while
the loop does not wait and the device stage holds a large share of the loop's time on a busy
GPU (or with idle cores to take it back), one op moves back. Each move is kept only if
throughput rose (or did not fall).

With an ``offload`` knob (the share of each batch's samples finished in the device stage) the
share moves toward where the workers and the device are equally short, read from the
measurements rather than tried (:mod:`drapps.control.offload_rule`).

With a ``codec`` knob (a sample cache) the codec with the lowest modelled cost per sample is
chosen from the cache's measurements (:mod:`drapps.control.codec_rule`).

With an ``executor`` knob (``workers="auto"`` on a map-style dataset) the same probe tries the
other executor, threads for worker processes or back, at the same count, where the loop starves
and another worker would not help; it is kept only if throughput rose (or the wait fell) by a
margin, and a failed try backs off as any other (:mod:`drapps.runtime.executor_pool`).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

from drapps.control.action import NOOP, Action
from drapps.control.codec_rule import CodecRule
from drapps.control.offload_rule import OffloadRule
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
    early: int = 2
    """Ticks after ``settle`` at which a probe whose throughput already moved by twice
    ``min_gain`` (either way) is judged, without measuring the rest of its ``window``: a clear
    result costs 4 ticks instead of 6, an unclear one is measured in full."""
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
    idle_free: float = 0.25
    """Share of the cores idle, before and during a worker's try while the loop starved, at
    which the worker counts as free (it waits on reads, not on the CPU) and is kept unless
    throughput fell."""
    idle_free_tail: float = 0.15
    """``idle_free`` while samples' costs are heavy-tailed (``State.sample_tail`` at least
    ``tail``): the loop then waits on a few slow reads or samples that more workers in
    flight hide, while the throughput a tick measures swings by tens of percent (a try that
    helps is rarely seen to), and the CPU idles between the bursts less than a quarter of
    the time."""
    tail: float = 8.0
    """p99 / p50 of samples' costs from which they count as heavy-tailed (the runtime cuts
    batches into parts from there too)."""
    wait_tail: float = 0.04
    """``wait_high`` while samples' costs are heavy-tailed and ``idle_free_tail`` of the cores
    idle: the loop then waits on stalls behind slow samples that more workers in flight hide,
    and a worker costs no CPU, so the pool grows until the loop waits less than this."""
    cpu_busy: float = 0.9
    """CPU utilisation above which the device stage is tried before another worker, and above
    which, with other processes taking less than ``others_low`` of the cores, the job owns a
    saturated machine: no worker beyond one per core is tried, and a pool above that is
    tried one smaller."""
    others_low: float = 0.1
    """Share of the cores other processes may use while the job still owns the machine."""
    device_room: float = 0.5
    """GPU utilisation below which the device stage may take another op (the proposal's
    "offload when the CPU is busy and the GPU under 50%")."""
    device_busy: float = 0.9
    """GPU utilisation above which a device stage that holds ``stage_share`` of the loop's
    time gives an op back to the workers."""
    stage_share: float = 0.2
    """Share of wall time the device stage must take before an op is moved back out of it."""
    stage_full: float = 0.8
    """Share of wall time above which the device stage is what a waiting loop waits on (its
    one thread, or its GPU, is saturated): the offload share is lowered."""

    def __post_init__(self) -> None:
        if not 0 <= self.wait_low < self.wait_high <= 1:
            raise ValueError(
                f"need 0 <= wait_low < wait_high <= 1, got {self.wait_low!r}, {self.wait_high!r}"
            )
        if not self.wait_low <= self.wait_tail <= self.wait_high:
            raise ValueError(
                f"need wait_low <= wait_tail <= wait_high ({self.wait_low!r}, "
                f"{self.wait_high!r}), got {self.wait_tail!r}"
            )
        for name in ("window", "settle", "backoff", "max_backoff"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if not 1 <= self.early <= self.window:
            raise ValueError(f"early must be in 1..window ({self.window}), got {self.early!r}")


@dataclass
class _Probe:
    knob: str
    """"workers", "split" or "executor"."""
    direction: int
    started: int
    """Tick of the probe's last move."""
    value: int
    """The knob's value the probe moves it to."""
    throughput: float
    wait: float
    """Mean wait over the baseline window."""
    idle_share: float
    wait_peak: float
    """Highest single tick's wait in the baseline window: what one tick of the probe is
    compared with."""
    size: int = 1
    """Steps from the knob's value before the probe to ``value``."""
    at: int = 0
    """The value the moves asked so far lead to: a probe of several steps moves one step a
    tick (as every Action does) and is judged once it is at ``value``."""

    @property
    def before(self) -> int:
        """The knob's value before the probe."""
        return self.value - self.direction * self.size


@dataclass
class _Backoff:
    until: int = 0
    length: int = 0
    wait: float = 0.0
    idle_share: float = 0.0
    clipped: bool = False
    """The last try was clipped by the controller: only the ceiling's wait re-opens it."""
    firm: bool = False
    """Only the backoff's end re-opens it: a failed try of threads, whose undo starts worker
    processes again, so the wait that follows is their start, not a new context."""


@register_policy("heuristic")
class HeuristicPolicy:
    """Grows workers while the consumer waits and it pays, shrinks when they sit idle."""

    def __init__(self, config: HeuristicConfig | None = None) -> None:
        self.config = config or HeuristicConfig()
        self._tick = 0
        self._recent: deque[State] = deque(maxlen=self.config.window)
        self._probe: _Probe | None = None
        self._backoff = {
            (knob, d): _Backoff() for knob in ("workers", "split", "executor") for d in (+1, -1)
        }
        self._flowing = 0  # ticks that delivered data since the start
        self._kept_in_a_row = 0  # worker grows kept in a row (the next grow's size doubles)
        self._grow_cap: int | None = None  # half the last failed grow, until one is kept or fed
        self._undo: list[tuple[str, int]] = []  # steps left to undo a failed probe, one a tick
        self._movable: frozenset[str] | None = None  # None: every knob (not bound)
        self._codec = CodecRule(
            min_gain=self.config.min_gain, memory_floor=self.config.memory_floor
        )
        c = self.config
        self._offload = OffloadRule(
            wait_high=c.wait_high, wait_low=c.wait_low, cpu_busy=c.cpu_busy,
            device_busy=c.device_busy, stage_full=c.stage_full, hold=c.settle + 1,
        )  # fmt: skip

    def bind(self, movable: tuple[str, ...]) -> None:
        """Only try moves of ``movable`` knobs (the Controller's adjustable ones)."""
        self._movable = frozenset(movable)

    def _may_move(self, knob: str) -> bool:
        return self._movable is None or knob in self._movable

    def decide(self, state: State) -> Action:
        if state.workers == 0 and state.max_workers > 0:
            # A pool between two epochs (its workers gone, the next ones not started): the
            # tick measures the restart, not a worker count, and there is nothing to size.
            return NOOP
        self._tick += 1
        self._recent.append(state)
        if state.codec is not None:
            self._codec.observe(state)
        c = self.config
        low_memory = state.available_bytes < c.memory_floor * state.total_bytes
        if low_memory or state.queue_bytes > state.memory_budget:
            self._probe, self._undo, self._kept_in_a_row = None, [], 0
            self._grow_cap = None
            self._recent.clear()
            why = "available memory is below the floor" if low_memory else "queue over budget"
            if state.workers > 1:
                return Action(workers=-1, prefetch=-1, reason=f"{why}: shedding a worker")
            if state.prefetch > 1:
                return Action(prefetch=-1, reason=f"{why}: lowering prefetch")
            return NOOP
        if self._undo:
            knob, direction = self._undo.pop()
            self._recent.clear()
            return _move(knob, direction, "undoing the last try")
        offload = state.offload is not None and self._may_move("offload")
        if offload and state.device_squeezed > 0 and state.offload:
            # The device stage already runs in pieces: the model's step needs the memory (a
            # probe under way is left unjudged: the readings now say little of it).
            self._probe = None
            return self._offload_choice(state) or NOOP
        if (
            state.codec is not None
            and self._may_move("codec")
            and self._flowing > c.settle
            and (choice := self._codec_choice(state)) is not None
        ):
            # A codec change is decided from measurements, not tried: it goes ahead of a
            # probe, which it would confound (the probe's move stays, unjudged).
            self._probe = None
            self._recent.clear()  # throughput shifts while entries are re-encoded
            return choice
        if self._probe is not None:
            return self._judge_probe(state)
        if self._flowing <= c.settle:
            # Start-up (worker start, cold caches) starves every loop: judging it would grow
            # the pool for a transient. Wait for data to flow for a few ticks first.
            self._flowing += state.throughput > 0
            self._recent.clear()
            return NOOP
        if offload and len(self._recent) >= c.early:
            move = self._offload_choice(state)
            if move is not None:
                return move
        # A loop starving by more than twice wait_high needs no full window to say so: the
        # next probe starts from an ``early``-tick baseline (kept probes leave that many).
        measured = len(self._recent)
        if measured < c.window and (
            measured < c.early or self._mean("wait_fraction") <= 2 * c.wait_high
        ):
            return NOOP
        wait = self._mean("wait_fraction")
        idle = self._mean("idle_cores")
        queue = self._mean("queue_batches")
        starving = wait > self._wait_high(state)
        if not starving and not self._spare_for_the_tail(state):
            # The loop is fed: the next starving starts from one. Not between two bursts of
            # slow samples, though: the loop is fed there, and starves again at the next.
            self._kept_in_a_row, self._grow_cap = 0, None
        workers = self._may_move("workers")
        split = state.split is not None and self._may_move("split")
        owned = self._owns_the_cpu(state)
        grow = (
            workers
            and state.workers < state.max_workers
            and not (owned and state.workers >= state.cores)
            and self._may_try("workers", +1, state, wait)
        )
        if wait > c.wait_high and split and self._mean("cpu_util") > c.cpu_busy:
            # The proposal's rule: the CPU is saturated, so the device stage is tried first.
            move = self._split_move(state, wait, idle, grow=False)
            if move is not None:
                return move
        if starving and grow and int(state.extra.get("executor", 0)) == 1:
            # On threads, idle cores while the loop waits is what a held GIL looks like (as
            # much as slow reads): more threads would queue for it, so worker processes are
            # tried first; a failed try backs off, and growth goes on.
            why = f"with {idle:.1f} idle cores the threads may be waiting for the GIL"
            if (move := self._executor_move(state, wait, why)) is not None:
                return move
            if self._executor_open(state, -1, wait) and len(self._recent) < c.window:
                return NOOP  # the try's baseline: a full window, not another grow
        if starving and grow:
            size = self._growth(state)
            return self._start(
                "workers",
                +1,
                state,
                f"training loop waited {wait:.0%} of the time with "
                f"{idle:.1f} idle cores: trying {_describe('workers', state.workers + size)}",
                size,
            )
        if (
            wait > c.wait_high
            and workers
            and owned
            and state.workers > state.cores
            and self._may_try("workers", -1, state, wait)
        ):
            # More CPU-bound workers than cores on a machine nobody else uses only share the
            # same cores (and take the training process's): one fewer is tried, kept unless
            # throughput falls. A competitor's return re-opens growth.
            return self._start(
                "workers",
                -1,
                state,
                f"the CPU is saturated by this job alone ({state.workers} workers on "
                f"{state.cores} cores, the loop waited {wait:.0%}): trying "
                f"{_describe('workers', state.workers - 1)}",
            )
        if (
            wait < c.wait_low
            and workers
            and state.workers > 1
            and queue >= 0.5 * state.prefetch
            and not self._spare_for_the_tail(state)
            and self._may_try("workers", -1, state, wait)
        ):
            return self._start(
                "workers",
                -1,
                state,
                f"training loop waited {wait:.0%} with {queue:.1f} "
                f"batches ready: trying {_describe('workers', state.workers - 1)}",
            )
        if starving and not grow and (move := self._executor_move(state, wait)) is not None:
            return move
        if split:
            move = self._split_move(state, wait, idle, grow)
            if move is not None:
                return move
        if not self._may_move("prefetch"):
            return NOOP
        return self._tune_prefetch(state, wait, queue)

    def _executor_move(self, state: State, wait: float, why: str = "") -> Action | None:
        """A try of the other executor (threads for processes, or back), where the loop
        starves and the worker count cannot help; kept only if it makes more (see
        :mod:`drapps.runtime.executor_pool`)."""
        now = int(state.knob("executor")) if "executor" in state.extra else 0
        direction = -1 if now else +1
        if not self._executor_open(state, direction, wait):
            return None
        if len(self._recent) < self.config.window or any(
            s.wait_fraction < self.config.wait_low for s in self._recent
        ):
            # A try is judged against the window before it: a full one in which the loop was
            # never fed, so that its baseline is one context, not the ticks after the last
            # switch (which restarts every worker) or before a transform turned on.
            return None
        tried = _describe("executor", now + direction)
        why = why or "more of them would not help"
        return self._start(
            "executor",
            direction,
            state,
            f"training loop waited {wait:.0%} of the time with {state.workers} "
            f"{_describe('executor', now)}, and {why}: trying {tried}",
        )

    def _executor_open(self, state: State, direction: int, wait: float) -> bool:
        """Whether the executor may be tried in ``direction`` now: the pool has the knob,
        the policy moves it, and no backoff holds that direction."""
        return (
            "executor" in state.extra
            and self._may_move("executor")
            and self._may_try("executor", direction, state, wait)
        )

    def _codec_choice(self, state: State) -> Action | None:
        """A codec change the cost model asks for (:mod:`drapps.control.codec_rule`)."""
        wait = self._mean("wait_fraction") if self._recent else state.wait_fraction
        busy = (self._mean("cpu_util") if self._recent else state.cpu_util) > self.config.cpu_busy
        choice = self._codec.choose(state, self._tick, wait, busy)
        return None if choice is None else Action(codec=choice[0], reason=choice[1])

    def _split_move(self, state: State, wait: float, idle: float, grow: bool) -> Action | None:
        """A probe of the split point, or None (see the module docstring for the rule)."""
        c = self.config
        split = int(state.split or 0)
        readings = [s.gpu_util for s in self._recent if s.gpu_util is not None]
        gpu = statistics.fmean(readings) if readings else None
        share = self._mean("device_stage_share")
        if (
            wait > c.wait_high
            and share >= c.stage_full  # so some op is in the stage: one can move back
            and self._may_try("split", +1, state, wait)
        ):
            # The loop waits on the stage itself (its thread or its GPU saturated): more ops
            # there, or more workers, would only starve it further.
            return self._start(
                "split",
                +1,
                state,
                f"training loop waited {wait:.0%} on the device stage (busy {share:.0%} of "
                f"the time): moving op {split} back to the workers",
            )
        if wait > c.wait_high and not grow:
            room = (gpu is None or gpu < c.device_room) and share < c.stage_full
            where = "the CPU" if gpu is None else f"a GPU {gpu:.0%} busy"
            if room and self._may_try("split", -1, state, wait):
                return self._start(
                    "split",
                    -1,
                    state,
                    f"training loop waited {wait:.0%} and another worker does not help: "
                    f"moving op {split - 1} into the device stage on {where}",
                )
        busy = gpu >= c.device_busy if gpu is not None else idle >= 1.0
        if (
            wait < c.wait_low
            and share > c.stage_share
            and busy
            and self._may_try("split", +1, state, wait)
        ):
            return self._start(
                "split",
                +1,
                state,
                f"the device stage takes {share:.0%} of the loop's time and the loop does not "
                f"wait: moving op {split} back to the workers",
            )
        return None

    def _offload_choice(self, state: State) -> Action | None:
        """A move of the offload share the rule asks for (:mod:`drapps.control.offload_rule`)."""
        readings = [s.gpu_util for s in self._recent if s.gpu_util is not None]
        choice = self._offload.choose(
            self._tick,
            float(state.offload or 0.0),
            wait=self._mean("wait_fraction"),
            cpu_util=self._mean("cpu_util"),
            idle_cores=self._mean("idle_cores"),
            gpu_util=statistics.fmean(readings) if readings else None,
            stage_share=self._mean("device_stage_share"),
            squeezed=state.device_squeezed,
            now=state.t,
            turnover_s=_turnover_s(state),
        )
        if choice is None:
            return None
        self._recent.clear()  # batches made with the old share are still arriving
        return Action(other={"offload": choice[0]}, reason=choice[1])

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

    def _owns_the_cpu(self, state: State) -> bool:
        """Whether the cores are saturated and this job's processes use them (over the
        window): another worker could then only share them. With a competitor (another job, a
        hog) a worker more wins a larger share of the cores, and may pay."""
        c = self.config
        busy = self._mean("cpu_util")
        if busy < c.cpu_busy:
            return False
        others = busy * state.cores - self._mean("main_cpu") - self._mean("workers_cpu")
        return others < c.others_low * state.cores

    def _mean(self, name: str) -> float:
        """Mean of a State field over the recent window."""
        return statistics.fmean(getattr(s, name) for s in self._recent)

    def _may_try(self, knob: str, direction: int, state: State, wait: float) -> bool:
        """Whether a try of ``knob`` in ``direction`` is allowed: its backoff is over, or
        ``wait`` (the window's mean) or the idle share moved away from the failed try's
        baseline."""
        if knob == "workers" and direction > 0 and not self._room_for_a_worker(state):
            return False
        backoff = self._backoff[knob, direction]
        if self._tick >= backoff.until:
            return True
        # An executor's try restarts every worker: the idle cores that re-open it are the
        # window's, not one tick's.
        one_tick = knob != "executor"
        idle_share = state.idle_cores / max(1, state.cores) if one_tick else self._idle_share(state)
        changed = (
            abs(wait - backoff.wait) > self.config.context_change
            or abs(idle_share - backoff.idle_share) > self.config.context_change
        )
        return changed and not backoff.clipped and not backoff.firm

    def _room_for_a_worker(self, state: State) -> bool:
        """Whether another worker's private memory (as much again as the median worker's, and
        as much for it to grow) leaves available memory above the floor: a memory-bound host
        gets fewer workers, not an out-of-memory kill."""
        return self._fits(state) >= 1

    def _fits(self, state: State) -> int:
        """How many more workers the host's memory holds: each takes the median worker's
        private memory, and the last as much again to grow, above the floor (a large number
        where the workers' memory is not known)."""
        private = state.worker_private_bytes
        if not private:
            return 1 << 30
        floor = self.config.memory_floor * state.total_bytes
        return int((state.available_bytes - floor) // private) - 1

    def _start(self, knob: str, direction: int, state: State, reason: str, size: int = 1) -> Action:
        """Start a probe of ``size`` steps of ``knob`` in ``direction`` (its first step now)."""
        now = int(state.knob(knob))
        self._probe = _Probe(
            knob=knob,
            direction=direction,
            started=self._tick,
            value=now + direction * size,
            throughput=self._mean("throughput"),
            wait=self._mean("wait_fraction"),
            idle_share=self._idle_share(state),
            wait_peak=max(s.wait_fraction for s in self._recent),
            size=size,
            at=now + direction,
        )
        self._recent.clear()
        return _move(knob, direction, reason)

    def _growth(self, state: State) -> int:
        """Workers the next grow tries at once: one, doubling with each grow kept in a row
        while the loop still starves (a large machine then reaches 64 workers from 8 in a few
        tries, not 56), or with cores idle the count the loop's wait says is missing; at most
        the pool's size and the room left below ``max_workers``. On a busy CPU (under
        ``idle_free`` idle; ``idle_free_tail`` with heavy-tailed costs) a try stops at one
        worker per core: past that, CPU-bound workers only share the cores, and the try would
        be judged as a whole."""
        size = 2 ** max(0, self._kept_in_a_row - 1)
        if self._idle_share(state) < self._idle_free():
            size = min(size, state.cores - state.workers)
        else:
            # Cores idle while the loop starves: the workers wait (on reads, on a store), so
            # throughput grows with their count, and the pool that would feed the loop is
            # about workers / (1 - wait). It is tried at once (still at most doubling), not a
            # worker a try: 2 -> 4 -> 6 where the loop waited 65% (reads of 1 ms, 5% of 60 ms).
            wait = min(self._mean("wait_fraction"), 0.95)
            size = max(size, math.ceil(state.workers / (1.0 - wait)) - state.workers)
        if self._grow_cap is not None:
            # A grow of several workers failed (past some count, workers cost throughput: a
            # disk that seeks between readers): the next tries half as many, down to one,
            # until a grow is kept or the loop is fed.
            size = min(size, self._grow_cap)
        return max(
            1, min(size, state.workers, state.max_workers - state.workers, self._fits(state))
        )

    def _judge_probe(self, state: State) -> Action:
        probe, c = self._probe, self.config
        assert probe is not None
        if probe.knob == "executor" and "executor" not in state.extra:
            self._probe = None  # the pool stopped reporting one (batches made in-process)
            return NOOP
        now = int(state.knob(probe.knob))
        if now == probe.at != probe.value:
            # A probe of several steps: the next one.
            probe.at += probe.direction
            probe.started = self._tick
            self._recent.clear()
            return _move(probe.knob, probe.direction, f"on to {_describe(probe.knob, probe.value)}")
        if 0 < (now - probe.before) * probe.direction < probe.size:
            # Clipped part way (a bound): judged where it stopped.
            probe.value = probe.at = now
            probe.size = abs(now - probe.before)
        elif now != probe.value:
            # The controller clipped the step (a bound, a fixed knob) or it was overridden:
            # nothing to judge, and no use asking again until the backoff's ceiling.
            self._probe = None
            self._recent.clear()
            backoff = self._backoff[probe.knob, probe.direction]
            backoff.until, backoff.clipped = self._tick + c.max_backoff, True
            return NOOP
        # Workers +1 and split -1 add capacity to the pipeline; the others take it away. A
        # change of executor is judged as an addition: kept only if it makes more.
        adds = (
            probe.knob == "executor" or probe.direction * (1 if probe.knob == "workers" else -1) > 0
        )
        elapsed = self._tick - probe.started
        if not adds and state.wait_fraction > max(c.wait_high, probe.wait_peak + c.wait_low):
            # The shrink was tried because the loop did not wait; a tick in which it starves
            # (more than any single tick before the try did) is answer enough. Waiting out
            # settle + window would starve it for seconds (a quarter of the throughput lost
            # for ~3 s a probe, measured by the bench).
            summary = (
                f"with {_describe(probe.knob, probe.value)} the training loop waited "
                f"{state.wait_fraction:.0%} of the time ({probe.wait:.0%} with "
                f"{_describe(probe.knob, probe.before)})"
            )
            return self._fail(probe, summary)
        if elapsed <= c.settle:
            self._recent.clear()
            return NOOP
        throughput = self._mean("throughput")  # this tick is in: decide() appended it
        change = throughput / probe.throughput - 1 if probe.throughput > 0 else 0.0
        wait = self._mean("wait_fraction")
        free = adds and probe.knob == "workers" and self._free(probe, state, wait)
        if len(self._recent) < c.window:
            # A new executor restarts every worker: its first ticks pay for the starts, so
            # it is judged over the whole window, never early.
            clear = (
                probe.knob != "executor"
                and len(self._recent) >= c.early
                and (abs(change) >= 2 * c.min_gain or (free and change > -c.min_gain))
            )
            if not clear:
                return NOOP
        if adds and probe.knob == "split":
            # An op moved to the device stage is kept unless throughput fell: it frees the
            # workers' CPU even when it buys nothing yet, and the next op may be the one that
            # pays (bench: flip alone +3%, crop and flip +17% with one worker on 2 cores).
            kept = change > -c.min_gain / 2
        elif adds:
            kept = (
                change >= c.min_gain
                or (wait <= probe.wait - c.context_change and change > -c.min_gain)
                or (free and change > -c.min_gain)
            )
        else:
            kept = change > -c.min_gain and wait <= max(c.wait_low, probe.wait + c.wait_low)
        self._probe = None
        summary = _outcome(probe, kept, adds, free, throughput, wait, c)
        grew = probe.knob == "workers" and probe.direction > 0
        self._kept_in_a_row = self._kept_in_a_row + 1 if kept and grew else 0
        if kept and grew:
            self._grow_cap = None
        if kept:
            kept_backoff = self._backoff[probe.knob, probe.direction]
            kept_backoff.length, kept_backoff.clipped = 0, False
            if probe.knob == "executor":
                # Going back is a try like any other, but not at once: the executor just
                # measured ahead holds until the backoff's ceiling, or until the loop's wait
                # or the idle cores move away from where it was kept (a new transform).
                back = self._backoff[probe.knob, -probe.direction]
                back.length, back.until, back.clipped, back.firm = (
                    c.max_backoff,
                    self._tick + c.max_backoff,
                    False,
                    False,
                )
                back.wait, back.idle_share = wait, self._idle_share(state)
            return Action(reason=f"kept {summary}")
        return self._fail(probe, summary)

    def _free(self, probe: _Probe, state: State, wait: float) -> bool:
        """Whether a worker tried while the loop starved with cores idle (slow reads,
        stragglers) cost no CPU: it then stays unless it measurably hurt, judged after
        ``early`` ticks, so the pool keeps growing while the loop starves and cores sit idle,
        however noisy the throughput."""
        c = self.config
        heavy = self._heavy_tailed()
        return (
            probe.wait > (c.wait_tail if heavy else c.wait_high)
            and min(probe.idle_share, self._idle_share(state)) >= self._idle_free()
            and wait <= probe.wait + c.wait_low
        )

    def _idle_free(self) -> float:
        """The idle share from which a worker counts as free: ``idle_free_tail`` while costs
        are heavy-tailed, else ``idle_free``."""
        c = self.config
        return c.idle_free_tail if self._heavy_tailed() else c.idle_free

    def _wait_high(self, state: State) -> float:
        """The wait above which the loop starves: ``wait_tail`` while costs are heavy-tailed
        and the cores have room for workers that wait on slow samples, else ``wait_high``."""
        if self._spare_for_the_tail(state):
            return self.config.wait_tail
        return self.config.wait_high

    def _spare_for_the_tail(self, state: State) -> bool:
        """Whether the workers are kept though the loop does not wait: samples' costs are
        heavy-tailed and the cores have room (``idle_free_tail``). A worker then costs no
        throughput, and the next burst of slow samples needs it (a shrink judged between
        bursts is kept, and the loop starves at the next one)."""
        return self._heavy_tailed() and self._idle_share(state) >= self.config.idle_free_tail

    def _heavy_tailed(self) -> bool:
        """Whether samples' costs were heavy-tailed over the window (``tail``)."""
        return self._mean("sample_tail") >= self.config.tail

    def _idle_share(self, state: State) -> float:
        """The share of the cores idle over the window."""
        return self._mean("idle_cores") / max(1, state.cores)

    def _fail(self, probe: _Probe, summary: str) -> Action:
        """Undo a probe and back off from its direction (doubling on each failure)."""
        c = self.config
        self._probe = None
        backoff = self._backoff[probe.knob, probe.direction]
        backoff.length = min(c.max_backoff, max(c.backoff, 2 * backoff.length))
        if probe.knob == "executor":  # a change of executor restarts every worker: rarer
            backoff.length = max(backoff.length, c.max_backoff // 2)
        backoff.until, backoff.clipped = self._tick + backoff.length, False
        backoff.firm = probe.knob == "executor" and probe.direction > 0
        # Conditions as they were where we return to: a later change from these re-opens the try.
        backoff.wait, backoff.idle_share = probe.wait, probe.idle_share
        self._recent.clear()
        self._kept_in_a_row = 0
        if probe.knob == "workers" and probe.direction > 0:
            self._grow_cap = max(1, probe.size // 2)
        before = _describe(probe.knob, probe.before)
        self._undo = [(probe.knob, -probe.direction)] * (abs(probe.at - probe.before) - 1)
        return _move(probe.knob, -probe.direction, f"back to {before}: {summary}")


def _move(knob: str, direction: int, reason: str) -> Action:
    if knob == "workers":
        return Action(workers=direction, reason=reason)
    if knob == "executor":
        return Action(other={"executor": direction}, reason=reason)
    return Action(split=direction, reason=reason)


def _turnover_s(state: State) -> float:
    """Seconds until a batch dispatched now reaches the loop: its own making (the median
    latency) after the ready queue drains (each worker makes a batch per latency)."""
    latency = state.latency_p50_s
    return latency + state.queue_batches * latency / max(1, state.workers)


def _describe(knob: str, value: int) -> str:
    if knob == "executor":
        return "threads" if value else "worker processes"
    if knob == "workers":
        return "1 worker" if value == 1 else f"{value} workers"
    return f"split at op {value}"


def _outcome(
    probe: _Probe,
    kept: bool,
    adds: bool,
    free: bool,
    throughput: float,
    wait: float,
    c: HeuristicConfig,
) -> str:
    """Why a judged try was kept or undone, in words that say which measurement decided: the
    samples/s with and without it, or the loop's wait where that decided."""
    tried, before = _describe(probe.knob, probe.value), _describe(probe.knob, probe.before)
    change = throughput / probe.throughput - 1 if probe.throughput > 0 else 0.0
    rates = f"{throughput:.0f} samples/s against {probe.throughput:.0f} with {before}"
    waits = f"{wait:.0%} of the time against {probe.wait:.0%} with {before}"
    if kept:
        if change >= c.min_gain:
            return f"{tried}: more samples/s ({rates})"
        if adds and wait <= probe.wait - c.context_change:
            return f"{tried}: the loop waited less ({waits}) at {rates}"
        if free:
            return f"{tried}: cores sat idle, so the worker costs no throughput ({rates})"
        return f"{tried}: about as many samples/s ({rates}), and the loop waited {waits}"
    if change <= -c.min_gain or (adds and probe.knob == "split"):
        return f"{tried} made fewer samples/s ({rates})"
    if adds:
        return f"{tried} made no more samples/s ({rates}), and the loop waited {waits}"
    return f"with {tried} the loop waited more ({waits}), at {rates}"
