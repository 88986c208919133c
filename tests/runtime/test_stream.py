"""Iterable datasets under drapps: transforms, errors, dying workers, stats and clean exits."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import IterableDataset, get_worker_info

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
