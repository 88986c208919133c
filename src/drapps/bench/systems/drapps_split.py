"""``drapps-split`` and ``drapps-split-1w``: the image pipeline as a Pipeline, cut at each split.

The workload's pipeline becomes ``DecodeJPEG -> ToCHWTensor -> RandomResizedCrop(224) ->
RandomHorizontalFlip`` over the JPEG bytes (the tensor crop, antialiased, rather than the other
systems' OpenCV one), so every op may run in the workers or in the device stage. One case per
split point, fixed (``drapps-split-0`` decodes in the training process, ``drapps-split-4`` is
all in the workers), plus ``auto`` (the controller moves the split; the workers stay fixed)
and ``auto-workers`` (the controller moves both). ``drapps-split`` runs one worker per usable
core, ``drapps-split-1w`` a single worker, which leaves the training process a core to use.
Both run only when named with ``--systems``; ``drapps bench --device cuda`` runs their device
stage on the GPU.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

import drapps
from drapps.bench.systems._base import EpochSource, Source, System, Workers
from drapps.bench.throttle import IoThrottle
from drapps.bench.workloads import Workload

SPLITS = ("0", "1", "2", "3", "4", "auto", "auto-workers")


class PlacementSystem(System):
    """The image workload's pipeline as a :class:`drapps.ops.Pipeline`, one case per placement
    a subclass names (:meth:`options`), without the sample cache (a first epoch filling it
    would hide the placement)."""

    opt_in = True
    runs_python_step = False  # builds its pipeline from ops, or caches a deterministic part

    placements: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def variants(cls, cores: int) -> list[Workers]:
        return list(cls.placements)

    @classmethod
    def case_name(cls, workers: Workers) -> str:
        return f"{cls.name}-{workers}"

    def options(self, placement: str) -> dict[str, Any]:
        """The Loader arguments of one placement (split, offload, workers)."""
        raise NotImplementedError

    def ends(self, loader: drapps.Loader) -> str:
        """Where the run ended, for "workers at end"."""
        stats = loader.stats()
        return f"{stats.workers}@{stats.split}"

    def open(
        self,
        workload: Workload,
        workers: Workers,
        batch_size: int,
        seed: int,
        throttle: IoThrottle | None,
    ) -> Source:
        pipeline_of = getattr(workload, "pipeline_dataset", None)
        if pipeline_of is None:
            raise ValueError(
                f"{self.name} needs a workload with an op pipeline (image), got {workload.name!r}"
            )
        dataset, pipeline = pipeline_of(throttle)
        loader = drapps.Loader(
            dataset,
            batch_size=batch_size,
            drop_last=True,
            shuffle=True,
            seed=seed,
            transform=pipeline,
            persistent_workers=True,
            device=self.device,
            cache=None,
            **self.options(str(workers)),
        )
        return EpochSource(loader, lambda: self.ends(loader))


class DrappsSplit(PlacementSystem):
    name = "drapps-split"
    summary = "the image pipeline as a drapps.ops.Pipeline at each split and split='auto'"
    placements = SPLITS
    workers: ClassVar[int | None] = None
    """Worker processes (None: one per usable core)."""

    def options(self, placement: str) -> dict[str, Any]:
        count = self.workers or len(os.sched_getaffinity(0))
        return {
            "split": "auto" if placement.startswith("auto") else int(placement),
            "workers": "auto" if placement == "auto-workers" else count,
        }


class DrappsSplitOneWorker(DrappsSplit):
    name = "drapps-split-1w"
    summary = "drapps-split with one worker: the training process has a core to spare"
    workers = 1
