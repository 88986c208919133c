"""The pool seam: a second kind of pool (threads) runs under the unchanged dispatcher."""

from __future__ import annotations

import threading

import pytest
import torch
from helpers import ThreadPool
from torch.utils.data import default_collate

from drapps.engines.pooled import pool_snapshot
from drapps.runtime.config import PoolSettings
from drapps.runtime.dispatcher import Dispatcher
from drapps.runtime.errors import SampleError
from drapps.runtime.plan import Plan
from drapps.runtime.pool import WorkerPool
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
