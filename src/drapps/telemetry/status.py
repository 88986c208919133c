"""The status line of ``progress=True``: averages over spans of a few seconds, printed once
there is something to say."""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from typing import TextIO

from drapps.telemetry.trace import TraceRow, while_loading

STATUS_EVERY_S = 5.0
"""Seconds a status line averages over on a terminal (twice that into a file or a pipe)."""


class StatusLine:
    """Writes a whole line per span of telemetry rows: never one redrawn in place, which would
    take the user's own prints onto it, nor a rate over one tick, which flips between 0 and a
    burst.

    The first span starts with the first tick that delivered a batch (start-up says nothing
    of the rate), and a line is written once the span is ``every_s`` long (none for a span in
    which the loop neither took a batch nor waited for one). :meth:`finish` writes the span
    still open, so a run shorter than a span still gets its line.
    """

    def __init__(self, stream: TextIO | None = None, every_s: float | None = None) -> None:
        """
        Args:
            stream: where lines go (None: ``sys.stderr`` as it is when each is written).
            every_s: the span's length (None: :data:`STATUS_EVERY_S` on a terminal, twice
                that into a file or a pipe).
        """
        self._stream = stream
        if every_s is None:
            out = stream if stream is not None else sys.stderr
            tty = getattr(out, "isatty", lambda: False)()
            every_s = STATUS_EVERY_S if tty else 2 * STATUS_EVERY_S
        self.every_s = every_s
        self._span: list[TraceRow] = []
        self._span_start = 0.0
        self._last_t = 0.0
        self._written = False
        self._lock = threading.Lock()

    def observe(self, row: TraceRow) -> None:
        """Add one tick's row; write the span's line once it is ``every_s`` long."""
        with self._lock:
            if not self._span:
                if row.state.throughput <= 0 and not self._written:
                    self._last_t = row.t  # start-up: no batch yet
                    return
                self._span_start = self._last_t
            self._span.append(row)
            self._last_t = row.t
            if row.t - self._span_start >= self.every_s:
                if while_loading(self._span):  # not a loader left open after its loop
                    self._write(self._span)
                self._span = []

    def finish(self) -> None:
        """Write the open span's line, if the loop took a batch in it. Idempotent."""
        with self._lock:
            span, self._span = list(while_loading(self._span)), []
            if any(r.state.throughput > 0 for r in span):
                self._write(span)

    def _write(self, rows: Sequence[TraceRow]) -> None:
        self._written = True
        stream = self._stream if self._stream is not None else sys.stderr
        stream.write(format_line(rows, self._span_start) + "\n")
        stream.flush()


def format_line(rows: Sequence[TraceRow], since: float) -> str:
    """One status line: samples/s, the loop's wait and CPU averaged over ``rows`` (weighted by
    each tick's length, the first one's measured from ``since``), and the last tick's workers
    (the count asked of the pool), ready batches, prefetch and memory."""
    spans = [
        r.t - before for r, before in zip(rows, [since, *(r.t for r in rows[:-1])], strict=True)
    ]
    total = sum(spans) or 1.0
    rate = sum(r.state.throughput * dt for r, dt in zip(rows, spans, strict=True)) / total
    waited = sum(r.state.wait_fraction * dt for r, dt in zip(rows, spans, strict=True)) / total
    cpu = sum(r.state.cpu_util * dt for r, dt in zip(rows, spans, strict=True)) / total
    last = rows[-1]
    target = last.state.target_workers  # not the count running, 0 between two epochs
    workers = int(last.applied.get("workers", last.state.workers)) if target is None else target
    prefetch = int(last.applied.get("prefetch", last.state.prefetch))
    return (
        f"[drapps] {rate:7.0f} samples/s | waited {waited:4.0%} | workers {workers} "
        f"| ready {last.state.queue_batches} of prefetch {prefetch} | cpu {cpu:4.0%} "
        f"| memory {last.state.held_bytes / 2**30:.2f} GiB"
    )
