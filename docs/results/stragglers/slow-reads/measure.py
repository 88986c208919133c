"""Slow reads with CPU to spare: drapps' default mode against DataLoader at every count.

The case the stragglers work started from: 5% of the samples (the same ones every epoch) wait
60 ms on a read and the rest 1 ms, batches of 32, a 30 ms training step (a cap of 1,067
samples/s), 2 cores. Systems: DataLoader with ``in_order=False`` and in order at each worker
count, and ``drapps.Loader`` with ``workers="auto"`` (batches fixed by the seed, the
default). Each run is a fresh process: ``--warmup`` epochs (1), then 3 timed epochs; rounds
interleave the systems. Reports median samples/s, the share of the timed window the loop
waited (and how much of it was for each epoch's first batch), next() p99 and the workers at
the end.

    python docs/results/stragglers/slow-reads/measure.py --rounds 3 \
        --out docs/results/stragglers/slow-reads
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

STEP_S, BATCH, EPOCHS = 0.030, 32, 3


class SlowReads:
    """Sample ``i`` waits 60 ms if it is one of the 5% slow ones, else 1 ms."""

    def __init__(self, n: int = 4800, seed: int = 0) -> None:
        self.slow = np.random.default_rng(seed).random(n) < 0.05

    def __len__(self) -> int:
        return len(self.slow)

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.060 if self.slow[i] else 0.001)
        return torch.full((1024,), i % 256, dtype=torch.uint8)


def make(system: str) -> Any:
    dataset = SlowReads()
    if system == "drapps-auto":
        import drapps

        return drapps.Loader(dataset, batch_size=BATCH, shuffle=True, seed=0,
                             persistent_workers=True)  # fmt: skip
    kind, workers = system.rsplit("-", 1)
    return torch.utils.data.DataLoader(
        dataset, batch_size=BATCH, shuffle=True, num_workers=int(workers),
        persistent_workers=True, in_order=kind != "dataloader-unordered",
    )  # fmt: skip


def one(system: str, warmup: int = 1) -> dict[str, Any]:
    loader = make(system)
    for _ in range(warmup):  # warm-up epochs (drapps learns the costs, grows its pool)
        for _ in loader:
            time.sleep(STEP_S)
    waits, firsts, samples, start = [], [], 0, time.perf_counter()
    for _ in range(EPOCHS):
        it = iter(loader)
        firsts.append(len(waits))
        while True:
            asked = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                break
            waits.append(time.perf_counter() - asked)
            samples += len(batch)
            time.sleep(STEP_S)
    elapsed = time.perf_counter() - start
    workers = loader.stats().workers if hasattr(loader, "stats") else loader.num_workers
    if hasattr(loader, "close"):
        loader.close()
    return {
        "system": system,
        "samples_per_s": samples / elapsed,
        "wait_share": sum(waits) / elapsed,
        "epoch_start_share": sum(waits[i] for i in firsts if i < len(waits)) / elapsed,
        "next_p99_ms": 1000 * float(np.percentile(waits, 99)),
        "workers": workers,
    }


def main() -> None:
    if sys.argv[1:2] == ["one"]:
        print(json.dumps(one(sys.argv[2], int(sys.argv[3]))))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", default="4,8,12")
    parser.add_argument("--systems", default="", help="only these (default: all)")
    parser.add_argument("--warmup", type=int, default=1, help="epochs before the timed ones")
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    counts = args.workers.split(",")
    systems = ["drapps-auto"] + [f"dataloader-unordered-{n}" for n in counts]
    systems += [f"dataloader-{n}" for n in counts]
    if args.systems:
        systems = args.systems.split(",")
    runs = []
    for k in range(args.rounds):
        for system in systems if k % 2 == 0 else systems[::-1]:
            command = [sys.executable, __file__, "one", system, str(args.warmup)]
            done = subprocess.run(command, check=True, capture_output=True, text=True)
            runs.append({**json.loads(done.stdout.strip().splitlines()[-1]), "round": k})
            print(json.dumps(runs[-1]), flush=True)
    out = Path(args.out)
    (out / "results.json").write_text(json.dumps(runs, indent=1))
    lines = ["| system | samples/s (min-max) | loop waited | of it, for an epoch's first batch "
             "| next() p99 ms | workers at end |", "|---|---:|---:|---:|---:|---|"]  # fmt: skip
    for system in systems:
        mine = [r for r in runs if r["system"] == system]
        rates = [r["samples_per_s"] for r in mine]
        lines.append(
            f"| {system} | {statistics.median(rates):.0f} ({min(rates):.0f}-{max(rates):.0f}) "
            f"| {statistics.median(r['wait_share'] for r in mine):.1%} "
            f"| {statistics.median(r.get('epoch_start_share', 0.0) for r in mine):.1%} "
            f"| {statistics.median(r['next_p99_ms'] for r in mine):.0f} "
            f"| {', '.join(str(r['workers']) for r in mine)} |"
        )
    lines.append(
        f"\nMedians of {args.rounds} interleaved rounds; a {STEP_S * 1000:.0f} ms step "
        f"(cap {BATCH / STEP_S:.0f} samples/s); {EPOCHS} timed epochs after {args.warmup}."
    )
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
