"""One run of the ``stragglers`` workload with parts of drapps' straggler handling turned off,
or through DataLoader, for A/B rounds in one checkout (from this folder):

    python run.py --no-read-ahead --no-stall -- --workers 4 --batches 400
    python run.py --no-stall -- --workers 4 --batches 400
    python run.py -- --workers 4 --batches 400
    python run.py --dataloader -- --workers 4 --batches 400

``--no-read-ahead`` builds the ImageFolder with ``read_threads=0``; ``--no-stall`` stops the
dispatcher from copying a part for one stalled sample (parts are still copied once overdue as
a whole). The arguments after ``--`` go to ``one_run.py`` (``--step-ms 0`` by default there).
``--dataloader`` runs ``torch.utils.data.DataLoader`` (``prefetch_factor=2``; in order, or
with ``--unordered`` ``in_order=False``) over the same dataset for the same batches after the
same 12 warm-up ones.
"""

from __future__ import annotations

import argparse
import runpy
import sys
import time
from pathlib import Path

import numpy as np


def dataloader(workers: int, batches: int, *, in_order: bool) -> None:
    import torch

    from drapps.bench.workloads import StragglersWorkload

    data = Path.home() / ".cache" / "drapps"
    workload = StragglersWorkload(StragglersWorkload.prepare(data, "default", 0))
    generator = torch.Generator().manual_seed(0)
    loader = torch.utils.data.DataLoader(
        workload.dataset(None), batch_size=32, drop_last=True, num_workers=workers,
        persistent_workers=True, shuffle=True, generator=generator, prefetch_factor=2,
        in_order=in_order,
    )  # fmt: skip
    batches_now = iter(loader)
    for _ in range(12):
        next(batches_now)
    start, waits = time.perf_counter(), []
    while len(waits) < batches:
        asked = time.perf_counter()
        try:
            next(batches_now)
        except StopIteration:
            batches_now = iter(loader)
            continue
        waits.append(time.perf_counter() - asked)
    wall = time.perf_counter() - start
    print(
        f"DataLoader{'' if in_order else ' unordered'} {len(waits) * 32 / wall:.0f} samples/s, "
        f"the loop waited "
        f"{sum(waits) / wall:.0%}, next() p99 {1000 * np.percentile(waits, 99):.0f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-read-ahead", action="store_true")
    parser.add_argument("--no-stall", action="store_true")
    parser.add_argument("--dataloader", action="store_true")
    parser.add_argument("--unordered", action="store_true", help="DataLoader's in_order=False")
    parser.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    if args.dataloader:
        options = argparse.ArgumentParser()
        options.add_argument("--workers", type=int, required=True)
        options.add_argument("--batches", type=int, default=400)
        known, _ = options.parse_known_args(rest)
        dataloader(known.workers, known.batches, in_order=not args.unordered)
        return
    if args.no_read_ahead:
        import drapps.datasets.image_folder as image_folder

        init = image_folder.ImageFolder.__init__

        def no_threads(self: image_folder.ImageFolder, *given: object, **named: object) -> None:
            init(self, *given, **{**named, "read_threads": 0})  # type: ignore[arg-type]

        image_folder.ImageFolder.__init__ = no_threads  # type: ignore[method-assign]
    if args.no_stall:
        import drapps.runtime.dispatcher as dispatcher

        dispatcher.Dispatcher._stall_due = lambda self, worker: None  # type: ignore[method-assign]
    sys.argv = ["one_run.py", *rest]
    runpy.run_path(str(Path(__file__).parents[1] / "one_run.py"), run_name="__main__")


if __name__ == "__main__":
    main()
