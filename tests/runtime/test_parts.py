"""Batches cut into parts among workers: the same batches, errors and skips as whole ones."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
import torch
from helpers import FailingDataset, RandomDataset, assert_batches_equal

import drapps
from drapps.runtime.hedging import Hedging
from drapps.runtime.parts import PartialBatch, largest_tensor
from drapps.runtime.reorder import Entry


class Straggling:
    """Every 20th sample sleeps 40 ms, the rest 1 ms (a heavy tail of slow reads)."""

    def __len__(self) -> int:
        return 1920  # the tail is read from a quarter of the batches until it is heavy

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.04 if i % 20 == 7 else 0.001)
        return torch.full((4,), i)


def epoch(dataset: Any, **options: Any) -> list[Any]:
    with drapps.Loader(dataset, batch_size=8, shuffle=True, seed=3, **options) as loader:
        return list(loader)


def test_parts_give_the_batches_whole_batches_give() -> None:
    expected = epoch(RandomDataset(50), workers=0)
    assert_batches_equal(epoch(RandomDataset(50), workers=2, dispatch="samples"), expected)


def test_a_failing_sample_in_a_part_raises_naming_the_first_failing_index() -> None:
    bad = {5, 6, 30}
    with pytest.raises(drapps.SampleError) as inline:
        epoch(FailingDataset(40, bad), workers=0)
    with pytest.raises(drapps.SampleError) as parts:
        epoch(FailingDataset(40, bad), workers=2, dispatch="samples")
    assert parts.value.index == inline.value.index
    assert f"sample {inline.value.index}" in str(parts.value)


def test_skipped_samples_in_parts_are_skipped_and_counted_as_whole_batches_do() -> None:
    bad = {5, 6, 30}
    options: dict[str, Any] = {"on_error": "skip"}
    expected = epoch(FailingDataset(40, bad), workers=0, **options)
    with drapps.Loader(
        FailingDataset(40, bad), batch_size=8, shuffle=True, seed=3, workers=2,
        dispatch="samples", **options,
    ) as loader:  # fmt: skip
        got = list(loader)
        assert loader.stats().samples_skipped == len(bad)
    assert_batches_equal(got, expected)


def test_a_collate_fn_of_your_own_keeps_batches_whole() -> None:
    def collate(samples: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack(samples).sum(0)

    with drapps.Loader(
        Straggling(), batch_size=8, workers=2, dispatch="samples", collate_fn=collate
    ) as loader:
        list(loader)
        assert loader.stats().cut_batches == 0


def test_auto_cuts_batches_once_costs_are_heavy_tailed_and_keeps_them_the_same() -> None:
    expected = epoch(Straggling(), workers=0)
    with drapps.Loader(
        Straggling(), batch_size=8, shuffle=True, seed=3, workers=2, persistent_workers=True
    ) as loader:
        assert_batches_equal(list(loader), expected)
        stats = loader.stats()
    assert stats.cut_batches > 0
    assert stats.sample_costs is not None and stats.sample_costs["tail_ratio"] >= 8


def test_a_partial_batch_collates_its_parts_in_plan_order() -> None:
    partial = PartialBatch([10, 11, 12, 13], {0: (1, 3), 1: (0, 2)}, 0.0)
    partial.add(1, [torch.tensor(10)], [0], [(12, "sample 12 failed")], 4)
    assert not partial.complete
    partial.add(0, [torch.tensor(11), torch.tensor(13)], [0, 1], [], 8)
    entry = partial.outcome(lambda samples, indices: (torch.stack(samples), indices))
    assert isinstance(entry, Entry) and entry.nbytes == 12
    batch, indices = entry.batch
    assert batch.tolist() == [10, 11, 13] and indices == [10, 11, 13]
    assert entry.skipped == [(12, "sample 12 failed")]


def test_the_largest_tensor_of_a_batch_is_found_in_nested_structures() -> None:
    big = torch.zeros(100)
    assert largest_tensor({"a": [torch.zeros(2), (big, "label")], "b": 3}) is big
    assert largest_tensor(["no", "tensors"]) is None


class SlowFirstRead:
    """``n`` samples whose every read takes ``each_s``; sample ``index``'s first read, from
    any process, waits ``first_s`` more (a cold object store), and any later read is quick,
    as a hedged request's usually is."""

    def __init__(self, folder: Any, *, n: int, index: int, first_s: float, each_s: float) -> None:
        self.marker = folder / f"{index}-read"
        self.n, self.index, self.first_s, self.each_s = n, index, first_s, each_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == self.index:
            try:
                self.marker.touch(exist_ok=False)
            except FileExistsError:
                pass
            else:
                time.sleep(self.first_s)
        time.sleep(self.each_s)
        return torch.full((4,), i)


def test_a_slow_read_is_raced_by_an_idle_worker_before_its_batch_is_due(tmp_path: Any) -> None:
    # Batches in plan order (no shuffle): sample 29 is in batch 3. While the loop is still
    # two batches behind, an idle worker copies the overdue part; the copy reads quickly, and
    # batch 3 is ready long before the 5-second read ends. The batches are the same.
    with drapps.Loader(
        SlowFirstRead(tmp_path, n=64, index=29, first_s=5.0, each_s=0.001),
        batch_size=8,
        workers=3,
        dispatch="samples",
        prefetch=6,
    ) as loader:
        got = []
        started = time.monotonic()
        for batch in loader:
            got.append(batch)
            time.sleep(0.3)  # the training step: the loop reaches batch 3 after ~1 s
        elapsed = time.monotonic() - started
        costs = loader.stats().sample_costs
    assert costs is not None and costs["hedges_ahead"] >= 1, costs
    assert elapsed < 5.0  # the epoch did not wait out the slow read
    assert [b.tolist() for b in got] == [
        [[i] * 4 for i in range(b * 8, b * 8 + 8)] for b in range(8)
    ]


def test_a_part_stuck_on_one_sample_is_copied_before_the_part_looks_overdue(
    tmp_path: Any,
) -> None:
    # Two workers, parts of 8 samples at 100 ms, two parts a worker: a part looks overdue
    # only after 4x its 0.8 s. Batch 1's first sample stalls in its read; the worker shows
    # the training process which sample it is on and since when. Once it has waited as long
    # as a copy would take on the other worker, its part (and the part queued behind it) is
    # copied there before the part looks overdue (``hedges_stalled``); the copy reads
    # quickly, and the epoch ends long before the 30 s read. Nothing of batch 0 is copied:
    # before any cost is measured, nothing says a part runs late.
    with drapps.Loader(
        SlowFirstRead(tmp_path, n=96, index=32, first_s=30.0, each_s=0.1),
        batch_size=32,
        workers=2,
        dispatch="samples",
    ) as loader:
        got, waits = [], []
        batches = iter(loader)
        while True:
            asked = time.monotonic()
            try:
                got.append(next(batches))
            except StopIteration:
                break
            waits.append(time.monotonic() - asked)
        costs = loader.stats().sample_costs
    assert costs is not None and 1 <= costs["hedges_stalled"] <= costs["hedges"] <= 3, costs
    assert sum(waits) < 20.0, waits
    assert [b.tolist() for b in got] == [
        [[i] * 4 for i in range(b * 32, b * 32 + 32)] for b in range(3)
    ]


def test_a_stalled_sample_is_not_copied_where_the_copy_would_come_after_it(
    tmp_path: Any,
) -> None:
    # The same two workers, batch 1's first read 0.6 s slower. It counts as stalled after
    # 4x its 100 ms, but a copy would take 0.8 s or more on the other, busy worker: the read
    # ends first, and no copy is made.
    with drapps.Loader(
        SlowFirstRead(tmp_path, n=96, index=32, first_s=0.6, each_s=0.1),
        batch_size=32,
        workers=2,
        dispatch="samples",
    ) as loader:
        got = list(loader)
        costs = loader.stats().sample_costs
    assert costs is not None and costs["hedges"] == 0, costs
    assert [b.tolist() for b in got] == [
        [[i] * 4 for i in range(b * 32, b * 32 + 32)] for b in range(3)
    ]


class Spinning:
    """Every sample burns ``cpu_s`` of its thread's CPU: uniform costs, all CPU."""

    def __init__(self, n: int = 4096, cpu_s: float = 0.0003) -> None:
        self.n, self.cpu_s = n, cpu_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        end = time.thread_time() + self.cpu_s
        while time.thread_time() < end:
            pass
        return torch.full((4,), i)


@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or not os.path.exists("/proc/thread-self/schedstat"),
    reason="needs Linux with per-thread scheduler statistics",
)
@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")
def test_more_workers_than_cores_do_not_make_uniform_costs_look_heavy_tailed() -> None:
    # Three workers on one core preempt each other: a sample cut by the end of a time slice
    # waits two slices for its core, 10-50x its own 0.3 ms. That wait is the scheduler's, not
    # the sample's; counted, it made the costs look heavy-tailed (p99 15x the median) and
    # nearly every batch was cut into parts for nothing.
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})  # the workers inherit it
    try:
        with drapps.Loader(Spinning(), batch_size=32, workers=3) as loader:
            list(loader)
            stats = loader.stats()
    finally:
        os.sched_setaffinity(0, before)
    assert stats.sample_costs is not None and stats.sample_costs["tail_ratio"] < 4
    assert stats.cut_batches == 0
    # The wall time a task takes per second of its own cost: three workers share the core,
    # so about 3 (what an overdue part is judged by).
    assert stats.sample_costs["stretch"] > 2


@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or not os.path.exists("/proc/thread-self/schedstat"),
    reason="needs Linux with per-thread scheduler statistics",
)
@pytest.mark.filterwarnings("ignore:This DataLoader will create 4 worker processes")
def test_workers_sharing_cores_do_not_make_parts_look_overdue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Four workers on one core make each part in about 4x its own cost. A part is overdue
    # at 4x its predicted cost on the wall, stretched by the measured wall time per second
    # of cost; with the stretch held at 1 nearly every part looked overdue and was copied
    # to another worker on the same busy core (38 copies in 32 batches on a quiet machine).
    def epoch() -> dict[str, Any]:
        before = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {min(before)})
        try:
            dataset = Spinning(1024, 0.002)  # parts of 4 samples, 8 ms each
            with drapps.Loader(dataset, batch_size=32, workers=4, dispatch="samples") as loader:
                list(loader)
                costs = loader.stats().sample_costs
        finally:
            os.sched_setaffinity(0, before)
        assert costs is not None
        return costs

    measured = epoch()
    with monkeypatch.context() as patch:
        patch.setattr(Hedging, "note_stretch", lambda self, wall_s, costs: None)
        blind = epoch()
    assert measured["stretch"] > 2.5 and blind["stretch"] == 1.0
    assert blind["hedges"] >= 8 and measured["hedges"] * 2 < blind["hedges"], (measured, blind)
