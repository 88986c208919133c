"""An iterable dataset's epoch resumes exactly: the stream is replayed with the seed and the
workers it was made with, and streams are seeded from ``seed`` with ``workers=0`` too."""

from __future__ import annotations

import json
import random

import pytest
import torch
from torch.utils.data import IterableDataset, get_worker_info

import drapps


class ShuffledStream(IterableDataset):  # type: ignore[type-arg]
    """96 items; each worker shuffles its shard with Python's ``random``, as a stream that
    reads shards of files in a random order does."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        info = get_worker_info()
        ids = list(range(96))
        if info is not None:
            ids = ids[info.id :: info.num_workers]
        random.shuffle(ids)
        yield from ids


def _taken_then_resumed(seed: int | None, workers: int) -> list[int]:
    torch.manual_seed(1)
    with drapps.Loader(ShuffledStream(), batch_size=4, num_workers=workers, seed=seed) as first:
        it = iter(first)
        got = [x for _ in range(6) for x in next(it).tolist()]
        state = json.loads(json.dumps(first.state_dict()))
    torch.manual_seed(2)  # the new process's torch RNG is not the first one's
    with drapps.Loader(ShuffledStream(), batch_size=4, num_workers=workers, seed=seed) as again:
        again.load_state_dict(state)
        got += [x for batch in again for x in batch.tolist()]
    return got


@pytest.mark.parametrize(("seed", "workers"), [(None, 2), (7, 0), (7, 2), (None, 3)])
def test_a_resumed_stream_delivers_every_item_once(seed: int | None, workers: int) -> None:
    """The state held ``seed: None`` rather than the base seed drawn, and a stream with
    ``workers=0`` drew from the training process's RNG: 19 duplicates and 19 missing.

    (With ``workers=0`` and no ``seed`` the stream draws from the training process's RNGs,
    as under DataLoader, so only a stream that does not draw resumes exactly there.)"""
    got = _taken_then_resumed(seed, workers)
    assert sorted(got) == list(range(96))


def test_a_stream_without_workers_is_seeded_from_seed() -> None:
    def epoch() -> list[list[int]]:
        with drapps.Loader(ShuffledStream(), batch_size=4, num_workers=0, seed=7) as loader:
            return [batch.tolist() for batch in loader]

    random.seed(1)
    first = epoch()
    random.seed(2)  # the training process's own RNG does not make the stream
    assert epoch() == first
    state = random.getstate()  # nor does the stream draw from it
    epoch()
    assert random.getstate() == state


def test_a_stream_state_names_its_seed_and_workers() -> None:
    with drapps.Loader(ShuffledStream(), batch_size=4, num_workers=2) as loader:
        it = iter(loader)
        next(it)
        state = loader.state_dict()
    assert isinstance(state["seed"], int) and state["workers"] == 2


def test_a_stream_made_by_workers_cannot_resume_without_them() -> None:
    with drapps.Loader(ShuffledStream(), batch_size=4, num_workers=2) as loader:
        it = iter(loader)
        next(it)
        state = loader.state_dict()
    with drapps.Loader(ShuffledStream(), batch_size=4, num_workers=0) as again:
        with pytest.raises(ValueError, match=r"streamed in 2 worker processes.*workers=0"):
            again.load_state_dict(state)


def _epochs_then_resumed(workers: int, stop: int) -> tuple[list[list[int]], list[list[int]]]:
    """Three epochs of persistent workers, straight; and the same with epoch 1 stopped after
    ``stop`` batches and resumed in a new loader (whose workers have drawn nothing)."""

    def loader() -> drapps.Loader:
        return drapps.Loader(ShuffledStream(), batch_size=4, num_workers=workers,
                             persistent_workers=True, seed=3)  # fmt: skip

    with loader() as straight:
        expected = [[x for b in straight for x in b.tolist()] for _ in range(3)]
    with loader() as first:
        got = [[x for b in first for x in b.tolist()]]
        it = iter(first)
        got.append([x for _ in range(stop) for x in next(it).tolist()])
        state = json.loads(json.dumps(first.state_dict()))
    with loader() as again:
        again.load_state_dict(state)
        got[1] += [x for b in again for x in b.tolist()]
        got.append([x for b in again for x in b.tolist()])
    return expected, got


def test_persistent_stream_workers_draw_on_from_epoch_to_epoch_and_resume_so() -> None:
    """Reseeded at every epoch, persistent workers streamed the same order every epoch
    (DataLoader seeds a worker once); a resumed later epoch replays their states."""
    expected, got = _epochs_then_resumed(workers=2, stop=5)
    assert expected[0] != expected[1] != expected[2]
    assert got == expected
