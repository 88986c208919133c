"""How ``workers="auto"`` finds its count on the ``stragglers`` bench workload.

Runs the workload's dataset through ``drapps.Loader(workers="auto")`` with a trace, for a
number of batches after 12 warm-up ones, with an optional training step (a sleep), and prints
the throughput, the loop's wait, the training process's CPU per batch, and each worker count
the controller moved to with the second it got there.

    python docs/results/stragglers/auto.py --batches 900 --step-ms 0
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import drapps
from drapps.bench.workloads import StragglersWorkload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=900)
    parser.add_argument("--step-ms", type=float, default=0.0)
    parser.add_argument("--data-dir", default=str(Path.home() / ".cache" / "drapps"))
    args = parser.parse_args()
    workload = StragglersWorkload(StragglersWorkload.prepare(Path(args.data_dir), "default", 0))
    with tempfile.TemporaryDirectory() as folder:
        trace = Path(folder) / "trace.jsonl"
        with drapps.Loader(
            workload.dataset(None), batch_size=32, drop_last=True, workers="auto",
            persistent_workers=True, cache=None, shuffle=True, seed=0, trace=trace,
        ) as loader:  # fmt: skip
            batches = iter(loader)
            for _ in range(12):
                next(batches)
            cpu, start, waited, taken = time.process_time(), time.perf_counter(), 0.0, 0
            while taken < args.batches:
                asked = time.perf_counter()
                try:
                    next(batches)
                except StopIteration:
                    batches = iter(loader)
                    continue
                waited += time.perf_counter() - asked
                taken += 1
                time.sleep(args.step_ms / 1000)
            wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        path, last = [], None
        for line in trace.read_text().splitlines():
            state = json.loads(line).get("state") or {}
            if state.get("workers") and state["workers"] != last:
                last = state["workers"]
                path.append(f"{last} at {state['t']:.0f} s")
    print(
        f"{taken * 32 / wall:.0f} samples/s, the loop waited {waited / wall:.0%}, "
        f"training process {1000 * cpu / taken:.1f} ms CPU a batch"
    )
    print("workers:", ", ".join(path))


if __name__ == "__main__":
    main()
