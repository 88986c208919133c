"""What the bench's plots draw, checked on the data made for them (no pixels)."""

from __future__ import annotations

from typing import Any

import pytest
from fake_runs import runs

from drapps.bench.plots import (
    load_span,
    load_spans,
    over_time_curves,
    styles,
    throughput_bars,
)
from drapps.bench.scenarios import CpuContention


def timed(found: list[dict[str, Any]], batches: int = 30, spans: bool = True) -> dict[str, Any]:
    """``found`` with a timeline of ``batches`` each (a batch every 10 ms x the case's place)
    and, where ``spans``, the hog's span as a run records it."""
    for i, run in enumerate(found):
        step = 0.01 * (1 + i % 3)
        run["timeline"] = [[round(step * (b + 1), 4), 0.0] for b in range(batches)]
        run["batch_size"] = 32
        if spans:
            run["load_spans"] = [[step * (batches // 3), step * (2 * batches // 3)]]
    return {"runs": found}


def test_throughput_bars_never_reach_below_zero_samples_per_second() -> None:
    # Wildly different repeats, the kind that took mean - sd below zero.
    record = timed(
        runs({"dataloader-2": [20.0, 1500.0, 3000.0], "drapps-heuristic": [5.0, 900.0, 4000.0]})
    )
    bars = throughput_bars(record, "image", "steady")
    assert [b.case for b in bars] == ["drapps-heuristic", "dataloader-2"]  # lowest median first
    for bar in bars:
        assert bar.below >= 0 and bar.above >= 0
        assert bar.median - bar.below >= 0  # the lower end: the slowest repeat
    drapps = bars[0]
    assert (drapps.median - drapps.below, drapps.median + drapps.above) == (5.0, 4000.0)
    assert bars[1].label == "dataloader-2 (best DataLoader)"


def test_each_dataloader_count_has_its_own_colour_marker_and_legend_entry() -> None:
    cases = ["dataloader-2", "dataloader-3", "dataloader-4", "dataloader-10", "drapps-heuristic"]
    look = styles(cases, best="dataloader-4")
    loaders = [c for c in cases if c.startswith("dataloader")]
    colours = [look[c]["color"] for c in loaders]
    assert len(set(colours)) == len(loaders)
    assert len({look[c]["marker"] for c in loaders}) == len(loaders)
    assert len({look[c]["hatch"] for c in loaders}) == len(loaders)
    # More workers darker: the grey levels fall with the count (10 after 4, not after 1).
    levels = [int(colour[1:3], 16) for colour in colours]
    assert levels == sorted(levels, reverse=True)
    assert look["dataloader-4"]["linewidth"] > look["dataloader-2"]["linewidth"]  # the best
    assert look["drapps-heuristic"]["color"] not in colours
    record = timed(runs({c: [1000.0 + i, 990.0 + i] for i, c in enumerate(cases)}))
    labels = [label for _, label in over_time_curves(record, "image", "steady")]
    assert all(any(label.startswith(c) for label in labels) for c in loaders)
    assert "dataloader-10 (best DataLoader)" in labels  # the highest median here


def test_the_hog_span_comes_from_the_runs_record_of_it() -> None:
    record = timed(
        runs(
            {"dataloader-2": [1000.0, 900.0], "drapps-heuristic": [1100.0, 950.0]}, "cpu-contention"
        )
    )
    spans = load_spans(record, "image", "cpu-contention")
    assert set(spans) == {"dataloader-2", "drapps-heuristic"}
    for start, end in spans.values():
        assert 0 < start < end
    steady = timed(runs({"dataloader-2": [1000.0]}), spans=False)
    assert load_spans(steady, "image", "steady") == {}


def test_results_from_before_the_spans_were_recorded_take_them_from_the_timeline() -> None:
    (run,) = timed(runs({"dataloader-2": [1000.0]}, "cpu-contention"), spans=False)["runs"]
    # 30 batches of 10 ms: the hog started before batch 10 (at 0.10 s) and stopped before 20.
    assert load_span(run, "cpu-contention") == pytest.approx((0.10, 0.20))
    assert load_span(run, "steady") is None


@pytest.mark.timeout(30)
def test_the_cpu_hog_records_when_it_ran() -> None:
    scenario = CpuContention()
    try:
        for b in range(9):
            scenario.before_batch(b, 9)
            if b == 4:
                assert scenario.helper_pids()  # running in the middle third
    finally:
        scenario.stop()
    ((start, end),) = scenario.spans
    assert end is not None and start < end
    assert CpuContention.changed_batches(9) == (3, 6)
