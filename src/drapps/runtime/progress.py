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

import time
from dataclasses import dataclass
from multiprocessing.context import BaseContext
from typing import Any

_STARTED, _BATCH, _PART, _POSITION = range(4)


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
    """Four shared doubles, written by one worker and read by the training process.

    Example:
        >>> import multiprocessing
        >>> clock = SampleClock(multiprocessing.get_context())
        >>> clock.begin_task(7, None)
        >>> clock.begin_sample(3)
        >>> now = clock.read()
        >>> (now.batch_id, now.part, now.position)
        (7, None, 3)
        >>> clock.end_sample()
        >>> clock.read() is None
        True
    """

    def __init__(self, context: BaseContext) -> None:
        self._values: Any = context.RawArray("d", 4)

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
        started, batch_id, part, position = self._values[:]
        if started <= 0:
            return None
        number = None if part < 0 else int(part)
        return SampleInProgress(int(batch_id), number, int(position), started)


_clock: SampleClock | None = None


def use_clock(clock: SampleClock | None) -> None:
    """Make ``clock`` the one this process's samples are timed on (a worker, at its start)."""
    global _clock
    _clock = clock


def current_clock() -> SampleClock | None:
    """This process's clock (None outside process workers)."""
    return _clock
