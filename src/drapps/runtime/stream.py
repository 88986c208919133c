"""Iterable datasets: each worker iterates its own copy of the dataset, as under DataLoader.

An ``IterableDataset``'s position lives inside the iterator of each worker, so a batch cannot be
handed to whichever worker is free, retried elsewhere, or made by a resized pool mid-epoch. The
stream pool therefore keeps its worker count fixed for an epoch (chosen when the epoch starts),
and the training loop takes batches round-robin over the workers that still have data, skipping
a worker once its stream ends: the order DataLoader delivers. Each worker reads its id and the
worker count from ``torch.utils.data.get_worker_info()`` to pick its shard, and its global RNGs
are seeded as DataLoader seeds them (``base_seed + worker id``), so the same base seed and worker
count give the same batches.

Batches cross processes in the same nameless shared-memory slabs as map-style batches.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Any

import torch

from drapps.runtime.errors import (
    SampleError,
    describe_failure,
    failure,
    sample_error,
    warn_once,
)
from drapps.runtime.inbox import PARENT_GONE, Parent, next_task
from drapps.runtime.messages import (
    StreamBatch,
    StreamEnded,
    StreamFailed,
    StreamNext,
    StreamReply,
    StreamStart,
    StreamStarted,
)
from drapps.runtime.process_pool import release_process, start_worker_process
from drapps.runtime.retries import HangLimit
from drapps.runtime.seeding import (
    mix_seed,
    rng_state,
    seed_worker,
    set_rng_state,
    set_worker_info,
    worker_info_read,
)
from drapps.runtime.stats import PipelineSnapshot
from drapps.runtime.transport import (
    RebuildError,
    discard,
    receive_message,
    send_message,
    unpack,
)
from drapps.runtime.worker import (
    BatchRecipe,
    collate,
    enter_worker_process,
    pack_batch,
    run_worker_init,
)

logger = logging.getLogger(__name__)


class Unsharded(Exception):
    """A worker past the first stops its stream: the dataset did not read
    ``get_worker_info()`` before its first item, so it does not shard, and each worker would
    yield all of it."""


PIPE_STREAM = 0x70697065  # "pipe"


def pipe_seed(seed: int, epoch: int) -> int:
    """The seed every copy of a datapipe draws its shuffles from in ``epoch`` (DataLoader's
    shared seed): the same in each worker, so that a shuffle before a ``sharding_filter``
    deals each item to one worker; another each epoch, and again the same when a checkpoint
    of that epoch is resumed."""
    return mix_seed(seed, epoch, PIPE_STREAM) & ((1 << 63) - 1)


def prepare_datapipe(dataset: Any, seed: int, num_workers: int, worker_id: int) -> bool:
    """Prepare an ``IterDataPipe`` as DataLoader does in each worker: its random ops seeded
    from ``seed`` (the same in every worker) and its ``sharding_filter`` given worker
    ``worker_id``'s share of ``num_workers``. Whether the pipe has a sharding filter (it then
    shards itself); False for any other dataset."""
    from torch.utils.data import IterDataPipe, graph_settings

    if not isinstance(dataset, IterDataPipe):
        return False
    graph_settings.apply_random_seed(dataset, torch.Generator().manual_seed(seed))
    graph_settings.apply_sharding(dataset, num_workers, worker_id)
    pipes = graph_settings.get_all_graph_pipes(graph_settings.traverse_dps(dataset))
    return any(graph_settings._is_sharding_datapipe(pipe) for pipe in pipes)


class StreamBatcher:
    """Turns one iterator over the dataset into batches (in a worker or the calling process).

    Args:
        recipe: the dataset, transform, collate_fn and on_error.
        batch_size: items per batch; None passes each item to ``collate_fn`` alone.
        drop_last: drop a last batch shorter than ``batch_size``.
    """

    def __init__(
        self,
        recipe: BatchRecipe,
        batch_size: int | None,
        drop_last: bool,
        *,
        unless_sharded: bool = False,
    ) -> None:
        self.recipe = recipe
        self.unless_sharded = unless_sharded
        """End the stream at its first item if the dataset has not read ``get_worker_info()``
        by then (:class:`Unsharded`): a worker past the first, under the default count."""
        self.batch_size, self.drop_last = batch_size, drop_last
        self.items: Iterator[Any] = iter(recipe.dataset)
        self.position = 0  # items taken from the stream so far
        self.skipped: list[tuple[int, str]] = []

    def _unsharded(self) -> bool:
        """Whether this worker ends its stream now: it is told to unless the dataset shards
        itself, and the dataset has not read ``get_worker_info()`` by its first item."""
        return self.unless_sharded and self.position == 0 and not worker_info_read()

    def next_batch(self) -> Any:
        """The next batch; raises StopIteration at the end of the stream."""
        r = self.recipe
        size = 1 if self.batch_size is None else self.batch_size
        samples: list[Any] = []
        while len(samples) < size:
            try:
                item = next(self.items)
            except StopIteration:
                break
            except Exception as exc:
                if self._unsharded():
                    raise Unsharded from exc  # the first worker streams it, and its error
                raise failure(
                    exc,
                    f"the dataset's stream failed after {self.position} items",
                    stage="__iter__",
                ) from exc
            if self._unsharded():
                raise Unsharded  # before the first item leaves: nothing is duplicated
            position, self.position = self.position, self.position + 1
            if r.transform is not None:
                try:
                    item = r.transform(item)
                except Exception as exc:
                    what = f"item {position} of the stream failed in transform"
                    if r.on_error == "skip":
                        self.skipped.append((position, describe_failure(what, exc)))
                        continue
                    raise failure(exc, what, index=position, stage="transform") from exc
            samples.append(item)
        if not samples or (self.drop_last and len(samples) < size):
            raise StopIteration
        try:
            return collate(r, samples)
        except Exception as exc:
            raise failure(
                exc,
                "collate_fn failed on a batch of the stream",
                stage="collate_fn",
            ) from exc


def run_stream_worker(
    recipe: BatchRecipe,
    batch_size: int | None,
    drop_last: bool,
    slot: int,
    tasks: Connection,
    results: Connection,
    parent_pid: int,
) -> None:
    """A stream worker: :class:`StreamStart` begins a new pass over the dataset. Its global
    RNGs are seeded at its first pass only, as DataLoader seeds a worker once: a persistent
    worker's later passes draw on, so each epoch streams another order (unless the start
    gives the states to start from: a resumed checkpoint's). Each :class:`StreamNext` is
    answered with :class:`StreamBatch`, :class:`StreamEnded` or :class:`StreamFailed`;
    ``None`` stops.
    """
    enter_worker_process()
    batcher: StreamBatcher | None = None
    generation = -1
    failed: SampleError | None = None
    initialised = seeded = False
    try:
        parent = Parent(parent_pid)
        while (task := next_task(tasks, parent)) is not PARENT_GONE:
            if task is None:
                return  # asked to stop
            if isinstance(task, StreamStart):
                generation = task.generation
                batcher, failed, sharded = None, None, False
                try:
                    sharded = prepare_datapipe(
                        recipe.dataset, task.pipe_seed, task.num_workers, slot
                    )
                except Exception as exc:  # two sharding filters in one branch, say
                    failed = failure(
                        exc, f"preparing the datapipe in worker {slot} failed", stage="__iter__"
                    )
                watch = task.solo_unless_sharded and slot > 0 and not sharded
                if not seeded:
                    seed_worker(task.seed, slot)
                    seeded = True
                set_worker_info(slot, task.num_workers, task.seed, recipe.dataset, watched=watch)
                if failed is None and not initialised:  # a failed one is tried next epoch
                    failed = run_worker_init(recipe, slot)
                    initialised = failed is None
                if task.rngs is not None:
                    set_rng_state(task.rngs)
                if task.report:
                    send_message(results, StreamStarted(generation, rng_state()))
                if failed is None:
                    try:
                        batcher = StreamBatcher(recipe, batch_size, drop_last, unless_sharded=watch)
                    except Exception as exc:
                        failed = failure(
                            exc,
                            f"starting the stream in worker {slot} failed",
                            stage="__iter__",
                        )
                continue
            if task.generation != generation:
                continue  # a request for a pass that has been replaced
            reply: StreamReply
            if failed is not None or batcher is None:
                reply = StreamFailed(generation, failed)
            else:
                try:
                    packed = pack_batch(batcher.next_batch())
                    reply = StreamBatch(generation, packed, batcher.skipped)
                    batcher.skipped = []
                except StopIteration:
                    reply = StreamEnded(generation)
                except Unsharded:
                    reply = StreamEnded(generation, unsharded=True)
                except SampleError as exc:  # the stream goes on from its next item
                    reply = StreamFailed(generation, exc, over=False)
                except Exception as exc:  # the batch cannot be pickled for the transport
                    reply = StreamFailed(
                        generation,
                        sample_error(
                            f"worker {slot} could not send its batch: {type(exc).__name__}: {exc}",
                            type(exc),
                            stage="transport",
                        ),
                        over=False,
                    )
            send_message(results, reply)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the training process closed our pipes


@dataclass(eq=False)
class _StreamWorker:
    slot: int
    process: BaseProcess
    tasks: Connection
    results: Connection
    requested: int = 0
    """Requests sent in the current pass and not yet answered."""
    active: bool = True
    """Its stream has not ended in the current pass."""


class StreamPool:
    """Worker processes for an iterable dataset; their count is fixed within an epoch."""

    def __init__(
        self,
        recipe: BatchRecipe,
        batch_size: int | None,
        drop_last: bool,
        *,
        context: BaseContext | None,
        prefetch_per_worker: int,
        timeout: float | None,
        finish: Callable[[Any], Any] | None = None,
    ) -> None:
        self.recipe = recipe
        self._batching = (batch_size, drop_last)
        self._context = context or multiprocessing.get_context()
        self._per_worker = prefetch_per_worker
        self._limit = HangLimit(timeout)
        self._finish = finish
        self.workers: list[_StreamWorker] = []
        self._generation = 0
        self._lock = threading.Lock()  # a pass begun or ended against one let go of
        self._owner = os.getpid()  # a forked child's copy never stops its parent's workers
        self._leaving: list[threading.Thread] = []  # each stops a let-go pass's workers
        self.rngs: list[dict[str, Any]] | None = None
        """Each worker's RNG states at the start of the pass (persistent workers only)."""
        self.wait_s = 0.0
        self.shared_bytes = 0

    def pids(self) -> tuple[int, ...]:
        return tuple(p for w in self.workers if (p := w.process.pid) is not None)

    def snapshot(
        self, *, samples: int, memory_budget: int, max_workers: int, target_workers: int
    ) -> PipelineSnapshot:
        """The stream's counters now (streams are not prefetched by depth or budget)."""
        return PipelineSnapshot(
            samples=samples,
            wait_s=self.wait_s,
            ready_batches=0,
            ready_bytes=0,
            memory_budget=memory_budget,
            workers=len(self.workers),
            max_workers=max_workers,
            prefetch_depth=0,
            worker_pids=self.pids(),
            target_workers=target_workers,
            shared_bytes=self.shared_bytes,
            executor="processes",  # a stream's workers always are
        )

    def start_epoch(
        self,
        workers: int,
        seed: int,
        *,
        fresh: bool,
        solo_unless_sharded: bool = False,
        rngs: list[dict[str, Any]] | None = None,
        keep_rngs: bool = False,
        shared_seed: int = 0,
    ) -> int:
        """Begin a pass over the dataset with ``workers`` processes; returns its generation.

        Args:
            shared_seed: what a datapipe's shuffles draw from in every worker (:func:`pipe_seed`).
            solo_unless_sharded: only the first worker streams a dataset that does not shard
                itself through ``get_worker_info()`` (the others end before their first
                item), so a default worker count never duplicates its items.
            rngs: each worker's RNG states to start from (a resumed persistent epoch's).
            keep_rngs: note each worker's RNG states at the start of the pass in
                :attr:`rngs` (persistent workers draw on from one epoch to the next, so a
                checkpoint of a later epoch needs them; fresh workers are seeded from
                ``seed``).
        """
        if rngs is not None and len(rngs) != workers:
            raise ValueError(f"rngs must hold {workers} workers' states, got {len(rngs)}")
        with self._lock:
            if fresh or len(self.workers) != workers:
                _stop(self.workers, grace_s=0.0)  # nothing of the old streams is worth waiting for
                self.workers = []
            self._leaving = [reaper for reaper in self._leaving if reaper.is_alive()]
            while len(self.workers) < workers:
                self._spawn(len(self.workers))
            self._generation += 1
            generation = self._generation
        for worker in self.workers:
            worker.requested, worker.active = 0, True
            state = rngs[worker.slot] if rngs is not None else None
            start = StreamStart(
                generation, seed, workers, solo_unless_sharded, state, keep_rngs, shared_seed
            )
            worker.tasks.send(start)
        self.rngs = None
        if keep_rngs:
            self.rngs = [self._started(worker, generation) for worker in self.workers]
        # Each worker is asked for its share of the prefetch now, as DataLoader asks at
        # iter(): a persistent worker makes what it was asked for before its next pass, so
        # one the loop never reached before leaving the pass has drawn as DataLoader's has.
        for worker in self.workers:
            self._top_up(worker, generation)
        return generation

    def batches(
        self, generation: int
    ) -> Iterator[tuple[Any, list[tuple[int, str]], SampleError | None]]:
        """The pass's batches, round-robin over the workers whose streams have not ended:
        each with the samples skipped, or with the error to raise in its place (a batch
        that failed; its worker's stream goes on, as under DataLoader).

        Raises:
            SampleError: a worker's stream failed to start.
            RuntimeError: a worker exited or gave no batch in ``timeout``.
        """
        for worker in itertools.cycle(self.workers):
            if generation != self._generation:
                raise RuntimeError("this epoch's iterator was superseded by a newer iter(loader)")
            if not any(w.active for w in self.workers):
                return
            if not worker.active:
                continue
            self._top_up(worker, generation)
            reply = self._receive(worker, generation)
            worker.requested -= 1
            if isinstance(reply, StreamEnded):
                worker.active = False
                if reply.unsharded:
                    name = type(self.recipe.dataset).__name__
                    warn_once(
                        f"unsharded:{name}",
                        f"drapps: {name} does not read torch.utils.data.get_worker_info() "
                        "before its first item, so one worker streams it (each of several "
                        "workers would yield all of it); shard it by get_worker_info() to use "
                        "more, or set num_workers to choose the count",
                    )
                continue
            if isinstance(reply, StreamFailed):
                assert reply.error is not None
                # Raised or yielded from a list, the reply let go: while the loop raises the
                # error, this generator's frame holds no reference to it (a cycle through its
                # traceback, which only the garbage collector frees, would keep the workers
                # after the loop let go).
                failed, over = [reply.error], reply.over
                del reply
                if over:
                    raise failed.pop()
                yield None, [], failed.pop()
                continue
            assert isinstance(reply, StreamBatch)
            self._top_up(worker, generation)
            try:
                batch = unpack(reply.packed)
            except RebuildError as exc:
                what = (
                    f"worker {worker.slot}'s batch was made but could not be rebuilt in the "
                    "training process"
                )
                rebuilt = failure(exc.error, what, stage="transport")
                rebuilt.__cause__ = exc.error
                failed = [rebuilt]
                del rebuilt
            else:
                failed = []
            if failed:  # yielded outside the handler and from a list: see above
                yield None, [], failed.pop()
                continue
            self.shared_bytes += reply.packed.nbytes
            if self._finish is not None:
                batch = self._finish(batch)
            yield batch, reply.skipped, None

    def _top_up(self, worker: _StreamWorker, generation: int) -> None:
        while worker.requested < self._per_worker:
            worker.tasks.send(StreamNext(generation))
            worker.requested += 1

    def _started(self, worker: _StreamWorker, generation: int) -> Any:
        """The RNG states ``worker``'s pass ``generation`` starts from (it was asked to say)."""
        reply = self._receive(worker, generation)
        assert isinstance(reply, StreamStarted), reply
        return reply.rngs

    def _receive(self, worker: _StreamWorker, generation: int) -> StreamReply:
        start = time.perf_counter()
        try:
            while True:
                timeout = self._limit.seconds()
                ready = wait([worker.results, worker.process.sentinel], timeout=timeout)
                if not ready:
                    raise RuntimeError(
                        f"drapps stream worker {worker.slot} (pid {worker.process.pid}) gave no "
                        f"batch in timeout={timeout:g}s"
                    )
                if worker.results in ready or worker.results.poll():
                    try:
                        reply: StreamReply | None = receive_message(worker.results)
                    except (EOFError, OSError):
                        reply = None  # its end of the pipe is gone: so is the worker
                    if reply is not None:
                        if reply.generation == generation:
                            self._limit.note(time.perf_counter() - start)
                            return reply
                        if isinstance(reply, StreamBatch):
                            discard(reply.packed)  # an earlier pass's batch
                        continue
                worker.process.join(timeout=1.0)
                raise RuntimeError(
                    f"drapps stream worker {worker.slot} (pid {worker.process.pid}) exited "
                    f"unexpectedly with exit code {worker.process.exitcode}; an iterable "
                    "dataset's stream cannot be resumed in another worker"
                )
        finally:
            self.wait_s += time.perf_counter() - start

    def _spawn(self, slot: int) -> None:
        process, task_send, result_recv = start_worker_process(
            self._context,
            run_stream_worker,
            (self.recipe, *self._batching, slot),
            {},
            name=f"drapps-stream-worker-{slot}",
        )
        self.workers.append(_StreamWorker(slot, process, task_send, result_recv))

    def let_go(self, generation: int) -> None:
        """The loop let go of pass ``generation`` before its end (from its iterator's
        ``__del__``, in whichever thread dropped it): its workers go, as DataLoader's do when
        its iterator is collected. They are asked to stop and our ends of their pipes
        closed, so each exits once it is done with the batch in hand; a thread of their own
        waits for them, and kills any still there after half a second. Never blocks, and
        does nothing once a newer pass has begun or while one begins (it stops them), and
        nothing in a forked child, whose copy of the iterator names its parent's workers."""
        if os.getpid() != self._owner or not self._lock.acquire(blocking=False):
            return  # held by this thread, or another beginning or ending a pass
        try:
            if generation != self._generation or not self.workers:
                return
            workers, self.workers = self.workers, []
            self._generation += 1  # the pass is over: its batches() would say superseded
            for worker in workers:
                _close(worker)
            reaper = threading.Thread(
                target=_stop, args=(workers, 0.5), name="drapps-stream-leaving", daemon=True
            )
            reaper.start()
            self._leaving.append(reaper)
        finally:
            self._lock.release()

    def shutdown(self, grace_s: float = 2.0) -> None:
        """Stop every worker (ask, wait up to ``grace_s``, kill), those of a pass let go of
        included; in the process that started them only."""
        if os.getpid() != self._owner:
            return
        with self._lock:
            _stop(self.workers, grace_s)
            self.workers = []
            for reaper in self._leaving:
                reaper.join()  # its own limits: half a second, then a kill
            self._leaving = []


def _close(worker: _StreamWorker) -> None:
    """Ask ``worker`` to stop, and close our ends of its pipes: once done with the batch in
    hand, it reads the request or finds its pipe closed, and exits."""
    with contextlib.suppress(OSError):
        worker.tasks.send(None)
    worker.tasks.close()
    worker.results.close()


def _stop(workers: list[_StreamWorker], grace_s: float) -> None:
    """Ask ``workers`` to stop, wait up to ``grace_s`` for them all, and kill any left."""
    for worker in workers:
        _close(worker)
    deadline = time.monotonic() + grace_s
    for worker in workers:
        worker.process.join(timeout=max(0.0, deadline - time.monotonic()))
        if worker.process.is_alive():
            worker.process.kill()
            worker.process.join(timeout=5.0)
        release_process(worker.process)
