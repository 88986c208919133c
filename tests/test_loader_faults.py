"""Faults: killed and hung workers, failing samples, invalid arguments."""

from __future__ import annotations

import os
import pickle
import re
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import (
    FailingDataset,
    FailingTransform,
    HangingDataset,
    SlowDataset,
    flatten_indices,
)

import drapps
from drapps.runtime.retries import HangLimit


def reference_order(n: int, batch_size: int, seed: int) -> list[int]:
    with drapps.Loader(
        SlowDataset(n), batch_size=batch_size, shuffle=True, seed=seed, workers=0
    ) as loader:
        return flatten_indices(list(loader))


def test_sigkilled_workers_lose_and_duplicate_nothing() -> None:
    kill_at = {2, 9, 17, 30}
    with drapps.Loader(
        SlowDataset(400, delay=0.003), batch_size=8, shuffle=True, seed=1, workers=3
    ) as loader:
        seen, killed = [], 0
        for b, batch in enumerate(loader):
            seen.extend(batch.tolist())
            if b in kill_at:
                pids = loader.stats().worker_pids
                os.kill(pids[b % len(pids)], signal.SIGKILL)
                killed += 1
                # Let the dispatcher reap it first, so the next kill never hits a dead pid.
                deadline = time.monotonic() + 10
                while loader.stats().worker_restarts < killed and time.monotonic() < deadline:
                    time.sleep(0.01)
        stats = loader.stats()
    assert seen == reference_order(400, 8, 1)  # every index once, in the planned order
    assert stats.worker_restarts == killed
    assert stats.workers == 3


class IdsChecked:
    """Samples ``i`` that fail where ``get_worker_info().id`` is not below its
    ``num_workers`` (a dataset that keys a shard or a handle by id relies on it)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        info = torch.utils.data.get_worker_info()
        if info is not None and not 0 <= info.id < info.num_workers:
            raise AssertionError(f"get_worker_info(): id {info.id}, num_workers {info.num_workers}")
        time.sleep(0.0005)
        return i


def test_a_worker_killed_as_the_pool_shrinks_leaves_the_ids_below_the_count() -> None:
    """Worker 0 dies and the pool shrinks to one before it is replaced: worker 1 must not go on
    alone as id 1 of one (the unit rule: ``tests/runtime/test_pool.py -k shrink_as``)."""
    for _ in range(5):
        with drapps.Loader(IdsChecked(4000), batch_size=4, num_workers=2) as loader:
            iterator = iter(loader)
            seen = next(iterator).tolist()
            pool = loader._parts.engine.dispatcher.pool
            first = next(w for w in pool.workers if w.slot == 0)
            os.kill(first.process.pid, signal.SIGKILL)
            # The shrink as soon as the dispatcher has let the dead worker go, before its next
            # step starts the replacement (a busy wait: a sleep would miss that moment).
            deadline = time.monotonic() + 10
            while first in list(pool.workers) and time.monotonic() < deadline:
                pass
            loader.resize(1)
            for _, batch in zip(range(30), iterator, strict=False):
                seen += batch.tolist()
        assert seen == list(range(4 * 31))


def test_a_hung_worker_is_replaced_and_its_batch_retried(tmp_path: Path) -> None:
    data = HangingDataset(48, index=21, marker=str(tmp_path / "hung-once"))
    with drapps.Loader(data, batch_size=4, workers=2, timeout=1.0) as loader:
        seen = flatten_indices(list(loader))
        stats = loader.stats()
    assert seen == list(range(48))
    assert stats.timeouts == 1 and stats.worker_restarts == 1 and stats.retries >= 1


def test_a_batch_that_always_hangs_is_named_after_max_attempts() -> None:
    data = HangingDataset(16, index=5)
    with drapps.Loader(data, batch_size=4, workers=2, timeout=0.5, max_attempts=2) as loader:
        it = iter(loader)
        assert next(it).tolist() == [0, 1, 2, 3]
        with pytest.raises(drapps.WorkerTimeoutError, match=r"batch 1 \(indices \[4, 5, 6, 7\]\)"):
            next(it)
        with pytest.raises(RuntimeError, match=r"^DataLoader timed out after 0.5 seconds; "):
            next(iter(drapps.Loader(data, batch_size=16, workers=1, timeout=0.5, max_attempts=1)))
        assert [b.tolist() for b in it] == [[8, 9, 10, 11], [12, 13, 14, 15]]
        assert loader.stats().timeouts == 2


def test_a_batch_that_always_hangs_is_skipped_and_counted_under_skip() -> None:
    data = HangingDataset(16, index=5)
    with drapps.Loader(
        data, batch_size=4, workers=2, timeout=0.5, max_attempts=1, on_error="skip"
    ) as loader:
        assert flatten_indices(list(loader)) == [0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15]
        assert loader.stats().samples_skipped == 4


@pytest.mark.parametrize("workers", [0, 2])
def test_a_failing_sample_raises_naming_its_index_path_and_cause(workers: int) -> None:
    with drapps.Loader(FailingDataset(20, {5}), batch_size=4, workers=workers) as loader:
        it = iter(loader)
        assert next(it).tolist() == [0, 1, 2, 3]
        with pytest.raises(drapps.SampleError) as info:
            next(it)
        error = info.value
        assert error.index == 5 and error.stage == "__getitem__"
        assert "sample 5 (/data/sample_0005.jpg) failed in __getitem__: ValueError: boom 5" in str(
            error
        )
        assert isinstance(error.__cause__, ValueError)
        # The epoch goes on after the failed batch, as with DataLoader.
        assert flatten_indices(list(it)) == list(range(8, 20))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_failing_transform_is_named(workers: int) -> None:
    with (
        drapps.Loader(
            SlowDataset(8), batch_size=4, workers=workers, transform=FailingTransform({6})
        ) as loader,
        pytest.raises(drapps.SampleError, match="sample 6 failed in transform: KeyError"),
    ):
        list(loader)


@pytest.mark.parametrize("workers", [0, 2])
def test_skip_drops_failing_samples_and_counts_them(workers: int) -> None:
    with drapps.Loader(
        FailingDataset(20, {5, 12, 13, 14, 15}), batch_size=4, workers=workers, on_error="skip"
    ) as loader:
        batches = list(loader)
        stats = loader.stats()
    expected = [i for i in range(20) if i not in {5, 12, 13, 14, 15}]
    assert flatten_indices(batches) == expected
    assert len(batches) == 4  # the batch whose samples all failed is left out
    assert stats.samples_skipped == 5 and stats.samples == 15
    assert stats.skipped[0][0] == 5 and "boom 5" in stats.skipped[0][1]


class Exits:
    """Sample 5 calls ``sys.exit(3)``."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> int:
        if i == 5:
            raise SystemExit(3)
        return i


EXECUTORS = {
    "2 processes": {"num_workers": 2},
    "2 threads": {"num_workers": 2, "backend": "thread"},
    "processes, samples apart": {"num_workers": 2, "dispatch": "samples"},
}


@pytest.mark.parametrize("settings", EXECUTORS.values(), ids=EXECUTORS.keys())
def test_a_sample_that_calls_sys_exit_in_a_worker_is_that_samples_failure(
    settings: dict[str, Any],
) -> None:
    """DataLoader's worker exits and its loop raises "worker exited unexpectedly", naming no
    sample; drapps retried the batch on a new worker each time (each exited), then named a
    worker's death. The sample's failure is raised once, naming it, and the epoch goes on."""
    with drapps.Loader(Exits(), batch_size=4, **settings) as loader:
        it = iter(loader)
        assert next(it).tolist() == [0, 1, 2, 3]
        with pytest.raises(drapps.SampleError, match=r"sample 5 failed .*sys\.exit\(3\)") as info:
            next(it)
        assert isinstance(info.value, RuntimeError) and info.value.index == 5
        assert next(it).tolist() == [8, 9, 10, 11]
        assert loader.stats().worker_restarts == 0
    with drapps.Loader(Exits(), batch_size=4, on_error="skip", **settings) as loader:
        assert flatten_indices(list(loader)) == [i for i in range(12) if i != 5]


def test_a_sample_that_calls_sys_exit_in_the_training_process_exits_it() -> None:
    """As DataLoader's without workers: the exit is the training process's."""
    with drapps.Loader(Exits(), batch_size=4, num_workers=0) as loader:
        it = iter(loader)
        next(it)
        with pytest.raises(SystemExit) as info:
            next(it)
        assert info.value.code == 3


def bad_collate(samples: list[torch.Tensor]) -> torch.Tensor:
    raise TypeError("cannot stack")


@pytest.mark.parametrize("workers", [0, 1])
def test_collate_failure_names_the_batch(workers: int) -> None:
    with (
        drapps.Loader(
            SlowDataset(4), batch_size=2, workers=workers, collate_fn=bad_collate
        ) as loader,
        pytest.raises(
            drapps.SampleError, match=r"collate_fn failed on the batch of indices \[0, 1\]"
        ),
    ):
        next(iter(loader))


TRAINING_PROCESS = os.getpid()


def _label(value: int) -> Label:
    if os.getpid() == TRAINING_PROCESS and value == 3:
        raise LookupError("sample 3 cannot be rebuilt here")
    return Label(value)


class Label(int):
    """Pickles in a worker, but label 3 cannot be unpickled in the training process."""

    def __reduce__(self) -> tuple[Any, tuple[int]]:
        return _label, (int(self),)


class Labels:
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> Label:
        return Label(i)


def keep_labels(labels: list[Label]) -> list[Label]:
    return labels


@pytest.mark.parametrize("dispatch", ["batches", "samples"])
def test_a_batch_that_cannot_be_rebuilt_in_the_training_process_is_named_and_the_rest_come(
    dispatch: str,
) -> None:
    # DataLoader raises the unpickling error once, then waits forever for the lost batch.
    # Whole batches that keep their labels, or batches cut into parts (sent uncollated, and
    # collated here).
    collate = keep_labels if dispatch == "batches" else None
    got: list[object] = []
    with drapps.Loader(
        Labels(), batch_size=2, workers=2, dispatch=dispatch, collate_fn=collate
    ) as loader:
        iterator = iter(loader)
        for _ in range(4):
            try:
                got.append([int(label) for label in next(iterator)])
            except LookupError as exc:
                assert isinstance(exc, drapps.SampleError)
                assert re.search(
                    r"batch 1 \(indices \[(2, )?3\]\) was made but could not be rebuilt in the "
                    "training process: LookupError: sample 3 cannot",
                    str(exc),
                )
                got.append("failed")
        assert next(iterator, None) is None
    assert got == [[0, 1], "failed", [4, 5], [6, 7]]


def test_sample_error_survives_pickling() -> None:
    error = drapps.SampleError("m", index=3, stage="transform", path="/x", indices=[3], detail="tb")
    error.__cause__ = ValueError("v")
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.index, copy.stage, copy.path, copy.indices, copy.detail) == (
        3,
        "transform",
        "/x",
        [3],
        "tb",
    )
    assert isinstance(copy.__cause__, ValueError)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 0}, "batch_size must be an int >= 1 or None, got 0"),
        ({"batch_size": 2.5}, "batch_size must be an int >= 1 or None, got 2.5"),
        ({"seed": -1}, "seed must be an int in [0, 2**64) or None"),
        ({"workers": -1}, "workers must be 'auto' or an int >= 0, got -1"),
        ({"workers": "many"}, "workers must be 'auto' or an int >= 0"),
        ({"workers": 5, "max_workers": 4}, "workers=5 exceeds max_workers=4"),
        ({"max_workers": 0}, "max_workers must be an int >= 1"),
        ({"prefetch": 0}, "prefetch must be 'auto' or an int >= 1, got 0"),
        ({"memory_budget": "lots"}, "memory_budget must be 'auto', a byte count or a size"),
        ({"memory_budget": 0}, "memory_budget must be > 0 bytes"),
        ({"on_error": "ignore"}, "on_error must be 'raise' or 'skip', got 'ignore'"),
        ({"timeout": -1}, "timeout option should be non-negative: a number of seconds"),
        ({"collate_fn": 3}, "collate_fn must be callable"),
        ({"transform": "flip"}, "transform must be callable"),
        ({"multiprocessing_context": "thread"}, "should specify a valid start method in"),
    ],
)
def test_invalid_arguments_are_named(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        drapps.Loader(SlowDataset(4), **kwargs)  # type: ignore[arg-type]


def test_invalid_dataset_resize_and_epoch_are_named() -> None:
    with pytest.raises(ValueError, match=r"map-style dataset \(__getitem__.*got int"):
        drapps.Loader(3)
    with drapps.Loader(SlowDataset(4), workers=0) as inline:
        with pytest.raises(ValueError, match=r"needs worker processes.*\(workers=0\)"):
            inline.resize(2)
        with pytest.raises(ValueError, match="epoch must be an int >= 0, got -2"):
            inline.set_epoch(-2)
    with drapps.Loader(SlowDataset(4), workers=1, max_workers=2) as loader:
        with pytest.raises(ValueError, match=r"workers must be an int in \[1, 2\], got 3"):
            loader.resize(3)


def test_load_state_dict_refuses_booleans_and_out_of_range_and_takes_numpy_ints() -> None:
    with drapps.Loader(SlowDataset(8), batch_size=2, seed=1, workers=0) as loader:
        good = loader.state_dict()
        for key, value in (
            ("next_batch", True),
            ("epoch", True),
            ("epoch", 2**64),
            ("epoch", -1),
            ("next_batch", 1.0),
        ):
            with pytest.raises(ValueError, match=f"state {key} must be"):
                loader.load_state_dict({**good, key: value})
        loader.load_state_dict({**good, "epoch": np.int64(3), "next_batch": np.int32(2)})
        assert loader.state_dict()["epoch"] == 3 and len(list(loader)) == 2
        loader.set_epoch(np.int64(1))
        with pytest.raises(ValueError, match="epoch must be an int >= 0, got True"):
            loader.set_epoch(True)
    for seed in (2**64, True, -1):
        with pytest.raises(ValueError, match="seed must be an int in"):
            drapps.Loader(SlowDataset(4), seed=seed)


class _FailingSampler(torch.utils.data.Sampler[int]):
    """Fails as it draws its first key (a RandomSampler with replacement over nothing does)."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        raise LookupError("the sampler has nothing to draw from")
        yield 0

    def __len__(self) -> int:
        return 3


def _where_it_raises(loader: Any) -> list[str]:
    """What two epochs of a loop that calls iter() and next() apart meet."""
    met = []
    for _ in range(2):
        try:
            iterator = iter(loader)
        except LookupError:
            met.append("iter")
            continue
        while True:
            try:
                next(iterator)
            except StopIteration:
                break
            except LookupError:
                met.append("next")
    return met


@pytest.mark.parametrize("workers", [0, "auto", 2])
def test_a_sampler_that_fails_as_it_draws_raises_where_dataloaders_does(
    workers: int | str,
) -> None:
    """In the training process (DataLoader's default) from next(), and the epoch is over;
    with workers, from iter()."""
    reference = torch.utils.data.DataLoader(
        list(range(3)), sampler=_FailingSampler(), num_workers=2 if workers == 2 else 0
    )
    with drapps.Loader(list(range(3)), sampler=_FailingSampler(), workers=workers) as loader:
        assert _where_it_raises(loader) == _where_it_raises(reference)


class _StallsOnce:
    """Each sample takes ``delay`` s; sample ``index`` stalls ``stall_s`` once (a marker file
    says it did), as a worker stuck on a lost network mount does."""

    def __init__(self, n: int, delay: float, index: int, stall_s: float, marker: str) -> None:
        self.n, self.delay, self.index, self.stall_s, self.marker = n, delay, index, stall_s, marker

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(self.delay)
        if i == self.index and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            time.sleep(self.stall_s)
        return torch.tensor(i)


class _StreamStallsOnce(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    def __init__(self, samples: _StallsOnce) -> None:
        self.samples = samples

    def __iter__(self):  # type: ignore[no-untyped-def]
        return (self.samples[i] for i in range(len(self.samples)))


@pytest.fixture
def scaled_hang_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default limit scaled down: at least 0.3 s, and 120 s before the first batch (so
    one taken before any batch came back would be waited for)."""
    scaled = {"factor": 10.0, "floor_s": 0.3, "first_s": 120.0}
    monkeypatch.setattr(HangLimit.__init__, "__kwdefaults__", scaled)


@pytest.mark.usefixtures("scaled_hang_limit")
def test_by_default_slow_batches_are_waited_for_and_a_stall_far_past_them_is_replaced(
    tmp_path: Path,
) -> None:
    """timeout=0, the default: batches of 0.6 s each, twice the (scaled) floor, all come; a
    batch that stalls for 30 s, far past ten times the slowest before it, is a hung worker,
    replaced and its batch made again."""
    slow = _StallsOnce(16, 0.15, index=-1, stall_s=0, marker=str(tmp_path / "never"))
    with drapps.Loader(slow, batch_size=4, workers=2) as loader:
        assert flatten_indices(list(loader)) == list(range(16))
        assert loader.stats().timeouts == 0
    stalls = _StallsOnce(48, 0.0, index=21, stall_s=30.0, marker=str(tmp_path / "stalled"))
    with drapps.Loader(stalls, batch_size=4, workers=2) as loader:
        assert flatten_indices(list(loader)) == list(range(48))
        assert loader.stats().timeouts >= 1


@pytest.mark.usefixtures("scaled_hang_limit")
def test_by_default_a_stream_stalled_far_past_its_batches_raises_naming_the_limit(
    tmp_path: Path,
) -> None:
    """An iterable dataset's worker cannot be replaced (its stream is where it stands): a
    stall far past its batches' times ends the epoch with an error that says so."""
    stalls = _StallsOnce(48, 0.0, index=21, stall_s=30.0, marker=str(tmp_path / "stalled"))
    with drapps.Loader(_StreamStallsOnce(stalls), batch_size=4, workers=1) as loader:
        with pytest.raises(RuntimeError, match=r"gave no batch in timeout=\d"):
            list(loader)
