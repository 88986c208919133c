"""The pool engine: a map-style dataset's batches made by a resizable :class:`WorkerPool`.

The dispatcher thread hands each planned batch to a worker (a process, a thread or a Ray actor)
and the reorder buffer gives them back in plan order under the memory budget; this engine is
the loader's face on that pair, and owns the workers, prefetch and priority knobs.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from drapps.control.controller import Bounds, default_knobs
from drapps.control.knobs import ExecutorKnob, Knob, LookaheadKnob, PriorityKnob
from drapps.engines.base import Engine, EngineBatch, EpochJob, Limits
from drapps.engines.in_loop import InLoopRule
from drapps.engines.inline import InlineEngine
from drapps.runtime.config import PoolSettings
from drapps.runtime.dispatcher import Dispatcher
from drapps.runtime.errors import SampleError, warn_user
from drapps.runtime.executor_pool import EVIDENCE, KINDS, ExecutorPool
from drapps.runtime.pool import WorkerPool
from drapps.runtime.reorder import Entry
from drapps.runtime.seeding import WorkerRngs
from drapps.runtime.stats import STAGES, PipelineSnapshot
from drapps.runtime.worker import BatchRecipe

LOOKAHEAD_MAX = 64
"""The most batches past the next one the controller may let work start on."""


class PoolEngine(Engine):
    """Batches made by the workers of ``pool`` (default: worker processes in the settings'
    context).

    Args:
        recipe: what a batch is made of, sent to every worker.
        settings: how the pool runs (see :class:`~drapps.runtime.config.PoolSettings`).
        max_workers: the most workers the controller may ask for.
        split: a Pipeline transform's split to start with.
        in_order: hand batches over in plan order (False: as they are made, lowest id first,
            as DataLoader's ``in_order=False``).
        in_process_if_unsendable: a batch a worker made but cannot send back (a class
            defined inside a function, a lock: what does not pickle) makes this engine let its
            workers go and make that batch and every later one in this process, with one
            warning, as DataLoader's default (``num_workers=0``) would have (the default
            count, ``workers="auto"``); False: the batch's error is raised in its place.
        in_loop: try making the batches in the training process when they cost less to make
            than the loop waits for them, keep it only where the loop gets them faster, and
            bring the workers back when they grow dearer (:mod:`drapps.engines.in_loop`;
            the default count's choice, ``workers="auto"``).
    """

    kind = "pool"
    tunable = True

    def __init__(
        self,
        recipe: BatchRecipe,
        settings: PoolSettings,
        *,
        max_workers: int,
        finish: Callable[[Any], Any] | None = None,
        split: Any = None,
        pool: WorkerPool | None = None,
        in_order: bool = True,
        in_process_if_unsendable: bool = False,
        in_loop: bool = False,
    ) -> None:
        self._limits = Limits(settings.memory_budget, max_workers)
        self._recipe, self._finish = recipe, finish
        self._fallback = in_process_if_unsendable
        self._inline: InlineEngine | None = None  # in-process: by choice, or unsendable
        self._loop: InlineEngine | None = None  # the engine batches made by choice ran on
        self._rule = InLoopRule() if in_loop else None
        self._back_at_epoch = False
        self._job: EpochJob | None = None
        self._delivered: set[int] = set()  # this epoch's ids handed over out of order
        self._lookahead_auto = settings.lookahead is None
        self._any_order = not in_order
        self._generation = 0
        self._split = split  # the split of the last batch handed over
        self.dispatcher = Dispatcher(recipe, settings, finish=finish, split=split, pool=pool)

    @property
    def workers(self) -> int:
        return 0 if self._inline is not None else self.dispatcher.target_workers

    def start_epoch(self, job: EpochJob) -> None:
        if job.plan is None:
            raise ValueError("the pool engine makes planned batches; an iterable dataset has none")
        self._job = job
        self._delivered.clear()
        if self._rule is not None:
            self._rule.restart()
        fresh = job.fresh
        if self._back_at_epoch:  # the workers come back with this epoch
            self._inline, self._back_at_epoch, fresh = None, False, True
        if self._inline is not None:
            self._inline.start_epoch(job)
        elif job.start < len(job.plan):
            self._generation = self.dispatcher.start_epoch(job.plan, job.start, fresh_workers=fresh)

    def beside(self, job: EpochJob, start: int) -> InlineEngine:
        """``job``'s batches from ``start`` on, made in the training process (copied, as the
        workers' would be) while the workers move on to the newer epoch. A fixed count's
        samples draw there from RNGs of their own, seeded as a worker past the pool's (its
        id ``max_workers``), as DataLoader's older iterator's draw from its workers'; the
        training loop's are not moved."""
        recipe = dataclasses.replace(self._recipe, watch_draws=False)
        rngs = None if recipe.reseed else WorkerRngs(job.seed + self._limits.max_workers)
        limits, finish = self._limits, self._finish
        side = InlineEngine(recipe, None, False, limits, finish, self._split, owned=True, rngs=rngs)
        side.start_epoch(dataclasses.replace(job, start=start))
        return side

    def end_epoch(self, job: EpochJob) -> None:
        if not job.persistent and self._inline is None:
            self.dispatcher.stop_workers(self._generation)

    def let_go(self, job: EpochJob) -> None:
        if not job.persistent and self._inline is None:
            self.dispatcher.let_go_workers(self._generation)

    def next(self) -> EngineBatch | None:
        if self._inline is not None:
            return self._next_in_process()
        began = time.perf_counter()
        buffer = self.dispatcher.buffer
        entry = buffer.get(alive=self.dispatcher.alive, any_order=self._any_order)
        return None if entry is None else self._handed_over(entry, began)

    def ready(self) -> EngineBatch | None:
        if self._inline is not None:
            return None  # made when asked for
        entry = self.dispatcher.buffer.get_ready(any_order=self._any_order)
        return None if entry is None else self._handed_over(entry, None)

    def _handed_over(self, entry: Entry, began: float | None) -> EngineBatch | None:
        """``entry`` handed to the loop, which asked for it at ``began`` (None: it asked
        whether one was ready)."""
        made = _made(entry, self._any_order)
        error = made.error
        if self._fallback and isinstance(error, SampleError) and error.stage == "transport":
            self._make_in_process_from(error, made.split)
            return self._next_in_process()
        self._delivered.add(entry.batch_id)
        self._split = made.split
        if self._rule is not None and error is None and not self._guarding():
            now = time.perf_counter()
            waited = 0.0 if began is None else now - began
            if self._rule.pool_batch(now, waited, self._made_s()) == "try":
                self._to_loop()
        return made

    def use_loop(self, on: bool) -> bool:
        """Make the next batches in the training process (``on``) or bring the workers back,
        as the default count's rule does when it measures a win; returns whether this engine
        can (only under the default count, where every sample is seeded wherever it is
        made, so the batches are the same either way)."""
        rule = self._rule
        if rule is None or self._job is None or self._job.plan is None:
            return False
        if on and self._inline is None:
            self._to_loop()
        elif not on and self._inline is not None and not self._back_at_epoch:
            self._to_pool()
        rule.state = "kept" if self._inline is not None else "pool"
        rule.restart()
        return True

    def _guarding(self) -> bool:
        """Whether a worker died, hung or lost a task this run: the workers then guard the
        samples (a task made again, a timeout), which batches made in the loop cannot."""
        d = self.dispatcher
        return bool(d.counters["worker_restarts"] or sum(d.retries.counters.values()))

    def _made_s(self) -> float:
        """The workers' seconds making batches so far (fetch, transform and collate)."""
        counters = self.dispatcher.counters
        return counters["fetch_s"] + counters["transform_s"] + counters["collate_s"]

    def _to_loop(self) -> None:
        """Let the workers go and make the epoch's next batches in this process."""
        job = self._job
        assert job is not None and job.plan is not None
        self.dispatcher.stop_workers(self._generation)
        if self._loop is None:
            recipe = dataclasses.replace(self._recipe, watch_draws=False)  # a worker's watch
            self._loop = InlineEngine(recipe, None, False, self._limits, self._finish, owned=True)
        self._loop.set_split(self._split)
        self._loop.check_draws(self._drew_from_none())
        self._loop.start_epoch(job)  # from the start, past the batches handed over
        self._inline = self._loop

    def _drew_from_none(self) -> bool:
        """Whether the workers watched enough samples (:data:`EVIDENCE`) and saw none draw
        from a global generator: the loop then checks its batches for draws instead of
        reseeding each sample (:meth:`InlineEngine.check_draws`)."""
        pool = self.dispatcher.pool
        return isinstance(pool, ExecutorPool) and pool.drew is None and pool.watched >= EVIDENCE

    def _to_pool(self) -> None:
        """Bring the workers back: now, from the next batch to make, or, where a batch past
        it was handed over already (out of order), with the next epoch."""
        job, inline = self._job, self._inline
        assert job is not None and job.plan is not None and inline is not None
        position = inline.position
        if any(batch_id >= position for batch_id in self._delivered):
            self._back_at_epoch = True
            return
        self._inline = None
        self._delivered.update(range(job.start, position))
        self._generation = self.dispatcher.start_epoch(job.plan, position, fresh_workers=True)

    def _make_in_process_from(self, error: SampleError, split: Any) -> None:
        """Let the workers go, and make the rest of the epoch (and every later epoch) here."""
        job = self._job
        assert job is not None and job.plan is not None
        cause = str(error).split(": ", 1)[-1].splitlines()[0]
        warn_user(
            f"drapps: a batch cannot be sent back from a worker process ({cause}); batches "
            "are made in this process from now on, as DataLoader's default (num_workers=0) "
            "makes them. To use workers, make batches picklable (classes defined at module "
            "level, no locks or open files); num_workers=0 says so from the start"
        )
        self.dispatcher.stop_workers(self._generation)
        self._rule, self._loop = None, None  # every batch is made here from now on
        self._inline = InlineEngine(self._recipe, None, False, self._limits, self._finish, split)
        # From the epoch's start, past the batches handed over already: out of order, a
        # batch before this one may not have been.
        self._inline.start_epoch(job)

    def _next_in_process(self) -> EngineBatch | None:
        """The next batch made here: in order, past those the workers handed over already."""
        inline = self._inline
        assert inline is not None
        while inline.position in self._delivered:
            inline.skip()  # made by a worker already: not made again
        batch_id = inline.position
        began = time.perf_counter()
        made = inline.next()
        if made is not None and self._any_order:
            made = dataclasses.replace(made, batch_id=batch_id)
        rule = self._rule if not self._back_at_epoch else None
        if rule is not None and made is not None and made.error is None:
            now = time.perf_counter()
            if rule.loop_batch(now, now - began) == "back":
                self._to_pool()
        return made

    def keep_workers(self) -> None:
        if self._rule is not None and self._loop is not None and self._inline is not None:
            self._to_pool()  # now, or with the next epoch
        self._rule = None

    def resize(self, workers: int) -> None:
        if self._inline is None or self._back_at_epoch:  # the count the workers come back at
            self.dispatcher.resize(workers)

    def set_split(self, split: Any) -> None:
        self._split = split
        for inline in {id(e): e for e in (self._inline, self._loop) if e is not None}.values():
            inline.set_split(split)
        self.dispatcher.set_split(split)

    def _use_executor(self, value: int) -> None:
        self.dispatcher.set_executor(KINDS[value])

    def set_prefetch(self, depth: int | None) -> None:
        self.dispatcher.set_prefetch(depth)

    def batch_bytes(self) -> int:
        return self.dispatcher.batch_bytes()

    def knobs(self, bounds: Bounds, grant: Any = None) -> list[Knob]:
        knobs = default_knobs(self, bounds, grant if bounds.adjust_workers else None)
        # Worker processes can yield the CPU to the training process; Ray actors cannot.
        if bounds.adjust_workers and self.dispatcher.set_priority("normal"):
            knobs.append(PriorityKnob(self.dispatcher.set_priority))
        if self.dispatcher.pool.choosable:
            knobs.append(ExecutorKnob(self._use_executor, adjustable=bounds.adjust_workers))
        adjustable = bounds.adjust_prefetch and self._lookahead_auto
        high = max(LOOKAHEAD_MAX, 2 * bounds.max_prefetch)
        knobs.append(
            LookaheadKnob(self.dispatcher.set_lookahead, low=1, high=high, adjustable=adjustable)
        )
        return knobs

    def snapshot(self, samples: int) -> PipelineSnapshot:
        if self._inline is not None and self._loop is None:  # unsendable: no workers again
            return self._inline.snapshot(samples)
        limits = self._limits
        snap = pool_snapshot(self.dispatcher, samples, limits.memory_budget, limits.max_workers)
        rule, loop = self._rule, self._loop
        if rule is None or loop is None:
            return snap
        wait_s = snap.wait_s + loop.wait_s  # the loop's wait: for workers, or making here
        if self._inline is None:  # the workers are back (or were kept): say why
            why = rule.why if snap.executor_why is None else f"{snap.executor_why}; {rule.why}"
            return dataclasses.replace(snap, wait_s=wait_s, executor_why=why)
        return dataclasses.replace(
            snap,
            wait_s=wait_s,
            workers=0,
            target_workers=0,
            ready_batches=0,
            ready_bytes=0,
            in_flight=0,
            worker_pids=(),
            helper_pids=(),
            executor="the training process",
            executor_why=rule.why,
            executor_choice=False,
        )

    def shutdown(self) -> None:
        self.dispatcher.shutdown()


def _made(entry: Entry, any_order: bool) -> EngineBatch:
    error = entry.error
    noted = any("worker traceback" in note for note in getattr(error, "__notes__", ()))
    if isinstance(error, SampleError) and error.detail and not noted:
        error.add_note(f"worker traceback:\n{error.detail}")  # type: ignore[attr-defined]
    batch_id = entry.batch_id if any_order else None
    return EngineBatch(
        entry.batch, entry.skipped, entry.split, error, batch_id, entry.keys, entry.places
    )


def pool_snapshot(
    d: Dispatcher, samples: int, memory_budget: int, max_workers: int
) -> PipelineSnapshot:
    """A worker pool's counters now, gathered from its dispatcher's parts (read without
    stopping its thread).

    Args:
        samples: samples the training loop has received (the loader counts them).
        memory_budget, max_workers: the loader's limits, reported alongside.
    """
    counters = dict(d.counters)
    depth = d.prefetch_depth
    return PipelineSnapshot(
        samples=samples,
        wait_s=d.buffer.waited_s(),
        ready_batches=len(d.buffer),
        ready_bytes=d.buffer.bytes,
        memory_budget=memory_budget,
        workers=len(d.pool.live()),
        max_workers=max_workers,
        prefetch_depth=depth,
        worker_pids=d.pool.pids(),
        pool_cores=d.pool.resources(),
        latencies=tuple(d.latencies),
        stage_s={name: counters[name] for name in STAGES},
        target_workers=d.target_workers,
        peak_ready_bytes=d.buffer.peak_bytes,
        in_flight=len(d.admission.open),
        batch_bytes=d.admission.batch_bytes,
        worker_restarts=int(counters["worker_restarts"]),
        timeouts=d.retries.counters["timeouts"],
        retries=d.retries.counters["retries"],
        pickled_bytes=d.admission.counters["pickled_bytes"],
        shared_bytes=d.admission.counters["shared_bytes"],
        cut_batches=d.schedule.cut_batches,
        lookahead=d.schedule.lookahead_for(depth),
        priority=d.priority,
        epoch_left=d.epoch_left(),
        worker_starts_s=tuple(d.pool.starts),
        helper_pids=d.pool.helper_pids(),
        executor=d.pool.executor,
        executor_why=d.pool.why,
        executor_choice=d.pool.choosable,
        sample_threads=d.pool.sample_threads(),
        sample_costs={
            **d.costs.report(),
            "slow_batches": d.collector.slow_batches,
            **d.hedging.report(),
        },
    )
