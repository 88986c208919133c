"""``dataloader``: torch.utils.data.DataLoader at every ``num_workers`` from 0 to 2x cores."""

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
        return EpochSource(loader, lambda: workers)
