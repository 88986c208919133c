"""The default count's pool: worker processes that may become threads mid-epoch, with no batch
lost or made twice, once the workers have shown the dataset draws from no global generator."""

from __future__ import annotations

import time

import torch

import drapps
from drapps.runtime.executor_pool import EVIDENCE, ExecutorPool


class Samples:
    def __init__(self, n: int = 96, draw: bool = False) -> None:
        self.n, self.draw = n, draw

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, float, float]:
        time.sleep(0.001)
        noise = float(torch.rand(1)[0]) if self.draw else 0.0
        return i, drapps.sample_rng().random(), noise


def _dispatcher(loader: drapps.Loader) -> object:
    return loader._parts.engine.dispatcher  # type: ignore[attr-defined]


def _pool(loader: drapps.Loader) -> ExecutorPool:
    pool = _dispatcher(loader).pool  # type: ignore[attr-defined]
    assert isinstance(pool, ExecutorPool)
    return pool


def _loader(dataset: Samples) -> drapps.Loader:
    # The controller is held off (a long interval): the test moves the executor itself.
    return drapps.Loader(dataset, batch_size=4, shuffle=True, seed=3, control_interval=60.0)


def test_workers_move_to_threads_and_back_mid_epoch_losing_and_repeating_nothing() -> None:
    with drapps.Loader(Samples(), batch_size=4, shuffle=True, seed=3, workers=0) as inline:
        expected = [[tuple(map(float, x)) for x in zip(*b, strict=True)] for b in inline]
    with _loader(Samples()) as loader:
        it = iter(loader)
        got = [next(it) for _ in range(6)]  # 24 samples: evidence enough
        assert _pool(loader).threads_allowed() is None
        _dispatcher(loader).set_executor("threads")  # type: ignore[attr-defined]
        got += [next(it) for _ in range(2)]
        assert loader.stats().executor == "threads"
        for _ in range(4):  # the processes finish what they hold, then exit
            got.append(next(it))
            if not loader.stats().worker_pids:
                break
            time.sleep(0.5)
        assert not loader.stats().worker_pids, "the worker processes were not retired"
        _dispatcher(loader).set_executor("processes")  # type: ignore[attr-defined]
        got += list(it)
        assert loader.stats().executor == "processes"
    assert [[tuple(map(float, x)) for x in zip(*b, strict=True)] for b in got] == expected


def test_threads_wait_for_evidence_and_never_run_a_dataset_that_draws_globally() -> None:
    with _loader(Samples(draw=True)) as loader:
        it = iter(loader)
        pool = _pool(loader)
        assert pool.threads_allowed() is not None  # nothing watched yet
        for _ in range(8):
            next(it)
        why = pool.threads_allowed()
        assert why is not None and "torch's default generator" in why
        _dispatcher(loader).set_executor("threads")  # type: ignore[attr-defined]
        assert loader.stats().executor == "processes"
        assert "threads not tried" in (loader.stats().executor_why or "")
        assert len(list(it)) == 24 - 8
    assert pool.watched >= EVIDENCE or pool.drew is not None


class PythonHeavy(Samples):
    """Each sample runs a loop of pure Python (no call that could release the GIL)."""

    def __getitem__(self, i: int) -> tuple[int, float, float]:
        x = 0
        for k in range(20_000):
            x = (x * 31 + k) & 0xFFFF
        return i, drapps.sample_rng().random(), float(x)


def test_a_dataset_whose_time_runs_python_keeps_processes_and_says_why() -> None:
    """The watch measures how much of a sample's time runs Python bytecode, which holds the
    GIL: where two threads would take turns at it, threads are refused before any try."""
    with _loader(PythonHeavy()) as loader:
        it = iter(loader)
        for _ in range(6):  # 24 samples: evidence enough
            next(it)
        pool = _pool(loader)
        share = pool.gil_share()
        assert share is not None and share > 0.5, share
        why = pool.threads_allowed()
        assert why is not None and "runs Python, which holds the GIL" in why, why
        _dispatcher(loader).set_executor("threads")  # type: ignore[attr-defined]
        assert loader.stats().executor == "processes"
        assert "holds the GIL" in (loader.stats().executor_why or "")
        assert len(list(it)) == 24 - 6
    with _loader(Samples()) as loader:  # its time is a sleep: a C call, the GIL released
        it = iter(loader)
        for _ in range(6):
            next(it)
        share = _pool(loader).gil_share()
        assert share is not None and share < 0.5, share
        assert _pool(loader).threads_allowed() is None


def test_a_starving_loop_the_count_cannot_help_gets_a_try_of_threads_the_report_names() -> None:
    """With the count at its ceiling and the loop starving, the controller tries threads at
    the same count, and the report names the try and its reason."""
    with drapps.Loader(
        Samples(100_000), batch_size=4, seed=1, max_workers=2, control_interval=0.05
    ) as loader:
        deadline = time.monotonic() + 60
        report = ""
        for n, _ in enumerate(loader):
            if n % 50:
                continue
            report = loader.report()
            if "-> threads: training loop" in report or time.monotonic() > deadline:
                break
    assert "worker processes -> threads: training loop waited" in report, report


def test_a_reply_sent_before_a_retired_worker_exits_is_read_though_a_later_send_fails() -> None:
    """Found moving workers between executors: a retired worker answered its last task and
    exited, a slab's release was then sent to it (the pipe was closed: a failed send), and the
    failure had marked it broken, so its last reply was never read and the batch was made
    again (and counted as a worker lost)."""
    from torch.utils.data import default_collate

    from drapps.runtime.messages import BatchMade, BatchTask, SlabsFreed
    from drapps.runtime.process_pool import ProcessPool
    from drapps.runtime.transport import discard
    from drapps.runtime.worker import BatchRecipe

    pool = ProcessPool(BatchRecipe(Samples(8), None, default_collate, "raise"), None)
    try:
        worker = pool.spawn(1, 0)
        pool.send(worker, BatchTask(1, 0, 0, 0, [0, 1], 1, None, None))
        pool.retire(worker)
        worker.process.join(timeout=30)  # type: ignore[attr-defined]
        assert worker.process.exitcode == 0  # type: ignore[attr-defined]
        pool.send(worker, SlabsFreed(()))  # its task pipe is closed now
        assert worker.retiring
        replies = pool.drain(worker)
        assert [type(r) for _, r in replies] == [BatchMade]
        for _, reply in replies:
            discard(reply.packed)
    finally:
        pool.shutdown()


def test_with_the_sample_cache_on_the_workers_stay_processes() -> None:
    with drapps.Loader(
        Samples(), batch_size=4, seed=3, control_interval=60.0, cache=drapps.Cache(memory="8MB")
    ) as loader:
        it = iter(loader)
        for _ in range(8):
            next(it)
        why = _pool(loader).threads_allowed()
        assert why is not None and "sample cache" in why
        _dispatcher(loader).set_executor("threads")  # type: ignore[attr-defined]
        assert loader.stats().executor == "processes"
        assert len(list(it)) == 24 - 8
