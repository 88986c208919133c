"""A sampler that never ends, or has no ``len()``: iteration-based training's
(detectron2's ``TrainingSampler``, mmengine's ``InfiniteSampler``). DataLoader draws such a
sampler as it goes; drapps plans its epoch a window of batches at a time."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Sampler

import drapps
import drapps.runtime.plan

WINDOW = 3
"""Batches per window in these tests: each run below crosses several windows."""


@pytest.fixture(autouse=True)
def small_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(drapps.runtime.plan, "WINDOW", WINDOW)


class Endless(Sampler[int]):
    """Pass after pass over ``range(n)``, each shuffled by a generator of its own (as
    detectron2's TrainingSampler); ``stop``: end after that many keys; counts what it gave."""

    def __init__(self, n: int, stop: int | None = None, *, length: bool = False) -> None:
        self.n, self.stop, self.length = n, stop, length
        self.given = 0

    def __iter__(self) -> Iterator[int]:
        g = torch.Generator().manual_seed(0)
        passes = (i for _ in itertools.count() for i in torch.randperm(self.n, generator=g))
        for i in itertools.islice(passes, self.stop):
            self.given += 1
            yield int(i)

    def __len__(self) -> int:  # mmengine's InfiniteSampler says one pass, and goes on
        if not self.length:
            raise TypeError("an endless sampler has no len()")
        return self.n


class Draws:
    """Each sample: its key, and a draw from torch's global generator."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor]:
        return i, torch.rand(2)


def take(loader: Any, batches: int) -> list[Any]:
    try:
        return list(itertools.islice(loader, batches))
    finally:
        if hasattr(loader, "close"):
            loader.close()


def keys(batches: list[Any]) -> list[list[int]]:
    return [batch[0].tolist() for batch in batches]


SETTINGS = {
    "in the loop": {"num_workers": 0},
    "2 processes": {"num_workers": 2},
    "2 threads": {"num_workers": 2, "backend": "thread"},
    "persistent": {"num_workers": 2, "persistent_workers": True},
    "out of order": {"num_workers": 2, "in_order": False},
    "auto": {},
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("settings", SETTINGS.values(), ids=SETTINGS.keys())
@pytest.mark.parametrize("length", [False, True], ids=["no len", "len of one pass"])
def test_an_endless_sampler_gives_dataloaders_batches(
    settings: dict[str, Any], length: bool
) -> None:
    """It hung: the epoch's batches were all drawn before the first was made."""
    workers = settings.get("num_workers", 0)
    torch.manual_seed(0)
    sampler = Endless(10, length=length)
    reference = take(DataLoader(Draws(10), batch_size=4, sampler=sampler, num_workers=workers), 24)
    torch.manual_seed(0)
    sampler = Endless(10, length=length)
    got = take(drapps.Loader(Draws(10), batch_size=4, sampler=sampler, **settings), 12)
    if settings.get("in_order", True):
        assert keys(got) == keys(reference)[:12]
        if "num_workers" in settings:  # DataLoader's draws too
            assert all(torch.equal(a[1], b[1]) for a, b in zip(got, reference, strict=False))
    else:  # each of DataLoader's batches once, in the order they were made
        planned = keys(reference)
        for batch in keys(got):
            planned[planned.index(batch)] = []
    # Drawn a window ahead of the loop at most (the first window is the sampler's len(), or
    # its first pass), and a batch more, to learn it goes on.
    assert sampler.given <= 4 * (12 + WINDOW + 1)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_sampler_without_len_ends_its_epoch_where_it_ends(workers: int) -> None:
    """37 keys: 10 batches, the last of one; ended past three windows, and again next epoch."""
    reference = keys(list(DataLoader(Draws(10), batch_size=4, sampler=Endless(10, stop=37))))
    with drapps.Loader(
        Draws(10), batch_size=4, sampler=Endless(10, stop=37), num_workers=workers
    ) as loader:
        assert [keys(list(loader)) for _ in range(2)] == [reference, reference]


@pytest.mark.parametrize("workers", [0, 2, "auto"])
def test_an_endless_epoch_resumes_from_a_checkpoint_at_any_batch(workers: int | str) -> None:
    """Within a window and between two: the rest is the uninterrupted run's, draws included."""
    kwargs: dict[str, Any] = {"batch_size": 4, "seed": 3, "workers": workers}
    whole = take(drapps.Loader(Draws(30), sampler=Endless(30), **kwargs), 16)
    between = 0
    for taken in range(1, 15) if workers == 0 else (5, 7, 13):
        with drapps.Loader(Draws(30), sampler=Endless(30), **kwargs) as loader:
            iterator = iter(loader)
            first = take_from(iterator, taken)
            state = json.loads(json.dumps(loader.state_dict()))
        assert state["sampler_batches"] == taken + len(state["batches"])
        between += not state["batches"]
        resumed = drapps.Loader(Draws(30), sampler=Endless(30), **kwargs)
        resumed.load_state_dict(state)
        assert resumed.state_dict() == state  # held until the epoch starts
        rest = take(resumed, 16 - taken)
        assert keys(first + rest) == keys(whole)
        assert all(torch.equal(a[1], b[1]) for a, b in zip(first + rest, whole, strict=True))
    assert between >= 1


def take_from(iterator: Iterator[Any], batches: int) -> list[Any]:
    return [next(iterator) for _ in range(batches)]


def test_a_key_drawn_again_draws_anew_the_same_for_any_workers() -> None:
    """With a seed, a sample's draws come from (seed, epoch, key), and an endless sampler
    gives a key again and again in one epoch: each window holds a key once and is seeded
    apart, so every time a key comes its draws are new."""
    runs = [
        take(drapps.Loader(Draws(25), batch_size=4, sampler=Endless(25), seed=0, workers=w), 60)
        for w in (0, 2)
    ]
    assert all(torch.equal(a[1], b[1]) for a, b in zip(*runs, strict=True))
    draws: dict[int, dict[int, torch.Tensor]] = {}  # key: batch: its draw there
    for b, (batch_keys, batch_draws) in enumerate(runs[0]):
        for key, draw in zip(batch_keys.tolist(), batch_draws, strict=True):
            draws.setdefault(key, {})[b] = draw
    assert min(map(len, draws.values())) >= 8  # 240 samples of 25 keys
    assert all(
        not torch.equal(x, y)
        for d in draws.values()
        for x, y in itertools.combinations(d.values(), 2)
    )


def test_past_its_first_pass_a_small_datasets_endless_sampler_is_planned_whole_windows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Windows ended before a key came again: over 10 keys, a batch or two each, and each
    drained the pool. A key's repeats within a window are seeded apart instead."""
    monkeypatch.setattr(drapps.runtime.plan, "WINDOW", 8)
    with drapps.Loader(Draws(10), batch_size=4, sampler=Endless(10), seed=0, workers=0) as a:
        iterator = iter(a)
        first_pass = len(a.state_dict()["batches"])  # until a key came again
        batches = take_from(iterator, first_pass + 1)
        assert len(a.state_dict()["batches"]) == 8 - 1  # the rest of a window of 8
        batches += take_from(iterator, 7)
    draws = [tuple(draw.tolist()) for _, batch in batches for draw in batch]
    assert len(set(draws)) == len(draws) == 4 * (first_pass + 8)  # no key drew twice alike


def test_a_checkpoint_of_an_endless_epoch_is_checked_as_it_loads() -> None:
    with drapps.Loader(Draws(10), batch_size=4, sampler=Endless(10), seed=3, workers=0) as loader:
        iterator = iter(loader)
        take_from(iterator, 4)
        state = loader.state_dict()
    state["sampler_batches"] = 1
    with pytest.raises(ValueError, match="sampler_batches must be at least"):
        drapps.Loader(Draws(10), batch_size=4, sampler=Endless(10), seed=3).load_state_dict(state)


class BreaksAt(Endless):
    """:class:`Endless` whose pass raises ValueError as it is asked for key ``at``."""

    def __init__(self, n: int, at: int) -> None:
        super().__init__(n)
        self.at = at

    def __iter__(self) -> Iterator[int]:
        for k, key in enumerate(super().__iter__()):
            if k == self.at:
                raise ValueError(f"key {k} cannot be drawn")
            yield key


def met(loader: Any) -> list[Any]:
    """Each ``next()``'s keys or error, up to the epoch's end (the loop goes on past it)."""
    iterator, got = iter(loader), []
    while len(got) < 100:
        try:
            got.append(next(iterator)[0].tolist())
        except StopIteration:
            break
        except ValueError:
            got.append("ValueError")
    getattr(loader, "close", lambda: None)()
    return got


@pytest.mark.timeout(120)
@pytest.mark.parametrize("at", [21, 23, 25, 27, 29])  # every place in a window of 3 batches
@pytest.mark.parametrize("settings", SETTINGS.values(), ids=SETTINGS.keys())
def test_a_sampler_that_raises_in_a_later_window_loses_no_batch(
    settings: dict[str, Any], at: int
) -> None:
    """The window's draw raised from the loop's ``next()``, and every batch the sampler gave
    in that window before it was lost (426 in a run of the default window, with or without
    workers). Now each is delivered, and the error comes once: where DataLoader's does
    without workers; with them no sooner than DataLoader's (its prefetch ahead of the loop)
    nor later than the batch that failed, and not before its window's first batch."""
    workers = settings.get("num_workers", 0)
    reference = met(
        DataLoader(Draws(10), batch_size=2, sampler=BreaksAt(10, at), num_workers=workers)
    )
    got = met(drapps.Loader(Draws(10), batch_size=2, sampler=BreaksAt(10, at), **settings))
    keys_given = _keys_of(at)
    given = [keys_given[k : k + 2] for k in range(0, at - 1, 2)]  # the half batch is lost
    assert got.count("ValueError") == 1, got
    delivered = [b for b in got if b != "ValueError"]
    if settings.get("in_order", True):
        assert delivered == given
    else:
        assert sorted(delivered) == sorted(given)
    failed = at // 2  # the batch the sampler could not give
    if workers == 0:
        assert got.index("ValueError") == reference.index("ValueError") == failed
    else:
        assert reference.index("ValueError") <= got.index("ValueError") <= failed, (got, reference)


def _keys_of(count: int) -> list[int]:
    """The first ``count`` keys :class:`Endless` over 10 keys gives."""
    return list(itertools.islice(Endless(10), count))
