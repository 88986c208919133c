"""Calibration from real traces: fit on one real run, replay another, compare.

The runs are real: a drapps.Loader with worker processes over a dataset that burns CPU per
sample, a training loop that sleeps per step, and (second run) a busy-loop process taking a
core for a while. The error bound here is loose (the VM is noisy); the measured errors are
reported in docs/sim.md.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import BusyDataset

import drapps
from drapps.sim.calibration import calibrate, record, replay
from drapps.telemetry.trace import read_trace


def _traced_run(path: Path, workers: int, seconds: float, hog: tuple[float, float] | None) -> None:
    data = BusyDataset(100_000, cpu_s=0.002)
    hog_process = None
    try:
        with drapps.Loader(
            data, batch_size=16, workers=workers, trace=path, control_interval=0.25, seed=0
        ) as loader:
            start = time.monotonic()
            for _ in loader:
                now = time.monotonic() - start
                if hog and hog_process is None and now > hog[0]:
                    hog_process = subprocess.Popen([sys.executable, "-c", "while True: pass"])
                if hog and hog_process is not None and now > hog[1]:
                    hog_process.kill()
                time.sleep(0.02)  # the training step
                if now > seconds:
                    break
    finally:
        if hog_process is not None:
            hog_process.kill()
            hog_process.wait()


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("traces")
    one, two = folder / "one-worker.jsonl", folder / "two-workers-hog.jsonl"
    _traced_run(one, 1, 6.0, None)
    _traced_run(two, 2, 6.0, (2.0, 4.0))
    return one, two


# Error bounds fitted on one machine: machine-dependent, so behind -m slow.
@pytest.mark.slow
def test_replay_of_another_real_run_lands_near_it(traces: tuple[Path, Path]) -> None:
    one, two = traces
    pipeline = calibrate(one)
    assert pipeline.cores >= 1 and pipeline.batch_size == 16
    # 16 samples x 2 ms of CPU per batch, plus the worker's own overhead
    assert 0.03 <= pipeline.cpu_s <= 0.06
    own = replay(pipeline, record(one))
    assert own.throughput_error < 0.10 and own.wait_error < 0.10
    other = replay(pipeline, record(two))  # other worker count, a hog: not fitted on
    assert other.throughput_error < 0.30, (other.run.throughput, other.recorded.throughput)
    assert other.wait_error < 0.25


def test_record_reads_the_schedule_and_the_outside_load(traces: tuple[Path, Path]) -> None:
    _, two = traces
    recorded = record(two)
    rows = read_trace(two).rows
    assert len(recorded.schedule) == len(rows) - 1
    assert recorded.first_workers == 2 and {w for w, _ in recorded.schedule} == {2}
    assert max(c.outside_load or 0.0 for c in recorded.outside) >= 0.5  # the hog was seen
    assert 0 < recorded.wait_fraction < 1 and recorded.throughput > 100


def test_a_workers_memory_is_what_it_holds_not_its_resident_set(
    traces: tuple[Path, Path],
) -> None:
    """The workers are forked: most of their resident set is the training process's pages.
    Calibration models a worker by the memory it holds (its proportional set size)."""
    _, two = traces
    last = read_trace(two).rows[-1]
    pipeline = calibrate(two)
    sizes = [(w["pss"], w["rss"]) for w in last.workers.values()]
    assert len(sizes) == 2 and all(pss < rss for pss, rss in sizes)
    assert pipeline.worker_rss == int(statistics.median(pss for pss, _ in sizes))
    assert pipeline.main_rss == last.state.held_bytes - int(sum(pss for pss, _ in sizes))


def test_bad_traces_are_named(tmp_path: Path) -> None:
    short = tmp_path / "short.jsonl"
    short.write_text('{"type": "header", "version": 1, "config": {"batch_size": 4}}\n')
    with pytest.raises(ValueError, match="at least 4 ticks"):
        calibrate(short)
    with pytest.raises(ValueError, match="not JSON"):
        (tmp_path / "bad.jsonl").write_text("nope\n")
        calibrate(tmp_path / "bad.jsonl")
