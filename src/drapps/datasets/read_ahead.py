"""ReadAhead: a dataset's file reads started in background threads before they are asked for.

A worker making a batch asks for its samples one at a time, and a read that waits on storage
(a cold object store, a busy network filesystem) holds the worker, and the batch, for all of
that wait. A dataset that can say how it reads a sample lets drapps start those reads early: the
worker hints each task's indices (and those of the task queued behind it) through the dataset's
``read_ahead(indices)`` before it makes them, a few threads read them, and ``__getitem__`` takes
the bytes when it gets there. A slow read then overlaps the decoding of the samples around it
instead of adding to it. Reads draw no randomness, so batches stay the same.
"""

from __future__ import annotations

import os
import queue
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from typing import Any

_QUEUED, _READING, _DONE = "queued", "reading", "done"


class _Slot:
    """One hinted read: queued, being read, or done (with its bytes or its error)."""

    __slots__ = ("data", "done", "error", "state")

    def __init__(self) -> None:
        self.state = _QUEUED
        self.done = threading.Event()
        self.data: Any = None
        self.error: BaseException | None = None


class ReadAhead:
    """Runs ``read(key)`` in background threads for keys hinted ahead of their :meth:`take`.

    Keys are read in the order hinted; a key is read once, whichever comes first. :meth:`take`
    returns a hinted key's result (waiting for a read in progress, re-raising its error), reads
    a key nobody has started yet in the calling thread, and reads an unhinted key directly. At
    most ``limit`` results wait to be taken: past that, the oldest hints are dropped (a task
    that failed part way leaves its other hints behind). The threads are daemons, started on the
    first hint in each process (a forked worker starts its own), and :meth:`close` stops them.

    Args:
        read: key -> data (a path -> bytes for files); called from the reading threads.
        threads: reads in flight at once.
        limit: hinted results kept waiting for their take.

    Example:
        >>> reads = ReadAhead(lambda key: key.upper(), threads=2)
        >>> reads.hint(["a", "b"])
        >>> reads.take("a"), reads.take("b"), reads.take("c")
        ('A', 'B', 'C')
        >>> reads.close()
    """

    def __init__(self, read: Callable[[Any], Any], *, threads: int = 4, limit: int = 128) -> None:
        if not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads must be an int >= 1, got {threads!r}")
        if not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be an int >= 1, got {limit!r}")
        self.read, self.threads, self.limit = read, threads, limit
        self._lock = threading.Lock()
        self._slots: OrderedDict[Hashable, _Slot] = OrderedDict()
        self._todo: queue.SimpleQueue[tuple[Hashable, _Slot] | None] = queue.SimpleQueue()
        self._readers: list[threading.Thread] = []
        self._pid = os.getpid()
        self._finalizer: weakref.finalize | None = None

    def hint(self, keys: Iterable[Hashable]) -> None:
        """Start reading ``keys`` (in this order) that are not read or being read already."""
        self._fork_check()
        with self._lock:
            for key in keys:
                if key in self._slots:
                    continue
                while len(self._slots) >= self.limit:
                    _, dropped = self._slots.popitem(last=False)
                    if dropped.state == _QUEUED:
                        dropped.state = _DONE  # its reader skips it
                slot = self._slots[key] = _Slot()
                self._todo.put((key, slot))
            if self._slots and not self._readers:
                self._start()

    def take(self, key: Hashable) -> Any:
        """``read(key)``: the hinted read's result, or read here if no reader has started it.

        Raises:
            Exception: whatever ``read`` raised for this key.
        """
        self._fork_check()
        with self._lock:
            slot = self._slots.pop(key, None)
            if slot is not None and slot.state == _QUEUED:
                slot.state, slot = _DONE, None  # not started: read it here, now
        if slot is None:
            return self.read(key)
        slot.done.wait()
        if slot.error is not None:
            raise slot.error
        return slot.data

    @property
    def waiting(self) -> int:
        """Hinted keys not taken yet (read or not)."""
        return len(self._slots)

    def close(self, timeout_s: float = 1.0) -> None:
        """Drop every hint and stop the threads (each finishes the read it is in, up to
        ``timeout_s`` in all; they are daemons and do not hold the process's exit)."""
        self._fork_check()
        with self._lock:
            readers, self._readers = self._readers, []
            for slot in self._slots.values():
                if slot.state == _QUEUED:
                    slot.state = _DONE
            self._slots.clear()
            for _ in readers:
                self._todo.put(None)
        for reader in readers:
            reader.join(timeout_s / len(readers))

    def _fork_check(self) -> None:
        """In a process forked after the threads started, start afresh: they are not here
        (and the lock may have been held by one of them when the process forked)."""
        if self._pid != os.getpid():
            self._pid, self._readers, self._slots = os.getpid(), [], OrderedDict()
            self._lock = threading.Lock()
            self._todo = queue.SimpleQueue()

    def _start(self) -> None:
        todo = self._todo
        for number in range(self.threads):
            reader = threading.Thread(
                target=_read_loop, args=(todo, self._lock, self.read),
                name=f"drapps-read-ahead-{number}", daemon=True,
            )  # fmt: skip
            reader.start()
            self._readers.append(reader)
        if self._finalizer is None:
            self._finalizer = weakref.finalize(self, _stop, todo, self.threads)

    def __getstate__(self) -> dict[str, Any]:
        return {"read": self.read, "threads": self.threads, "limit": self.limit}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["read"], threads=state["threads"], limit=state["limit"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"ReadAhead(threads={self.threads}, limit={self.limit}, waiting={self.waiting})"


def _read_loop(
    todo: queue.SimpleQueue[tuple[Hashable, _Slot] | None],
    lock: threading.Lock,
    read: Callable[[Any], Any],
) -> None:
    """A reading thread: read each queued key nobody took or dropped first, until None."""
    while (item := todo.get()) is not None:
        key, slot = item
        with lock:
            if slot.state != _QUEUED:
                continue
            slot.state = _READING
        try:
            slot.data = read(key)
        except BaseException as exc:  # handed to the take, which raises it
            slot.error = exc
        finally:
            slot.state = _DONE
            slot.done.set()


def _stop(todo: queue.SimpleQueue[Any], threads: int) -> None:
    for _ in range(threads):
        todo.put(None)
