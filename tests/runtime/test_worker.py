"""make_batch and collate as a worker runs them."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
import torch
from torch.utils.data import default_collate, get_worker_info
from torch.utils.data._utils import worker as torch_worker

from drapps.runtime.seeding import set_worker_info
from drapps.runtime.worker import BatchRecipe, collate, make_batch, runqueue_wait


@pytest.fixture
def in_a_worker() -> Iterator[None]:
    set_worker_info(1, 2, 7, dataset=[])
    try:
        yield
    finally:
        torch_worker._worker_info = None


def test_default_collate_does_not_allocate_shared_memory_in_a_worker(in_a_worker: None) -> None:
    samples = [torch.zeros(3, 4, dtype=torch.uint8) for _ in range(5)]
    assert default_collate(samples).is_shared()  # what torch does in a DataLoader worker
    batch = collate(BatchRecipe([], None, default_collate, "raise"), samples)
    assert batch.shape == (5, 3, 4) and not batch.is_shared()  # drapps copies it into a slab
    assert get_worker_info() is not None and get_worker_info().id == 1  # restored


def test_a_users_collate_fn_sees_the_worker(in_a_worker: None) -> None:
    def ids(samples: list[int]) -> list[int | None]:
        info = get_worker_info()
        return [s + (info.id if info is not None else 100) for s in samples]

    assert collate(BatchRecipe([], None, ids, "raise"), [1, 2]) == [2, 3]
    assert collate(BatchRecipe([], None, ids, "raise", auto_collation=False), [[5]]) == [6]


def test_a_worker_answers_with_its_batch_collated_in_the_slab(in_a_worker: None) -> None:
    from drapps.runtime.transport import SlabArena, SlabWriter, unpack
    from drapps.runtime.worker import answer, pack_batch

    dataset = [(torch.full((3, 8, 8), i, dtype=torch.uint8), i) for i in range(6)]
    recipe = BatchRecipe(dataset, None, default_collate, "raise")
    writer = SlabWriter()
    arena = SlabArena(writer)
    seen: list[int | None] = []

    def pack(batch: object) -> object:
        seen.append(arena.offset_of(batch[0]))  # type: ignore[index]
        return pack_batch(batch, writer, arena)

    try:
        task = (0, 5, 0, 3, [4, 1, 2], 2, None, None)
        reply = answer(recipe, task, pack, None, arena)  # type: ignore[arg-type]
        assert reply[0] == "ok" and seen == [0]
        images, labels = unpack(reply[3])
        assert labels.tolist() == [4, 1, 2] and images[:, 0, 0, 0].tolist() == [4, 1, 2]
        # A user collate_fn keeps its own output, copied into a slab as before.
        mine = BatchRecipe(dataset, None, lambda s: [torch.stack([x for x, _ in s])], "raise")
        seen.clear()
        reply = answer(mine, task, pack, None, arena)  # type: ignore[arg-type]
        assert reply[0] == "ok" and seen == [None]
        assert unpack(reply[3])[0][:, 0, 0, 0].tolist() == [4, 1, 2]
    finally:
        writer.close()


class _Spins:
    """Each sample burns ``cpu_s`` of this thread's CPU time (its own work), and one sleeps."""

    def __init__(self, cpu_s: float, sleepy: int, sleep_s: float) -> None:
        self.cpu_s, self.sleepy, self.sleep_s = cpu_s, sleepy, sleep_s

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        end = time.thread_time() + self.cpu_s
        while time.thread_time() < end:
            pass
        if i == self.sleepy:
            time.sleep(self.sleep_s)
        return i


@pytest.fixture
def one_shared_core() -> Iterator[None]:
    """This process and a busy one pinned to the same core: each gets about half of it."""
    if not hasattr(os, "sched_setaffinity") or not os.path.exists("/proc/thread-self/schedstat"):
        pytest.skip("needs Linux with per-thread scheduler statistics")
    before = os.sched_getaffinity(0)
    core = min(before)
    os.sched_setaffinity(0, {core})
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # inherits the pin
    try:
        time.sleep(0.2)  # until the hog runs
        yield
    finally:
        hog.kill()
        hog.wait()
        os.sched_setaffinity(0, before)


def test_a_samples_cost_leaves_out_the_time_another_process_held_its_core(
    one_shared_core: None,
) -> None:
    # Four samples of 30 ms of CPU each, sharing one core with a busy process: each takes
    # about 60 ms of wall time, but costs its own 30 ms. Sample 2 also sleeps 50 ms (storage
    # it waited on), which is part of its cost.
    recipe = BatchRecipe(_Spins(0.03, sleepy=2, sleep_s=0.05), None, default_collate, "raise")
    started = time.perf_counter()
    made = make_batch(recipe, 0, 0, [0, 1, 2, 3])
    wall = time.perf_counter() - started
    assert wall > 0.05 + 4 * 0.03 * 1.3, "the busy process did not share the core"
    quick = [made.costs[i] for i in (0, 1, 3)]
    assert all(0.025 < c < 0.03 * 1.25 for c in quick), made.costs
    assert 0.075 < made.costs[2] < 0.08 + 0.03 * 0.5, made.costs


def test_the_runqueue_wait_grows_only_while_the_thread_waits_for_a_core(
    one_shared_core: None,
) -> None:
    start = runqueue_wait()
    time.sleep(0.3)  # sleeping is not waiting for a core (waking up may wait a little)
    slept = runqueue_wait() - start
    end = time.thread_time() + 0.1
    while time.thread_time() < end:
        pass
    contended = runqueue_wait() - start - slept
    assert slept < 0.15 and contended > 0.05, (slept, contended)


@pytest.mark.skipif(not os.path.exists("/proc/thread-self/schedstat"), reason="needs Linux")
def test_the_runqueue_file_of_a_thread_is_closed_when_the_thread_ends() -> None:
    def open_files() -> int:
        return len(os.listdir("/proc/self/fd"))

    before = open_files()
    for _ in range(50):
        thread = threading.Thread(target=runqueue_wait)
        thread.start()
        thread.join()
    assert open_files() <= before + 2
