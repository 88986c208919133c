"""Dispatch orders on one workload: FIFO, predicted (drapps' default) and clairvoyant.

A dataset where 5% of the samples (the same ones every epoch) wait 60 ms on a read and the
rest 1 ms, batches of 32, a training step of 30 ms, 3 worker processes, batches cut into parts
(``dispatch="samples"``), 3 epochs. The three runs differ only in what the schedule is told
about each sample's cost before making it:

- ``fifo``: nothing (every sample the same: parts go out in plan order);
- ``predicted``: drapps' predictor (measured costs of earlier epochs, the better of its models);
- ``clairvoyant``: the true cost of every sample, from the start.

Rounds alternate the order of the three; the table gives medians over rounds.

    python docs/results/stragglers/orders.py --rounds 3 --out docs/results/stragglers
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import drapps
from drapps.runtime.cost import SampleCosts


class SlowReads:
    """Sample ``i`` waits 60 ms if it is one of the 5% slow ones, else 1 ms."""

    def __init__(self, n: int = 4800, seed: int = 0) -> None:
        self.slow = np.random.default_rng(seed).random(n) < 0.05

    def __len__(self) -> int:
        return len(self.slow)

    def cost(self, i: int) -> float:
        return 0.060 if self.slow[i] else 0.001

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(self.cost(i))
        return torch.full((1024,), i % 256, dtype=torch.uint8)


class Flat(SampleCosts):
    """Knows nothing: every sample is predicted at the running mean."""

    def predict(self, indices: Any) -> np.ndarray:
        return np.full(len(indices), max(self.mean, 1e-6))


class Clairvoyant(SampleCosts):
    """Knows every sample's true cost."""

    def __init__(self, dataset: SlowReads) -> None:
        super().__init__(len(dataset))
        self.dataset = dataset

    def predict(self, indices: Any) -> np.ndarray:
        return np.array([self.dataset.cost(i) for i in indices])


def run(order: str, dataset: SlowReads, epochs: int = 3) -> dict[str, Any]:
    loader = drapps.Loader(
        dataset, batch_size=32, shuffle=True, seed=0, workers=3, dispatch="samples",
        persistent_workers=True,
    )  # fmt: skip
    dispatcher = loader._parts.engine.dispatcher  # the experiment swaps the predictor
    if order != "predicted":
        costs = Flat(len(dataset)) if order == "fifo" else Clairvoyant(dataset)
        dispatcher.costs = dispatcher.schedule.costs = costs
    waits, samples, start = [], 0, time.perf_counter()
    for _ in range(epochs):
        batches = iter(loader)
        while True:
            t0 = time.perf_counter()
            batch = next(batches, None)
            if batch is None:
                break
            waits.append(time.perf_counter() - t0)
            samples += len(batch)
            time.sleep(0.030)  # the training step
    elapsed = time.perf_counter() - start
    report = loader.stats().sample_costs or {}
    loader.close()
    waits.sort()
    return {
        "samples_per_s": samples / elapsed,
        "next_p50_ms": 1000 * waits[len(waits) // 2],
        "next_p99_ms": 1000 * waits[min(len(waits) - 1, int(0.99 * len(waits)))],
        "wait_share": sum(waits) / elapsed,
        "predictor": report,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    dataset = SlowReads()
    orders = ["fifo", "predicted", "clairvoyant"]
    runs: dict[str, list[dict[str, Any]]] = {o: [] for o in orders}
    for n in range(args.rounds):
        for order in orders if n % 2 == 0 else orders[::-1]:
            runs[order].append(run(order, dataset))
            print(
                n,
                order,
                json.dumps({k: v for k, v in runs[order][-1].items() if k != "predictor"}),
                flush=True,
            )
    summary = {
        order: {
            key: statistics.median(r[key] for r in found)
            for key in ("samples_per_s", "next_p50_ms", "next_p99_ms", "wait_share")
        }
        for order, found in runs.items()
    }
    summary["predicted"]["predictor"] = runs["predicted"][-1]["predictor"]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "orders.json").write_text(json.dumps({"runs": runs, "summary": summary}, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
