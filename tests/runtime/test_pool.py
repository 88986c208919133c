"""The pool seam: a second kind of pool (threads) runs under the unchanged dispatcher."""

from __future__ import annotations

import threading

import pytest
import torch
from helpers import BarePool, ThreadPool
from torch.utils.data import default_collate

from drapps.engines.pooled import pool_snapshot
from drapps.runtime.config import PoolSettings
from drapps.runtime.dispatcher import Dispatcher
from drapps.runtime.errors import SampleError
from drapps.runtime.plan import Plan
from drapps.runtime.pool import Task, WorkerPool
from drapps.runtime.process_pool import ProcessPool
from drapps.runtime.worker import BatchRecipe


def _recipe() -> BatchRecipe:
    data = [torch.tensor([i]) for i in range(40)]
    return BatchRecipe(data, lambda x: x * 10, default_collate, "raise")


def _dispatcher(pool: WorkerPool | None, workers: int) -> Dispatcher:
    settings = PoolSettings(workers=workers, memory_budget=2**24, timeout=30.0, max_attempts=3)
    return Dispatcher(_recipe(), settings, pool=pool)


def _epoch(dispatcher: Dispatcher, plan: Plan, resize_at: int | None = None) -> list[int]:
    dispatcher.start_epoch(plan, 0)
    seen: list[int] = []
    while (entry := dispatcher.buffer.get(dispatcher.alive)) is not None:
        if entry.error is not None:
            raise entry.error
        seen += entry.batch.flatten().tolist()
        if resize_at is not None and len(seen) == resize_at:
            dispatcher.resize(2)
    return seen


@pytest.mark.parametrize("kind", ["threads", "processes"])
def test_one_dispatcher_runs_either_pool(kind: str) -> None:
    pool = ThreadPool(_recipe()) if kind == "threads" else None
    dispatcher = _dispatcher(pool, workers=1)
    try:
        plan = Plan(40, 4, shuffle=True, drop_last=False, seed=3, epoch=0)
        expected = [10 * i for b in range(len(plan)) for i in plan.batch(b)]
        assert _epoch(dispatcher, plan, resize_at=8) == expected  # in order across a resize
        assert dispatcher.target_workers == 2
        snapshot = pool_snapshot(dispatcher, samples=40, memory_budget=2**24, max_workers=2)
        assert snapshot.target_workers == 2
        assert isinstance(dispatcher.pool, ThreadPool if pool else ProcessPool)
        if pool is not None:
            assert snapshot.worker_pids == ()  # threads: nothing for the monitor to measure
    finally:
        dispatcher.shutdown()
    assert dispatcher.pool.workers == []
    if pool is not None:
        assert pool.closed
        assert not [t for t in threading.enumerate() if t.name.startswith("test-pool-")]


def test_a_sample_error_travels_through_a_thread_pool() -> None:
    recipe = BatchRecipe([torch.tensor([0]), "not a tensor"], None, default_collate, "raise")
    pool = ThreadPool(recipe)
    settings = PoolSettings(workers=1, memory_budget=2**20, timeout=None, max_attempts=1)
    dispatcher = Dispatcher(recipe, settings, pool=pool)
    try:
        with pytest.raises(SampleError, match="collate_fn failed"):
            _epoch(dispatcher, Plan(2, 2, shuffle=False, drop_last=False, seed=0, epoch=0))
    finally:
        dispatcher.shutdown()


def _ids(pool: WorkerPool) -> list[int]:
    return sorted(w.slot for w in pool.live())


def test_the_live_workers_ids_stay_below_their_number_across_resizes() -> None:
    """DataLoader's ``get_worker_info().id`` is below ``num_workers`` (the pool's size, as
    each task tells it); a dataset that keys a resource by id relies on it. A shrink parks
    the highest ids whatever each holds, a grow takes the lowest back, and a worker whose
    pipe broke leaves its id to its replacement."""
    pool = BarePool()
    pool.keep_size(4, seed=0)
    assert _ids(pool) == [0, 1, 2, 3]
    for worker in pool.workers[:2]:  # ids 0 and 1 idle, 2 and 3 busy
        worker.assigned.clear()
    for worker in pool.workers[2:]:
        worker.assigned.extend(Task(0, 0, b, [b], 0.0) for b in range(3))
    pool.keep_size(2, seed=0)
    assert _ids(pool) == [0, 1]
    pool.keep_size(3, seed=0)
    assert _ids(pool) == [0, 1, 2] and len(pool.workers) == 4  # taken back, not started
    pool.workers[1].broken = True  # its process is being killed: its id is free
    pool.keep_size(3, seed=0)
    assert _ids(pool) == [0, 1, 2] and pool.workers[-1].slot == 1
    pool.reap(pool.workers[1])
    pool.keep_size(4, seed=0)
    assert _ids(pool) == [0, 1, 2, 3] and len(pool.workers) == 4


def test_a_shrink_as_the_lowest_worker_dies_keeps_the_ids_below_the_count() -> None:
    """Worker 0 dies as the pool shrinks from two workers to one (found by the campaign of
    events: the controller of the default count shrank it as a worker was killed). Worker 1
    must not go on alone as id 1 of ``num_workers=1``: it is parked, and a new worker 0
    starts."""
    pool = BarePool()
    pool.keep_size(2, seed=0)
    pool.workers[0].broken = True
    pool.keep_size(1, seed=0)
    assert _ids(pool) == [0]
    assert [w.slot for w in pool.parked()] == [1]
