"""One run of the ``image`` workload (uniform costs, local files) through ``drapps.Loader``,
with the ImageFolder's reads started ahead or not, for A/B rounds of what reading ahead costs
where there is no slow read to hide (from this folder):

    python uniform.py --workers 2 --read-threads 4
    python uniform.py --workers 2 --read-threads 0
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import drapps
import drapps.datasets.image_folder as image_folder
from drapps.bench.workloads import ImageWorkload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--read-threads", type=int, default=4)
    parser.add_argument("--batches", type=int, default=300)
    args = parser.parse_args()
    init = image_folder.ImageFolder.__init__

    def with_threads(self: image_folder.ImageFolder, *given: object, **named: object) -> None:
        init(self, *given, **{**named, "read_threads": args.read_threads})  # type: ignore[arg-type]

    image_folder.ImageFolder.__init__ = with_threads  # type: ignore[method-assign]
    data = Path.home() / ".cache" / "drapps"
    workload = ImageWorkload(ImageWorkload.prepare(data, "default", 0))
    with drapps.Loader(
        workload.dataset(None), batch_size=32, drop_last=True, workers=args.workers,
        persistent_workers=True, shuffle=True, seed=0,
    ) as loader:  # fmt: skip
        batches = iter(loader)
        for _ in range(12):
            next(batches)
        cpu, start, taken = time.process_time(), time.perf_counter(), 0
        while taken < args.batches:
            try:
                next(batches)
            except StopIteration:
                batches = iter(loader)
                continue
            taken += 1
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    print(
        f"{taken * 32 / wall:.0f} samples/s, training process {1000 * cpu / taken:.1f} ms CPU "
        f"a batch ({args.workers} workers, read_threads={args.read_threads})"
    )


if __name__ == "__main__":
    main()
