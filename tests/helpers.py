"""Shared fakes and leak probes for the test suite (picklable, importable by workers)."""

from __future__ import annotations

import contextlib
import gc
import os
import queue
import random
import socket
import subprocess
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import replace
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

import numpy as np
import torch

import drapps
from drapps.control import State
from drapps.runtime.messages import WorkerFatal
from drapps.runtime.pool import Polled, Reply, Task, Worker, WorkerPool
from drapps.runtime.slabs import SHM_DIR
from drapps.runtime.transport import pack_inline
from drapps.runtime.worker import BatchRecipe, answer


class RandomDataset:
    """Each sample draws from every RNG a transform might use."""

    def __init__(self, n: int, shape: tuple[int, ...] = (3,)) -> None:
        self.n, self.shape = n, shape

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {
            "index": i,
            "py": random.random(),
            "np": np.random.rand(),
            "torch": torch.rand(self.shape),
            "rng": drapps.sample_rng().random(),
        }


class SlowDataset:
    """Returns its index after sleeping ``delay`` seconds."""

    def __init__(self, n: int, delay: float = 0.0) -> None:
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.delay:
            time.sleep(self.delay)
        return torch.tensor(i)


class FailingDataset:
    """Raises ValueError for the indices in ``bad``."""

    def __init__(self, n: int, bad: set[int]) -> None:
        self.n, self.bad = n, bad
        self.paths = [f"/data/sample_{i:04d}.jpg" for i in range(n)]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if i in self.bad:
            raise ValueError(f"boom {i}")
        return torch.tensor(i)


class FailingTransform:
    def __init__(self, bad: set[int]) -> None:
        self.bad = bad

    def __call__(self, sample: torch.Tensor) -> torch.Tensor:
        if int(sample) in self.bad:
            raise KeyError(f"transform cannot handle {int(sample)}")
        return sample


class NoiseTransform:
    """A torchvision-style transform: randomness from torch's global generator."""

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        return {**sample, "noise": torch.rand(2), "flip": torch.rand(1).item() < 0.5}


class HangingDataset:
    """Hangs at ``index``: on the first attempt only when ``marker`` is given, else always."""

    def __init__(self, n: int, index: int, marker: str | None = None) -> None:
        self.n, self.index, self.marker = n, index, marker

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == self.index:
            if self.marker is None:
                time.sleep(3600)
            elif not os.path.exists(self.marker):
                open(self.marker, "w").close()
                time.sleep(3600)
        return torch.tensor(i)


class BigDataset:
    """Samples of ``nbytes`` float32 bytes each."""

    def __init__(self, n: int, nbytes: int) -> None:
        self.n, self.numel = n, nbytes // 4

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((self.numel,), float(i))


class BigStream(torch.utils.data.IterableDataset[torch.Tensor]):
    """``n`` samples of ``nbytes`` float32 bytes each, sharded over the workers."""

    def __init__(self, n: int, nbytes: int) -> None:
        self.n, self.numel = n, nbytes // 4

    def __iter__(self) -> Any:
        info = torch.utils.data.get_worker_info()
        share = range(self.n) if info is None else range(info.id, self.n, info.num_workers)
        return (torch.full((self.numel,), float(i)) for i in share)


class BarePool(WorkerPool):
    """A pool whose workers are only records: what :meth:`WorkerPool.keep_size` and
    :meth:`WorkerPool.next_ids` decide, and what the dispatcher sends each worker
    (:attr:`sent`), without running anything."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[int, Any]] = []
        """(worker's slot, message), in the order sent."""

    def spawn(self, num_workers: int = 1, seed: int = 0) -> Worker:
        wid, slot = self.next_ids()
        self.workers.append(Worker(wid, slot=slot))
        return self.workers[-1]

    def send(self, worker: Worker, message: object) -> None:
        self.sent.append((worker.slot, message))

    def poll(self, timeout: float, wake: int) -> Polled:
        return Polled()

    def drain(self, worker: Worker) -> list[Reply]:
        return []

    def retire(self, worker: Worker) -> None:
        worker.retiring = True

    def kill(self, worker: Worker, *, wait_s: float = 5.0) -> None:
        pass

    def reap(self, worker: Worker) -> list[Task]:
        return self.forget(worker)

    def exit_reason(self, worker: Worker) -> str:
        return "gone"

    def shutdown(self, grace_s: float = 2.0) -> None:
        self.workers.clear()


def flatten_indices(batches: list[Any]) -> list[int]:
    return [int(i) for batch in batches for i in batch]


def assert_batches_equal(left: list[Any], right: list[Any], where: str = "") -> None:
    """Bit-for-bit equality of two lists of (possibly nested) batches; ``where`` leads the
    message (``"epoch 1, "``)."""
    assert len(left) == len(right), f"{where}{len(left)} batches != {len(right)}"
    for b, (x, y) in enumerate(zip(left, right, strict=True)):
        _assert_equal(x, y, f"{where}batch {b}")


def _shown(x: torch.Tensor) -> Any:
    """A small tensor's values in full (torch prints 643470 and 643471 alike as 6.4347e+05)."""
    return x.tolist() if x.numel() <= 64 else x


def _assert_equal(x: Any, y: Any, where: str) -> None:
    if isinstance(x, dict):
        assert x.keys() == y.keys(), where
        for key in x:
            _assert_equal(x[key], y[key], f"{where}[{key!r}]")
    elif isinstance(x, torch.Tensor):
        assert isinstance(y, torch.Tensor), f"{where}: {type(y).__name__} is not a tensor"
        assert x.dtype == y.dtype and torch.equal(x, y), f"{where}: {_shown(x)} != {_shown(y)}"
    elif isinstance(x, np.ndarray):
        assert isinstance(y, np.ndarray) and x.dtype == y.dtype, where
        assert np.array_equal(x, y), f"{where}: {x} != {y}"
    elif isinstance(x, list | tuple):
        assert type(x) is type(y) and len(x) == len(y), f"{where}: {x!r} != {y!r}"
        for i, (a, b) in enumerate(zip(x, y, strict=True)):
            _assert_equal(a, b, f"{where}[{i}]")
    else:
        assert type(x) is type(y) and x == y, f"{where}: {x!r} != {y!r}"


def wait_until(condition: Any, timeout: float = 20.0, every: float = 0.05) -> bool:
    """Whether ``condition()`` became true within ``timeout`` seconds (polled)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(every)
    return True


def free_port() -> int:
    """A loopback TCP port the OS had free just now, for a server started in another process
    (torchrun's rendezvous, redis-server) that takes its port as an argument: another process
    may take it first, so a server that can bind port 0 itself should do that instead."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------------------- leak probes


def drapps_children() -> list[Any]:
    """Live child processes of this process, other than multiprocessing's own helpers."""
    import psutil

    children = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                continue
            cmdline = " ".join(child.cmdline())
        except psutil.NoSuchProcess:
            continue
        if "resource_tracker" in cmdline or "forkserver" in cmdline:
            continue
        children.append(child)
    return children


def drapps_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("drapps-")]


def slab_fds(pid: int | None = None) -> list[str]:
    """Descriptors of drapps' shared memory (slabs, cache regions) that ``pid`` (default: this
    process) holds open."""
    fd_dir = f"/proc/{pid or os.getpid()}/fd"
    found = []
    for fd in os.listdir(fd_dir):
        with contextlib.suppress(OSError):
            target = os.readlink(f"{fd_dir}/{fd}")
            if target.startswith("/memfd:drapps"):
                found.append(target)
    return found


def slab_maps(pid: int | None = None) -> list[str]:
    """Mappings of drapps' slabs in ``pid`` (default: this process)."""
    with open(f"/proc/{pid or os.getpid()}/maps") as maps:
        return [line for line in maps if "/memfd:drapps-slab" in line]


def slab_bytes_held() -> int:
    """Bytes of drapps' slabs held anywhere in this process tree: each slab once (by inode),
    its allocated pages where a process holds it open, else the size of its mappings."""
    import psutil

    held: dict[int, int] = {}
    for process in [psutil.Process(), *psutil.Process().children(recursive=True)]:
        with contextlib.suppress(OSError, psutil.Error):
            fd_dir = f"/proc/{process.pid}/fd"
            for fd in os.listdir(fd_dir):
                with contextlib.suppress(OSError):
                    if os.readlink(f"{fd_dir}/{fd}").startswith("/memfd:drapps-slab"):
                        stat = os.stat(f"{fd_dir}/{fd}")
                        held[stat.st_ino] = stat.st_blocks * 512
            for line in slab_maps(process.pid):
                fields = line.split()
                start, end = (int(x, 16) for x in fields[0].split("-"))
                held.setdefault(int(fields[4]), end - start)
    return sum(held.values())


def shm_names() -> set[str]:
    """Everything named like drapps' in the shared-memory filesystem (and ``/dev/shm``)."""
    names: set[str] = set()
    for directory in {SHM_DIR, "/dev/shm"}:
        with contextlib.suppress(FileNotFoundError):
            names |= {f"{directory}/{n}" for n in os.listdir(directory) if n.startswith("drapps")}
    return names


def leaks(wait_s: float = 5.0) -> dict[str, list[Any]]:
    """What drapps left behind (processes, threads, shared memory held or named), after
    waiting up to ``wait_s``."""
    deadline = time.monotonic() + wait_s
    # A full collection costs ~70 ms: only when something is still there, or a batch held by
    # a reference cycle still maps a slab (the next test would see it).
    collect = bool(slab_maps())
    while True:
        if collect:
            gc.collect()
        collect = True
        found = {
            "processes": drapps_children(),
            "threads": drapps_threads(),
            "shared memory": slab_fds(),
            "names in /dev/shm": sorted(shm_names()),
        }
        if not any(found.values()) or time.monotonic() > deadline:
            return {k: v for k, v in found.items() if v}
        time.sleep(0.05)


# ------------------------------------------------------------------------- control states

GIB = 2**30


def state(**overrides: object) -> State:
    base = State(
        t=0.0,
        cores=8,
        cpu_util=0.4,
        idle_cores=4.8,
        main_cpu=1.0,
        workers_cpu=2.0,
        rss_bytes=2 * GIB,
        available_bytes=20 * GIB,
        total_bytes=32 * GIB,
        disk_read_bps=0.0,
        net_bps=0.0,
        gpu_util=None,
        gpu_memory_bytes=None,
        queue_batches=0,
        queue_bytes=0,
        memory_budget=GIB,
        wait_fraction=0.0,
        latency_p50_s=0.05,
        latency_p99_s=0.08,
        throughput=1000.0,
        workers=2,
        max_workers=8,
        prefetch=4,
    )
    return replace(base, **overrides)  # type: ignore[arg-type]


class BusyDataset:
    """Each sample burns ``cpu_s`` seconds of CPU (a CPU-heavy transform stand-in)."""

    def __init__(self, n: int, cpu_s: float) -> None:
        self.n, self.cpu_s = n, cpu_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        start = time.process_time()
        while time.process_time() - start < self.cpu_s:
            pass
        return torch.tensor(i)


# ------------------------------------------------------------------------- training toolkit


def linear_regression_batches(
    generator: torch.Generator, sizes: list[int], dim: int = 10
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Micro-batches of x ~ N(0, I), y = noise ~ N(0, 1): pure noise targets for a known B_noise."""
    return [
        (torch.randn(n, dim, generator=generator), torch.randn(n, 1, generator=generator))
        for n in sizes
    ]


def regression_b_noise(distance_sq: float, noise_var: float, dim: int) -> float:
    """Analytic B_noise of 0.5 (w.x - y)^2 with x ~ N(0, I_dim), y = w*.x + N(0, noise_var).

    With d = w - w*: G = d, per-item gradient covariance Sigma = (|d|^2 + s^2) I + d d^T, so
    tr(Sigma) / |G|^2 = (dim (|d|^2 + s^2) + |d|^2) / |d|^2.
    """
    return (dim * (distance_sq + noise_var) + distance_sq) / distance_sq


def tiny_mlp(seed: int = 0) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 16),
        torch.nn.Tanh(),
        torch.nn.Linear(16, 16),
        torch.nn.Tanh(),
        torch.nn.Linear(16, 3),
    )


def zero_rank_training(rank: int, world: int, zero: int, steps: int, out: str) -> None:
    """One rank of a ZeRO run: tiny_mlp, AdamW, each rank half of a fixed global batch."""
    from drapps.train import full_state_dict, make_optimizer, shard

    model = tiny_mlp()
    model = shard(model, zero, blocks=[model[0], model[2]] if zero == 2 else None)
    optimizer = make_optimizer(model, zero, torch.optim.AdamW, lr=1e-2, weight_decay=0.01)
    for step in range(steps):
        x, y = zero_batch(step)
        share = len(x) // world
        xs, ys = x[rank * share : (rank + 1) * share], y[rank * share : (rank + 1) * share]
        loss = torch.nn.functional.cross_entropy(model(xs), ys)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    state = full_state_dict(model)
    if rank == 0:
        torch.save(state, out)


def zero_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(16, 6, generator=g), torch.randint(0, 3, (16,), generator=g)


@contextlib.contextmanager
def mounted_tmpfs(mount: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (e.g. "64m") at ``mount``; the test is skipped where none can be."""
    import pytest

    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def barrier_rank(rank: int, world: int) -> None:
    """A rank that only meets the others (for process-group start-up tests)."""
    import torch.distributed as dist

    dist.barrier()


def noise_scale_rank(rank: int, world: int, steps: int, out: str, kind: str) -> None:
    """One DDP or FSDP2 rank measuring B_noise on the regression problem: the global step is
    four micro-batches of 8, rank r takes micro-batches r, r + world, ...; lr 0 holds w."""
    import json

    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    wrap = DistributedDataParallel if kind == "ddp" else fully_shard
    estimate = regression_noise_scale(world, rank, steps, wrap)
    if rank == 0:
        Path(out).write_text(json.dumps(estimate))


def regression_noise_scale(
    world: int, rank: int, steps: int, wrap: Any = None
) -> dict[str, float | None]:
    """B_noise measured on this rank's share of the same global micro-batches."""
    import math

    from drapps.train import AdaptiveAccumulation, GradientNoiseScale

    dim = 10
    model = torch.nn.Linear(dim, 1, bias=False)
    with torch.no_grad():
        model.weight.zero_()
        model.weight[0, 0] = 1.0
    module = wrap(model) if wrap is not None else model
    k = 4 // world
    acc = AdaptiveAccumulation(
        module, 8, min_k=k, max_k=k, max_overhead=math.inf,
        estimator=GradientNoiseScale(beta=0.99, min_updates=1),
    )  # fmt: skip
    optimizer = torch.optim.SGD(module.parameters(), lr=0.0)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        mine = linear_regression_batches(g, [8, 8, 8, 8], dim)[rank::world]
        for x, y in mine:
            with acc.micro_batch(8):
                (0.5 * (module(x) - y).square().sum() / (8 * len(mine))).backward()
        acc.step(optimizer)
    return {"estimate": acc.noise_scale, "updates": acc.estimator.updates}


# ------------------------------------------------------------------------ a second pool


class ThreadPool(WorkerPool):
    """Workers as threads of this process: each takes messages from its own queue and puts
    replies on one shared queue, writing a byte to a pipe so that ``poll`` wakes up."""

    def __init__(self, recipe: BatchRecipe) -> None:
        super().__init__()
        self._recipe = recipe
        self._inboxes: dict[int, queue.SimpleQueue[Any]] = {}
        self._threads: dict[int, threading.Thread] = {}
        self._replies: queue.SimpleQueue[Reply] = queue.SimpleQueue()
        self._notify_r, self._notify_w = os.pipe()
        self.closed = False

    def _run(self, worker: Worker, inbox: queue.SimpleQueue[Any]) -> None:
        while (message := inbox.get()) is not None:
            try:
                reply = answer(self._recipe, message, pack_inline)
            except Exception:
                reply = WorkerFatal(traceback.format_exc())
            self._replies.put((worker, reply))
            os.write(self._notify_w, b"x")

    def spawn(self, num_workers: int = 1, seed: int = 0) -> Worker:
        wid, slot = self.next_ids()
        worker = Worker(wid, slot=slot)
        inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        thread = threading.Thread(target=self._run, args=(worker, inbox), name=f"test-pool-{wid}")
        self._inboxes[wid], self._threads[wid] = inbox, thread
        self.workers.append(worker)
        thread.start()
        return worker

    def send(self, worker: Worker, message: Any) -> None:
        self._inboxes[worker.wid].put(message)

    def poll(self, timeout: float, wake: int) -> Polled:
        ready = wait([self._notify_r, wake], timeout=timeout)
        polled = Polled(woke=wake in ready)
        if self._notify_r in ready:
            os.read(self._notify_r, 4096)
        while not self._replies.empty():
            polled.replies.append(self._replies.get())
        polled.exited = [w for w in self.workers if not self._threads[w.wid].is_alive()]
        return polled

    def drain(self, worker: Worker) -> list[Reply]:
        return []  # every reply is on the shared queue, which poll() empties

    def retire(self, worker: Worker) -> None:
        worker.retiring = True
        self._inboxes[worker.wid].put(None)

    def kill(self, worker: Worker, *, wait_s: float = 5.0) -> None:
        self._inboxes[worker.wid].put(None)  # a thread cannot be killed: it stops when free
        self._threads[worker.wid].join(timeout=wait_s)

    def reap(self, worker: Worker) -> list[Task]:
        self._threads.pop(worker.wid).join(timeout=5.0)
        del self._inboxes[worker.wid]
        return self.forget(worker)

    def exit_reason(self, worker: Worker) -> str:
        return "thread ended"

    def shutdown(self, grace_s: float = 2.0) -> None:
        if self.closed:
            return
        self.closed = True
        for worker in list(self.workers):
            self.kill(worker, wait_s=grace_s)
            self.reap(worker)
        os.close(self._notify_r)
        os.close(self._notify_w)
