"""The 95% interval the bench and the ablation tables print."""

from __future__ import annotations

import math
import random

import pytest

from drapps.bench.confidence import describe_interval, mean_interval
from drapps.bench.runner import summarize


def test_the_interval_matches_students_t() -> None:
    mean, half = mean_interval([10.0, 12.0, 11.0])  # type: ignore[misc]
    assert mean == 11.0 and half == pytest.approx(4.303 * 1.0 / math.sqrt(3), rel=1e-4)
    assert mean_interval([5.0]) is None and mean_interval([1.0, math.inf]) is None
    assert describe_interval([1.0]) == "-" and describe_interval([2.0, 4.0]) == "3 +- 13"


def test_it_covers_the_mean_about_95_percent_of_the_time() -> None:
    rng = random.Random(0)
    hits = 0
    for _ in range(2000):
        values = [rng.gauss(100.0, 5.0) for _ in range(3)]
        mean, half = mean_interval(values)  # type: ignore[misc]
        hits += abs(mean - 100.0) <= half
    assert 0.93 <= hits / 2000 <= 0.97


def test_the_bench_summary_carries_the_interval() -> None:
    runs = [
        {"workload": "w", "scenario": "s", "case": "c", "system": "x", "workers": 1,
         "final_workers": 1, "samples_per_s": rate, "repeat": k}
        for k, rate in enumerate([100.0, 110.0, 105.0])
    ]  # fmt: skip
    (row,) = summarize(runs)
    assert row["samples_per_s_mean"] == 105.0
    assert row["samples_per_s_ci95"] == pytest.approx(4.303 * 5.0 / math.sqrt(3), rel=1e-4)
