"""One pipeline snapshot: Loader.stats(), the monitor and the controller read the same counters."""

from __future__ import annotations

import threading
import time

import pytest
from helpers import BusyDataset
from helpers import SlowDataset as SleepingDataset

import drapps
from drapps.runtime.stats import PipelineSnapshot
from drapps.telemetry import Monitor


class SlowDataset:
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> int:
        time.sleep(1.5 if index == 0 else 0.0)
        return index


@pytest.mark.parametrize("workers", [0, 1])
def test_a_wait_under_way_counts_in_every_reading(workers: int) -> None:
    with drapps.Loader(SlowDataset(), batch_size=2, workers=workers, seed=0) as loader:
        taken: list[object] = []
        consumer = threading.Thread(target=lambda: taken.extend(loader), name="test-consumer")
        consumer.start()
        time.sleep(0.8)  # the first batch takes 1.5 s: the loop is blocked in next()
        snapshot = loader.snapshot()
        stats = loader.stats()
        consumer.join(timeout=30)
    if workers:  # a wait under way counts as soon as the loop blocks
        assert snapshot.wait_s > 0.4 and stats.wait_s >= snapshot.wait_s
    assert len(taken) == 2


def test_stats_and_the_monitor_read_the_same_snapshot() -> None:
    options = {"batch_size": 8, "workers": 2, "seed": 0, "persistent_workers": True}
    with drapps.Loader(BusyDataset(64, 0.001), **options) as loader:
        batches = list(loader)
        snapshot = loader.snapshot()
        stats = loader.stats()
        state = Monitor(loader.snapshot).sample()
    assert isinstance(snapshot, PipelineSnapshot)
    assert (stats.samples, stats.batches) == (snapshot.samples, len(batches)) == (64, 8)
    assert stats.target_workers == snapshot.target_workers == 2
    assert stats.worker_pids == snapshot.worker_pids and len(stats.worker_pids) == 2
    assert stats.fetch_s == snapshot.stage_s["fetch_s"] > 0
    assert stats.shared_bytes == snapshot.shared_bytes > 0
    assert (state.workers, state.prefetch) == (snapshot.workers, snapshot.prefetch_depth)
    assert state.memory_budget == stats.memory_budget == snapshot.memory_budget


def test_the_state_knows_an_ending_epoch_has_nothing_left_to_make() -> None:
    # Near an epoch's end the queue drains because nothing is left to make, not because the
    # workers fall behind: what is left, ready, reads as a full queue.
    options = {"batch_size": 4, "workers": 2, "seed": 0, "prefetch": 4}
    with drapps.Loader(BusyDataset(40, 0.001), **options) as loader:
        epoch = iter(loader)
        for _ in range(8):
            next(epoch)
        deadline = time.monotonic() + 30
        while loader.snapshot().ready_batches < 2 and time.monotonic() < deadline:
            time.sleep(0.01)  # the last two batches are made
        state = Monitor(loader.snapshot).sample()
        rest = list(epoch)
        after = Monitor(loader.snapshot).sample()
    assert (state.epoch_left, state.queue_batches, state.prefetch) == (2, 2, 4)
    assert state.queue_fill == 1.0 and len(rest) == 2
    assert (after.epoch_left, after.queue_batches, after.queue_fill) == (0, 0, 1.0)


@pytest.mark.parametrize(("step_s", "busy"), [(0.0, True), (0.25, False)])
def test_the_state_tells_busy_workers_from_idle_ones(step_s: float, busy: bool) -> None:
    # Both runs' workers use almost no CPU. A loop that takes batches as fast as they come
    # keeps every worker at work (waiting on its reads); a slow loop leaves them idle behind
    # a full queue, so fewer would do. Batches in flight per worker says which.
    options = {"batch_size": 4, "workers": 2, "seed": 0, "prefetch": 4}
    reads = SleepingDataset(4000, 0.005)  # each sample waits 5 ms off the CPU
    with drapps.Loader(reads, **options) as loader:
        epoch = iter(loader)
        for _ in range(4):
            next(epoch)
        monitor = Monitor(loader.snapshot)
        monitor.sample()
        ends = time.monotonic() + 1.5
        while time.monotonic() < ends:
            next(epoch)
            time.sleep(step_s)
        state = monitor.sample()
    assert state.in_flight is not None and state.workers == 2
    if busy:
        assert state.busy_share > 0.7, state
    else:
        assert state.busy_share < 0.3, state
