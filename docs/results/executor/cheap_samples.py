"""Samples that cost next to nothing (a 192-byte tensor made in memory): what the loader
itself costs a sample. DataLoader without workers and with 2, drapps with 0 and 2 and
``workers="auto"``; batches of 32 shuffled, 12,800 samples, one warm epoch and two timed, each
loader in a fresh interpreter, ``ROUNDS`` interleaved rounds (default 3), median samples/s.

    .venv/bin/python docs/results/executor/cheap_samples.py
"""

import statistics

from interleaved import rates, runs

SYSTEMS = ["dataloader-0", "drapps-0", "dataloader-2", "drapps-2", "drapps-auto"]

CHILD = r"""
import sys, time, torch, drapps
from torch.utils.data import DataLoader

class Cheap(torch.utils.data.Dataset):
    def __len__(self):
        return 32 * 400
    def __getitem__(self, i):
        return torch.full((3, 8, 8), i % 7, dtype=torch.uint8)

torch.set_num_threads(1)
name = sys.argv[1]
kind, _, count = name.rpartition("-")
ds = Cheap()
if kind == "dataloader":
    loader = DataLoader(ds, batch_size=32, shuffle=True, num_workers=int(count))
elif name == "drapps-auto":
    loader = drapps.Loader(ds, batch_size=32, shuffle=True)
else:
    loader = drapps.Loader(ds, batch_size=32, shuffle=True, num_workers=int(count))
for batch in loader:
    pass
start = time.perf_counter()
for _ in range(2):
    for batch in loader:
        pass
print(2 * len(ds) / (time.perf_counter() - start))
"""


def main() -> None:
    got = rates(CHILD, SYSTEMS, "samples/s")
    print("| loader | samples/s (median) | runs | us a sample |")
    print("|---|---:|---|---:|")
    for system, values in got.items():
        median = statistics.median(values)
        print(f"| {system} | {median:,.0f} | {runs(values)} | {1e6 / median:.1f} |")


if __name__ == "__main__":
    main()
