"""How much of a sample's time runs Python that holds the GIL: what decides whether threads of
one process can make a dataset's batches as fast as worker processes.

A worker process watches its first samples (:class:`drapps.runtime.worker.Watch`) with a
profile hook that splits their time between C functions (a JPEG decode, an OpenCV resize, a
NumPy or torch op, a read, a sleep: where the GIL may be released) and Python bytecode, which
always holds it. ``n`` threads of one process run the Python share one at a time, so where
it is ``g`` of a sample's time they make at most ``1 / g`` samples in a sample's time, against
``n`` for ``n`` processes: threads are refused where ``g * n >= 1``
(:class:`drapps.runtime.executor_pool.ExecutorPool`).

The split is a lower bound on the GIL's share: some C functions hold the GIL (a small NumPy
op, ``list.sort``), and their time counts as released. What it measures is stable under load:
both shares slow down together when the cores are shared.

Example:
    >>> meter = GilMeter()
    >>> with meter.measure():
    ...     total = sum(i * i for i in range(200_000))  # Python bytecode throughout
    >>> meter.held_share() > 0.5
    True
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any


class GilMeter:
    """Splits the time of the code it measures, in the thread that measures it, between C
    functions and Python bytecode (``sys.setprofile``: only while :meth:`measure` runs, and
    not where another profiler is installed)."""

    def __init__(self) -> None:
        self.c_s = 0.0
        """Seconds in C functions called from Python (not counting Python they call back)."""
        self.measured_s = 0.0
        """Seconds measured in all."""
        self._in_c = False
        self._since = 0.0
        self._stack: list[bool] = []

    @contextmanager
    def measure(self) -> Iterator[None]:
        """Measure the block's time (nothing where a profiler is already installed)."""
        if sys.getprofile() is not None:
            yield
            return
        self._in_c, self._stack = False, []
        start = time.perf_counter()
        sys.setprofile(self._event)
        try:
            yield
        finally:
            sys.setprofile(None)
            end = time.perf_counter()
            if self._in_c:
                self.c_s += end - self._since
            self.measured_s += end - start

    def held_share(self) -> float | None:
        """The share of the measured time in Python bytecode (None: nothing measured)."""
        if self.measured_s <= 0:
            return None
        return max(0.0, 1.0 - self.c_s / self.measured_s)

    def take(self) -> tuple[float, float]:
        """(seconds in Python bytecode, seconds measured) since the last call."""
        taken = (max(0.0, self.measured_s - self.c_s), self.measured_s)
        self.c_s = self.measured_s = 0.0
        return taken

    def _event(self, frame: FrameType, event: str, arg: Any) -> None:
        # A stack of "in C" states, one per call: a C function's time runs from its call to
        # its return, less the Python functions it calls back (map, sorted with a key, a
        # generator it consumes). This hook is Python too: a C span starts when it ends.
        if event == "c_call":
            self._stack.append(self._in_c)
            if not self._in_c:
                self._in_c = True
                self._since = time.perf_counter()
        elif event in ("c_return", "c_exception"):
            self._leave(time.perf_counter())
        elif event == "call":
            self._stack.append(self._in_c)
            if self._in_c:
                self.c_s += time.perf_counter() - self._since
                self._in_c = False
        elif event == "return":
            self._leave(time.perf_counter())

    def _leave(self, now: float) -> None:
        if not self._stack:
            return  # a frame entered before the measure began
        outer, was_in_c = self._stack.pop(), self._in_c
        if was_in_c and not outer:
            self.c_s += now - self._since
        self._in_c = outer
        if outer and not was_in_c:
            self._since = time.perf_counter()  # back in the C function that called
