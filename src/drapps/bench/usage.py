"""What a system's processes use while it runs: peak memory and CPU time of the process tree.

The tree is this process and its descendants, less the helpers a scenario started. A sampler
thread reads each process every ``interval`` seconds; CPU time is counted per process between
the window's start and its end, so workers that a system starts or retires mid-run are
counted too (a retired worker up to its last reading, at most one interval short).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import psutil

_Key = tuple[int, float]  # (pid, create time): a reused pid is another process


def process_tree(exclude: set[int]) -> list[psutil.Process]:
    """This process and its live descendants, less the pids in ``exclude``."""
    me = psutil.Process()
    return [p for p in [me, *me.children(recursive=True)] if p.pid not in exclude]


class TreeUsage:
    """Samples the process tree: the peak of its summed RSS, and CPU seconds over a window.

    RSS counts a shared page once per process that maps it, so shared-memory batches and
    copy-on-write pages after fork are counted in each worker: an upper bound, the same for
    every system.

    Args:
        exclude: the pids to leave out, asked at every reading (a scenario's helpers).
        interval: seconds between two readings.

    Example:
        >>> usage = TreeUsage(set)
        >>> usage.open_window()
        >>> total, mine = usage.close_window()
        >>> usage.stop()
        >>> total >= mine >= 0.0
        True
    """

    def __init__(self, exclude: Callable[[], set[int]], interval: float = 0.05) -> None:
        self._exclude, self._interval = exclude, interval
        self.peak = 0
        """The highest summed RSS read, in bytes."""
        self._lock = threading.Lock()
        self._cpu: dict[_Key, float] = {}  # the last reading of each process seen
        self._base: dict[_Key, float] | None = None  # at the window's start; None: no window
        self._me: _Key | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-usage", daemon=True)
        self._thread.start()

    def sample(self) -> dict[_Key, float]:
        """Read every process of the tree once; its CPU seconds by process."""
        total, read = 0, {}
        for process in process_tree(self._exclude()):
            try:
                with process.oneshot():
                    key = (process.pid, process.create_time())
                    total += process.memory_info().rss
                    times = process.cpu_times()
            except psutil.Error:
                continue
            read[key] = times.user + times.system
        with self._lock:
            self.peak = max(self.peak, total)
            self._cpu.update(read)
            if self._base is not None:
                for key in read.keys() - self._base.keys():
                    self._base[key] = 0.0  # born inside the window: all its CPU is in it
        return read

    def open_window(self) -> None:
        """Start counting CPU time from now, for the processes alive now and any born later."""
        me = psutil.Process()
        self._me = (me.pid, me.create_time())
        read = self.sample()
        with self._lock:
            self._base = read

    def close_window(self) -> tuple[float, float]:
        """CPU seconds the tree used since :meth:`open_window`, and this process's share."""
        self.sample()
        with self._lock:
            base, self._base = self._base or {}, None
            used = {key: self._cpu[key] - cpu for key, cpu in base.items() if key in self._cpu}
        return sum(used.values()), used.get(self._me, 0.0) if self._me else 0.0

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.sample()

    def stop(self) -> None:
        """Stop sampling (after one last reading)."""
        self._stop.set()
        self._thread.join(timeout=5)
        self.sample()
