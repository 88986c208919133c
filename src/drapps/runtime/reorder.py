"""The reorder buffer: made batches wait here until it is their turn, in batch-id order."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Entry:
    """One batch's outcome: a batch, an error to raise in its place, or nothing (all skipped)."""

    batch: Any | None = None
    nbytes: int = 0
    error: BaseException | None = None
    skipped: list[tuple[int, str]] = field(default_factory=list)
    split: int | None = None
    """The split the batch was made with: its device stage starts there."""


class ReorderBuffer:
    """Thread-safe holding area between the dispatcher (producer) and the training loop.

    Batches arrive in any order and leave strictly by id. A result for an id already delivered or
    held, or from an earlier epoch's generation, is refused, which is what makes retried tasks
    exactly-once. The dispatcher keeps ``bytes`` under the memory budget by not dispatching more.
    """

    def __init__(self, on_consumed: Callable[[], None] | None = None) -> None:
        self._cond = threading.Condition()
        self._entries: dict[int, Entry] = {}
        self._on_consumed = on_consumed
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

    def reset(self, generation: int, start: int, end: int) -> list[Entry]:
        """Begin a new epoch (``generation``) delivering ids ``start..end-1``; returns dropped."""
        with self._cond:
            dropped = list(self._entries.values())
            self._entries.clear()
            self.generation, self.next_id, self.end_id = generation, start, end
            self.bytes = 0
            self._cond.notify_all()
        return dropped

    def holds(self, batch_id: int) -> bool:
        return batch_id in self._entries

    def put(self, generation: int, batch_id: int, entry: Entry) -> bool:
        """Hold ``entry`` for delivery; False when it is stale or a duplicate (caller drops it)."""
        with self._cond:
            if (
                generation != self.generation
                or batch_id < self.next_id
                or batch_id in self._entries
                or self._failure is not None
            ):
                return False
            self._entries[batch_id] = entry
            self.bytes += entry.nbytes
            self.peak_bytes = max(self.peak_bytes, self.bytes)
            if batch_id == self.next_id:
                self._cond.notify_all()
            return True

    def get(self, alive: Callable[[], bool] | None = None) -> Entry | None:
        """The next batch's entry, waiting for it; None once the epoch is exhausted.

        Args:
            alive: polled while waiting; when it returns False the wait ends with an error
                instead of hanging (the producer is gone).
        """
        with self._cond:
            start = time.perf_counter()
            self._waiting_since = start
            try:
                while True:
                    if self._failure is not None:
                        raise self._failure
                    if self.next_id >= self.end_id:
                        return None
                    entry = self._pop_next()
                    if entry is not None:
                        break
                    if alive is not None and not alive():
                        raise RuntimeError("drapps: the dispatcher thread stopped unexpectedly")
                    self._cond.wait(timeout=1.0)
            finally:
                self._waiting_since = None
                self.wait_s += time.perf_counter() - start
        if self._on_consumed is not None:
            self._on_consumed()
        return entry

    def get_ready(self) -> Entry | None:
        """The next batch's entry if it is here now (never waits); None otherwise."""
        with self._cond:
            if self._failure is not None or self.next_id >= self.end_id:
                return None
            entry = self._pop_next()
            if entry is None:
                return None
        if self._on_consumed is not None:
            self._on_consumed()
        return entry

    def _pop_next(self) -> Entry | None:
        """Take the next batch's entry if held, advancing past it (the lock is held)."""
        entry = self._entries.pop(self.next_id, None)
        if entry is not None:
            self.next_id += 1
            self.bytes -= entry.nbytes
        return entry

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
