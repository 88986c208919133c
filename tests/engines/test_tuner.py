"""workers='auto' end to end on real workers: it grows, shrinks and re-decides (no timings)."""

from __future__ import annotations

import gc
import io
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from helpers import BusyDataset, SlowDataset, drapps_threads, state, wait_until

import drapps
from drapps.control import NOOP, Action, HeuristicConfig, HeuristicPolicy, State
from drapps.telemetry import TraceRow, read_trace, status
from drapps.telemetry.status import StatusLine, format_line

N = 10**6  # more samples than any test reads: the tests stop on a condition, not an epoch end


def consume_until(
    loader: drapps.Loader,
    done: Callable[[drapps.LoaderStats], bool],
    step_s: float = 0.0,
    limit_s: float = 30.0,
) -> drapps.LoaderStats:
    """Take batches until ``done(stats)``; returns the stats it was true of, read inside the
    epoch (breaking out of it lets its workers go, as DataLoader's do)."""
    deadline = time.monotonic() + limit_s
    stats = loader.stats()
    for _ in loader:
        if step_s:
            time.sleep(step_s)
        stats = loader.stats()
        if done(stats) or time.monotonic() > deadline:
            break
    return stats


def test_grows_from_one_worker_while_the_consumer_waits() -> None:
    with drapps.Loader(
        BusyDataset(N, 0.003), batch_size=8, workers="auto", max_workers=2, control_interval=0.1
    ) as loader:
        loader.resize(1)
        stats = consume_until(loader, lambda stats: stats.workers >= 2)
        assert stats.workers == 2
    # After close the controller thread has finished its tick, so the report has it.
    assert "trying 2 workers" in loader.report()


def test_shrinks_when_workers_sit_idle() -> None:
    with drapps.Loader(
        SlowDataset(N), batch_size=4, workers="auto", max_workers=4, control_interval=0.1
    ) as loader:
        loader.resize(4)
        stats = consume_until(loader, lambda stats: stats.workers < 4, step_s=0.02)
        assert stats.workers < 4


@pytest.fixture()
def cpu_hog() -> Iterator[list[subprocess.Popen[bytes]]]:
    burners: list[subprocess.Popen[bytes]] = []
    yield burners
    for burner in burners:
        burner.kill()
        burner.wait()


# Assumes how many samples/s a core makes: machine-dependent, so behind -m slow.
@pytest.mark.slow
def test_a_cpu_hog_mid_run_makes_it_re_decide(cpu_hog: list[subprocess.Popen[bytes]]) -> None:
    # One worker feeds this consumer on idle cores; with three CPU burners it cannot.
    with drapps.Loader(
        BusyDataset(N, 0.003), batch_size=8, workers="auto", max_workers=4, control_interval=0.1
    ) as loader:
        loader.resize(1)
        # ~89 samples/s asked; one worker makes ~235 on a free core (2.6x headroom, so a slow
        # CI machine holds too): nothing to change.
        stats = consume_until(loader, lambda stats: stats.workers > 1, step_s=0.09, limit_s=3.0)
        assert stats.workers == 1
        for _ in range(8):
            cpu_hog.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
        # Now the worker gets ~2/9 of a core (~50 samples/s); a second wins back CPU share.
        stats = consume_until(loader, lambda stats: stats.workers > 1, step_s=0.09, limit_s=30.0)
        assert stats.workers > 1
    assert "trying 2 workers" in loader.report()


def test_trace_file_and_report_from_a_real_run(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    with drapps.Loader(
        BusyDataset(N, 0.001), batch_size=8, workers="auto", control_interval=0.05, trace=path
    ) as loader:
        consume_until(loader, lambda _: len(loader._parts.tuner.rows) >= 5)  # type: ignore[union-attr]
        report = loader.report()
    trace = read_trace(path)
    assert len(trace.rows) >= 5 and trace.header["config"]["batch_size"] == 8
    assert trace.rows[-1].state.throughput >= 0 and trace.rows[-1].stages["fetch_s"] > 0
    assert "the training loop waited" in report and "Workers" in report
    # energy: each tick's watts and how they were counted, and the run's joules per sample
    assert all(row.state.energy_source for row in trace.rows)
    assert any((row.state.power_w or 0) > 0 for row in trace.rows)
    energy = r"Energy: \d+ J over .* mJ per sample, about \d+ J per epoch of 1000000"
    assert re.search(energy, report)


LINE = (
    r"\[drapps\] +\d+ samples/s \| waited +\d+% \| workers \d+ \| ready \d+ of "
    r"prefetch \d+ \| cpu +\d+% \| memory [\d.]+ GiB"
)


def status_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("[drapps]")]


def test_progress_lines_are_whole_lines_at_a_steady_pace(
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whole lines (a user's print never lands on one), spaced, each an average over its span."""
    monkeypatch.setattr(status, "STATUS_EVERY_S", 0.125)  # 0.25 s into a pipe
    with drapps.Loader(
        SlowDataset(N), batch_size=4, workers=1, progress=True, control_interval=0.05
    ) as loader:
        consume_until(loader, lambda _: False, limit_s=1.2)
    err = capfd.readouterr().err
    lines = status_lines(err)
    assert "\r" not in err and 2 <= len(lines) <= 7  # ~24 ticks, a line per 0.25 s
    for line in lines:
        assert re.fullmatch(LINE, line), line
        assert not line.startswith("[drapps]       0 samples/s"), line  # nothing said at t=0


def test_a_run_shorter_than_a_span_gets_one_line_with_its_averages(
    capfd: pytest.CaptureFixture[str],
) -> None:
    # Piped, a line comes every 10 s; this run is over in about a second.
    with drapps.Loader(
        SlowDataset(64, 0.002), batch_size=4, workers=1, progress=True, control_interval=0.05
    ) as loader:
        for _ in range(3):
            for _batch in loader:
                time.sleep(0.01)
        assert status_lines(capfd.readouterr().err) == []  # the span is still open
    lines = status_lines(capfd.readouterr().err)
    assert len(lines) == 1 and re.fullmatch(LINE, lines[0]), lines
    rate = int(lines[0].split()[1])
    assert rate > 0  # the span's average, not the zero of a tick before the first batch


def test_the_first_line_waits_for_batches_and_a_full_span() -> None:
    rows = []
    line = StatusLine(stream=io.StringIO(), every_s=1.0)
    for i in range(1, 9):  # 0.25 s ticks: workers start for 1 s, then 400 samples/s
        flowing = i > 4
        s = state(t=0.25 * i, throughput=400.0 if flowing else 0.0, wait_fraction=0.5)
        rows.append(TraceRow(s.t, s, NOOP, {"workers": 2, "prefetch": 4}, 0.0))
        line.observe(rows[-1])
    out = line._stream.getvalue()  # type: ignore[attr-defined]
    # Ticks 5-8 are the first span (1.0 s from the tick before the first batch): one line.
    assert out.count("\n") == 1 and out.startswith("[drapps]     400 samples/s | waited  50%")
    line.finish()
    assert out == line._stream.getvalue()  # type: ignore[attr-defined]  # nothing left open


def test_the_line_gives_the_count_asked_of_the_pool_not_a_restart() -> None:
    s = state(t=1.0, throughput=400.0, workers=0, target_workers=3)  # between two epochs
    line = format_line([TraceRow(s.t, s, NOOP, {"workers": 0, "prefetch": 6}, 0.0)], 0.0)
    assert "| workers 3 |" in line


def test_an_epoch_boundary_never_resizes_the_pool() -> None:
    # Workers not kept between epochs: a tick between two epochs sees none running. Nothing is
    # sized there (no policy move asked), so the count asked of the pool stays 2.
    with drapps.Loader(
        SlowDataset(64), batch_size=8, workers="auto", max_workers=2, min_workers=1,
        policy="static", control_interval=0.01,
    ) as loader:  # fmt: skip
        loader.resize(2)
        for _ in range(15):
            for _batch in loader:
                time.sleep(0.002)
            time.sleep(0.03)  # a tick or more between epochs
        rows = list(loader._parts.tuner.rows)  # type: ignore[union-attr]
        assert any(r.state.workers == 0 for r in rows)  # ticks between epochs were seen
        assert loader.stats().target_workers == 2
        assert {r.state.target_workers for r in rows} == {2}
        report = loader.report()
    assert "Workers stayed at 2" in report and "0 ->" not in report and "-> 0" not in report


def test_the_heuristic_does_not_judge_a_tick_between_epochs() -> None:
    policy = HeuristicPolicy()
    between = state(workers=0, max_workers=8, throughput=0.0, wait_fraction=1.0)
    assert all(policy.decide(between) == NOOP for _ in range(20))
    assert policy._tick == 0 and not policy._recent


class Stream:
    """An iterable dataset of ``n`` numbers, sharded by worker."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[torch.Tensor]:
        info = torch.utils.data.get_worker_info()
        start, step = (info.id, info.num_workers) if info is not None else (0, 1)
        for i in range(start, self.n, step):
            time.sleep(0.0005)
            yield torch.tensor(i)


@pytest.mark.parametrize(
    ("make", "told"),
    [
        (lambda: drapps.Loader(SlowDataset(N, 0.001), batch_size=4, num_workers=2,
                               control_interval=0.05), "Workers: 2 throughout, the count you gave"),
        (lambda: drapps.Loader(SlowDataset(N, 0.001), batch_size=4, num_workers=0,
                               control_interval=0.05), "Workers: none (workers=0)"),
        (lambda: drapps.Loader(Stream(N), batch_size=4, num_workers=1, control_interval=0.05),
         "Workers: 1 throughout, the count you gave"),
        (lambda: drapps.Loader(Stream(N), batch_size=4, num_workers=0, control_interval=0.05),
         "Workers: none (workers=0)"),
    ],
    ids=["fixed", "zero", "stream", "stream-zero"],
)  # fmt: skip
def test_every_loader_reports_where_the_time_went(make: object, told: str) -> None:
    loader = make()  # type: ignore[operator]
    with loader:
        assert not controller_threads()  # none before the loop starts
        consume_until(loader, lambda _: len(loader._parts.tuner.rows) >= 6, limit_s=20)
        assert len(controller_threads()) == 1
        report = loader.report()
    assert "Over " in report and "the training loop waited" in report and told in report
    assert "No telemetry" not in report and "controller" not in report
    assert wait_until(lambda: not controller_threads(), timeout=5)


def controller_threads() -> list[threading.Thread]:
    return [t for t in drapps_threads() if t.name == "drapps-controller"]


def test_a_fixed_counts_controller_thread_stops_when_the_loader_is_collected() -> None:
    loader = drapps.Loader(SlowDataset(N), batch_size=4, num_workers=1, control_interval=0.05)
    epoch = iter(loader)
    for _ in range(3):
        next(epoch)
    assert controller_threads()
    del loader, epoch
    gc.collect()
    assert wait_until(lambda: not drapps_threads(), timeout=10), drapps_threads()


def test_telemetry_false_starts_no_thread_and_says_there_is_no_report() -> None:
    with drapps.Loader(SlowDataset(64), batch_size=4, num_workers=1, telemetry=False) as loader:
        for _ in loader:
            assert not controller_threads()
        assert loader._parts.tuner is None
        assert "telemetry=False" in loader.report()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, r"telemetry=False turns off the telemetry that workers='auto' needs: give a "
             r"worker count \(num_workers=n\)"),
        ({"workers": 2, "progress": True}, "that progress=True needs"),
        ({"workers": 2, "trace": "t.jsonl"}, "that trace='t.jsonl' needs"),
        ({"workers": 2, "telemetry": "no"}, "telemetry must be a bool, got 'no'"),
    ],
)  # fmt: skip
def test_telemetry_false_refuses_what_needs_telemetry(
    kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        drapps.Loader(SlowDataset(4), **{"telemetry": False, **kwargs})  # type: ignore[arg-type]


class CountingPolicy:
    def __init__(self) -> None:
        self.seen = 0

    def decide(self, state: State) -> Action:
        self.seen += 1
        if self.seen % 2:
            raise RuntimeError("flaky policy")
        return NOOP


def test_custom_and_failing_policies_never_stop_the_pipeline() -> None:
    policy = CountingPolicy()
    with drapps.Loader(
        SlowDataset(400, 0.001), batch_size=4, workers="auto", policy=policy, control_interval=0.02
    ) as loader:
        assert sum(len(b) for b in loader) == 400
    assert policy.seen >= 2


def test_workers_zero_can_be_traced_but_not_tuned(tmp_path: Path) -> None:
    with drapps.Loader(
        BusyDataset(N, 0.001),
        batch_size=8,
        workers=0,
        trace=tmp_path / "t.jsonl",
        control_interval=0.05,
    ) as loader:
        consume_until(loader, lambda _: False, limit_s=0.5)
    rows = read_trace(tmp_path / "t.jsonl").rows
    assert rows and all(r.applied["workers"] == 0 for r in rows)


def test_heuristic_policy_object_is_accepted() -> None:
    policy = HeuristicPolicy(HeuristicConfig(backoff=4))
    with drapps.Loader(SlowDataset(16), batch_size=4, workers="auto", policy=policy) as loader:
        assert len(list(loader)) == 4


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"policy": "magic"}, r"policy must be one of \['heuristic', 'rl', 'static'\]"),
        ({"policy": 3}, "policy must be a registered name or an object with decide"),
        ({"min_workers": 0}, "min_workers must be an int >= 1, got 0"),
        ({"min_workers": 9, "max_workers": 4}, "min_workers=9 exceeds max_workers=4"),
        ({"control_interval": 0}, "control_interval must be a number of seconds > 0, got 0"),
        ({"progress": "yes"}, "progress must be a bool"),
    ],
)
def test_invalid_control_arguments_are_named(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        drapps.Loader(SlowDataset(4), **kwargs)  # type: ignore[arg-type]
