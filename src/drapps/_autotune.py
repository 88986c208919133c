"""Wiring between a Loader and its telemetry and control: Monitor -> Controller -> actuators.

Holds the loader only through a weak reference, so a loader with a controller thread can still
be garbage-collected (its finalizer stops this first).
"""

from __future__ import annotations

import sys
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from drapps.control.controller import Bounds, Controller, Tick
from drapps.control.policy import Policy
from drapps.runtime.dispatcher import Dispatcher
from drapps.telemetry.monitor import Monitor, PipelineSnapshot
from drapps.telemetry.trace import TraceRow, TraceWriter

_KEPT_ROWS = 20_000  # ~3 hours at the default 0.5 s tick


class _DispatcherActuators:
    def __init__(self, dispatcher: Dispatcher) -> None:
        self._dispatcher = dispatcher

    def resize(self, workers: int) -> None:
        self._dispatcher.resize(workers)

    def set_prefetch(self, depth: int) -> None:
        self._dispatcher.set_prefetch(depth)

    def batch_bytes(self) -> int:
        return self._dispatcher.batch_bytes()


class _NoActuators:
    """For loaders without a pool (workers=0): observed, never actuated."""

    def resize(self, workers: int) -> None:
        raise RuntimeError("a loader with workers=0 has no pool to resize")

    def set_prefetch(self, depth: int) -> None:
        raise RuntimeError("a loader with workers=0 has no prefetch to set")

    def batch_bytes(self) -> int:
        return 0


class AutoTuner:
    """A loader's Monitor and Controller, with its trace, history and progress line."""

    def __init__(
        self,
        snapshot: Callable[[], PipelineSnapshot],
        dispatcher: Dispatcher | None,
        policy: Policy,
        bounds: Bounds,
        *,
        interval: float,
        trace_path: str | None,
        progress: bool,
        config: dict[str, Any],
    ) -> None:
        self.monitor = Monitor(snapshot)
        actuators = _DispatcherActuators(dispatcher) if dispatcher else _NoActuators()
        self.controller = Controller(
            self.monitor.sample, policy, actuators, bounds, interval=interval, on_tick=self._record
        )
        self.rows: deque[TraceRow] = deque(maxlen=_KEPT_ROWS)
        self.writer = TraceWriter(trace_path, config) if trace_path else None
        self.progress = progress
        self._last_progress = 0.0
        self._stopped = False

    @classmethod
    def for_loader(cls, loader: Any, **kwargs: Any) -> AutoTuner:
        ref = weakref.ref(loader)

        def snapshot() -> PipelineSnapshot:
            alive = ref()
            if alive is None:
                raise RuntimeError("the loader was garbage-collected")
            return alive._pipeline_snapshot()

        return cls(snapshot, loader._dispatcher, **kwargs)

    def start(self) -> None:
        if not self._stopped:
            self.controller.start()

    def stop(self) -> None:
        """Stop ticking and close the trace. Idempotent."""
        self._stopped = True
        self.controller.stop()
        if self.writer is not None:
            self.writer.close()
        if self.progress and self._last_progress and sys.stderr.isatty():
            sys.stderr.write("\n")

    def _record(self, tick: Tick) -> None:
        snapshot = self.monitor.last_snapshot
        row = TraceRow(
            t=tick.state.t,
            state=tick.state,
            action=tick.action,
            applied={"workers": tick.workers, "prefetch": tick.prefetch},
            reward=tick.reward,
            workers={str(pid): v for pid, v in self.monitor.per_worker.items()},
            stages=dict(snapshot.stage_s) if snapshot is not None else {},
        )
        self.rows.append(row)
        if self.writer is not None:
            self.writer.write(row)
        if self.progress:
            self._show(tick)

    def _show(self, tick: Tick) -> None:
        s = tick.state
        line = (
            f"[drapps] {s.throughput:7.0f} samples/s | waited {s.wait_fraction:4.0%} | "
            f"workers {tick.workers} | ready {s.queue_batches}/{tick.prefetch} | "
            f"cpu {s.cpu_util:4.0%} | rss {s.rss_bytes / 2**30:.2f} GiB"
        )
        now = time.monotonic()
        if sys.stderr.isatty():
            sys.stderr.write("\r" + line)
            sys.stderr.flush()
            self._last_progress = now
        elif now - self._last_progress >= 10.0:  # a log file gets a line every 10 s
            sys.stderr.write(line + "\n")
            self._last_progress = now
