"""Samples whose ``__getitem__`` waits (1 ms, 5% of them 60 ms: a network file system), a
30 ms training step (a sleep): DataLoader at 4, 6 and 8 workers, drapps at 4 and 6 and
``workers="auto"``; 150 timed batches of 32 after 10, interleaved rounds. Prints samples/s,
the share of the timed window the loop waited, p99 ``next()``, the workers at the end and the
proportional memory (PSS) of the whole process tree at the end of the window.

    ROUNDS=2 .venv/bin/python docs/results/executor/slow_reads.py
    ROUNDS=1 .venv/bin/python docs/results/executor/slow_reads.py dataloader-6,drapps-auto
"""
import sys, time, statistics, json, os, random as _r
import psutil
import torch
from torch.utils.data import DataLoader, Dataset
import drapps

class SlowReads(Dataset):
    def __init__(self, n=20000):
        self.n = n
        self.slow = set(_r.Random(0).sample(range(n), n // 20))
    def __len__(self): return self.n
    def __getitem__(self, i):
        time.sleep(0.060 if i in self.slow else 0.001)
        return torch.full((3, 32, 32), i % 251, dtype=torch.uint8), i

B, WARM, TIMED, STEP = 32, 10, int(os.environ.get("TIMED", 150)), 0.030
def run(make):
    l = make(); it = iter(l); n = 0; waits = []; waited = 0.0
    while True:
        t = time.perf_counter()
        b = next(it)
        w = time.perf_counter() - t
        n += 1
        if n == WARM: t0 = time.perf_counter()
        if n > WARM: waits.append(w)
        if n == WARM + TIMED:
            dt = time.perf_counter() - t0
            tree = psutil.Process().children(recursive=True) + [psutil.Process()]
            pss = sum(p.memory_full_info().pss for p in tree if p.is_running()) / 2**20
            workers = l.stats().workers if hasattr(l, "stats") else l.num_workers
            if hasattr(l, "close"): l.close()
            waits.sort()
            return {"sps": TIMED * B / dt, "waited": sum(waits) / dt, "p99_ms": 1000 * waits[int(0.99 * len(waits))], "workers": workers, "tree_pss_mib": pss}
        time.sleep(STEP)
ds = SlowReads()
systems = {f"dataloader-{k}": (lambda k=k: run(lambda: DataLoader(ds, batch_size=B, shuffle=True, num_workers=k, persistent_workers=True))) for k in (4, 6, 8)}
systems["drapps-6"] = lambda: run(lambda: drapps.Loader(ds, batch_size=B, shuffle=True, num_workers=6))
systems["drapps-4"] = lambda: run(lambda: drapps.Loader(ds, batch_size=B, shuffle=True, num_workers=4))
for k in (8, 16):
    systems[f"drapps-thread-{k}"] = (lambda k=k: run(lambda: drapps.Loader(ds, batch_size=B, shuffle=True, num_workers=k, backend="thread")))
systems["drapps-thread-auto"] = lambda: run(lambda: drapps.Loader(ds, batch_size=B, shuffle=True, workers="auto", backend="thread"))
systems["drapps-auto"] = lambda: run(lambda: drapps.Loader(ds, batch_size=B, shuffle=True, workers="auto"))
names = sys.argv[1].split(",") if len(sys.argv) > 1 else list(systems)
res = {k: [] for k in names}
for r in range(int(os.environ.get("ROUNDS", 2))):
    for k in (names if r % 2 == 0 else names[::-1]):
        res[k].append(systems[k]()); print(r, k, {a: (round(b, 3) if isinstance(b, float) else b) for a, b in res[k][-1].items()}, flush=True)
print("median of the rounds:")
for k in names:
    print(f"  {k}: " + ", ".join(f"{a} {statistics.median(r[a] for r in res[k]):.3f}" for a in res[k][0]))
if os.environ.get("OUT"):
    json.dump({"rounds": res, "timed_batches": TIMED, "step_s": STEP, "batch": B}, open(os.environ["OUT"], "w"), indent=1)
