"""The Ray pool: batches made by Ray actors, on whichever machines of a Ray cluster have room.

A second member of the pool protocol (:class:`drapps.runtime.pool.WorkerPool`): the dispatcher
plans, orders, retries and bounds memory exactly as with worker processes, and the controller
sizes the actor pool with the same knobs. Each actor holds the batch recipe (sent once through
the object store) and makes batches with the same :func:`~drapps.runtime.worker.make_batch` a
worker process runs, so batches are bit-identical to the local backend's for the same seed.

A batch comes back as one NumPy uint8 array plus a small skeleton (:func:`pack_buffer`), which
Ray moves through its object store without pickling the bytes. An actor that dies (killed, its
node gone) fails the calls it held; the pool reports it exited and the dispatcher re-queues its
batches and starts a replacement, as it does for a dead process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from drapps._optional import require
from drapps.runtime.messages import BatchFailed, BatchMade, BatchTask, SlabsFreed
from drapps.runtime.pool import Polled, Reply, Task, Worker, WorkerPool
from drapps.runtime.worker import BatchRecipe

logger = logging.getLogger(__name__)

_VIEW_TTL_S = 1.0


class _BatchMaker:
    """The actor: a worker process's state (seeded globals, worker info) and its loop body."""

    def __init__(self, recipe: BatchRecipe, slot: int, num_workers: int, seed: int) -> None:
        import ray

        from drapps.runtime.seeding import seed_worker, set_worker_info
        from drapps.runtime.worker import enter_worker_process, run_worker_init

        enter_worker_process()
        self._recipe = recipe
        self._slot, self._workers, self._seed = slot, num_workers, seed
        seed_worker(seed, slot)
        set_worker_info(slot, num_workers, seed, recipe.dataset)
        self._init_error = run_worker_init(recipe, slot)
        self._where = (os.getpid(), ray.get_runtime_context().get_node_id())

    def make(self, task: BatchTask) -> tuple[tuple[int, str], BatchMade | BatchFailed]:
        """One task, answered as a worker process answers it; with where the actor runs."""
        from drapps.runtime.seeding import set_worker_info
        from drapps.runtime.transport import pack_buffer
        from drapps.runtime.worker import answer

        if (task.num_workers, task.seed) != (self._workers, self._seed):
            self._workers, self._seed = task.num_workers, task.seed
            set_worker_info(self._slot, task.num_workers, task.seed, self._recipe.dataset)
        return self._where, answer(self._recipe, task, pack_buffer, self._init_error)


@dataclass(eq=False, kw_only=True)
class RayWorker(Worker):
    """An actor and the calls it has not answered yet, oldest first."""

    actor: Any
    started: Future[Any] | None = None
    """Done once Ray has placed the actor and run its constructor."""
    calls: deque[Future[Any]] = field(default_factory=deque)
    pid: int | None = None
    """Its process id when it runs on this machine (measured by the monitor)."""
    gone: str | None = None
    """How it ended, once it has: the pool killed it, or the error its call raised."""


class RayPool(WorkerPool):
    """Batches made by Ray actors, with the options of :class:`drapps.RayBackend` (which
    checks them and makes this pool).

    Ray is initialised here when it is not yet (and shut down again by :meth:`shutdown`).
    Replies arrive as futures of actor calls; each one's completion writes a byte to a pipe, so
    :meth:`poll` waits on that pipe and the dispatcher's wake-up descriptor together.

    Args:
        recipe: what each actor makes batches with.
        address: the cluster ``ray.init(address)`` joins when Ray is not initialised yet.
        cpus_per_worker: CPUs each actor reserves in Ray's scheduler.
        spread: spread actors over the nodes (Ray's ``SPREAD`` strategy).
    """

    executor = "Ray actors"
    why = "asked for (backend='ray')"

    def __init__(
        self,
        recipe: BatchRecipe,
        *,
        address: str | None = None,
        cpus_per_worker: float = 1.0,
        spread: bool = True,
    ) -> None:
        super().__init__()
        ray = require("ray")
        self._ray = ray
        self._cpus_per_worker = cpus_per_worker
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            ray.init(address=address, include_dashboard=False, logging_level=logging.WARNING)
        self._node = ray.get_runtime_context().get_node_id()
        self._recipe = ray.put(recipe)
        options: dict[str, Any] = {
            "num_cpus": cpus_per_worker,
            "max_restarts": 0,  # the dispatcher replaces actors and re-queues their batches
            "max_task_retries": 0,
        }
        if spread:
            options["scheduling_strategy"] = "SPREAD"
        self._actor_class = ray.remote(_BatchMaker).options(**options)
        self._ready_r, self._ready_w = os.pipe()
        os.set_blocking(self._ready_r, False)
        os.set_blocking(self._ready_w, False)
        self._lock = threading.Lock()
        self._closed = False
        self._view: tuple[float, float] | None = None
        self._view_at = -_VIEW_TTL_S

    def cluster_cpus(self) -> float:
        """CPUs in the cluster now, as Ray counts them."""
        return float(self._ray.cluster_resources().get("CPU", 0.0))

    def max_workers(self) -> int:
        """Actors the cluster has CPUs for (at least 1)."""
        return max(1, int(self.cluster_cpus() // self._cpus_per_worker))

    def _cluster_view(self) -> tuple[float, float] | None:
        """(CPUs, free CPUs) as Ray counts them, read at most once a second: the dispatcher
        asks on every loop and the monitor every tick. None until Ray first answers."""
        now = time.monotonic()
        if now - self._view_at > _VIEW_TTL_S:
            with contextlib.suppress(Exception):  # unreachable: keep the last answer
                total = self.cluster_cpus()
                free = float(self._ray.available_resources().get("CPU", 0.0))
                self._view = total, min(free, total)
            self._view_at = now
        return self._view

    def capacity(self) -> int | None:
        # After a node is lost, replacements beyond what is left would wait for CPUs that
        # never come.
        view = self._cluster_view()
        return None if view is None else max(1, int(view[0] // self._cpus_per_worker))

    # ------------------------------------------------------------------ the pool protocol

    def pids(self) -> tuple[int, ...]:
        return tuple(w.pid for w in _own_all(self.workers) if w.pid is not None and not w.gone)

    def resources(self) -> tuple[float, float] | None:
        return self._cluster_view()

    def spawn(self, num_workers: int = 1, seed: int = 0) -> Worker:
        wid, slot = self.next_ids()
        actor = self._actor_class.remote(self._recipe, slot, num_workers, seed)
        worker = RayWorker(
            wid, slot=slot, actor=actor, started=actor.__ray_ready__.remote().future()
        )
        self.workers.append(worker)
        logger.debug("started Ray actor for worker %d", wid)
        return worker

    def send(self, worker: Worker, message: BatchTask | SlabsFreed | None) -> None:
        own = _own(worker)
        try:
            call = own.actor.make.remote(message).future()
        except Exception as exc:  # the actor handle is unusable: it counts as exited
            own.gone = f"could not be sent a task ({type(exc).__name__}: {exc})"
            worker.broken = True
            return
        own.calls.append(call)
        call.add_done_callback(self._notify)

    def _notify(self, _: Future[Any]) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._ready_w, b"x")

    def poll(self, timeout: float, wake: int) -> Polled:
        try:
            readable, _, _ = select.select([wake, self._ready_r], [], [], max(0.0, timeout))
        except InterruptedError:
            readable = []
        if self._ready_r in readable:
            with contextlib.suppress(BlockingIOError):
                while os.read(self._ready_r, 4096):
                    pass
        polled = Polled(woke=wake in readable)
        for worker in self.workers:
            polled.replies += self.drain(worker)
        for worker in _own_all(self.workers):
            if worker.retiring and not worker.calls and worker.gone is None:
                self._stop(worker, "retired")
        self._unplace()
        polled.exited = [w for w in _own_all(self.workers) if w.gone is not None]
        return polled

    def _unplace(self) -> None:
        """Stop actors still waiting for a place the cluster no longer has (a node was lost
        after they were asked for), so that their batches go to actors that run."""
        waiting = [
            w for w in _own_all(self.workers)
            if w.gone is None and w.started is not None and not w.started.done()
        ]  # fmt: skip
        if not waiting:
            return
        capacity = self.capacity() or 0
        running = [w for w in _own_all(self.workers) if w.gone is None and not w.retiring]
        for worker in waiting[::-1][: max(0, len(running) - capacity)]:
            self._stop(worker, f"could not be placed: the cluster has CPUs for {capacity} actors")

    def drain(self, worker: Worker) -> list[Reply]:
        own = _own(worker)
        replies: list[Reply] = []
        while own.calls and own.calls[0].done() and own.gone is None:
            call = own.calls.popleft()
            try:
                (pid, node), reply = call.result()
            except Exception as exc:  # the actor died (killed, its node lost) or cannot run
                own.gone = _describe(exc)
                worker.last_error = own.gone
                self._view_at = -_VIEW_TTL_S  # a node may be gone with it: read Ray's view again
                logger.debug("Ray actor of worker %d is gone: %s", worker.wid, own.gone)
                break
            if own.pid is None and node == self._node:
                own.pid = pid
            replies.append((worker, reply))
        return replies

    def retire(self, worker: Worker) -> None:
        worker.retiring = True  # stopped by poll() once its calls are answered

    def kill(self, worker: Worker, *, wait_s: float = 5.0) -> None:
        self._stop(_own(worker), "was stopped")

    def _stop(self, worker: RayWorker, reason: str) -> None:
        if worker.gone is None:
            worker.gone = reason
        with contextlib.suppress(Exception):
            self._ray.kill(worker.actor, no_restart=True)

    def reap(self, worker: Worker) -> list[Task]:
        own = _own(worker)
        if own.gone is None:
            self._stop(own, "was stopped")
        own.calls.clear()  # their answers, should they come, are for a worker that is gone
        return self.forget(worker)

    def exit_reason(self, worker: Worker) -> str:
        return _own(worker).gone or "is running"

    def shutdown(self, grace_s: float = 2.0) -> None:
        """Kill every actor (their batches are not needed any more) and, when this pool
        started Ray, stop it. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for worker in list(self.workers):
            self.kill(worker)
            self.reap(worker)
        for fd in (self._ready_r, self._ready_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        if self._owns_ray and self._ray.is_initialized():
            self._ray.shutdown()


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _own(worker: Worker) -> RayWorker:
    if not isinstance(worker, RayWorker):
        raise TypeError(f"worker {worker.wid} is not a RayPool worker")
    return worker


def _own_all(workers: list[Worker]) -> list[RayWorker]:
    return [_own(w) for w in workers]
