"""The process pool: worker processes that make batches, each with its own pair of pipes.

Each worker has a private task pipe and result pipe rather than sharing one queue: a worker killed
mid-write can only corrupt its own pipe (a shared ``multiprocessing.Queue`` would leave its lock
held and stall every other worker), and the pool always knows which tasks a dead worker took.
Workers are forked by the pool's :class:`~drapps.runtime.zygote.Zygote`, made when an epoch
begins: never from the training process's threads, and the dataset crosses to it once.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import multiprocessing
import os
import pickle
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Any

from drapps.runtime.errors import fd_limit_error
from drapps.runtime.messages import BatchTask, SlabsFreed
from drapps.runtime.pool import (
    Polled,
    Reply,
    Task,
    Worker,
    WorkerPool,
    dataloader_exit_words,
    describe_exit,
)
from drapps.runtime.progress import SampleClock
from drapps.runtime.ready import readable
from drapps.runtime.ready import ready as ready_to_read
from drapps.runtime.recycling import starting_worker
from drapps.runtime.transport import receive_message
from drapps.runtime.worker import BatchRecipe, run_worker
from drapps.runtime.zygote import (
    ForkedProcess,
    ImportUnderWay,
    ImportWait,
    Zygote,
    imports_under_way,
)

logger = logging.getLogger(__name__)

_EXITING_S = 0.5
"""How long a worker whose result pipe closed is given to finish exiting before it is killed."""

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


def worker_pipes(context: BaseContext) -> tuple[Connection, Connection, Connection, Connection]:
    """A worker's task pipe and result socket pair (slab descriptors cross it, see
    :func:`~drapps.runtime.transport.send_message`): ``(task_recv, task_send, result_recv,
    result_send)``. If the socket pair cannot be made, the pipe is closed again."""
    task_recv, task_send = context.Pipe(duplex=False)
    try:
        result_recv, result_send = context.Pipe(duplex=True)  # a Unix socket pair
    except BaseException:
        task_recv.close()
        task_send.close()
        raise
    return task_recv, task_send, result_recv, result_send


def start_worker_process(
    context: BaseContext,
    target: Callable[..., None],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    name: str,
) -> tuple[BaseProcess, Connection, Connection]:
    """Start ``target(*args, tasks, results, parent_pid, **kwargs)`` as a daemon worker with
    pipes of its own (:func:`worker_pipes`); returns the process and our ends of both.

    The process is also counted among the workers a forked child must not terminate.
    """
    if context.get_start_method() == "fork":
        # A fork copies another thread's import under way, its lock held: a worker that
        # imported that module would wait forever. Forked once they are done (an import begun
        # between this look and the fork is not seen).
        mine = imports_under_way(threading.get_ident())
        others = [name for name in imports_under_way() if name not in mine]
        if others:
            ImportWait().wait(others)
    pipes: tuple[Connection, ...] = ()  # closed again if the worker does not start
    try:
        pipes = task_recv, task_send, result_recv, result_send = worker_pipes(context)
        process = context.Process(  # type: ignore[attr-defined]
            target=target,
            args=(*args, task_recv, result_send, os.getpid()),
            kwargs=kwargs,
            name=name,
            daemon=True,
        )
        with starting_worker():
            process.start()
    except BaseException as exc:
        for connection in pipes:
            connection.close()
        if isinstance(exc, OSError) and exc.errno == errno.EMFILE:
            raise fd_limit_error() from exc
        raise
    _started.add(process)
    task_recv.close()
    result_send.close()
    return process, task_send, result_recv


def release_process(process: BaseProcess | ForkedProcess) -> None:
    """Close an exited worker's sentinel now: a traceback that holds the process object (an
    error the training loop keeps) would otherwise hold its descriptor too."""
    if process.exitcode is not None:
        with contextlib.suppress(ValueError):
            process.close()


@dataclass(eq=False, kw_only=True)
class ProcessWorker(Worker):
    """A worker process and our ends of its pipes."""

    process: ForkedProcess
    tasks: Connection
    results: Connection


class ProcessPool(WorkerPool):
    """Worker processes, started by ``multiprocessing`` (fork, spawn or forkserver).

    Each worker has a private task pipe and result socket; batches come back in nameless
    shared-memory slabs whose descriptors follow their replies on that socket.
    """

    def __init__(self, recipe: BatchRecipe, context: BaseContext | None) -> None:
        super().__init__()
        self._recipe = recipe
        self.caches = recipe.cache is not None
        """Its workers read and write a sample cache."""
        self._context = context or multiprocessing.get_context()
        self._niceness: int | None = None  # None: as inherited
        self._zygote: Zygote | None = None
        self._retired: list[Zygote] = []  # replaced, until their last workers are reaped
        self._zygote_lock = threading.Lock()
        # The imports the thread that begins the epoch has under way: its loop runs inside.
        self._whole: frozenset[str] = frozenset()

    def prepare(self, fresh: bool) -> None:
        """Make the zygote now, in the thread that starts the epoch (DataLoader starts its
        workers there): a new one for ``fresh`` workers, which see the dataset as it is."""
        with self._zygote_lock:
            self._whole = frozenset(imports_under_way(threading.get_ident()))
            if fresh and self._zygote is not None:
                self._retire_zygote()
            self._current_zygote()

    def idle(self) -> None:
        """The zygote goes too, once the last worker it forked is reaped."""
        with self._zygote_lock:
            self._retire_zygote()

    def _current_zygote(self) -> Zygote:
        zygote = self._zygote
        if zygote is not None and not zygote.alive():
            self._retire_zygote()
            zygote = None
        if zygote is None:
            try:
                with starting_worker():
                    zygote = Zygote(
                        self._context,
                        functools.partial(run_forked_worker, self._recipe),
                        name="drapps-zygote",
                        whole=self._whole,
                    )
            except OSError as exc:
                if exc.errno == errno.EMFILE:
                    raise fd_limit_error() from exc
                raise
            _started.add(zygote.process)
            self._zygote = zygote
            if self._niceness is not None and zygote.pid is not None:
                _renice(zygote.pid, self._niceness)
        return zygote

    def _retire_zygote(self) -> None:
        zygote, self._zygote = self._zygote, None
        if zygote is not None:
            self._retired.append(zygote)
            zygote.retire()
        self._retired = [z for z in self._retired if not z.closed]

    def set_priority(self, niceness: int) -> bool:
        self._niceness = niceness
        for pid in self.pids():
            _renice(pid, niceness)
        return True

    def pids(self) -> tuple[int, ...]:
        return tuple(p for w in list(self.workers) if (p := _own(w).process.pid) is not None)

    def helper_pids(self) -> tuple[int, ...]:
        zygotes = [self._zygote, *self._retired]
        return tuple(z.pid for z in zygotes if z is not None and not z.closed and z.pid is not None)

    def spawn(self, num_workers: int = 1, seed: int = 0) -> Worker:
        asked_at = time.monotonic()
        wid, slot = self.next_ids()
        options = {"wid": wid, "slot": slot, "num_workers": num_workers, "base_seed": seed}
        options["parent_pid"] = os.getpid()
        with self._zygote_lock:
            attempt, imports = 0, ImportWait()
            while True:
                # The zygote first, then the worker's pipes: a zygote forked now (under
                # ``fork``) inherits every descriptor this process holds, and one holding the
                # worker's end of its result socket would keep the socket open after the
                # worker dies, so a reply cut short by its death would be waited for forever.
                zygote = self._current_zygote()
                clock = SampleClock()
                try:
                    task_recv, task_send, result_recv, result_send = worker_pipes(self._context)
                except OSError as exc:
                    clock.close()
                    if exc.errno == errno.EMFILE:
                        raise fd_limit_error() from exc
                    raise
                assert clock.fd is not None
                fds = [task_recv.fileno(), result_send.fileno(), clock.fd]
                try:
                    process = zygote.fork(fds, f"drapps-worker-{slot}", **options)
                    break
                except (ImportUnderWay, EOFError, OSError) as exc:
                    task_send.close()
                    result_recv.close()
                    clock.close()
                    if isinstance(exc, ImportUnderWay):
                        # Forked in the middle of another thread's imports: a new zygote,
                        # once they are done here.
                        self._retire_zygote()
                        imports.wait(exc.modules)
                        continue
                    if attempt:
                        raise
                    attempt += 1
                    # The zygote died as it was asked: a new one forks the worker, from
                    # pipes made after it.
                    self._retire_zygote()
                finally:
                    task_recv.close()
                    result_send.close()
                    clock.close_fd()
        worker = ProcessWorker(
            wid, slot=slot, process=process, tasks=task_send, results=result_recv, clock=clock,
            asked_at=asked_at,
        )  # fmt: skip
        self.workers.append(worker)
        if self._niceness is not None and process.pid is not None:
            _renice(process.pid, self._niceness)
        logger.debug("started worker %d (pid %s)", wid, process.pid)
        return worker

    def send(self, worker: Worker, message: BatchTask | SlabsFreed | None) -> None:
        try:
            _own(worker).tasks.send(message)
        except OSError:
            # Its task pipe is closed: it exited (a retired worker sent a slab's release
            # after its last reply) or is dying. It takes nothing new, and the replies it sent
            # before are still read: only a failed result pipe makes a worker broken.
            worker.retiring = True
            _own(worker).process.kill()

    def poll(self, timeout: float, wake: int) -> Polled:
        waitables: dict[Any, Worker | None] = {wake: None}
        sentinels = {}
        for worker in self.workers:
            sentinels[_own(worker).process.sentinel] = worker  # ready once it has exited
            if not worker.broken:
                waitables[_own(worker).results] = worker
        ready = ready_to_read([*waitables, *sentinels], timeout)
        polled = Polled(woke=wake in ready)
        self.note_starts()
        for item in ready:
            sender = waitables.get(item)
            if sender is not None:
                polled.replies += self.drain(sender)
        # A sentinel stays ready once its process is gone, so an exit is never missed; only
        # those are asked (is_alive reaps the child), not every worker on every poll.
        polled.exited = [
            w for s, w in sentinels.items() if s in ready and not _own(w).process.is_alive()
        ]
        return polled

    def drain(self, worker: Worker) -> list[Reply]:
        replies: list[Reply] = []
        if worker.broken or worker not in self.workers:
            return replies
        results = _own(worker).results
        try:
            while readable(results):
                replies.append((worker, receive_message(results)))
        except (EOFError, OSError, ValueError, pickle.UnpicklingError) as exc:
            # EOF or a truncated message: the pipe is unusable. Make sure the process is gone
            # too; it then shows as exited and its tasks are re-queued. One that is exiting
            # is let finish first, so that its own exit code is the one reported.
            logger.debug("worker %d result pipe broke: %s", worker.wid, repr(exc))
            worker.broken = True
            process = _own(worker).process
            process.join(timeout=_EXITING_S)
            if process.is_alive():
                process.kill()
        return replies

    def retire(self, worker: Worker) -> None:
        worker.retiring = True
        # After its assigned tasks: pipes keep order. A closed pipe: it is gone already.
        with contextlib.suppress(OSError):
            _own(worker).tasks.send(None)

    def kill(self, worker: Worker, *, wait_s: float = 5.0) -> None:
        process = _own(worker).process
        if process.is_alive():
            process.kill()
        process.join(timeout=wait_s)

    def exit_reason(self, worker: Worker) -> str:
        return describe_exit(_own(worker).process.exitcode)

    def exit_words(self, worker: Worker) -> str | None:
        process = _own(worker).process
        return dataloader_exit_words(process.pid, process.exitcode)

    def reap(self, worker: Worker) -> list[Task]:
        own = _own(worker)
        own.process.join(timeout=5.0)
        own.tasks.close()
        own.results.close()  # with any slab descriptors still in it
        if own.clock is not None:
            own.clock.close()
        release_process(own.process)
        return self.forget(worker)

    def shutdown(self, grace_s: float = 2.0) -> None:
        """Stop every worker: ask, wait up to ``grace_s``, then kill; then the zygotes."""
        for worker in self.workers:
            if not worker.retiring:
                self.retire(worker)
        deadline = time.monotonic() + grace_s
        for worker in self.workers:
            _own(worker).process.join(timeout=max(0.0, deadline - time.monotonic()))
        for worker in list(self.workers):
            self.kill(worker)
            self.reap(worker)
        with self._zygote_lock:
            zygotes, self._zygote, self._retired = [self._zygote, *self._retired], None, []
        for zygote in zygotes:
            if zygote is not None:
                zygote.close()


def run_forked_worker(
    recipe: BatchRecipe,
    fds: list[int],
    *,
    wid: int,
    slot: int,
    num_workers: int,
    base_seed: int,
    parent_pid: int,
) -> None:
    """A worker the zygote forked: its task pipe, result socket and clock arrive as ``fds``."""
    clock = SampleClock(fds[2])
    clock.close_fd()
    tasks, results = Connection(fds[0], writable=False), Connection(fds[1])
    run_worker(
        recipe, wid, tasks, results, parent_pid, slot=slot, num_workers=num_workers,
        base_seed=base_seed, clock=clock,
    )  # fmt: skip


def _own(worker: Worker) -> ProcessWorker:
    """``worker`` as one of this pool's (the dispatcher only hands back what we spawned)."""
    if not isinstance(worker, ProcessWorker):
        raise TypeError(f"worker {worker.wid} is not a ProcessPool worker")
    return worker


def _renice(pid: int, niceness: int) -> None:
    """Set a worker's niceness; a worker that just exited, or a niceness below the current
    one without the privilege to lower it, is left as it is."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.setpriority(os.PRIO_PROCESS, pid, niceness)
