"""How real jobs end, fork, suspend and share a machine: each defect of issue 14 as a test."""

from __future__ import annotations

import atexit
import collections
import errno
import gc
import os
import pickle
import re
import signal
import time
import warnings
from pathlib import Path
from typing import Any
from unittest import mock

import psutil
import pytest
import torch
from helpers import SlowDataset, drapps_children, mounted_tmpfs, shm_names, slab_fds
from test_loader_lifecycle import read_pids, run_script, wait_gone

import drapps
from drapps.runtime import config, transport


def test_a_dropped_loader_stops_its_workers_without_the_cyclic_collector() -> None:
    fds = psutil.Process().num_fds()
    gc.disable()
    try:
        for _ in range(20):
            loader = drapps.Loader(SlowDataset(8), batch_size=4, workers=2, seed=0)
            assert len(list(loader)) == 2
            del loader  # the last reference: its workers stop now, not at some gc pass
            assert len(drapps_children()) <= 2
    finally:
        gc.enable()
    assert psutil.Process().num_fds() <= fds + 4


def _forked(body: Any) -> int:
    """Run ``body`` in a plain os.fork() child that exits normally (atexit handlers run)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            body()
        except BaseException:
            code = 1
        atexit._run_exitfuncs()
        os._exit(code)
    return os.waitpid(pid, 0)[1]


def test_a_forked_child_that_exits_leaves_the_parents_loader_alone() -> None:
    with drapps.Loader(SlowDataset(64, 0.002), batch_size=4, workers=2, seed=0) as loader:
        iterator = iter(loader)
        seen = [int(i) for i in next(iterator)]
        for _ in range(5):
            assert _forked(lambda: None) == 0
        seen += [int(i) for b in iterator for i in b]
        stats = loader.stats()
    assert seen == list(range(64))
    assert stats.worker_restarts == 0 and stats.retries == 0


class _Stream(torch.utils.data.IterableDataset[torch.Tensor]):
    """0..n-1, sharded over the workers, each sample waiting ``delay`` seconds."""

    def __init__(self, n: int, delay: float) -> None:
        self.n, self.delay = n, delay

    def __iter__(self) -> Any:
        info = torch.utils.data.get_worker_info()
        for i in range(self.n)[info.id :: info.num_workers] if info else range(self.n):
            time.sleep(self.delay)
            yield torch.tensor(i)


@pytest.mark.parametrize("kind", ["map-style", "stream", "stream beside another epoch"])
@pytest.mark.parametrize("child", ["exits", "drops the iterator", "drops the loader"])
def test_what_a_forked_child_drops_stays_its_parents(kind: str, child: str) -> None:
    """A child forked mid-epoch (a helper process, a DataLoader's worker) holds copies of the
    loader and its iterator, and their finalizers: dropping them, collecting, exiting, it
    neither stops the parent's workers nor ends its epoch."""
    n = 64
    dataset = SlowDataset(n, 0.002) if kind == "map-style" else _Stream(n, 0.002)
    loader = drapps.Loader(dataset, batch_size=4, workers=2, seed=0)
    iterator = iter(loader)
    seen = [int(i) for _ in range(2) for i in next(iterator)]
    side = None
    if kind == "stream beside another epoch":  # the first epoch streams on beside it
        side = iter(loader)
        next(side)

    def body() -> None:
        nonlocal iterator, loader, side
        if child == "drops the iterator":
            iterator = side = None
        elif child == "drops the loader":
            iterator = side = loader = None
        gc.collect()

    try:
        assert _forked(body) == 0
        seen += [int(i) for b in iterator for i in b]
        assert sorted(seen) == list(range(n))
        assert sorted(int(i) for b in loader for i in b) == list(range(n))  # and the next
        assert loader.stats().worker_restarts == 0
    finally:
        loader.close()


def test_a_forked_child_cannot_iterate_the_parents_loader(tmp_path: Path) -> None:
    marker = tmp_path / "message"

    def child() -> None:
        try:
            iter(loader)
        except RuntimeError as exc:
            marker.write_text(str(exc))

    with drapps.Loader(SlowDataset(8), batch_size=4, workers=1) as loader:
        assert _forked(child) == 0
        assert len(list(loader)) == 2
    assert "a forked child" in marker.read_text()


KILLED = """
loader = drapps.Loader(SlowDataset(10**6, 0.001), batch_size=64, workers=2, cache=True)
it = iter(loader)
next(it)
print("pids", *loader.stats().worker_pids, flush=True)
for batch in it:
    pass
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_killing_the_process_group_leaves_nothing_in_dev_shm(sig: signal.Signals) -> None:
    """Slabs and the cache's memory tier have no names: the kernel frees them with the last
    process, so nothing waits for a later loader to sweep it."""
    before = shm_names()
    proc = run_script(KILLED)
    pids = read_pids(proc)
    time.sleep(0.3)
    assert shm_names() == before  # nothing named while it runs either
    assert slab_fds(proc.pid)  # its batches are in shared memory all the same
    os.killpg(proc.pid, sig)  # what timeout, systemd, scancel and the OOM killer do
    proc.communicate(timeout=30)
    assert not wait_gone(pids)
    assert shm_names() == before


def test_auto_memory_budget_fits_a_64_mib_shared_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where slabs are files in /dev/shm (no memfd_create), its size bounds the budget."""
    monkeypatch.setattr(config, "slab_space", lambda: 64 * 2**20)
    assert config.auto_memory_budget() == 32 * 2**20
    monkeypatch.setattr(config, "slab_space", lambda: None)  # memfd: RAM alone bounds it
    assert config.auto_memory_budget() >= 64 * 2**20


@pytest.fixture()
def small_tmpfs(tmp_path: Path) -> Any:
    with mounted_tmpfs(tmp_path / "shm", "64m") as mount:  # Docker's default /dev/shm
        yield mount


SMALL_SHM = """
loader = drapps.Loader(BigDataset(48, 2 * 2**20), batch_size=4, workers=2, prefetch=8)
held = []
for b, batch in enumerate(loader):
    held = (held + [batch])[-2:]  # the loop keeps the last two batches alive
print("ok", b + 1, loader.stats().memory_budget, flush=True)
"""


def test_the_default_budget_works_in_dockers_64_mib_shm(small_tmpfs: Path) -> None:
    env = dict(os.environ, DRAPPS_SHM_DIR=str(small_tmpfs))
    proc = run_script("from helpers import BigDataset\n" + SMALL_SHM, env=env)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    _, batches, budget = out.split()
    assert int(batches) == 12 and int(budget) >= 64 * 2**20  # /dev/shm's size is no limit
    assert os.listdir(small_tmpfs) == []


SUSPENDED = """
loader = drapps.Loader(SlowDataset(48, 0.1), batch_size=4, workers=2, timeout=1.0)
it = iter(loader)
next(it)
print("pids", *loader.stats().worker_pids, flush=True)
sys.stdin.readline()  # the test suspends the job now
rest = list(it)
print("timeouts", loader.stats().timeouts, "restarts", loader.stats().worker_restarts, flush=True)
"""


def test_a_suspended_job_does_not_count_as_hung_workers() -> None:
    proc = run_script(SUSPENDED, stdin=True)
    read_pids(proc)
    assert proc.stdin is not None
    proc.stdin.write("\n")
    proc.stdin.flush()
    time.sleep(0.2)  # the workers are mid-batch
    os.killpg(proc.pid, signal.SIGSTOP)  # Ctrl-Z, or a scheduler's suspend
    time.sleep(3.0)  # three times the timeout
    os.killpg(proc.pid, signal.SIGCONT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.split() == ["timeouts", "0", "restarts", "0"], out + err


class _Unpicklable:
    def __call__(self, samples: list[Any]) -> Any:
        return {"x": torch.stack(samples), "fn": lambda: None}


def test_an_unpicklable_batch_is_named_at_once() -> None:
    with drapps.Loader(SlowDataset(8), batch_size=4, workers=2, collate_fn=_Unpicklable()) as ld:
        with pytest.raises(drapps.SampleError, match="could not be sent") as caught:
            list(ld)
        assert ld.stats().worker_restarts == 0
    assert caught.value.stage == "transport" and caught.value.indices == [0, 1, 2, 3]
    assert isinstance(caught.value, (pickle.PicklingError, AttributeError, TypeError))


def test_a_failed_constructor_leaks_no_file_descriptors(tmp_path: Path) -> None:
    bad = tmp_path / "missing" / "trace.jsonl"
    fds = psutil.Process().num_fds()
    for _ in range(30):
        with pytest.raises(OSError):
            drapps.Loader(SlowDataset(4), workers=2, trace=bad)
    assert psutil.Process().num_fds() <= fds + 2
    assert not drapps_children()


class _Crashes:
    def __init__(self, how: str) -> None:
        self.how = how

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == 5:
            if self.how == "exit":
                os._exit(3)
            os.kill(os.getpid(), signal.SIGSEGV)
        return torch.tensor(i)


@pytest.mark.parametrize(
    ("how", "words", "dataloaders"),
    [
        ("exit", "exited with code 3", r"DataLoader worker \(pid\(s\) \d+\) exited unexpectedly"),
        ("segv", "was killed by SIGSEGV", r"DataLoader worker \(pid \d+\) is killed by signal: "),
    ],
)
def test_a_dying_worker_is_reported_with_its_exit_code_or_signal(
    how: str, words: str, dataloaders: str
) -> None:
    """The error leads with DataLoader's words, which scripts match."""
    with drapps.Loader(_Crashes(how), batch_size=2, workers=2, max_attempts=2) as loader:
        with pytest.raises(drapps.WorkerTimeoutError, match=words) as raised:
            list(loader)
    assert re.match(dataloaders, str(raised.value))


def test_a_worker_that_fails_outside_a_sample_says_why() -> None:
    with mock.patch("drapps.runtime.worker.make_batch", side_effect=MemoryError("no room")):
        with drapps.Loader(SlowDataset(4), batch_size=2, workers=1, max_attempts=1) as loader:
            with pytest.raises(drapps.WorkerTimeoutError, match="its last error: MemoryError"):
                list(loader)


def test_a_slab_that_cannot_be_mapped_is_made_again() -> None:
    real_unpack = transport.unpack
    calls = {"n": 0}

    def vanishing(packed: Any, *args: Any) -> Any:
        calls["n"] += 1
        if calls["n"] in (2, 5):  # e.g. the address space is full at the wrong moment
            os.close(packed.fd)
            raise OSError(errno.ENOMEM, "Cannot allocate memory")
        return real_unpack(packed, *args)

    with mock.patch("drapps.runtime.admission.unpack", vanishing):
        with drapps.Loader(SlowDataset(40), batch_size=4, workers=2, seed=0) as loader:
            seen = [int(i) for b in loader for i in b]
            stats = loader.stats()
    assert seen == list(range(40))  # every index once, in order
    assert stats.retries == 2


def _local_namedtuple_dataset() -> Any:
    Pair = collections.namedtuple("Pair", ["index", "noise"])  # not importable by the workers

    class Local:
        kind = Pair

        def __len__(self) -> int:
            return 10

        def __getitem__(self, i: int) -> Any:
            return Pair(i, torch.rand(2))

    return Local()


@pytest.mark.parametrize("in_order", [True, False])
def test_under_the_default_count_a_batch_that_cannot_be_sent_is_made_in_process(
    in_order: bool,
) -> None:
    data = _local_namedtuple_dataset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with drapps.Loader(data, batch_size=3, seed=4, in_order=in_order) as loader:
            first = list(loader)
            assert loader.stats().workers == 0
            assert not wait_gone([p.pid for p in drapps_children()])  # the workers went
            second = list(loader)
    said = [w for w in caught if "cannot be sent back from a worker" in str(w.message)]
    assert len(said) == 1 and said[0].filename == __file__
    for epoch in (first, second):
        assert all(isinstance(batch, data.kind) for batch in epoch)
        indices = sorted(int(i) for batch in epoch for i in batch.index)
        assert indices == list(range(10))  # each sample once
    with drapps.Loader(data, batch_size=3, seed=4, workers=0) as in_process:
        expected = {int(b.index[0]): b.noise for b in in_process}
    for batch in first:  # per-sample seeds: the same draws as made here from the start
        assert torch.equal(batch.noise, expected[int(batch.index[0])])


def test_a_count_the_user_asked_for_raises_for_a_batch_that_cannot_be_sent() -> None:
    with drapps.Loader(_local_namedtuple_dataset(), batch_size=3, num_workers=2) as loader:
        with pytest.raises(drapps.SampleError, match="could not be sent"):
            list(loader)
