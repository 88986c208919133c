"""``dataloader``: torch.utils.data.DataLoader at every ``num_workers`` from 0 to 2x cores."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from drapps.bench.systems._base import Source, System, Workers
from drapps.bench.throttle import IoThrottle
from drapps.bench.workloads import Workload


def epochs(loader: Any) -> Generator[Any, None, None]:
    """Batches from epoch after epoch, so a run may be longer than the dataset."""
    while True:
        yield from loader


class _DataLoaderSource(Source):
    def __init__(self, loader: DataLoader[Any], workers: int) -> None:
        self.loader, self._workers = loader, workers
        self._it: Generator[Any, None, None] = epochs(loader)

    def __iter__(self) -> Iterator[Any]:
        return self._it

    def workers(self) -> Workers:
        return self._workers

    def close(self) -> None:
        self._it.close()
        del self.loader  # persistent workers shut down with the last reference


class DataLoaderSystem(System):
    name = "dataloader"
    summary = (
        "torch DataLoader, one case per num_workers 0..2x cores (persistent workers, "
        "default prefetch_factor 2); the best of them is the oracle static"
    )

    @classmethod
    def variants(cls, cores: int) -> list[Workers]:
        return list(range(0, 2 * cores + 1))

    @classmethod
    def case_name(cls, workers: Workers) -> str:
        return f"dataloader-{workers}"

    def open(
        self,
        workload: Workload,
        workers: Workers,
        batch_size: int,
        seed: int,
        throttle: IoThrottle | None,
    ) -> Source:
        if not isinstance(workers, int):
            raise ValueError(f"DataLoader needs an int worker count, got {workers!r}")
        loader = DataLoader(
            workload.dataset(throttle),
            batch_size=batch_size,
            shuffle=True,
            num_workers=workers,
            drop_last=True,
            generator=torch.Generator().manual_seed(seed),
            # Runs span epochs; re-forking workers every epoch would be an unfair baseline.
            persistent_workers=workers > 0,
        )
        return _DataLoaderSource(loader, workers)
