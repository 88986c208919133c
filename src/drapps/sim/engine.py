"""The discrete-event simulator: a worker pool, a disk, a ready buffer and a training loop.

Time advances from event to event. CPU work and disk reads are shared resources in
processor-sharing: every CPU job (a worker making a batch, the training process receiving a
batch or stepping) gets ``demand * min(1, cores / total demand)`` of a core, where outside load
adds to the demand; every disk read gets an equal share of the bandwidth. Because all jobs on a
resource run at one common speed, each resource keeps a *virtual clock* that advances at that
speed, and a job finishes when the clock reaches its start plus its work: an event costs
O(log jobs), so a 64-core pipeline simulates as fast as a 2-core one. Workers at ``"low"``
priority (nice +10) weigh :data:`LOW_WEIGHT` against the training process and other processes,
as the kernel's fair scheduler weighs them: the workers' jobs and the rest then run at two
speeds, one virtual clock each. Worker threads (``PipelineModel.executor``) run the share of
their work that holds the GIL on a third clock, one job's speed shared by the threads that
want it, and the rest beside the other workers. Worker processes whose samples wait on reads
make several at once, as the runtime's pool asks (:meth:`Simulator.sample_threads`): their
reads overlap.

The simulator mirrors ``drapps.Loader``'s dispatcher: tasks are dispatched in batch order while
in-flight plus ready batches stay under the prefetch depth and the memory budget; idle workers
take them first come first served; the training loop takes batches in order. It reports the
same :class:`~drapps.control.State` the real monitor does, and is driven through the same
``resize`` / ``set_prefetch`` / ``batch_bytes`` actuators by the same Controller.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from drapps.control.state import State, percentile
from drapps.runtime.executor_pool import SAMPLE_THREADS
from drapps.sim.cache import CacheSim
from drapps.sim.hedging import TASKS_PER_WORKER, HedgedCopies
from drapps.sim.scenario import Change, Scenario
from drapps.telemetry.energy import WATTS_PER_CORE

_Callback = Callable[[], None]

LOW_WEIGHT = 110 / 1024
"""CPU weight of a process at nice +10 against one at nice 0 (the Linux fair scheduler's
table): what ``"low"`` priority gives the workers."""


class _SharedResource:
    """Jobs that all progress at one speed; finish order is kept in virtual time."""

    def __init__(self) -> None:
        self.virtual = 0.0
        self.speed = 1.0
        self.jobs: list[tuple[float, int, str, _Callback]] = []

    def add(self, work: float, owner: str, seq: int, done: _Callback) -> None:
        heapq.heappush(self.jobs, (self.virtual + work, seq, owner, done))

    def next_time(self, now: float) -> float:
        if not self.jobs or self.speed <= 0:
            return math.inf
        return now + max(0.0, self.jobs[0][0] - self.virtual) / self.speed


@dataclass(eq=False)
class _Worker:
    kind: str = "process"
    """"process" or "thread" (see ``PipelineModel.executor``)."""
    parked: bool = False
    """Finishing its current task, then exits (a shrink)."""
    busy: bool = False
    started: bool = False
    copies: deque[tuple[int, int, float, float]] = field(default_factory=deque)
    """Hedged copies it takes before any other task: (batch, part, share, predicted)."""
    began: float = 0.0
    """When it began its current task."""
    predicted: float = 0.0
    """Its current task's predicted share of a mean batch's work (hedging only)."""


@dataclass(eq=False)
class _Slowest:
    """A task whose worker made its samples at once and is free before the task's slowest
    read is done: the task is delivered when both are (``left`` counts them down)."""

    kind: str
    batch: int
    part: int
    copy: bool
    began: float
    share: float
    left: int = 2


_Part = tuple[float, bool, int]
"""One task of a batch: its share of a mean batch's work (its slow samples drawn), whether it
is one predicted-slow sample (slow whoever makes it), its samples. (A plain tuple: one is
made per part, and a NamedTuple's constructor is slower.)"""


@dataclass
class _Interval:
    """Integrals since the last observation."""

    cpu_busy: float = 0.0
    worker_cpu: float = 0.0
    main_cpu: float = 0.0
    main_wait: float = 0.0
    wait: float = 0.0
    gpu_busy: float = 0.0
    device_s: float = 0.0
    device_batches: int = 0
    read_bytes: float = 0.0
    samples: int = 0
    latencies: list[float] = field(default_factory=list)


@dataclass
class Totals:
    """Counters over the whole run (for invariants and summaries)."""

    dispatched: int = 0
    arrived: int = 0
    consumed: int = 0
    samples: int = 0
    wait_s: float = 0.0
    ready_integral: float = 0.0
    """Integral of the ready-buffer length over time (Little's law: L)."""
    ready_residence: float = 0.0
    """Summed seconds consumed batches spent in the ready buffer (Little's law: W)."""
    epochs: int = 0
    """Epochs begun after the first."""
    hedges: int = 0
    """Parts copied to a second worker (see :mod:`drapps.sim.hedging`)."""
    hedges_won: int = 0
    """Copies whose answer came before the part's first task's."""


class Simulator:
    """Runs one :class:`Scenario`. ``workers=0`` makes batches in the training loop itself
    (``torch.utils.data.DataLoader``'s default). ``hedge=False`` leaves out the dispatcher's
    hedged copies of overdue parts (:mod:`drapps.sim.hedging`), to see what they do; they only
    act while batches are cut into parts.

    Example:
        >>> from drapps.sim import PipelineModel, Scenario, Simulator
        >>> sim = Simulator(Scenario(PipelineModel(cores=2, cpu_s=0.05)), workers=2, seed=0)
        >>> sim.run_until(10.0)
        >>> 300 < sim.totals.samples / 10.0 < 1300
        True
    """

    def __init__(
        self,
        scenario: Scenario,
        *,
        workers: int,
        prefetch: int | None = None,
        seed: int = 0,
        hedge: bool = True,
    ) -> None:
        p = scenario.pipeline
        if isinstance(workers, bool) or not isinstance(workers, int):
            raise ValueError(f"workers must be an int, got {workers!r}")
        if not 0 <= workers <= p.worker_limit:
            raise ValueError(f"workers must be in [0, {p.worker_limit}], got {workers!r}")
        if prefetch is not None and (not isinstance(prefetch, int) or prefetch < 1):
            raise ValueError(f"prefetch must be None or an int >= 1, got {prefetch!r}")
        self.scenario = scenario
        self.pipeline = p
        self.now = 0.0
        self.totals = Totals()
        self._rng = np.random.default_rng(seed)
        self._draws: deque[float] = deque()
        self._seq = itertools.count()
        self._events: list[tuple[float, int, _Callback]] = []
        # "gil": the GIL-holding share of worker threads' work, run one at a time
        self._cpus = {
            "worker": _SharedResource(),
            "main": _SharedResource(),
            "gil": _SharedResource(),
        }
        self._priority = "normal"
        self._held = {"worker": 1.0, "main": 1.0}  # cores' worth per job, as CPU time
        self._main_share = 1.0  # of a core, per job of the training process
        self._disk = _SharedResource()
        self._owners = {"worker": 0, "main": 0, "gil": 0}
        self._outside = p.outside_load
        self._factors = {"cpu": 1.0, "read": 1.0, "step": 1.0}
        self._executor = p.executor or "process"
        self._gil_share = float(p.gil_share)
        self._made_by: dict[int, str] = {}  # batch id -> the kind of worker that finished it
        self._inline = workers == 0
        self._workers: list[_Worker] = []
        self._target = 0
        self._prefetch = prefetch
        self._tasks: list[tuple[float, int, int, int, float]] = []  # key, seq, batch, part, share
        self._in_flight: dict[int, float] = {}  # batch id -> dispatch time
        self._parts: dict[int, list[_Part]] = {}  # drawn once per batch
        self._parts_left: dict[int, int] = {}  # batch id -> parts not made yet
        self._early: set[int] = set()  # batches past the frontier whose slow parts started
        self._lookahead: int | None = None
        # one typical sample's share of a mean batch's work
        self._unit = 1.0 / (p.batch_size * (1 - p.slow_share + p.slow_share * p.slow_factor))
        self._hedging: HedgedCopies[_Worker] | None = (
            HedgedCopies() if hedge and p.cuts and workers > 0 else None
        )
        self._ready: dict[int, float] = {}  # batch id -> arrival time
        self._next_dispatch = 0
        self._next_consume = 0
        self._epoch_end = p.epoch_batches or math.inf  # the batch id that starts the next
        self._seen_batch = False
        self._waiting = False
        self._in_step = 0
        self._step_began = 0.0
        self._step_s: float | None = None  # the last step's length, taken to done
        self._credited = 0.0  # samples of the step under way counted at the last observe()
        self._stepping_gpu = False
        self._split = p.start_split
        self._share = 1.0 if p.offload is None else float(p.offload)
        # batch id -> the (split, offload share) its task was made with
        self._made_with: dict[int, tuple[int, float]] = {}
        self._cache = CacheSim(p.cache) if p.cache is not None else None
        self._cache_seen = (0.0, 0.0, 0.0, 0.0, 0.0)  # hits, misses, refused, read s, make s
        self._interval = _Interval()
        self._last_observed = 0.0
        self._observed_workers = workers  # the pool's size at the last observe()
        self._batch_changes = sorted(
            (c for c in scenario.changes if c.at_batch is not None),
            key=lambda c: c.at_batch or 0,
        )
        for change in scenario.changes:
            if change.at is not None:
                self._at(change.at, functools.partial(self._apply, change))
        self._apply_batch_changes()
        if not self._inline:
            self._grow(workers, start_cost=False)
        self._consume()

    # ------------------------------------------------------------------ actuators

    def resize(self, workers: int) -> None:
        """Target ``workers`` workers: new ones start (paying ``worker_start_s``), surplus
        ones finish their task and exit."""
        if self._inline:
            raise RuntimeError("a simulator made with workers=0 has no pool to resize")
        if not 1 <= workers <= self.pipeline.worker_limit:
            raise ValueError(f"workers must be in [1, {self.pipeline.worker_limit}], got {workers}")
        if workers > self._target:
            self._grow(workers - self._target, start_cost=True)  # dispatches to the new room
        elif workers < self._target:
            self._shrink(self._target - workers)  # lowers the limits: nothing to dispatch

    def set_prefetch(self, depth: int | None) -> None:
        """Batches in flight plus ready (None: twice the target workers)."""
        if depth is not None and depth < 1:
            raise ValueError(f"prefetch depth must be >= 1, got {depth}")
        self._prefetch = depth
        self._dispatch()

    def batch_bytes(self) -> int:
        return self.pipeline.batch_bytes if self._seen_batch else 0

    def set_lookahead(self, lookahead: int | None) -> None:
        """Batches past the next one whose predicted-slow parts may start early (None: twice
        the prefetch depth)."""
        if lookahead is not None and lookahead < 1:
            raise ValueError(f"lookahead must be >= 1, got {lookahead}")
        self._lookahead = lookahead
        self._dispatch()

    @property
    def lookahead(self) -> int:
        return self._lookahead if self._lookahead is not None else 2 * self.prefetch

    def set_split(self, split: int) -> None:
        """Batches dispatched from now on run ``device_ops[:split]`` in the workers and the
        rest in the device stage (batches already made keep their split, as in the loader)."""
        if not 0 <= split <= len(self.pipeline.device_ops):
            raise ValueError(
                f"split must be in [0, {len(self.pipeline.device_ops)}], got {split!r}"
            )
        self._split = split

    @property
    def split(self) -> int:
        return self._split

    def set_offload(self, share: float) -> None:
        """Batches dispatched from now on offload ``share`` of their samples: those run the
        ops from the split on in the device stage, the rest run them in the workers."""
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"offload must be in [0, 1], got {share!r}")
        self._share = float(share)

    @property
    def offload(self) -> float:
        return self._share

    def set_codec(self, codec: str) -> None:
        """New cache entries are written with ``codec``; older ones are re-encoded as read."""
        if self._cache is None:
            raise RuntimeError("this simulated pipeline has no sample cache")
        self._cache.set_codec(codec)

    @property
    def codec(self) -> str | None:
        return self._cache.codec if self._cache is not None else None

    def set_executor(self, executor: str) -> None:
        """Make batches with worker ``"process"``-es or ``"thread"``-s from now on, as many as
        now: workers of the other kind finish the task they hold and exit, new ones start
        (paying ``worker_start_s`` or ``thread_start_s``); nothing is made twice."""
        if executor not in ("process", "thread"):
            raise ValueError(f"executor must be 'process' or 'thread', got {executor!r}")
        if self.pipeline.executor is None or self._inline:
            raise RuntimeError("this simulated pipeline has no executor to move")
        if executor == self._executor:
            return
        self._executor = executor
        count = self._target
        self._shrink(count)
        self._grow(count, start_cost=True)

    @property
    def executor(self) -> str:
        return self._executor

    def sample_threads(self) -> int:
        """How many of a batch's samples each worker process makes at once, as the runtime's
        pool under ``workers="auto"`` asks (``ExecutorPool.sample_threads``): one over the
        share of a sample's time on the CPU (the rest waits on reads, ``read_s``), at most
        :data:`~drapps.runtime.executor_pool.SAMPLE_THREADS`, and at most one over the share
        that holds the GIL. 1 where the pipeline has no executor choice (a fixed count), runs
        on threads, makes batches in the loop, or has a sample cache, as in the runtime."""
        p = self.pipeline
        if p.executor is None or self._inline or self._executor != "process" or p.cache is not None:
            return 1
        wait_s = p.read_s * self._factors["read"]
        if wait_s <= 0:
            return 1
        cpu_s = p.cpu_s * self._factors["cpu"]
        at_once = int(1.0 / max(cpu_s / (cpu_s + wait_s), 1.0 / SAMPLE_THREADS))
        if self._gil_share > 0:
            at_once = min(at_once, max(1, int(1.0 / self._gil_share)))
        return at_once

    def set_priority(self, priority: str) -> None:
        """Run the workers at ``"normal"`` CPU priority or ``"low"`` (nice +10: they get
        :data:`LOW_WEIGHT` of a normal process's share while the CPU is saturated)."""
        if priority not in ("normal", "low"):
            raise ValueError(f"priority must be 'normal' or 'low', got {priority!r}")
        self._priority = priority
        self._speeds()

    @property
    def priority(self) -> str:
        return self._priority

    @property
    def workers(self) -> int:
        return self._target

    @property
    def prefetch(self) -> int:
        if self._inline:
            return 0
        return self._prefetch if self._prefetch is not None else max(1, 2 * self._target)

    # ------------------------------------------------------------------ running

    def run_until(self, t: float) -> None:
        """Advance simulated time to ``t`` seconds."""
        while True:
            t_event = self._events[0][0] if self._events else math.inf
            t_workers = self._cpus["worker"].next_time(self.now)
            t_main = self._cpus["main"].next_time(self.now)
            t_gil = self._cpus["gil"].next_time(self.now)
            t_disk = self._disk.next_time(self.now)
            t_next = min(t_event, t_workers, t_main, t_gil, t_disk)
            if t_next > t:
                self._advance(t - self.now)
                return
            self._advance(t_next - self.now)
            if t_next == t_event:
                heapq.heappop(self._events)[2]()
            elif t_next == t_workers:
                self._finish(self._cpus["worker"])
            elif t_next == t_main:
                self._finish(self._cpus["main"])
            elif t_next == t_gil:
                self._finish(self._cpus["gil"])
            else:
                self._finish(self._disk)

    def observe(self) -> State:
        """The State over the interval since the last observation (as the real Monitor).

        Throughput counts the batch under way by the share of its step done (against the last
        step's length, at most 99%), and what it counted is taken off once the batch is done:
        with steps a sizeable part of a tick, whole batches would make it jump by a batch a
        tick (to zero with steps longer than a tick) whatever the pipeline did.
        """
        p, i = self.pipeline, self._interval
        dt = max(self.now - self._last_observed, 1e-9)
        under_way = self._step_done() * p.batch_size
        samples = max(0.0, i.samples + under_way - self._credited)
        self._credited = under_way
        cpu_util = min(1.0, i.cpu_busy / (p.cores * dt))
        ready_bytes = len(self._ready) * p.batch_bytes
        rss = p.main_rss + self._workers_rss() + ready_bytes
        state = State(
            t=self.now,
            cores=p.cores,
            cpu_util=cpu_util,
            idle_cores=p.cores * (1.0 - cpu_util),
            main_cpu=i.main_cpu / dt,
            workers_cpu=i.worker_cpu / dt,
            rss_bytes=rss,
            available_bytes=max(0, p.total_memory - p.other_memory - rss),
            total_bytes=p.total_memory,
            disk_read_bps=i.read_bytes / dt,
            net_bps=0.0,
            gpu_util=min(1.0, i.gpu_busy / dt) if p.gpu else None,
            gpu_memory_bytes=0 if p.gpu else None,
            queue_batches=len(self._ready),
            queue_bytes=ready_bytes,
            memory_budget=p.memory_budget,
            wait_fraction=min(1.0, i.wait / dt),
            latency_p50_s=percentile(i.latencies, 0.5),
            latency_p99_s=percentile(i.latencies, 0.99),
            throughput=samples / dt,
            workers=self._target,
            workers_added=max(0, self._target - self._observed_workers),
            max_workers=p.worker_limit,
            prefetch=self.prefetch,
            split=self._split if p.device_ops else None,
            offload=self._share if p.offload is not None else None,
            lookahead=None if self._inline else self.lookahead,
            priority=None if self._inline else self._priority,
            in_flight=sum(i.latencies) / dt,
            main_wait=i.main_wait / dt,
            epoch_left=(
                int(self._epoch_end - self._next_consume)
                if self.pipeline.epoch_batches and not self._inline
                else None
            ),
            sample_tail=p.sample_tail,
            device_stage_s=i.device_s / i.device_batches if i.device_batches else 0.0,
            device_stage_share=min(1.0, i.device_s / dt),
            power_w=(i.main_cpu + i.worker_cpu) / dt * WATTS_PER_CORE,
            energy_source=f"simulated CPU-time estimate ({WATTS_PER_CORE:g} W per busy core)",
            **self._cache_state(),
        )
        if p.executor is not None and not self._inline:
            state.extra["executor"] = int(self._executor == "thread")
        self._interval = _Interval()
        self._last_observed = self.now
        self._observed_workers = self._target
        return state

    def _step_done(self) -> float:
        """The share of the step under way done, by the last step's length (0 when none is
        under way or none has finished yet)."""
        if not self._in_step or not self._step_s:
            return 0.0
        return min(0.99, (self.now - self._step_began) / self._step_s)

    def _cache_state(self) -> dict[str, Any]:
        """The State's cache fields over the interval (as the real monitor's)."""
        cache = self._cache
        if cache is None:
            return {}
        now = (cache.hits, cache.misses, cache.not_admitted, cache.read_s, cache.make_s)
        seen = self._cache_seen
        hits, misses, refused = now[0] - seen[0], now[1] - seen[1], now[2] - seen[2]
        read_s, make_s = now[3] - seen[3], now[4] - seen[4]
        self._cache_seen = now
        return {
            "codec": cache.codec,
            "cache_hit_rate": hits / (hits + misses) if hits + misses > 0 else 0.0,
            "cache_read_ms": 1000 * read_s / hits if hits > 0 else 0.0,
            "cache_make_ms": 1000 * make_s / misses if misses > 0 else 0.0,
            "cache_fill": min(1.0, cache.held_bytes / max(1, cache.model.budget_bytes)),
            "cache_not_admitted": refused / misses if misses > 0 else 0.0,
            "cache_held_bytes": int(cache.held_bytes),
            "cache_budget_bytes": cache.model.budget_bytes,
            "cache_samples": cache.model.samples,
            "cache_profile": cache.profile(),
        }

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    @property
    def ready(self) -> int:
        return len(self._ready)

    @property
    def in_step(self) -> int:
        """Batches the training loop has taken and not finished with (0 or 1)."""
        return self._in_step

    # ------------------------------------------------------------------ internals: time

    def _at(self, t: float, callback: _Callback) -> None:
        heapq.heappush(self._events, (t, next(self._seq), callback))

    def _advance(self, dt: float) -> None:
        if dt <= 0:
            return
        self.now += dt
        disk, i = self._disk, self._interval
        for cpu in self._cpus.values():
            cpu.virtual += cpu.speed * dt
        disk.virtual += disk.speed * dt
        i.cpu_busy += min(float(self.pipeline.cores), self._demand()) * dt
        i.worker_cpu += self._worker_jobs() * self._held["worker"] * dt
        i.main_cpu += self._owners["main"] * self._held["main"] * dt
        i.main_wait += self._owners["main"] * (1.0 - self._main_share) * dt
        if self._waiting:
            i.wait += dt
            self.totals.wait_s += dt
        if self._stepping_gpu:
            i.gpu_busy += dt
        if disk.jobs and math.isfinite(self.pipeline.disk_bps):
            i.read_bytes += self.pipeline.disk_bps * dt
        self.totals.ready_integral += len(self._ready) * dt

    def _demand(self) -> float:
        """Cores wanted now: one per running CPU job, plus other processes' load."""
        return self._worker_jobs() + self._owners["main"] + self._outside

    def _worker_jobs(self) -> int:
        """Worker jobs that want a core now: those that do not hold the GIL, and one of the
        threads waiting for it (the one that holds it)."""
        return self._owners["worker"] + min(1, self._owners["gil"])

    def _speeds(self) -> None:
        workers, others = self._shares()
        self._main_share = others  # of a core; the rest of the time it waits for one
        paging, switching = self._paging(), self._switching()
        # CPU time counts what the jobs hold of the cores; switching spends some of it
        self._held = {"worker": workers * paging, "main": others * paging}
        self._cpus["worker"].speed = workers * paging * switching
        self._cpus["main"].speed = others * paging * switching
        # the GIL's holder runs as one worker job; its waiters take turns at that speed
        self._cpus["gil"].speed = workers * paging * switching / max(1, self._owners["gil"])
        self._disk.speed = 1.0 / max(1, len(self._disk.jobs))

    def _shares(self) -> tuple[float, float]:
        """Cores' worth each worker job and each other job (the training process's, other
        processes') gets: an equal share at normal priority; at low priority the CPU is filled
        by weight, no job above one core, so the others take what they want first."""
        cores = float(self.pipeline.cores)
        workers = self._worker_jobs()
        others = self._owners["main"] + self._outside
        if workers + others <= cores:
            return 1.0, 1.0
        if self._priority == "normal" or workers == 0:
            share = cores / (workers + others)
            return share, share
        level = cores / (others + LOW_WEIGHT * workers)  # speed of a weight-1 job
        if level <= 1.0:
            return LOW_WEIGHT * level, level
        return (cores - others) / workers, 1.0

    def _switching(self) -> float:
        """The share of CPU time left for work with more runnable jobs than cores: each job
        beyond one per core costs ``oversubscription`` of it (context switches, caches)."""
        over = self._demand() / self.pipeline.cores - 1.0
        return 1.0 / (1.0 + self.pipeline.oversubscription * over) if over > 0 else 1.0

    def _paging(self) -> float:
        """1.0 while the pipeline fits in the machine's memory; past it, ``(room / needed)**2``:
        the machine pages, and every CPU job waits on the disk for the pages that did not fit.
        (A model of swapping; a real machine may kill a worker instead, which is worse.)"""
        p = self.pipeline
        needed = p.main_rss + self._workers_rss() + len(self._ready) * p.batch_bytes
        room = p.total_memory - p.other_memory
        return min(1.0, room / needed) ** 2 if needed > 0 else 1.0

    def _workers_rss(self) -> int:
        p = self.pipeline
        threads = sum(w.kind == "thread" for w in self._workers)
        return (len(self._workers) - threads) * p.worker_rss + threads * p.thread_rss

    def _cpu_job(self, work: float, owner: str, done: _Callback) -> None:
        self._owners[owner] += 1
        self._cpus[owner].add(work, owner, next(self._seq), done)
        self._speeds()

    def _read(self, nbytes: float, done: _Callback) -> None:
        self._disk.add(nbytes / self.pipeline.disk_bps, "disk", next(self._seq), done)
        self._speeds()

    def _finish(self, resource: _SharedResource) -> None:
        _, _, owner, done = heapq.heappop(resource.jobs)
        if owner in self._owners:
            self._owners[owner] -= 1
        self._speeds()
        done()

    def _draw(self, cv: float) -> float:
        """A lognormal factor with mean 1 and coefficient of variation ``cv``."""
        if cv <= 0:
            return 1.0
        if not self._draws:
            self._draws.extend(self._rng.standard_normal(1024).tolist())
        sigma2 = math.log1p(cv * cv)
        return math.exp(math.sqrt(sigma2) * self._draws.popleft() - sigma2 / 2)

    # ------------------------------------------------------------------ internals: changes

    def _apply(self, change: Change) -> None:
        if change.outside_load is not None:
            self._outside = change.outside_load
            self._speeds()
        for key, value in (
            ("cpu", change.cpu_factor),
            ("read", change.read_factor),
            ("step", change.step_factor),
        ):
            if value is not None:
                self._factors[key] = value
        if change.gil_share is not None:
            self._gil_share = change.gil_share

    def _apply_batch_changes(self) -> None:
        while (
            self._batch_changes and (self._batch_changes[0].at_batch or 0) <= self.totals.consumed
        ):
            self._apply(self._batch_changes.pop(0))

    # ------------------------------------------------------------------ internals: pool

    def _grow(self, count: int, *, start_cost: bool) -> None:
        p = self.pipeline
        kind = self._executor
        start_s = p.thread_start_s if kind == "thread" else p.worker_start_s
        for worker in self._workers:  # reuse workers parked by a recent shrink first
            if count and worker.parked and worker.kind == kind:
                worker.parked = False
                self._target += 1
                count -= 1
        for _ in range(count):
            worker = _Worker(kind)
            self._workers.append(worker)
            self._target += 1
            if start_cost and start_s > 0:
                started = functools.partial(self._started, worker)
                self._cpu_job(start_s, "worker", started)
            else:
                worker.started = True
        self._dispatch()

    def _started(self, worker: _Worker) -> None:
        worker.started = True
        if worker.parked:
            self._workers.remove(worker)
        else:
            self._work(worker)
            self._hedge()  # an idle worker may take a copy

    def _shrink(self, count: int) -> None:
        # Idle workers go first, then starting ones, then busy ones (after their task).
        order = sorted(
            (w for w in self._workers if not w.parked),
            key=lambda w: (w.busy, not w.started),
        )
        for worker in order[:count]:
            worker.parked = True
            self._target -= 1
            if worker.started and not worker.busy:
                self._workers.remove(worker)

    def _dispatch(self) -> None:
        if self._inline:
            return
        p = self.pipeline
        while True:
            outstanding = len(self._in_flight) + len(self._ready)
            if outstanding >= self.prefetch or self._next_dispatch >= self._epoch_end:
                break
            if not self._seen_batch:
                if outstanding >= max(1, self._target):
                    break
            elif (outstanding + 1) * p.batch_bytes > p.memory_budget:
                break
            batch = self._next_dispatch
            self._next_dispatch += 1
            self._in_flight[batch] = self.now
            self.totals.dispatched += 1
            early = batch in self._early
            self._early.discard(batch)
            for part, (share, known, _) in enumerate(self._composition(batch)):
                if not (early and known):  # a slow part started early is on its way
                    self._enqueue(batch, part, share, known)
            if self._parts_left[batch] == 0:  # every part was made early
                self._made(batch)
        if p.cuts:
            # Predicted-slow parts of later batches within the lookahead start early, least
            # slack first (their memory is left out: one sample each).
            end = min(self._next_consume + self.lookahead, self._epoch_end)
            for batch in range(self._next_dispatch, int(end)):
                if batch in self._early:
                    continue
                self._early.add(batch)
                for part, (share, known, _) in enumerate(self._composition(batch)):
                    if known:
                        self._enqueue(batch, part, share, known)
        for worker in self._workers:
            if not self._tasks:
                break
            if worker.started and not worker.busy and not worker.parked:
                self._work(worker)

    def _composition(self, batch: int) -> list[_Part]:
        """Batch ``batch``'s tasks, drawn once. Whole batches are one task; cut ones two per
        worker, predicted-slow samples alone."""
        parts = self._parts.get(batch)
        if parts is not None:
            return parts
        p = self.pipeline
        n = p.batch_size
        whole, unit, slow = self._whole_share()
        known = int(self._rng.binomial(slow, p.slow_known)) if slow else 0
        if not p.cuts or self._whole_at_once():
            parts = [(whole, False, n)]
        else:
            count = max(2, min(n, 2 * max(1, self._target)))
            parts = [(unit * p.slow_factor, True, 1)] * min(known, count - 1)
            rest = n - len(parts)
            groups = min(rest, count - len(parts))
            sizes = [rest // groups + (g < rest % groups) for g in range(groups)]
            unknown = slow - len(parts)
            hits = np.bincount(self._rng.integers(0, groups, unknown), minlength=groups)
            parts += [
                (unit * (size + (p.slow_factor - 1) * int(hit)), False, size)
                for size, hit in zip(sizes, hits, strict=True)
            ]
        self._parts[batch] = parts
        self._parts_left[batch] = len(parts)
        return parts

    def _whole_share(self) -> tuple[float, float, int]:
        """A batch's work as a share of the mean batch's (its slow samples drawn), one
        typical sample's share, and how many slow samples it holds."""
        p = self.pipeline
        n = p.batch_size
        unit = self._unit
        slow = int(self._rng.binomial(n, p.slow_share)) if p.slow_share > 0 else 0
        return unit * (n - slow + slow * p.slow_factor), unit, slow

    def _enqueue(self, batch: int, part: int, share: float, known: bool) -> None:
        """Least slack first: a task due ``k`` batches on may wait ``k`` batch intervals less
        its predicted cost (whole batches: plan order)."""
        if self.pipeline.cuts:
            predicted = share if known else 1.0 / max(1, len(self._parts[batch]))
            key = batch / max(1, self._target) - predicted
        else:
            key = float(batch)
        heapq.heappush(self._tasks, (key, next(self._seq), batch, part, share))

    def _work(self, worker: _Worker) -> None:
        """``worker`` takes its next task: a copy sent to it first, else the least slack."""
        if worker.busy:
            return
        if worker.copies:
            batch, part, share, predicted = worker.copies.popleft()
            # made as its part's first task was (whose batch may be consumed by now)
            cut = self._made_with.get(batch, (self._split, self._share))
            copy = True
        elif self._tasks:
            _, _, batch, part, share = heapq.heappop(self._tasks)
            cut = self._made_with.setdefault(batch, (self._split, self._share))
            copy, predicted = False, 0.0
        else:
            return
        worker.busy = True
        if self._hedging is not None:
            if not copy:
                _, known, size = self._parts[batch][part]
                predicted = share if known else self._unit * size
                self._hedging.start(batch, part, worker, self.now, predicted)
            worker.began, worker.predicted = self.now, predicted
        owner = "thread" if worker.kind == "thread" else "worker"
        waited, slowest = self._reads_at_once(worker, batch, part, share)
        if slowest > waited:  # the slowest read holds only itself, not its worker
            held = _Slowest(worker.kind, batch, part, copy, self.now, share)
            freed = functools.partial(self._freed, worker, held)
            tail = functools.partial(self._slowest_read, held)
            self._make_batch(owner, freed, cut, share, waited, (slowest, tail))
            return
        arrived = functools.partial(self._arrived, worker, batch, part, copy, self.now, share)
        self._make_batch(owner, arrived, cut, share, waited)

    def _whole_at_once(self) -> bool:
        """Whether batches go whole to workers that make their samples at once: under
        ``dispatch="auto"`` the runtime does not cut them then, nor copy late parts."""
        return self.pipeline.dispatch == "auto" and self.sample_threads() > 1

    def _reads_at_once(
        self, worker: _Worker, batch: int, part: int, share: float
    ) -> tuple[float, float]:
        """The shares of a task's read wait that its worker waits and that its slowest sample
        waits, where the worker makes the samples at once (:meth:`sample_threads`): the
        reads overlap, so the worker waits for them over its threads (at least one typical
        read), while a slow one holds only itself, as the runtime's threads go on to the
        samples of the tasks behind it. (1.0, 1.0): one at a time."""
        at_once = self.sample_threads() if worker.kind == "process" else 1
        if at_once <= 1 or share <= 0:
            return 1.0, 1.0
        parts = self._parts.get(batch)  # (a copy's batch may be consumed by now)
        size = parts[part][2] if parts is not None else self.pipeline.batch_size
        if size <= 1:
            return 1.0, 1.0
        unit = self._unit
        slowest = unit * self.pipeline.slow_factor if share > unit * size * 1.000001 else unit
        waited = min(1.0, max(1.0 / min(at_once, size), unit / share))
        return waited, min(1.0, max(waited, slowest / share))

    def _freed(self, worker: _Worker, held: _Slowest) -> None:
        """``worker`` made what it could of ``held``'s task: it takes its next task while the
        task's slowest read goes on."""
        worker.busy = False
        self._release(worker)
        self._slowest_read(held)

    def _slowest_read(self, held: _Slowest) -> None:
        held.left -= 1
        if held.left == 0:
            self._deliver(held.kind, held.batch, held.part, held.copy, held.began, held.share)
            self._hedge_if_idle()

    def _make_batch(
        self,
        owner: str,
        done: _Callback,
        cut: tuple[int, float],
        share: float = 1.0,
        waited: float = 1.0,
        slowest: tuple[float, _Callback] | None = None,
    ) -> None:
        """Read (latency, then bytes through the shared disk), then the CPU work (the fixed
        part, the movable ops before the split, and those after it for the samples not
        offloaded); ``cut``: (split, offload share); ``share``: of a mean batch's work;
        ``waited``: the share of the read latency waited; ``slowest``: (its share, the
        callback when it is done) of a slowest read that outlasts it
        (:meth:`_reads_at_once`)."""
        p, f = self.pipeline, self._factors
        cost = self._draw(p.cost_cv) * share
        split, offload = cut
        cpu_s = p.cpu_s + sum(worker_s for worker_s, _ in p.device_ops[:split])
        cpu_s += (1.0 - offload) * sum(worker_s for worker_s, _ in p.device_ops[split:])
        read = 1.0
        if self._cache is not None and p.cache is not None:
            cached = p.cpu_s * p.cache.make_share
            cache_cpu, read = self._cache.batch(p.batch_size, cached / p.batch_size)
            cpu_s += cache_cpu - cached

        # Events are partials of methods, not closures, so that a deep copy of the simulator
        # (``Simulator.branch``) carries them over to the copy.
        read_bytes = functools.partial(self._read_bytes, cpu_s, cost, read, owner, done)
        latency = p.read_s * f["read"] * cost * read if p.read_s > 0 and read > 0 else 0.0
        if slowest is not None:
            self._at(self.now + latency * slowest[0], slowest[1])
        if latency > 0:
            self._at(self.now + latency * waited, read_bytes)
        else:
            read_bytes()

    def _read_bytes(
        self, cpu_s: float, cost: float, read: float, owner: str, done: _Callback
    ) -> None:
        """A batch's bytes through the shared disk (``read``: the share of them it reads),
        then its CPU work (``cost``: its drawn factor; both scaled by the factors of the time
        each starts)."""
        p = self.pipeline
        compute = functools.partial(self._compute, cpu_s, cost, owner, done)
        if p.read_bytes > 0 and read > 0:
            self._read(p.read_bytes * self._factors["read"] * cost * read, compute)
        else:
            compute()

    def _compute(self, cpu_s: float, cost: float, owner: str, done: _Callback) -> None:
        """The CPU work; a worker thread's (``owner`` "thread") holds the GIL for
        ``gil_share`` of it first, one thread at a time, then runs the rest beside the others."""
        work = cpu_s * self._factors["cpu"] * cost
        if owner != "thread":
            self._cpu_job(work, owner, done)
            return
        held = work * self._gil_share
        free = functools.partial(self._cpu_job, work - held, "worker", done)
        if held > 0:
            self._cpu_job(held, "gil", free)
        else:
            free()

    def _arrived(
        self, worker: _Worker, batch: int, part: int, copy: bool, began: float, share: float
    ) -> None:
        """``worker`` made a task (``copy``: a hedged copy) it began at ``began``."""
        worker.busy = False
        self._deliver(worker.kind, batch, part, copy, began, share)
        self._release(worker)
        self._hedge_if_idle()

    def _deliver(
        self, kind: str, batch: int, part: int, copy: bool, began: float, share: float
    ) -> None:
        """A task is made (by a worker of ``kind``): its batch is ready once every part is."""
        first = True
        hedging = self._hedging
        if hedging is not None:
            first = hedging.made(batch, part, copy, self.now - began, share)
            self.totals.hedges_won += first and copy  # (the second answer is dropped)
        if first:
            self._made_by[batch] = kind
            self._parts_left[batch] -= 1
            if self._parts_left[batch] == 0 and batch in self._in_flight:
                self._made(batch)

    def _release(self, worker: _Worker) -> None:
        """``worker`` is free: it exits if parked, else takes its next task."""
        if worker.parked and not worker.copies:
            self._workers.remove(worker)
        else:
            self._work(worker)

    def _hedge_if_idle(self) -> None:
        if self._hedging is not None and (self._waiting or not self._tasks):
            self._hedge()  # (the test inlined: this runs for every task made)

    # ------------------------------------------------------------------ internals: hedging

    def _hedge(self) -> None:
        """Copy overdue parts of the batches due (as ``runtime.hedging.Hedging``): before the loop
        waits, parts of the next :data:`~drapps.sim.hedging.HEDGE_AHEAD` batches to an idle
        worker; while it waits, parts of the batch it waits for to the worker holding the
        fewest tasks, one more than usual at most, that is not overdue itself. The copy's
        cost is drawn afresh: a sample slow at random (a tail read) is usually quick the
        second time, one predicted slow (its own cost) is slow again."""
        hedging = self._hedging
        if hedging is None or hedging.wall_per_share is None or self._whole_at_once():
            return
        waiting = self._waiting
        if not waiting and self._tasks:
            return  # no worker is idle: each takes a task as it frees
        room = hedging.room(waiting)
        for batch in hedging.due_batches(self._next_consume, waiting):
            for part, holder in hedging.overdue(batch, self.now):
                spares = [
                    w
                    for w in self._workers
                    if w is not holder
                    and w.started
                    and not w.parked
                    and self._holds(w) <= room
                    and not (w.busy and hedging.late(w.began, w.predicted, self.now))
                ]
                if not spares:
                    return
                spare = min(spares, key=self._holds)
                hedging.copy(batch, part)
                self.totals.hedges += 1
                spare.copies.append((batch, part, *self._copy_cost(batch, part)))
                self._work(spare)  # at once if it is idle, after its task if not

    @staticmethod
    def _holds(worker: _Worker) -> int:
        """Tasks a real worker in its place would hold: a busy one the usual (the one it
        makes and the next), and the copies sent to it."""
        return (TASKS_PER_WORKER if worker.busy else 0) + len(worker.copies)

    def _copy_cost(self, batch: int, part: int) -> tuple[float, float]:
        """A copy of a part: its share of a mean batch's work, drawn afresh for the samples
        slow at random, and its predicted share."""
        p = self.pipeline
        share, known, size = self._parts[batch][part]
        if known:
            return share, share
        unit = self._unit
        # a sample of a part not predicted slow is slow at random with this chance
        chance = p.slow_share * (1 - p.slow_known) / (1 - p.slow_share * p.slow_known)
        hits = int(self._rng.binomial(size, chance)) if chance > 0 else 0
        return unit * (size + (p.slow_factor - 1) * hits), unit * size

    def _made(self, batch: int) -> None:
        """Every task of ``batch`` is done: it is ready."""
        self._seen_batch = True
        dispatched = self._in_flight.pop(batch)
        del self._parts[batch], self._parts_left[batch]
        self._ready[batch] = self.now
        self.totals.arrived += 1
        self._interval.latencies.append(self.now - dispatched)
        if self._waiting and batch == self._next_consume:
            self._consume()

    # ------------------------------------------------------------------ internals: consumer

    def _consume(self) -> None:
        """The training loop asks for the next batch in order (the first of a new epoch once
        it has taken the last of this one)."""
        if self._next_consume >= self._epoch_end:
            self._epoch_end += self.pipeline.epoch_batches or math.inf
            self.totals.epochs += 1
            self._dispatch()
        if self._inline:
            self._waiting = True  # the real loader counts inline batch making as waiting
            made = functools.partial(self._made_inline, self.now)
            self._made_with[-1] = (self._split, self._share)
            self._make_batch("main", made, self._made_with[-1], self._whole_share()[0])
            return
        batch = self._next_consume
        if batch not in self._ready:
            self._waiting = True
            self._hedge()  # a copy may now go to a busy worker
            return
        self._take(batch)

    def _made_inline(self, started: float) -> None:
        """The training loop made a batch itself (``workers=0``), begun at ``started``."""
        self._interval.latencies.append(self.now - started)
        self.totals.dispatched += 1
        self.totals.arrived += 1
        self._take(None)

    def _take(self, batch: int | None) -> None:
        self._waiting = False
        self._in_step = 1
        self._step_began = self.now
        if batch is not None:
            self.totals.ready_residence += self.now - self._ready.pop(batch)
            self._next_consume += 1
            self._dispatch()
            self._hedge()  # the batches due moved on
        p = self.pipeline
        split, offload = self._made_with.pop(
            -1 if batch is None else batch, (len(p.device_ops), 1.0)
        )
        device_s = offload * sum(op_s for _, op_s in p.device_ops[split:])
        step = functools.partial(self._step, device_s)
        threads = batch is not None and self._made_by.pop(batch, "process") == "thread"
        transport_s = p.thread_transport_s if threads else p.transport_s
        if transport_s > 0 and batch is not None:
            self._cpu_job(transport_s, "main", step)
        else:
            step()

    def _step(self, device_s: float = 0.0) -> None:
        """The device stage (``device_s``: on the accelerator before the step, or CPU work
        of the training process without one), then the step."""
        p = self.pipeline
        factor = self._factors["step"] * self._draw(p.step_cv)
        i = self._interval
        if device_s > 0:
            i.device_batches += 1
            i.device_s += device_s
        gpu_stage = device_s if p.gpu else 0.0
        accelerator = functools.partial(self._accelerator, factor, gpu_stage)
        if device_s > 0 and not p.gpu:
            cpu_stage = device_s * self._factors["cpu"]
            after = functools.partial(self._cpu_step, factor, accelerator)
            self._cpu_job(cpu_stage, "main", after)
            return
        self._cpu_step(factor, accelerator)

    def _accelerator(self, factor: float, gpu_stage: float) -> None:
        """The step's time off the CPU (the accelerator, or a sleep) and the GPU stage."""
        p = self.pipeline
        if p.step_s + p.gpu_s + gpu_stage > 0:
            self._stepping_gpu = p.gpu
            self._at(self.now + p.step_s * factor + p.gpu_s + gpu_stage, self._stepped)
        else:
            self._stepped()

    def _cpu_step(self, factor: float, accelerator: _Callback) -> None:
        p = self.pipeline
        if p.step_cpu_s > 0:
            self._cpu_job(p.step_cpu_s * factor, "main", accelerator)
        else:
            accelerator()

    def _stepped(self) -> None:
        self._stepping_gpu = False
        self._in_step = 0
        self._step_s = self.now - self._step_began
        self.totals.consumed += 1
        self.totals.samples += self.pipeline.batch_size
        self._interval.samples += self.pipeline.batch_size
        self._apply_batch_changes()
        self._consume()
