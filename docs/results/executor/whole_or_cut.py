"""Whole batches or batches cut into parts, while worker processes make samples at once.

Under ``workers="auto"``, worker processes whose samples wait make several of a batch's
samples at once in threads of their own, and the dispatcher stops cutting batches into parts
(and copying late parts) for slow samples: a slow read then holds only itself. This measures
that rule against an ablation that cuts anyway (``Schedule.cutting`` without its
samples-at-once condition), beside DataLoader with 8 workers.

Each sample sleeps 2 ms (5% of them 80 ms: a slow read) and hashes ``CPU_KIB`` KiB with
SHA-256 (the GIL released): with the default 5,100 KiB, about 3 ms of CPU, so a third of a
sample's mean time is on the CPU and the workers make 3-4 samples at once; ``CPU_KIB=1700``
gives about 1 ms, 7-8 at once. Batches of 32 shuffled, a 4 ms step (loader-bound), two epochs
of 128 batches, timed over the second; each run in a fresh interpreter, ``ROUNDS`` interleaved
rounds (default 3), medians.

    .venv/bin/python docs/results/executor/whole_or_cut.py
    CPU_KIB=1700 .venv/bin/python docs/results/executor/whole_or_cut.py
"""

import json
import os
import statistics
import sys

from interleaved import environment, interleaved, runs

SYSTEMS = ["whole", "cut", "dataloader-8"]

CHILD = r"""
import hashlib, json, random, sys, time
import numpy as np
import torch
import drapps
from drapps.runtime import schedule

MODE, CPU_KIB = sys.argv[1], int(sys.argv[2])
SEEN = {}
shipped = schedule.Schedule.cutting.fget

def cutting(self):
    SEEN["schedule"] = self
    SEEN.setdefault("at_once", []).append(self.samples_at_once)
    if MODE == "cut":  # the rule without its samples-at-once condition
        return self._splittable and (
            self.mode == "samples" or (self.mode == "auto" and self.heavy_tailed())
        )
    return shipped(self)

schedule.Schedule.cutting = property(cutting)
BUF = bytes(CPU_KIB * 1024)

class SlowReads(torch.utils.data.Dataset):
    def __len__(self):
        return 4096
    def __getitem__(self, i):
        slow = random.Random(i * 7919 + 1).random() < 0.05
        time.sleep(0.080 if slow else 0.002)
        hashlib.sha256(BUF).digest()
        return torch.tensor(i)

if MODE == "dataloader-8":
    loader = torch.utils.data.DataLoader(SlowReads(), batch_size=32, shuffle=True, num_workers=8)
else:
    loader = drapps.Loader(SlowReads(), batch_size=32, shuffle=True, seed=0)
waits, start, n = [], None, 0
for epoch in range(2):
    it = iter(loader)
    while True:
        t = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            break
        if epoch == 1:
            if start is None:
                start, n = t, 0
            waits.append(time.perf_counter() - t)
            n += len(batch)
        time.sleep(0.004)
out = {"system": MODE, "samples_s": n / (time.perf_counter() - start),
       "p99_next_ms": float(np.percentile(waits, 99) * 1e3)}
if "schedule" in SEEN:
    at_once = SEEN["at_once"]
    out["at_once"] = float(np.median(at_once[len(at_once) // 2:]))
    out["cut_batches"] = SEEN["schedule"].cut_batches
print(json.dumps(out))
"""


def main() -> None:
    rounds = int(os.environ.get("ROUNDS", 3))
    cpu_kib = int(os.environ.get("CPU_KIB", 5100))
    systems = sys.argv[1].split(",") if len(sys.argv) > 1 else SYSTEMS
    print(environment(f"CPU_KIB={cpu_kib}, {rounds} rounds"))
    outcomes: dict[str, list[dict]] = {s: [] for s in systems}
    for system, line in interleaved(CHILD, systems, rounds, str(cpu_kib)):
        outcomes[system].append(json.loads(line))
        print(line, flush=True)
    print("| system | samples/s (median) | runs | p99 next() ms | samples at once | cut batches |")
    print("|---|---:|---|---:|---:|---:|")
    for system, got in outcomes.items():
        rates = [g["samples_s"] for g in got]
        p99 = statistics.median(g["p99_next_ms"] for g in got)
        once = statistics.median(g.get("at_once", 1) for g in got)
        cut = statistics.median(g.get("cut_batches", 0) for g in got)
        print(
            f"| {system} | {statistics.median(rates):,.0f} | "
            f"{runs(rates)} | {p99:.0f} | {once:g} | {cut:g} |"
        )


if __name__ == "__main__":
    main()
