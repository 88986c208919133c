"""The same cases through torch's DataLoader and drapps.Loader: the batches must be the same."""

from __future__ import annotations

import collections
import copy
import json
import multiprocessing
import os
import pickle
import random
import re
import subprocess
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import assert_batches_equal, wait_until
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
    default_collate,
    get_worker_info,
)

import drapps
from drapps.runtime.config import usable_cores

Pair = collections.namedtuple("Pair", ["image", "label"])


class Mixed:
    """Samples of every kind default_collate handles."""

    def __init__(self, n: int = 11) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return {
            "tuple": (torch.full((2,), i), float(i) / 2),
            "pair": Pair(np.full((2, 2), i, dtype=np.uint8), i),
            "nested": [[i, i + 1], ["s", f"name-{i}"]],
            "array": np.arange(3, dtype=np.float32) + i,
            "text": f"sample {i}",
            "number": i,
            "flag": i % 2 == 0,
        }


class Indexed:
    """Returns its index (a tensor), so the order is visible."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: Any) -> torch.Tensor:
        return torch.tensor(int(i))


class Keyed:
    """A map-style dataset keyed by strings: only a sampler knows its keys."""

    def __init__(self, keys: list[str]) -> None:
        self.values = {k: torch.tensor(len(k)) for k in keys}

    def __getitem__(self, key: str) -> Any:
        return {"key": key, "value": self.values[key]}


class KeySampler:
    def __init__(self, keys: list[str]) -> None:
        self.keys = keys

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys)

    def __len__(self) -> int:
        return len(self.keys)


class Shards(IterableDataset):  # type: ignore[type-arg]
    """Worker k of n yields the items k, k+n, ... of its range, with worker-seeded noise."""

    def __init__(self, n: int, noise: bool = False, uneven: bool = False) -> None:
        self.n, self.noise, self.uneven = n, noise, uneven

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        stop = self.n - (5 * start if self.uneven else 0)
        for i in range(start, stop, step):
            yield {"i": i, "noise": torch.rand(1)} if self.noise else torch.tensor(i)

    def __len__(self) -> int:
        return self.n


class StreamOnly:
    """__iter__ and __len__ but no __getitem__: an iterable dataset, never map-style."""

    def __iter__(self) -> Iterator[int]:
        return iter(range(7))

    def __len__(self) -> int:
        return 7


class WorkerProbe:
    """Reports what get_worker_info() says inside the worker."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> Any:
        info = get_worker_info()
        if info is None:
            return {"i": i, "id": -1, "workers": 0, "same": True}
        return {"i": i, "id": info.id, "workers": info.num_workers, "same": info.dataset is self}


class KeyErrorAt:
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == 5:
            raise KeyError(f"no sample {i}")
        return torch.tensor(i)


def both(
    dataset: Any, drapps_kwargs: dict[str, Any] | None = None, *, seed: int = 0, **kwargs: Any
) -> tuple[list[Any], list[Any]]:
    """One epoch through DataLoader and one through drapps.Loader, from the same torch seed."""
    torch.manual_seed(seed)
    expected = list(DataLoader(dataset, **kwargs))
    after_torch = torch.rand(1)
    torch.manual_seed(seed)
    with drapps.Loader(dataset, **kwargs, **(drapps_kwargs or {})) as loader:
        got = list(loader)
    assert torch.equal(torch.rand(1), after_torch), "drapps drew from torch's RNG differently"
    return expected, got


WORKERS = [0, 2]


@pytest.mark.parametrize("workers", WORKERS)
def test_default_collate_of_every_kind_of_sample(workers: int) -> None:
    expected, got = both(Mixed(), batch_size=4, num_workers=workers)
    assert_batches_equal(got, expected)
    assert isinstance(got[0]["pair"], Pair)


@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("persistent", [False, True])
def test_shuffle_follows_torch_manual_seed_like_dataloader(workers: int, persistent: bool) -> None:
    if persistent and workers == 0:
        pytest.skip("persistent_workers needs workers, in both loaders")
    kwargs = {"batch_size": 5, "shuffle": True, "num_workers": workers}
    kwargs["persistent_workers"] = persistent
    data = Indexed(37)
    torch.manual_seed(3)
    reference = DataLoader(data, **kwargs)  # type: ignore[arg-type]
    expected = [list(reference), list(reference)]  # two epochs: the RNG moves on between them
    torch.manual_seed(3)
    with drapps.Loader(data, **kwargs) as loader:  # type: ignore[arg-type]
        got = [list(loader), list(loader)]
    for e in range(2):
        assert_batches_equal(got[e], expected[e])
    assert not torch.equal(torch.cat(got[0]), torch.cat(got[1]))
    torch.manual_seed(4)
    with drapps.Loader(data, **kwargs) as other:  # type: ignore[arg-type]
        assert not torch.equal(torch.cat(list(other)), torch.cat(got[0]))


@pytest.mark.parametrize("workers", WORKERS)
def test_the_order_holds_when_the_loop_draws_from_torch_between_batches(workers: int) -> None:
    """The sampler's batches are drawn as they are needed, as DataLoader's are, but all it
    draws from torch's generator is drawn as the epoch starts: a loop that draws between
    batches (dropout, its own sampling) moves neither loader's order."""
    kwargs = {"batch_size": 4, "shuffle": True, "num_workers": workers}
    data = Indexed(203)

    def epochs(loader: Any) -> list[list[torch.Tensor]]:
        out = []
        for _ in range(2):
            batches = []
            for batch in loader:
                batches.append(batch)
                torch.rand(3)
            out.append(batches)
        return out

    torch.manual_seed(5)
    expected = epochs(DataLoader(data, **kwargs))  # type: ignore[arg-type]
    torch.manual_seed(5)
    with drapps.Loader(data, **kwargs) as loader:  # type: ignore[arg-type]
        got = epochs(loader)
    for e in range(2):
        assert_batches_equal(got[e], expected[e])


class Augmented:
    """Samples whose augmentations draw from torch's, NumPy's and Python's global RNGs, and
    say which seed torch's generator started from."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> torch.Tensor:
        draws = [torch.randint(0, 10**6, ()).item(), np.random.randint(10**6), random.random()]
        return torch.tensor([i, torch.initial_seed() % 10**6, *draws], dtype=torch.float64)


def _seed_torch_12345(worker_id: int) -> None:
    torch.manual_seed(12345)


@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("init", [None, _seed_torch_12345], ids=["", "worker_init_fn"])
def test_augmentations_draw_as_in_dataloaders_workers(
    workers: int, persistent: bool, init: Callable[[int], None] | None
) -> None:
    if persistent and workers == 0:
        pytest.skip("persistent_workers needs workers, in both loaders")
    kwargs: dict[str, Any] = {"batch_size": 3, "shuffle": True, "num_workers": workers}
    kwargs.update(persistent_workers=persistent, worker_init_fn=init)
    torch.manual_seed(5)
    random.seed(5)
    np.random.seed(5)
    reference = DataLoader(Augmented(), **kwargs)
    expected = [list(reference), list(reference)]
    torch.manual_seed(5)
    random.seed(5)
    np.random.seed(5)
    with drapps.Loader(Augmented(), **kwargs) as loader:
        got = [list(loader), list(loader)]
    for e in range(2):
        assert_batches_equal(got[e], expected[e])
    if init is not None and workers:
        assert {float(s[1]) for b in got[0] for s in b} == {12345.0}


@pytest.mark.parametrize(("workers", "prefetch_factor"), [(1, None), (2, 1), (3, 3)])
@pytest.mark.parametrize("left_after", [0, 1, 2])
def test_persistent_workers_draw_on_past_an_epoch_left_early_as_dataloaders(
    workers: int, prefetch_factor: int | None, left_after: int
) -> None:
    """A loop that leaves an epoch (``break``) and begins the next: DataLoader's persistent
    workers make every batch it had sent them of the left epoch (the prefetch depth past the
    loop) before the next epoch's, so the next epoch's augmentations draw on from there."""
    kwargs: dict[str, Any] = {"batch_size": 2, "num_workers": workers, "shuffle": True}
    kwargs.update(persistent_workers=True, prefetch_factor=prefetch_factor)

    def epochs(loader: Any) -> list[list[torch.Tensor]]:
        torch.manual_seed(5)
        random.seed(5)
        np.random.seed(5)
        it = iter(loader)
        left = [next(it) for _ in range(left_after)]
        return [left, list(loader), list(loader)]

    expected = epochs(DataLoader(Augmented(), **kwargs))
    with drapps.Loader(Augmented(), **kwargs) as loader:
        got = epochs(loader)
    for e in range(3):
        assert_batches_equal(got[e], expected[e], f"epoch {e}, ")


class AugmentedShards(IterableDataset):  # type: ignore[type-arg]
    """Worker k of n streams the items k, k+n, ... of 24, each drawing from torch's, NumPy's
    and Python's global RNGs."""

    def __iter__(self) -> Iterator[torch.Tensor]:
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(start, 24, step):
            draws = [torch.randint(0, 10**6, ()).item(), np.random.randint(10**6), random.random()]
            yield torch.tensor([i, *draws], dtype=torch.float64)


@pytest.mark.parametrize(("workers", "prefetch_factor"), [(2, None), (2, 1), (3, 1)])
@pytest.mark.parametrize("left_after", [1, 2])
def test_persistent_stream_workers_draw_on_past_an_epoch_left_early_as_dataloaders(
    workers: int, prefetch_factor: int | None, left_after: int
) -> None:
    """The same for an iterable dataset: DataLoader asks each worker for its prefetch as
    ``iter()`` is called, so a worker the loop never reached before leaving has made batches
    too, and its next epoch's items draw on from there."""
    kwargs: dict[str, Any] = {"batch_size": 2, "num_workers": workers}
    kwargs.update(persistent_workers=True, prefetch_factor=prefetch_factor)

    def epochs(loader: Any) -> list[list[torch.Tensor]]:
        torch.manual_seed(5)
        random.seed(5)
        np.random.seed(5)
        it = iter(loader)
        left = [next(it) for _ in range(left_after)]
        return [left, list(loader), list(loader)]

    expected = epochs(DataLoader(AugmentedShards(), **kwargs))
    with drapps.Loader(AugmentedShards(), **kwargs) as loader:
        got = epochs(loader)
    for e in range(3):
        assert_batches_equal(got[e], expected[e], f"epoch {e}, ")


def test_with_a_seed_each_sample_draws_the_same_for_any_worker_count() -> None:
    def epoch(workers: int) -> list[torch.Tensor]:
        with drapps.Loader(Augmented(), batch_size=3, workers=workers, seed=11) as loader:
            return list(loader)

    one = epoch(0)
    assert_batches_equal(epoch(2), one)
    assert_batches_equal(epoch(1), one)


def test_generator_drives_the_order_as_in_dataloader() -> None:
    data = Indexed(30)
    expected = list(
        DataLoader(data, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(9))
    )
    with drapps.Loader(
        data, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(9), workers=2
    ) as loader:
        assert_batches_equal(list(loader), expected)


@pytest.mark.parametrize(
    "make_sampler",
    [
        lambda: SequentialSampler(range(20)),
        lambda: RandomSampler(range(20), replacement=True, num_samples=13),
        lambda: SubsetRandomSampler([3, 1, 4, 15, 9, 2, 6]),
        lambda: WeightedRandomSampler([0.1] * 10 + [1.0] * 10, num_samples=25),
    ],
    ids=["sequential", "random-replacement", "subset", "weighted"],
)
@pytest.mark.parametrize("workers", WORKERS)
def test_samplers(make_sampler: Callable[[], Any], workers: int) -> None:
    torch.manual_seed(1)
    expected = list(DataLoader(Indexed(20), batch_size=3, sampler=make_sampler()))
    torch.manual_seed(1)
    with drapps.Loader(Indexed(20), batch_size=3, sampler=make_sampler(), workers=workers) as ld:
        assert len(ld) == len(expected)
        assert_batches_equal(list(ld), expected)


@pytest.mark.parametrize("workers", WORKERS)
def test_a_user_sampler_of_string_keys(workers: int) -> None:
    keys = ["a", "bb", "ccc", "dddd", "ee"]
    data, sampler = Keyed(keys), KeySampler(keys)
    expected = list(DataLoader(data, batch_size=2, sampler=sampler))
    with drapps.Loader(data, batch_size=2, sampler=sampler, workers=workers) as loader:
        assert_batches_equal(list(loader), expected)


@pytest.mark.parametrize("workers", WORKERS)
def test_batch_sampler_with_uneven_batches(workers: int) -> None:
    batches = [[0, 1, 2], [9], [4, 3], [7, 8, 5, 6]]
    expected, got = both(Indexed(10), batch_sampler=batches, num_workers=workers)
    assert_batches_equal(got, expected)
    expected, got = both(
        Indexed(10),
        batch_sampler=BatchSampler(RandomSampler(range(10)), 3, True),
        num_workers=workers,
    )
    assert_batches_equal(got, expected)


@pytest.mark.parametrize("workers", WORKERS)
def test_batch_size_none_turns_auto_batching_off(workers: int) -> None:
    expected, got = both(Mixed(5), batch_size=None, num_workers=workers)
    assert_batches_equal(got, expected)
    assert isinstance(got[0]["array"], torch.Tensor)  # default_convert, as DataLoader


@pytest.mark.parametrize("workers", WORKERS)
def test_drop_last_and_len(workers: int) -> None:
    for drop_last in (False, True):
        expected, got = both(Indexed(10), batch_size=4, drop_last=drop_last, num_workers=workers)
        assert_batches_equal(got, expected)
        with drapps.Loader(Indexed(10), batch_size=4, drop_last=drop_last) as loader:
            assert len(loader) == len(DataLoader(Indexed(10), batch_size=4, drop_last=drop_last))


@pytest.mark.parametrize("workers", [0, 2, "auto"])
def test_an_iterators_len_is_its_whole_epochs_as_in_dataloader(workers: int | str) -> None:
    """However far the iterator has gone, and for a resumed epoch too (it said what was left:
    DataLoader's, and torchdata's stateful loader's, say the epoch's length)."""
    kwargs: dict[str, Any] = {"batch_size": 4, "shuffle": True}
    reference = iter(DataLoader(Indexed(10), **kwargs))
    with drapps.Loader(Indexed(10), **kwargs, seed=1, num_workers=workers) as loader:
        it = iter(loader)
        for _ in range(2):
            next(it)
            next(reference)
            assert len(it) == len(reference) == 3
        state = loader.state_dict()
    with drapps.Loader(Indexed(10), **kwargs, seed=1, num_workers=workers) as resumed:
        resumed.load_state_dict(state)
        it = iter(resumed)
        assert len(it) == 3 and len(list(it)) == 1


@pytest.mark.parametrize("workers", [0, "auto"])
@pytest.mark.parametrize("batch_size", [None, 4])
def test_without_workers_the_order_is_drawn_at_the_first_batch_as_in_dataloader(
    workers: int | str, batch_size: int | None
) -> None:
    """A draw from torch's generator between ``iter(loader)`` and the first ``next()`` (a
    model made in between), or a second iterator that takes its batch first, comes before
    the order, as under DataLoader without workers (found by the DataLoader harness)."""

    def epochs(loader: Any) -> tuple[list[Any], float]:
        torch.manual_seed(0)
        it = iter(loader)
        torch.rand(1)
        first = [torch.as_tensor(b).tolist() for b in it]
        it = iter(loader)
        peek = torch.as_tensor(next(iter(loader))).tolist()  # a second iterator goes first
        return [first, peek, [torch.as_tensor(b).tolist() for b in it]], torch.rand(1).item()

    kwargs: dict[str, Any] = {"batch_size": batch_size, "shuffle": True}
    expected = epochs(DataLoader(Indexed(16), **kwargs))
    with drapps.Loader(Indexed(16), **kwargs, num_workers=workers) as loader:
        assert epochs(loader) == expected


class _PermutedInIter(torch.utils.data.Sampler[int]):
    """A sampler that draws its order as ``iter()`` is called (not as a generator)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        return iter(torch.randperm(self.n).tolist())


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("workers", [0, 2, "auto"])
def test_a_sampler_that_draws_in_iter_draws_as_in_dataloader(
    workers: int | str, persistent: bool
) -> None:
    """DataLoader's iterator calls ``iter()`` on the sampler before it draws its base seed,
    and with workers once more as they start (the first pass dropped): the order, and
    torch's generator after the epochs, are DataLoader's (``batch_size=None``, where the
    sampler is not wrapped in a BatchSampler)."""
    if persistent and workers in (0, "auto"):
        pytest.skip("the reference, DataLoader without workers, refuses persistent_workers")

    def epochs(loader: Any) -> tuple[list[list[int]], float]:
        torch.manual_seed(0)
        orders = [[int(b) for b in loader] for _ in range(3)]
        return orders, torch.rand(1).item()

    kwargs: dict[str, Any] = {"batch_size": None, "persistent_workers": persistent}
    count = 0 if workers == "auto" else workers
    reference = DataLoader(Indexed(12), sampler=_PermutedInIter(12), num_workers=count, **kwargs)
    expected = epochs(reference)
    sampler = _PermutedInIter(12)
    with drapps.Loader(Indexed(12), sampler=sampler, num_workers=workers, **kwargs) as loader:
        assert epochs(loader) == expected


class _DrawsEachBatch:
    """A batch sampler that draws each batch from torch's global generator as it yields it;
    it may give fewer than its ``len()`` (``gives``), or fail at batch ``fails``."""

    def __init__(
        self, n: int, size: int, batches: int, gives: int | None = None, fails: int | None = None
    ) -> None:
        self.n, self.size, self.batches = n, size, batches
        self.gives, self.fails = batches if gives is None else gives, fails

    def __len__(self) -> int:
        return self.batches

    def __iter__(self) -> Iterator[list[int]]:
        for b in range(self.gives):
            if b == self.fails:
                raise LookupError(f"the sampler failed at batch {b}")
            yield torch.randint(self.n, (self.size,)).tolist()


def _steps(loader: Any, epochs: int = 2) -> list[Any]:
    """What a loop that draws from torch's generator at every step meets: batches, errors."""
    torch.manual_seed(0)
    met: list[Any] = []
    for _ in range(epochs):
        it = iter(loader)
        while True:
            try:
                met.append(next(it).tolist())
            except StopIteration:
                break
            except LookupError as exc:
                met.append(str(exc))
            torch.rand(1)  # the training step's draw
    return met


_WHOLE_PASS = pytest.mark.xfail(
    strict=True,
    reason='known difference (docs/runtime.md): with workers, and under "auto", drapps '
    "draws a user sampler's whole pass as the epoch starts, DataLoader each batch as it "
    "asks for it",
)


@pytest.mark.parametrize(
    "workers", [0, pytest.param(2, marks=_WHOLE_PASS), pytest.param("auto", marks=_WHOLE_PASS)]
)
def test_a_sampler_that_draws_each_batch_between_the_loops_draws(workers: int | str) -> None:
    """A batch sampler whose every batch draws from torch's generator, and a loop that draws
    between batches (a model's dropout): DataLoader interleaves the two, without workers
    batch by batch (drapps too), with workers ``prefetch_factor`` batches each ahead."""

    kwargs: dict[str, Any] = {"batch_sampler": _DrawsEachBatch(16, 4, 8)}
    expected = _steps(DataLoader(Indexed(16), **kwargs), epochs=1)
    with drapps.Loader(Indexed(16), **kwargs, num_workers=workers) as loader:
        assert _steps(loader, epochs=1) == expected


class _BreaksAt:
    """A batch sampler of ``n`` one-key batches whose pass raises ValueError at batch ``at``
    (a bucketing sampler that meets a bad length, say)."""

    def __init__(self, at: int, n: int = 5) -> None:
        self.at, self.n = at, n

    def __iter__(self) -> Any:
        for k in range(self.n):
            if k == self.at:
                raise ValueError(f"batch {k} cannot be drawn")
            yield [k]

    def __len__(self) -> int:
        return self.n


def _met(loader: Any) -> list[Any]:
    """What a loop meets: where ``iter()`` raises, else each ``next()``'s batch or error."""
    try:
        it = iter(loader)
    except ValueError:
        return ["iter() raised ValueError"]
    met: list[Any] = []
    while len(met) < 8:
        try:
            met.append(next(it).tolist())
        except StopIteration:
            return met
        except ValueError:
            met.append("ValueError")
    return met


@pytest.mark.parametrize("at", [0, 1, 2, 3])
@pytest.mark.parametrize("workers, prefetch", [(0, None), (1, 1), (2, 1), (1, 2), ("auto", None)])
def test_a_sampler_that_raises_partway_raises_where_dataloaders_does_and_loses_no_batch(
    workers: int | str, prefetch: int | None, at: int
) -> None:
    """Found by a campaign (a RandomSampler with replacement over no keys, behind an empty
    first batch): drapps, which draws the pass as the epoch starts, raised from iter(). Now
    the error comes where DataLoader's does: from iter() for a batch within its workers'
    first prefetch, else from the next() that asks for it (without workers, or under
    "auto", that batch's own next()). Every batch drawn before it is delivered; DataLoader
    loses the one its next() held as the sampler raised."""
    kwargs: dict[str, Any] = {"batch_sampler": _BreaksAt(at)}
    if workers != "auto":
        kwargs["num_workers"] = workers
    if prefetch is not None:
        kwargs["prefetch_factor"] = prefetch
    reference = dict(kwargs, num_workers=0) if workers == "auto" else kwargs
    expected = _met(DataLoader(Indexed(8), **reference))
    with drapps.Loader(Indexed(8), **kwargs) as loader:
        got = _met(loader)
    if expected == ["iter() raised ValueError"]:
        assert got == expected
        return
    assert got.index("ValueError") == expected.index("ValueError"), (got, expected)
    assert [b for b in got if b != "ValueError"] == [[k] for k in range(at)], got
    assert got.count("ValueError") == 1, got


class _Missing(Indexed):
    """``Indexed`` whose samples ``missing`` raise KeyError (files gone)."""

    def __init__(self, n: int, missing: set[int]) -> None:
        super().__init__(n)
        self.missing = missing

    def __getitem__(self, i: int) -> torch.Tensor:
        if i in self.missing:
            raise KeyError(f"sample {i} is missing")
        return super().__getitem__(i)


@pytest.mark.parametrize("in_order", [True, False])
@pytest.mark.parametrize("workers", [0, 2, "auto"])
@pytest.mark.parametrize("missing", [{5}, {4, 5}, {1}, {0, 1}, {2}])
def test_a_samplers_error_behind_skipped_batches_is_raised(
    workers: int | str, in_order: bool, missing: set[int]
) -> None:
    """Found by the DataLoader campaign: with ``on_error="skip"`` a batch of nothing but a
    failed sample is not delivered, and the sampler's error due at the batch after it was
    passed over with it: the epoch ended without raising it (7 runs in 10 under "auto", every
    run in order), or raised it a batch late. Now it is raised once, in order where
    DataLoader's would be (its workers' prefetch ahead of the batch that failed), and every
    other batch drawn before it is delivered."""
    kwargs: dict[str, Any] = {"batch_sampler": _BreaksAt(6, n=8), "in_order": in_order}
    if workers != "auto":
        kwargs["num_workers"] = workers
    with drapps.Loader(_Missing(8, missing), on_error="skip", **kwargs) as loader:
        got = _met(loader)
    assert got.count("ValueError") == 1, got
    delivered = sorted(b for b in got if b != "ValueError")
    assert delivered == [[k] for k in range(6) if k not in missing], got
    if in_order:
        due = 6 - (0 if workers in (0, "auto") else 2 * 2)  # DataLoader's 2 workers, 2 ahead
        assert got.index("ValueError") == len([k for k in range(due) if k not in missing]), got


def _left_then_whole(loader: Any, taken: int) -> list[Any]:
    """The loop leaves the first epoch after ``taken`` batches (a ``break``), then takes the
    next two whole."""
    first = iter(loader)
    for _ in range(taken):
        next(first)
    del first
    return [batch.tolist() for _ in range(2) for batch in loader]


@pytest.mark.parametrize(
    "workers, prefetch", [(0, None), (2, 1), (2, 2), ("auto", None)]
)  # fmt: skip
@pytest.mark.parametrize(
    "n, batch_size, drop_last",
    [(12, 2, False), (11, 3, False), (11, 3, True), (5, None, False)],
    ids=["whole-batches", "short-last", "short-dropped", "unbatched"],
)
def test_an_epoch_left_early_leaves_the_shuffles_generator_as_dataloaders_does(
    workers: int | str, prefetch: int | None, n: int, batch_size: int | None, drop_last: bool
) -> None:
    """``shuffle=True`` with a ``generator``: torch's RandomSampler draws once more from it at
    the next() that finds its pass over, and DataLoader asks for that next() only as its
    prefetch (or, without workers, its loop) reaches the end. Past an epoch the loop left after
    any number of batches, the next orders are drawn where DataLoader's are (found by a
    campaign: drapps drew that next() as the epoch started)."""
    reference = 0 if workers == "auto" else workers
    kwargs: dict[str, Any] = {"batch_size": batch_size, "shuffle": True, "drop_last": drop_last}
    batches = len(DataLoader(Indexed(n), **kwargs))
    kwargs["prefetch_factor"] = prefetch
    for taken in range(batches + 1):
        generator = torch.Generator().manual_seed(5)
        dataloader = DataLoader(Indexed(n), **kwargs, num_workers=reference, generator=generator)
        expected = _left_then_whole(dataloader, taken)
        generator = torch.Generator().manual_seed(5)
        with drapps.Loader(
            Indexed(n), **kwargs, num_workers=workers, generator=generator
        ) as loader:
            assert _left_then_whole(loader, taken) == expected, f"left after {taken}"


def _beside_then_whole(loader: Any) -> list[list[int]]:
    """A second iterator runs a whole epoch while the loop's holds one batch; then the loop's
    ends, and the next epoch runs."""
    first = iter(loader)
    steps = [next(first).tolist()]
    steps += [batch.tolist() for batch in loader]
    steps += [batch.tolist() for batch in first]
    return steps + [batch.tolist() for batch in loader]


@pytest.mark.parametrize("workers", [2, "auto"])
@pytest.mark.parametrize("batch_size", [2, 5])
def test_two_iterators_take_their_orders_from_the_shuffles_generator_as_dataloaders_do(
    workers: int | str, batch_size: int
) -> None:
    """Each iterator's RandomSampler draws its order from the loader's ``generator``, and once
    more at the next() that finds its pass over: drawn where DataLoader draws them, the
    orders are DataLoader's."""
    reference = 0 if workers == "auto" else workers
    kwargs: dict[str, Any] = {"batch_size": batch_size, "shuffle": True}
    generator = torch.Generator().manual_seed(3)
    expected = _beside_then_whole(
        DataLoader(Indexed(12), **kwargs, num_workers=reference, generator=generator)
    )
    generator = torch.Generator().manual_seed(3)
    with drapps.Loader(Indexed(12), **kwargs, num_workers=workers, generator=generator) as loader:
        assert _beside_then_whole(loader) == expected


@pytest.mark.parametrize(
    "gives, fails", [(8, None), (5, None), (8, 3), (8, 0)], ids=["whole", "short", "fails", "first"]
)
def test_without_workers_a_users_sampler_gives_each_batch_as_dataloaders_does(
    gives: int, fails: int | None
) -> None:
    """Without workers each batch is drawn at its own next(): between the loop's draws, a
    sampler that ends before its len() ends the epoch there, and one that fails raises at the
    batch it failed to give, then the epoch is over."""
    sampler = _DrawsEachBatch(16, 4, 8, gives, fails)
    expected = _steps(DataLoader(Indexed(16), batch_sampler=sampler))
    with drapps.Loader(Indexed(16), batch_sampler=sampler, num_workers=0) as loader:
        assert _steps(loader) == expected


def test_without_workers_a_checkpoint_holds_the_rest_of_a_pass_drawn_as_asked() -> None:
    """A checkpoint mid-epoch draws the rest of the user's sampler's pass then: the run goes
    on with those batches, and so does a run resumed from it."""
    kwargs: dict[str, Any] = {"batch_sampler": _DrawsEachBatch(16, 4, 6), "num_workers": 0}
    with drapps.Loader(Indexed(16), **kwargs) as loader:
        torch.manual_seed(0)
        it = iter(loader)
        seen = [next(it).tolist() for _ in range(2)]
        state = loader.state_dict()
        torch.rand(5)  # draws after the checkpoint change nothing that follows
        rest = [b.tolist() for b in it]
    assert len(seen) + len(rest) == 6 and state["batches"] == rest
    with drapps.Loader(Indexed(16), **kwargs) as resumed:
        resumed.load_state_dict(state)
        assert [b.tolist() for b in resumed] == rest


def test_the_rest_of_dataloaders_arguments_are_accepted() -> None:
    context = multiprocessing.get_context("spawn")
    kwargs: dict[str, Any] = {
        "batch_size": 4,
        "shuffle": True,
        "num_workers": 2,
        "timeout": 0,
        "prefetch_factor": 3,
        "persistent_workers": True,
        "in_order": True,
        "multiprocessing_context": context,
    }
    expected, got = both(Indexed(17), **kwargs)
    assert_batches_equal(got, expected)
    # The positional order is DataLoader's.
    with drapps.Loader(Indexed(8), 4, False, None, None, 0, None, False, True, 0) as loader:
        assert [b.tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_attributes_frameworks_read_match_dataloaders() -> None:
    data = Indexed(10)
    gen = torch.Generator()
    reference = DataLoader(data, batch_size=3, shuffle=True, num_workers=2, generator=gen)
    with drapps.Loader(data, batch_size=3, shuffle=True, num_workers=2, generator=gen) as loader:
        for name in ("dataset", "batch_size", "drop_last", "num_workers", "pin_memory",
                     "timeout", "worker_init_fn", "generator", "prefetch_factor",
                     "persistent_workers", "in_order", "collate_fn"):  # fmt: skip
            assert getattr(loader, name) == getattr(reference, name), name
        assert type(loader.sampler) is type(reference.sampler)
        assert type(loader.batch_sampler) is type(reference.batch_sampler)
        assert loader.batch_sampler.batch_size == 3
    with drapps.Loader(data, batch_sampler=[[0, 1]], workers=0) as loader:
        assert loader.batch_size is None and loader.drop_last is False


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"sampler": SequentialSampler(range(4)), "shuffle": True},
            "mutually exclusive with shuffle",
        ),
        ({"batch_sampler": [[0]], "batch_size": 2}, "batch_sampler option is mutually exclusive"),
        ({"batch_sampler": [[0]], "drop_last": True}, "batch_sampler option is mutually exclusive"),
        ({"batch_size": None, "drop_last": True}, "mutually exclusive with drop_last"),
        (
            {"num_workers": 0, "persistent_workers": True},
            "persistent_workers option needs num_workers > 0",
        ),
        (
            {"num_workers": 0, "multiprocessing_context": "spawn"},
            "multiprocessing_context can only be used with multi-process loading",
        ),
        ({"num_workers": 0, "prefetch_factor": 2}, "prefetch_factor needs worker processes"),
        ({"num_workers": 0, "timeout": 5}, "timeout needs num_workers > 0"),
        ({"workers": 0, "timeout": 0.5}, "timeout needs num_workers > 0"),
        ({"num_workers": 2, "workers": 3}, "num_workers and workers name the same setting"),
        ({"timeout": -1}, "timeout option should be non-negative"),
        (
            {"num_workers": 1, "multiprocessing_context": "bad"},
            "should specify a valid start method in",
        ),
        ({"sampler": [0, 1], "shuffle": 3}, "sampler option is mutually exclusive with shuffle"),
        ({"generator": 3}, "generator must be a torch.Generator"),
        ({"num_workers": -1}, "num_workers option should be non-negative"),
    ],
)
def test_invalid_combinations_are_refused_as_in_dataloader(
    kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        drapps.Loader(Indexed(4), **kwargs)


def test_a_timeout_is_taken_wherever_workers_may_run() -> None:
    """Only a count of 0 refuses one: the default count may start workers, and None (no
    limit) and 0 (DataLoader's default) ask for no limit anywhere."""
    for kwargs in ({"timeout": 5}, {"workers": 0, "timeout": None}, {"workers": 0, "timeout": 0.0}):
        with drapps.Loader(Indexed(4), batch_size=2, **kwargs) as loader:
            assert [b.tolist() for b in loader] == [[0, 1], [2, 3]]
    with pytest.raises(AssertionError, match="requires timeout == 0"):
        next(iter(DataLoader(Indexed(4), num_workers=0, timeout=5)))  # refused there too


def test_iterable_dataset_arguments_are_refused_in_dataloaders_words() -> None:
    """Scripts match DataLoader's wording; drapps' said 'Loader with an iterable dataset'."""
    for kwargs in ({"shuffle": True}, {"shuffle": 3}, {"sampler": [0]}, {"batch_sampler": [[0]]}):
        name = next(iter(kwargs))
        with pytest.raises(ValueError, match=f"DataLoader with IterableDataset: expected unspe"
                           f"cified {name} option"):  # fmt: skip
            drapps.Loader(Shards(4), **kwargs)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="multiprocessing_context option should be a valid"):
        drapps.Loader(Indexed(4), num_workers=1, multiprocessing_context=object())


def test_shuffle_is_taken_for_its_truth_as_in_dataloader() -> None:
    torch.manual_seed(0)
    expected = [b.tolist() for b in DataLoader(Indexed(8), batch_size=4, shuffle=1)]
    torch.manual_seed(0)
    with drapps.Loader(Indexed(8), batch_size=4, shuffle=1, num_workers=0) as loader:
        assert [b.tolist() for b in loader] == expected


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_workers": np.int64(2)},
        {"num_workers": 1, "prefetch_factor": np.int32(3)},
        {"num_workers": 1, "timeout": np.int64(60)},
        {"num_workers": 1, "timeout": np.float32(60)},
        {"num_workers": 1, "persistent_workers": 1},
        {"num_workers": 0, "pin_memory": np.True_},
        {"num_workers": 2, "in_order": np.False_},
    ],
    ids=repr,
)
def test_flags_and_counts_are_read_as_dataloader_reads_them(kwargs: dict[str, Any]) -> None:
    """DataLoader reads its flags for their truth and its counts and seconds as numbers of
    any kind, as a config file or an array gives them (drapps refused these)."""
    expected = sorted(b.tolist() for b in DataLoader(Indexed(8), batch_size=2, **kwargs))
    with drapps.Loader(Indexed(8), batch_size=2, **kwargs) as loader:
        assert sorted(b.tolist() for b in loader) == expected
        for name, value in kwargs.items():
            assert getattr(loader, name) == value, name


def test_drapps_own_counts_take_numpy_numbers_too() -> None:
    kwargs: dict[str, Any] = {
        "workers": np.int64(1),
        "max_workers": np.int32(3),
        "seed": np.uint64(7),
        "prefetch": np.int64(2),
        "memory_budget": np.int64(10**8),
        "control_interval": np.float32(0.25),
    }
    with drapps.Loader(Indexed(8), batch_size=2, **kwargs) as loader:
        it = iter(loader)
        got = [next(it).tolist()]
        loader.resize(np.int64(2))
        got += [b.tolist() for b in it]
        assert loader.num_workers == 2
        config = loader.config
        assert (config.workers, config.seed, config.prefetch) == (1, 7, 2)
        assert type(config.seed) is int and type(config.control_interval) is float
    with drapps.Loader(Indexed(8), batch_size=2, seed=7, workers=0) as expected:
        assert got == [b.tolist() for b in expected]


def test_a_count_that_is_no_integer_is_named() -> None:
    for value in (True, 1.5, "2"):
        with pytest.raises(ValueError, match=f"num_workers must be an int >= 0 or 'auto', got "
                           f"{re.escape(repr(value))}"):  # fmt: skip
            drapps.Loader(Indexed(4), num_workers=value)  # type: ignore[arg-type]


def _first_error(make: Callable[..., Any], dataset: Any, kwargs: dict[str, Any]) -> Exception:
    try:
        loader = make(dataset, **kwargs)
        next(iter(loader))
    except Exception as error:
        return error
    raise AssertionError(f"{make.__name__}{kwargs} took it")


@pytest.mark.parametrize(
    ("dataset", "kwargs"),
    [
        (None, {}),
        (5, {}),
        (Indexed(4), {"collate_fn": 5}),
        (Indexed(4), {"sampler": 5}),
        (Indexed(4), {"batch_sampler": 5}),
        (Indexed(4), {"shuffle": True, "generator": 1}),
        (Indexed(4), {"num_workers": "2"}),
        (Indexed(4), {"num_workers": 1.5}),
        (Indexed(4), {"num_workers": 1, "timeout": "1"}),
        (Indexed(4), {"num_workers": 1, "multiprocessing_context": 5}),
        (Indexed(4), {"batch_size": "2"}),
        (Indexed(4), {"num_workers": -1}),
        (Indexed(4), {"shuffle": True, "sampler": [0, 1]}),
    ],
    ids=repr,
)
def test_a_wrong_argument_raises_what_dataloader_raises_and_a_value_error(
    dataset: Any, kwargs: dict[str, Any]
) -> None:
    """DataLoader raises a TypeError for an argument of a wrong type (some only at the first
    batch), and a ValueError for a wrong value; drapps refuses both as the loader is made, with
    an error that is both, so code written for either catches it."""
    expected = type(_first_error(DataLoader, dataset, kwargs))
    with pytest.raises(drapps.ArgumentError) as raised:
        drapps.Loader(dataset, **kwargs)
    assert isinstance(raised.value, expected) and isinstance(raised.value, ValueError)


@pytest.mark.parametrize("workers", [2, 3])
def test_worker_info_and_worker_init_fn(workers: int, tmp_path: Any) -> None:
    with drapps.Loader(
        WorkerProbe(), batch_size=2, workers=workers, worker_init_fn=_mark_worker(tmp_path)
    ) as loader:
        batches = list(loader)
    ids = {int(i) for b in batches for i in b["id"]}
    assert ids <= set(range(workers)) and len(ids) >= 1
    assert {int(n) for b in batches for n in b["workers"]} == {workers}
    assert all(bool(s) for b in batches for s in b["same"])  # its own copy of the dataset
    started = sorted(int(p.name.split("-")[1]) for p in tmp_path.glob("init-*"))
    assert started == list(range(workers))
    with drapps.Loader(WorkerProbe(), batch_size=2, workers=0) as inline:
        assert {int(i) for b in inline for i in b["id"]} == {-1}  # no worker: None


class DiesOnce(Dataset[tuple[int, int, int]]):
    """Sample ``i`` is ``(i, get_worker_info().id, its num_workers)``; the first worker asked
    for sample 5 exits instead (once: ``flag`` marks that it has)."""

    def __init__(self, flag: Path) -> None:
        self.flag = flag

    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> tuple[int, int, int]:
        info = get_worker_info()
        if i == 5 and not self.flag.exists():
            self.flag.touch()
            os._exit(1)
        return i, info.id, info.num_workers


@pytest.mark.parametrize("persistent", [False, True])
def test_a_replacement_worker_takes_the_id_of_the_one_that_died(
    persistent: bool, tmp_path: Path
) -> None:
    """DataLoader's ids are below ``num_workers``, and a dataset that keys a resource by id
    (a file handle, a connection) relies on it. drapps makes a dead worker's batch again in
    a worker started in its place, which gets its id, in that epoch and, kept, in the next."""
    flag = tmp_path / "died"
    with drapps.Loader(
        DiesOnce(flag), batch_size=None, workers=2, persistent_workers=persistent
    ) as loader:
        epochs = [list(loader) for _ in range(2)]
    assert flag.exists()
    for samples in epochs:
        assert sorted(i for i, _, _ in samples) == list(range(24))
        assert {(w, n) for _, w, n in samples} <= {(0, 2), (1, 2)}


class _mark_worker:
    def __init__(self, directory: Any) -> None:
        self.directory = str(directory)

    def __call__(self, worker_id: int) -> None:
        assert get_worker_info() is not None and get_worker_info().id == worker_id
        open(f"{self.directory}/init-{worker_id}", "w").close()


@pytest.mark.parametrize("workers", WORKERS)
def test_a_workers_exception_keeps_its_type(workers: int) -> None:
    with pytest.raises(KeyError) as theirs:
        list(DataLoader(KeyErrorAt(), batch_size=2, num_workers=workers))
    # DataLoader's error holds its iterator in a reference cycle; freed by the collector,
    # the iterator waits 5 s for each of its workers. Freed now, it stops them at once.
    traceback.clear_frames(theirs.tb)
    with drapps.Loader(KeyErrorAt(), batch_size=2, workers=workers) as loader:
        with pytest.raises(KeyError, match="sample 5") as caught:
            list(loader)
    assert isinstance(caught.value, drapps.SampleError)
    assert caught.value.index == 5 and caught.value.original_type is KeyError


class FailsToCollate(Dataset[Any]):
    """Samples default_collate refuses (datetime arrays), keyed by 0-d tensors."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, key: torch.Tensor) -> Any:
        return np.zeros(2, dtype="datetime64[D]") + int(key)


@pytest.mark.parametrize("batch_size", [None, 2])
def test_a_workers_error_names_tensor_keys_by_value(batch_size: int | None) -> None:
    """Found by a campaign: a worker's error names its batch's keys; a sampler's tensor keys
    came back through torch's shared memory, and each held a descriptor open for as long as
    the loop kept the error (DataLoader's worker error holds only text)."""
    errors = []
    with drapps.Loader(
        FailsToCollate(), sampler=torch.arange(6), batch_size=batch_size, num_workers=2
    ) as loader:
        batches = iter(loader)
        for _ in range(len(loader)):
            with pytest.raises(TypeError) as caught:
                next(batches)
            errors.append(caught.value)
    keys = [key for error in errors for key in error.indices]
    assert all(isinstance(key, torch.Tensor) and not key.is_shared() for key in keys), keys


class CodedError(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class FailsWith(Dataset[int]):
    def __init__(self, error: Callable[[], Exception]) -> None:
        self.error = error

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        if i == 1:
            raise self.error()
        return i


def _missing_file() -> Exception:
    return FileNotFoundError(2, "No such file or directory", "/data/img1.jpg")


@pytest.mark.parametrize("workers", [0, 2])
def test_an_error_keeps_the_originals_fields(workers: int) -> None:
    """DataLoader without workers raises the dataset's own exception: its fields (an
    OSError's ``errno`` and ``filename``, a custom exception's) are there on drapps' too
    (found by running PyTorch's test_dataloader.py against drapps), and come from a worker
    with its error, where they pickle (DataLoader's worker error has none of them)."""
    with drapps.Loader(FailsWith(_missing_file), num_workers=workers) as loader:
        with pytest.raises(FileNotFoundError) as caught:
            list(loader)
    assert (caught.value.errno, caught.value.filename) == (2, "/data/img1.jpg")
    assert caught.value.strerror == "No such file or directory"
    assert caught.value.index == 1  # type: ignore[attr-defined]
    with drapps.Loader(FailsWith(lambda: CodedError(42)), num_workers=workers) as loader:
        with pytest.raises(CodedError) as coded:
            list(loader)
    assert coded.value.code == 42
    assert coded.value.stage == "__getitem__"  # type: ignore[attr-defined]


@pytest.mark.parametrize("workers", [0, 2])
def test_an_errors_class_pickles_as_dataloaders_does(workers: int) -> None:
    """``torch._utils.ExceptionWrapper`` pickles the exception's class (a process reporting
    a failure to its parent does): the combined class pickles by name, and a new process
    that has not raised one makes it as it unpickles it."""
    from torch._utils import ExceptionWrapper

    for error in (lambda: RuntimeError("worker error"), lambda: CodedError(7)):
        with drapps.Loader(FailsWith(error), num_workers=workers) as loader:
            try:
                list(loader)
            except Exception:
                wrapper = ExceptionWrapper(sys.exc_info())
        kind = pickle.loads(pickle.dumps(wrapper)).exc_type
        assert kind is wrapper.exc_type and issubclass(kind, drapps.SampleError)
        fresh = subprocess.run(
            [sys.executable, "-c", "import pickle, sys; print(pickle.load(sys.stdin.buffer))"],
            input=pickle.dumps(kind),
            capture_output=True,
            check=True,
            cwd=str(Path(__file__).parent),
        )
        assert (
            fresh.stdout.decode().strip() == f"<class 'drapps.runtime.errors.{kind.__qualname__}'>"
        )


def test_pin_memory_without_an_accelerator_warns_like_dataloader() -> None:
    if torch.accelerator.is_available():
        pytest.skip("an accelerator is present: tests/gpu covers pinning")
    with pytest.warns(UserWarning, match="no accelerator is found"):
        list(DataLoader(Indexed(4), batch_size=2, pin_memory=True))
    with pytest.warns(UserWarning, match="no accelerator is found") as warned:
        with drapps.Loader(Indexed(4), batch_size=2, pin_memory=True, workers=1) as loader:
            assert [b.tolist() for b in loader] == [[0, 1], [2, 3]]
    # At the user's line, as DataLoader's is (it pointed into drapps/loader.py).
    assert {w.filename for w in warned} == {__file__}


def test_in_order_false_without_worker_processes_keeps_the_order() -> None:
    # Batches made in the calling process come in order either way.
    with drapps.Loader(Indexed(9), batch_size=2, workers=0, in_order=False) as loader:
        assert [int(i) for b in loader for i in b] == list(range(9))


def test_set_epoch_reaches_a_distributed_sampler() -> None:
    sampler = DistributedSampler(Indexed(12), num_replicas=2, rank=1, shuffle=True, seed=5)
    with drapps.Loader(Indexed(12), batch_size=2, sampler=sampler, workers=2) as loader:
        loader.set_epoch(3)
        got = [int(i) for b in loader for i in b]
    sampler.set_epoch(3)
    assert got == list(sampler)


@pytest.mark.parametrize("workers", [0, 2, 3])
@pytest.mark.parametrize("uneven", [False, True])
def test_iterable_datasets_stream_as_in_dataloader(workers: int, uneven: bool) -> None:
    expected, got = both(Shards(23, uneven=uneven), batch_size=4, num_workers=workers)
    assert_batches_equal(got, expected)


@pytest.mark.parametrize("workers", [0, 2])
def test_iterable_randomness_is_seeded_per_worker_as_in_dataloader(workers: int) -> None:
    expected, got = both(Shards(12, noise=True), seed=7, batch_size=3, num_workers=workers)
    assert_batches_equal(got, expected)


class _PermutedStream(IterableDataset):  # type: ignore[type-arg]
    """A stream whose ``__iter__`` draws its order as it is called (not a generator)."""

    def __iter__(self) -> Iterator[int]:
        return iter(torch.randperm(8).tolist())


def test_without_workers_a_stream_is_started_as_its_iterator_is_made_as_in_dataloader() -> None:
    """DataLoader's iterator calls ``iter(dataset)`` as it is made: a draw from torch's RNG
    before its first ``next()`` comes after the stream's, and the base seed before it."""

    def epochs(loader: Any) -> tuple[list[list[int]], float]:
        torch.manual_seed(0)
        orders = []
        for _ in range(2):
            it = iter(loader)
            torch.rand(1)
            orders.append([int(x) for x in it])
        return orders, torch.rand(1).item()

    expected = epochs(DataLoader(_PermutedStream(), batch_size=None))
    with drapps.Loader(_PermutedStream(), batch_size=None, num_workers=0) as loader:
        assert epochs(loader) == expected


def test_iterable_len_drop_last_batch_none_and_stream_only_classes() -> None:
    for kwargs in ({"batch_size": 4}, {"batch_size": 4, "drop_last": True}, {"batch_size": None}):
        expected, got = both(Shards(10), num_workers=2, **kwargs)  # type: ignore[arg-type]
        assert_batches_equal(got, expected)
        with drapps.Loader(Shards(10), workers=2, **kwargs) as loader:  # type: ignore[arg-type]
            assert len(loader) == len(DataLoader(Shards(10), **kwargs))  # type: ignore[arg-type]
            assert len(iter(loader)) == len(loader)
    with drapps.Loader(StreamOnly(), batch_size=3, workers=2) as loader:
        # Each of the two workers iterates its own copy; batches alternate between them.
        assert [b.tolist() for b in loader] == [
            [0, 1, 2],
            [0, 1, 2],
            [3, 4, 5],
            [3, 4, 5],
            [6],
            [6],
        ]
        assert len(loader) == 3


def test_iterable_datasets_refuse_samplers_and_shuffle() -> None:
    for kwargs in ({"shuffle": True}, {"sampler": [0, 1]}, {"batch_sampler": [[0]]}):
        with pytest.raises(ValueError, match="with IterableDataset: expected unspecified"):
            drapps.Loader(Shards(4), **kwargs)  # type: ignore[arg-type]


def test_iterable_epochs_with_persistent_workers() -> None:
    # Mid-epoch resume of an iterable dataset is in the engines' conformance check.
    with drapps.Loader(Shards(20), batch_size=3, workers=2, persistent_workers=True) as loader:
        first = [b.tolist() for b in loader]
        pids = loader.stats().worker_pids
        second = [b.tolist() for b in loader]
        assert loader.stats().worker_pids == pids  # the same processes ran both epochs
    assert first == second


@pytest.mark.parametrize("persistent", [False, True])
def test_non_persistent_workers_see_the_dataset_as_it_is_each_epoch(persistent: bool) -> None:
    data = Indexed(6)
    with drapps.Loader(
        data, batch_size=3, workers=2, seed=0, persistent_workers=persistent
    ) as loader:
        list(loader)
        data.n = 3  # a curriculum step between epochs; len() is read in the training process
        pids = set(loader.stats().worker_pids)
        assert [b.tolist() for b in loader] == [[0, 1, 2]]
        assert (set(loader.stats().worker_pids) == pids) is persistent


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_mid_epoch_with_a_drawing_sampler(workers: int) -> None:
    # Shuffling from torch's seeding resumes in every engine's conformance check
    # (tests/conformance.py); a sampler that draws with replacement stores its batches too.
    weighted = WeightedRandomSampler([1.0] * 30, num_samples=20)
    with drapps.Loader(Indexed(30), batch_size=4, sampler=weighted, workers=workers) as loader:
        iterator = iter(loader)
        next(iterator)
        state = loader.state_dict()
        rest = list(iterator)
    with drapps.Loader(Indexed(30), batch_size=4, sampler=weighted, workers=workers) as resumed:
        resumed.load_state_dict(state)
        assert_batches_equal(list(resumed), rest)


class KeyTypes(Dataset[str]):
    """Each sample: the type of the key ``__getitem__`` was given."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, key: Any) -> str:
        return f"{type(key).__name__}:{getattr(key, 'dtype', '')}:{int(key)}"


@pytest.mark.parametrize("workers", [0, 2, "auto"])
@pytest.mark.parametrize(
    "sampler",
    [
        pytest.param(lambda: torch.randperm(12, dtype=torch.int32), id="tensor"),
        pytest.param(lambda: SubsetRandomSampler(torch.arange(12)), id="subset-of-a-tensor"),
        pytest.param(lambda: np.random.permutation(12), id="numpy"),
    ],
)
def test_a_resumed_epoch_gives_the_dataset_keys_of_the_samplers_type(
    workers: int | str, sampler: Callable[[], Any]
) -> None:
    """A sampler of tensor (or NumPy) keys: the resumed epoch's ``__getitem__`` gets them as
    the sampler gave them, as in the uninterrupted run (DataLoader hands them over as they
    are), not as the ints a checkpoint stores."""
    keys = sampler()
    kwargs = {"batch_size": 4, "sampler": keys, "collate_fn": list, "num_workers": workers}
    with drapps.Loader(KeyTypes(), **kwargs) as loader:
        iterator = iter(loader)
        head = next(iterator)
        state = json.loads(json.dumps(loader.state_dict()))
        rest = list(iterator)
    given = next(iter(DataLoader(KeyTypes(), **{**kwargs, "num_workers": 0})))
    assert [k.rsplit(":", 1)[0] for k in head] == [k.rsplit(":", 1)[0] for k in given]
    with drapps.Loader(KeyTypes(), **kwargs) as resumed:
        resumed.load_state_dict(state)
        assert list(resumed) == rest
        assert next(iter(resumed))[0].split(":")[:2] == head[0].split(":")[:2]  # the next epoch


def test_tensor_keys_reach_the_workers_by_value() -> None:
    """A worker gets the sampler's keys as DataLoader's does (0-d tensors of their dtype, and
    whatever else a batch sampler mixes in), while the sampler's tensor stays as the user
    gave it: not moved into shared memory and handed over by descriptor at every batch."""
    keys = torch.randperm(12, dtype=torch.int16)
    mixed = [[torch.tensor(1), 2, np.int64(3)], [torch.tensor(4.0, dtype=torch.bfloat16)]]
    for kwargs in ({"batch_size": 4, "sampler": keys}, {"batch_sampler": mixed}):
        given = list(DataLoader(KeyTypes(), collate_fn=list, num_workers=0, **kwargs))
        with drapps.Loader(KeyTypes(), collate_fn=list, num_workers=2, **kwargs) as loader:
            assert list(loader) == given
    assert not keys.is_shared()


def test_a_checkpoints_key_type_must_name_an_integer_dtype() -> None:
    kwargs = {"batch_size": 4, "sampler": torch.arange(12), "collate_fn": list, "num_workers": 0}
    with drapps.Loader(KeyTypes(), **kwargs) as loader:
        next(iter(loader))
        state = loader.state_dict()
    assert state["key_type"] == "torch.int64"
    with drapps.Loader(KeyTypes(), **kwargs) as other:
        wrong_ones = ("torch.float32", "torch.bool", "torch.qint8", "numpy.float64", "int", 3)
        for wrong in (*wrong_ones, "numpy.nonsense"):
            with pytest.raises(ValueError, match=f"key_type must name .*got {wrong!r}"):
                other.load_state_dict({**state, "key_type": wrong})
        with pytest.raises(ValueError, match=r"integer keys of torch\.uint8"):
            other.load_state_dict({**state, "key_type": "torch.uint8", "batches": [[300]]})
        other.load_state_dict(state)  # the loader is unchanged by the refused ones
        assert [k.split(":")[0] for b in other for k in b] == ["Tensor"] * 8


def _seeded_loader(where: str, **kwargs: Any) -> drapps.Loader:
    """A shuffling loader whose order comes from a generator seeded 5: the loader's
    ``generator`` (``"loader"``), or a ``RandomSampler``'s own (``"sampler"``)."""
    generator = torch.Generator().manual_seed(5)
    if where == "loader":
        return drapps.Loader(Indexed(7), batch_size=2, shuffle=True, generator=generator, **kwargs)
    sampler = RandomSampler(range(7), generator=generator)
    return drapps.Loader(Indexed(7), batch_size=2, sampler=sampler, **kwargs)


@pytest.mark.parametrize("where", ["loader", "sampler"])
@pytest.mark.parametrize(
    "kwargs",
    [{"workers": 0}, {"workers": 2}, {"workers": 2, "persistent_workers": True}, {}],
    ids=["0", "2", "2-persistent", "auto"],
)
@pytest.mark.parametrize(("epoch", "taken"), [(0, 1), (1, 0), (1, 3)])
def test_a_resumed_run_draws_the_later_epochs_from_the_generator_as_the_uninterrupted_one(
    where: str, kwargs: dict[str, Any], epoch: int, taken: int
) -> None:
    """A checkpoint holds the generator's state, and loading it restores it: the epochs after
    the resumed one are the uninterrupted run's, where a generator seeded afresh would
    repeat the first epoch's order (a new process seeds it as the first did)."""
    with _seeded_loader(where, **kwargs) as loader:
        whole = [[b.tolist() for b in loader] for _ in range(4)]
    assert whole[0] != whole[1]
    with _seeded_loader(where, **kwargs) as loader:
        for _ in range(epoch):
            list(loader)
        iterator = iter(loader)
        head = [next(iterator).tolist() for _ in range(taken)]
        state = json.loads(json.dumps(loader.state_dict()))
    torch.manual_seed(99)  # another process: torch's generator is not the one drawn from
    with _seeded_loader(where, **kwargs) as resumed:
        resumed.load_state_dict(state)
        after = [[b.tolist() for b in resumed] for _ in range(4 - epoch)]
    assert [head + after[0], *after[1:]] == whole[epoch:]


class WorkerShuffled(IterableDataset):  # type: ignore[type-arg]
    """Each worker's share of 8 items, in an order drawn from its torch generator (which
    DataLoader seeds from the epoch's base seed)."""

    def __iter__(self) -> Iterator[int]:
        info = get_worker_info()
        share = torch.arange(8)[info.id :: info.num_workers] if info else torch.arange(8)
        return iter(share[torch.randperm(len(share))].tolist())


def test_a_resumed_stream_draws_its_later_epochs_from_the_generator() -> None:
    """The same for an iterable dataset, whose epochs' base seeds the generator draws."""

    def loader() -> drapps.Loader:
        generator = torch.Generator().manual_seed(5)
        return drapps.Loader(WorkerShuffled(), batch_size=2, workers=2, generator=generator)

    with loader() as whole_run:
        whole = [[b.tolist() for b in whole_run] for _ in range(3)]
    assert whole[0] != whole[1]
    with loader() as interrupted:
        list(interrupted)
        iterator = iter(interrupted)
        head = [next(iterator).tolist()]
        state = json.loads(json.dumps(interrupted.state_dict()))
    with loader() as resumed:
        resumed.load_state_dict(state)
        after = [[b.tolist() for b in resumed] for _ in range(2)]
    assert [head + after[0], after[1]] == whole[1:]


def test_a_checkpoints_generators_must_be_this_loaders() -> None:
    with _seeded_loader("loader", workers=0) as loader:
        next(iter(loader))
        state = loader.state_dict()
    assert set(state["generators"]) == {"loader"}
    generator = torch.Generator().manual_seed(3)
    sampler = RandomSampler(range(7), generator=generator)
    with drapps.Loader(Indexed(7), batch_size=2, sampler=sampler, workers=0) as other:
        with pytest.raises(ValueError, match=r"saved with generators \['loader'\] but this"):
            other.load_state_dict(state)
        with pytest.raises(ValueError, match=r"saved with generators \['1', 'loader'\]"):
            other.load_state_dict({**state, "generators": {1: "", "loader": ""}})
        with pytest.raises(ValueError, match=r"generators\['sampler'\] must be a generator"):
            other.load_state_dict({**state, "generators": {"sampler": "bm90IGEgc3RhdGU="}})
        assert torch.equal(generator.get_state(), torch.Generator().manual_seed(3).get_state())
    with drapps.Loader(Indexed(7), batch_size=2, shuffle=True, workers=0) as without:
        with pytest.raises(ValueError, match=r"but this loader has \[\]"):
            without.load_state_dict(state)
        without.load_state_dict({k: v for k, v in state.items() if k != "generators"})


class Unsharded(IterableDataset):  # type: ignore[type-arg]
    """Yields all of its items in every worker: it never reads get_worker_info()."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[torch.Tensor]:
        return (torch.tensor(i) for i in range(self.n))


def test_the_default_worker_count_never_duplicates_an_unsharded_iterable() -> None:
    # DataLoader's default loads in the training process: each item once, in order. drapps'
    # default starts workers, and only the first streams a dataset that does not shard itself.
    expected = [b.tolist() for b in DataLoader(Unsharded(20), batch_size=3)]
    with pytest.warns(UserWarning, match="Unsharded does not read .*get_worker_info"):
        with drapps.Loader(Unsharded(20), batch_size=3) as loader:
            assert loader.num_workers > 1
            assert [b.tolist() for b in loader] == expected
            assert [b.tolist() for b in loader] == expected  # every epoch
    # A dataset that shards itself is streamed by every worker, as in DataLoader.
    workers = drapps.Loader(Shards(20), batch_size=3).num_workers
    sharded = [b.tolist() for b in DataLoader(Shards(20), batch_size=3, num_workers=workers)]
    with drapps.Loader(Shards(20), batch_size=3) as loader:
        assert [b.tolist() for b in loader] == sharded
    # Workers asked for by count do what DataLoader's do, duplicates included.
    asked = [b.tolist() for b in DataLoader(Unsharded(6), batch_size=3, num_workers=2)]
    with drapps.Loader(Unsharded(6), batch_size=3, num_workers=2) as loader:
        assert [b.tolist() for b in loader] == asked and len(asked) == 4


def test_more_workers_than_cores_warn_as_in_dataloader_and_run() -> None:
    many = 2 * usable_cores() + 1  # past the default bound, which no longer refuses it
    with pytest.warns(UserWarning, match="excessive worker creation might get DataLoader"):
        torch_loader = DataLoader(Indexed(8), batch_size=2, num_workers=many)
    expected = [b.tolist() for b in torch_loader]
    with pytest.warns(UserWarning, match="excessive worker creation might get DataLoader") as w:
        with drapps.Loader(Indexed(8), batch_size=2, num_workers=many) as loader:
            assert loader.config.resolved_max_workers == many
            assert [b.tolist() for b in loader] == expected
    assert {warning.filename for warning in w} == {__file__}


@pytest.mark.parametrize("persistent", [False, True])
def test_the_excessive_workers_warning_comes_with_each_iterator_as_in_dataloader(
    persistent: bool,
) -> None:
    """At construction and as each iterator starts its workers (the first only, with
    persistent workers): counted under ``simplefilter("always")``."""
    many = usable_cores() + 1

    def warned(make: Callable[[], Any]) -> int:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loader = make()
            for _ in range(3):
                list(loader)
        if isinstance(loader, drapps.Loader):
            loader.close()
        return sum("excessive worker creation" in str(w.message) for w in caught)

    kwargs: dict[str, Any] = {
        "batch_size": 4,
        "num_workers": many,
        "persistent_workers": persistent,
    }
    expected = warned(lambda: DataLoader(Indexed(8), **kwargs))
    assert expected == (2 if persistent else 4)
    assert warned(lambda: drapps.Loader(Indexed(8), **kwargs)) == expected


def test_a_loader_type_takes_a_parameter_as_dataloaders_does() -> None:
    def first(loader: drapps.Loader[torch.Tensor]) -> torch.Tensor:
        return next(iter(loader))

    assert DataLoader[int].__origin__ is DataLoader
    assert drapps.Loader[torch.Tensor].__origin__ is drapps.Loader
    with drapps.Loader(Indexed(4), batch_size=2, num_workers=0) as loader:
        assert first(loader).tolist() == [0, 1]


class Drawing(Indexed):
    """``(i, torch.rand(2))``."""

    def __getitem__(self, i: Any) -> tuple[int, torch.Tensor]:
        return int(i), torch.rand(2)


@pytest.mark.parametrize("copied", ["pickle", "deepcopy"])
@pytest.mark.parametrize("workers", [0, 2, "auto"])
def test_a_copied_loader_stands_where_the_original_stood_with_workers_of_its_own(
    copied: str, workers: Any
) -> None:
    """DataLoader pickles and deep-copies (``torch.multiprocessing.spawn`` pickles its
    arguments); a Loader's copy is a new loader made with the same arguments, resuming where
    the original stood. It raised "cannot pickle '_thread.RLock' object"."""
    copy_of = {"pickle": lambda x: pickle.loads(pickle.dumps(x)), "deepcopy": copy.deepcopy}
    with drapps.Loader(Drawing(12), batch_size=2, shuffle=True, seed=3, workers=workers) as a:
        whole = list(a)
        iterator = iter(a)
        head = [next(iterator) for _ in range(2)]
        with copy_of[copied](a) as b:
            assert b is not a and b._parts is not a._parts
            tail = list(b)  # the rest of the original's second epoch
            after = list(b)  # and the epoch after it
        rest = list(iterator)  # the original goes on, untouched
        assert_batches_equal(rest, tail)
        assert_batches_equal(list(a), after)
    assert len(head + tail) == len(whole) == 6
    closed = copy_of[copied](a)
    with pytest.raises(RuntimeError, match="closed"):
        iter(closed)


def test_a_copy_leaves_the_originals_trace_alone(tmp_path: Any) -> None:
    trace = tmp_path / "trace.jsonl"
    with drapps.Loader(Indexed(64), batch_size=2, trace=trace, control_interval=0.05) as a:
        next(iter(a))
        assert wait_until(lambda: trace.exists() and trace.stat().st_size > 0, timeout=30)
        written = trace.read_bytes()
        with copy.deepcopy(a) as b:
            assert b.config.trace is None and len(list(b)) == 31
        assert trace.read_bytes().startswith(written)  # it goes on, not over


def test_a_copy_of_dataloader_arguments_is_dataloaders_copy() -> None:
    """What the copy copies is DataLoader's: its dataset, sampler and generator (drawing
    on from the same state)."""
    generator = torch.Generator().manual_seed(5)
    torch_loader = DataLoader(Indexed(10), batch_size=2, shuffle=True, generator=generator)
    with drapps.Loader(Indexed(10), batch_size=2, shuffle=True, generator=generator) as loader:
        torch_copy, copied = copy.deepcopy(torch_loader), copy.deepcopy(loader)
        assert copied.generator is not loader.generator and copied.dataset is not loader.dataset
        with copied:
            assert [b.tolist() for b in copied] == [b.tolist() for b in torch_copy]


@pytest.mark.parametrize(
    "name", ["batch_size", "batch_sampler", "sampler", "drop_last", "dataset", "persistent_workers"]
)
def test_attributes_that_fix_the_batches_refuse_a_new_value(name: str) -> None:
    torch_loader = DataLoader(Indexed(4), batch_size=2)
    with pytest.raises(ValueError, match=f"{name} attribute should not be set after DataLoader"):
        setattr(torch_loader, name, getattr(torch_loader, name))
    with drapps.Loader(Indexed(4), batch_size=2, num_workers=0) as loader:
        with pytest.raises(ValueError, match=f"{name} attribute should not be set after Loader"):
            setattr(loader, name, getattr(loader, name))
        loader.timeout = 0  # the others are read at iter(), as in DataLoader (below)
        assert [b.tolist() for b in loader] == [[0, 1], [2, 3]]


def _reseeded(worker_id: int) -> None:
    random.seed(1000 + worker_id)
    torch.manual_seed(2000 + worker_id)


def _negated(samples: list[torch.Tensor]) -> torch.Tensor:
    return -torch.stack(samples)


_SET_AFTER = {
    "worker_init_fn": _reseeded,  # as Lightning's seed_everything(workers=True) sets it
    "collate_fn": _negated,
    "num_workers": 3,
    "prefetch_factor": 4,
}


@pytest.mark.parametrize("name", [*_SET_AFTER, "num_workers=0"])
@pytest.mark.parametrize("persistent", [False, True])
def test_an_argument_set_after_the_first_epoch_is_read_at_the_next_iter_as_dataloaders(
    name: str, persistent: bool
) -> None:
    """DataLoader reads these again as each iter() makes its workers (persistent ones keep
    what they were made with, and num_workers=0 makes the next epoch in the training
    process): the epochs after the attribute is set are DataLoader's, draws included."""
    attribute, value = ("num_workers", 0) if name == "num_workers=0" else (name, _SET_AFTER[name])

    def epochs(make: Callable[..., Any]) -> list[list[list[float]]]:
        torch.manual_seed(0)
        random.seed(0)
        np.random.seed(0)
        loader = make(Augmented(), batch_size=3, num_workers=2, persistent_workers=persistent)
        first = [b.tolist() for b in loader]
        setattr(loader, attribute, value)
        assert getattr(loader, attribute) == value
        later = [[b.tolist() for b in loader] for _ in range(2)]
        if hasattr(loader, "close"):
            loader.close()
        return [first, *later]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # three workers on two cores
        assert epochs(drapps.Loader) == epochs(DataLoader)


def _recorder(pl: Any) -> Any:
    """A LightningModule class that keeps each training batch it is given, as a list."""

    class Recorder(pl.LightningModule):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)
            self.seen: list[list[float]] = []

        def training_step(self, batch: torch.Tensor, _: int) -> torch.Tensor:
            self.seen.append(batch.tolist())
            return self.layer(batch[:, :1].float()).mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.0)

    return Recorder


@pytest.mark.extras
@pytest.mark.filterwarnings("ignore::UserWarning")  # Lightning's advice on a CPU run
def test_lightnings_seeded_workers_draw_in_drapps_workers_as_in_dataloaders() -> None:
    """``seed_everything(workers=True)`` has Lightning set its ``worker_init_fn`` on the
    loader it is given, after the loader is made: the epochs' draws are then DataLoader's.
    Lightning checks that a loader which is not a DataLoader is iterable by calling
    ``iter()`` on it once, which draws a base seed as DataLoader's ``iter()`` does: the
    DataLoader run takes that iterator too."""
    pl = pytest.importorskip("pytorch_lightning")

    Recorder = _recorder(pl)

    def fit(make: Callable[..., Any]) -> tuple[list[list[float]], Any]:
        pl.seed_everything(7, workers=True)
        loader, model = make(Augmented(), batch_size=3, num_workers=2), Recorder()
        if isinstance(loader, DataLoader):
            iter(loader)  # what Lightning's check does to drapps' loader
        trainer = pl.Trainer(
            accelerator="cpu", devices=1, max_epochs=2, logger=False,
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        )  # fmt: skip
        trainer.fit(model, train_dataloaders=loader)
        init = loader.worker_init_fn
        if hasattr(loader, "close"):
            loader.close()
        return model.seen, init

    (theirs, their_init), (ours, our_init) = fit(DataLoader), fit(drapps.Loader)
    assert our_init is not None and our_init.func is their_init.func  # Lightning's, set on it
    assert len(ours) == 8 and ours == theirs


RESUMED = [
    pytest.param({"seed": 0, "num_workers": 2}, id="seed-2-workers"),
    pytest.param({"seed": 0}, id="seed-auto"),
    pytest.param({"workers": "auto"}, id="auto"),
]
"""Loaders whose resumed run is the uninterrupted one's, draws included: per-sample seeds (from
the ``seed``, or under ``"auto"`` from the epoch's base seed, which a checkpoint holds)."""


class SizedShards(AugmentedShards):
    """A stream that says its length, as Lightning needs to take no batch ahead of its step."""

    def __len__(self) -> int:
        return 24


@pytest.mark.extras
@pytest.mark.filterwarnings("ignore::UserWarning")  # Lightning's advice on a CPU run
@pytest.mark.parametrize(
    ("options", "dataset"),
    [
        *(pytest.param(*p.values, Augmented, id=p.id) for p in RESUMED),
        pytest.param({"seed": 0, "num_workers": 2}, SizedShards, id="stream-2-workers"),
    ],
)
def test_lightnings_mid_epoch_checkpoint_resumes_the_loaders_epoch(
    options: dict[str, Any], dataset: Callable[[], Any], tmp_path: Path
) -> None:
    """Lightning saves a loader's ``state_dict()`` in its checkpoints and restores it: a fit
    resumed from a checkpoint taken mid-epoch gets the rest of that epoch, then the epochs
    after it, as the uninterrupted fit did (the checkpoint after 4 batches of 6, or of 12)."""
    pl = pytest.importorskip("pytorch_lightning")

    Recorder = _recorder(pl)

    def fit(seed: int, ckpt_path: Path | None = None) -> list[list[float]]:
        torch.manual_seed(seed)
        model = Recorder()
        saves = pl.callbacks.ModelCheckpoint(
            dirpath=tmp_path, every_n_train_steps=4, save_top_k=-1, filename="{step}"
        )
        trainer = pl.Trainer(
            accelerator="cpu", devices=1, max_steps=14, logger=False, callbacks=[saves],
            enable_progress_bar=False, enable_model_summary=False,
        )  # fmt: skip
        shuffle = None if dataset is SizedShards else True
        with drapps.Loader(dataset(), batch_size=2, shuffle=shuffle, **options) as loader:
            trainer.fit(model, train_dataloaders=loader, ckpt_path=ckpt_path)
        return model.seen

    whole = fit(0)
    resumed = fit(1, tmp_path / "step=4.ckpt")  # another torch seed: nothing left to chance
    assert len(whole) == len(resumed) + 4 == 14
    # Without a seed the later epochs draw their base seeds from torch's RNG, as a new
    # DataLoader would, and Lightning does not restore it: only the epoch's rest is the same.
    same = resumed if "seed" in options else resumed[:2]
    assert same == whole[4 : 4 + len(same)]


@pytest.fixture
def accelerate() -> Iterator[Any]:
    """Accelerate, its process-wide state reset after the test (an ``Accelerator`` left
    made would have every later loader in this process stand in its gradient state)."""
    module = pytest.importorskip("accelerate")
    yield module
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


@pytest.mark.extras
@pytest.mark.parametrize("left", [None, 5], ids=["whole-epochs", "first-epoch-left-early"])
@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"num_workers": 0}, id="inline"),
        pytest.param({"num_workers": 2}, id="processes"),
        pytest.param({"num_workers": 2, "backend": "thread"}, id="threads"),
        pytest.param({}, id="auto"),
    ],
)
def test_accelerates_accumulation_steps_at_each_epochs_end_as_with_a_dataloader(
    accelerate: Any, options: dict[str, Any], left: int | None
) -> None:
    """Under ``accelerator.accumulate()`` with 4 steps, epochs of 10 batches: the optimizer
    steps after batches 4, 8 and the epoch's last, as with a DataLoader that Accelerate
    wraps, also with an evaluation loader run to its end mid-epoch and an epoch the loop
    leaves early (a ``break``). Without the epoch's end, the accumulation ran on into the
    next epoch."""

    def syncs(make: Callable[..., Any]) -> list[tuple[int, int]]:
        accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=4)
        model = torch.nn.Linear(1, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        data = torch.arange(40.0).unsqueeze(1)
        kwargs = options if make is drapps.Loader else {}
        train, evaluation = make(data, batch_size=4, **kwargs), make(data, batch_size=8)
        model, optimizer, train, evaluation = accelerator.prepare(
            model, optimizer, train, evaluation
        )
        stepped = []
        for epoch in range(3):
            for k, batch in enumerate(train):
                with accelerator.accumulate(model):
                    model(batch).sum().backward()
                    optimizer.step()
                    optimizer.zero_grad()
                    if accelerator.sync_gradients:
                        stepped.append((epoch, k))
                if k == 2:
                    with torch.no_grad():
                        assert sum(len(b) for b in evaluation) == 40
                if epoch == 0 and k == left:
                    break
        for loader in (train, evaluation):
            if hasattr(loader, "close"):
                loader.close()
        return stepped

    theirs = syncs(DataLoader)
    assert (0, 9) in theirs or left is not None
    assert syncs(drapps.Loader) == theirs


@pytest.mark.extras
@pytest.mark.parametrize("options", RESUMED)
def test_accelerates_saved_state_resumes_a_registered_loader_mid_epoch(
    accelerate: Any, options: dict[str, Any], tmp_path: Path
) -> None:
    """``accelerator.register_for_checkpointing(loader)``: ``save_state()`` keeps the loader's
    ``state_dict()`` and ``load_state()`` restores it in a new run, which gets the rest of the
    epoch and the next one as the uninterrupted run did."""

    def run(seed: int, save_after: int | None = None) -> list[list[float]]:
        torch.manual_seed(seed)
        accelerator = accelerate.Accelerator(cpu=True)
        loader = drapps.Loader(Augmented(), batch_size=2, shuffle=True, **options)
        loader = accelerator.prepare(loader)
        accelerator.register_for_checkpointing(loader)
        with loader:
            if save_after is None:
                accelerator.load_state(str(tmp_path))
                return [b.tolist() for _ in range(2) for b in loader]
            epoch = iter(loader)
            taken = [next(epoch).tolist() for _ in range(save_after)]
            accelerator.save_state(str(tmp_path))
            return taken + [b.tolist() for b in epoch] + [b.tolist() for b in loader]

    whole = run(0, save_after=4)
    assert len(whole) == 12 and run(1) == whole[4:]


def test_an_argument_set_mid_epoch_leaves_the_epoch_under_way_as_dataloader() -> None:
    def epochs(make: Callable[..., Any]) -> tuple[list[Any], list[Any]]:
        torch.manual_seed(0)
        loader = make(Indexed(8), batch_size=2, num_workers=2)
        iterator = iter(loader)
        next(iterator)
        loader.collate_fn = _negated
        rest, after = [b.tolist() for b in iterator], [b.tolist() for b in loader]
        if hasattr(loader, "close"):
            loader.close()
        return rest, after

    assert (
        epochs(drapps.Loader)
        == epochs(DataLoader)
        == ([[2, 3], [4, 5], [6, 7]], [[0, -1], [-2, -3], [-4, -5], [-6, -7]])
    )


def test_an_argument_refused_at_the_next_iter_names_it_and_the_loader_goes_on() -> None:
    with drapps.Loader(Indexed(4), batch_size=2, num_workers=0) as loader:
        loader.timeout = 5.0  # DataLoader fails its next iter() too (an assertion there)
        with pytest.raises(ValueError, match=r"timeout needs num_workers > 0"):
            iter(loader)
        loader.timeout = 0
        assert [b.tolist() for b in loader] == [[0, 1], [2, 3]]
        with pytest.raises(ValueError, match="num_workers option should be non-negative"):
            loader.num_workers = -1
        with pytest.raises(TypeError, match="num_workers must be an int >= 0 or 'auto'"):
            loader.num_workers = "2"
        assert loader.num_workers == 0
        loader.generator = None  # the one it holds: free
        with pytest.raises(ValueError, match="generator attribute should not be set after"):
            loader.generator = torch.Generator()


def test_shuffle_true_with_a_datapipe_that_cannot_shuffle_says_it_stays_unshuffled() -> None:
    datapipes = pytest.importorskip("torch.utils.data.datapipes.iter")
    pipe = datapipes.IterableWrapper(range(10))
    expected = [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        unshuffled = DataLoader(pipe, batch_size=2, shuffle=True)
        assert [b.tolist() for b in unshuffled] == expected  # DataLoader's, whatever it says
    with pytest.warns(UserWarning, match=r"has no \.shuffle\(\): it is not shuffled"):
        loader = drapps.Loader(pipe, batch_size=2, shuffle=True, num_workers=0)
    with loader:
        assert [b.tolist() for b in loader] == expected


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("shuffle", [True, False, None])
def test_shuffle_turns_a_datapipes_shuffles_on_or_off_as_in_dataloader(
    shuffle: bool | None, workers: int
) -> None:
    """``shuffle=False`` turns a pipe's ``.shuffle()`` off (in place, as DataLoader does);
    True turns it on; None leaves it. Each gives DataLoader's order."""
    settings = {"shuffle": shuffle, "num_workers": workers}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = _pipe_epochs(torch.utils.data.DataLoader, settings)
        got = _pipe_epochs(drapps.Loader, settings)
    assert got == expected
    unshuffled = [item for item, _ in got] == [list(range(24))] * 3
    assert unshuffled == (shuffle is False)


def test_a_dataset_spawned_workers_cannot_receive_loads_in_process_by_default() -> None:
    class Local(Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return 6

        def __getitem__(self, i: int) -> torch.Tensor:
            return torch.tensor(i)

    # DataLoader's default loads in the training process, where a local class works.
    expected = [b.tolist() for b in DataLoader(Local(), batch_size=2)]
    sent = "the dataset cannot be sent to 'spawn' worker processes .*module level"
    with pytest.warns(UserWarning, match=sent):
        with drapps.Loader(
            Local(), batch_size=2, multiprocessing_context="spawn", persistent_workers=True
        ) as loader:
            assert loader.num_workers == 0
            assert [b.tolist() for b in loader] == expected


@pytest.mark.parametrize("part", ["worker_init_fn", "collate_fn"])
def test_a_function_workers_cannot_receive_is_named_with_the_fix(part: str) -> None:
    def local(value: Any) -> Any:
        return default_collate(value) if part == "collate_fn" else None

    with pytest.raises(
        pickle.PicklingError,
        match=f"{part} cannot be sent to 'spawn' worker processes .*define it at module level",
    ):
        drapps.Loader(
            Indexed(6),
            batch_size=2,
            num_workers=2,
            multiprocessing_context="spawn",
            **{part: local},
        )


FD_LIMIT_SCRIPT = """
import resource, torch, drapps
resource.setrlimit(resource.RLIMIT_NOFILE, (20, 20))
data = [torch.zeros(2)] * 64
try:
    list(drapps.Loader(data, batch_size=2, num_workers=6, multiprocessing_context="fork"))
except RuntimeError as e:
    print("RuntimeError:", e)
"""


def test_the_open_file_limit_is_a_runtime_error_naming_ulimit() -> None:
    # DataLoader raises RuntimeError here, so that is what scripts catch.
    out = subprocess.run(
        [sys.executable, "-c", FD_LIMIT_SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert "RuntimeError: Too many open files" in out.stdout, out.stdout + out.stderr
    assert "ulimit -n" in out.stdout and "set_sharing_strategy" in out.stdout


class HeldUntilReleased:
    """Sample 0 is made only once the loop has received another batch (or after 60 s)."""

    def __init__(self, release: Any) -> None:
        self.release = release

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == 0:
            self.release.wait(timeout=60)
        return torch.tensor(i)


def test_in_order_false_hands_batches_over_as_they_are_made_and_resumes() -> None:
    # As DataLoader(in_order=False): a slow batch holds back none behind it; each comes once.
    context = multiprocessing.get_context("fork")
    release = context.Event()
    options = {"batch_size": 1, "num_workers": 2, "multiprocessing_context": context, "seed": 3}
    with drapps.Loader(HeldUntilReleased(release), in_order=False, **options) as loader:
        iterator = iter(loader)
        first = next(iterator).item()
        state = loader.state_dict()  # batch 0 is still owed, though a later one was delivered
        release.set()
        rest = [b.item() for b in iterator]
    assert first != 0
    assert sorted([first, *rest]) == list(range(8))
    assert state["next_batch"] == 0 and [first] not in state["batches"]
    release.set()
    with drapps.Loader(HeldUntilReleased(release), **options) as resumed:
        resumed.load_state_dict(state)
        assert sorted([first, *(b.item() for b in resumed)]) == list(range(8))


class WhichWorker:
    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor(get_worker_info().id)


def test_a_fixed_worker_count_deals_batches_round_robin_as_dataloader() -> None:
    # Scripts read get_worker_info().id per batch for logging and sharded side effects.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 3 workers on 2 cores: DataLoader's warning
        expected = [b.tolist() for b in DataLoader(WhichWorker(), batch_size=2, num_workers=3)]
        with drapps.Loader(WhichWorker(), batch_size=2, num_workers=3) as loader:
            assert [b.tolist() for b in loader] == expected
    assert expected[:3] == [[0, 0], [1, 1], [2, 2]]


@pytest.mark.parametrize("persistent", [False, True])
def test_workers_exit_when_an_epoch_ends_unless_persistent(persistent: bool) -> None:
    # DataLoader's workers exit with an exhausted iterator unless persistent_workers=True.
    with drapps.Loader(
        Indexed(8), batch_size=2, num_workers=2, persistent_workers=persistent
    ) as loader:
        assert len(list(loader)) == 4
        pids = loader.stats().worker_pids
        assert len(pids) == 2
        gone = wait_until(lambda: not loader.stats().worker_pids, timeout=3 if persistent else 30)
        assert gone is not persistent
        assert [int(i) for b in loader for i in b] == list(range(8))  # the next epoch runs
        assert (set(loader.stats().worker_pids) == set(pids)) is persistent


def test_far_more_batches_ahead_than_a_loop_can_use_get_a_word() -> None:
    """``prefetch_factor=10**9`` was taken with no word: the memory budget alone bounds it."""
    with pytest.warns(UserWarning, match="prefetch_factor=1000000000 asks for more") as warned:
        with drapps.Loader(
            Indexed(4), batch_size=2, num_workers=1, prefetch_factor=10**9
        ) as loader:
            assert [b.tolist() for b in loader] == [[0, 1], [2, 3]]
    assert {w.filename for w in warned} == {__file__}


class LongerThanItsLen(IterableDataset):  # type: ignore[type-arg]
    def __iter__(self) -> Iterator[int]:
        return iter(range(8))

    def __len__(self) -> int:
        return 4


@pytest.mark.parametrize("workers", [0, 1])
def test_a_stream_longer_than_its_len_warns_as_in_dataloader(workers: int) -> None:
    """Once len(loader) was read, each batch past it gets DataLoader's warning (drapps gave
    none)."""

    def warned(make: Any) -> int:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loader = make(LongerThanItsLen(), batch_size=None, num_workers=workers)
            assert len(loader) == 4 and len(list(loader)) == 8
            getattr(loader, "close", lambda: None)()
        return sum(str(w.message).startswith("Length of IterableDataset ")
                   and "was reported to be 4" in str(w.message) for w in caught)  # fmt: skip

    assert warned(drapps.Loader) == warned(DataLoader) == 4


@pytest.mark.parametrize("workers", [0, 1])
def test_a_batched_stream_longer_than_its_len_warns_past_len_loader(workers: int) -> None:
    """8 items, a ``len()`` of 4, batches of 2: ``len(loader)`` says 2 batches and 4 come.
    DataLoader counts batches against the dataset's 4 samples and says nothing; drapps warns
    at each batch past the 2 it said, in batches (its words said samples)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with drapps.Loader(LongerThanItsLen(), batch_size=2, num_workers=workers) as loader:
            assert len(loader) == 2
            assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    said = [str(w.message) for w in caught if "was reported to be 2" in str(w.message)]
    assert [m.split("), but ")[1].split(" have")[0] for m in said] == ["3 batches", "4 batches"]


class CountsInShared(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Holds a multiprocessing.Value of the workers' start method, as DataLoader allows."""

    def __init__(self, method: str) -> None:
        self.count = multiprocessing.get_context(method).Value("i", 0, lock=True)

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        with self.count.get_lock():
            self.count.value += 1
        return i


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_dataset_holding_a_shared_value_goes_to_spawned_workers(method: str) -> None:
    """It was refused ('Synchronized objects should only be shared between processes through
    inheritance'): the check pickled it outside a process start."""
    dataset = CountsInShared(method)
    with drapps.Loader(
        dataset, batch_size=2, num_workers=2, multiprocessing_context=method
    ) as loader:
        assert sorted(i for b in loader for i in b.tolist()) == [0, 1, 2, 3]
    assert dataset.count.value == 4


class SlowAt(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Sample ``slow`` is made only once sample 9 is (or after 0.5 s in order, where that
    would wait for ever): a worker holding it holds its share of work meanwhile. A sample is
    its index and the id of the worker that made it."""

    def __init__(self, slow: int, in_order: bool) -> None:
        self.slow, self.in_order = slow, in_order
        self.last_made = multiprocessing.get_context("fork").Event()

    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> tuple[int, int]:
        if i == self.slow:
            if self.in_order:
                time.sleep(0.5)
            else:
                assert self.last_made.wait(60)
        if i == 9:
            self.last_made.set()
        return i, get_worker_info().id


@pytest.mark.parametrize(("in_order", "slow"), [(True, 2), (False, 0)])
def test_a_fixed_count_hands_batches_over_in_dataloaders_order(in_order: bool, slow: int) -> None:
    """Out of order, DataLoader gives a worker that holds its share of work no more while
    another has room: worker 0, stuck on sample 0, holds 0 and 2, and worker 1 makes the
    rest. drapps dealt round-robin, so worker 0 was dealt 4, 6 and 8 behind its stuck one."""
    torch_loader = DataLoader(
        SlowAt(slow, in_order), num_workers=2, in_order=in_order, multiprocessing_context="fork"
    )
    expected = [(int(i), int(w)) for i, w in torch_loader]
    with drapps.Loader(SlowAt(slow, in_order), num_workers=2, in_order=in_order) as loader:
        got = [(int(i), int(w)) for i, w in loader]
    if in_order:
        assert got == expected == [(i, i % 2) for i in range(10)]
        return
    # The order the two workers' batches arrive in is their pipes' race on a busy machine
    # (8 was once overtaken by 0, made after 9); which worker made which sample is the rule.
    for made in (got, expected):
        assert sorted(made) == [(i, 0 if i in (0, 2) else 1) for i in range(10)]
        assert [i for i, _ in made][:2] == [1, 3]


class _Table(Dataset):  # type: ignore[type-arg]
    """A table whose batches come from one call: ``__getitems__`` gives a slice (a tensor,
    not a list of samples, which only a collate_fn of the user's own takes as it is)."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.rows, self.fail_at = torch.arange(40.0).reshape(20, 2), fail_at

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == self.fail_at:
            raise KeyError(f"row {i}")
        return self.rows[i]

    def __getitems__(self, indices: list[int]) -> torch.Tensor:
        if self.fail_at in indices:
            raise KeyError(f"row {self.fail_at}")
        return self.rows[indices]


def _as_given(batch: Any) -> Any:
    return batch


@pytest.mark.parametrize(
    "workers, more",
    [(0, {}), (2, {}), (2, {"backend": "thread"}), ("auto", {}), (2, {"in_order": False})],
)
def test_a_dataset_with_getitems_gives_each_batch_from_one_call_as_to_dataloader(
    workers: int | str, more: dict[str, Any]
) -> None:
    """DataLoader's fetcher takes a batch's samples from ``__getitems__`` when the dataset has
    it, and passes what it returns to collate_fn as it is: here a slice of the table."""
    expected = list(DataLoader(_Table(), batch_size=4, shuffle=False, collate_fn=_as_given))
    count = {} if workers == "auto" else {"num_workers": workers}
    with drapps.Loader(_Table(), batch_size=4, collate_fn=_as_given, **count, **more) as loader:
        got = sorted(loader, key=lambda batch: float(batch[0, 0]))
    assert [type(batch) for batch in got] == [torch.Tensor] * 5  # not lists of rows
    assert_batches_equal(expected, got)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_failing_getitems_names_the_batch_and_skipping_makes_it_again_sample_by_sample(
    workers: int,
) -> None:
    with (
        pytest.raises(
            KeyError, match=r"__getitems__ failed on the batch of indices \[4, 5, 6, 7\]"
        ),
        drapps.Loader(_Table(7), batch_size=4, num_workers=workers, collate_fn=_as_given) as loader,
    ):
        list(loader)
    skip = {"num_workers": workers, "collate_fn": _as_given, "on_error": "skip"}
    with drapps.Loader(_Table(7), batch_size=4, **skip) as loader:  # type: ignore[arg-type]
        rows = [
            int(row[0]) // 2 for batch in loader for row in batch
        ]  # the failing batch: rows one by one
        assert rows == [i for i in range(20) if i != 7]
        assert loader.stats().samples_skipped == 1


class _Marked(Dataset):  # type: ignore[type-arg]
    """Says which call made each sample: ``__getitem__`` or ``__getitems__``."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> tuple[int, str]:
        return i, "one"

    def __getitems__(self, indices: list[int]) -> list[tuple[int, str]]:
        return [(i, "batch") for i in indices]


@pytest.mark.parametrize(
    "settings, made_by",
    [
        ({}, "batch"),  # workers="auto"
        ({"seed": 3, "num_workers": 2}, "batch"),
        ({"num_workers": 2, "dispatch": "samples"}, "one"),  # made apart, as asked
        ({"num_workers": 2, "defer_after": 0.0}, "one"),
        ({"num_workers": 2, "transform": lambda sample: sample}, "one"),  # runs per sample
    ],
)
def test_getitems_is_called_unless_the_samples_are_made_apart(
    settings: dict[str, Any], made_by: str
) -> None:
    with drapps.Loader(_Marked(), batch_size=4, **settings) as loader:
        called = {name for _, names in loader for name in names}
    assert called == {made_by}


def _pipe() -> Any:
    """A datapipe that shuffles, then shards: DataLoader seeds its shuffle alike in every
    worker and gives each worker its share of the sharding filter."""
    import torch.utils.data.datapipes as dp

    return dp.iter.IterableWrapper(list(range(24))).shuffle().sharding_filter()


@pytest.mark.parametrize(
    "settings",
    [{"num_workers": 2}, {"num_workers": 3, "persistent_workers": True}, {}, {"num_workers": 0}],
)
def test_a_sharded_datapipe_gives_each_item_once_each_epoch(settings: dict[str, Any]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # datapipes are deprecated
        with drapps.Loader(_pipe(), batch_size=None, **settings) as loader:
            epochs = [[int(item) for item in loader] for _ in range(2)]
    for items in epochs:
        assert sorted(items) == list(range(24))
    assert epochs[0] != epochs[1]  # shuffled anew each epoch


def test_a_sharded_datapipe_resumes_with_the_items_still_owed() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with drapps.Loader(_pipe(), batch_size=2, num_workers=2, seed=5) as loader:
            epoch = iter(loader)
            taken = [int(i) for _ in range(5) for i in next(epoch)]
            state = loader.state_dict()
        with drapps.Loader(_pipe(), batch_size=2, num_workers=2, seed=5) as loader:
            loader.load_state_dict(state)
            rest = [int(i) for batch in loader for i in batch]
    assert sorted(taken + rest) == list(range(24))


def _pipe_epochs(make: Callable[..., Any], settings: dict[str, Any]) -> list[Any]:
    """Three epochs of ``make(_pipe())`` from ``torch.manual_seed(7)``: each epoch's items, and
    a draw from torch's generator after it (where the loader left it)."""
    torch.manual_seed(7)
    loader = make(_pipe(), batch_size=None, **settings)
    epochs = []
    for _ in range(3):
        epochs.append(([int(item) for item in loader], torch.randint(1 << 30, ()).item()))
    if hasattr(loader, "close"):
        loader.close()
    return epochs


@pytest.mark.parametrize(
    "settings",
    [{"num_workers": 0}, {"num_workers": 2}, {"num_workers": 2, "persistent_workers": True}],
)
def test_a_datapipe_without_a_seed_draws_as_dataloader_draws(settings: dict[str, Any]) -> None:
    """Without a ``seed``, a pipe's shuffles come from torch's generator as DataLoader's do:
    the same order, epoch after epoch, and the training loop's draws after each epoch the
    same (a ``torch.manual_seed`` before an epoch repeats the pipe's order)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = _pipe_epochs(torch.utils.data.DataLoader, settings)
        assert _pipe_epochs(drapps.Loader, settings) == expected
        torch.manual_seed(3)
        with drapps.Loader(_pipe(), batch_size=None, **settings) as loader:
            first = [int(item) for item in loader]
            torch.manual_seed(3)
            assert [int(item) for item in loader] == first


def test_a_datapipe_without_a_seed_resumes_with_the_pipe_seed_it_drew() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with drapps.Loader(_pipe(), batch_size=2, num_workers=2) as loader:
            epoch = iter(loader)
            taken = [int(i) for _ in range(5) for i in next(epoch)]
            state = loader.state_dict()
            rest = [int(i) for batch in epoch for i in batch]
        torch.manual_seed(11)  # another generator state: the pipe's order comes from the state
        with drapps.Loader(_pipe(), batch_size=2, num_workers=2) as loader:
            loader.load_state_dict(state)
            assert [int(i) for batch in loader for i in batch] == rest
    assert "pipe_seed" in state and sorted(taken + rest) == list(range(24))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_datapipe_sharded_twice_raises_the_pipes_error(workers: int) -> None:
    import torch.utils.data.datapipes as dp

    pipe = dp.iter.IterableWrapper(list(range(8))).sharding_filter().sharding_filter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loader = drapps.Loader(pipe, batch_size=None, num_workers=workers)
        with loader, pytest.raises(RuntimeError, match="Sharding twice"):
            list(loader)


@pytest.mark.parametrize(("workers", "persistent"), [(0, False), (2, False), (2, True)])
def test_an_epoch_of_no_batch_draws_from_torch_as_dataloaders_does(
    workers: int, persistent: bool
) -> None:
    """One sample, batches of 2 without the last: DataLoader's epoch yields nothing, but
    starts its RandomSampler, which draws its seed from torch's generator. drapps drew
    nothing there, so every later draw of the training loop moved."""
    after = {}
    for make in (DataLoader, drapps.Loader):
        torch.manual_seed(0)
        loader = make(
            [0], batch_size=2, drop_last=True, shuffle=True, num_workers=workers,
            persistent_workers=persistent,
        )  # fmt: skip
        draws = []
        for _ in range(3):
            assert list(loader) == []
            draws.append(int(torch.randint(0, 2**62, ())))
        after[make] = draws
        if isinstance(loader, drapps.Loader):
            loader.close()
    assert after[drapps.Loader] == after[DataLoader]
