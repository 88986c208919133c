"""The worker pool: processes that make batches, each with its own pair of pipes.

Each worker has a private task pipe and result pipe rather than sharing one queue: a worker killed
mid-write can only corrupt its own pipe (a shared ``multiprocessing.Queue`` would leave its lock
held and stall every other worker), and the pool always knows which tasks a dead worker took.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Any

from drapps.runtime.transport import remove_slabs, slab_prefix
from drapps.runtime.worker import BatchRecipe, run_worker

logger = logging.getLogger(__name__)

# Every worker process drapps started in this process. multiprocessing lists them as children of
# this process, and a plain os.fork() child inherits that list: when such a child exits, its
# atexit handler would terminate our workers as if they were its own. The fork hook below makes
# the child forget them.
_started: weakref.WeakSet[BaseProcess] = weakref.WeakSet()


def _forget_workers_after_fork() -> None:
    children = getattr(multiprocessing.process, "_children", None)
    if children is not None:
        for process in list(_started):
            children.discard(process)
    _started.clear()


os.register_at_fork(after_in_child=_forget_workers_after_fork)


def start_worker_process(
    context: BaseContext,
    target: Callable[..., None],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    name: str,
) -> tuple[BaseProcess, Connection, Connection]:
    """Start ``target(*args, tasks, results, parent_pid, **kwargs)`` as a daemon worker with a
    private task pipe and result pipe; returns the process and our ends of both pipes.

    The process is also counted among the workers a forked child must not terminate.
    """
    task_recv, task_send = context.Pipe(duplex=False)
    result_recv, result_send = context.Pipe(duplex=False)
    process = context.Process(  # type: ignore[attr-defined]
        target=target,
        args=(*args, task_recv, result_send, os.getpid()),
        kwargs=kwargs,
        name=name,
        daemon=True,
    )
    process.start()
    _started.add(process)
    task_recv.close()
    result_send.close()
    return process, task_send, result_recv


@dataclass(frozen=True)
class Task:
    """One batch to make."""

    generation: int
    epoch: int
    batch_id: int
    indices: list[int]
    assigned_at: float


@dataclass(eq=False)
class Worker:
    """The pool's view of one worker process."""

    wid: int
    process: BaseProcess
    tasks: Connection
    results: Connection
    assigned: deque[Task] = field(default_factory=deque)
    """Tasks sent and not yet answered, oldest (the one being made) first."""
    last_progress: float = field(default_factory=time.monotonic)
    """When the worker last finished a task (or started)."""
    retiring: bool = False
    """Told to stop after its assigned tasks."""
    parked_at: float | None = None
    """When a shrink parked it: it finishes what it holds, takes nothing new, and is the first
    reused by a grow (no fork, no cold start); retired once parked for long enough."""
    broken: bool = False
    """Its result pipe failed; only its exit is awaited."""
    slot: int = 0
    """Its id as ``torch.utils.data.get_worker_info()`` reports it."""
    last_error: str | None = None
    """The last line of the error that killed it, when it could say."""

    def head_started(self) -> float | None:
        """When the worker began its current task, or None when it has none."""
        if not self.assigned:
            return None
        return max(self.assigned[0].assigned_at, self.last_progress)


class WorkerPool:
    """Starts, retires, kills and reaps worker processes; knows their unanswered tasks."""

    def __init__(self, recipe: BatchRecipe, session: str, context: BaseContext | None) -> None:
        self._recipe = recipe
        self._session = session
        self._context = context or multiprocessing.get_context()
        self._next_wid = 0
        self.workers: list[Worker] = []

    def live(self) -> list[Worker]:
        """Workers that take new tasks (not parked, retiring or broken)."""
        return [w for w in self.workers if not w.retiring and not w.broken and w.parked_at is None]

    def pids(self) -> tuple[int, ...]:
        """Process ids of every started worker (parked and retiring ones included)."""
        return tuple(p for w in list(self.workers) if (p := w.process.pid) is not None)

    def parked(self) -> list[Worker]:
        """Parked workers, most recently parked first."""
        parked = [w for w in self.workers if w.parked_at is not None and not w.retiring]
        return sorted(parked, key=lambda w: w.parked_at or 0.0, reverse=True)

    def spawn(self, num_workers: int = 1, seed: int = 0) -> Worker:
        """Start a worker; it takes the lowest id (``get_worker_info().id``) not in use.

        Args:
            num_workers: the pool's size as the new worker's ``get_worker_info()`` first says.
            seed: the epoch's base seed; the worker's global RNGs start from it as
                DataLoader's do.
        """
        wid = self._next_wid
        self._next_wid += 1
        taken = {w.slot for w in self.workers if not w.retiring}
        slot = next(i for i in range(len(taken) + 1) if i not in taken)
        process, task_send, result_recv = start_worker_process(
            self._context,
            run_worker,
            (self._recipe, self._session, wid),
            {"slot": slot, "num_workers": num_workers, "base_seed": seed},
            name=f"drapps-worker-{slot}",
        )
        worker = Worker(wid, process, task_send, result_recv, slot=slot)
        self.workers.append(worker)
        logger.debug("started worker %d (pid %s)", wid, process.pid)
        return worker

    def retire(self, worker: Worker) -> None:
        """Let ``worker`` finish its assigned tasks, then exit (the pipe keeps order)."""
        worker.retiring = True
        try:
            worker.tasks.send(None)
        except OSError:
            worker.broken = True

    def kill(self, worker: Worker) -> None:
        if worker.process.is_alive():
            worker.process.kill()
        worker.process.join(timeout=5.0)

    def reap(self, worker: Worker) -> list[Task]:
        """Forget an exited worker; returns its unanswered tasks and removes its stray slabs."""
        worker.process.join(timeout=5.0)
        worker.tasks.close()
        worker.results.close()
        self.workers.remove(worker)
        # Whatever it sent was already mapped and unlinked; what is left was never delivered.
        remove_slabs(slab_prefix(self._session, worker.wid))
        unanswered = list(worker.assigned)
        worker.assigned.clear()
        return unanswered

    def shutdown(self, grace_s: float = 2.0) -> None:
        """Stop every worker: ask, wait up to ``grace_s``, then kill; remove all our slabs."""
        for worker in self.workers:
            if not worker.retiring:
                self.retire(worker)
        deadline = time.monotonic() + grace_s
        for worker in self.workers:
            worker.process.join(timeout=max(0.0, deadline - time.monotonic()))
        for worker in list(self.workers):
            self.kill(worker)
            self.reap(worker)
        remove_slabs(slab_prefix(self._session))
