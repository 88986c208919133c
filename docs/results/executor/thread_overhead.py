"""Where drapps' thread workers lose against plain threads: the bench's image pipeline made by
two plain threads, and by ``drapps.Loader(backend="thread", num_workers=2)`` whole and with one
part of its work taken out at a time (ablations: each patches one internal, so the batches are
not drapps' any more; they measure what that part costs, nothing else).

Each variant runs in a fresh interpreter, interleaved over rounds; 12 batches of 32 warm up,
then ``TIMED`` batches are timed. Prints samples/s, the process's CPU seconds per batch, its
CPU use (cores) and voluntary context switches per batch, and the median of each variant.

    ROUNDS=5 TIMED=300 .venv/bin/python docs/results/executor/thread_overhead.py

Variants:
- ``plain``: two threads each make whole batches (``dataset[i]``, then ``default_collate``)
  into a queue the main thread takes them from;
- ``relay``: ``plain`` with a third thread between the queue and the main thread, which
  moves each batch to a second queue (a hand-over through one thread more, doing nothing else);
- ``drapps``: ``drapps.Loader(ds, batch_size=32, shuffle=True, num_workers=2,
  backend="thread", persistent_workers=True)`` as shipped;
- ``no-seed``: without entering each sample's seed (the ops draw from one generator);
- ``no-runqueue``: without reading each worker's wait for a core after each sample;
- ``no-cost-model``: the dispatcher neither learns nor predicts sample costs;
- ``bare``: a task is ``dataset[i]`` for its indices and drapps' collate, nothing else (no
  seed, no per-sample record, no clock): what is left is the dispatch and hand-over.
- ``direct``: the hand-over without the dispatcher's thread: a worker thread takes its reply
  to the dispatcher's state itself (under one lock the dispatcher's thread takes for each of
  its steps) and deals the next tasks, and the loop deals them as it takes a batch; the
  dispatcher's thread only keeps the pool, applies commands and watches the clock;
- ``direct-no-runqueue``: ``direct`` and ``no-runqueue`` together.
"""

import json
import os
import queue
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

VARIANTS = [
    "plain", "relay", "drapps", "no-seed", "no-runqueue", "no-cost-model", "bare", "direct",
    "direct-no-runqueue",
]  # fmt: skip
B, WARM = 32, 12


def run(variant: str, timed: int) -> dict:
    import numpy as np
    import torch
    from torch.utils.data import default_collate

    import drapps
    from drapps.bench.workloads.image import ImageWorkload
    from drapps.runtime import cost, worker

    ds = ImageWorkload(ImageWorkload.prepare(Path.home() / ".cache/drapps", "default", 0)).dataset(
        None
    )
    torch.set_num_threads(1)
    if variant.startswith("direct"):
        _hand_over_directly()
    if variant == "no-seed":
        worker._SampleMaker._enter = lambda self, position, index: None
    elif variant.endswith("no-runqueue"):
        worker.runqueue_wait = worker._not_read
    elif variant == "no-cost-model":
        cost.SampleCosts.observe = lambda self, indices, seconds: False
        cost.SampleCosts.predict = lambda self, indices: np.full(len(indices), 1e-3)
    elif variant == "bare":

        def bare(recipe, seed, epoch, indices, split=None, *, collate=True, **_):
            samples = [recipe.dataset[i] for i in indices]
            return worker.Made(
                worker.collate(recipe, samples), [], (0.0, 0.0, 0.0), [1e-3] * len(indices)
            )

        worker.make_batch = bare

    if variant in ("plain", "relay"):
        g = torch.Generator().manual_seed(0)
        n = len(ds)
        order = iter(
            [
                p[i : i + B]
                for p in (torch.randperm(n, generator=g).tolist() for _ in range(50))
                for i in range(0, n - B + 1, B)
            ]
        )
        lock, out = threading.Lock(), queue.Queue(maxsize=4)

        def work():
            while True:
                with lock:
                    idx = next(order, None)
                if idx is None:
                    return
                out.put(default_collate([ds[i] for i in idx]))

        for _ in range(2):
            threading.Thread(target=work, daemon=True).start()
        if variant == "relay":
            moved: queue.Queue = queue.Queue(maxsize=4)

            def relay(made: queue.Queue) -> None:
                while True:
                    moved.put(made.get())

            threading.Thread(target=relay, args=(out,), daemon=True).start()
            batches = iter(moved.get, None)
        else:
            batches = iter(out.get, None)
    else:
        loader = drapps.Loader(
            ds, batch_size=B, shuffle=True, num_workers=2, backend="thread", persistent_workers=True
        )

        def endless():
            while True:
                yield from loader

        batches = endless()
    for _ in range(WARM):
        next(batches)
    r0, c0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.process_time(), time.perf_counter()
    for _ in range(timed):
        next(batches)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "samples_s": round(timed * B / wall),
        "cpu_ms_per_batch": round(1e3 * cpu / timed, 2),
        "cores": round(cpu / wall, 3),
        "voluntary_switches_per_batch": round((r1.ru_nvcsw - r0.ru_nvcsw) / timed, 1),
    }


def _hand_over_directly() -> None:
    """Patch the dispatcher and the thread pool for the ``direct`` variant."""
    from drapps.runtime import dispatcher, thread_pool

    made = dispatcher.Dispatcher.__init__

    def init(self, *args, **kwargs):
        made(self, *args, **kwargs)
        self.state = threading.RLock()
        self.pool.direct = self
        self.buffer._on_consumed = lambda: deal_from_the_loop(self)

    def deal_from_the_loop(self) -> None:
        if self.state.acquire(blocking=False):
            try:
                self._dispatch()
            finally:
                self.state.release()
        else:
            self._wake_soon()

    ran, polled = dispatcher.Dispatcher._run, thread_pool.ThreadPool.poll

    def run(self) -> None:  # the dispatcher's loop under the state's lock but for its wait
        with self.state:
            ran(self)

    def poll(self, timeout, wake):
        self.direct.state.release()
        try:
            return polled(self, timeout, wake)
        finally:
            self.direct.state.acquire()

    def reply(self, worker, reply) -> None:
        with self.direct.state:
            if worker.wid in self._threads and not self.direct.mailbox.stopped:
                self.direct._on_reply(worker, reply)
                self.direct._dispatch()

    dispatcher.Dispatcher.__init__ = init
    dispatcher.Dispatcher._run = run
    thread_pool.ThreadPool.poll = poll
    thread_pool.ThreadPool._reply = reply


def main() -> None:
    if len(sys.argv) == 3:  # one run, in a fresh interpreter
        print(json.dumps(run(sys.argv[1], int(sys.argv[2]))), flush=True)
        os._exit(0)  # the loader's threads and the plain threads end with the process
    rounds, timed = int(os.environ.get("ROUNDS", 5)), int(os.environ.get("TIMED", 300))
    variants = sys.argv[1].split(",") if len(sys.argv) == 2 else VARIANTS
    got: dict[str, list[dict]] = {v: [] for v in variants}
    for r in range(rounds):
        for v in variants if r % 2 == 0 else variants[::-1]:
            line = (
                subprocess.run(
                    [sys.executable, __file__, v, str(timed)],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                .stdout.strip()
                .splitlines()[-1]
            )
            got[v].append(json.loads(line))
            print(r, v, got[v][-1], flush=True)
    base = statistics.median(x["samples_s"] for x in got["plain"]) if "plain" in got else None
    print(
        "\nvariant | samples/s median (min-max) | of plain | CPU ms/batch | cores"
        " | voluntary switches/batch"
    )
    for v, runs in got.items():
        s = [x["samples_s"] for x in runs]
        med = statistics.median(s)
        share = f"{med / base:.2f}" if base else "-"
        print(
            f"{v} | {med:,.0f} ({min(s):,}-{max(s):,}) | {share} | "
            f"{statistics.median(x['cpu_ms_per_batch'] for x in runs):.1f} | "
            f"{statistics.median(x['cores'] for x in runs):.2f} | "
            f"{statistics.median(x['voluntary_switches_per_batch'] for x in runs):.1f}"
        )
    print(
        "python",
        sys.version.split()[0],
        "torch",
        __import__("torch").__version__,
        "cpus",
        os.cpu_count(),
    )


if __name__ == "__main__":
    main()
