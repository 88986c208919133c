"""Worker processes that each run threads: where a dataset's samples wait (on reads, on
storage), each worker makes several of a batch's samples at once, and the batches are the
ones DataLoader makes, failures named as it names them."""

from __future__ import annotations

import io
import multiprocessing
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, default_collate, get_worker_info

import drapps
from drapps.runtime.errors import SampleError
from drapps.runtime.executor_pool import SAMPLE_THREADS, ExecutorPool
from drapps.runtime.handles import shared_handle
from drapps.runtime.worker import BatchRecipe, SampleThreads, make_batch


class Waits:
    """Samples that wait on a read: 2 ms each, every tenth 20 ms, and mostly sleep."""

    def __init__(self, n: int = 160, fail: tuple[int, ...] = (), rng: bool = True) -> None:
        self.n, self.fail, self.rng = n, fail, rng
        self.inside = 0
        self.most_inside = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, float]:
        with self._lock:
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
        try:
            time.sleep(0.020 if i % 10 == 0 else 0.002)
            if i in self.fail:
                raise ValueError(f"sample {i} is corrupt")
            return i, drapps.sample_rng().random() if self.rng else 0.0
        finally:
            with self._lock:
                self.inside -= 1


class Computes(Waits):
    """Samples that only compute (NumPy releases the GIL; none of their time waits)."""

    def __getitem__(self, i: int) -> tuple[int, float]:
        a = np.random.default_rng(i).random((160, 160))
        for _ in range(6):
            a = a @ a.T
            a /= np.abs(a).max()
        return i, float(a[0, 0])


class HoldsAFile(Waits):
    """Reads each record at its offset in one file object it holds: seek, then read."""

    def __init__(self, n: int = 160) -> None:
        super().__init__(n)
        self.file = io.BytesIO(bytes(range(256)) * 4)

    def __getitem__(self, i: int) -> tuple[int, float]:
        self.file.seek(i % 1024)
        time.sleep(0.002)
        return i, float(self.file.read(1)[0])


def _pool(loader: drapps.Loader) -> ExecutorPool:
    pool = loader._parts.engine.dispatcher.pool  # type: ignore[attr-defined]
    assert isinstance(pool, ExecutorPool)
    return pool


def _rows(batches: list[object]) -> list[list[tuple[float, ...]]]:
    return [[tuple(map(float, x)) for x in zip(*b, strict=True)] for b in batches]  # type: ignore[call-overload]


@pytest.fixture
def sample_threads() -> Iterator[None]:
    try:
        yield
    finally:
        SampleThreads.close()  # this process's: the test made batches in it


def test_make_batch_in_threads_gives_the_batch_made_one_at_a_time(sample_threads: None) -> None:
    dataset = Waits(fail=(3, 6))
    recipe = BatchRecipe(dataset, None, default_collate, "skip")
    indices = list(range(12))
    alone = make_batch(recipe, 5, 0, indices)
    together = make_batch(recipe, 5, 0, indices, sample_threads=4)
    assert dataset.most_inside == 4  # four at once, no more
    assert together.kept == alone.kept and together.skipped == alone.skipped
    assert [m[0] for m in together.skipped] == [3, 6]
    assert _rows([together.batch]) == _rows([alone.batch])
    assert len(together.costs) == 12 and together.cpu_s < sum(together.costs)
    raising = BatchRecipe(Waits(fail=(7, 2)), None, default_collate, "raise")
    with pytest.raises(SampleError) as one:
        make_batch(raising, 5, 0, indices)
    with pytest.raises(SampleError) as threads:
        make_batch(raising, 5, 0, indices, sample_threads=6)
    assert str(threads.value) == str(one.value) and "sample 2 failed" in str(one.value)
    assert raising.dataset.inside == 0  # no sample left running after the raise


def test_workers_whose_samples_wait_make_them_at_once_and_batches_match_dataloader() -> None:
    dataset = Waits()
    # A long control interval: the controller holds the count at two workers.
    with drapps.Loader(dataset, batch_size=16, shuffle=True, seed=4, control_interval=60.0) as dl:
        got = list(dl)
        pool = _pool(dl)
        threads = pool.sample_threads()
        why = dl.stats().executor_why or ""
        assert dl.stats().sample_threads == threads
    cpu = pool.cpu_share()
    assert cpu is not None and cpu < 0.3, cpu
    assert 2 <= threads <= SAMPLE_THREADS, threads
    assert "of a batch's samples at once, in threads of its own" in why, why
    with drapps.Loader(dataset, batch_size=16, shuffle=True, seed=4, workers=0) as inline:
        assert _rows(got) == _rows(list(inline))
    # The batches are DataLoader's (drapps' sample_rng aside, which DataLoader lacks).
    plain = Waits(rng=False)
    expected = _rows(list(DataLoader(plain, batch_size=16, num_workers=2)))
    with drapps.Loader(plain, batch_size=16, control_interval=60.0) as ordered:
        assert _rows(list(ordered)) == expected
        assert _pool(ordered).sample_threads() > 1


def test_a_failing_sample_is_named_as_dataloader_names_it_and_skips_match() -> None:
    dataset = Waits(n=96, fail=(41,))
    loader = drapps.Loader(dataset, batch_size=16, control_interval=60.0)
    with loader, pytest.raises(ValueError, match="sample 41 is corrupt") as raised:
        for _ in loader:
            pass
    assert "sample 41 failed in __getitem__" in str(raised.value)
    skipping = Waits(n=96, fail=(12, 41, 42))
    with drapps.Loader(skipping, batch_size=16, on_error="skip", control_interval=60.0) as dl:
        seen = [int(i) for b in dl for i in b[0]]
        skipped = [i for i, _ in dl.stats().skipped]
    assert seen == [i for i in range(96) if i not in (12, 41, 42)]
    assert sorted(skipped) == [12, 41, 42]


def test_samples_that_compute_are_made_one_at_a_time() -> None:
    with drapps.Loader(Computes(64), batch_size=16, control_interval=60.0) as loader:
        list(loader)
        pool = _pool(loader)
        assert pool.sample_threads() == 1 == loader.stats().sample_threads
        cpu = pool.cpu_share()
        assert cpu is not None and cpu > 0.5, cpu


def test_a_dataset_holding_an_open_file_keeps_its_samples_one_at_a_time_and_says_why() -> None:
    """Threads of one process would share the file's position: each would read at the
    offset another left. The workers see the handle, refuse, and the report says so."""
    dataset = HoldsAFile()
    assert shared_handle(dataset) == "an open file (io.BytesIO) in its attribute 'file'"
    with drapps.Loader(dataset, batch_size=16, control_interval=60.0) as loader:
        got = [float(v) for b in loader for v in b[1]]
        pool = _pool(loader)
        assert pool.sample_threads() == 1
        why = pool.threads_allowed()
        assert why is not None and "holds an open file" in why, why
    assert got == [float(i % 256) for i in range(160)]
    with pytest.warns(UserWarning, match="holds an open file"):
        threaded = drapps.Loader(dataset, batch_size=16, backend="thread", num_workers=2)
    with threaded:
        assert [float(v) for b in threaded for v in b[1]] == got
        assert threaded.stats().executor == "processes"


def test_shared_handle_looks_into_what_the_dataset_holds() -> None:
    class Reader:
        def __init__(self, file: io.IOBase) -> None:
            self.file = file

    class Holder:
        def __init__(self, **held: object) -> None:
            self.__dict__.update(held)

    shard = io.BytesIO(b"x")
    assert shared_handle(Holder(reader=Reader(shard))) == (
        "an open file (io.BytesIO) in its attribute 'reader.file'"
    )
    assert "'shards[1]'" in (shared_handle(Holder(shards=["a.bin", shard])) or "")
    assert "files['train']" in (shared_handle(Holder(files={"train": shard})) or "")
    closed = io.BytesIO(b"x")
    closed.close()
    assert shared_handle(Holder(file=closed, paths=["a", "b"], n=3)) is None
    deep = Holder(a=Holder(b=Holder(c=shard)))  # three attributes down: not looked at
    assert shared_handle(deep) is None


class AsksWhichWorker(Waits):
    """Each sample asks ``get_worker_info()`` (as a dataset that opens a handle per worker
    does), also while the worker collates the batch before it."""

    def __getitem__(self, i: int) -> tuple[int, float]:
        time.sleep(0.001)
        info = get_worker_info()
        return i, -1.0 if info is None else float(info.num_workers)


def test_every_sample_made_in_a_thread_sees_its_worker() -> None:
    with drapps.Loader(AsksWhichWorker(600), batch_size=8, control_interval=60.0) as loader:
        seen = {float(v) for b in loader for v in b[1]}
        assert loader.stats().sample_threads > 1
    assert seen == {2.0}, seen


def draws_as_it_collates(samples: list[tuple[int, float]]) -> tuple[list[int], float]:
    """A collate_fn that draws from torch's global generator (a mixup weight)."""
    return [i for i, _ in samples], float(torch.rand(1)[0])


def test_a_collate_fn_that_draws_gets_the_draws_it_gets_one_sample_at_a_time() -> None:
    dataset = Waits(96)
    kwargs = {"batch_size": 8, "shuffle": True, "seed": 5, "collate_fn": draws_as_it_collates}
    with drapps.Loader(dataset, workers=0, dispatch="samples", **kwargs) as inline:
        expected = list(inline)
    with drapps.Loader(dataset, control_interval=60.0, **kwargs) as loader:
        got = list(loader)
        assert loader.stats().sample_threads > 1
    assert got == expected


class ComputesInAHelper(Waits):
    """Samples whose work runs in a thread each starts and waits for, as a BLAS matrix
    product runs in native threads: their CPU time is the helper's."""

    def __getitem__(self, i: int) -> tuple[int, float]:
        spent: list[float] = []

        def work() -> None:
            start, deadline = time.thread_time(), time.perf_counter() + 0.01
            while time.perf_counter() < deadline:
                pass
            spent.append(time.thread_time() - start)

        helper = threading.Thread(target=work)
        helper.start()
        helper.join()
        self.helper_cpu_s = getattr(self, "helper_cpu_s", 0.0) + spent[0]
        return i, spent[0]


def test_the_cpu_of_threads_a_sample_starts_is_its_own_in_a_worker_process() -> None:
    """A sample whose work runs in threads it starts computes; it does not wait. Made where no
    other Python thread runs (a worker process), the batch's CPU time counts the helpers'
    (measured in a forked process: the test runner has threads of its own)."""
    with multiprocessing.get_context("fork").Pool(1) as pool:
        spent = pool.apply(_made_alone)
    for cpu_s, helper_s in spent:  # one after another, and by one __getitems__ call
        assert cpu_s >= helper_s > 0, spent


class ComputesInAHelperAtOnce(ComputesInAHelper):
    """The same samples, a batch of them from one ``__getitems__`` call."""

    def __getitems__(self, indices: list[int]) -> list[tuple[int, float]]:
        return [self[i] for i in indices]


def _made_alone() -> list[tuple[float, float]]:
    """The CPU seconds a batch of three such samples took, and their helpers', made one after
    another and by one ``__getitems__`` call."""
    assert threading.active_count() == 1
    spent = []
    for dataset in (ComputesInAHelper(4), ComputesInAHelperAtOnce(4)):
        getitems = isinstance(dataset, ComputesInAHelperAtOnce)
        recipe = BatchRecipe(dataset, None, default_collate, "raise", getitems=getitems)
        batch = make_batch(recipe, 0, 0, [0, 1, 2])
        spent.append((batch.cpu_s, dataset.helper_cpu_s))
    return spent
