"""The soak: random resizes, epochs, resumes, loader churn, forks, killed workers, a sample
cache and suspends for a long time, with every batch exact (each sample is its index; the batch
held before the newest is checked again; whole epochs hold every index once) and workers,
threads, file descriptors, /dev/shm and RSS flat. ``-m slow``; 30 minutes by default
(``DRAPPS_SOAK_S`` sets the length): ``DRAPPS_SOAK_S=1800 make test-slow``."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from test_loader_lifecycle import run_script

SOAK_S = float(os.environ.get("DRAPPS_SOAK_S", "1800"))

SOAK = """
import atexit, gc, json, os, random, signal, threading
import psutil, torch
from helpers import drapps_children, shm_names, slab_fds

class Tagged(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n = n
    def __len__(self):
        return self.n
    def __getitem__(self, i):
        return torch.full((4096,), float(i)), i

def exact(batch):
    x, y = batch
    return bool((x == y.to(x.dtype)[:, None]).all())

wrong = 0

rng = random.Random(0)
me = psutil.Process()
end = time.monotonic() + DURATION
last = 0.0
while time.monotonic() < end:
    workers = rng.choice([1, 2, 3, "auto"])
    kwargs = dict(batch_size=rng.choice([1, 4, 16]), shuffle=rng.random() < 0.5,
                  persistent_workers=rng.random() < 0.5, seed=rng.choice([None, 7]),
                  control_interval=0.1)
    n = rng.randint(20, 400)
    cache = rng.random() < 0.3
    loader = drapps.Loader(Tagged(n), workers=workers, cache=cache, **kwargs)
    resumed = False
    for _ in range(rng.randint(1, 3)):
        it = iter(loader)
        seen, held, whole, resumed = [], None, not resumed, False  # a resumed epoch: its rest
        for b, batch in enumerate(it):
            if not exact(batch) or (held is not None and not exact(held)):
                wrong += 1
            held = batch
            seen += batch[1].tolist()
            r = rng.random()
            if r < 0.05 and workers != "auto":
                loader.resize(rng.randint(1, 3))
            elif r < 0.07:
                state = loader.state_dict()
                loader.load_state_dict(state)
                resumed = True
                break
            elif r < 0.08:
                pid = os.fork()
                if pid == 0:
                    atexit._run_exitfuncs()
                    os._exit(0)
                os.waitpid(pid, 0)
            elif r < 0.09 and workers != "auto":
                pids = loader.stats().worker_pids
                if pids:
                    try:
                        os.kill(rng.choice(pids), signal.SIGKILL)
                    except ProcessLookupError:
                        pass  # it left on its own since the read (a retired worker)
            elif r < 0.10:
                whole = False
                break
        else:
            if whole and sorted(seen) != list(range(n)) and b > 0:
                wrong += 1
    if rng.random() < 0.5:
        loader.close()
    del loader, it, held, batch
    if time.monotonic() - last > 5:
        last = time.monotonic()
        gc.collect()
        time.sleep(0.5)  # parked workers and closing loaders settle
        sample = {"workers": len(drapps_children()), "threads": threading.active_count(),
                  "fds": me.num_fds(), "slabs": len(slab_fds()) + len(shm_names()),
                  "rss": me.memory_info().rss, "wrong": wrong}
        print(json.dumps(sample), flush=True)
print("done", flush=True)
"""


@pytest.mark.slow
@pytest.mark.timeout(SOAK_S + 600)
def test_soak_keeps_every_resource_flat() -> None:
    proc = run_script(f"DURATION = {SOAK_S}\n" + SOAK)
    deadline = time.monotonic() + SOAK_S + 300
    next_suspend = time.monotonic() + 20
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(1)
        if time.monotonic() > next_suspend:  # a suspended job, now and then
            os.killpg(proc.pid, signal.SIGSTOP)
            time.sleep(2)
            os.killpg(proc.pid, signal.SIGCONT)
            next_suspend = time.monotonic() + 30
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and out.rstrip().endswith("done"), err[-3000:]
    samples = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert len(samples) >= 4, out
    quarter = max(1, len(samples) // 4)
    first, last = samples[:quarter], samples[-quarter:]
    for key, slack in (("workers", 3), ("threads", 3), ("fds", 16), ("slabs", 4)):
        early = max(s[key] for s in first)
        late = max(s[key] for s in last)
        assert late <= early + slack, (key, early, late)
    assert max(s["rss"] for s in last) <= 1.5 * max(s["rss"] for s in first)
    assert samples[-1]["wrong"] == 0, samples[-1]
