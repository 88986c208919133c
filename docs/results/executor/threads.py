"""The bench's image pipeline made by plain threads in one process, against drapps and
DataLoader with two worker processes: 150 timed batches of 32 after 12, interleaved rounds,
each system's median samples/s.

    .venv/bin/python docs/results/executor/threads.py            # every system, 3 rounds
    ROUNDS=5 .venv/bin/python docs/results/executor/threads.py threads-2,drapps-2

``drapps-thread-N``: ``drapps.Loader(backend="thread")`` with N threads.
``threads-N``: N threads each make whole batches (``dataset[i]`` per index, then
``default_collate``) into a queue the main thread takes them from; decode and resize release
the GIL.
"""

import sys, time, threading, queue, statistics, json, os
from pathlib import Path
import torch
from torch.utils.data import DataLoader, default_collate
import drapps
from drapps.bench.workloads.image import ImageWorkload

params = ImageWorkload.prepare(Path.home() / ".cache/drapps", "default", 0)
wl = ImageWorkload(params)
ds = wl.dataset(None)
N = len(ds); B = 32; WARM, TIMED = 12, 150
torch.set_num_threads(1)

def threads(n):
    order = torch.randperm(N).tolist()
    batches = iter([order[i:i+B] for i in range(0, N - B + 1, B)] * 10)
    lock = threading.Lock(); out = queue.Queue(maxsize=2 * n); stop = False
    def work():
        while not stop:
            with lock:
                idx = next(batches, None)
            if idx is None: return
            out.put(default_collate([ds[i] for i in idx]))
    ts = [threading.Thread(target=work, daemon=True) for _ in range(n)]
    for t in ts: t.start()
    for _ in range(WARM): out.get()
    t0 = time.perf_counter()
    for _ in range(TIMED): out.get()
    dt = time.perf_counter() - t0
    stop = True
    while any(t.is_alive() for t in ts):
        try: out.get(timeout=0.1)
        except queue.Empty: pass
    return TIMED * B / dt

def loader(make):
    l = make(); it = iter(l); n = 0
    while True:
        for b in it:
            n += 1
            if n == WARM: t0 = time.perf_counter()
            if n == WARM + TIMED:
                dt = time.perf_counter() - t0
                if hasattr(l, "close"): l.close()
                return TIMED * B / dt
        it = iter(l)

systems = {
    "threads-2": lambda: threads(2),
    "threads-3": lambda: threads(3),
    "drapps-2": lambda: loader(lambda: drapps.Loader(ds, batch_size=B, shuffle=True, num_workers=2)),
    "drapps-thread-2": lambda: loader(lambda: drapps.Loader(ds, batch_size=B, shuffle=True, num_workers=2, backend="thread")),
    "drapps-thread-3": lambda: loader(lambda: drapps.Loader(ds, batch_size=B, shuffle=True, num_workers=3, backend="thread")),
    "dataloader-4": lambda: loader(lambda: DataLoader(ds, batch_size=B, shuffle=True, num_workers=4, persistent_workers=True)),
    "dataloader-2": lambda: loader(lambda: DataLoader(ds, batch_size=B, shuffle=True, num_workers=2, persistent_workers=True)),
}
names = sys.argv[1].split(",") if len(sys.argv) > 1 else list(systems)
res = {k: [] for k in names}
for r in range(int(os.environ.get("ROUNDS", 3))):
    for k in (names if r % 2 == 0 else names[::-1]):
        res[k].append(systems[k]())
        print(r, k, round(res[k][-1]), flush=True)
print(json.dumps({k: round(statistics.median(v)) for k, v in res.items()}))
