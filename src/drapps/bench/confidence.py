"""Confidence intervals for the few repeats a benchmark can afford.

A benchmark with 3 repeats gives a median and a range, which say nothing about how sure a
difference is. :func:`mean_interval` gives Student's t interval of the mean, so a table can say
whether two systems' intervals overlap.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

# Two-sided 95% quantiles of Student's t by degrees of freedom (1..30); normal beyond.
_T95 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def mean_interval(values: Sequence[float]) -> tuple[float, float] | None:
    """(mean, half-width) of the 95% t interval of the mean; None with fewer than 2 values.

    Example:
        >>> mean, half = mean_interval([10.0, 12.0, 11.0])
        >>> round(mean, 1), round(half, 2)
        (11.0, 2.48)
    """
    clean = [float(v) for v in values if v is not None and math.isfinite(v)]
    if len(clean) < 2 or len(clean) != len(values):
        return None
    df = len(clean) - 1
    t = _T95[df - 1] if df <= len(_T95) else 1.96
    return statistics.fmean(clean), t * statistics.stdev(clean) / math.sqrt(len(clean))


def describe_interval(values: Sequence[float], spec: str = ".0f") -> str:
    """``"mean +- half"`` for a table cell, or ``"-"`` when there is no interval."""
    interval = mean_interval(values)
    if interval is None:
        return "-"
    mean, half = interval
    return f"{format(mean, spec)} +- {format(half, spec)}"
