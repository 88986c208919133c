"""The pool protocol: what the dispatcher needs of a set of workers, whatever they run on.

A pool starts workers, sends each a task message, and reports what came back (replies and
exits) in one :meth:`WorkerPool.poll`; it grows by :meth:`~WorkerPool.spawn`, shrinks by
:meth:`~WorkerPool.retire`, and answers for every task it was given (:meth:`~WorkerPool.reap`
returns those a dead worker left unanswered). Scheduling, retries, ordering and the memory
budget stay in the dispatcher, so a new pool (threads, Ray actors) only moves messages.

The lifecycle follows torchdata.nodes' ``BaseNode`` in spirit: start (``spawn``), next
(``send`` + ``poll``), reset (the dispatcher's epochs re-seed workers through task messages),
and ``shutdown``, which every pool makes idempotent and safe under garbage collection.

Members: :class:`drapps.runtime.process_pool.ProcessPool` (the default) and
:class:`drapps.integrations.ray_pool.RayPool` (Ray actors).
"""

from __future__ import annotations

import signal
import time
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from drapps.runtime.messages import BatchTask, SlabsFreed, WorkerReply
from drapps.runtime.progress import SampleClock
from drapps.runtime.schedule import Work

PARK_S = 5.0
"""A worker parked by a shrink is kept this long for a grow to reuse before it is retired:
controllers oscillate, and a fork of a large training process costs tens of milliseconds."""

Reply = tuple["Worker", WorkerReply]
"""A worker and one reply it sent (see :func:`drapps.runtime.worker.run_worker`)."""


@dataclass(frozen=True)
class Task:
    """One batch to make."""

    generation: int
    epoch: int
    batch_id: int
    indices: list[int]
    assigned_at: float
    split: Any = None
    """The transform Pipeline's split the batch is made with (None: no Pipeline; a
    :class:`drapps.ops.cut.Cut` under an offload share below 1)."""
    work: Work | None = None
    """What the schedule handed out: the whole batch or one part (None: the whole batch)."""

    @property
    def part(self) -> int | None:
        """The part of its batch the task makes (None: the whole batch)."""
        return None if self.work is None else self.work.part


@dataclass(eq=False)
class Worker:
    """The dispatcher's view of one worker, whatever it runs on."""

    wid: int
    """The pool's own id for it, never reused."""
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
    clock: SampleClock | None = None
    """Where it is within its task, when its pool can tell (process workers)."""
    asked_at: float = field(default_factory=time.monotonic)
    """When the pool was asked for it."""
    start_s: float | None = None
    """Seconds from :attr:`asked_at` until it was ready for its first task (None: not yet,
    or its pool cannot tell)."""

    def head_started(self) -> float | None:
        """When the worker began its current task, or None when it has none."""
        if not self.assigned:
            return None
        return max(self.assigned[0].assigned_at, self.last_progress)


@dataclass
class Polled:
    """What one :meth:`WorkerPool.poll` found."""

    replies: list[Reply] = field(default_factory=list)
    """Replies in the order each worker sent them."""
    exited: list[Worker] = field(default_factory=list)
    """Workers that are gone (their replies sent before leaving are in ``replies``)."""
    woke: bool = False
    """The dispatcher's wake-up file descriptor was readable."""


class WorkerPool(ABC):
    """A set of workers that make batches from task messages.

    A worker is sent :class:`~drapps.runtime.messages.BatchTask` messages and answers each
    as :func:`drapps.runtime.worker.answer` does, in the order it received them; ``None``
    asks it to stop after what it holds.
    """

    executor = "processes"
    """What the workers are, in words, for the report."""
    why: str | None = None
    """Why the workers are what they are, in words (None: the default)."""
    choosable = False
    """Whether :meth:`use` can change what new workers are (processes or threads)."""

    def __init__(self) -> None:
        self.workers: list[Worker] = []
        self.starts: deque[float] = deque(maxlen=64)
        """Seconds each recent worker took from being asked for to being ready (see
        :meth:`note_starts`)."""
        self._next_wid = 0

    # --------------------------------------------------------------- what a member provides

    @abstractmethod
    def spawn(self, num_workers: int = 1, seed: int = 0) -> Worker:
        """Start a worker (its id from :meth:`next_ids`) and add it to :attr:`workers`.

        Args:
            num_workers: the pool's size as the new worker's ``get_worker_info()`` first says.
            seed: the epoch's base seed; the worker's global RNGs start from it as
                DataLoader's do.
        """

    @abstractmethod
    def send(self, worker: Worker, message: BatchTask | SlabsFreed | None) -> None:
        """Send a task message; on failure give it no new task (``worker.retiring``) and
        make sure it exits (the replies it sent before are still drained)."""

    @abstractmethod
    def poll(self, timeout: float, wake: int) -> Polled:
        """Wait up to ``timeout`` seconds for replies, exits, or the file descriptor ``wake``
        becoming readable (the dispatcher reads it); report what happened."""

    @abstractmethod
    def drain(self, worker: Worker) -> list[Reply]:
        """Replies ``worker`` has sent and :meth:`poll` has not yet returned."""

    @abstractmethod
    def retire(self, worker: Worker) -> None:
        """Let ``worker`` finish its assigned tasks, then exit; set ``worker.retiring``."""

    @abstractmethod
    def kill(self, worker: Worker, *, wait_s: float = 5.0) -> None:
        """Stop ``worker`` now, waiting up to ``wait_s`` for it to be gone."""

    @abstractmethod
    def reap(self, worker: Worker) -> list[Task]:
        """Release an exited worker (:meth:`forget`); returns its unanswered tasks."""

    @abstractmethod
    def exit_reason(self, worker: Worker) -> str:
        """How an exited worker ended, in words (``exited with code 1``)."""

    def exit_words(self, worker: Worker) -> str | None:
        """How DataLoader would say that an exited worker ended, or None (no such words):
        its errors lead with them, since scripts match them."""
        return None

    @abstractmethod
    def shutdown(self, grace_s: float = 2.0) -> None:
        """Stop every worker (ask, wait up to ``grace_s``, then force) and free what they
        held. Idempotent."""

    def exit_wait_s(self) -> float:
        """How much longer than its ``grace_s`` :meth:`shutdown` may wait now: workers that
        cannot be forced (threads) are waited for as the process exits."""
        return 0.0

    def use(self, executor: str) -> bool:
        """Start new workers as ``executor`` from now on; False where this pool cannot (a
        pool of one kind can only stay what it is)."""
        return executor == self.executor

    def note_draws(
        self, watched: int, drew: str | None, python_s: float = 0.0, measured_s: float = 0.0
    ) -> None:
        """A worker watched ``watched`` samples for draws from a global generator and saw
        ``drew`` (None: none), and ``python_s`` of their ``measured_s`` seconds ran Python
        bytecode; only a pool that may move to threads keeps count."""
        return None

    def note_work(
        self, worker: Worker, costs: list[float], cpu_s: float, alone: str | None = None
    ) -> None:
        """``worker`` made samples that cost ``costs`` seconds, of which ``cpu_s`` were CPU
        time (and made them one at a time though asked for more, because ``alone``); only a
        pool that may run a worker's samples in threads keeps count."""
        return None

    def sample_threads(self) -> int:
        """How many of a task's samples a worker makes at once (1: one after another, as
        DataLoader's workers do)."""
        return 1

    def prepare(self, fresh: bool) -> None:
        """An epoch begins (called in the thread that starts it, before the dispatcher acts
        on it); ``fresh``: its workers must see the dataset as it is now."""
        return None

    def idle(self) -> None:
        """No worker starts until the next :meth:`prepare` (the epoch's workers are let go)."""
        return None

    def pids(self) -> tuple[int, ...]:
        """Process ids the monitor should measure (none for workers inside this process)."""
        return ()

    def helper_pids(self) -> tuple[int, ...]:
        """Process ids of the pool's own processes that make no batch (measured for memory)."""
        return ()

    def set_priority(self, niceness: int) -> bool:
        """Run the workers at ``niceness`` (as ``nice``: higher yields the CPU to others), now
        and when started later; returns whether this pool can (worker processes can)."""
        return False

    def capacity(self) -> int | None:
        """Workers the pool can run at once now (a cluster's CPUs); None: no limit of its
        own. The dispatcher starts no more than this, whatever the target."""
        return None

    def resources(self) -> tuple[float, float] | None:
        """(cores, idle cores) where the workers run, for pools that run them on other
        machines (a Ray cluster); None: on this machine, which the monitor measures."""
        return None

    # -------------------------------------------------------------------- shared bookkeeping

    def note_starts(self) -> None:
        """Count the start of each worker that became ready since the last call (those whose
        clock says when)."""
        for worker in self.workers:
            if worker.start_s is None and worker.clock is not None:
                ready = worker.clock.ready_at()
                if ready is not None:
                    worker.start_s = max(0.0, ready - worker.asked_at)
                    self.starts.append(worker.start_s)

    def next_ids(self) -> tuple[int, int]:
        """(wid, slot) for a new worker: a fresh wid, and the lowest ``get_worker_info().id``
        not taken by a worker that stays. A broken worker (its pipe gone, the process being
        killed) does not stay: its replacement takes its id, so ids stay below the pool's
        size, as DataLoader's do."""
        wid = self._next_wid
        self._next_wid += 1
        taken = {w.slot for w in self.workers if not w.retiring and not w.broken}
        slot = next(i for i in range(len(taken) + 1) if i not in taken)
        return wid, slot

    def forget(self, worker: Worker) -> list[Task]:
        """Drop ``worker`` from the pool; returns its unanswered tasks."""
        self.workers.remove(worker)
        unanswered = list(worker.assigned)
        worker.assigned.clear()
        return unanswered

    def live(self) -> list[Worker]:
        """Workers that take new tasks (not parked, retiring or broken)."""
        return [w for w in self.workers if not w.retiring and not w.broken and w.parked_at is None]

    def parked(self) -> list[Worker]:
        """Parked workers, most recently parked first."""
        parked = [w for w in self.workers if w.parked_at is not None and not w.retiring]
        return sorted(parked, key=lambda w: w.parked_at or 0.0, reverse=True)

    def keep_size(self, target: int, seed: int) -> None:
        """Hold ``target`` live workers (within :meth:`capacity`): take parked ones back
        first, then start new ones; park the surplus, and retire those parked for longer than
        ``PARK_S`` with nothing left to make.

        The live workers' ``get_worker_info().id`` stay below ``target``, the ``num_workers``
        their tasks tell them, as DataLoader's ids stay below ``num_workers``: a grow takes
        back the lowest parked ids first and starts the lowest free ones (:meth:`next_ids`);
        a live worker whose id is past the size is parked, whether a shrink put it there or
        the worker below it died as the pool shrank (its replacement takes the dead one's id).
        A parked worker whose id is past the size stays parked (and retires)."""
        now = time.monotonic()
        for worker in self.live():
            if worker.slot >= target:
                worker.parked_at = now
        live = self.live()
        capacity = self.capacity()
        room = target if capacity is None else min(target, capacity)
        missing = room - len(live)
        back = sorted((w for w in self.parked() if w.slot < room), key=lambda w: w.slot)
        for worker in back[: max(0, missing)]:
            worker.parked_at = None
            missing -= 1
        for _ in range(missing):
            self.spawn(target, seed)
        for worker in self.parked():
            if now - (worker.parked_at or now) > PARK_S and not worker.assigned:
                self.retire(worker)


def dataloader_exit_words(pid: int | None, code: int | None) -> str:
    """DataLoader's words for a worker process that ended: killed by a signal, or exited."""
    if code is not None and code < 0:
        try:
            name = signal.strsignal(-code) or f"signal {-code}"
        except ValueError:
            name = f"signal {-code}"
        return f"DataLoader worker (pid {pid}) is killed by signal: {name}."
    return f"DataLoader worker (pid(s) {pid}) exited unexpectedly"


def describe_exit(code: int | None) -> str:
    """How a worker process ended, in words: its exit code, or the signal that killed it."""
    if code is None:
        return "did not exit"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"
