"""Wiring between a loader's pipeline and its telemetry and control: Monitor -> Controller -> knobs.

It is given a snapshot function and the knobs, never the loader, so a loader with a controller
thread can still be garbage-collected (its finalizer stops this first).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import fields
from typing import Any

from drapps.control.controller import Bounds, Controller, Tick
from drapps.control.knobs import Knob
from drapps.control.policy import Policy, make_policy
from drapps.engines.base import Engine
from drapps.runtime.config import LoaderConfig
from drapps.runtime.stats import PipelineSnapshot
from drapps.telemetry.monitor import Monitor
from drapps.telemetry.status import StatusLine
from drapps.telemetry.trace import TraceRow, TraceWriter

_KEPT_ROWS = 20_000  # ~3 hours at the default 0.5 s tick


class AutoTuner:
    """A loader's Monitor and Controller, with its trace, history and progress line."""

    def __init__(
        self,
        snapshot: Callable[[], PipelineSnapshot],
        knobs: Sequence[Knob],
        policy: Policy,
        *,
        interval: float,
        trace_path: str | None,
        progress: bool,
        config: dict[str, Any],
    ) -> None:
        self.monitor = Monitor(snapshot)
        self.controller = Controller(
            self.monitor.sample,
            policy,
            knobs=knobs,
            interval=interval,
            on_tick=self._record,
        )
        self.rows: deque[TraceRow] = deque(maxlen=_KEPT_ROWS)
        self.writer = TraceWriter(trace_path, config) if trace_path else None
        self.status = StatusLine() if progress else None
        self._started = self._stopped = False

    def start(self) -> None:
        """Start ticking (the first call measures from now; later ones do nothing)."""
        if not self._stopped and not self._started:
            self._started = True
            self.monitor.begin()
            self.controller.start()

    def stop(self) -> None:
        """Stop ticking, write the status line of a span still open, and close the trace.
        Idempotent."""
        self._stopped = True
        self.controller.stop()
        if self.status is not None:
            self.status.finish()
        if self.writer is not None:
            self.writer.close()

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
            notes=dict(tick.notes),
        )
        self.rows.append(row)
        if self.writer is not None:
            self.writer.write(row)
        if self.status is not None:
            self.status.observe(row)


def make_tuner(
    config: LoaderConfig,
    snapshot: Callable[[], PipelineSnapshot],
    engine: Engine,
    grant: Callable[[int, int], int] | None = None,
    knobs: Sequence[Knob] = (),
) -> AutoTuner | None:
    """The tuner a loader needs: a controller over the knobs left to it, or, with none left
    to it, one whose static policy only records (for the report, a trace and the status
    line); none with ``telemetry=False``.

    Args:
        snapshot: the pipeline's counters (it must not hold the loader, which has to stay
            collectable while the controller runs).
        engine: makes the batches and owns the workers and prefetch knobs.
        grant: the host's share of cores, see :class:`~drapps.control.knobs.WorkersKnob`.
        knobs: the other owners' knobs (the split, the codec), asked after the engine's.
    """
    c = config
    auto_workers = c.workers == "auto" and engine.tunable
    auto = engine.tunable and (auto_workers or any(k.adjustable for k in knobs))
    if not c.telemetry:
        # The config refused every setting that reads it; an automatic codec keeps its first.
        return None
    if not auto:
        policy: Policy = make_policy("static")  # telemetry only: nothing to tune
    elif isinstance(c.policy, str):
        policy = make_policy(c.policy)
    else:
        policy = c.policy
    limit = c.resolved_max_workers
    bounds = Bounds(
        min_workers=c.min_workers if auto_workers else 1,
        max_workers=limit,
        max_prefetch=4 * limit,
        adjust_workers=auto_workers,
        adjust_prefetch=auto_workers and c.prefetch == "auto",
    )
    return AutoTuner(
        snapshot,
        [*engine.knobs(bounds, grant if auto_workers else None), *knobs],
        policy,
        interval=c.control_interval,
        trace_path=c.trace,
        progress=c.progress,
        config={f.name: _plain(getattr(c, f.name)) for f in fields(c)},
    )


def _plain(value: Any) -> Any:
    """A config value as the trace header stores it: itself if JSON-plain, else its repr."""
    return value if isinstance(value, int | float | str | bool | type(None)) else repr(value)
