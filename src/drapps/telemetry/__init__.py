"""Telemetry: the Monitor that makes States, JSONL traces, the bottleneck report and the
status line."""

from drapps.runtime.stats import PipelineSnapshot
from drapps.telemetry.monitor import Monitor
from drapps.telemetry.report import bottleneck_report
from drapps.telemetry.status import StatusLine
from drapps.telemetry.trace import TRACE_VERSION, Trace, TraceRow, TraceWriter, read_trace

__all__ = [
    "TRACE_VERSION",
    "Monitor",
    "PipelineSnapshot",
    "StatusLine",
    "Trace",
    "TraceRow",
    "TraceWriter",
    "bottleneck_report",
    "read_trace",
]
