"""Time a learned policy's decisions: python decision_time.py [POLICY.npz ...] (default: the
shipped one). Each round decides on 1,000 States half a second apart (so every one is a
decision, ``State.vector()`` and the action's reason included); prints the median and the
fastest of 20 rounds, per decision."""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import replace

import numpy as np

from drapps.control.rl import MlpPolicy
from drapps.control.state import State

ROUNDS, DECISIONS = 20, 1000


def states() -> list[State]:
    rng = np.random.default_rng(0)
    base = State(
        t=0.0, cores=2, cpu_util=0.5, idle_cores=1.0, main_cpu=0.1, workers_cpu=0.9,
        rss_bytes=2**30, available_bytes=20 * 2**30, total_bytes=24 * 2**30,
        disk_read_bps=0.0, net_bps=0.0, gpu_util=None, gpu_memory_bytes=None,
        queue_batches=3, queue_bytes=3 * 2**20, memory_budget=2**30, wait_fraction=0.0,
        latency_p50_s=0.03, latency_p99_s=0.05, throughput=700.0, workers=2, max_workers=8,
        prefetch=4, epoch_left=50, in_flight=1.0,
    )  # fmt: skip
    ticks = []
    for k in range(DECISIONS):
        wait, ready, workers = rng.uniform(0, 0.5), rng.integers(0, 8), rng.integers(1, 9)
        ticks.append(
            replace(
                base,
                t=0.5 * (k + 1),
                wait_fraction=float(wait),
                queue_batches=int(ready),
                workers=int(workers),
            )
        )
    return ticks


def main(paths: list[str]) -> None:
    ticks = states()
    for path in paths or [None]:
        rounds = []
        for _ in range(ROUNDS):
            policy = MlpPolicy.load(path) if path else MlpPolicy.shipped()
            began = time.perf_counter()
            for state in ticks:
                policy.decide(state)
            rounds.append((time.perf_counter() - began) / DECISIONS * 1e6)
        sizes = [policy.layers[0][0].shape[0]] + [w.shape[1] for w, _ in policy.layers]
        print(
            f"{path or 'shipped'} ({' -> '.join(map(str, sizes))}): median "
            f"{statistics.median(rounds):.0f} us per decision, fastest {min(rounds):.0f} us"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
