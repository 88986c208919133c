"""One run of the ``stragglers`` bench workload through ``drapps.Loader``, in this process.

Runs the workload's dataset for a number of batches after 12 warm-up ones, with an optional
training step (a sleep), and prints the throughput, the loop's wait, the p99 of ``next()``,
the training process's CPU per batch and the parts copied to a second worker; with
``--workers auto``, each worker count the controller moved to and the second it got there
(from a trace). For an A/B of two checkouts, run it with ``PYTHONPATH`` at each one's ``src``,
alternating.

    python docs/results/stragglers/one_run.py --batches 900 --step-ms 0
    python docs/results/stragglers/one_run.py --workers 6 --batches 400 --step-ms 40
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

import drapps
from drapps.bench.workloads import StragglersWorkload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="auto", help='"auto" or a fixed count')
    parser.add_argument("--batches", type=int, default=900)
    parser.add_argument("--step-ms", type=float, default=0.0)
    parser.add_argument("--lookahead", default="auto", help='"auto" or a fixed count')
    parser.add_argument("--data-dir", default=str(Path.home() / ".cache" / "drapps"))
    args = parser.parse_args()
    workers = args.workers if args.workers == "auto" else int(args.workers)
    lookahead = args.lookahead if args.lookahead == "auto" else int(args.lookahead)
    workload = StragglersWorkload(StragglersWorkload.prepare(Path(args.data_dir), "default", 0))
    with tempfile.TemporaryDirectory() as folder:
        trace = Path(folder) / "trace.jsonl"
        with drapps.Loader(
            workload.dataset(None), batch_size=32, drop_last=True, workers=workers,
            persistent_workers=True, cache=None, shuffle=True, seed=0, trace=trace,
            lookahead=lookahead,
        ) as loader:  # fmt: skip
            batches = iter(loader)
            for _ in range(12):
                next(batches)
            cpu, start, waits = time.process_time(), time.perf_counter(), []
            while len(waits) < args.batches:
                asked = time.perf_counter()
                try:
                    next(batches)
                except StopIteration:
                    batches = iter(loader)
                    continue
                waits.append(time.perf_counter() - asked)
                time.sleep(args.step_ms / 1000)
            wall, cpu = time.perf_counter() - start, time.process_time() - cpu
            costs = loader.stats().sample_costs or {}
        path, last = [], None
        for line in trace.read_text().splitlines():
            state = json.loads(line).get("state") or {}
            if state.get("workers") and state["workers"] != last:
                last = state["workers"]
                path.append(f"{last} at {state['t']:.0f} s")
    taken = len(waits)
    print(
        f"{taken * 32 / wall:.0f} samples/s, the loop waited {sum(waits) / wall:.0%}, "
        f"next() p99 {1000 * np.percentile(waits, 99):.0f} ms, training process "
        f"{1000 * cpu / taken:.1f} ms CPU a batch, {costs.get('hedges', 0)} parts copied "
        f"({costs.get('hedges_ahead', 0)} before the loop waited)"
    )
    print("workers:", ", ".join(path))


if __name__ == "__main__":
    main()
