"""Iterable datasets under drapps: transforms, errors, dying workers, stats and clean exits."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

import drapps


class Numbers(IterableDataset):  # type: ignore[type-arg]
    def __init__(self, n: int, fail_at: int | None = None) -> None:
        self.n, self.fail_at = n, fail_at

    def __iter__(self) -> Iterator[int]:
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(start, self.n, step):
            if i == self.fail_at:
                raise ValueError(f"stream broke at {i}")
            yield i


class Square:
    def __call__(self, x: int) -> torch.Tensor:
        if x == 7:
            raise KeyError("no square for 7")
        return torch.tensor(x * x)


class GoesOn(IterableDataset):  # type: ignore[type-arg]
    """A stream that is an iterator object, not a generator: after the item that fails, the
    next ones follow (a generator ends at its first error)."""

    def __init__(self, n: int, fail_at: int) -> None:
        self.n, self.fail_at = n, fail_at

    def __iter__(self) -> Iterator[int]:
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        return _Items(iter(range(start, self.n, step)), self.fail_at)


class _Items:
    def __init__(self, ids: Iterator[int], fail_at: int) -> None:
        self.ids, self.fail_at = ids, fail_at

    def __iter__(self) -> _Items:
        return self

    def __next__(self) -> int:
        i = next(self.ids)
        if i == self.fail_at:
            raise KeyError(f"item {i} is missing")
        return i


def _outcome(loader: Any, take: int | None = None) -> list[Any]:
    """Each batch as a list, or the name of the error raised in its place (the loop goes on)."""
    got: list[Any] = []
    iterator = iter(loader)
    while take is None or len(got) < take:
        try:
            got.append(next(iterator).tolist())
        except StopIteration:
            break
        except Exception as exc:  # as a loop that logs a bad batch and goes on
            got.append(type(exc).__name__)
    return got


@pytest.mark.parametrize("workers", [0, 2])
def test_the_stream_goes_on_after_a_failed_batch_as_under_dataloader(workers: int) -> None:
    expected = _outcome(DataLoader(GoesOn(10, fail_at=4), batch_size=2, num_workers=workers))
    assert "KeyError" in expected and len(expected) > expected.index("KeyError") + 1
    with drapps.Loader(GoesOn(10, fail_at=4), batch_size=2, workers=workers) as loader:
        got = _outcome(loader)
    assert [b if isinstance(b, list) else "KeyError" for b in got] == expected
    # A generator ends at its error, here and under DataLoader.
    generator = _outcome(DataLoader(Numbers(10, fail_at=4), batch_size=2, num_workers=workers))
    with drapps.Loader(Numbers(10, fail_at=4), batch_size=2, workers=workers) as loader:
        got = _outcome(loader)
    assert [b if isinstance(b, list) else "ValueError" for b in got] == generator


@pytest.mark.parametrize("workers", [0, 2])
def test_a_stream_resumed_after_a_failed_batch_gives_the_rest(workers: int) -> None:
    with drapps.Loader(GoesOn(10, fail_at=4), batch_size=2, workers=workers) as loader:
        whole = _outcome(loader)
    failed = next(i for i, b in enumerate(whole) if not isinstance(b, list))
    with drapps.Loader(GoesOn(10, fail_at=4), batch_size=2, workers=workers) as loader:
        assert _outcome(loader, take=failed + 1) == whole[: failed + 1]
        state = loader.state_dict()
    with drapps.Loader(GoesOn(10, fail_at=4), batch_size=2, workers=workers) as resumed:
        resumed.load_state_dict(state)
        assert _outcome(resumed) == whole[failed + 1 :]


def _fail_init(worker_id: int) -> None:
    raise OSError(f"cannot open the shard of worker {worker_id}")


@pytest.mark.parametrize("workers", [0, 2])
def test_an_error_in_the_stream_keeps_its_type(workers: int) -> None:
    with drapps.Loader(Numbers(20, fail_at=9), batch_size=2, workers=workers) as loader:
        with pytest.raises(ValueError, match="stream broke at 9") as caught:
            list(loader)
    assert isinstance(caught.value, drapps.SampleError)


@pytest.mark.parametrize("workers", [0, 2])
def test_transforms_run_per_item_and_failures_can_be_skipped(workers: int) -> None:
    kwargs: dict[str, Any] = {"batch_size": 4, "transform": Square(), "workers": workers}
    with drapps.Loader(Numbers(10), **kwargs) as loader:
        with pytest.raises(KeyError, match="no square for 7"):
            list(loader)
    with drapps.Loader(Numbers(10), on_error="skip", **kwargs) as loader:
        values = sorted(int(v) for b in loader for v in b)
        stats = loader.stats()
    assert values == sorted(i * i for i in range(10) if i != 7)
    assert stats.samples_skipped == 1 and stats.samples == 9


def test_a_killed_stream_worker_is_reported_not_hung() -> None:
    with drapps.Loader(Numbers(10**6), batch_size=4, workers=2) as loader:
        iterator = iter(loader)
        next(iterator)
        os.kill(loader.stats().worker_pids[1], signal.SIGKILL)
        with pytest.raises(RuntimeError, match="exited unexpectedly with exit code -9"):
            for _ in range(10**5):
                next(iterator)


def test_a_failing_worker_init_fn_is_named() -> None:
    with drapps.Loader(Numbers(8), batch_size=2, workers=2, worker_init_fn=_fail_init) as ld:
        with pytest.raises(OSError, match="cannot open the shard of worker"):
            list(ld)
    with drapps.Loader(list(range(8)), batch_size=2, workers=2, worker_init_fn=_fail_init) as ld:
        with pytest.raises(OSError, match="worker_init_fn failed in worker"):
            list(ld)


def test_stats_resize_and_an_abandoned_epoch() -> None:
    with drapps.Loader(Numbers(40), batch_size=4, workers=2, persistent_workers=True) as loader:
        iterator = iter(loader)
        next(iterator)  # abandoned: the next epoch starts the streams over
        loader.resize(3)  # a stream cannot move between workers: applies from the next epoch
        assert loader.num_workers == 3
        values = sorted(int(v) for b in loader for v in b)
        stats = loader.stats()
    assert values == list(range(40))
    # 1 batch of the abandoned epoch, then 4 from each worker's shard of 13 or 14 items
    assert stats.workers == 3 and len(stats.worker_pids) == 3 and stats.batches == 13
