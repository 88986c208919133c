"""Two iterators over one loader at once, as DataLoader runs them: ``zip(loader, loader)``, a
``next(iter(loader))`` inside ``for batch in loader``, an iterator put down and taken up again.

The newer iterator gets the workers; the older one makes the rest of its batches in the
training process meanwhile (the same batches and draws it would have had) and gets the
workers back once the newer one has ended or been let go of. A checkpoint follows the
iterator under way: the newer one while it lives, then the older one again."""

from __future__ import annotations

import gc
import json
import multiprocessing
import threading
from typing import Any

import pytest
import torch
from helpers import drapps_children, wait_until
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

import drapps

SETTINGS = [
    pytest.param({"num_workers": 0}, id="inline"),
    pytest.param({"num_workers": 2}, id="processes"),
    pytest.param({"num_workers": 2, "persistent_workers": True}, id="persistent"),
    pytest.param({"num_workers": 2, "backend": "thread"}, id="threads"),
    pytest.param({"workers": "auto"}, id="auto"),
]


class Keys(Dataset[torch.Tensor]):
    """Each sample: its key, a draw (from ``drapps.sample_rng()``, which threads may run), and
    the worker that made it (-1: the training process)."""

    def __init__(self, n: int = 20) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        info = get_worker_info()
        try:
            draw = float(drapps.sample_rng().random())
        except RuntimeError:  # DataLoader's: no drapps sample
            draw = torch.rand(()).item()
        return torch.tensor([float(i), draw, -1.0 if info is None else info.id])


def keys(batch: torch.Tensor) -> list[int]:
    return (batch[:, 0] if batch.dim() == 2 else batch).long().tolist()


def patterns(loader: Any) -> dict[str, Any]:
    """What three ways of holding two iterators at once give, as keys."""
    zipped = [(keys(a), keys(b)) for a, b in zip(loader, loader, strict=True)]
    peeked = [(keys(a), keys(next(iter(loader)))) for a in loader]
    first = iter(loader)
    head = keys(next(first))
    second = [keys(b) for b in iter(loader)]
    rest = [keys(b) for b in first]
    return {"zip": zipped, "peek": peeked, "put down": (head, second, rest)}


@pytest.mark.parametrize("options", SETTINGS)
def test_two_iterators_at_once_give_dataloaders_batches(options: dict[str, Any]) -> None:
    """Each iterator runs a whole epoch of its own, as DataLoader's do (the older one raised
    "superseded" at its next batch)."""
    expected = patterns(DataLoader(Keys(), batch_size=4))
    with drapps.Loader(Keys(), batch_size=4, **options) as loader:
        assert patterns(loader) == expected


def test_out_of_order_batches_go_on_beside_a_newer_iterator() -> None:
    """``in_order=False``: the older iterator makes only the batches it has not delivered."""
    with drapps.Loader(Keys(40), batch_size=4, num_workers=2, in_order=False) as loader:
        first = iter(loader)
        head = [keys(next(first)) for _ in range(3)]
        second = [keys(b) for b in iter(loader)]
        rest = [keys(b) for b in first]
    for epoch in (head + rest, second):
        assert sorted(k for batch in epoch for k in batch) == list(range(40))


@pytest.mark.parametrize("options", SETTINGS)
def test_the_older_iterator_keeps_its_batches_and_draws(options: dict[str, Any]) -> None:
    """With a seed, an epoch's batches and draws are its own whatever iterators ran beside it:
    the loop's epoch is the one it would have had without the peeks."""
    kwargs = {"batch_size": 4, "shuffle": True, "seed": 5}
    with drapps.Loader(Keys(), num_workers=0, **kwargs) as reference:
        expected = [b[:, :2] for b in reference]
    with drapps.Loader(Keys(), **kwargs, **options) as loader:
        got = []
        for k, batch in enumerate(loader):
            got.append(batch[:, :2])
            if k % 2 == 0:
                assert next(iter(loader)).shape == (4, 3)  # another epoch's first batch
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b)


def held_across_the_loops_end(loader: Any) -> list[Any]:
    """A second iterator made mid-epoch and let go of untaken, after the loop ended its epoch
    and took the next one's first batch: the orders each epoch drew from torch's RNG."""
    torch.manual_seed(0)
    loop = iter(loader)
    taken: list[Any] = [keys(next(loop))]
    second = iter(loader)
    taken += [keys(b) for b in loop]
    loop = iter(loader)
    taken.append(keys(next(loop)))
    del second
    return [*taken, *(keys(b) for b in loop), *(keys(b) for b in loader)]


def one_let_go_then_another(loader: Any) -> list[Any]:
    """A second iterator let go of untaken, then a third that takes two batches, mid-epoch."""
    torch.manual_seed(0)
    loop = iter(loader)
    taken: list[Any] = [keys(next(loop))]
    second = iter(loader)
    del second
    third = iter(loader)
    taken += [keys(next(third)), keys(next(third))]
    del third
    return [*taken, *(keys(b) for b in loop), *(keys(b) for b in loader)]


@pytest.mark.parametrize(
    ("options", "dataloaders"),
    [
        pytest.param({"num_workers": 0}, 0, id="inline"),
        pytest.param({"num_workers": 2}, 2, id="processes"),
        pytest.param({"workers": "auto"}, 0, id="auto"),
    ],
)
def test_a_second_iterator_never_taken_from_draws_as_dataloaders(
    options: dict[str, Any], dataloaders: int
) -> None:
    """Without workers (and under "auto", which draws as they do) an iterator draws its order
    at its first ``next()``: one let go of untaken draws none, and the loop's epochs after it
    draw theirs where DataLoader's do; with workers each draws as it starts them."""
    kwargs = {"batch_size": 4, "shuffle": True}
    for pattern in (held_across_the_loops_end, one_let_go_then_another):
        expected = pattern(DataLoader(range(12), num_workers=dataloaders, **kwargs))
        with drapps.Loader(range(12), **kwargs, **options) as loader:
            assert pattern(loader) == expected, pattern.__name__


@pytest.mark.parametrize("persistent", [False, True])
def test_the_workers_come_back_once_the_newer_iterator_is_let_go(persistent: bool) -> None:
    """Past a peek, the loop's batches are the workers' again, not the training process's."""
    options = {"batch_size": 2, "num_workers": 2, "persistent_workers": persistent}
    with drapps.Loader(Keys(40), **options) as loader:
        made_by = []
        for k, batch in enumerate(loader):
            made_by.append(int(batch[0, 2]))
            if k == 3:
                next(iter(loader))
    assert -1 not in made_by, made_by


@pytest.mark.parametrize("options", SETTINGS)
def test_a_checkpoint_follows_the_iterator_under_way(options: dict[str, Any]) -> None:
    """While the newer iterator lives, a checkpoint is its; once it is let go of, the older
    one's again, so that a checkpoint the loop takes past a peek resumes the loop's epoch,
    and then the epoch the loop would have had next."""
    kwargs = {"batch_size": 4, "shuffle": True, "seed": 3}

    def epochs(loader: drapps.Loader, count: int) -> list[list[list[int]]]:
        return [[keys(b) for b in loader] for _ in range(count)]

    with drapps.Loader(Keys(), **kwargs, **options) as loader:
        it = iter(loader)
        first = [keys(next(it)) for _ in range(2)]
        peek = iter(loader)
        next(peek)
        assert loader.state_dict()["epoch"] == 1  # the newer one's
        del peek
        state = json.loads(json.dumps(loader.state_dict()))
        assert (state["epoch"], state["next_batch"], state["next_epoch"]) == (0, 2, 2)
        rest = [keys(b) for b in it]
        later = epochs(loader, 2)
    with drapps.Loader(Keys(), **kwargs, num_workers=0) as resumed:
        resumed.load_state_dict(state)
        assert resumed.state_dict() == state  # as a copy of the loader stands
        assert [keys(b) for b in resumed] == rest
        assert epochs(resumed, 2) == later
    with drapps.Loader(Keys(), **kwargs, num_workers=0) as reference:
        whole = epochs(reference, 4)  # epoch 1 is the peek's
    assert first + rest == whole[0] and later == whole[2:]


def test_a_checkpoint_with_a_malformed_next_epoch_is_refused() -> None:
    with drapps.Loader(Keys(), batch_size=4, seed=0) as loader:
        state = loader.state_dict()
        for bad in (0, -1, "2", True):
            with pytest.raises(ValueError, match="next_epoch"):
                loader.load_state_dict({**state, "next_epoch": bad})


def test_iterators_in_two_threads_each_get_their_epoch() -> None:
    """Two threads, each with its own ``for batch in loader``, at once."""
    with drapps.Loader(Keys(60), batch_size=3, num_workers=2) as loader:
        got: dict[int, list[int]] = {}

        def run(name: int) -> None:
            got[name] = [k for b in loader for k in keys(b)]

        threads = [threading.Thread(target=run, args=(n,)) for n in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    assert got == {0: list(range(60)), 1: list(range(60))}


def test_an_iterator_beside_a_newer_one_is_closed_with_the_loader() -> None:
    loader = drapps.Loader(Keys(), batch_size=4, num_workers=2)
    older = iter(loader)
    next(older)
    newer = iter(loader)
    next(newer)
    loader.close()
    with pytest.raises(RuntimeError, match="closed"):
        next(older)
    del newer


class Stream(IterableDataset[int]):
    def __iter__(self) -> Any:
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(start, 12, step))


def test_an_iterable_datasets_iterators_run_side_by_side_without_workers() -> None:
    expected = patterns(DataLoader(Stream(), batch_size=4))
    with drapps.Loader(Stream(), batch_size=4, num_workers=0) as loader:
        got = patterns(loader)
    for name in ("zip", "put down"):  # a stream's loader has a len(); a peek needs none
        assert got[name] == expected[name]


STREAMED = [
    pytest.param({"num_workers": 2}, id="2"),
    pytest.param({"num_workers": 3}, id="3"),
]


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("options", STREAMED)
def test_an_iterable_datasets_iterators_run_side_by_side_in_workers_of_their_own(
    options: dict[str, Any],
) -> None:
    """Workers hold a stream's position: the older iterator keeps its workers, which stream
    on, and the newer one gets workers of its own, as each of DataLoader's iterators has."""
    expected = patterns(DataLoader(Stream(), batch_size=2, **options))
    before = children()
    with drapps.Loader(Stream(), batch_size=2, **options) as loader:
        got = patterns(loader)
    assert got == expected
    gc.collect()
    assert children() - before == set()


def children() -> set[int]:
    return {p.pid for p in multiprocessing.active_children() if p.pid is not None}


def test_an_iterable_datasets_older_workers_exit_when_let_go_of_or_closed() -> None:
    before = children()
    loader = drapps.Loader(Stream(), batch_size=2, num_workers=2)
    older = iter(loader)
    next(older)
    first = children() - before
    newer = iter(loader)
    next(newer)
    assert len(children() - before - first) == 2  # the newer iterator's own two
    del older
    gc.collect()
    assert children() & first == set()  # the older one's exited
    older = iter(loader)  # now the newer one is the older
    next(older)
    loader.close()
    assert children() - before == set()
    with pytest.raises(RuntimeError, match="closed"):
        next(newer)


@pytest.mark.parametrize("taken", [0, 1], ids=["untaken", "one-taken"])
@pytest.mark.parametrize("workers", [{"num_workers": 2}, {"workers": "auto"}], ids=["2", "auto"])
@pytest.mark.parametrize("iterable", [False, True], ids=["map", "stream"])
def test_no_worker_outlives_an_epoch_left_after_a_peek(
    iterable: bool, workers: dict[str, Any], taken: int
) -> None:
    """The loop takes ``taken`` batches, a second iterator one (``next(iter(loader))``), and
    the loop leaves the epoch: as DataLoader's, no worker runs on once both iterators are let
    go of, though the loader lives on (found by a campaign: the newer iterator's workers,
    kept for the older one to take back, ran until the loader closed)."""

    def run(loader: Any) -> tuple[list[list[int]], list[int]]:
        older = iter(loader)
        batches = [keys(next(older)) for _ in range(taken)]
        batches.append(keys(next(iter(loader))))
        del older
        gc.collect()
        wait_until(lambda: not drapps_children(), timeout=30)
        return batches, [child.pid for child in drapps_children()]

    dataset: Any = Stream() if iterable else Keys()
    reference, none = run(DataLoader(dataset, batch_size=2, num_workers=2))
    assert none == []
    with drapps.Loader(dataset, batch_size=2, **workers) as loader:
        got, left = run(loader)
        assert left == [], f"{len(left)} drapps processes still running after the loop left"
        if "num_workers" in workers:
            assert got == reference
        whole = sorted(k for b in loader for k in keys(b))  # the next epoch, workers anew
        assert whole == list(range(len(whole))) and len(whole) == (12 if iterable else 20)


def test_a_checkpoint_beside_a_streams_peek_resumes_the_loops_epoch() -> None:
    def loader() -> drapps.Loader:
        return drapps.Loader(Stream(), batch_size=2, num_workers=2, seed=3)

    with loader() as whole:
        expected = [keys(b) for b in whole]
    with loader() as first:
        loop = iter(first)
        head = [keys(next(loop)), keys(next(loop))]
        assert keys(next(iter(first))) == expected[0]  # a peek: the next epoch's first batch
        gc.collect()
        state = json.loads(json.dumps(first.state_dict()))
        assert head + [keys(b) for b in loop] == expected
    with loader() as resumed:
        resumed.load_state_dict(state)
        assert head + [keys(b) for b in resumed] == expected


def test_persistent_stream_workers_supersede_the_older_iterator_saying_why() -> None:
    """Persistent stream workers draw on from one epoch to the next: workers of its own for
    the newer iterator would give later epochs other draws, so the older one is superseded."""
    with drapps.Loader(Stream(), batch_size=2, num_workers=2, persistent_workers=True) as loader:
        older = iter(loader)
        next(older)
        newer = iter(loader)
        with pytest.raises(RuntimeError, match=r"superseded by a newer iter.*persistent workers"):
            next(older)
        assert sorted(k for b in newer for k in b.tolist()) == list(range(12))
        del older
        gc.collect()


class Draws(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.rand(2)


def test_a_fixed_counts_older_iterator_draws_from_rngs_of_its_own() -> None:
    """Without a seed, samples draw from their worker's RNGs, as DataLoader's. Beside a newer
    iterator, the older one's samples draw from RNGs of its own, as DataLoader's older
    iterator's draw in its workers: the training loop's generator is where DataLoader
    leaves it (they drew from it)."""

    def loop(make: Any) -> tuple[torch.Tensor, torch.Tensor]:
        torch.manual_seed(0)
        loader = make()
        it = iter(loader)
        batches = [next(it)]
        second = iter(loader)  # held while the loop's epoch goes on beside it
        next(second)
        batches.extend(it)
        del second
        after = torch.rand(3)
        if hasattr(loader, "close"):
            loader.close()
        return after, torch.cat(batches)

    expected, _ = loop(lambda: DataLoader(Draws(), batch_size=4, num_workers=2))
    after, draws = loop(lambda: drapps.Loader(Draws(), batch_size=4, num_workers=2))
    torch.testing.assert_close(after, expected)
    assert len(set(draws[:, 0].tolist())) == 24  # each sample drew anew


def test_filled_batches_older_iterator_is_superseded_saying_why() -> None:
    """Batches filled from made samples (``defer_after``): the workers hold the samples the
    older epoch still owes, so it cannot go on beside a newer one, and says so."""
    with drapps.Loader(Keys(40), batch_size=4, num_workers=2, defer_after=0.0) as loader:
        older = iter(loader)
        next(older)
        newer = iter(loader)
        with pytest.raises(RuntimeError, match=r"superseded by a newer iter.*defer_after"):
            next(older)
        assert sorted(k for b in newer for k in keys(b)) == list(range(40))


@pytest.mark.parametrize("options", SETTINGS)
def test_a_checkpoint_holds_the_loops_epoch_until_the_loop_sees_its_end(
    options: dict[str, Any],
) -> None:
    """The loop holds every batch of its epoch but has not seen its end, and a second iterator
    ran a whole epoch meanwhile: the checkpoint is the loop's epoch (resumed, it ends, then
    the epoch past both runs), as without the second iterator. It pointed past the loop's
    epoch, so that the resumed loop got a batch of a later epoch in its place (found by a
    campaign)."""
    kwargs = {"batch_size": 10, "shuffle": True, "seed": 3}
    with drapps.Loader(Keys(), **kwargs, **options) as loader:
        it = iter(loader)
        [next(it) for _ in range(2)]  # every batch, the end not seen
        assert len(list(iter(loader))) == 2  # the second iterator's epoch, to its end
        state = loader.state_dict()
        assert (state["epoch"], state["next_batch"], state["next_epoch"]) == (0, 2, 2)
        assert next(it, None) is None
    with drapps.Loader(Keys(), **kwargs, num_workers=0) as resumed:
        resumed.load_state_dict(state)
        assert list(resumed) == []
        assert [keys(b) for b in resumed] == epochs_of(3)[2]


def epochs_of(count: int) -> list[list[list[int]]]:
    """The first ``count`` epochs of the seeded loader above, without workers."""
    with drapps.Loader(Keys(), batch_size=10, shuffle=True, seed=3, num_workers=0) as loader:
        return [[keys(b) for b in loader] for _ in range(count)]
