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

import numpy as np
import pytest
from helpers import BusyDataset

import drapps
from drapps.sim.calibration import TraceFamily, calibrate, record, replay
from drapps.sim.families import draw
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


def test_a_trace_family_draws_the_traced_runs_scaled_with_their_load_stretched(
    traces: tuple[Path, Path],
) -> None:
    pytest.importorskip("gymnasium")
    from drapps.sim.env import PipelineEnv

    one, two = traces
    family = TraceFamily.from_traces([one, two], spread=1.25, varied=0.5)
    calibrated = [calibrate(one), calibrate(two)]
    assert [p for p, _, _ in family.runs] == calibrated
    stretched = [
        [x for c in outside for x in (c.at * 60.0 / spans, c.outside_load or 0.0)]
        for _, outside, spans in family.runs
    ]
    drawn, spreads = set(), set()
    for seed in range(20):
        scenario = draw(family, np.random.default_rng(seed), duration=60.0)
        assert scenario.name == "traces" and scenario.pipeline.cores == calibrated[0].cores
        changes = [x for c in scenario.changes for x in (c.at, c.outside_load or 0.0)]
        k = next(k for k, run in enumerate(stretched) if run == pytest.approx(changes))
        drawn.add(k)
        p, base = scenario.pipeline, calibrated[k]  # its costs scaled within the spread
        for name in ("cpu_s", "step_s"):
            assert getattr(base, name) / 1.25 <= getattr(p, name) <= getattr(base, name) * 1.25
        # the run's own cost spread, or in about half the draws one between 0.1 and 1.5
        assert p.cost_cv == base.cost_cv or 0.1 <= p.cost_cv <= 1.5
        spreads.add(p.cost_cv == base.cost_cv)
    assert drawn == {0, 1} and spreads == {True, False}
    same = TraceFamily(family.runs, varied=0.0)
    assert all(
        same(np.random.default_rng(seed), 60.0).pipeline.cost_cv in {c.cost_cv for c in calibrated}
        for seed in range(10)
    )
    assert max(stretched[1][1::2]) >= 0.5  # the hog, in the drawn load
    env = PipelineEnv([family, "cpu-bound"], duration=5.0)
    obs, _ = env.reset(seed=1)
    assert obs.shape == env.observation_space.shape
    assert env.step(4)[1] != 0.0


def test_a_trace_family_refuses_what_it_cannot_draw_from(
    traces: tuple[Path, Path], tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="at least one traced run"):
        TraceFamily.from_traces([])
    with pytest.raises(ValueError, match="spread must be >= 1"):
        TraceFamily.from_traces([traces[0]], spread=0.5)
    with pytest.raises(ValueError, match=r"varied must be in \[0, 1\]"):
        TraceFamily.from_traces([traces[0]], varied=1.5)
    short = tmp_path / "short.jsonl"
    short.write_text('{"type": "header", "version": 1, "config": {"batch_size": 4}}\n')
    with pytest.raises(ValueError, match=r"short\.jsonl: a trace needs at least 4 ticks"):
        TraceFamily.from_traces([traces[0], short])


def test_train_policy_calibrate_fine_tunes_from_traces(
    traces: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("gymnasium")
    from drapps.cli import main
    from drapps.control.rl import MlpPolicy

    one, two = traces
    out = tmp_path / "tuned.npz"
    argv = ["train-policy", "--calibrate", str(one), str(two), "--steps", "1", "--duration", "5",
            "--episodes", "0", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "calibrating the simulator from 2 trace(s)" in text
    assert "the States of 1 episodes of the traced runs, held over 4 episodes" in text
    tuned = MlpPolicy.load(out)
    meta = tuned.meta["finetune"]
    assert meta["traces"] == [one.name, two.name] and meta["temperature"] == 0.1
    assert meta["start"] == "the shipped policy"
    assert meta["states"] == 2 and meta["anchor_states"] == 8
    assert tuned.features == MlpPolicy.shipped().features
    for bad, message in (
        (["--offline", str(one)], "--offline and --calibrate are two ways"),
        (["--learner", "ppo"], "--calibrate fine-tunes with --learner rollout, not ppo"),
        (["--from", str(tmp_path / "none.npz")], "none.npz"),
    ):
        assert main(["train-policy", "--calibrate", str(one), *bad]) == 2
        assert message in capsys.readouterr().err
    assert main(["train-policy", "--calibrate", str(tmp_path / "gone.jsonl")]) == 2
    assert "gone.jsonl" in capsys.readouterr().err
    assert main(["train-policy", "--temperature", "0.2", "--steps", "10"]) == 2
    assert "--temperature applies to --calibrate" in capsys.readouterr().err
