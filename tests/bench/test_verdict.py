"""The bench's verdict: paired ratios with an interval, "not separable", and the busy machine."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from fake_runs import results, runs

from drapps.bench.report import brief
from drapps.bench.runner import QUICK_SYSTEMS, BenchConfig, chosen_systems
from drapps.bench.verdict import OutsideLoad, busy_reasons, comparisons, settled, verdict
from drapps.runtime.config import usable_cores


def test_a_steady_lead_is_named_with_its_interval() -> None:
    # The machine drifts between repeats, but drapps leads by ~10% within every repeat.
    found = runs(
        {
            "dataloader-2": [1000, 800, 1200, 900],
            "dataloader-4": [950, 760, 1150, 860],
            "drapps-heuristic": [1100, 885, 1315, 995],
        }
    )
    (comparison, _, other), *_ = comparisons(found)
    assert other == "the best fixed DataLoader (dataloader-2)"
    assert comparison.separated and 1.09 < comparison.ratio < 1.11
    assert comparison.low > 1.0 and comparison.pairs == 4
    said = "\n".join(verdict(results(found)))
    assert "drapps was 1.10x the best fixed DataLoader (dataloader-2) (95% interval 1.0" in said
    assert "busy" not in said
    assert settled(found)


def test_a_gap_inside_the_noise_is_not_separable() -> None:
    found = runs(
        {
            "dataloader-2": [1000, 1000, 1000],
            "drapps-heuristic": [1150, 880, 1020],
            "tf-autotune": [1000, 1010, 990],
        }
    )
    said = "\n".join(verdict(results(found)))
    assert "drapps and the best fixed DataLoader (dataloader-2) were not separable" in said
    assert "drapps and tf.data AUTOTUNE were not separable" in said
    assert "were not separable (1.01x" in said
    assert "differences under" in said and "are noise on this run" in said
    assert not settled(found)


def test_one_repeat_is_never_a_verdict() -> None:
    found = runs({"dataloader-2": [1000], "drapps-heuristic": [2000]})
    said = "\n".join(verdict(results(found)))
    assert "were not separable (2.00x, no interval from one repeat)" in said
    busy = "\n".join(verdict(results(found, outside_load=[0.9])))
    assert "drapps measured 2.00x the best fixed DataLoader (dataloader-2) (no interval" in busy


def test_a_busy_machine_names_no_winner() -> None:
    found = runs({"dataloader-2": [1000, 800, 1200, 900], "drapps-heuristic": [700, 560, 840, 630]})
    busy = results(found, outside_load=[0.02, 0.48, 0.05, 0.04])
    said = "\n".join(verdict(busy))
    assert "the machine was busy: processes outside the benchmark used up to 48%" in said
    assert "No winner is named" in said and "drapps measured 0.70x" in said
    assert " was 0.70x" not in said
    swinging = results(found, limit={"image": {"per_core_min": 349.0, "per_core_max": 846.0}})
    assert busy_reasons(swinging) == [
        "its own per-core speed on `image` swung from 349 to 846 samples/s between repeats"
    ]
    quiet = results(
        found,
        outside_load=[0.01, 0.02],
        limit={"image": {"per_core_min": 800.0, "per_core_max": 846.0}},
    )
    assert busy_reasons(quiet) == []
    assert "drapps was 0.70x" in "\n".join(verdict(quiet))


@pytest.mark.timeout(60)
def test_outside_load_sees_a_process_the_bench_did_not_start() -> None:
    load = OutsideLoad()
    load.start()
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(1.5)
        share = load.share()
    finally:
        hog.kill()
        hog.wait()
    # One busy core of the usable ones, whatever else the machine runs (more only adds).
    assert share > 0.5 / usable_cores()


def test_the_quick_run_compares_drapps_dataloader_and_tf_under_changing_load() -> None:
    config = BenchConfig.quick()
    cores = usable_cores()
    assert config.scenarios == ("steady", "cpu-contention") and config.consumer == "none"
    assert config.workers == tuple(sorted({cores, cores + 1, 2 * cores}))
    assert config.repeats >= 3 and config.max_repeats and config.budget_s
    run, skipped = chosen_systems(config)
    assert set(run) | set(skipped) == set(QUICK_SYSTEMS) and "drapps-heuristic" in run
    with pytest.raises(ValueError, match="max_repeats must be >= repeats"):
        BenchConfig.quick(repeats=5, max_repeats=4)
    with pytest.raises(ValueError, match="budget_s must be > 0"):
        BenchConfig.quick(budget_s=0)


def test_the_terminal_brief_is_narrow_and_ends_with_the_verdict() -> None:
    found = runs({"dataloader-2": [1000, 900, 1100], "drapps-heuristic": [1100, 990, 1210]})
    summary = [
        {
            "workload": "image",
            "scenario": "steady",
            "case": case,
            "system": case.rsplit("-", 1)[0] if case.startswith("data") else case,
            "samples_per_s": rate,
            "samples_per_s_mean": rate,
            "samples_per_s_ci95": 50.0,
            "wait_fraction": 1.0,
            "final_workers": [2, 2, 3],
        }
        for case, rate in (("dataloader-2", 1000.0), ("drapps-heuristic", 1100.0))
    ]
    text = brief(
        results(found, summary=summary, workloads={"image": ""}, config={"consumer": "none"})
    )
    assert max(len(line) for line in text.splitlines()) <= 100
    assert "loop waited" not in text  # with no training step the loop always waits
    assert text.splitlines()[-1].startswith("- differences under")
    assert "drapps was 1.10x the best fixed DataLoader" in text
