"""Loader behaviour: determinism, resume, resize, bounded memory, stats."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import random
import time

import numpy as np
import pytest
import torch
from helpers import (
    BigDataset,
    NoiseTransform,
    RandomDataset,
    SlowDataset,
    assert_batches_equal,
    flatten_indices,
    slab_bytes_held,
    slab_maps,
    wait_until,
)

import drapps
from drapps.runtime.slabs import KEEP_FREE


def epoch(workers: int, n: int = 61, **kwargs: object) -> list[object]:
    kwargs = {"batch_size": 4, "shuffle": True, "seed": 11, **kwargs}
    with drapps.Loader(RandomDataset(n), workers=workers, **kwargs) as loader:  # type: ignore[arg-type]
        return list(loader)


@pytest.fixture(scope="module")
def reference() -> list[object]:
    return epoch(0)


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_batches_are_identical_for_every_worker_count(
    workers: int, reference: list[object]
) -> None:
    assert_batches_equal(epoch(workers), reference)


def test_existing_transforms_get_per_sample_randomness_unchanged() -> None:
    kwargs = {"transform": NoiseTransform()}
    assert_batches_equal(epoch(0, **kwargs), epoch(3, **kwargs))


def test_spawned_workers_give_the_same_batches(reference: list[object]) -> None:
    assert_batches_equal(epoch(2, multiprocessing_context="spawn"), reference)


def test_epochs_differ_and_set_epoch_replays_one() -> None:
    with drapps.Loader(RandomDataset(40), batch_size=8, shuffle=True, seed=0, workers=2) as loader:
        first, second = list(loader), list(loader)
        assert flatten_indices([b["index"] for b in first]) != flatten_indices(
            [b["index"] for b in second]
        )
        assert not torch.equal(first[0]["torch"], second[0]["torch"])
        loader.set_epoch(0)
        assert_batches_equal(list(loader), first)
        assert loader.stats().epoch == 0


def test_random_resizes_mid_epoch_change_nothing(reference: list[object]) -> None:
    rng = random.Random(0)
    resize_at = set(rng.sample(range(len(reference)), 6))
    with drapps.Loader(
        RandomDataset(61),
        batch_size=4,
        shuffle=True,
        seed=11,
        workers=2,
        max_workers=4,
        persistent_workers=True,  # the pool's size is read after the epoch
    ) as loader:
        out, sizes = [], []
        for b, batch in enumerate(loader):
            out.append(batch)
            if b in resize_at:
                sizes.append(rng.randint(1, 4))
                loader.resize(sizes[-1])
        assert_batches_equal(out, reference)
        deadline = time.monotonic() + 5
        while loader.stats().workers != sizes[-1] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert loader.stats().workers == loader.stats().target_workers == sizes[-1]


def test_resize_down_retires_processes() -> None:
    # persistent_workers: the workers outlive the epoch, so the count after it can be read.
    options = {"batch_size": 4, "workers": 3, "persistent_workers": True}
    with drapps.Loader(SlowDataset(64, 0.001), **options) as loader:
        it = iter(loader)
        next(it)
        loader.resize(1)
        rest = list(it)
        assert len(rest) == 15
        assert loader.stats().workers == 1
        # The surplus workers are parked for a later grow, then exit (after ~5 s).
        deadline = time.monotonic() + 15
        while len(loader.stats().worker_pids) != 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(loader.stats().worker_pids) == 1


def test_a_grow_reuses_workers_parked_by_a_shrink() -> None:
    options = {"batch_size": 4, "workers": 3, "persistent_workers": True}
    with drapps.Loader(SlowDataset(64, 0.001), **options) as loader:
        it = iter(loader)
        next(it)
        before = set(loader.stats().worker_pids)
        loader.resize(1)
        next(it)
        loader.resize(3)
        assert len(list(it)) == 14
        stats = loader.stats()
    assert set(stats.worker_pids) == before and stats.workers == 3


class _WorkerIds(torch.utils.data.Dataset[torch.Tensor]):
    """Sample ``i`` is ``[i, get_worker_info().id, its num_workers]``."""

    def __len__(self) -> int:
        return 96

    def __getitem__(self, i: int) -> torch.Tensor:
        info = torch.utils.data.get_worker_info()
        return torch.tensor([i, info.id, info.num_workers])


@pytest.mark.parametrize("backend", ["process", "thread"])
def test_across_resizes_the_ids_stay_below_the_count(backend: str) -> None:
    """DataLoader's ``get_worker_info().id`` is below ``num_workers``, and a dataset that
    keys a handle by id relies on it: a shrink parks the highest ids, a grow takes back the
    lowest (it parked the least loaded, so 3 of 4 workers could be ids 1 to 3 of 3)."""
    sizes = iter([1, 4, 2, 3, 1, 2, 4, 3] * 3)
    options = {"batch_size": 4, "workers": 3, "persistent_workers": True, "backend": backend}
    with drapps.Loader(_WorkerIds(), **options) as loader:
        samples = []
        for _ in range(2):
            for k, batch in enumerate(loader):
                samples += batch.tolist()
                if k % 3 == 0:
                    loader.resize(next(sizes))
    assert sorted(i for i, _, _ in samples) == sorted(list(range(96)) * 2)
    assert all(0 <= wid < n for _, wid, n in samples), sorted({(w, n) for _, w, n in samples})


def _slab_files(pid: int) -> set[int]:
    """Inodes of the slab files ``pid`` holds open."""
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):  # closed, or the worker gone, since it was listed
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:drapps-slab"):
                found.add(os.stat(f"/proc/{pid}/fd/{fd}").st_ino)
    return found


def test_the_slabs_of_a_retired_worker_are_not_kept_mapped() -> None:
    # The training process keeps its mapping of a released slab for the slab's next batch.
    # A worker retired by a shrink sends none again: its slabs must go with it, or the
    # training process alone holds their pages after every shrink.
    options = {"batch_size": 8, "workers": 3, "persistent_workers": True}
    with drapps.Loader(BigDataset(64, 64 * 1024), **options) as loader:
        it = iter(loader)

        def step() -> None:
            nonlocal it
            try:
                next(it)
            except StopIteration:
                it = iter(loader)

        for _ in range(4):
            step()
        first = set(loader.stats().worker_pids)
        assert len(first) == 3
        files: dict[int, set[int]] = {}
        deadline = time.monotonic() + 30
        # Until every worker has sent a batch (a slow start may leave one without any).
        while not all(files.get(pid) for pid in first) and time.monotonic() < deadline:
            step()
            for pid in first:
                files[pid] = _slab_files(pid) or files.get(pid, set())
        assert all(files.get(pid) for pid in first)
        loader.resize(1)
        while len(loader.stats().worker_pids) > 1 and time.monotonic() < deadline + 30:
            for pid in loader.stats().worker_pids:  # each worker's files, last seen alive
                with contextlib.suppress(FileNotFoundError):  # exited since it was listed
                    files.setdefault(pid, set()).update(_slab_files(pid))
            step()
            time.sleep(0.02)
        left = set(loader.stats().worker_pids)
        assert len(left) == 1 and len(first - left) == 2  # two retired (after ~5 s parked)
        for _ in range(4):  # the loop goes on with the one left
            step()
        del it
        gc.collect()
        retired = set().union(*(files[pid] for pid in first - left))
        mapped = {int(line.split()[4]) for line in slab_maps()}
        assert mapped and not mapped & retired


@pytest.mark.parametrize(("workers_before", "workers_after"), [(2, 1), (0, 3), (3, 0)])
def test_resume_yields_exactly_the_remaining_batches(
    workers_before: int, workers_after: int, reference: list[object]
) -> None:
    with drapps.Loader(
        RandomDataset(61), batch_size=4, shuffle=True, seed=11, workers=workers_before
    ) as first:
        it = iter(first)
        head = [next(it) for _ in range(5)]
        state = first.state_dict()
    json.dumps(state)  # checkpoints store it as plain data
    with drapps.Loader(
        RandomDataset(61), batch_size=4, shuffle=True, seed=11, workers=workers_after
    ) as second:
        second.load_state_dict(state)
        assert_batches_equal(head + list(second), reference)
        assert second.state_dict()["epoch"] == 1  # the next iteration is the next epoch


class _Stream(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    def __iter__(self):  # type: ignore[no-untyped-def]
        info = torch.utils.data.get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(start, 30, step))


@pytest.mark.parametrize("seed", [11, None])
@pytest.mark.parametrize("stream", [False, True], ids=["map-style", "iterable"])
@pytest.mark.parametrize("workers", [0, 2, "auto"])
def test_a_checkpoint_after_the_loop_breaks_out_resumes_the_rest_of_the_epoch(
    workers: int | str, stream: bool, seed: int | None
) -> None:
    """A loop that breaks out mid-epoch (a job out of time) and saves: its iterator is gone,
    and the checkpoint pointed past the epoch, dropping its remaining batches on resume."""

    def loader() -> drapps.Loader:
        if stream:
            return drapps.Loader(_Stream(), batch_size=3, seed=seed, workers=workers)
        return drapps.Loader(
            list(range(30)), batch_size=3, shuffle=True, seed=seed, workers=workers
        )

    torch.manual_seed(0)
    with loader() as whole:
        expected = [b.tolist() for b in whole]
    torch.manual_seed(0)
    with loader() as first:
        head = []
        for step, batch in enumerate(first):
            head.append(batch.tolist())
            if step == 3:
                break
        gc.collect()
        state = json.loads(json.dumps(first.state_dict()))
        assert (state["epoch"], state["next_batch"]) == (0, 4)
    with loader() as second:
        second.load_state_dict(state)
        assert head + [b.tolist() for b in second] == expected


def test_after_a_break_a_new_iteration_or_set_epoch_moves_the_checkpoint_on() -> None:
    with drapps.Loader(list(range(12)), batch_size=3, seed=0, workers=0) as loader:
        for _ in loader:
            break
        assert loader.state_dict()["next_batch"] == 1
        it = iter(loader)  # the next epoch: the one let go of is over
        assert (loader.state_dict()["epoch"], loader.state_dict()["next_batch"]) == (1, 0)
        next(it)
        del it
        loader.set_epoch(5)
        assert (loader.state_dict()["epoch"], loader.state_dict()["next_batch"]) == (5, 0)


def test_state_dict_before_and_after_an_epoch() -> None:
    with drapps.Loader(SlowDataset(8), batch_size=4, workers=0) as loader:
        assert loader.state_dict()["epoch"] == 0 and loader.state_dict()["next_batch"] == 0
        list(loader)
        assert loader.state_dict()["epoch"] == 1 and loader.state_dict()["next_batch"] == 0


def test_load_state_dict_rejects_a_state_from_another_loader() -> None:
    with drapps.Loader(SlowDataset(8), batch_size=4, workers=0) as loader:
        state = loader.state_dict()
    with drapps.Loader(SlowDataset(8), batch_size=2, workers=0) as other:
        with pytest.raises(ValueError, match="batch_size=4 but this loader has batch_size=2"):
            other.load_state_dict(state)
        with pytest.raises(ValueError, match="next_batch must be in"):
            other.load_state_dict({**other.state_dict(), "next_batch": 99})
        with pytest.raises(ValueError, match="version"):
            other.load_state_dict({})


def test_ready_batches_stay_under_the_memory_budget_when_the_consumer_stalls() -> None:
    batch_bytes = 4 * 256 * 1024
    budget = 3 * batch_bytes
    with drapps.Loader(
        BigDataset(96, 256 * 1024), batch_size=4, workers=2, prefetch=16, memory_budget=budget
    ) as loader:
        seen = []
        for batch in loader:
            if not seen:
                time.sleep(1.0)  # a stalled training step: workers run ahead until the budget
            assert loader.stats().ready_bytes <= budget
            seen.extend(batch[:, 0].long().tolist())
        stats = loader.stats()
    assert sorted(seen) == list(range(96))
    assert batch_bytes * 2 <= stats.peak_ready_bytes <= budget
    # Batches crossed by shared memory: the pipes carried only a small skeleton per batch.
    assert stats.shared_bytes == 24 * batch_bytes
    assert stats.pickled_bytes / stats.batches < 1024


class Growing:
    """Batches of 4 that grow from 64 KiB to 2 MiB a sample: the slabs a worker keeps for
    reuse are the largest it made."""

    def __len__(self) -> int:
        return 128

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full(((i // 4 + 1) * 16384,), float(i))


def test_batches_and_the_slabs_kept_for_reuse_stay_under_the_memory_budget() -> None:
    """Each worker kept two released slabs of its largest batch, outside the budget: with a
    128 MB budget about 408 MiB stayed held, idle between epochs too."""
    budget, largest_batch = 24 * 2**20, 4 * 2 * 2**20
    with drapps.Loader(
        Growing(), batch_size=4, workers=3, memory_budget=budget, persistent_workers=True
    ) as loader:
        for _ in range(2):
            peak = 0
            for batch in loader:
                del batch
                peak = max(peak, slab_bytes_held())
            gc.collect()
            # The batch the loop waits for is always made, so the bound is one batch more.
            assert peak <= budget + largest_batch
            assert wait_until(lambda: slab_bytes_held() <= budget, timeout=10)  # idle


class Varied:
    """Samples of 1 to 64 rows of 16 KiB, in no order: slabs of many sizes, of which a
    worker keeps some for reuse and closes the others."""

    def __len__(self) -> int:
        return 4000

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((1 + (i * 7919) % 64, 4096), float(i))


def test_slabs_counted_for_reuse_stay_within_the_workers_shares_over_epochs_left_early() -> None:
    """An epoch left early drops the replies in flight unread. Each names the slabs its worker
    closed since its last one, which the training process then forgets; dropped, they stayed
    counted against the memory budget until the worker exited: 179 MiB after 40 epochs here,
    so fewer and fewer batches were made ahead."""
    largest_batch, prefetch = 4 * 64 * 4096 * 4, 4
    with drapps.Loader(
        Varied(), batch_size=4, num_workers=2, persistent_workers=True,
        collate_fn=list, prefetch_factor=prefetch,
    ) as loader:  # fmt: skip
        for _ in range(30):
            for k, _batch in enumerate(loader):
                if k == 6:
                    break
        gc.collect()
        held = loader._parts.engine.dispatcher.admission.recycler.mappings.held_bytes()
    # Each worker keeps at most KEEP_FREE slabs of its largest batch, and counts those it let
    # go until its next reply: at most what it was sent ahead.
    assert held <= 2 * (KEEP_FREE + prefetch) * largest_batch, f"{held / 2**20:.0f} MiB held"


def test_a_loop_that_kept_every_batch_leaves_nothing_counted_once_they_go() -> None:
    """A worker remembers at most 64 sent slabs and closes the oldest past that, while the
    loop still holds their batches. Once those went, the training process kept them counted
    as awaiting a close it had already been told of: 44 MiB here, for the workers' life."""
    slab = 4 * 4 * 64 * 1024  # a batch's 256 KiB, its slab's length rounded up, at most 4x
    with drapps.Loader(
        BigDataset(1200, 64 * 1024), batch_size=4, num_workers=2, persistent_workers=True
    ) as loader:
        kept = list(loader)  # 150 batches each worker sent and the loop held
        del kept
        gc.collect()
        assert sum(len(b) for b in loader) == 1200  # each worker names what it closed
        gc.collect()
        held = loader._parts.engine.dispatcher.admission.recycler.mappings.held_bytes()
    assert held <= 2 * KEEP_FREE * slab, f"{held / 2**20:.0f} MiB held"


def test_memory_budget_parses_sizes() -> None:
    with drapps.Loader(SlowDataset(4), workers=1, memory_budget="1.5MiB") as loader:
        assert loader.stats().memory_budget == int(1.5 * 2**20)


def test_workers_zero_leaves_the_callers_rng_streams_alone() -> None:
    random.seed(3), np.random.seed(3), torch.manual_seed(3)
    expected = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    random.seed(3), np.random.seed(3), torch.manual_seed(3)
    # With a seed of its own; with seed=None the loader draws its base seed from torch's RNG,
    # exactly as DataLoader does (tests/test_compat.py).
    list(drapps.Loader(RandomDataset(10), batch_size=3, seed=5, workers=0))
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected


def test_collate_matches_torch_default_collate() -> None:
    data = RandomDataset(9)
    with drapps.Loader(data, batch_size=3, workers=2) as loader:
        batches = list(loader)
    assert set(batches[0]) == {"index", "py", "np", "torch", "rng"}
    assert batches[0]["torch"].shape == (3, 3)
    assert batches[0]["index"].dtype == torch.int64
    assert batches[0]["py"].dtype == torch.float64


def test_len_and_stats_counters() -> None:
    # persistent_workers: the workers outlive the epoch, so their count can be read after it.
    options = {"batch_size": 4, "drop_last": True, "workers": 2, "persistent_workers": True}
    with drapps.Loader(SlowDataset(10), **options) as loader:
        assert len(loader) == 2
        it = iter(loader)
        assert len(it) == 2
        assert sum(len(b) for b in it) == 8
        stats = loader.stats()
    assert (stats.batches, stats.samples, stats.workers, stats.target_workers) == (2, 8, 2, 2)
    assert stats.prefetch_depth == 4 and stats.in_flight == 0


@pytest.mark.parametrize("supersede", ["set_epoch", "load_state_dict"])
def test_set_epoch_or_a_load_supersedes_the_iterator_under_way(supersede: str) -> None:
    """A newer ``iter(loader)`` runs beside the older one (tests/engines/test_side_by_side.py);
    moving the loader to another epoch, or loading a checkpoint, ends the older one."""
    with drapps.Loader(SlowDataset(16), batch_size=4, workers=2) as loader:
        old = iter(loader)
        next(old)
        if supersede == "set_epoch":
            loader.set_epoch(3)
        else:
            loader.load_state_dict(loader.state_dict())
        new = iter(loader)
        with pytest.raises(RuntimeError, match=r"superseded by set_epoch\(\) or load_state_dict"):
            next(old)
        assert len(list(new)) == (4 if supersede == "set_epoch" else 3)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("seen_the_end", [True, False])
def test_an_exhausted_iterator_stays_exhausted_after_a_new_one(
    workers: int, seen_the_end: bool
) -> None:
    """As DataLoader's: an iterator with no batch left raises StopIteration, also once a
    newer iterator started (it raised the superseded error, which is for an iterator that
    still had batches to give)."""
    with drapps.Loader(SlowDataset(8), batch_size=4, workers=workers) as loader:
        old = iter(loader)
        taken = [next(old) for _ in range(2)]  # every batch, the end not seen yet
        if seen_the_end:
            assert next(old, None) is None
        new = iter(loader)
        with pytest.raises(StopIteration):
            next(old)
        assert flatten_indices(taken) == flatten_indices(list(new)) == list(range(8))


def test_resize_before_the_first_epoch_sets_the_starting_pool() -> None:
    options = {"batch_size": 4, "workers": 1, "max_workers": 3, "persistent_workers": True}
    with drapps.Loader(SlowDataset(16), **options) as loader:
        loader.resize(3)
        assert loader.stats().target_workers == 3 and loader.stats().workers == 0
        assert len(list(loader)) == 4
        assert loader.stats().workers == 3
