"""The stream engine: an iterable dataset's batches from worker processes, round-robin.

Each worker iterates its own copy of the dataset (sharding through ``get_worker_info()``), as
DataLoader's workers do; the worker count is fixed within an epoch, so a resize applies from
the next one. Beside a newer ``iter(loader)``, the epoch under way keeps its workers and the
newer one gets its own, as each of DataLoader's iterators has.
"""

from __future__ import annotations

import copy
import functools
import threading
import weakref
from collections.abc import Callable, Iterator
from multiprocessing.context import BaseContext
from typing import Any

from drapps.control.knobs import STREAM_COUNT_HELD
from drapps.engines.base import Engine, EngineBatch, EpochJob, Limits, Skipped
from drapps.runtime.stats import PipelineSnapshot
from drapps.runtime.stream import StreamPool
from drapps.runtime.worker import BatchRecipe


class StreamEngine(Engine):
    """Batches of an iterable dataset made by ``workers`` processes."""

    kind = "stream"
    count_held_by = STREAM_COUNT_HELD
    holds = (
        "its persistent workers stream an iterable dataset, and their RNGs draw on from one "
        "epoch to the next"
    )

    def __init__(
        self,
        recipe: BatchRecipe,
        batch_size: int | None,
        drop_last: bool,
        *,
        workers: int,
        limits: Limits,
        context: BaseContext | None,
        prefetch_per_worker: int,
        timeout: float | None,
        finish: Callable[[Any], Any] | None = None,
        solo_unless_sharded: bool = False,
    ) -> None:
        self._limits = limits
        self._solo_unless_sharded = solo_unless_sharded
        self._workers = workers
        self._new_pool = functools.partial(
            StreamPool,
            recipe,
            batch_size,
            drop_last,
            context=context,
            prefetch_per_worker=prefetch_per_worker,
            timeout=timeout,
            finish=finish,
        )
        self.pool = self._new_pool()
        self._batches: Iterator[tuple[Any, Skipped, BaseException | None]] = iter(())
        self._job: tuple[EpochJob, int] | None = None  # the epoch under way, its pass
        self._starting = threading.Lock()  # an epoch begins: a let-go of the last waits
        self._owned: weakref.finalize[Any, Any] | None = None  # set on an epoch's own engine
        self._sides: list[weakref.finalize[Any, Any]] = []  # their workers, stopped with ours

    @property
    def workers(self) -> int:
        return self._workers

    def start_epoch(self, job: EpochJob) -> None:
        workers = job.workers if job.workers is not None else self._workers
        with self._starting:
            generation = self.pool.start_epoch(
                workers,
                job.seed,
                fresh=job.fresh,
                solo_unless_sharded=self._solo_unless_sharded,
                rngs=job.rngs,
                keep_rngs=job.persistent,
                shared_seed=job.pipe_seed,
            )
            self._batches = self.pool.batches(generation)
            self._job = (job, generation)

    def end_epoch(self, job: EpochJob) -> None:
        if self._owned is not None:
            self._owned()  # its workers were its own
        elif not job.persistent:
            self.pool.shutdown(grace_s=0.5)  # the next epoch starts new ones

    def let_go(self, job: EpochJob) -> None:
        # From a finalizer, in any thread: never waits. A newer epoch beginning (in another
        # thread, or in this one, which a collection interrupted) replaces what this would.
        if not self._starting.acquire(blocking=False):
            return
        try:
            under_way = self._job
            if under_way is None or under_way[0] is not job:
                return  # a newer epoch has begun
            self._batches, self._job = iter(()), None  # with the last batch the stream held
            if not job.persistent:
                self.pool.let_go(under_way[1])
        finally:
            self._starting.release()

    def beside(self, job: EpochJob, start: int) -> StreamEngine | None:
        """The epoch under way, handed over with its workers, which stream on (each of
        DataLoader's iterators has workers of its own); this engine starts new ones for the
        newer epoch. The handed-over workers exit at the epoch's end, when its iterator is
        let go of, or with the loader. Not for persistent workers: their RNGs draw on from
        one epoch to the next, so new ones would give the later epochs other draws."""
        if job.persistent:
            return None
        side = copy.copy(self)
        side._sides, side._starting = [], threading.Lock()
        side._owned = weakref.finalize(side, self.pool.shutdown, 0.5)
        self._sides = [f for f in self._sides if f.alive]
        self._sides.append(side._owned)
        self.pool, self._batches, self._job = self._new_pool(), iter(()), None
        return side

    def next(self) -> EngineBatch | None:
        item = next(self._batches, None)
        return None if item is None else EngineBatch(item[0], item[1], error=item[2])

    def stream_rngs(self) -> list[dict[str, Any]] | None:
        return self.pool.rngs

    def resize(self, workers: int) -> None:
        self._workers = workers  # streams cannot move between workers: from the next epoch

    def snapshot(self, samples: int) -> PipelineSnapshot:
        return self.pool.snapshot(
            samples=samples,
            memory_budget=self._limits.memory_budget,
            max_workers=self._limits.max_workers,
            target_workers=self._workers,
        )

    def shutdown(self) -> None:
        for side in self._sides:
            side()
        if self._owned is not None:
            self._owned()
        else:
            self.pool.shutdown()
