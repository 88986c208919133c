from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from drapps.telemetry import Monitor, PipelineSnapshot
from drapps.telemetry.monitor import PSS_EVERY_S


class Pipeline:
    def __init__(self) -> None:
        self.snapshot = PipelineSnapshot(
            samples=0,
            wait_s=0.0,
            ready_batches=0,
            ready_bytes=0,
            memory_budget=2**20,
            workers=1,
            max_workers=4,
            prefetch_depth=2,
            worker_pids=(),
        )

    def __call__(self) -> PipelineSnapshot:
        return self.snapshot


@pytest.fixture()
def burner() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    yield proc
    proc.kill()
    proc.wait()


def test_rates_and_fractions_come_from_deltas(burner: subprocess.Popen[bytes]) -> None:
    pipeline = Pipeline()
    monitor = Monitor(pipeline)
    monitor.sample()
    start = time.monotonic()
    pipeline.snapshot = replace(
        pipeline.snapshot,
        samples=500,
        wait_s=0.25,
        ready_batches=3,
        ready_bytes=1000,
        worker_pids=(burner.pid,),
        latencies=((start + 1, 0.010), (start + 1, 0.030), (start + 1, 0.020)),
    )
    monitor.sample()  # first sight of the burner: its CPU counts from here
    later = time.monotonic() + 1
    pipeline.snapshot = replace(
        pipeline.snapshot, samples=1000, wait_s=0.5, latencies=((later, 0.010), (later, 0.030))
    )
    time.sleep(0.5)
    state = monitor.sample()
    elapsed = state.t
    assert 0 < state.throughput <= 500 / 0.5 * 1.01
    assert 0 < state.wait_fraction <= 0.5
    assert state.latency_p50_s == pytest.approx(0.030) and state.latency_p99_s == pytest.approx(
        0.030
    )
    assert state.workers_cpu > 0  # the busy child's CPU is counted (how much: machine speed)
    assert state.queue_batches == 3 and state.rss_bytes > 0 and elapsed > 0
    assert state.cores >= 1 and 0 <= state.cpu_util <= 1
    assert state.gpu_util is None  # no NVML here, and that is not an error
    assert set(monitor.per_worker) == {burner.pid}


def test_a_worker_started_since_the_last_sample_counts_from_its_start() -> None:
    """A worker of a new epoch (persistent_workers=False) works before the monitor first sees
    it; that CPU is the pipeline's too."""
    pipeline = Pipeline()
    monitor = Monitor(pipeline)
    monitor.sample()
    worker = subprocess.Popen(
        [sys.executable, "-c", "import time\nt = time.process_time()\n"
         "while time.process_time() - t < 0.4: pass\nprint(flush=True)\ntime.sleep(30)"],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        # Its word that it has burned its 0.4 s of CPU (the kernel's count of it, in ticks,
        # may stay a tick short of 0.4 for good).
        assert worker.stdout is not None and worker.stdout.readline() == b"\n"
        pipeline.snapshot = replace(pipeline.snapshot, worker_pids=(worker.pid,))
        state = monitor.sample()
        assert state.workers_cpu * state.t >= 0.3  # its CPU since it started, not zero
    finally:
        worker.kill()
        worker.wait()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity")
def test_a_loop_that_waits_for_a_core_counts_the_wait(burner: subprocess.Popen[bytes]) -> None:
    """The training loop and another busy process on one core: the loop gets part of it and
    waits for the rest, and the State says both (what it asked of the CPU, not what it got)."""
    core = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(burner.pid, {core})
    os.sched_setaffinity(0, {core})  # this thread only: the loop's
    try:
        monitor = Monitor(Pipeline())
        monitor.sample()
        spin = time.process_time() + 0.3
        while time.process_time() < spin:
            pass
        state = monitor.sample()
    finally:
        os.sched_setaffinity(0, before)
    assert state.main_wait > 0.1  # it shared the core (how much: the scheduler's call)
    assert state.main_cpu + state.main_wait > 0.6  # ready to run all along, run or waiting


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup"), reason="needs smaps_rollup")
def test_memory_a_forked_worker_shares_is_held_once() -> None:
    """A worker forked from a training process that holds 200 MiB shows those pages in its
    resident set, but holds none of them: the State's held memory counts them once."""
    held = bytearray(200 * 2**20)
    held[::4096] = b"x" * len(held[::4096])  # resident, not just reserved
    worker = multiprocessing.get_context("fork").Process(target=time.sleep, args=(60,))
    worker.start()
    try:
        pipeline = Pipeline()
        pipeline.snapshot = replace(pipeline.snapshot, worker_pids=(worker.pid,))
        state = Monitor(pipeline).sample()
    finally:
        worker.kill()
        worker.join()
    mib = 2**20
    assert state.rss_bytes > 2 * 200 * mib  # the 200 MiB once per process
    assert state.pss_bytes is not None and state.held_bytes == state.pss_bytes
    assert state.rss_bytes - state.pss_bytes > 150 * mib  # ... and once here


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup"), reason="needs smaps_rollup")
def test_held_memory_stays_counted_once_when_a_worker_starts_or_exits() -> None:
    """A fork shares the training process's pages without moving its resident set: the
    training process's last reading, carried forward, would still count them in full beside
    the new worker's share. Every process is read again when the workers change."""
    held = bytearray(200 * 2**20)
    held[::4096] = b"x" * len(held[::4096])
    pipeline = Pipeline()
    monitor = Monitor(pipeline)
    alone = monitor.sample().held_bytes
    worker = multiprocessing.get_context("fork").Process(target=time.sleep, args=(60,))
    worker.start()
    try:
        pipeline.snapshot = replace(pipeline.snapshot, worker_pids=(worker.pid,))
        shared = monitor.sample().held_bytes  # well within PSS_EVERY_S of the first
    finally:
        worker.kill()
        worker.join()
    pipeline.snapshot = replace(pipeline.snapshot, worker_pids=())
    after = monitor.sample().held_bytes
    mib = 2**20
    assert abs(shared - alone) < 50 * mib  # not the 200 MiB + half of it
    assert abs(after - alone) < 50 * mib  # nor half of it once the worker is gone


def test_the_proportional_size_is_read_now_and_then_and_carried_between(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reads: list[int] = []

    def proportional(pid: int) -> tuple[int, int]:
        reads.append(pid)
        return 100, 40

    monkeypatch.setattr("drapps.telemetry.monitor.process_memory", proportional)
    monitor = Monitor(Pipeline())
    assert monitor._held(7, rss=1000, now=0.0) == 100  # first sight: read
    assert monitor._private[7] == 40
    assert monitor._held(7, rss=1500, now=1.0) == 600  # carried by the resident set's growth
    assert monitor._held(7, rss=200, now=1.5) == 0  # never below nothing
    assert monitor._held(7, rss=1500, now=2.0 + PSS_EVERY_S) == 100 and len(reads) == 2


def test_workers_added_counts_the_pools_growth_since_the_last_sample() -> None:
    pipeline = Pipeline()
    monitor = Monitor(pipeline)
    assert monitor.sample().workers_added == 0  # the first sample: nothing to compare with
    pipeline.snapshot = replace(pipeline.snapshot, workers=3)
    assert monitor.sample().workers_added == 2
    assert monitor.sample().workers_added == 0
    pipeline.snapshot = replace(pipeline.snapshot, workers=2)
    assert monitor.sample().workers_added == 0  # shed, not added


def _hold_100_mib_of_its_own(written: Any) -> None:
    held = bytearray(100 * 2**20)
    held[::4096] = b"x" * len(held[::4096])
    written.set()
    time.sleep(60)


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup"), reason="needs smaps_rollup")
def test_a_pool_helper_s_memory_counts_as_held_but_it_is_no_worker() -> None:
    """The zygote holds the dataset (a whole copy of it under spawn) and makes no batch."""
    pipeline = Pipeline()
    monitor = Monitor(pipeline)
    alone = monitor.sample().held_bytes
    context = multiprocessing.get_context("fork")
    written = context.Event()
    helper = context.Process(target=_hold_100_mib_of_its_own, args=(written,))
    helper.start()
    try:
        assert written.wait(timeout=120)
        pipeline.snapshot = replace(pipeline.snapshot, helper_pids=(helper.pid,))
        state = monitor.sample()
    finally:
        helper.kill()
        helper.join()
    assert state.held_bytes - alone > 80 * 2**20
    assert monitor.per_worker == {} and state.worker_private_bytes is None
