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
from dataclasses import fields
from typing import TYPE_CHECKING, Any

from drapps.control.controller import Bounds, Controller, Tick
from drapps.control.policy import Policy, make_policy
from drapps.runtime.dispatcher import Dispatcher
from drapps.telemetry.monitor import Monitor, PipelineSnapshot
from drapps.telemetry.trace import TraceRow, TraceWriter

if TYPE_CHECKING:
    from drapps.loader import Loader

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
        grant: Callable[[int, int], int] | None = None,
    ) -> None:
        self.monitor = Monitor(snapshot)
        actuators = _DispatcherActuators(dispatcher) if dispatcher else _NoActuators()
        self.controller = Controller(
            self.monitor.sample,
            policy,
            actuators,
            bounds,
            interval=interval,
            on_tick=self._record,
            grant=grant,
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
            return snapshot_of(alive)

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
            applied=dict(tick.applied),
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


def make_tuner(loader: Loader) -> AutoTuner | None:
    """The tuner a loader needs: a controller for workers="auto", else telemetry only if a
    trace or progress line was asked for, else none."""
    c = loader.config
    auto = c.workers == "auto" and loader._dispatcher is not None
    if not (auto or c.trace or c.progress):
        return None
    if not auto:
        policy: Policy = make_policy("static")  # telemetry only: nothing to tune
    elif isinstance(c.policy, str):
        policy = make_policy(c.policy)
    else:
        policy = c.policy
    limit = c.resolved_max_workers
    bounds = Bounds(
        min_workers=c.min_workers if auto else 1,
        max_workers=limit,
        max_prefetch=4 * limit,
        adjust_workers=auto,
        adjust_prefetch=auto and c.prefetch == "auto",
    )
    return AutoTuner.for_loader(
        loader,
        policy=policy,
        bounds=bounds,
        interval=c.control_interval,
        trace_path=c.trace,
        progress=c.progress,
        config={f.name: _plain(getattr(c, f.name)) for f in fields(c)},
        grant=loader._budget.grant if auto and loader._budget is not None else None,
    )


def snapshot_of(loader: Loader) -> PipelineSnapshot:
    """The loader's pipeline counters now, for the Monitor."""
    d = loader._dispatcher
    if d is None:
        return PipelineSnapshot(
            samples=loader._samples,
            wait_s=loader._inline_wait_s,
            queue_batches=0,
            queue_bytes=0,
            memory_budget=loader._memory_budget,
            workers=0,
            max_workers=0,
            prefetch=0,
            worker_pids=(),
        )
    counters = d.snapshot()
    return PipelineSnapshot(
        samples=loader._samples,
        wait_s=d.buffer.waited_s(),
        queue_batches=len(d.buffer),
        queue_bytes=d.buffer.bytes,
        memory_budget=loader._memory_budget,
        workers=len(d.pool.live()),
        max_workers=loader.config.resolved_max_workers,
        prefetch=d.prefetch_depth,
        worker_pids=d.pool.pids(),
        latencies=tuple(d.latencies),
        stage_s={k: counters[k] for k in ("fetch_s", "transform_s", "collate_s", "transport_s")},
    )


def _plain(value: Any) -> Any:
    """A config value as the trace header stores it: itself if JSON-plain, else its repr."""
    return value if isinstance(value, int | float | str | bool | type(None)) else repr(value)
