"""Benchmark scenarios: named, reproducible recipes for what changes during a timed run.

Each recipe acts on the timed window of ``n`` batches, split in thirds by batch index (not by
seconds, so every system meets the change at the same point of its work):

- ``steady``: nothing changes.
- ``cpu-contention``: a separate process burns one core (a busy loop) for the middle third.
- ``consumer-shift``: the training step takes 2x as long in the middle third, then half as
  long (2x faster than at the start) in the last third; needs a ``sleep`` consumer.
- ``slow-io``: every file read goes through a throttle shared by all processes: 20 MB/s in
  all plus 5 ms per read (a network file system or a cold, busy disk); for workloads that
  read files.

The recipes live in one module, not one file each, because each is a few lines.
"""

from __future__ import annotations

import subprocess
import sys
import time
from typing import ClassVar

from drapps.bench.throttle import IoThrottle
from drapps.registry import Registry

SLOW_IO_MB_PER_S = 20.0
SLOW_IO_LATENCY_MS = 5.0


class LoadScenario:
    """Steady load; subclasses change something mid-run."""

    name: ClassVar[str] = "steady"
    summary: ClassVar[str] = "nothing changes"
    needs_sleep_consumer: ClassVar[bool] = False
    needs_file_reads: ClassVar[bool] = False
    span_label: ClassVar[str | None] = None
    """What runs during :meth:`changed_batches`, in a plot's legend; None: nothing does."""

    def __init__(self) -> None:
        self.spans: list[tuple[float, float | None]] = []
        """``[start, end]`` ``time.perf_counter()`` readings of each time the change ran
        (``end`` None while it runs); the case records them against its timed window."""

    @classmethod
    def changed_batches(cls, n: int) -> tuple[int, int] | None:
        """The timed batches ``[first, last)`` of ``n`` before which the change starts and
        stops, or None where nothing starts and stops."""
        return None

    def throttle(self) -> IoThrottle | None:
        """The read throttle the workload's dataset goes through, if this scenario has one."""
        return None

    def before_batch(self, b: int, n: int) -> float:
        """Called before timed batch ``b`` of ``n``; returns the consumer step's factor."""
        return 1.0

    def helper_pids(self) -> set[int]:
        """Processes this scenario started (left out of the loaders' CPU and memory)."""
        return set()

    def stop(self) -> None:
        """Undo whatever the scenario started; safe to call twice."""


class Steady(LoadScenario):
    pass


class CpuContention(LoadScenario):
    name = "cpu-contention"
    summary = "a separate process burns one core for the middle third of the timed batches"
    span_label = "CPU hog running"

    def __init__(self) -> None:
        super().__init__()
        self._hog: subprocess.Popen[bytes] | None = None

    @classmethod
    def changed_batches(cls, n: int) -> tuple[int, int]:
        return n // 3, 2 * n // 3

    def before_batch(self, b: int, n: int) -> float:
        first, last = self.changed_batches(n)
        if b == first and self._hog is None:
            self._hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            self.spans.append((time.perf_counter(), None))
        elif b == last:
            self.stop()
        return 1.0

    def helper_pids(self) -> set[int]:
        return {self._hog.pid} if self._hog is not None else set()

    def stop(self) -> None:
        if self._hog is not None:
            self._hog.kill()
            self._hog.wait()
            self._hog = None
            self.spans[-1] = (self.spans[-1][0], time.perf_counter())


class ConsumerShift(LoadScenario):
    name = "consumer-shift"
    summary = "the training step gets 2x slower for the middle third, then 2x faster than at first"
    needs_sleep_consumer = True

    def before_batch(self, b: int, n: int) -> float:
        if b < n // 3:
            return 1.0
        return 2.0 if b < 2 * n // 3 else 0.5


class SlowIo(LoadScenario):
    name = "slow-io"
    summary = (
        f"file reads throttled to {SLOW_IO_MB_PER_S:g} MB/s shared by all readers, "
        f"plus {SLOW_IO_LATENCY_MS:g} ms per read"
    )
    needs_file_reads = True

    def __init__(self) -> None:
        super().__init__()
        self._throttle: IoThrottle | None = None

    def throttle(self) -> IoThrottle | None:
        if self._throttle is None:
            self._throttle = IoThrottle(SLOW_IO_MB_PER_S, SLOW_IO_LATENCY_MS)
        return self._throttle

    def stop(self) -> None:
        if self._throttle is not None:
            self._throttle.close()
            self._throttle = None


SCENARIOS: Registry[type[LoadScenario]] = Registry("scenario")
"""Load scenarios by name (``drapps bench --scenario``)."""
for _scenario in (Steady, CpuContention, ConsumerShift, SlowIo):
    SCENARIOS.register(_scenario.name, _scenario)


def scenario_class(name: str) -> type[LoadScenario]:
    """The scenario registered as ``name``; the error lists the valid names."""
    return SCENARIOS.get(name)
