"""Collecting what the workers make: whole batches, batches cut into parts among workers,
and batches filled from made samples.

A whole batch is read back from its worker's slab and delivered (unless it is a late copy).
A batch cut into parts comes back from several workers uncollated; :class:`Collector`
keeps each open batch's parts (:class:`~drapps.runtime.parts.PartialBatch`) until the last
is in, then collates them in plan order and delivers the batch. With ``defer_after`` the
parts' samples instead join the pool batches are filled from
(:class:`~drapps.runtime.fill.ReadyFill`). It owns the open batches' parts, the fill and the
count of batches that held a slow sample; the dispatcher hands it every batch and part that
arrives and every part it gives up.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

from drapps.runtime.admission import Admission
from drapps.runtime.errors import SampleError, WorkerTimeoutError
from drapps.runtime.fill import Filled, ReadyFill
from drapps.runtime.messages import BatchFailed, BatchMade
from drapps.runtime.parts import PartialBatch, largest_tensor
from drapps.runtime.plan import EpochPlan
from drapps.runtime.pool import Task, Worker
from drapps.runtime.reorder import Entry, ReorderBuffer
from drapps.runtime.schedule import Work
from drapps.runtime.transport import RebuildError
from drapps.runtime.worker import BatchRecipe, collate_samples, transport_error

Deliver = Callable[[int, int, Entry], None]
"""Hand a batch (generation, batch id, entry) to the buffer."""
Unreadable = Callable[[int, "Work | None", Exception], None]
"""A part's slab could not be mapped: make it again."""


class Collector:
    """The parts of the batches made in parts, and the batches filled from them.

    Args:
        recipe: collates the parts (as the workers would have).
        admission: receives each part's slab and holds each collated batch's bytes.
        buffer: where filled batches go (by slot).
        finish: applied to each collated batch (pinning).
        defer_after: seconds the loop may wait for a batch's own samples before made ones
            fill it (None: batches are collated from their own parts).
        counters, latencies: the dispatcher's, which the collector adds to.
    """

    def __init__(
        self,
        recipe: BatchRecipe,
        admission: Admission,
        buffer: ReorderBuffer,
        finish: Callable[[Any], Any] | None,
        defer_after: float | None,
        counters: dict[str, float],
        latencies: deque[tuple[float, float]],
    ) -> None:
        self._recipe, self._admission, self._buffer = recipe, admission, buffer
        self._finish, self.defer_after = finish, defer_after
        self._counters, self._latencies = counters, latencies
        self.partial: dict[int, PartialBatch] = {}
        """The open batches made in parts, by id."""
        self.fill: ReadyFill | None = None
        self.slow_batches = 0
        """Batches that held a slow sample."""

    def reset(self, plan: EpochPlan, start: int) -> None:
        """A new epoch: no batch open, and (with ``defer_after``) an empty pool to fill from."""
        self.partial.clear()
        self.fill = ReadyFill(plan, start) if self.defer_after is not None else None

    def close(self) -> None:
        """Let go of every part held (their samples map their workers' slabs)."""
        self.partial.clear()
        self.fill = None

    def open(
        self, batch_id: int, indices: list[Any], parts: list[Work], split: Any, now: float
    ) -> None:
        """Batch ``batch_id`` is sent out in ``parts`` from ``now``."""
        positions = {w.part: w.positions for w in parts if w.part is not None}
        self.partial[batch_id] = PartialBatch(indices, positions, now, split)

    def pooled_batches(self, batch_len: int) -> int:
        """Batches' worth of made samples waiting to fill a batch (they hold memory too)."""
        return 0 if self.fill is None else -(-self.fill.pooled // max(1, batch_len))

    def made_already(self, work: Work) -> bool | None:
        """Whether a part ``work`` came back already (None: the buffer knows, not the fill)."""
        if self.fill is not None and work.part is not None:
            return self.fill.has(work.batch_id, work.part)
        return None

    def on_part(
        self,
        worker: Worker,
        reply: BatchMade | BatchFailed,
        current: bool,
        task: Task | None,
        deliver: Deliver,
        unreadable: Unreadable,
    ) -> None:
        """One part of a batch made in parts; the batch is delivered with its last."""
        generation, batch_id, part = reply.generation, reply.batch_id, reply.part
        assert part is not None
        partial = self.partial.get(batch_id) if current else None
        done = self._buffer.done(batch_id) if self.fill is None else False
        if partial is None or partial.has(part) or done:
            if isinstance(reply, BatchMade):
                self._admission.drop(worker, reply.packed)
            return  # a stale epoch's part, or a duplicate of a retried one
        now = time.monotonic()
        failure = reply.error if isinstance(reply, BatchFailed) else None
        received = None
        if isinstance(reply, BatchMade):
            try:
                received = self._samples(worker, reply, task, unreadable)
            except RebuildError as exc:  # made again, it would fail again
                failure = _not_rebuilt(batch_id, task, exc)
            else:
                if received is None:
                    return
        if failure is not None:
            if self.fill is not None:
                self.fill.fail(batch_id, part, partial.positions[part], failure)
                self._part_in(batch_id, partial, part)
                return
            partial.fail(part, failure)
        else:
            assert isinstance(reply, BatchMade) and received is not None
            assert reply.kept is not None  # a part says which of its samples it holds
            add_stages(self._counters, reply.seconds)
            if self.fill is not None:
                places = partial.positions[part]
                self.fill.add(batch_id, part, places, received[0], reply.kept, reply.skipped)
                self._part_in(batch_id, partial, part)
                return
            partial.add(part, received[0], reply.kept, reply.skipped, received[1])
            self._counters["transport_s"] += time.monotonic() - now
        if partial.complete:
            self._assemble(generation, batch_id, partial, deliver)

    def on_whole(
        self,
        worker: Worker,
        reply: BatchMade | BatchFailed,
        current: bool,
        task: Task | None,
        split: Any,
        deliver: Deliver,
        unreadable: Unreadable,
    ) -> None:
        """A whole batch, made with ``split``: received and delivered (if of the ``current``
        epoch and not delivered already: a late copy's slab goes back to its worker)."""
        now = time.monotonic()
        if task is not None:
            self._latencies.append((now, now - task.assigned_at))
        if isinstance(reply, BatchFailed):
            entry = Entry(error=reply.error)
        else:
            if not current or self._buffer.done(reply.batch_id):
                self._admission.drop(worker, reply.packed)
                return
            batch, nbytes = None, 0
            if reply.packed is not None:
                try:
                    batch, nbytes = self._admission.receive(worker, reply.packed)
                except (OSError, ValueError) as exc:  # its slab cannot be mapped: make it again
                    unreadable(reply.batch_id, None, exc)
                    return
                except RebuildError as exc:  # made again, it would fail again
                    if current:
                        error = _not_rebuilt(reply.batch_id, task, exc)
                        deliver(reply.generation, reply.batch_id, Entry(error=error))
                    return
                if self._finish is not None:
                    batch = self._finish(batch)
                self._counters["transport_s"] += time.monotonic() - now
                self._admission.note_batch(nbytes)
            entry = Entry(batch=batch, nbytes=nbytes, skipped=reply.skipped, split=split)
            add_stages(self._counters, reply.seconds)
        if current:
            deliver(reply.generation, reply.batch_id, entry)

    def give_up(self, task: Task, message: str, skip: bool, deliver: Deliver) -> None:
        """Part ``task`` was given up: ``message`` skips its samples (``skip``) or fails it."""
        assert task.part is not None
        partial = self.partial.get(task.batch_id)
        if partial is None or partial.has(task.part):
            return
        error = WorkerTimeoutError(message, stage="worker", indices=task.indices)
        if self.fill is not None:
            places = partial.positions[task.part]
            if skip:
                self.fill.skip(task.batch_id, task.part, places, message)
            else:
                self.fill.fail(task.batch_id, task.part, places, error)
            self._part_in(task.batch_id, partial, task.part)
            return
        if skip:
            partial.skip(task.part, message)
        else:
            partial.fail(task.part, error)
        if partial.complete:
            self._assemble(task.generation, task.batch_id, partial, deliver)

    def fill_ready(self, generation: int, split: Any) -> None:
        """Hand over every batch the pool of made samples can fill now."""
        fill, defer_after = self.fill, self.defer_after
        if fill is None or defer_after is None:
            return
        while True:
            head = self._buffer.next_id == fill.slot
            filled = fill.form(self._buffer.waiting_s() if head else None, defer_after)
            if filled is None:
                return
            self._buffer.put(generation, filled.slot, self._filled_entry(filled, split))

    def _samples(
        self, worker: Worker, reply: BatchMade, task: Task | None, unreadable: Unreadable
    ) -> tuple[list[Any], int] | None:
        """A part's samples and their bytes; None when its slab cannot be mapped (the part is
        made again).

        Raises:
            RebuildError: the samples cannot be rebuilt in this process.
        """
        if reply.packed is None:
            return [], 0
        try:
            return self._admission.receive(worker, reply.packed)
        except (OSError, ValueError) as exc:
            unreadable(reply.batch_id, task.work if task is not None else None, exc)
            return None

    def _part_in(self, batch_id: int, partial: PartialBatch, part: int) -> None:
        partial.received.add(part)
        if partial.complete:
            del self.partial[batch_id]
            self._admission.open.discard(batch_id)

    def _filled_entry(self, filled: Filled, split: Any) -> Entry:
        keys, places = filled.keys, filled.places
        if filled.error is not None:
            return Entry(error=filled.error, keys=keys, places=places)
        entry = Entry(skipped=filled.skipped, split=split, keys=keys, places=places)
        if filled.samples:
            try:
                batch = collate_samples(self._recipe, filled.samples, split, keys, one_thread=True)
            except Exception as exc:  # collate_samples names the batch in a SampleError
                return Entry(error=exc, keys=keys, places=places)
            tensor = largest_tensor(batch)
            entry.nbytes = 0 if tensor is None else tensor.nbytes
            entry.batch = self._admission.hold(batch, entry.nbytes, self._finish)
        return entry

    def _assemble(
        self, generation: int, batch_id: int, partial: PartialBatch, deliver: Deliver
    ) -> None:
        """Collate a batch whose parts are all here, in plan order, and deliver it."""
        del self.partial[batch_id]
        self.slow_batches += partial.slow
        start = time.monotonic()
        entry = partial.outcome(
            lambda samples, indices: collate_samples(
                self._recipe, samples, partial.split, indices, one_thread=True
            )
        )
        if entry.batch is not None:
            entry.batch = self._admission.hold(entry.batch, entry.nbytes, self._finish)
        now = time.monotonic()
        self._counters["assemble_s"] += now - start
        self._latencies.append((now, now - partial.opened_at))
        deliver(generation, batch_id, entry)


def add_stages(counters: dict[str, float], seconds: tuple[float, float, float]) -> None:
    """Add a reply's seconds in ``__getitem__``, the transform and ``collate_fn``."""
    for name, value in zip(("fetch_s", "transform_s", "collate_s"), seconds, strict=True):
        counters[name] += value


def _not_rebuilt(batch_id: int, task: Task | None, exc: RebuildError) -> SampleError:
    """The error in the place of a batch (or part) that arrived but cannot be rebuilt here."""
    indices = task.indices if task is not None else None
    return transport_error(batch_id, indices, exc.error, received=True)
