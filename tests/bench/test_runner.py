"""Smoke size of the benchmark harness: correctness only, never a speed."""

from pathlib import Path

import pytest

from drapps.bench.report import markdown
from drapps.bench.runner import BenchConfig, run_benchmark
from drapps.cli import main


def test_every_case_runs_and_delivers_full_batches(tmp_path: Path) -> None:
    config = BenchConfig(
        workers=(0, 2),
        batch_size=4,
        warmup_batches=2,
        measure_batches=4,
        repeats=2,
        images=32,
        resize_every=2,
        data_dir=tmp_path,
    )
    results = run_benchmark(config, progress=False)
    cases = {(r["system"], r["workers"]) for r in results["summary"]}
    assert cases == {
        ("torch", 0),
        ("torch", 2),
        ("drapps", 0),
        ("drapps", 2),
        ("drapps-resizing", 2),
    }
    assert len(results["runs"]) == 2 * len(cases)
    for run in results["runs"]:
        assert run["samples_per_s"] > 0 and run["wait_p50_ms"] >= 0
    assert results["environment"]["torch"]
    table = markdown(results)
    assert "| 2 |" in table and "Resize probe" in table


def test_config_errors_are_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"systems must be among \['torch', 'drapps'\]"):
        BenchConfig(systems=("tf",), data_dir=tmp_path)
    with pytest.raises(ValueError, match=r"images=10 is fewer than one batch \(batch_size=32\)"):
        BenchConfig(images=10, data_dir=tmp_path)


def test_cli_reports_bad_options(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["bench", "--images", "10", "--data-dir", str(tmp_path)]) == 2
    assert "images=10 is fewer than one batch" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "--workers", "two"])
    assert "expected comma-separated ints" in capsys.readouterr().err


def test_scenario_consumers_and_auto_run(tmp_path: Path) -> None:
    config = BenchConfig(
        workers=(1,),
        systems=("torch",),
        batch_size=4,
        warmup_batches=1,
        measure_batches=12,  # 8 batches an epoch: the run crosses into the next epoch
        repeats=1,
        images=32,
        consumer="cpu-model",
        scenario="cpu-hog",
        auto=True,
        resize_probe=False,
        data_dir=tmp_path,
    )
    results = run_benchmark(config, progress=False)
    cases = {(r["system"], r["workers"]) for r in results["runs"]}
    assert cases == {("torch", 1), ("drapps-auto", "auto")}
    assert all(0 <= r["wait_fraction"] <= 1 for r in results["runs"])
    table = markdown(results)
    assert "Scenario `cpu-hog`, consumer `cpu-model`" in table
    assert 'drapps, workers="auto"' in table and "x the best static" in table


def test_scenario_options_are_checked(tmp_path: Path) -> None:
    with pytest.raises(
        ValueError, match=r"consumer must be one of \['none', 'sleep', 'cpu-model'\]"
    ):
        BenchConfig(consumer="gpu", data_dir=tmp_path)
    with pytest.raises(ValueError, match="scenario must be one of"):
        BenchConfig(scenario="earthquake", data_dir=tmp_path)
    with pytest.raises(ValueError, match="the sleep consumer needs step_ms > 0"):
        BenchConfig(consumer="sleep", data_dir=tmp_path)
