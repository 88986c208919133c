"""The pool engine: a map-style dataset's batches made by a resizable :class:`WorkerPool`.

The dispatcher thread hands each planned batch to a worker (a process, a thread or a Ray actor)
and the reorder buffer gives them back in plan order under the memory budget; this engine is
the loader's face on that pair, and owns the workers, prefetch and priority knobs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from drapps.control.controller import Bounds, default_knobs
from drapps.control.knobs import ExecutorKnob, Knob, LookaheadKnob, PriorityKnob
from drapps.engines.base import Engine, EngineBatch, EpochJob, Limits
from drapps.engines.inline import InlineEngine
from drapps.runtime.config import PoolSettings
from drapps.runtime.dispatcher import Dispatcher
from drapps.runtime.errors import SampleError, warn_user
from drapps.runtime.executor_pool import KINDS
from drapps.runtime.pool import WorkerPool
from drapps.runtime.reorder import Entry
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
    ) -> None:
        self._limits = Limits(settings.memory_budget, max_workers)
        self._recipe, self._finish = recipe, finish
        self._fallback = in_process_if_unsendable
        self._inline: InlineEngine | None = None  # once batches cannot be sent back
        self._job: EpochJob | None = None
        self._delivered: set[int] = set()  # this epoch's ids handed over out of order
        self._lookahead_auto = settings.lookahead is None
        self._any_order = not in_order
        self._generation = 0
        self.dispatcher = Dispatcher(recipe, settings, finish=finish, split=split, pool=pool)

    @property
    def workers(self) -> int:
        return 0 if self._inline is not None else self.dispatcher.target_workers

    def start_epoch(self, job: EpochJob) -> None:
        if job.plan is None:
            raise ValueError("the pool engine makes planned batches; an iterable dataset has none")
        self._job = job
        self._delivered.clear()
        if self._inline is not None:
            self._inline.start_epoch(job)
        elif job.start < len(job.plan):
            self._generation = self.dispatcher.start_epoch(
                job.plan, job.start, fresh_workers=job.fresh
            )

    def end_epoch(self, job: EpochJob) -> None:
        if not job.persistent and self._inline is None:
            self.dispatcher.stop_workers(self._generation)

    def next(self) -> EngineBatch | None:
        if self._inline is not None:
            return self._next_in_process()
        buffer = self.dispatcher.buffer
        entry = buffer.get(alive=self.dispatcher.alive, any_order=self._any_order)
        return None if entry is None else self._handed_over(entry)

    def ready(self) -> EngineBatch | None:
        if self._inline is not None:
            return None  # made when asked for
        entry = self.dispatcher.buffer.get_ready(any_order=self._any_order)
        return None if entry is None else self._handed_over(entry)

    def _handed_over(self, entry: Entry) -> EngineBatch | None:
        made = _made(entry, self._any_order)
        error = made.error
        if self._fallback and isinstance(error, SampleError) and error.stage == "transport":
            self._make_in_process_from(error, made.split)
            return self._next_in_process()
        self._delivered.add(entry.batch_id)
        return made

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
        made = inline.next()
        if made is not None and self._any_order:
            made = dataclasses.replace(made, batch_id=batch_id)
        return made

    def resize(self, workers: int) -> None:
        if self._inline is None:
            self.dispatcher.resize(workers)

    def set_split(self, split: Any) -> None:
        if self._inline is not None:
            self._inline.set_split(split)
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
        if self._inline is not None:
            return self._inline.snapshot(samples)
        limits = self._limits
        return pool_snapshot(self.dispatcher, samples, limits.memory_budget, limits.max_workers)

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
