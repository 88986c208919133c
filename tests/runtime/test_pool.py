"""The pool seam: a second kind of pool (threads) runs under the unchanged dispatcher."""

from __future__ import annotations

import os
import queue
import threading
import traceback
from multiprocessing.connection import wait
from typing import Any

import pytest
import torch
from torch.utils.data import default_collate

from drapps.runtime.dispatcher import Dispatcher
from drapps.runtime.errors import SampleError
from drapps.runtime.plan import Plan
from drapps.runtime.pool import Polled, Reply, Task, Worker, WorkerPool
from drapps.runtime.process_pool import ProcessPool
from drapps.runtime.transport import pack_inline
from drapps.runtime.worker import BatchRecipe, make_batch


class ThreadPool(WorkerPool):
    """Workers as threads of this process: each takes messages from its own queue and puts
    replies on one shared queue, writing a byte to a pipe so that ``poll`` wakes up."""

    def __init__(self, recipe: BatchRecipe) -> None:
        super().__init__()
        self._recipe = recipe
        self._inboxes: dict[int, queue.SimpleQueue[Any]] = {}
        self._threads: dict[int, threading.Thread] = {}
        self._replies: queue.SimpleQueue[Reply] = queue.SimpleQueue()
        self._notify_r, self._notify_w = os.pipe()
        self.closed = False

    def _run(self, worker: Worker, inbox: queue.SimpleQueue[Any]) -> None:
        while (message := inbox.get()) is not None:
            generation, seed, epoch, batch_id, indices, _, stop = message
            try:
                made = make_batch(self._recipe, seed, epoch, indices, stop)
                packed = None if made.batch is None else pack_inline(made.batch)
                reply = ("ok", generation, batch_id, packed, made.skipped, made.seconds)
            except SampleError as exc:
                reply = ("err", generation, batch_id, exc)
            except Exception:
                reply = ("fatal", -1, -1, traceback.format_exc())
            self._replies.put((worker, reply))
            os.write(self._notify_w, b"x")

    def spawn(self, num_workers: int = 1, seed: int = 0) -> Worker:
        wid, slot = self.next_ids()
        worker = Worker(wid, slot=slot)
        inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        thread = threading.Thread(target=self._run, args=(worker, inbox), name=f"test-pool-{wid}")
        self._inboxes[wid], self._threads[wid] = inbox, thread
        self.workers.append(worker)
        thread.start()
        return worker

    def send(self, worker: Worker, message: Any) -> None:
        self._inboxes[worker.wid].put(message)

    def poll(self, timeout: float, wake: int) -> Polled:
        ready = wait([self._notify_r, wake], timeout=timeout)
        polled = Polled(woke=wake in ready)
        if self._notify_r in ready:
            os.read(self._notify_r, 4096)
        while not self._replies.empty():
            polled.replies.append(self._replies.get())
        polled.exited = [w for w in self.workers if not self._threads[w.wid].is_alive()]
        return polled

    def drain(self, worker: Worker) -> list[Reply]:
        return []  # every reply is on the shared queue, which poll() empties

    def retire(self, worker: Worker) -> None:
        worker.retiring = True
        self._inboxes[worker.wid].put(None)

    def kill(self, worker: Worker, *, wait_s: float = 5.0) -> None:
        self._inboxes[worker.wid].put(None)  # a thread cannot be killed: it stops when free
        self._threads[worker.wid].join(timeout=wait_s)

    def reap(self, worker: Worker) -> list[Task]:
        self._threads.pop(worker.wid).join(timeout=5.0)
        del self._inboxes[worker.wid]
        return self.forget(worker)

    def exit_reason(self, worker: Worker) -> str:
        return "thread ended"

    def shutdown(self, grace_s: float = 2.0) -> None:
        if self.closed:
            return
        self.closed = True
        for worker in list(self.workers):
            self.kill(worker, wait_s=grace_s)
            self.reap(worker)
        os.close(self._notify_r)
        os.close(self._notify_w)


def _recipe() -> BatchRecipe:
    data = [torch.tensor([i]) for i in range(40)]
    return BatchRecipe(data, lambda x: x * 10, default_collate, "raise")


def _dispatcher(pool: WorkerPool | None, workers: int) -> Dispatcher:
    return Dispatcher(
        _recipe(),
        workers=workers,
        prefetch=None,
        memory_budget=2**24,
        timeout=30.0,
        max_attempts=3,
        context=None,
        pool=pool,
    )


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
        snapshot = dispatcher.snapshot(samples=40, memory_budget=2**24, max_workers=2)
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
    dispatcher = Dispatcher(
        recipe, workers=1, prefetch=None, memory_budget=2**20, timeout=None, max_attempts=1,
        context=None, pool=pool,
    )  # fmt: skip
    try:
        with pytest.raises(SampleError, match="collate_fn failed"):
            _epoch(dispatcher, Plan(2, 2, shuffle=False, drop_last=False, seed=0, epoch=0))
    finally:
        dispatcher.shutdown()
