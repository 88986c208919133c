"""The memory of the whole process tree on the bench's image pipeline, counted two ways: the
sum of each process's resident set (RSS: pages shared between processes, such as torch's
libraries and the pages a forked worker still shares with its parent, count once per process)
and the sum of proportional set sizes (PSS: a shared page is split among the processes that
map it, so the tree's total counts it once). Peak of each, sampled every 20 of 300 batches of
32, for each loader in turn, ``ROUNDS`` rounds (default 2, alternating order), median.

    .venv/bin/python docs/results/executor/tree_memory.py
    ROUNDS=3 .venv/bin/python docs/results/executor/tree_memory.py dataloader-2,drapps-thread-2

Each loader runs in a fresh interpreter, so that one does not inherit what another touched.
"""

import json
import os
import statistics
import subprocess
import sys

SYSTEMS = ["dataloader-2", "dataloader-4", "drapps-2", "drapps-thread-2", "drapps-auto"]

CHILD = r"""
import sys, psutil, torch
from pathlib import Path
from torch.utils.data import DataLoader
import drapps
from drapps.bench.workloads.image import ImageWorkload

params = ImageWorkload.prepare(Path.home() / ".cache/drapps", "default", 0)
ds = ImageWorkload(params).dataset(None)
torch.set_num_threads(1)
name = sys.argv[1]
kind, _, count = name.rpartition("-")
if name == "drapps-auto":
    loader = drapps.Loader(ds, batch_size=32, shuffle=True, persistent_workers=True, cache=None)
elif kind == "dataloader":
    loader = DataLoader(ds, batch_size=32, shuffle=True, num_workers=int(count), persistent_workers=True)
elif kind == "drapps":
    loader = drapps.Loader(ds, batch_size=32, shuffle=True, num_workers=int(count), cache=None)
elif kind == "drapps-thread":
    loader = drapps.Loader(ds, batch_size=32, shuffle=True, num_workers=int(count), backend="thread")
else:
    raise SystemExit(f"unknown loader {name!r}")

def tree():
    me = psutil.Process()
    pss = rss = 0
    procs = 0
    for p in [me, *me.children(recursive=True)]:
        try:
            m = p.memory_full_info()
        except psutil.Error:
            continue
        pss, rss, procs = pss + m.pss, rss + m.rss, procs + 1
    return pss / 2**20, rss / 2**20, procs

peak_pss = peak_rss = 0.0
procs = n = 0
while n < 300:
    for batch in loader:
        n += 1
        if n % 20 == 0:
            pss, rss, procs = tree()
            peak_pss, peak_rss = max(peak_pss, pss), max(peak_rss, rss)
        if n >= 300:
            break
executor = loader.stats().executor if hasattr(loader, "stats") else "processes"
print({"pss": round(peak_pss), "rss": round(peak_rss), "processes": procs, "executor": executor})
if hasattr(loader, "close"):
    loader.close()
"""

names = sys.argv[1].split(",") if len(sys.argv) > 1 else SYSTEMS
rounds = int(os.environ.get("ROUNDS", 2))
found: dict[str, list[dict]] = {name: [] for name in names}
for r in range(rounds):
    for name in names if r % 2 == 0 else names[::-1]:
        out = subprocess.run(
            [sys.executable, "-c", CHILD, name], capture_output=True, text=True, check=True
        ).stdout.strip().splitlines()[-1]
        found[name].append(eval(out))  # the child's own dict literal
        print(r, name, found[name][-1], flush=True)
summary = {
    name: {
        "pss_mib": statistics.median(f["pss"] for f in runs),
        "rss_sum_mib": statistics.median(f["rss"] for f in runs),
        "processes": runs[-1]["processes"],
        "executor": [f["executor"] for f in runs],
    }
    for name, runs in found.items()
}
print(json.dumps(summary, indent=1))
