"""Every local engine and mode passes the one conformance check (``tests/conformance.py``).

Inline, worker processes (fixed and "auto"), worker threads (a pool given through the
backends seam), batches cut into parts among workers, an iterable dataset inline and over stream
workers, the sample cache, and a Pipeline split between the workers and the device stage. The
Ray pool and the Redis source run the same check in the integration tier.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from conformance import check_engine
from helpers import ThreadPool
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

import drapps
from drapps.engines.backends import Backend
from drapps.ops import Pipeline, RandomHorizontalFlip, Spec, ToCHWTensor
from drapps.runtime.pool import WorkerPool
from drapps.runtime.worker import BatchRecipe

SEED = 5


class Indexed:
    """Sample ``i`` is a small record of ``i`` (no randomness: DataLoader gives the same)."""

    def __init__(self, n: int = 45) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"index": torch.tensor(i), "x": torch.full((8192,), float(i))}


class Shards(IterableDataset):  # type: ignore[type-arg]
    """Worker k of n yields k, k+n, ... (sharded through get_worker_info, as DataLoader's)."""

    def __init__(self, n: int = 40) -> None:
        self.n = n

    def __iter__(self) -> Iterator[torch.Tensor]:
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        return (torch.tensor(i) for i in range(start, self.n, step))

    def __len__(self) -> int:
        return self.n


class Pictures:
    """Fixed-size uint8 HWC images, labelled by index."""

    def __len__(self) -> int:
        return 30

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        return np.random.default_rng(i).integers(0, 256, (8, 6, 3), dtype=np.uint8), i


def pipeline(split: int) -> Pipeline:
    ops = [ToCHWTensor(), RandomHorizontalFlip()]
    return Pipeline(ops, split=split, key=0, takes=Spec("array", "uint8", "HWC"))


def dataloader_epoch(dataset: Any, **kwargs: Any) -> list[Any]:
    torch.manual_seed(SEED)
    return list(DataLoader(dataset, **kwargs))


def maker(dataset: Any, **kwargs: Any) -> Any:
    def make(**overrides: Any) -> drapps.Loader:
        torch.manual_seed(SEED)  # the order (and base seed) is drawn from it, as DataLoader's
        return drapps.Loader(dataset, **{**kwargs, **overrides})

    return make


def kill_a_worker(loader: drapps.Loader) -> None:
    os.kill(loader.stats().worker_pids[0], signal.SIGKILL)


class ThreadBackend(Backend):
    """Workers as threads of this process (the test pool of the pool seam), reaching the
    loader through the backends seam as Ray does."""

    name = "threads"

    def make_pool(self, recipe: BatchRecipe, context: Any) -> WorkerPool:
        return ThreadPool(recipe)


MAP_MODES = {
    "inline": ({"workers": 0}, None),
    "processes": ({"workers": 2}, kill_a_worker),
    # Workers forked by a zygote that was spawned (or forkserved): the dataset crossed once.
    "spawn": ({"workers": 2, "multiprocessing_context": "spawn"}, kill_a_worker),
    "forkserver": ({"workers": 2, "multiprocessing_context": "forkserver"}, kill_a_worker),
    "auto": ({"workers": "auto"}, kill_a_worker),
    "threads": ({"workers": 2, "backend": ThreadBackend()}, None),
    "cache": ({"workers": 2, "cache": drapps.Cache(memory="16MiB", disk=None)}, kill_a_worker),
    # Batches cut into parts that several workers make and the training process collates.
    "parts": ({"workers": 2, "dispatch": "samples"}, kill_a_worker),
    "parts-auto": ({"workers": "auto", "dispatch": "samples"}, kill_a_worker),
    "parts-threads": ({"workers": 2, "dispatch": "samples", "backend": ThreadBackend()}, None),
    # Batches filled from made samples; with nothing slow for 30 s, the planned ones.
    "fill": ({"workers": 2, "defer_after": 30.0}, kill_a_worker),
}


@pytest.mark.parametrize("mode", list(MAP_MODES))
def test_map_style_engines_conform(mode: str) -> None:
    options, kill = MAP_MODES[mode]
    expected = dataloader_epoch(Indexed(), batch_size=4, shuffle=True)
    make = maker(Indexed(), batch_size=4, shuffle=True, **{"cache": None, **options})
    check_engine(make, expected, kill=kill)


@pytest.mark.parametrize("workers", [0, 2])
def test_iterable_engines_conform(workers: int) -> None:
    expected = dataloader_epoch(Shards(), batch_size=3, num_workers=workers)
    check_engine(maker(Shards(), batch_size=3, workers=workers), expected)


@pytest.mark.parametrize("workers", [0, 2, "parts", "offload"])
def test_a_split_pipeline_conforms(workers: int | str) -> None:
    with drapps.Loader(
        Pictures(), batch_size=4, shuffle=True, seed=SEED, workers=0, transform=pipeline(2)
    ) as reference:
        expected = list(reference)  # every op in the worker: the reference path
    make = maker(
        Pictures(),
        batch_size=4,
        shuffle=True,
        seed=SEED,
        workers=2 if workers in ("parts", "offload") else workers,
        dispatch="samples" if workers == "parts" else "batches",
        transform=pipeline(1),  # the flip runs in the device stage, on batches
        # Half of each batch's samples flipped in the stage, the rest whole in the workers.
        offload=0.5 if workers == "offload" else None,
    )
    check_engine(make, expected, kill=kill_a_worker if workers else None)


def test_the_check_fails_an_engine_that_repeats_a_batch() -> None:
    expected = dataloader_epoch(Indexed(), batch_size=4, shuffle=True)
    with pytest.raises(AssertionError, match="batches"):
        check_engine(
            maker(Indexed(), batch_size=4, shuffle=True, workers=0), expected + expected[:1]
        )
