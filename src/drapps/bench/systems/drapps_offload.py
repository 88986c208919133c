"""``drapps-offload``: the image pipeline cut before the decode, a share of each batch decoded in
the device stage (nvJPEG on a GPU) and the rest in the workers.

The workload's Pipeline (``DecodeJPEG -> ToCHWTensor -> RandomResizedCrop(224) ->
RandomHorizontalFlip`` over the JPEG bytes) runs with ``split=0`` and ``workers="auto"``;
one case per offload share: ``0`` (every sample made in the workers), ``0.5``, ``1`` (every
sample decoded in the stage: the workers only read bytes), ``auto`` (the controller moves the
share), and ``auto-all`` (the controller moves the split, the share and the workers from the
defaults). Opt-in (named with ``--systems``); ``drapps bench --device cuda`` runs the stage on
the GPU.
"""

from __future__ import annotations

from typing import Any

import drapps
from drapps.bench.systems._base import EpochSource, Source, System, Workers
from drapps.bench.throttle import IoThrottle
from drapps.bench.workloads import Workload

SHARES = ("0", "0.5", "1", "auto", "auto-all")


class DrappsOffload(System):
    name = "drapps-offload"
    summary = "the image pipeline cut before the decode, at fixed offload shares and 'auto'"
    opt_in = True

    @classmethod
    def variants(cls, cores: int) -> list[Workers]:
        return list(SHARES)

    @classmethod
    def case_name(cls, workers: Workers) -> str:
        return f"{cls.name}-{workers}"

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
        share = str(workers)
        options: dict[str, Any] = {"split": 0, "offload": share}
        if share == "auto-all":
            options = {"split": "auto", "offload": "auto"}
        elif share != "auto":
            options["offload"] = float(share)
        loader = drapps.Loader(
            dataset,
            batch_size=batch_size,
            drop_last=True,
            shuffle=True,
            seed=seed,
            transform=pipeline,
            persistent_workers=True,
            device=self.device,
            cache=None,  # the placement alone: a first epoch filling a cache would hide it
            workers="auto",
            **options,
        )

        def ends() -> str:
            stats = loader.stats()
            return f"{stats.workers}@{stats.split}/{stats.offload:.2f}"

        return EpochSource(loader, ends)
