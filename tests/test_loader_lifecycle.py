"""Clean exit: nothing of ours (processes, threads, shared memory) outlives the loader."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from helpers import (
    BigDataset,
    BigStream,
    FailingDataset,
    HangingDataset,
    SlowDataset,
    drapps_children,
    drapps_threads,
    leaks,
    shm_names,
    slab_bytes_held,
    slab_fds,
    wait_until,
)

import drapps
from drapps.runtime.dispatcher import Dispatcher

SRC = str(Path(__file__).resolve().parents[1] / "src")
TESTS = str(Path(__file__).resolve().parent)


def test_normal_end_and_close() -> None:
    # persistent_workers: the workers are still there when close() stops them.
    loader = drapps.Loader(SlowDataset(32), batch_size=4, workers=2, persistent_workers=True)
    assert len(list(loader)) == 8
    assert len(loader.stats().worker_pids) == 2
    loader.close()
    loader.close()  # idempotent
    assert not leaks()
    with pytest.raises(RuntimeError, match="closed"):
        iter(loader)


def test_with_block_closes_even_after_break() -> None:
    with drapps.Loader(SlowDataset(400), batch_size=4, workers=2) as loader:
        for b, _ in enumerate(loader):
            if b == 3:
                break
    assert not leaks()


@pytest.mark.parametrize("dataset", [BigDataset, BigStream])
@pytest.mark.parametrize("workers", [2, "auto"])
@pytest.mark.parametrize("persistent", [False, True])
def test_a_loop_that_breaks_out_of_an_epoch_lets_its_workers_go_as_dataloaders_do(
    dataset: Any, workers: int | str, persistent: bool
) -> None:
    # DataLoader shuts an iterator's workers down once the iterator is collected (a loop that
    # broke out of its epoch); persistent workers stay for the next epoch. drapps kept both,
    # and the batches made ahead, until the next iter(): here 2 processes and 16 MiB, for as
    # long as the program did something else (an iterable dataset's, too).
    options: dict[str, Any] = {"batch_size": 4, "persistent_workers": persistent}
    if workers != "auto":
        options["num_workers"] = workers
    with drapps.Loader(dataset(400, 256 * 1024), **options) as loader:
        for b, _batch in enumerate(loader):
            if b == 0:
                pids = loader.stats().worker_pids
            if b == 3:
                break
        del _batch  # the loop lets go of its last batch too
        gc.collect()
        assert loader.state_dict()["next_batch"] == 4  # a checkpoint still holds the epoch
        assert pids
        if persistent:
            assert set(loader.stats().worker_pids) == set(pids)
        else:
            assert wait_until(lambda: not loader.stats().worker_pids, timeout=60)
            assert wait_until(lambda: not any(map(psutil.pid_exists, pids)), timeout=60)
            assert wait_until(lambda: slab_bytes_held() == 0, timeout=60)
        assert sum(len(batch) for batch in loader) == 400  # the next epoch, whole


def test_an_epoch_let_go_of_while_its_thread_holds_the_dispatchers_mailbox_still_lets_go() -> None:
    # An iterator in a reference cycle is freed by whichever allocation starts a collection,
    # maybe one the dispatcher's mailbox makes with its lock held in this very thread. The
    # let-go its finalizer sends must neither wait for that lock nor be dropped (the workers
    # and what they made ahead would stay until the next iter()).
    with drapps.Loader(BigDataset(400, 256 * 1024), batch_size=4, num_workers=2) as loader:
        epoch = iter(loader)
        next(epoch)
        pids = loader.stats().worker_pids
        assert pids
        with loader._parts.engine.dispatcher.mailbox._lock:  # as inside post()
            del epoch  # its finalizer runs here
        assert wait_until(lambda: not any(map(psutil.pid_exists, pids)), timeout=60)
        assert wait_until(lambda: slab_bytes_held() == 0, timeout=60)
        assert sum(len(batch) for batch in loader) == 400  # the next epoch, whole


class StuckStream(torch.utils.data.IterableDataset[int]):
    """Each worker yields 4 items, then waits in its next one for an hour."""

    def __iter__(self) -> Any:
        yield from range(4)
        time.sleep(3600)


def test_a_stream_worker_stuck_in_the_dataset_is_stopped_when_its_epoch_is_let_go_of() -> None:
    # The workers of an epoch let go of are asked to stop from its iterator's finalizer,
    # which must not wait for them; one that does not stop in its own time is killed.
    with drapps.Loader(StuckStream(), batch_size=2, num_workers=2) as loader:
        for b, _batch in enumerate(loader):
            if b == 0:
                pids = loader.stats().worker_pids
            if b == 3:
                break
        del _batch
        assert len(pids) == 2
        assert wait_until(lambda: not any(map(psutil.pid_exists, pids)), timeout=60)
    assert not leaks()


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("workers", [2, "auto"])
def test_the_epoch_after_a_break_is_whole_however_soon_it_begins(
    workers: int | str, stream: bool
) -> None:
    # The left epoch's workers are let go from its iterator's finalizer, which the dispatcher
    # may hear of only after the next iter() has begun: that must not let the next epoch's
    # batches go too (it gave none, most times, where the loop went straight on).
    options: dict[str, Any] = {"batch_size": 4}
    if workers != "auto":
        options["num_workers"] = workers
    with drapps.Loader(BigStream(64, 4) if stream else list(range(64)), **options) as loader:
        for _ in range(20):
            for b, _batch in enumerate(loader):
                if b == 1:
                    break
            assert sum(len(batch) for batch in loader) == 64


def test_garbage_collection_mid_epoch_stops_everything() -> None:
    loader = drapps.Loader(SlowDataset(400), batch_size=4, workers=3, prefetch=8)
    it = iter(loader)
    next(it)
    pids = loader.stats().worker_pids
    del loader, it
    gc.collect()
    assert not leaks()
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids)


class CollectsOnAWorkerThread:
    """Sample ``at`` waits until the test has dropped its loader, then runs the cyclic
    collector on the worker thread making it, which finds the loader unreachable."""

    def __init__(self, n: int, at: int) -> None:
        self.n, self.at = n, at
        self.dropped, self.collected = threading.Event(), threading.Event()
        self.dispatcher_after: bool | None = None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == self.at:
            assert self.dropped.wait(60), "the test never dropped the loader"
            gc.collect()
            # Stopping the loader joins this very thread: it cannot have ended yet.
            names = [t.name for t in threading.enumerate()]
            self.dispatcher_after = any(n.startswith("drapps-dispatcher") for n in names)
            self.collected.set()
        return torch.tensor(i)


def test_garbage_collection_on_the_loaders_own_worker_thread_neither_waits_nor_warns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A loader in a reference cycle is freed by whichever thread's allocation starts a
    # collection: often one of its own worker threads. Stopping it there must not wait for
    # that very thread (its grace ran out, then a warning said it was "still making a sample").
    dataset = CollectsOnAWorkerThread(16, at=2)
    gc.disable()  # only the worker thread's collection may find the loader
    try:
        loader = drapps.Loader(dataset, batch_size=1, workers=2, backend="thread", prefetch=4)
        loader.cycle = loader  # type: ignore[attr-defined]
        it = iter(loader)
        next(it)
        collected = weakref.ref(loader)
        del loader, it
        dataset.dropped.set()
        assert dataset.collected.wait(60)
    finally:
        gc.enable()
    assert collected() is None  # the worker thread's collection freed it
    assert dataset.dispatcher_after, "the collection waited for the loader to stop"
    assert not leaks()
    assert "still making a sample" not in caplog.text


class SamplerFails(torch.utils.data.Sampler[int]):
    def __init__(self, at: int) -> None:
        self.at = at

    def __len__(self) -> int:
        return 40

    def __iter__(self) -> Any:
        for key in range(40):
            if key == self.at:
                raise LookupError("the sampler failed")
            yield key


class StreamFailsAtThree(torch.utils.data.IterableDataset[int]):
    def __iter__(self) -> Any:
        info = torch.utils.data.get_worker_info()
        for i in range(8):
            if i == 3:
                raise KeyError(i)
            if info is None or i % info.num_workers == info.id:
                yield i


def fails_to_start(worker_id: int) -> None:
    raise RuntimeError("this worker cannot start")


@pytest.mark.parametrize(
    "case", ["sample", "sampler", "sampler-early", "stream", "worker_init_fn", "timeout"]
)
@pytest.mark.parametrize("workers", [0, 2, "threads"])
def test_a_loader_whose_error_the_loop_caught_goes_with_its_last_reference(
    case: str, workers: int | str
) -> None:
    # An error raised from a frame that still held it (a local, the batch it came with) is a
    # reference cycle through its traceback: the loop that caught it and let go of the loader
    # left the loader, its workers and what they held for the garbage collector, which may not
    # run for long. Each of these errors leaves no such cycle: the last reference frees it all.
    if workers == 0 and case in ("worker_init_fn", "timeout"):
        pytest.skip("a worker's failure: there is none")
    if workers == "threads" and case in ("stream", "worker_init_fn", "timeout"):
        pytest.skip("map-style samples, no worker_init_fn, and a thread cannot be stopped")
    options: dict[str, Any] = {
        "batch_size": 2,
        "num_workers": 2 if workers == "threads" else workers,
    }
    if workers == "threads":
        options["backend"] = "thread"
    if case == "sample":
        dataset: Any = FailingDataset(8, {3})
    elif case.startswith("sampler"):  # early: within the workers' first prefetch (iter())
        at = 4 if case == "sampler-early" else 30
        dataset, options["sampler"] = SlowDataset(40, 0.0), SamplerFails(at)
    elif case == "stream":
        dataset = StreamFailsAtThree()
    elif case == "worker_init_fn":
        dataset, options["worker_init_fn"] = FailingDataset(8, {3}), fails_to_start
    else:
        dataset, options["timeout"], options["max_attempts"] = HangingDataset(8, 3), 1.0, 1
    gc.disable()  # only reference counts may free the loader
    try:
        loader = drapps.Loader(dataset, **options)
        freed = weakref.ref(loader)
        raised = None
        try:
            for _batch in loader:
                pass
        except Exception as exc:  # the loop catches it, and keeps no reference to it
            raised = type(exc).__name__
        del loader
        assert raised is not None
        assert freed() is None, f"the loader outlived its last reference after {raised}"
        assert wait_until(lambda: not drapps_children() and not drapps_threads(), timeout=30)
    finally:
        gc.enable()
    assert not leaks()


def test_a_thread_that_still_holds_a_batchs_error_does_not_hold_the_loader(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A thread worker's error reaches the loop as an object another thread made and passed
    # on, and may hold a moment longer. Raised itself, it took the loop's frames, and the
    # loader through them, into that thread: on a loaded machine the loader outlived its
    # last reference for as long (found by CI). Here the worker keeps each error for good;
    # the loop raises a copy, so the loader still goes with its last reference.
    from drapps.runtime import thread_pool
    from drapps.runtime.messages import BatchFailed

    kept: list[BaseException] = []
    made = thread_pool.answer

    def answer_and_keep(*args: Any, **kwargs: Any) -> Any:
        reply = made(*args, **kwargs)
        if isinstance(reply, BatchFailed):
            kept.append(reply.error)
        return reply

    monkeypatch.setattr(thread_pool, "answer", answer_and_keep)
    gc.disable()  # only reference counts may free the loader
    try:
        loader = drapps.Loader(
            FailingDataset(8, {3}), batch_size=2, num_workers=2, backend="thread"
        )
        freed = weakref.ref(loader)
        raised = None
        try:
            for _batch in loader:
                pass
        except ValueError as exc:
            raised = exc.args[0]
        del loader
        assert raised is not None and "boom 3" in raised and kept
        assert freed() is None, "the loader outlived its last reference"
        assert wait_until(lambda: not drapps_threads(), timeout=30)
    finally:
        gc.enable()
        kept.clear()


@pytest.mark.parametrize("case", ["closed", "dispatcher"])
@pytest.mark.parametrize("workers", [2, "threads"])
def test_a_loader_failed_for_good_goes_with_its_last_reference(
    case: str, workers: int | str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A loader that cannot go on (closed while the loop still held its iterator, or its
    # dispatcher thread failed) raises at every later next(). Each raise is an error of its
    # own: one error raised again would carry every call's frames, and hold, through them,
    # the loader that keeps it.
    options: dict[str, Any] = {"batch_size": 2, "num_workers": 2}
    if workers == "threads":
        options["backend"] = "thread"
    if case == "dispatcher":
        dispatched = Dispatcher._dispatch
        calls = iter(range(1_000_000))

        def fails_later(self: Dispatcher) -> None:
            if next(calls) == 6:
                raise ZeroDivisionError("a defect in the dispatcher")
            dispatched(self)

        monkeypatch.setattr(Dispatcher, "_dispatch", fails_later)
    gc.disable()  # only reference counts may free the loader
    try:
        loader = drapps.Loader(SlowDataset(400, 0.001), **options)
        freed = weakref.ref(loader)
        batches = iter(loader)
        next(batches)
        if case == "closed":
            loader.close()
        depths, messages = [], set()
        for _ in range(3):  # the failure, then the same words at each later next()
            with pytest.raises(RuntimeError) as raised:
                while True:
                    next(batches)
            depths.append(len(raised.traceback))
            messages.add(str(raised.value))
            if case == "dispatcher":
                assert isinstance(raised.value.__cause__, ZeroDivisionError)
        del raised
        assert len(messages) == 1 and ("closed" if case == "closed" else "dispatcher") in str(
            messages
        )
        assert depths[1] == depths[2], f"each next() raised a longer traceback: {depths}"
        del batches, loader
        assert freed() is None, f"the loader outlived its last reference ({case})"
        assert wait_until(lambda: not drapps_children() and not drapps_threads(), timeout=30)
    finally:
        gc.enable()
    assert not leaks()


def train_until_failure() -> None:
    loader = drapps.Loader(SlowDataset(400, 0.001), batch_size=4, workers=2)
    for b, _ in enumerate(loader):
        if b == 5:
            raise ArithmeticError("loss is NaN")


def test_exception_in_the_training_loop() -> None:
    with pytest.raises(ArithmeticError):
        train_until_failure()
    assert not leaks()


def run_script(
    body: str, env: dict[str, str] | None = None, stdin: bool = False
) -> subprocess.Popen[str]:
    script = textwrap.dedent(
        f"""
        import signal, sys, time
        # As when started from a terminal, even if our own launcher ignored SIGINT (a shell
        # starting a job in the background does): Ctrl-C must raise KeyboardInterrupt.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.path[:0] = [{SRC!r}, {TESTS!r}]
        import drapps
        from helpers import SlowDataset
        """
    ) + textwrap.dedent(body)
    return subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.PIPE if stdin else None,
        text=True,
        env=env,
        start_new_session=True,  # our SIGINT reaches the script's group only
    )


def read_pids(proc: subprocess.Popen[str]) -> list[int]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("pids"), line + (proc.stderr.read() if proc.stderr else "")
    return [int(p) for p in line.split()[1:]]


def wait_gone(pids: list[int], timeout_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _alive(p)]
        time.sleep(0.05)
    return alive


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


LOOP = """
loader = drapps.Loader(SlowDataset(10**6, 0.001), batch_size=4, workers=2)
it = iter(loader)
next(it)
print("pids", *loader.stats().worker_pids, flush=True)
for batch in it:
    time.sleep(0.001)
"""


def test_ctrl_c_in_the_training_process() -> None:
    proc = run_script(LOOP)
    pids = read_pids(proc)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    _, stderr = proc.communicate(timeout=30)
    assert "KeyboardInterrupt" in stderr
    assert not wait_gone(pids)
    assert not shm_names()


SLOW_TORCH_SAMPLE = """
import torch

class SlowSample(torch.utils.data.Dataset):
    # Sample 7 spends a few seconds in torch's native code, one short call after another.
    def __len__(self):
        return 64

    def __getitem__(self, index):
        x = torch.ones(64, 64)
        end = time.monotonic() + (3.0 if index == 7 else 0.0)
        while time.monotonic() < end:
            x = torch.tanh(x @ x / 64)
        return x[0]

loader = drapps.Loader(SlowSample(), batch_size=4, num_workers=2, backend="thread")
batches = iter(loader)
next(batches)
print("the script ends while sample 7 is being made", flush=True)
"""


# The dispatcher's thread waits for the pool as the loader closes; the loop waits that long
# for the dispatcher (10 s), which a sample may outlast. Here 1 s: a sample of 3 s does.
QUICK_DISPATCHER = """
from drapps.runtime.dispatcher import Dispatcher
Dispatcher.shutdown.__defaults__ = (1.0,)
"""


@pytest.mark.parametrize("case", ["open", "closed", "past-the-dispatchers-wait"])
def test_a_script_that_ends_while_a_thread_worker_is_in_native_code_exits_cleanly(
    case: str,
) -> None:
    # Python ends a daemon thread still in native code as it finalizes from inside that
    # call; in torch's C++ code that aborts the process (exit status 134). The exit waits
    # for the sample instead, as it would for a thread of concurrent.futures: that of a
    # loader still open, and that of one closed before (its close waited 2 s, then let go).
    body = SLOW_TORCH_SAMPLE + ("loader.close()\n" if case == "closed" else "")
    proc = run_script((QUICK_DISPATCHER if case.startswith("past") else "") + body)
    stdout, stderr = proc.communicate(timeout=120)
    assert "the script ends" in stdout
    assert proc.returncode == 0, stderr
    assert "terminate called" not in stderr


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_workers_exit_by_themselves_when_the_training_process_is_killed(method: str) -> None:
    """Under forkserver a worker's parent is the fork server, not the training process: it
    watches the training process itself."""
    body = LOOP.replace("workers=2)", f"workers=2, multiprocessing_context={method!r})")
    proc = run_script(body)
    pids = read_pids(proc)
    proc.kill()
    proc.communicate(timeout=30)
    assert not wait_gone(pids)
    assert not shm_names()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("iterable", [False, True])
def test_forkserver_workers_stay_while_the_loop_is_away(iterable: bool) -> None:
    """Under forkserver a worker once took its changed parent pid (the fork server's) for
    the training process's death and exited after a second without a task: lost batches
    ("exited with code 0 on each of 3 attempts"), or a broken pipe for a stream."""
    data: Any = SlowDataset(16) if not iterable else Stream16()
    with drapps.Loader(
        data, batch_size=4, workers=2, persistent_workers=True, multiprocessing_context="forkserver"
    ) as loader:
        for _ in range(2):
            assert sum(len(batch) for batch in loader) == 16
            pids = loader.stats().worker_pids
            time.sleep(2.5)  # the loop is away (evaluation, a checkpoint)
            assert [p for p in pids if _alive(p)] == list(pids)


class Stream16(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    def __iter__(self):  # type: ignore[no-untyped-def]
        info = torch.utils.data.get_worker_info()
        yield from range(info.id, 16, info.num_workers)


def test_recycled_slabs_never_overwrite_a_batch_the_loop_still_holds() -> None:
    """Workers write over released slabs only: every batch of an epoch kept alive stays as
    made, and after close no slab (or released slab) of the loader is left."""
    import numpy as np

    data = [np.full((64, 64), i, dtype=np.int64) for i in range(40)]
    with drapps.Loader(data, batch_size=4, workers=2, seed=0, shuffle=True) as loader:
        for _ in range(2):  # epoch 1 drops its batches: epoch 2 reuses their slabs
            for batch in loader:
                del batch
            gc.collect()
        kept = list(loader)
        for batch in kept:
            assert all((row == row.flatten()[0]).all() for row in batch)
        assert sorted(int(b[i, 0, 0]) for b in kept for i in range(4)) == list(range(40))
    del kept, batch
    gc.collect()
    assert slab_fds() == []
