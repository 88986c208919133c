"""``dataloader``: torch.utils.data.DataLoader at every ``num_workers`` from 0 to 2x cores;
``dataloader-unordered``: the same with ``in_order=False`` (batches handed over as made)."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader

from drapps.bench.systems._base import EpochSource, Source, System, Workers
from drapps.bench.throttle import IoThrottle
from drapps.bench.workloads import Workload


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

    in_order = True

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
            in_order=self.in_order,
        )
        return EpochSource(loader, lambda: workers)


class DataLoaderUnorderedSystem(DataLoaderSystem):
    name = "dataloader-unordered"
    summary = (
        "torch DataLoader with in_order=False (a batch is handed over as soon as it is made, so "
        "a slow one holds back none behind it), one case per num_workers 1..2x cores"
    )
    in_order = False
    opt_in = True  # runs when named: the straggler comparison, not every bench

    @classmethod
    def variants(cls, cores: int) -> list[Workers]:
        return list(range(1, 2 * cores + 1))  # with no workers there is nothing to reorder

    @classmethod
    def case_name(cls, workers: Workers) -> str:
        return f"dataloader-unordered-{workers}"
