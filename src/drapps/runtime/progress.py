"""Where a worker process is within its task, shared with the training process.

The dispatcher sees a task start and end; between the two it cannot tell a part that makes
eight cheap samples slowly from one stuck on a single read that may take half a second. Each
process worker writes, into four doubles of shared memory, the task it is making, the sample's
position in it, and when that sample began (0 between samples). The dispatcher reads them to
copy a part whose one sample has run far past its predicted cost, long before the part as a
whole would look overdue. Fields are written sample-first-cleared and time-last-set, so a read
torn between two writes sees either no sample or one that just began.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import time
from dataclasses import dataclass
from typing import Any

_STARTED, _BATCH, _PART, _POSITION, _READY = range(5)
_SIZE = 5 * 8


@dataclass(frozen=True)
class SampleInProgress:
    """The sample a worker is making now."""

    batch_id: int
    part: int | None
    position: int
    """Its place in the task's indices."""
    started: float
    """``time.monotonic()`` when the worker began it."""


class SampleClock:
    """Five shared doubles, written by one worker and read by the training process: a page
    of anonymous shared memory, whose descriptor (:attr:`fd`) is handed to the worker.

    Example:
        >>> clock = SampleClock()
        >>> clock.begin_task(7, None)
        >>> clock.begin_sample(3)
        >>> now = clock.read()
        >>> (now.batch_id, now.part, now.position)
        (7, None, 3)
        >>> clock.end_sample()
        >>> clock.read() is None
        True
    """

    def __init__(self, fd: int | None = None) -> None:
        """A new clock, or (``fd``) the one another process made; the descriptor is this
        object's to close (:meth:`close_fd`)."""
        if fd is None:
            fd = os.memfd_create("drapps-clock", os.MFD_CLOEXEC)
            os.ftruncate(fd, _SIZE)
        self.fd: int | None = fd
        self._map: mmap.mmap | None = mmap.mmap(fd, _SIZE)
        self._values: Any = (ctypes.c_double * 5).from_buffer(self._map)

    def __reduce__(self) -> tuple[Any, ...]:
        """Sent to a process being started (its descriptor is duplicated into it)."""
        from multiprocessing import reduction

        if self.fd is None:
            raise TypeError("this SampleClock's descriptor is closed: it cannot be sent")
        return (_rebuild, (reduction.DupFd(self.fd),))

    def close_fd(self) -> None:
        """Close the descriptor once the worker has its own (the mapping stays)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def close(self) -> None:
        """Let go of the clock (its worker is gone): the mapping and the descriptor that
        ``mmap`` keeps of its own. Reads give None from here."""
        self.close_fd()
        if self._map is not None:
            self._values = None  # the array's view of the map must go before the map
            with contextlib.suppress(BufferError):  # a read under way: the GC closes it
                self._map.close()
            self._map = None

    def mark_ready(self) -> None:
        """The worker is ready for its first task (started, ``worker_init_fn`` run)."""
        self._values[_READY] = time.monotonic()

    def ready_at(self) -> float | None:
        """``time.monotonic()`` when the worker was ready, or None before."""
        values = self._values
        ready = values[_READY] if values is not None else 0.0
        return ready if ready > 0 else None

    def begin_task(self, batch_id: int, part: int | None) -> None:
        values = self._values
        values[_STARTED] = 0.0
        values[_BATCH] = batch_id
        values[_PART] = -1 if part is None else part

    def begin_sample(self, position: int) -> None:
        values = self._values
        values[_POSITION] = position
        values[_STARTED] = time.monotonic()

    def end_sample(self) -> None:
        self._values[_STARTED] = 0.0

    def read(self) -> SampleInProgress | None:
        """The sample being made, or None between samples."""
        values = self._values
        if values is None:
            return None
        started, batch_id, part, position = values[:4]
        if started <= 0:
            return None
        number = None if part < 0 else int(part)
        return SampleInProgress(int(batch_id), number, int(position), started)


def _rebuild(fd: Any) -> SampleClock:
    return SampleClock(fd.detach())


_clock: SampleClock | None = None


def use_clock(clock: SampleClock | None) -> None:
    """Make ``clock`` the one this process's samples are timed on (a worker, at its start)."""
    global _clock
    _clock = clock


def current_clock() -> SampleClock | None:
    """This process's clock (None outside process workers)."""
    return _clock
