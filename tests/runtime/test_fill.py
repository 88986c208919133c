"""Batches filled from made samples (``defer_after``): exactly once, resumable, replayable."""

from __future__ import annotations

import random
import time
from typing import Any

import pytest
import torch
from helpers import FailingDataset, assert_batches_equal

import drapps
from drapps.runtime.fill import ReadyFill
from drapps.runtime.plan import Plan, SampledPlan


class Stragglers:
    """Every 23rd sample sleeps 80 ms, the rest 1 ms; each sample draws from torch's RNG."""

    def __len__(self) -> int:
        return 200

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(0.08 if i % 23 == 5 else 0.001)
        return torch.tensor(i), torch.rand(2)


def filled(**options: Any) -> drapps.Loader:
    settings = {"defer_after": 0.0, "shuffle": True, **options}
    return drapps.Loader(
        Stragglers(), batch_size=8, seed=1, workers=2, persistent_workers=True, **settings
    )


def test_ready_samples_fill_batches_every_sample_once_and_the_epoch_replays() -> None:
    with filled() as loader:
        epoch = iter(loader)
        batches = list(epoch)
        record = epoch.delivered_keys
    indices = [int(i) for batch, _ in batches for i in batch]
    assert sorted(indices) == list(range(200)) and len(batches) == 25
    assert [[int(i) for i in batch] for batch, _ in batches] == record
    with drapps.Loader(Stragglers(), batch_size=8, shuffle=True, seed=1, workers=0) as planned:
        plan = [[int(i) for i in batch] for batch, _ in planned]
    assert record != plan  # stragglers joined later batches
    with drapps.Loader(Stragglers(), batch_sampler=record, seed=1, workers=0) as replay:
        assert_batches_equal(list(replay), batches)  # the same augmentation, bit for bit


def test_a_filled_epoch_resumes_with_exactly_the_samples_still_owed() -> None:
    with filled() as loader:
        epoch = iter(loader)
        first = [next(epoch) for _ in range(7)]
        state = loader.state_dict()
    with filled() as resumed:
        resumed.load_state_dict(state)
        rest = list(resumed)
    indices = [int(i) for batch, _ in first + rest for i in batch]
    assert sorted(indices) == list(range(200)) and len(first) + len(rest) == 25


def test_a_generous_defer_after_gives_the_planned_batches() -> None:
    with drapps.Loader(Stragglers(), batch_size=8, shuffle=True, seed=1, workers=0) as planned:
        expected = list(planned)
    with filled(defer_after=None) as loader:  # the default: planned batches
        assert_batches_equal(list(loader), expected)
    with drapps.Loader(
        Stragglers(), batch_size=8, shuffle=True, seed=1, workers=2, defer_after=60.0
    ) as loader:
        assert_batches_equal(list(loader), expected)


def test_skipped_samples_are_counted_once_in_filled_batches() -> None:
    bad = {3, 17, 30}
    with drapps.Loader(
        FailingDataset(40, bad), batch_size=4, shuffle=True, seed=0, workers=2,
        defer_after=0.0, on_error="skip",
    ) as loader:  # fmt: skip
        got = [int(i) for batch in loader for i in batch]
        assert loader.stats().samples_skipped == len(bad)
    assert sorted(got) == sorted(set(range(40)) - bad)


def test_a_failing_sample_raises_in_the_filled_batch_that_takes_it() -> None:
    with drapps.Loader(
        FailingDataset(40, {9}), batch_size=4, workers=2, defer_after=0.0
    ) as loader, pytest.raises(drapps.SampleError, match="sample 9"):  # fmt: skip
        list(loader)


def test_the_pool_forms_the_planned_batch_unless_the_loop_waited_long_enough() -> None:
    plan = Plan(8, 4, shuffle=False, drop_last=False, seed=0, epoch=0)
    fill = ReadyFill(plan, 0)
    fill.add(0, 0, [0, 1, 2], ["a0", "a1", "a2"], [0, 1, 2], [])  # sample 3 is late
    fill.add(1, 0, [0, 1, 2, 3], ["b0", "b1", "b2", "b3"], [0, 1, 2, 3], [])
    assert fill.form(None, 0.0) is None  # the loop is not waiting: batch 0 waits for it
    assert fill.form(0.01, 0.05) is None  # waiting, but not for long enough
    first = fill.form(0.06, 0.05)
    assert first is not None and first.samples == ["a0", "a1", "a2", "b0"]
    assert first.places == [(0, 0), (0, 1), (0, 2), (1, 0)] and fill.deferred == 1
    fill.add(0, 1, [3], ["a3"], [0], [])
    second = fill.form(None, 0.05)  # every sample it owes is here: no wait needed
    assert second is not None and second.samples == ["a3", "b1", "b2", "b3"]
    assert fill.done and fill.form(1.0, 0.0) is None


def test_a_repeat_of_a_stragglers_key_waits_for_it() -> None:
    """A key the plan gives again is delivered in the order of its repeats (each draws its
    own), so that the delivered keys, replayed as a batch sampler, draw as the epoch did."""
    plan = SampledPlan(([0, 1], [1, 2], [3, 4]), 0, 0)
    fill = ReadyFill(plan, 0)
    fill.add(0, 0, [0], ["0"], [0], [])  # key 1's first time is late
    fill.add(1, 0, [0, 1], ["1 again", "2"], [0, 1], [])
    fill.add(2, 0, [0, 1], ["3", "4"], [0, 1], [])
    first = fill.form(1.0, 0.0)
    assert first is not None and first.keys == [0, 2]  # not key 1's repeat
    fill.add(0, 1, [1], ["1"], [0], [])
    second = fill.form(1.0, 0.0)
    assert second is not None and second.samples == ["1", "1 again"]
    plan = SampledPlan(([0, 1], [1, 2]), 0, 0)
    fill = ReadyFill(plan, 0)
    fill.add(1, 0, [0, 1], ["1 again", "2"], [0, 1], [])
    assert fill.form(1.0, 0.0) is None  # made, but a repeat: it waits


class Jittery:
    """Samples that take 0-5 ms, drawn afresh each time (so repeats finish out of order),
    each drawing from torch's RNG."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(random.Random().random() * 0.005)
        return torch.tensor(i), torch.rand(2)


def test_filled_epochs_that_give_keys_again_replay() -> None:
    sampler = torch.utils.data.RandomSampler(
        range(12), replacement=True, num_samples=48, generator=torch.Generator()
    )
    with drapps.Loader(
        Jittery(), batch_size=4, sampler=sampler, seed=1, workers=2, defer_after=0.0
    ) as loader:
        for epoch in range(3):
            iterator = iter(loader)
            batches = list(iterator)
            record = iterator.delivered_keys
            replay = drapps.Loader(Jittery(), batch_sampler=record, seed=1, workers=0)
            replay.set_epoch(epoch)
            with replay:
                assert_batches_equal(list(replay), batches)


@pytest.mark.parametrize(
    ("options", "needs"),
    [
        ({"workers": 0}, "needs worker processes"),
        ({"in_order": False}, "needs in_order=True"),
        ({"defer_after": -1.0}, "a number >= 0"),
        ({"collate_fn": lambda batch: batch}, "a collate_fn of its own"),
    ],
)
def test_what_filling_batches_needs_is_named(options: dict[str, Any], needs: str) -> None:
    with pytest.raises(ValueError, match=needs):
        drapps.Loader(Stragglers(), **{"batch_size": 8, "defer_after": 0.0, **options})
