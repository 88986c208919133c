"""What a Loader's process tree holds with N forked workers: the sum of resident sets, of
proportional set sizes, and of private pages (the bench's image workload, 150 batches):

    python docs/results/learners/real-held/memprobe.py 1; ... 2; ... 8
"""

import sys
import time

import psutil

import drapps
from drapps.bench.data import default_data_dir
from drapps.bench.workloads import workload_class


def smaps(pid):
    out = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if parts[0] in (
                "Rss:",
                "Pss:",
                "Private_Clean:",
                "Private_Dirty:",
                "Shared_Clean:",
                "Shared_Dirty:",
            ):
                out[parts[0][:-1]] = int(parts[1]) * 1024
    return out


n = int(sys.argv[1])
cache = len(sys.argv) > 2
wt = workload_class("image")
w = wt(wt.prepare(default_data_dir(), "default", 0))
with drapps.Loader(
    w.dataset(None),
    batch_size=32,
    drop_last=True,
    workers=n,
    persistent_workers=True,
    policy="static",
    cache=cache or None,
    shuffle=True,
    seed=0,
) as loader:
    it = iter(loader)
    for _ in range(150):
        try:
            next(it)
        except StopIteration:
            it = iter(loader)
            next(it)
    me = psutil.Process()
    tree = [me, *me.children(recursive=True)]
    t0 = time.perf_counter()
    rows = [(p.pid, smaps(p.pid)) for p in tree]
    dt = time.perf_counter() - t0

    def tot(key: str) -> float:
        return sum(r[key] for _, r in rows) / 2**20

    uss = sum(r["Private_Clean"] + r["Private_Dirty"] for _, r in rows) / 2**20
    print(
        f"workers={n} cache={cache} procs={len(rows)} rss={tot('Rss'):.0f} "
        f"pss={tot('Pss'):.0f} uss={uss:.0f} MiB; smaps_rollup of all took {dt * 1000:.1f} ms"
    )
    for pid, r in rows:
        private = (r["Private_Clean"] + r["Private_Dirty"]) / 2**20
        print(
            f"  {pid} rss={r['Rss'] / 2**20:.0f} pss={r['Pss'] / 2**20:.0f} private={private:.0f}"
        )
