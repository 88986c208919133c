"""Time to first batch and workers' private memory: drapps against DataLoader, per start method.

An ImageNet-size list of 1,281,167 path strings in a Python list, a small tensor per index;
4 workers, batch 64, shuffled; one pass over 200,000 indices after the first batch. Each
(start method, loader) runs in its own process, interleaved over the rounds. Also, under
spawn, a worker added mid-epoch (``resize``): seconds until it is ready for a task.

    .venv/bin/python docs/results/worker-start/bench.py --rounds 3 \
        > docs/results/worker-start/results.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import time

N = 1_281_167
WORKERS, BATCH, PASS = 4, 64, 200_000


class Paths:
    """The paths of an ImageNet-size training set, and a small tensor per index."""

    def __init__(self, n: int) -> None:
        self.paths = [
            f"/data/train/n{i // 1300:08d}/n{i // 1300:08d}_{i:08d}.JPEG" for i in range(n)
        ]

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> object:
        import torch

        return torch.tensor([len(self.paths[index]), index])


def _private(pid: int) -> int:
    total = 0
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        for line in rollup:
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                total += int(line.split()[1]) * 1024
    return total


def one(method: str, system: str) -> dict[str, float]:
    """Run one case in this process; returns its figures."""
    import torch
    from torch.utils.data import DataLoader

    import drapps

    dataset = Paths(N)
    context = multiprocessing.get_context(method)
    kwargs = {"batch_size": BATCH, "num_workers": WORKERS, "shuffle": True}
    torch.manual_seed(0)
    began = time.perf_counter()
    if system == "dataloader":
        loader = DataLoader(dataset, multiprocessing_context=context, **kwargs)  # type: ignore[arg-type]
        batches = iter(loader)
        next(batches)
        pids = [w.pid for w in batches._workers]  # type: ignore[attr-defined]
    else:
        loader = drapps.Loader(
            dataset, multiprocessing_context=context, max_workers=WORKERS + 1, **kwargs
        )  # type: ignore[arg-type]
        batches = iter(loader)
        next(batches)
        pids = list(loader.stats().worker_pids)
    first = time.perf_counter() - began
    private_first = sum(_private(pid) for pid in pids)
    for _ in range(PASS // BATCH):
        next(batches)
    private_after = sum(_private(pid) for pid in pids)
    out = {"first_batch_s": first, "private_first_mib": private_first / 2**20}
    out["private_after_mib"] = private_after / 2**20
    if system == "drapps" and method == "spawn":
        loader.resize(WORKERS + 1)  # a worker added mid-epoch
        deadline = time.monotonic() + 60
        while len(loader.stats().worker_starts_s) < WORKERS + 1 and time.monotonic() < deadline:
            next(batches)
        out["added_worker_ready_s"] = loader.stats().worker_starts_s[-1]
    if system == "drapps":
        loader.close()  # type: ignore[union-attr]
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--one", nargs=2, metavar=("METHOD", "SYSTEM"))
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(*args.one)))
        return
    cases = [(m, s) for m in ("fork", "spawn", "forkserver") for s in ("dataloader", "drapps")]
    runs: dict[str, list[dict[str, float]]] = {f"{m}/{s}": [] for m, s in cases}
    for _ in range(args.rounds):
        for method, system in cases:
            done = subprocess.run(
                [sys.executable, __file__, "--one", method, system],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            runs[f"{method}/{system}"].append(json.loads(done.stdout.strip().splitlines()[-1]))
    medians = {
        case: {key: statistics.median(r[key] for r in rs) for key in rs[0]}
        for case, rs in runs.items()
    }
    env = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "load": os.getloadavg(),
    }
    print(
        json.dumps({"env": env, "rounds": args.rounds, "medians": medians, "runs": runs}, indent=1)
    )


if __name__ == "__main__":
    main()
