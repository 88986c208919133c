"""Thread workers: a member of the pool protocol whose workers are threads of the training
process (``Loader(backend="thread")``).

A batch made by a thread crosses no process boundary: no slab, no pickle, one copy of the
dataset. A batch that may hold the dataset's own objects (``batch_size=None``, a
``collate_fn`` that keeps samples) is copied once, as the boundary would copy it
(:func:`~drapps.runtime.transport.owned`), so that a loop that writes into its batch changes
no sample. Work that releases the GIL (decoding, resizing, reading, waiting on storage) runs in
parallel; pure-Python work does not, and is the processes' case.

The guarantees are the process pool's. Each sample is made from its own seed: drapps'
:func:`~drapps.sample_rng` is per thread, and ``get_worker_info()`` answers per thread
(:func:`~drapps.runtime.seeding.answer_worker_info_per_thread`). What threads cannot give a
sample of its own is a *global* generator: Python's ``random``, NumPy's ``np.random`` and
torch's default generator are one per process, shared with every other thread and with the
training loop. :func:`thread_hazard` therefore makes up to three samples before the first
thread starts and watches those generators: a dataset that draws from them (torchvision's
transforms draw from torch's) keeps worker processes, and the loader says why. The sample
cache's handles are one per process too: threads run without it.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import logging
import os
import queue
import select
import threading
import time
import traceback
from typing import Any

from drapps.runtime.errors import SampleError
from drapps.runtime.handles import shared_handle
from drapps.runtime.messages import BatchTask, SlabsFreed, WorkerFatal
from drapps.runtime.pool import Polled, Reply, Task, Worker, WorkerPool
from drapps.runtime.seeding import (
    answer_worker_info_per_thread,
    global_states,
    moved_generators,
    preserved_global_rngs,
    seed_worker,
    set_thread_worker_info,
)
from drapps.runtime.transport import pack_local, pack_owned
from drapps.runtime.worker import BatchRecipe, answer, fresh_batches, make_batch

logger = logging.getLogger(__name__)

EXIT_WAIT_S = 60.0
"""How long the process, as it exits, waits for its drapps worker threads to finish the
samples they are making. Python ends a thread that is still in native code as it finalizes
from inside that call, which aborts the process from within a C++ library such as torch
("terminate called without an active exception", exit status 134). A sample that takes
longer than this (a read that hangs) is left to the exit."""

_exiting = False
_let_go: set[threading.Thread] = set()  # threads no pool waits for any more, maybe still busy
_let_go_lock = threading.Lock()


def _let_go_of(threads: list[threading.Thread]) -> None:
    """Keep ``threads`` (those still running) for the process's exit to wait for."""
    with _let_go_lock:
        _let_go.difference_update([t for t in _let_go if not t.is_alive()])
        _let_go.update(t for t in threads if t.is_alive())


def _join(threads: list[threading.Thread], limit_s: float) -> list[threading.Thread]:
    """Wait up to ``limit_s`` in all for ``threads`` to end; those still running."""
    deadline = time.monotonic() + limit_s
    for thread in threads:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    return [t for t in threads if t.is_alive()]


def _wait_as_the_process_exits(busy: list[threading.Thread]) -> list[threading.Thread]:
    """Wait up to :data:`EXIT_WAIT_S` for the ``busy`` threads, saying so; those still
    running."""
    if not busy:
        return busy
    logger.warning(
        "the process waits for %d drapps worker thread(s) to finish the sample each is "
        "making (up to %.0f s)", len(busy), EXIT_WAIT_S,
    )  # fmt: skip
    return _join(busy, EXIT_WAIT_S)


def _at_exit() -> None:
    """As the process exits (before ``atexit``'s callbacks, which close the loaders still
    open): from now on a pool that shuts down waits for its busy threads, and the threads
    pools let go of before are waited for here."""
    global _exiting
    _exiting = True
    with _let_go_lock:
        threads = list(_let_go)
    _wait_as_the_process_exits([t for t in threads if t.is_alive()])


# threading's own exit hook runs before atexit's (concurrent.futures waits for its threads so)
with contextlib.suppress(RuntimeError):  # imported as the interpreter shuts down: too late
    getattr(threading, "_register_atexit", atexit.register)(_at_exit)

PROBES = (0, 1, -1)
"""The samples :func:`thread_hazard` makes (the first two and the last: a dataset whose odd
samples differ is seen) to see whether the dataset draws from the global generators. A
dataset that draws from one only for samples it did not make is not seen."""


def thread_hazard(recipe: BatchRecipe, keys: list[Any] | None = None) -> str | None:
    """Why ``recipe``'s batches cannot be made by threads of this process, in words; None
    when they can.

    A ``worker_init_fn`` is written for a worker process (it seeds the process's generators,
    sets its thread count, opens its own handles): it keeps processes. Otherwise up to
    three samples are made here (:data:`PROBES`, or ``keys``: the sampler's own, where it
    holds them, so the dataset is asked only for keys it gives), with the global generators
    set to known states: one that moved (even in a sample that then failed) means the
    dataset draws from a generator every thread shares, and its samples would depend on
    which thread drew first.
    The caller's generator states are back afterwards, and a sample that fails here is left
    to fail, named, where the loader makes it. A dataset that then holds an open handle
    (opened in ``__init__`` or by a sample) keeps processes too: threads would share its
    position (:mod:`drapps.runtime.handles`).
    """
    if recipe.worker_init_fn is not None:
        return "a worker_init_fn is set (it prepares a worker process)"
    try:
        size = len(recipe.dataset)
    except TypeError:
        return None
    probe = dataclasses.replace(recipe, reseed=False, cache=None, on_error="raise")
    if keys is None:  # a sampler of range(len(dataset))
        keys = sorted({p % size for p in PROBES} if size else set())
    for index in keys:
        with preserved_global_rngs():
            seed_worker(0, 0, devices=False)
            before = global_states()
            with contextlib.suppress(SampleError):  # it fails where the loader makes it
                make_batch(probe, 0, 0, [index], collate=False)
            moved = moved_generators(before, global_states())
        if moved:
            return (
                f"the dataset draws from {' and '.join(moved)} (sample {index} did), a "
                "generator every thread of a process shares; draw from drapps.sample_rng() "
                "to run on threads"
            )
    if (handle := shared_handle(recipe.dataset)) is not None:
        return f"the dataset holds {handle}, which threads would share"
    return None


@dataclasses.dataclass(eq=False)
class _Thread:
    thread: threading.Thread
    inbox: queue.SimpleQueue[BatchTask | None]


class ThreadPool(WorkerPool):
    """Workers as threads of the training process.

    Each thread takes task messages from its own inbox and puts replies on one shared queue,
    writing a byte to a pipe so that :meth:`poll` wakes. A thread cannot be killed: one that
    is stopped (a timeout, a resize) is forgotten at once, finishes what it is making, and its
    late replies are dropped; the dispatcher has already given its tasks to others.
    """

    executor = "threads"
    why = "asked for (backend='thread')"

    def __init__(self, recipe: BatchRecipe) -> None:
        super().__init__()
        # Threads share the global generators: a sample's draws come from sample_rng(),
        # which is per thread (thread_hazard keeps datasets that draw globally off threads).
        self._recipe = dataclasses.replace(recipe, reseed=False, watch_draws=False)
        self._threads: dict[int, _Thread] = {}
        self._replies: queue.SimpleQueue[Reply] = queue.SimpleQueue()
        self._pending: list[Reply] = []
        self._notify_r, self._notify_w = os.pipe()
        os.set_blocking(self._notify_r, False)
        os.set_blocking(self._notify_w, False)
        self._closed = False
        answer_worker_info_per_thread()

    # ------------------------------------------------------------------------ the threads

    def _run(self, worker: Worker, inbox: queue.SimpleQueue[BatchTask | None]) -> None:
        worker.start_s = time.monotonic() - worker.asked_at
        self.starts.append(worker.start_s)
        shape: tuple[int, int] | None = None
        try:
            while (task := inbox.get()) is not None:
                if (task.num_workers, task.seed) != shape:
                    shape = task.num_workers, task.seed
                    set_thread_worker_info(worker.slot, *shape, self._recipe.dataset)
                # A batch that may hold the dataset's own objects is copied, as crossing
                # from a worker process copies it: the loop may write into its batch.
                pack = pack_local if fresh_batches(self._recipe, task.split) else pack_owned
                self._reply(worker, answer(self._recipe, task, pack))
        except BaseException:  # said to the dispatcher, which names it in its error
            self._reply(worker, WorkerFatal(traceback.format_exc()))

    def _reply(self, worker: Worker, reply: Any) -> None:
        self._replies.put((worker, reply))
        with contextlib.suppress(BlockingIOError, OSError):  # full: poll wakes anyway
            os.write(self._notify_w, b"x")

    # ------------------------------------------------------------------ the pool protocol

    def spawn(self, num_workers: int = 1, seed: int = 0) -> Worker:
        wid, slot = self.next_ids()
        worker = Worker(wid, slot=slot)
        inbox: queue.SimpleQueue[BatchTask | None] = queue.SimpleQueue()
        thread = threading.Thread(
            target=self._run, args=(worker, inbox), name=f"drapps-worker-{wid}", daemon=True
        )
        self._threads[wid] = _Thread(thread, inbox)
        self.workers.append(worker)
        thread.start()
        return worker

    def send(self, worker: Worker, message: BatchTask | SlabsFreed | None) -> None:
        if isinstance(message, SlabsFreed):
            return  # a thread's batches hold no slab
        own = self._threads.get(worker.wid)
        if own is None or not own.thread.is_alive():
            worker.retiring = True  # it ended: its exit shows in the next poll
            return
        if message is not None and message.sample_threads > 1:
            # A thread is one of the training process's: it makes its samples one at a time
            # (threads of a worker process are that process's own).
            message = message._replace(sample_threads=1)
        own.inbox.put(message)

    def poll(self, timeout: float, wake: int) -> Polled:
        ready: list[int] = []
        if self._replies.empty():
            with contextlib.suppress(InterruptedError):
                ready, _, _ = select.select([self._notify_r, wake], [], [], max(0.0, timeout))
        polled = Polled(woke=wake in ready)
        with contextlib.suppress(BlockingIOError):
            os.read(self._notify_r, 65536)
        self._take_replies()
        polled.replies, self._pending = self._pending, []
        polled.exited = [w for w in self.workers if not self._threads[w.wid].thread.is_alive()]
        return polled

    def _take_replies(self) -> None:
        """Move replies from the shared queue to :attr:`_pending`, dropping those of threads
        already forgotten."""
        while True:
            try:
                worker, reply = self._replies.get_nowait()
            except queue.Empty:
                return
            if worker.wid in self._threads:
                self._pending.append((worker, reply))

    def drain(self, worker: Worker) -> list[Reply]:
        self._take_replies()
        mine = [r for r in self._pending if r[0] is worker]
        self._pending = [r for r in self._pending if r[0] is not worker]
        return mine

    def retire(self, worker: Worker) -> None:
        worker.retiring = True
        own = self._threads.get(worker.wid)
        if own is not None:
            own.inbox.put(None)

    def kill(self, worker: Worker, *, wait_s: float = 5.0) -> None:
        # A thread cannot be stopped from outside: asked to stop, it is forgotten by reap and
        # ends when what it is making ends.
        self.retire(worker)

    def reap(self, worker: Worker) -> list[Task]:
        own = self._threads.pop(worker.wid, None)
        if own is not None:  # it ends with what it is making, which the exit waits for
            _let_go_of([own.thread])
        return self.forget(worker)

    def exit_reason(self, worker: Worker) -> str:
        return f"thread {worker.slot} stopped"

    def exit_wait_s(self) -> float:
        return EXIT_WAIT_S if _exiting else 0.0

    def shutdown(self, grace_s: float = 2.0) -> None:
        if self._closed:
            return
        self._closed = True
        threads = list(self._threads.values())
        for own in threads:  # each ends after the task it is making, not those queued behind
            with contextlib.suppress(queue.Empty):
                while True:
                    own.inbox.get_nowait()
            own.inbox.put(None)
        busy = _join([own.thread for own in threads], grace_s)
        if _exiting:  # a thread left in a native call would abort the exit
            busy = _wait_as_the_process_exits(busy)
        if busy:  # daemon threads: they end with what they make, or with the process
            logger.warning("%d drapps worker thread(s) still making a sample at close", len(busy))
            _let_go_of(busy)
        self._threads.clear()
        self.workers.clear()
        os.close(self._notify_r)
        os.close(self._notify_w)
