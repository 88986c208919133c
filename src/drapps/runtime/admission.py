"""Admission: what work may start, and the bytes the memory budget holds.

The memory budget bounds the batches made ahead: those in the reorder buffer, those the
training loop still holds (their pages stay in shared memory until their last tensor is gone),
the released slabs the workers keep to write later batches into, and the batches under way.
:class:`Admission` owns those counts, the batches opened and not yet delivered, and the slab
recycling of what comes back; the dispatcher asks it whether a batch may open and a worker may
take another task, and hands it every batch that arrives and every one it drops.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from drapps.runtime.cost import SampleCosts
from drapps.runtime.parts import on_free
from drapps.runtime.plan import EpochPlan
from drapps.runtime.pool import Worker
from drapps.runtime.recycling import SlabRecycler
from drapps.runtime.slabs import PAGE
from drapps.runtime.transport import Packed, discard, unpack

TASKS_PER_WORKER = 2
"""Tasks a worker holds at most: the one it makes and one waiting, so it never idles between
tasks while the rest stay free to go to whichever worker frees up first."""
SLOW_PART = 2.0
"""A part predicted to cost this many times a typical one holds its worker to that part alone."""


class Admission:
    """The memory budget's accounts, and the rules for starting work.

    Args:
        budget: bytes the batches made ahead may hold.
    """

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.open: set[int] = set()
        """Batches started and not yet in the buffer."""
        self.batch_bytes = 0
        """Bytes of the largest batch received so far (0 before the first)."""
        self._live_bytes = 0
        self._lock = threading.Lock()
        self.recycler = SlabRecycler(room=self.room_to_keep)
        """Released slabs go back to their workers, those the budget has room for kept."""
        self.counters = {"pickled_bytes": 0, "shared_bytes": 0}

    def reset(self, plan: EpochPlan, start: int) -> None:
        """A new epoch: none of its batches is open yet."""
        self.open.clear()

    @staticmethod
    def may_queue(worker: Worker, *, cutting: bool, costs: SampleCosts) -> bool:
        """Whether ``worker`` may take one more task now: up to two, so it never idles between
        tasks; while batches are cut into parts (``cutting``), a second only behind a part not
        predicted slow (a part queued behind a straggler would wait while another worker
        idles)."""
        if len(worker.assigned) >= TASKS_PER_WORKER:
            return False
        if not worker.assigned or not cutting:
            return True
        work = worker.assigned[0].work
        typical = costs.mean * (len(work.positions) if work is not None else 1)
        return work is None or work.cost <= SLOW_PART * typical

    def may_open(
        self, batch_id: int, depth: int, *, head: int, ready: int, pooled: int, workers: int
    ) -> bool:
        """Whether work on ``batch_id`` may start at prefetch depth ``depth`` (a batch already
        started always may, and so does ``head``, the one the training loop waits for).
        ``ready``: batches in the buffer; ``pooled``: batches' worth of made samples waiting
        to fill one; ``workers``: live workers."""
        if batch_id == head or batch_id in self.open:
            return True
        outstanding = len(self.open) + ready + pooled
        if outstanding >= depth:
            return False
        if self.batch_bytes == 0:
            # Size unknown until the first batch lands: one batch per worker until then.
            return outstanding < max(1, workers)
        kept = self.recycler.mappings.held_bytes()
        projected = self._live_bytes + kept + (len(self.open) + 1) * self.batch_bytes
        return projected <= self.budget

    def room_to_keep(self) -> int:
        """Bytes the budget has left for one more released slab kept for reuse, beside the
        live batches, the slabs kept already and the batches under way (called from the
        finalizer of a batch's last tensor, in any thread)."""
        kept = self.recycler.mappings.held_bytes_unlocked()
        under_way = len(self.open) * self.batch_bytes
        return self.budget - self._live_bytes - kept - under_way

    def receive(self, worker: Worker, packed: Packed) -> tuple[Any, int]:
        """A packed reply rebuilt over its slab, counted live until its last tensor goes.

        Raises:
            OSError, ValueError: its slab cannot be mapped.
        """
        release = self._releaser(worker, packed)
        # A batch written into a longer slab kept for reuse (slabs only grow) holds all of its
        # pages: the slab's length counts (beyond the page a small batch is rounded up to).
        nbytes = packed.nbytes
        if packed.fd is not None and (length := os.fstat(packed.fd).st_size) > nbytes + PAGE:
            nbytes = length

        def on_release(_: int) -> None:
            self.released(nbytes)

        batch = unpack(packed, on_release, release, self.recycler.mappings, worker.wid)
        if nbytes:
            with self._lock:
                self._live_bytes += nbytes
        self.counters["pickled_bytes"] += len(packed.skeleton)
        self.counters["shared_bytes"] += nbytes
        return batch, nbytes

    def drop(self, worker: Worker, packed: Packed | None) -> None:
        """Let go of a reply not delivered (stale, or a duplicate), its slab back to its
        worker. The slabs the worker closed since its last batch, which the reply names, are
        forgotten all the same: no later reply names them again."""
        if packed is not None:
            if packed.closed:
                self.recycler.mappings.forget(packed.closed)
            discard(packed, self._releaser(worker, packed))

    def hold(self, batch: Any, nbytes: int, finish: Callable[[Any], Any] | None) -> Any:
        """A batch collated in this process, through ``finish``. The parts' slabs are freed
        as their samples go; the collated batch now holds that memory (``nbytes``), counted
        live until the training loop lets it go."""
        if finish is not None:
            batch = finish(batch)
        if nbytes and on_free(batch, lambda: self.released(nbytes)):
            with self._lock:
                self._live_bytes += nbytes
        self.note_batch(nbytes)
        return batch

    def note_batch(self, nbytes: int) -> None:
        """A batch of ``nbytes`` arrived (the largest so far sizes what may open)."""
        self.batch_bytes = max(self.batch_bytes, nbytes)

    def released(self, nbytes: int) -> None:
        """The training loop let go of ``nbytes`` of batches (any thread)."""
        with self._lock:
            self._live_bytes -= nbytes

    def _releaser(self, worker: Worker, packed: Packed) -> Callable[[bool], None] | None:
        if packed.recycle and packed.slab is not None:
            return self.recycler.releaser(worker.wid, packed.slab)
        return None
