"""The bench's image pipeline made by plain threads in one process, against drapps and
DataLoader with two worker processes: 150 timed batches of 32 after 12, interleaved rounds,
each system's median samples/s.

    .venv/bin/python docs/results/executor/threads.py            # every system, 3 rounds
    ROUNDS=5 .venv/bin/python docs/results/executor/threads.py threads-2,drapps-2

``drapps-thread-N``: ``drapps.Loader(backend="thread")`` with N threads (which run without
the sample cache); ``drapps-auto``: the default count, which may move the workers to threads
(not with the cache on, as ``cache="auto"`` puts it for this dataset; ``-nocache``: without it,
as for a user's own dataset). ``GIL_MS=2`` adds a pure-Python loop of
about 2 ms to each sample (a GIL-heavy augmentation). Also prints each loader's peak resident
memory (the process and its children, sampled every 10 batches; ``RSS=0`` leaves it out: the
sampling reads every process in ``/proc`` and holds the GIL, which threads notice) and the
executor it ended on.
``threads-N``: N threads each make whole batches (``dataset[i]`` per index, then
``default_collate``) into a queue the main thread takes them from; decode and resize release
the GIL. Their batches run on across epochs (one order, repeated) with no boundary;
``threads-2-epochs`` stops at each epoch's end, as the loaders do (the next epoch begins once
the loop has taken the last batch of this one).
"""

import sys, time, threading, queue, statistics, json, os
import psutil
from pathlib import Path
import torch
from torch.utils.data import DataLoader, default_collate
import drapps
from drapps.bench.workloads.image import ImageWorkload

params = ImageWorkload.prepare(Path.home() / ".cache/drapps", "default", 0)
wl = ImageWorkload(params)
ds = wl.dataset(None)
GIL_MS = float(os.environ.get("GIL_MS", 0))
RSS = os.environ.get("RSS", "1") != "0"  # RSS=0: no memory sampling (psutil holds the GIL)


class GilHeavy(torch.utils.data.Dataset):
    """The image dataset with a pure-Python loop after each sample, holding the GIL for
    about ``GIL_MS`` milliseconds (a Python-level augmentation)."""

    def __init__(self, inner):
        self.inner = inner
        self.rounds = self._calibrate(GIL_MS)

    @staticmethod
    def _calibrate(ms):
        t = time.perf_counter(); x = 0
        for i in range(200_000): x += i * i % 7
        per_round = (time.perf_counter() - t) / 200_000
        return int(ms / 1000 / per_round)

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, i):
        sample = self.inner[i]
        x = 0
        for k in range(self.rounds): x += k * k % 7
        return sample


if GIL_MS:
    ds = GilHeavy(ds)
N = len(ds); B = 32; WARM, TIMED = 12, int(os.environ.get("TIMED", 150))
torch.set_num_threads(1)

def start_threads(n, batches, stopped=lambda: False):
    """``n`` threads that take the next indices from ``batches`` under a lock and put their
    collated batch on the queue returned with them, until ``batches`` ends or ``stopped()``."""
    lock = threading.Lock(); out = queue.Queue(maxsize=2 * n)
    def work():
        while not stopped():
            with lock:
                idx = next(batches, None)
            if idx is None: return
            out.put(default_collate([ds[i] for i in idx]))
    ts = [threading.Thread(target=work, daemon=True) for _ in range(n)]
    for t in ts: t.start()
    return ts, out

def drain(ts, out):
    """Take what the threads put until each has returned."""
    while any(t.is_alive() for t in ts):
        try: out.get(timeout=0.1)
        except queue.Empty: pass

def threads(n):
    order = torch.randperm(N).tolist()
    batches = iter([order[i:i+B] for i in range(0, N - B + 1, B)] * 10)
    stop = threading.Event()
    ts, out = start_threads(n, batches, stop.is_set)
    for _ in range(WARM): out.get()
    t0 = time.perf_counter()
    for _ in range(TIMED): out.get()
    dt = time.perf_counter() - t0
    stop.set()
    drain(ts, out)
    return TIMED * B / dt

def threads_by_epoch(n):
    """``threads(n)`` with DataLoader's epochs: the threads take one epoch's batches, and the
    next epoch begins once the loop has taken the last of them (the loaders' boundary)."""
    got, t0 = 0, None
    while True:
        order = torch.randperm(N).tolist()
        ts, out = start_threads(n, iter([order[i:i+B] for i in range(0, N - B + 1, B)]))
        for _ in range(N // B):
            out.get(); got += 1
            if got == WARM: t0 = time.perf_counter()
            if got == WARM + TIMED:
                dt = time.perf_counter() - t0
                drain(ts, out)
                return TIMED * B / dt
        for t in ts: t.join()

def tree_rss():
    """Resident memory of this process and its children, in MiB."""
    me = psutil.Process()
    total = 0
    for p in [me, *me.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total / 2**20

PEAK = {}

def loader(make):
    l = make(); it = iter(l); n = 0; peak = 0.0
    while True:
        for b in it:
            n += 1
            if n == WARM: t0 = time.perf_counter()
            if RSS and n % 10 == 0: peak = max(peak, tree_rss())
            if n == WARM + TIMED:
                dt = time.perf_counter() - t0
                executor = l.stats().executor if hasattr(l, "stats") else None
                if hasattr(l, "close"): l.close()
                PEAK.setdefault(NAME[0], []).append(round(peak))
                if executor: EXECUTOR.setdefault(NAME[0], []).append(executor)
                return TIMED * B / dt
        it = iter(l)

EXECUTOR = {}
NAME = [""]

systems = {
    "threads-2": lambda: threads(2),
    "threads-3": lambda: threads(3),
    "threads-2-epochs": lambda: threads_by_epoch(2),
    "drapps-auto": lambda: loader(lambda: drapps.Loader(ds, batch_size=B, shuffle=True, persistent_workers=True)),
    "drapps-auto-nocache": lambda: loader(lambda: drapps.Loader(ds, batch_size=B, shuffle=True, persistent_workers=True, cache=None)),
    "drapps-2-nocache": lambda: loader(lambda: drapps.Loader(ds, batch_size=B, shuffle=True, num_workers=2, cache=None)),
    "drapps-2": lambda: loader(lambda: drapps.Loader(ds, batch_size=B, shuffle=True, num_workers=2)),
    "drapps-thread-2": lambda: loader(lambda: drapps.Loader(ds, batch_size=B, shuffle=True, num_workers=2, backend="thread")),
    "drapps-thread-2-persistent": lambda: loader(lambda: drapps.Loader(ds, batch_size=B, shuffle=True, num_workers=2, backend="thread", persistent_workers=True)),
    "drapps-thread-3": lambda: loader(lambda: drapps.Loader(ds, batch_size=B, shuffle=True, num_workers=3, backend="thread")),
    "dataloader-4": lambda: loader(lambda: DataLoader(ds, batch_size=B, shuffle=True, num_workers=4, persistent_workers=True)),
    "dataloader-2": lambda: loader(lambda: DataLoader(ds, batch_size=B, shuffle=True, num_workers=2, persistent_workers=True)),
}
names = sys.argv[1].split(",") if len(sys.argv) > 1 else list(systems)
res = {k: [] for k in names}
for r in range(int(os.environ.get("ROUNDS", 3))):
    for k in (names if r % 2 == 0 else names[::-1]):
        NAME[0] = k
        res[k].append(systems[k]())
        print(r, k, round(res[k][-1]), flush=True)
print(json.dumps({k: round(statistics.median(v)) for k, v in res.items()}))
print("peak tree RSS MiB:", json.dumps({k: statistics.median(v) for k, v in PEAK.items()}))
print("executor at the end:", json.dumps(EXECUTOR))
