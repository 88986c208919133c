"""The tables and the verdict state the same figures, from one computation of them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from fake_runs import results, runs

from drapps.bench.figures import RATIO_STATISTIC, scenario_figures
from drapps.bench.report import brief, markdown
from drapps.bench.runner import summarize
from drapps.bench.verdict import verdict

# A busy machine: the repeats' load differs so much that the ratio of the two medians (900 /
# 700 = 1.29x) says something the repeats do not; paired by repeat, drapps was 1.10x, 1.80x
# and 0.79x the DataLoader: 1.16x, with an interval holding 1.
BUSY = {
    "dataloader-2": [1000.0, 500.0, 700.0],
    "dataloader-4": [950.0, 480.0, 650.0],
    "drapps-heuristic": [1100.0, 900.0, 550.0],
    "tf-autotune": [990.0, 700.0, 600.0],
}


MEASURED = {
    "workers": 2,
    "final_workers": 2,
    "wait_fraction": 1.0,
    "wait_p50_ms": 1.0,
    "wait_p99_ms": 2.0,
    "cpu_util": 0.9,
    "peak_rss_mib": 100.0,
    "first_batch_s": 0.2,
    "end_to_end_s": 3.0,
}
"""What a run measures besides its rate, all alike here."""


def written(tmp_path: Path, rates: dict[str, list[float]]) -> dict[str, Any]:
    """A results JSON as the runner writes it, read back."""
    found = [
        {**run, **MEASURED}
        for scenario in ("steady", "cpu-contention")
        for run in runs(rates, scenario=scenario)
    ]
    record = results(
        found,
        summary=summarize(found),
        workloads={"image": "JPEGs"},
        scenarios={"steady": "nothing changes", "cpu-contention": "a hog"},
        config={
            "consumer": "none",
            "measure_batches": 80,
            "warmup_batches": 8,
            "repeats": 3,
            "size": "quick",
        },
        environment={
            "usable_cores": 2,
            "cpu": "test",
            "memory_gib": 1,
            "torch": "-",
            "python": "-",
            "commit": "-",
        },
    )
    path = tmp_path / "results.json"
    path.write_text(json.dumps(record))
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


def table_row(text: str, scenario: str, case: str) -> list[str]:
    """The cells of ``case``'s row in the brief's table of ``scenario``."""
    block = text.split(f"image, {scenario}:\n", 1)[1].split("\n\n", 1)[0]
    line = next(line for line in block.splitlines() if line.split()[0] == case)
    return line.split()


@pytest.mark.parametrize("scenario", ["steady", "cpu-contention"])
def test_the_brief_table_and_the_verdict_state_the_same_ratio(
    tmp_path: Path, scenario: str
) -> None:
    record = written(tmp_path, BUSY)
    text = brief(record)
    _, median, spread, ratio, interval, *_ = table_row(text, scenario, "drapps-heuristic")
    assert (median, spread, ratio) == ("900", "550-1100", "1.16x")
    said = "\n".join(verdict(record))
    line = next(s for s in said.splitlines() if f"`{scenario}`" in s)
    assert (
        f"drapps and the best fixed DataLoader (dataloader-2) were not separable "
        f"({ratio}, 95% interval {interval}, 3 repeats)" in line
    )
    assert "1.29x" not in text  # the ratio of the medians is printed nowhere
    # The best count's row is marked, and its ratio to itself has no interval.
    assert table_row(text, scenario, "dataloader-2")[1:6] == ["*", "700", "500-1000", "1.00x", "-"]


def test_the_markdown_tables_state_the_verdicts_figures_and_say_which_statistic(
    tmp_path: Path,
) -> None:
    record = written(tmp_path, BUSY)
    found = scenario_figures(record["runs"], "image", "steady")
    (ours_vs_best, ours_vs_tf) = found.verdict
    table = markdown(record)
    cell = f"{ours_vs_best.ratio:.2f}x ({ours_vs_best.low:.2f}-{ours_vs_best.high:.2f})"
    assert "| drapps-heuristic | 900 (550-1100) | " in table and f"| {cell} |" in table
    assert f"{ours_vs_best.ratio:.2f}x, 95% interval {ours_vs_best.low:.2f}-" in table
    assert f"{ours_vs_tf.ratio:.2f}x, 95% interval" in table
    assert RATIO_STATISTIC in table
    assert "median of the repeats, with their min-max" in table


def test_the_brief_says_which_statistic_each_column_is(tmp_path: Path) -> None:
    text = brief(written(tmp_path, BUSY))
    legend = text.split("Verdict (")[0].replace("\n", " ")
    assert "samples/s: the median of 3 repeats, with their min-max" in legend
    assert "the geometric mean of the per-repeat ratios, and its 95% interval" in legend
    assert "The verdict states the same figures" in legend
    assert max(len(line) for line in text.splitlines()) <= 100


def test_every_ratio_the_brief_prints_is_a_paired_one(tmp_path: Path) -> None:
    record = written(tmp_path, BUSY)
    text = brief(record)
    for scenario in ("steady", "cpu-contention"):
        found = scenario_figures(record["runs"], "image", scenario)
        for case in found.cases:
            assert case.vs_best is not None
            cells = table_row(text, scenario, case.case)
            assert f"{case.vs_best.ratio:.2f}x" in cells
    assert re.search(r"\b1\.29x\b", markdown(record)) is None
