"""Workers start from a clean parent: a zygote per pool, made when the epoch begins, forks
every worker; none is forked from the threaded training process, and under spawn and
forkserver the dataset crosses once."""

from __future__ import annotations

import importlib
import multiprocessing
import os
import signal
import sys
import threading
import time
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

import psutil
import pytest
import torch

import drapps
from drapps.runtime.zygote import ImportUnderWay, ImportWait, Zygote

LOCK = threading.Lock()
"""A lock the training process's threads and the dataset share (a logging handler's, an
object-store client's connection pool)."""


class TakesTheLock:
    def __len__(self) -> int:
        return 48

    def __getitem__(self, index: int) -> torch.Tensor:
        with LOCK:
            return torch.tensor(index)


@pytest.mark.timeout(180)
def test_a_worker_added_while_a_thread_holds_a_lock_can_take_it() -> None:
    """Under fork, a worker forked from the training process while another thread holds a
    lock inherits it held, forever: the worker hangs on its first sample. Workers come from
    the zygote, forked when the epoch began."""
    context = multiprocessing.get_context("fork")
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with LOCK:
            held.set()
            release.wait()

    loader = drapps.Loader(
        TakesTheLock(), batch_size=4, num_workers=1, multiprocessing_context=context
    )
    with loader:
        batches = iter(loader)
        first = next(batches)
        holder = threading.Thread(target=hold)
        holder.start()
        try:
            held.wait()
            loader.resize(2)  # each resize starts a worker while the lock is held here
            loader.resize(3)
            rest = list(batches)
            assert len(loader.snapshot().worker_pids) == 3
        finally:
            release.set()
            holder.join()
    indices = torch.cat([first, *rest]).tolist()
    assert indices == list(range(48))


class CountsItsPickling:
    """A dataset that counts, in the training process, how often it is pickled."""

    pickled = 0

    def __init__(self) -> None:
        self.items = list(range(24))

    def __getstate__(self) -> dict[str, Any]:
        type(self).pickled += 1
        return self.__dict__

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[int, int, int]:
        parent = psutil.Process(os.getppid())
        return self.items[index], parent.num_threads(), parent.pid


def _as_list(batch: list[Any]) -> list[Any]:
    return batch


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("method", "persistent"),
    [("fork", False), ("spawn", True), ("spawn", False), ("forkserver", True)],
)
def test_workers_come_from_a_parent_without_threads_and_the_dataset_crosses_once(
    method: str, persistent: bool
) -> None:
    CountsItsPickling.pickled = 0
    context = multiprocessing.get_context(method)
    loader = drapps.Loader(
        CountsItsPickling(),
        batch_size=2,
        num_workers=3,
        multiprocessing_context=context,
        collate_fn=_as_list,
        persistent_workers=persistent,
    )
    checked = CountsItsPickling.pickled  # pickled to see that it can be sent
    with loader:
        samples = [sample for batch in loader for sample in batch]
        loader.resize(1)
        loader.resize(3)  # two more workers, one more epoch
        samples += [sample for batch in loader for sample in batch]
    assert sorted(item for item, _, _ in samples) == sorted(2 * list(range(24)))
    assert {threads for _, threads, _ in samples} == {1}  # forked by a one-thread process
    assert os.getpid() not in {parent for _, _, parent in samples}
    # Sent once, whatever the workers, or once an epoch when each epoch's workers are new
    # (DataLoader's workers: once each, every epoch unless persistent).
    sent = 0 if method == "fork" else 1 if persistent else 2
    assert CountsItsPickling.pickled - checked == sent


def _exit_with(fds: list[int], code: int) -> None:
    for fd in fds:
        os.close(fd)
    if code == -1:
        time.sleep(60)  # killed
    os._exit(code)


@pytest.mark.timeout(120)
def test_the_zygote_reports_each_workers_exit_as_multiprocessing_would() -> None:
    zygote = Zygote(multiprocessing.get_context("spawn"), _exit_with, name="drapps-zygote")
    try:
        r, w = os.pipe()
        processes = [zygote.fork([r, w, r], f"drapps-worker-{c}", code=c) for c in (0, 3, -1)]
        os.close(r)
        os.close(w)
        ok, three, killed = processes
        assert psutil.Process(killed.pid).ppid() == zygote.pid
        ok.join(timeout=30)
        three.join(timeout=30)
        assert (ok.exitcode, three.exitcode) == (0, 3)
        assert killed.is_alive()
        killed.kill()
        killed.join(timeout=30)
        assert killed.exitcode == -signal.SIGKILL and not killed.is_alive()
        for process in processes:
            process.close()
    finally:
        zygote.close()
    assert not zygote.alive()


@pytest.mark.timeout(180)
def test_stats_give_the_first_batch_each_workers_start_and_its_own_memory() -> None:
    with drapps.Loader(
        list(range(64)), batch_size=4, num_workers=2, persistent_workers=True
    ) as loader:
        batches = iter(loader)
        next(batches)
        stats = loader.stats()
        assert stats.first_batch_s is not None and 0 < stats.first_batch_s < 60
        loader.resize(3)
        list(batches)
        stats = loader.stats()
        assert len(stats.worker_starts_s) == 3  # the two at iter() and the one added
        assert all(0 <= s < 60 for s in stats.worker_starts_s)
        assert len(stats.worker_private_bytes) == len(stats.worker_pids) == 3
        assert all(b > 0 for b in stats.worker_private_bytes)
        (zygote,) = loader.snapshot().helper_pids  # measured for memory, as the loader's
        assert {psutil.Process(pid).ppid() for pid in stats.worker_pids} == {zygote}


def test_the_report_names_copy_on_read_only_where_workers_hold_much_of_their_own() -> None:
    from drapps.telemetry._sections import worker_story_of_start_and_memory as story

    mib = 2**20
    lean = story(
        {
            "first_batch_s": 0.18,
            "worker_starts_s": (0.01, 0.02),
            "worker_private_bytes": (30 * mib, 34 * mib),
        }
    )
    assert lean == [
        "Start: the first batch came 180 ms after iter(); each worker was ready 10 ms to 20 ms "
        "after it was asked for (2 started, each forked from the loader's zygote, not the "
        "training process).",
        "Worker memory: each worker holds 32 MiB of its own (median of 2; pages no other "
        "process shares).",
    ]
    grown = story({"worker_private_bytes": (572 * mib, 600 * mib, 0)})
    assert (
        len(grown) == 1 and "586 MiB" in grown[0] and "NumPy array or an Arrow column" in grown[0]
    )
    assert story({}) == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_worker_killed_mid_reply_leaves_its_socket_closed_even_from_a_new_zygote(
    method: str,
) -> None:
    """Found by the soak: a zygote made as a worker is spawned (the first, or a replacement
    mid-epoch) was forked after the worker's pipes, so it held the worker's end of the result
    socket; a worker killed between a reply and its slab's descriptor then left the
    dispatcher waiting forever for the descriptor. The socket must close with the worker."""
    from torch.utils.data import default_collate

    from drapps.runtime.process_pool import ProcessPool, _own
    from drapps.runtime.worker import BatchRecipe

    recipe = BatchRecipe([torch.tensor([i]) for i in range(4)], None, default_collate, "raise")
    pool = ProcessPool(recipe, multiprocessing.get_context(method))
    try:
        worker = pool.spawn()  # no zygote yet: this makes it
        process = _own(worker).process
        process.kill()
        process.join(timeout=30)
        results = _own(worker).results
        assert results.poll(30), "the dead worker's result socket did not close"
        with pytest.raises(EOFError):
            results.recv()
    finally:
        pool.shutdown()


def _pipes_that_run_out(context: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The context's next pipe is made, and the one after it fails as at the open-file limit."""
    import errno

    made = context.Pipe
    calls = 0

    def pipe(duplex: bool = True) -> Any:
        nonlocal calls
        calls += 1
        if calls > 1:
            raise OSError(errno.EMFILE, "Too many open files")
        return made(duplex)

    monkeypatch.setattr(context, "Pipe", pipe)


def test_a_worker_that_cannot_have_its_pipes_leaves_none_open(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At the open-file limit, the worker's first pipe was made and its second not: the error
    named the limit, but the first pipe stayed open, one more descriptor lost each try."""
    from torch.utils.data import default_collate

    from drapps.runtime.process_pool import ProcessPool, start_worker_process
    from drapps.runtime.worker import BatchRecipe

    context = multiprocessing.get_context("fork")
    recipe = BatchRecipe([torch.tensor([i]) for i in range(4)], None, default_collate, "raise")
    pool = ProcessPool(recipe, context)
    try:
        pool.spawn()  # the zygote and one worker, open from here on
        before = sorted(os.listdir("/proc/self/fd"))
        # The errors are held, as a caller that reports them does: a pipe left to the garbage
        # collector stays open as long as the traceback that names it.
        with monkeypatch.context() as patch:
            _pipes_that_run_out(context, patch)
            with pytest.raises(RuntimeError, match="Too many open files") as spawned:
                pool.spawn()
        with monkeypatch.context() as patch:
            _pipes_that_run_out(context, patch)
            with pytest.raises(RuntimeError, match="Too many open files") as started:
                start_worker_process(context, print, (), {}, name="never-started")
        assert sorted(os.listdir("/proc/self/fd")) == before
        assert spawned.value is not None and started.value is not None
    finally:
        pool.shutdown()


class HalfMade:
    """A module another thread is importing: it stops halfway until ``finish()``."""

    def __init__(self, where: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.name = f"half_made_{uuid.uuid4().hex}"
        gate = f"{self.name}_gate"
        (where / f"{gate}.py").write_text(
            "import threading\nstarted, go = threading.Event(), threading.Event()\n"
        )
        (where / f"{self.name}.py").write_text(
            f"import {gate}\nbegun = True\n{gate}.started.set()\n{gate}.go.wait()\nmade = True\n"
        )
        monkeypatch.syspath_prepend(str(where))
        self.gate: Any = importlib.import_module(gate)
        self.importer = threading.Thread(target=importlib.import_module, args=(self.name,))

    def __enter__(self) -> HalfMade:
        self.importer.start()
        assert self.gate.started.wait(60)
        return self

    def finish(self) -> None:
        self.gate.go.set()

    def __exit__(self, *exc: object) -> None:
        self.finish()
        self.importer.join()
        for name in (self.name, self.gate.__name__):
            sys.modules.pop(name, None)


def _import_and_exit(fds: list[int], module: str) -> None:
    """A worker that imports ``module``: exit 0 where it was whole, 7 where half made."""
    for fd in fds:
        os.close(fd)
    imported: ModuleType = importlib.import_module(module)
    os._exit(0 if hasattr(imported, "made") else 7 if hasattr(imported, "begun") else 1)


def _fork_one(zygote: Zygote, module: str) -> Any:
    r, w = os.pipe()
    try:
        return zygote.fork([r, w, r], "drapps-worker-0", module=module)
    finally:
        os.close(r)
        os.close(w)


def _exit_code(process: Any) -> int | None:
    process.join(timeout=60)
    code = process.exitcode
    process.close()
    return code


@pytest.mark.timeout(120)
def test_a_zygote_forked_during_another_threads_import_forks_no_worker_until_it_is_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under fork, a zygote forked while another thread imports a module inherits its lock
    held, and a worker that imports it would wait forever: the zygote names the import
    instead, and one forked after it finishes forks a worker that imports it whole."""
    context = multiprocessing.get_context("fork")
    with HalfMade(tmp_path, monkeypatch) as module:
        zygote = Zygote(context, _import_and_exit, name="drapps-zygote")
        try:
            with pytest.raises(ImportUnderWay) as cut:
                _fork_one(zygote, module.name)
            assert cut.value.modules == [module.name]
        finally:
            zygote.close()
        with pytest.raises(RuntimeError, match=f"importing {module.name} for 0 s"):
            ImportWait(limit_s=0.1).wait([module.name])
        threading.Timer(0.2, module.finish).start()
        ImportWait().wait([module.name])  # returns once the import is done
        zygote = Zygote(context, _import_and_exit, name="drapps-zygote")
        try:
            assert _exit_code(_fork_one(zygote, module.name)) == 0
        finally:
            zygote.close()


@pytest.mark.timeout(120)
def test_the_imports_the_training_thread_runs_its_loop_in_are_left_as_far_as_they_got(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loop that runs as its module is imported (a script another module imports) holds
    that import for the whole run: a zygote made in another thread takes it as its own, and a
    worker sees the module as far as it got, as one forked from the training thread does."""
    context = multiprocessing.get_context("fork")
    with HalfMade(tmp_path, monkeypatch) as module:
        whole = frozenset({module.name})
        zygote = Zygote(context, _import_and_exit, name="drapps-zygote", whole=whole)
        try:
            assert _exit_code(_fork_one(zygote, module.name)) == 7  # begun, not made
        finally:
            zygote.close()


class ImportsAsItMakes:
    """A dataset whose samples import a module (a lazy import in a transform)."""

    def __init__(self, module: str) -> None:
        self.module = module

    def __len__(self) -> int:
        return 32

    def __getitem__(self, index: int) -> int:
        return index if importlib.import_module(self.module).made else -1


class StreamImportsAsItMakes(torch.utils.data.IterableDataset[int]):
    """A stream whose workers import a module as they begin (a lazy import in a reader)."""

    def __init__(self, module: str) -> None:
        self.module = module

    def __iter__(self) -> Any:
        made = importlib.import_module(self.module).made
        info = torch.utils.data.get_worker_info()
        assert info is not None
        return iter(range(info.id, 32 if made else 0, info.num_workers))


# The stream's two workers take turns, a batch each: 0, 2, 4, 6 from the first, 1, 3, 5, 7...
_TURNS = [w + 8 * k + 2 * i for k in range(4) for w in (0, 1) for i in range(4)]


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("dataset", "expected"),
    [(ImportsAsItMakes, list(range(32))), (StreamImportsAsItMakes, _TURNS)],
    ids=["map", "stream"],
)
def test_an_epoch_begun_while_another_thread_imports_gets_every_batch(
    dataset: Any, expected: list[int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the guide's example, one run in two: the epoch's zygote was forked as the
    dispatcher thread imported a module on first use, and every worker forked from it then
    waited forever on that import's lock, and the loop on its first batch. An iterable
    dataset's workers, forked from the training process as its epoch begins, could not
    import it either."""
    context = multiprocessing.get_context("fork")
    with HalfMade(tmp_path, monkeypatch) as module:
        loader = drapps.Loader(
            dataset(module.name), batch_size=4, num_workers=2, multiprocessing_context=context
        )
        with loader:
            threading.Timer(0.5, module.finish).start()
            indices = torch.cat(list(loader)).tolist()  # forked as the import is under way
    assert indices == expected
