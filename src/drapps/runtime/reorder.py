"""The reorder buffer: made batches wait here until it is their turn, in batch-id order (or, for
a loader with ``in_order=False``, leave as soon as they are made, lowest id first)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from drapps.runtime.errors import anew


@dataclass
class Entry:
    """One batch's outcome: a batch, an error to raise in its place, or nothing (all skipped)."""

    batch: Any | None = None
    nbytes: int = 0
    error: BaseException | None = None
    skipped: list[tuple[int, str]] = field(default_factory=list)
    split: Any = None
    """The split the batch was made with: its device stage starts there."""
    batch_id: int = -1
    """The batch's id in its epoch (set when the buffer takes it)."""
    keys: list[Any] | None = None
    """The dataset keys the batch holds, where they are not its planned batch's (a batch
    filled from made samples); None: the plan's."""
    places: list[tuple[int, int]] | None = None
    """Those samples' places in the plan, (batch id, position)."""


class ReorderBuffer:
    """Thread-safe holding area between the dispatcher (producer) and the training loop.

    Batches arrive in any order and leave strictly by id, or, asked for ``any_order``, as they
    are here. A result for an id already delivered or held, or from an earlier epoch's
    generation, is refused, which is what makes retried tasks exactly-once. The dispatcher keeps
    ``bytes`` under the memory budget by not dispatching more.
    """

    def __init__(
        self,
        on_consumed: Callable[[], None] | None = None,
        on_wait: Callable[[], None] | None = None,
    ) -> None:
        """
        Args:
            on_consumed: called after each entry the consumer takes.
            on_wait: called when the consumer starts waiting for an entry not here yet.
        """
        self._cond = threading.Condition()
        self._entries: dict[int, Entry] = {}
        self._ahead: set[int] = set()  # ids above next_id delivered out of order
        self._on_consumed = on_consumed
        self._on_wait = on_wait
        self._failure: BaseException | None = None
        self.generation = 0
        self.next_id = 0
        self.end_id = 0
        self.bytes = 0
        self.peak_bytes = 0
        self.wait_s = 0.0
        self._waiting_since: float | None = None

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def left(self) -> int:
        """Entries of this epoch the consumer has not taken yet (ready ones included)."""
        return max(0, self.end_id - self.next_id - len(self._ahead))

    def reset(self, generation: int, start: int, end: int) -> list[Entry]:
        """Begin a new epoch (``generation``) delivering ids ``start..end-1``; returns dropped."""
        with self._cond:
            dropped = self._drop_held()
            self.generation, self.next_id, self.end_id = generation, start, end
            self._cond.notify_all()
        return dropped

    def _drop_held(self) -> list[Entry]:
        """Empty the buffer, with its lock held; returns what it held."""
        dropped = list(self._entries.values())
        self._entries.clear()
        self._ahead.clear()
        self.bytes = 0
        return dropped

    def let_go(self, generation: int) -> list[Entry]:
        """The loop let go of epoch ``generation`` before its end: drop what is held, and take
        none of its batches from now on (the replies still in flight are dropped as they
        come); returns what was held, for the caller to drop outside the lock. Nothing where
        a newer epoch has begun: the loop may start one before the dispatcher hears of this."""
        with self._cond:
            if generation != self.generation:
                return []
            self.next_id = max(self.next_id, self.end_id)
            return self._drop_held()

    def view(self) -> tuple[int, int, int]:
        """(generation, next id, entries held), read together: a dispatcher in another thread
        decides on one epoch's state, never on a mix of it and the next's."""
        with self._cond:
            return self.generation, self.next_id, len(self._entries)

    def holds(self, batch_id: int) -> bool:
        return batch_id in self._entries

    def done(self, batch_id: int) -> bool:
        """Whether ``batch_id`` is held or delivered already (a result for it is a duplicate)."""
        with self._cond:
            return batch_id < self.next_id or batch_id in self._entries or batch_id in self._ahead

    def put(self, generation: int, batch_id: int, entry: Entry) -> bool:
        """Hold ``entry`` for delivery; False when it is stale or a duplicate (caller drops it)."""
        with self._cond:
            if (
                generation != self.generation
                or batch_id < self.next_id
                or batch_id in self._entries
                or batch_id in self._ahead
                or self._failure is not None
            ):
                return False
            entry.batch_id = batch_id
            self._entries[batch_id] = entry
            self.bytes += entry.nbytes
            self.peak_bytes = max(self.peak_bytes, self.bytes)
            self._cond.notify_all()  # the next id, or any id for a loop that takes any order
            return True

    def get(
        self, alive: Callable[[], bool] | None = None, *, any_order: bool = False
    ) -> Entry | None:
        """The next batch's entry, waiting for it; None once the epoch is exhausted.

        Args:
            alive: polled while waiting; when it returns False the wait ends with an error
                instead of hanging (the producer is gone).
            any_order: take whichever batch is here (the lowest id), not only the next.
        """
        with self._cond:
            start = time.perf_counter()
            self._waiting_since = start
            told = False
            try:
                while True:
                    if self._failure is not None:
                        failure = anew(self._failure)
                        try:
                            raise failure
                        finally:
                            del failure
                    if self.next_id >= self.end_id:
                        return None
                    entry = self._pop_next(any_order)
                    if entry is not None:
                        break
                    if alive is not None and not alive():
                        raise RuntimeError("drapps: the dispatcher thread stopped unexpectedly")
                    if self._on_wait is not None and not told:
                        told = True
                        self._on_wait()
                    self._cond.wait(timeout=1.0)
            finally:
                self._waiting_since = None
                self.wait_s += time.perf_counter() - start
        if self._on_consumed is not None:
            self._on_consumed()
        return entry

    def get_ready(self, *, any_order: bool = False) -> Entry | None:
        """The next batch's entry if it is here now (never waits); None otherwise."""
        with self._cond:
            if self._failure is not None or self.next_id >= self.end_id:
                return None
            entry = self._pop_next(any_order)
            if entry is None:
                return None
        if self._on_consumed is not None:
            self._on_consumed()
        return entry

    def _pop_next(self, any_order: bool = False) -> Entry | None:
        """Take the next batch's entry if held (with ``any_order``, the lowest held), advancing
        past every id delivered (the lock is held)."""
        batch_id = self.next_id
        if any_order and batch_id not in self._entries and self._entries:
            batch_id = min(self._entries)
        entry = self._entries.pop(batch_id, None)
        if entry is None:
            return None
        self.bytes -= entry.nbytes
        if batch_id != self.next_id:
            self._ahead.add(batch_id)
            return entry
        self.next_id += 1
        while self.next_id in self._ahead:
            self._ahead.discard(self.next_id)
            self.next_id += 1
        return entry

    def waiting_s(self) -> float | None:
        """How long the consumer has been waiting in the current ``get`` (None: it is not)."""
        since = self._waiting_since
        return None if since is None else time.perf_counter() - since

    def waited_s(self) -> float:
        """Seconds the consumer has waited so far, including a wait still under way."""
        since = self._waiting_since
        return self.wait_s + (time.perf_counter() - since if since is not None else 0.0)

    def fail(self, error: BaseException) -> list[Entry]:
        """Make every current and future ``get`` raise ``error``; returns the dropped entries."""
        with self._cond:
            if self._failure is None:
                self._failure = error
            dropped = list(self._entries.values())
            self._entries.clear()
            self.bytes = 0
            self._cond.notify_all()
        return dropped
