"""make_batch and collate as a worker runs them."""

from __future__ import annotations

import gc
import itertools
import multiprocessing
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from helpers import wait_until
from torch.utils.data import default_collate, get_worker_info
from torch.utils.data._utils import worker as torch_worker

import drapps
from drapps.runtime import worker as worker_module
from drapps.runtime.inbox import Inbox
from drapps.runtime.messages import BatchTask, SlabsFreed
from drapps.runtime.progress import SampleClock
from drapps.runtime.seeding import set_worker_info
from drapps.runtime.worker import (
    QUEUED_READ_S,
    BatchRecipe,
    collate,
    make_batch,
    read_ahead_of,
    runqueue_wait,
)


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
    from drapps.runtime.messages import BatchMade, BatchTask
    from drapps.runtime.slabs import SlabArena, SlabWriter
    from drapps.runtime.transport import unpack
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
        task = BatchTask(0, 5, 0, 3, [4, 1, 2], 2, None, None)
        reply = answer(recipe, task, pack, None, arena)  # type: ignore[arg-type]
        assert isinstance(reply, BatchMade) and reply.packed is not None and seen == [0]
        images, labels = unpack(reply.packed)
        assert labels.tolist() == [4, 1, 2] and images[:, 0, 0, 0].tolist() == [4, 1, 2]
        # A user collate_fn keeps its own output, copied into a slab as before.
        mine = BatchRecipe(dataset, None, lambda s: [torch.stack([x for x, _ in s])], "raise")
        seen.clear()
        reply = answer(mine, task, pack, None, arena)  # type: ignore[arg-type]
        assert isinstance(reply, BatchMade) and reply.packed is not None and seen == [None]
        assert unpack(reply.packed)[0][:, 0, 0, 0].tolist() == [4, 1, 2]
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


def test_cheap_samples_read_the_wait_for_a_core_seldom_and_still_cost_only_their_own_time(
    one_shared_core: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 4,000 samples of 5 us of CPU sharing one core with a busy process: the scheduler
    # takes the core away mid-sample a dozen times or more, for a time slice (milliseconds)
    # each. Those samples still cost about their own 5 us, though the wait is read only
    # once QUEUED_READ_S has passed since the last reading (a system call a read).
    reads: list[float] = []

    def counted() -> float:
        reads.append(time.perf_counter())
        return runqueue_wait()

    monkeypatch.setattr(worker_module, "runqueue_wait", counted)
    recipe = BatchRecipe(_Spins(5e-6, -1, 0.0), None, default_collate, "raise")
    gc.disable()  # a collection mid-sample would be its own time, a long one
    try:
        started = time.perf_counter()
        made = make_batch(recipe, 0, 0, list(range(4000)))
        wall = time.perf_counter() - started
    finally:
        gc.enable()
    assert wall > 1.5 * made.cpu_s, "the busy process did not share the core"
    assert len(reads) <= wall / QUEUED_READ_S + 2, (len(reads), wall)
    # Each read follows the one before by QUEUED_READ_S or more: how many reads that allows
    # depends on how long the shared core made the samples take. A read taken just after
    # its sample ended can be put off by the busy process, which shortens the next gap:
    # a few may fall short; reads after every sample (gaps of about 5 us) would not.
    short = sum(b - a < QUEUED_READ_S for a, b in itertools.pairwise(reads))
    assert short <= max(3, len(reads) // 20), (short, len(reads), wall)
    later = made.costs[1:]  # the first pays for what a batch sets up once
    assert max(later) < 0.001, max(later)  # a time slice is longer; it is not counted


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


def task(generation: int, batch_id: int) -> BatchTask:
    """A task message for ``batch_id`` (indices and the rest do not matter to the inbox)."""
    return BatchTask(generation, 0, 0, batch_id, [batch_id], 2, None, None)


def test_the_inbox_takes_the_earliest_batch_first_and_a_stop_last() -> None:
    receive, send = multiprocessing.Pipe(duplex=False)
    released: list[object] = []
    inbox = Inbox(receive, os.getpid(), released.append)
    for message in (task(1, 5), task(1, 6), SlabsFreed("slab-a"), task(1, 3), None, task(1, 0)):
        send.send(message)
    # A copy of an overdue part of batch 3 overtakes batches 5 and 6; the stop stays behind
    # them, and what came after the stop stays after it.
    assert [t.batch_id for t in inbox.waiting()] == [5, 6, 3, 0]
    taken = [inbox.next() for _ in range(5)]
    assert [m if m is None else m.batch_id for m in taken] == [3, 5, 6, None, 0]
    assert released == ["slab-a"]  # handed over at once, not queued as a task


def test_the_inbox_takes_a_newer_generation_before_an_older_one() -> None:
    receive, send = multiprocessing.Pipe(duplex=False)
    inbox = Inbox(receive, os.getpid(), lambda notices: None)
    for message in (task(1, 2), task(2, 7)):
        send.send(message)
    taken = [inbox.next() for _ in range(2)]
    assert [(t.generation, t.batch_id) for t in taken] == [(2, 7), (1, 2)]


class Hinted:
    """Answers, for each sample, whether its index was hinted to ``read_ahead`` before."""

    def __init__(self, n: int) -> None:
        self.n, self.hinted = n, set[int]()

    def __len__(self) -> int:
        return self.n

    def read_ahead(self, indices: list[int]) -> None:
        self.hinted.update(indices)

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i, i in self.hinted])


def test_workers_hint_each_tasks_indices_before_making_them() -> None:
    with drapps.Loader(Hinted(40), batch_size=4, shuffle=True, seed=1, workers=2) as loader:
        got = torch.cat(list(loader))
    assert sorted(got[:, 0].tolist()) == list(range(40))
    assert got[:, 1].all()


def test_no_hints_go_to_a_dataset_behind_a_sample_cache() -> None:
    dataset = Hinted(4)
    assert read_ahead_of(BatchRecipe(dataset, None, default_collate, "raise")) is not None
    cached = BatchRecipe(dataset, None, default_collate, "raise", cache=object())  # type: ignore[arg-type]
    assert read_ahead_of(cached) is None
    assert read_ahead_of(BatchRecipe(list(range(4)), None, default_collate, "raise")) is None


def test_a_worker_shows_which_sample_it_is_making_to_the_training_process() -> None:
    context = multiprocessing.get_context("spawn")
    clock = SampleClock()
    process = context.Process(target=make_sample_four_of_batch_two, args=(clock,))
    process.start()
    clock.close_fd()  # the worker has its own: the mapping is what both read
    try:
        assert wait_until(lambda: clock.read() is not None, timeout=60)
        sample = clock.read()
        assert sample is not None
        assert (sample.batch_id, sample.part, sample.position) == (2, 1, 4)
        assert 0 < sample.started <= time.monotonic()  # one clock for both processes
    finally:
        process.kill()
        process.join()


def make_sample_four_of_batch_two(clock: SampleClock) -> None:
    clock.begin_task(2, 1)
    clock.begin_sample(4)
    time.sleep(60)


class _FailsAt:
    """Index 2 fails in ``__getitem__``; the transform fails on 3."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == 2:
            raise KeyError(f"no sample {i}")
        return torch.tensor([i, int(drapps.sample_rng().integers(100))])


def _fails_on_three(sample: torch.Tensor) -> torch.Tensor:
    if int(sample[0]) == 3:
        raise ValueError("cannot transform 3")
    return sample.flip(0).flip(0)


@pytest.mark.parametrize("transform", [None, _fails_on_three], ids=["plain", "transform"])
def test_samples_made_in_the_loop_are_made_and_fail_as_a_workers_are(transform: Any) -> None:
    """The loop's plain path (costs as wall times) and a worker's (costs net of the wait for
    a core) make the same batch, and skip or raise the same failures, named alike."""
    for on_error in ("skip", "raise"):
        recipe = BatchRecipe(_FailsAt(), transform, default_collate, on_error)
        outcomes = []
        for timed in (False, True):
            try:
                made = make_batch(recipe, 3, 1, [0, 1, 2, 3, 4], timed=timed)
                outcomes.append((made.batch.tolist(), made.skipped, len(made.costs)))
            except drapps.SampleError as exc:
                outcomes.append((str(exc).splitlines()[0], exc.stage, exc.index))
            with pytest.raises(RuntimeError):  # each path leaves the sample it was in
                drapps.sample_seed()
        assert outcomes[0] == outcomes[1], on_error
        if on_error == "skip":
            batch, skipped, costs = outcomes[0]
            assert [row[0] for row in batch] == ([0, 1, 4] if transform else [0, 1, 3, 4])
            assert [index for index, _ in skipped] == ([2, 3] if transform else [2])
            assert costs == 5
        else:
            assert outcomes[0][1:] == ("__getitem__", 2)
