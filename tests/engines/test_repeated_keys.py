"""A key a sampler gives more than once in one epoch: ``RandomSampler(replacement=True)``,
``WeightedRandomSampler`` (oversampling a rare class), a ``DistributedSampler``'s padding.

DataLoader's workers draw on from their generators, so each time such a key comes its
augmentation is new. Under ``workers="auto"`` or a ``seed`` drapps seeds every sample from
``(seed, epoch, key)``, and from its repeat too: each repeat draws anew, and the same way for
any executor, and again on resume."""

from __future__ import annotations

import itertools
import json
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, RandomSampler, Sampler, WeightedRandomSampler

import drapps
from drapps.runtime.plan import (
    RepeatTable,
    SampledPlan,
    _count_drawn,
    _counted,
    repeat_table,
    repeats_in,
)
from drapps.runtime.seeding import sample_seed_for


class Draws:
    """Each sample: its key, a draw and the sample's seed. The draw is from torch's global
    generator, or (``own``) from ``drapps.sample_rng()``, which threads may run."""

    def __init__(self, n: int, own: bool = False) -> None:
        self.n, self.own = n, own

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor, int]:
        draw = torch.from_numpy(drapps.sample_rng().random(2)) if self.own else torch.rand(2)
        return i, draw, _seed_or_none()


def _seed_or_none() -> int:
    """The sample's seed (in int64), or -1 outside a drapps sample (DataLoader's)."""
    try:
        return drapps.sample_seed() & ((1 << 63) - 1)
    except RuntimeError:  # DataLoader: no drapps sample
        return -1


class Fixed(Sampler[int]):
    """The same keys every pass: a key that comes again, within a batch and across batches."""

    def __init__(self, keys: list[int]) -> None:
        self.keys = keys

    def __iter__(self) -> Any:
        return iter(self.keys)

    def __len__(self) -> int:
        return len(self.keys)


KEYS = [0, 1, 1, 2, 0, 3, 1, 1, 4, 0, 2, 2]
"""Batches of 4: key 1 twice in batch 0 and twice in batch 1, key 0 in every batch."""


def samplers(n: int) -> dict[str, Any]:
    return {
        # drawn batch by batch from a generator it seeds from torch's (a DrawnPlan)
        "replacement": lambda: RandomSampler(range(n), replacement=True, num_samples=3 * n),
        "replacement, generator": lambda: RandomSampler(
            range(n), replacement=True, num_samples=3 * n, generator=torch.Generator()
        ),
        "weighted": lambda: WeightedRandomSampler([1.0] * (n - 1) + [20.0], 3 * n),
        "fixed": lambda: Fixed(KEYS),
    }


SAMPLERS = samplers(6)


def epoch(
    sampler: Any, own: bool = False, **options: Any
) -> list[tuple[list[int], torch.Tensor, list[int]]]:
    """One epoch's batches as (keys, draws, seeds), after ``torch.manual_seed(0)``."""
    torch.manual_seed(0)
    options = {"batch_size": 4, **options}
    with drapps.Loader(Draws(6, own), sampler=sampler, **options) as loader:
        return [(k.tolist(), d, s.tolist()) for k, d, s in loader]


def draws_by_key(batches: list[Any]) -> dict[int, list[torch.Tensor]]:
    found: dict[int, list[torch.Tensor]] = {}
    for keys, draws, _ in batches:
        for key, draw in zip(keys, draws, strict=True):
            found.setdefault(key, []).append(draw)
    return found


def assert_each_repeat_draws_anew(batches: list[Any]) -> None:
    found = draws_by_key(batches)
    assert max(map(len, found.values())) >= 3, found  # the sampler gave a key again
    for key, draws in found.items():
        for x, y in itertools.combinations(draws, 2):
            assert not torch.equal(x, y), f"key {key} drew {x.tolist()} twice"


SETTINGS = {
    "auto": {},
    "seed, in the loop": {"seed": 5, "num_workers": 0},
    "seed, 2 processes": {"seed": 5, "num_workers": 2},
    "seed, 2 threads": {"seed": 5, "num_workers": 2, "backend": "thread", "own": True},
    "seed, samples apart": {"seed": 5, "num_workers": 2, "dispatch": "samples"},
    "seed, filled": {"seed": 5, "num_workers": 2, "defer_after": 0.0},
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("make", SAMPLERS.values(), ids=SAMPLERS.keys())
@pytest.mark.parametrize("settings", SETTINGS.values(), ids=SETTINGS.keys())
def test_each_time_a_key_comes_it_draws_anew(make: Any, settings: dict[str, Any]) -> None:
    assert_each_repeat_draws_anew(epoch(make(), **settings))


@pytest.mark.parametrize("make", SAMPLERS.values(), ids=SAMPLERS.keys())
def test_dataloader_draws_anew_too(make: Any) -> None:
    """What the tests above hold drapps to: DataLoader's workers draw on."""
    torch.manual_seed(0)
    batches = [
        (k.tolist(), d, s.tolist())
        for k, d, s in DataLoader(Draws(6), batch_size=4, sampler=make(), num_workers=2)
    ]
    assert_each_repeat_draws_anew(batches)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("make", SAMPLERS.values(), ids=SAMPLERS.keys())
def test_a_repeat_draws_the_same_for_any_executor(make: Any) -> None:
    for settings in list(SETTINGS.values())[2:-1]:  # filled batches are not the planned ones
        reference = epoch(make(), settings.get("own", False), seed=5, num_workers=0)
        got = epoch(make(), **settings)
        assert [keys for keys, _, _ in got] == [keys for keys, _, _ in reference]
        assert all(torch.equal(g[1], r[1]) for g, r in zip(got, reference, strict=True))


def test_a_sample_knows_its_seed_by_its_repeat() -> None:
    batches = epoch(Fixed(KEYS), seed=5, num_workers=0)
    seen: dict[int, int] = {}
    for keys, _, seeds in batches:
        for key, seed in zip(keys, seeds, strict=True):
            repeat = seen.get(key, 0)
            seen[key] = repeat + 1
            assert seed == sample_seed_for(5, 0, key, repeat) & ((1 << 63) - 1)
    assert sample_seed_for(5, 0, 3) == sample_seed_for(5, 0, 3, 0)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("make", SAMPLERS.values(), ids=SAMPLERS.keys())
@pytest.mark.parametrize("workers", [0, 2])
def test_a_resumed_epoch_draws_its_repeats_as_the_whole_one(make: Any, workers: int) -> None:
    whole = epoch(make(), seed=5, num_workers=workers)
    for at in range(1, len(whole)) if workers == 0 else [1, len(whole) - 1]:
        torch.manual_seed(0)
        with drapps.Loader(Draws(6), batch_size=4, sampler=make(), seed=5, workers=workers) as a:
            iterator = iter(a)
            head = [next(iterator) for _ in range(at)]
            state = json.loads(json.dumps(a.state_dict()))
        torch.manual_seed(1)  # the resumed run draws nothing the checkpoint did not keep
        with drapps.Loader(Draws(6), batch_size=4, sampler=make(), seed=5, workers=workers) as b:
            b.load_state_dict(state)
            tail = list(b)
        got = [(k.tolist(), d) for k, d, _ in head + tail]
        assert [keys for keys, _ in got] == [keys for keys, _, _ in whole], at
        assert all(torch.equal(g[1], w[1]) for g, w in zip(got, whole, strict=True)), at


def test_a_checkpoints_repeats_are_checked_as_it_loads() -> None:
    with drapps.Loader(Draws(6), batch_size=4, sampler=Fixed(KEYS), seed=5, workers=0) as loader:
        iterator = iter(loader)
        next(iterator)
        state = loader.state_dict()
        assert state["repeats"] == [[1, 0, 2, 3], [0, 2, 1, 2]]
        bad_ones = (
            [[1, 0, 2, 3]],
            [None, [0, 2, 1]],
            [[1, 0, -1, 3], None],
            "1",
            [[1, 0, 0.5, 3], None],
        )
        for bad in bad_ones:
            with pytest.raises(ValueError, match="state repeats"):
                loader.load_state_dict({**state, "repeats": bad})


def test_a_plans_repeats_are_made_per_batch_as_they_are_asked_for() -> None:
    """An epoch's repeats are one array, each batch's tuple made when asked: the same as
    counted key by key, batch sizes 0 to 5 and ids past a resume included."""
    rng = np.random.default_rng(0)
    batches = tuple(rng.integers(0, 30, rng.integers(0, 6)).tolist() for _ in range(200))
    table = repeat_table(batches)
    assert isinstance(table, RepeatTable) and len(table) == 200
    assert tuple(table) == _counted(batches)
    assert table[-1] == table[199] and list(table[10:13]) == [table[10], table[11], table[12]]
    with pytest.raises(IndexError):
        table[200]
    plan = SampledPlan(batches, 0, 0, first=5)
    assert [plan.repeats_of(b) for b in range(5, 205)] == list(_counted(batches) or ())


def test_repeats_are_counted_over_the_epoch_in_order() -> None:
    batches = ([0, 1, 1], [2, 0], [3], [1, 0, 2])
    expected = ((0, 0, 1), (0, 1), None, (2, 2, 1))
    assert repeats_in(batches) == expected
    assert repeats_in([["a", "b", "b"], ["c", "a"], ["d"], ["b", "a", "c"]]) == expected
    assert repeats_in([[1 << 70, 1], [1 << 70]]) == (None, (1,))  # keys past int64
    seen = np.zeros(4, dtype=np.int32)  # a sampler with replacement, counted as it draws
    assert tuple(_count_drawn(batch, seen) for batch in batches) == expected
    assert repeats_in(([0, 1], [2])) is None  # no key twice: nothing kept
    assert repeats_in(()) is None
    plan = SampledPlan(([3], [1, 0, 2]), 0, 0, first=2, saved_repeats=(None, (1, 0, 0)))
    assert plan.repeats_of(2) is None
    assert plan.repeats_of(3) == (1, 0, 0)
    with pytest.raises(IndexError):
        plan.repeats_of(1)
