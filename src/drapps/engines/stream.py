"""The stream engine: an iterable dataset's batches from worker processes, round-robin.

Each worker iterates its own copy of the dataset (sharding through ``get_worker_info()``), as
DataLoader's workers do; the worker count is fixed within an epoch, so a resize applies from
the next one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from multiprocessing.context import BaseContext
from typing import Any

from drapps.engines.base import Engine, EngineBatch, EpochJob, Limits, Skipped
from drapps.runtime.stats import PipelineSnapshot
from drapps.runtime.stream import StreamPool
from drapps.runtime.worker import BatchRecipe


class StreamEngine(Engine):
    """Batches of an iterable dataset made by ``workers`` processes."""

    kind = "stream"

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
        self.pool = StreamPool(
            recipe,
            batch_size,
            drop_last,
            context=context,
            prefetch_per_worker=prefetch_per_worker,
            timeout=timeout,
            finish=finish,
        )
        self._batches: Iterator[tuple[Any, Skipped, BaseException | None]] = iter(())

    @property
    def workers(self) -> int:
        return self._workers

    def start_epoch(self, job: EpochJob) -> None:
        workers = job.workers if job.workers is not None else self._workers
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

    def end_epoch(self, job: EpochJob) -> None:
        if not job.persistent:
            self.pool.shutdown(grace_s=0.5)  # the next epoch starts new ones

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
        self.pool.shutdown()
