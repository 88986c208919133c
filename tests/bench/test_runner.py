"""Smoke size of the benchmark harness: every system delivers the expected batches; never a
speed (timings never decide a test)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from drapps.bench import BenchConfig, run_benchmark
from drapps.bench.plots import plot
from drapps.bench.report import markdown
from drapps.bench.runner import Progress
from drapps.bench.systems import SYSTEMS
from drapps.runtime.config import usable_cores
from drapps.telemetry.energy import WATTS_PER_CORE

pytestmark = pytest.mark.integration  # starts real engines or interpreters

CODECS = ("none", "lz4", "zstd", "quantize-16", "jpeg")
AVAILABLE = [
    name for name, system in SYSTEMS.items() if system.unavailable() is None and not system.opt_in
]


def check_runs(results: dict[str, Any], cases: set[tuple[str, str, str]], repeats: int) -> None:
    assert {(r["workload"], r["scenario"], r["case"]) for r in results["runs"]} == cases
    assert len(results["runs"]) == repeats * len(cases)
    for run in results["runs"]:
        assert run["shape_mismatch"] is None, run["case"]
        assert run["samples"] == run["expected_samples"], run["case"]
        assert len(run["timeline"]) == results["config"]["measure_batches"]
        assert run["samples_per_s"] > 0 and 0 <= run["wait_fraction"] <= 1
        assert run["peak_rss_mib"] > 0 and run["first_batch_s"] > 0
        assert run["end_to_end_s"] >= run["first_batch_s"]
        # CPU per batch: every process's, and the training process's share of it
        assert 0 <= run["loop_cpu_ms_per_batch"] <= run["cpu_ms_per_batch"], run["case"]
        assert run["cpu_ms_per_batch"] > 0, run["case"]
        # joules over the timed batches, and how they were counted
        timed = len(run["timeline"]) * run["batch_size"]
        assert run["energy_j"] > 0 and run["energy_source"], run["case"]
        assert run["mj_per_sample"] == pytest.approx(1000 * run["energy_j"] / timed)
        if "estimate" in run["energy_source"]:  # CPU time x watts per core, nothing else
            cpu_s = run["cpu_ms_per_batch"] * len(run["timeline"]) / 1000
            assert run["energy_j"] == pytest.approx(cpu_s * WATTS_PER_CORE, rel=1e-6)
    json.dumps(results)  # the record must be JSON as it stands


@pytest.mark.timeout(300)
def test_opt_in_systems_run_only_when_named(tmp_path: Path) -> None:
    every = [name for name, system in SYSTEMS.items() if system.opt_in]
    splits = {"drapps-split", "drapps-split-1w", "drapps-offload"}  # image only: run below
    caches = {
        "drapps-cache",
        "tf-autotune-cache",
        "drapps-cache-psnr35",
        *(f"drapps-cache-{c}" for c in CODECS),
    }  # run below
    named = {"drapps-static-sampler", "drapps-static-pinned", "drapps-fill", "dataloader-unordered"}
    assert set(every) == {*named, *splits, *caches}
    opt_in = [name for name in every if name not in splits | caches]
    config = BenchConfig(
        workloads=("synthetic",),
        scenarios=("steady",),
        systems=tuple(opt_in),
        workers=(1,),
        static_workers=(1,),
        size="smoke",
        repeats=1,
        data_dir=tmp_path,
    )
    results = run_benchmark(config, progress=False)
    # drapps-fill chooses its workers ("auto"): its case is named after the system alone.
    cases = {("synthetic", "steady", f"{name}-1") for name in opt_in if name != "drapps-fill"}
    cases.add(("synthetic", "steady", "drapps-fill"))
    check_runs(results, cases, repeats=1)


# Minutes each (every system at smoke size): behind -m slow; the opt-in test above is the
# default run's smoke check of the harness.
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("workload", ["image", "text", "synthetic"])
def test_every_available_system_runs_each_workload(
    workload: str, tmp_path: Path, corpus: Path
) -> None:
    config = BenchConfig(
        workloads=(workload,),
        scenarios=("steady",),
        workers=(0, 2),
        size="smoke",
        repeats=1,
        data_dir=tmp_path,
    )
    results = run_benchmark(config, progress=False)
    others = [
        SYSTEMS[n] for n in AVAILABLE if n != "dataloader" and SYSTEMS[n].refuses(workload) is None
    ]
    cases = {"dataloader-0", "dataloader-2"}
    cases |= {s.case_name(w) for s in others for w in s.variants(usable_cores())}
    check_runs(results, {(workload, "steady", c) for c in cases}, repeats=1)
    refused = [n for n in AVAILABLE if SYSTEMS[n].refuses(workload) is not None]
    assert all(f"{n} on {workload}" in results["skipped"] for n in refused)
    assert "tf-autotune" in cases, "the tests run with the tf extra installed"
    assert f"drapps-static-{usable_cores()}" in cases
    table = markdown(results)
    assert f"#### `{workload}`, `steady`" in table and "Oracle static" in table
    assert "skipped `drapps-rl`" in table or "drapps-rl" in cases
    limit = results["limit"][workload]
    assert limit["cores"] == usable_cores() and limit["per_core_samples_per_s"] > 0
    assert limit["samples_per_s"] == pytest.approx(limit["per_core_samples_per_s"] * limit["cores"])
    assert f"Preprocessing limit of `{workload}` here: {limit['samples_per_s']:.0f}" in table
    assert "| of limit |" in table and "| CPU ms/batch: all / training process |" in table


# Minutes: behind -m slow.
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_every_scenario_runs_and_is_recorded(tmp_path: Path) -> None:
    scenarios = ("cpu-contention", "consumer-shift", "slow-io")
    config = BenchConfig(
        workloads=("image",),
        scenarios=scenarios,
        systems=("dataloader", "drapps-heuristic"),
        workers=(1,),
        size="smoke",
        repeats=2,
        measure_batches=9,
        data_dir=tmp_path,
    )
    results = run_benchmark(config, progress=False)
    cases = {("image", s, c) for s in scenarios for c in ("dataloader-1", "drapps-heuristic")}
    check_runs(results, cases, repeats=2)
    summary = {(r["scenario"], r["case"]): r for r in results["summary"]}
    assert summary["slow-io", "dataloader-1"]["repeats"] == 2
    assert set(results["scenarios"]) == set(scenarios)
    pngs = plot(results, tmp_path / "plots")
    names = {p.name for p in pngs}
    assert names == {f"image-{s}-over-time.png" for s in scenarios} | {
        "image-end-to-end.png",
        "image-throughput.png",
    }
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in pngs)


@pytest.mark.timeout(300)
def test_the_cache_comparison_times_the_epochs_after_the_first(tmp_path: Path) -> None:
    config = BenchConfig(
        workloads=("image",),
        scenarios=("steady",),
        cache=True,
        workers=(2,),
        cache_memory="64MB",
        size="smoke",
        repeats=1,
        measure_batches=3,
        data_dir=tmp_path,
    )
    results = run_benchmark(config, progress=False)
    names = ["dataloader-2", "tf-autotune", "tf-autotune-cache", "drapps-heuristic"]
    names += ["drapps-cache"]
    names += [f"drapps-cache-{codec}" for codec in ("none", "lz4", "zstd")]
    check_runs(results, {("image", "steady", name) for name in names}, repeats=1)
    ends = {run["case"]: run for run in results["runs"]}
    assert ends["drapps-cache-zstd"]["final_workers"].endswith("/zstd")
    assert ends["drapps-cache"]["final_workers"].split("/")[1] in (
        "none",
        "lz4",
        "zstd",
        "quantize-16",
    )
    assert all(run["warmup_samples_per_s"] > 0 for run in results["runs"])
    assert results["config"]["cache_memory"] == "64MB"


@pytest.mark.timeout(300)
def test_the_split_systems_run_every_split_and_record_where_it_ended(tmp_path: Path) -> None:
    config = BenchConfig(
        workloads=("image",),
        scenarios=("steady",),
        systems=("drapps-split-1w",),
        size="smoke",
        repeats=1,
        data_dir=tmp_path,
    )
    results = run_benchmark(config, progress=False)
    names = ["0", "1", "2", "3", "4", "auto", "auto-workers"]
    check_runs(results, {("image", "steady", f"drapps-split-1w-{n}") for n in names}, repeats=1)
    ends = {run["case"]: run["final_workers"] for run in results["runs"]}
    assert ends["drapps-split-1w-2"] == "1@2" and ends["drapps-split-1w-4"] == "1@4"
    with pytest.raises(ValueError, match="device must be None or a torch device name, got 'gpu0'"):
        BenchConfig(device="gpu0")


@pytest.mark.timeout(300)
def test_the_offload_systems_run_every_share_under_the_model_consumer(tmp_path: Path) -> None:
    config = BenchConfig(
        workloads=("image",),
        scenarios=("steady",),
        systems=("drapps-offload",),
        consumer="cuda-model",  # without CUDA: the small CPU model's step
        batch_size=8,
        size="smoke",
        repeats=1,
        data_dir=tmp_path,
    )
    results = run_benchmark(config, progress=False)
    names = ["0", "0.5", "1", "auto", "auto-all"]
    check_runs(results, {("image", "steady", f"drapps-offload-{n}") for n in names}, repeats=1)
    assert all(run["batch_size"] == 8 for run in results["runs"])
    assert results["workloads"]["image"].endswith("; batch 8")  # the size the runs used
    ends = {run["case"]: run["final_workers"] for run in results["runs"]}
    assert ends["drapps-offload-0.5"].endswith("@0/0.50")  # workers@split/share
    assert ends["drapps-offload-1"].endswith("@0/1.00")
    assert "Consumer `cuda-model`" in markdown(results)


@pytest.mark.timeout(300)
def test_a_run_is_timed_for_at_least_the_seconds_asked(tmp_path: Path) -> None:
    config = BenchConfig(
        workloads=("synthetic",),
        scenarios=("steady",),
        systems=("dataloader",),
        workers=(0,),
        measure_batches=2,
        measure_s=1.0,
        size="smoke",
        repeats=1,
        data_dir=tmp_path,
    )
    results = run_benchmark(config, progress=False)
    (run,) = results["runs"]
    assert len(run["timeline"]) > 2 and run["timeline"][-1][0] >= 1.0
    assert run["samples"] == run["expected_samples"]  # every timed batch counted
    assert "2 timed batches and at least 1 s after" in markdown(results)  # the table says so
    with pytest.raises(ValueError, match="measure_s times runs by the clock"):
        BenchConfig(measure_s=5.0, scenarios=("steady", "cpu-contention"))


def test_bad_configs_are_named() -> None:
    with pytest.raises(
        ValueError, match=r"workload must be one of \['image', 'image-gil', 'text', 'synth"
    ):
        BenchConfig(workloads=("imagenet",))
    with pytest.raises(ValueError, match=r"scenario must be one of \['steady', 'cpu-contention'"):
        BenchConfig(scenarios=("earthquake",))
    with pytest.raises(
        ValueError,
        match=r"system must be one of \['dataloader', 'dataloader-unordered', 'tf-autotune'",
    ):
        BenchConfig(systems=("tf",))
    with pytest.raises(ValueError, match="'consumer-shift' changes the step time"):
        BenchConfig(scenarios=("consumer-shift",), consumer="cpu-model")
    with pytest.raises(ValueError, match="workload 'synthetic' reads no files"):
        BenchConfig(workloads=("synthetic",), scenarios=("slow-io",))
    with pytest.raises(ValueError, match="repeats must be >= 1, got 0"):
        BenchConfig(repeats=0)
    with pytest.raises(ValueError, match="size must be one of"):
        BenchConfig(size="huge")
    with pytest.raises(ValueError, match="batch_size must be None or an int >= 1, got 0"):
        BenchConfig(batch_size=0)
    with pytest.raises(ValueError, match="consumer must be one of"):
        BenchConfig(consumer="gpu-model")


def test_an_unavailable_system_named_outright_is_an_error(tmp_path: Path) -> None:
    if SYSTEMS["drapps-rl"].unavailable() is None:
        pytest.skip("an rl policy is registered")
    config = BenchConfig(systems=("drapps-rl",), size="smoke", data_dir=tmp_path)
    with pytest.raises(ValueError, match="system 'drapps-rl' cannot run here: no policy"):
        run_benchmark(config, progress=False)


def test_a_missing_corpus_says_how_to_get_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRAPPS_TEXT_CORPUS", str(tmp_path / "missing"))
    config = BenchConfig(workloads=("text",), size="smoke", data_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match=r"apt-get install python3\.11-doc"):
        run_benchmark(config, progress=False)


def test_progress_bar_counts_and_estimates() -> None:
    stream = io.StringIO()
    bar = Progress(4, stream=stream)
    for i in range(4):
        bar.update(f"case {i}")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 4  # not a terminal: one line per run
    assert lines[0].startswith("bench [#####...............] 1/4") and "case 0" in lines[0]
    assert lines[-1].startswith("bench [####################] 4/4") and "0m00s left" in lines[-1]


# Minutes: behind -m slow.
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_cpu_model_consumer_trains_on_every_workload(tmp_path: Path, corpus: Path) -> None:
    config = BenchConfig(
        workloads=("image", "text", "synthetic"),
        scenarios=("steady",),
        systems=("dataloader",),
        workers=(0,),
        consumer="cpu-model",
        size="smoke",
        repeats=1,
        data_dir=tmp_path,
    )
    results = run_benchmark(config, progress=False)
    cases = {(w, "steady", "dataloader-0") for w in ("image", "text", "synthetic")}
    check_runs(results, cases, repeats=1)
    assert "Consumer `cpu-model`" in markdown(results)
