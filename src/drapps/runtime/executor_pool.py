"""Processes or threads, chosen live: the pool ``workers="auto"`` runs a map-style dataset on.

Two members of the pool protocol side by side: worker processes (the start) and threads of the
training process. :meth:`ExecutorPool.use` moves new workers to the other kind; the workers of
the kind left behind retire after the tasks they hold, so no batch is lost or made twice
while the pool changes (the dispatcher answers for every task, as on a resize). The controller
decides (:class:`drapps.control.knobs.ExecutorKnob`): it tries threads where the loop starves,
and keeps them only if they make more.

Threads share the process's global generators, so they are allowed only once the process
workers have shown that the dataset does not draw from them: each worker watches the first
samples it makes (:data:`drapps.runtime.worker.WATCHED_SAMPLES`) and says whether one moved a
generator; the pool needs :data:`EVIDENCE` such samples and none that drew. The same watch
measures how much of a sample's time runs Python bytecode, which holds the GIL
(:mod:`drapps.runtime.gil`): ``n`` threads share that part, so threads are refused where it is
``1 / n`` of a sample's time or more, and the try they would cost is saved.

Worker processes may run threads too. Where the samples wait (on reads, on storage) rather
than compute, each worker makes several of a batch's samples at once, each in a thread of its
own (:class:`drapps.runtime.worker.SampleThreads`): as many as keep one core busy, from the
CPU time of the samples against their cost (:meth:`ExecutorPool.sample_threads`). Many reads
are then in flight with a few processes, where DataLoader needs a process per read.
"""

from __future__ import annotations

from typing import Any

from drapps.runtime.messages import BatchTask, SlabsFreed
from drapps.runtime.pool import Polled, Task, Worker, WorkerPool
from drapps.runtime.process_pool import ProcessPool
from drapps.runtime.thread_pool import ThreadPool

EVIDENCE = 16
"""Samples the process workers must have watched, none drawing from a global generator,
before threads may make this dataset's batches."""

TRANSITION_POLL_S = 0.005
"""While workers of both kinds run, each wait on one kind is this short."""

SAMPLE_THREADS = 32
"""The most samples one worker process makes at once (:meth:`ExecutorPool.sample_threads`)."""

WORK_DECAY = 0.9
"""Weight of what was measured before, each time a batch's samples are counted: the share of
their time on the CPU follows the last tens of batches."""

KINDS = ("processes", "threads")
"""The executor knob's values, in order (0: processes, 1: threads)."""


class ExecutorPool(WorkerPool):
    """Worker processes and thread workers behind one pool; new workers are of the kind in
    use (:attr:`executor`)."""

    choosable = True

    def __init__(self, processes: ProcessPool, threads: ThreadPool) -> None:
        super().__init__()
        self._members: dict[str, WorkerPool] = {"processes": processes, "threads": threads}
        for member in self._members.values():
            # One id space: the dispatcher keys slabs and mappings by wid, and slots must
            # not repeat across the two kinds.
            member.next_ids = self.next_ids  # type: ignore[method-assign]
        self._kind: dict[int, str] = {}
        self._cached = processes.caches
        self.executor = "processes"
        self.watched = 0
        """Samples the process workers watched for draws from a global generator."""
        self.drew: str | None = None
        """The first such draw seen, in words (then threads are never used)."""
        self.python_s = 0.0
        """Of the watched samples' time, the seconds in Python bytecode (holding the GIL)."""
        self.measured_s = 0.0
        """The watched samples' time measured for it."""
        self.timed = 0
        """Samples whose cost and CPU time the process workers reported."""
        self._cost_s = 0.0
        self._cpu_s = 0.0
        self._threads_said = 1
        self.alone: str | None = None
        """Why a worker process refused to make samples in threads (then none is asked to)."""

    # ------------------------------------------------------------------------- the choice

    def note_draws(
        self, watched: int, drew: str | None, python_s: float = 0.0, measured_s: float = 0.0
    ) -> None:
        """Count samples a process worker watched, a draw it saw, and how much of their
        time ran Python bytecode."""
        self.watched += watched
        if drew is not None and self.drew is None:
            self.drew = drew
        self.python_s += python_s
        self.measured_s += measured_s

    def gil_share(self) -> float | None:
        """The share of the watched samples' time in Python bytecode (None: none measured)."""
        return self.python_s / self.measured_s if self.measured_s > 0 else None

    def note_work(
        self, worker: Worker, costs: list[float], cpu_s: float, alone: str | None = None
    ) -> None:
        if alone is not None and self.alone is None:
            self.alone = alone
            if self._threads_said > 1:  # it had said the samples ran in threads
                self.why = f"each making a batch's samples one at a time: {alone}"
        if self._kind.get(worker.wid) != "processes" or not costs:
            return
        self.timed += len(costs)
        self._cost_s = WORK_DECAY * self._cost_s + sum(costs)
        self._cpu_s = WORK_DECAY * self._cpu_s + cpu_s

    def cpu_share(self) -> float | None:
        """The share of the process workers' recent samples' time spent on the CPU (the rest
        they waited: on reads, storage, a lock); None before :data:`EVIDENCE` samples."""
        if self.timed < EVIDENCE or self._cost_s <= 0:
            return None
        return min(1.0, self._cpu_s / self._cost_s)

    def sample_threads(self) -> int:
        """How many of a batch's samples each worker process makes at once: as many as keep
        one core busy (1 / the samples' CPU share), at most :data:`SAMPLE_THREADS` and no
        more than the GIL's share lets run (1 / it); 1 where threads could make this dataset's
        samples wrongly (:meth:`threads_allowed`'s evidence) or the pool runs on threads."""
        threads, cpu = 1, self.cpu_share()
        if self.executor == "processes" and cpu is not None and self._threads_safe() is None:
            threads = int(1.0 / max(cpu, 1.0 / SAMPLE_THREADS))
            gil = self.gil_share()
            if gil is not None and gil > 0:
                threads = min(threads, max(1, int(1.0 / gil)))
        if threads > self._threads_said:
            self._threads_said = threads
            self.why = (
                f"each making up to {threads} of a batch's samples at once, in threads of "
                f"its own: the samples spent {1 - (cpu or 0.0):.0%} of their time waiting "
                "(on reads or storage), not on the CPU"
            )
        return threads

    def threads_allowed(self) -> str | None:
        """Why threads may not run this dataset now, in words; None when they may."""
        if (why := self._threads_safe()) is not None:
            return why
        share, threads = self.gil_share(), max(2, len(self.live()))
        if share is not None and share * threads >= 1:
            return (
                f"{share:.0%} of a sample's time runs Python, which holds the GIL: "
                f"{threads} threads would take turns at it (measured in the worker processes)"
            )
        return None

    def _threads_safe(self) -> str | None:
        """Why threads of one process could make this dataset's samples wrongly (not only
        slowly), in words; None once the evidence says they may."""
        if self._cached:
            return "the sample cache is on, and its handles are one per worker process"
        if self.drew is not None:
            return f"the dataset draws from {self.drew}, which threads share"
        if self.alone is not None:
            return f"{self.alone}, which threads would share"
        if self.watched < EVIDENCE:
            return f"{self.watched} of {EVIDENCE} samples watched for global draws so far"
        return None

    def use(self, executor: str) -> bool:
        """Start new workers as ``executor`` ("processes" or "threads") from now on and retire
        the others after what they hold; False (and no change) where threads are not
        allowed yet (:meth:`threads_allowed`).

        Raises:
            ValueError: not one of :data:`KINDS`.
        """
        if executor not in KINDS:
            raise ValueError(f"executor must be one of {KINDS}, got {executor!r}")
        if executor == self.executor:
            return True
        if executor == "threads" and (why := self.threads_allowed()) is not None:
            self.why = f"threads not tried: {why}"
            return False
        self.executor = executor
        self._threads_said = 1  # back on processes, a count of sample threads is said anew
        self.why = (
            "chosen by the controller (workers='auto'), which measured them ahead"
            if executor == "threads"
            else None
        )
        for worker in list(self.workers):
            if self._kind[worker.wid] != executor and not worker.retiring:
                self.retire(worker)
        return True

    # ------------------------------------------------------------------ the pool protocol

    def _of(self, worker: Worker) -> WorkerPool:
        return self._members[self._kind[worker.wid]]

    def spawn(self, num_workers: int = 1, seed: int = 0) -> Worker:
        worker = self._members[self.executor].spawn(num_workers, seed)
        self._kind[worker.wid] = self.executor
        self.workers.append(worker)
        return worker

    def send(self, worker: Worker, message: BatchTask | SlabsFreed | None) -> None:
        self._of(worker).send(worker, message)

    def poll(self, timeout: float, wake: int) -> Polled:
        busy = [m for m in self._members.values() if m.workers]
        if len(busy) <= 1:
            member = busy[0] if busy else self._members[self.executor]
            polled = member.poll(timeout, wake)
        else:  # a change under way: both kinds, each waited on briefly
            polled = Polled()
            for member in busy:
                more = member.poll(min(timeout, TRANSITION_POLL_S), wake)
                polled.replies += more.replies
                polled.exited += more.exited
                polled.woke = polled.woke or more.woke
                if more.replies or more.woke:
                    timeout = 0.0
        self.starts.extend(s for m in self._members.values() for s in _new_starts(m))
        return polled

    def drain(self, worker: Worker) -> list[Any]:
        return self._of(worker).drain(worker)

    def retire(self, worker: Worker) -> None:
        self._of(worker).retire(worker)

    def kill(self, worker: Worker, *, wait_s: float = 5.0) -> None:
        self._of(worker).kill(worker, wait_s=wait_s)

    def reap(self, worker: Worker) -> list[Task]:
        unanswered = self._of(worker).reap(worker)
        del self._kind[worker.wid]
        self.workers.remove(worker)
        return unanswered

    def exit_reason(self, worker: Worker) -> str:
        return self._of(worker).exit_reason(worker)

    def exit_words(self, worker: Worker) -> str | None:
        return self._of(worker).exit_words(worker)

    def shutdown(self, grace_s: float = 2.0) -> None:
        for member in self._members.values():
            member.shutdown(grace_s)
        self.workers.clear()
        self._kind.clear()

    def exit_wait_s(self) -> float:
        return max(member.exit_wait_s() for member in self._members.values())

    def prepare(self, fresh: bool) -> None:
        if self.executor == "processes":
            self._members["processes"].prepare(fresh)

    def idle(self) -> None:
        self._members["processes"].idle()

    def pids(self) -> tuple[int, ...]:
        return self._members["processes"].pids()

    def helper_pids(self) -> tuple[int, ...]:
        return self._members["processes"].helper_pids()

    def set_priority(self, niceness: int) -> bool:
        return self._members["processes"].set_priority(niceness)


def _new_starts(member: WorkerPool) -> list[float]:
    """Starts a member counted since the last call (moved out of it)."""
    starts = list(member.starts)
    member.starts.clear()
    return starts
