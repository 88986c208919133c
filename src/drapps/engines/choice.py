"""The choice of engine: the one place the branch on the kind of engine is written.

:func:`choose_engine` takes a loader's settings and the parts
:func:`~drapps.engines.assembly.assemble` built (the batch recipe, the backend, the pinning
step, the Pipeline's split) and returns the engine that makes its batches: inline, the stream
engine over an iterable dataset's workers, or the pool engine over the backend's pool.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from drapps.engines.backends import Backend
from drapps.engines.base import Engine, Limits
from drapps.engines.inline import InlineEngine
from drapps.engines.pooled import PoolEngine
from drapps.engines.stream import StreamEngine
from drapps.ops.split import Split
from drapps.runtime.config import LoaderConfig
from drapps.runtime.executor_pool import ExecutorPool
from drapps.runtime.pool import WorkerPool
from drapps.runtime.process_pool import ProcessPool
from drapps.runtime.thread_pool import ThreadPool
from drapps.runtime.worker import BatchRecipe, splittable


def choose_engine(
    c: LoaderConfig,
    recipe: BatchRecipe,
    backend: Backend,
    finish: Callable[[Any], Any] | None,
    split: Split | None,
    iterable: bool,
) -> tuple[Engine, LoaderConfig]:
    """The engine for ``c``, the one place the branch on the kind is written: inline without
    workers, the stream engine for an iterable dataset, else the pool engine over
    ``backend``'s pool (a remote backend bounds and starts it with the cluster's CPUs).
    Returns it with the config as the choice leaves it (no workers where the recipe cannot
    be sent to them; a Ray cluster's CPUs cap ``max_workers``)."""
    per_worker = c.prefetch_factor or 2
    budget = c.resolved_memory_budget
    limits = Limits(budget, c.resolved_max_workers)
    first_split = split.cut if split is not None else None
    if c.initial_workers and not backend.sendable(c, recipe):
        c = dataclasses.replace(
            c,
            workers=0,
            prefetch_factor=None,
            multiprocessing_context=None,
            persistent_workers=False,
            split=None if c.split == "auto" else c.split,
            offload=None if c.offload == "auto" else c.offload,
        )
    if c.initial_workers == 0:
        engine: Engine = InlineEngine(
            recipe,
            c.batch_size,
            c.drop_last,
            limits,
            finish,
            split=first_split,
            seeded=c.seed is not None,
        )
        return engine, c
    if c.defer_after is not None and (iterable or not splittable(recipe)):
        what = "an iterable dataset" if iterable else "a collate_fn of its own"
        raise ValueError(
            f"defer_after needs a map-style dataset whose batches torch's default_collate "
            f"makes (it fills them from samples), got {what}"
        )
    if iterable:
        engine = StreamEngine(
            recipe,
            c.batch_size,
            c.drop_last,
            workers=c.initial_workers,
            limits=limits,
            context=c.context,
            prefetch_per_worker=per_worker,
            timeout=c.resolved_timeout,
            finish=finish,
            # The default count never duplicates a dataset that does not shard itself.
            solo_unless_sharded=c.workers == "auto",
        )
        return engine, c
    if c.workers == "auto" and backend.name == "process" and recipe.worker_init_fn is None:
        # The default count may also choose threads, once the workers have shown that the
        # dataset draws from no global generator (they watch their first samples).
        recipe = dataclasses.replace(recipe, watch_draws=True)
        pool: WorkerPool = ExecutorPool(ProcessPool(recipe, c.context), ThreadPool(recipe))
    else:
        pool = backend.make_pool(recipe, c.context)
    initial = c.initial_workers
    if not backend.local:  # bounded by the cluster's CPUs, and starting with all of them
        cap = c.max_workers or pool.max_workers()  # type: ignore[attr-defined]
        try:
            c = dataclasses.replace(c, max_workers=cap)
        except ValueError as exc:
            pool.shutdown()
            raise ValueError(f"{exc} (the Ray cluster has CPUs for {cap} actors)") from None
        initial = c.resolved_max_workers if c.workers == "auto" else c.initial_workers
    engine = PoolEngine(
        recipe,
        c.pool_settings(initial, memory_budget=budget),
        max_workers=c.resolved_max_workers,
        finish=finish,
        split=first_split,
        pool=pool,
        in_order=c.in_order,
        in_process_if_unsendable=c.workers == "auto" and backend.local,
        # The default count may also make cheap batches in the training process; not where
        # the user's worker_init_fn prepares what samples need, nor where samples are pooled.
        in_loop=c.workers == "auto"
        and backend.local
        and recipe.worker_init_fn is None
        and c.defer_after is None,
    )
    return engine, c
