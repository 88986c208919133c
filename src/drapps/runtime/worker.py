"""Making a batch (shared by worker processes and ``workers=0``) and the worker process loop."""

from __future__ import annotations

import os
import signal
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import torch

from drapps.runtime.errors import SampleError, describe_failure, sample_path
from drapps.runtime.seeding import clear_sample, sample_seed_for, seed_sample
from drapps.runtime.transport import SharedMemoryFullError, pack, remove_slabs, slab_prefix

# How often an idle worker checks that the process that started it is still alive.
_PARENT_CHECK_S = 1.0


@dataclass(frozen=True)
class BatchRecipe:
    """Everything a worker needs to turn indices into a batch (sent to each worker once)."""

    dataset: Any
    transform: Callable[[Any], Any] | None
    collate_fn: Callable[[list[Any]], Any]
    seed: int
    on_error: str


@dataclass
class Made:
    """A made batch and what happened while making it."""

    batch: Any | None
    """The collated batch; None when every sample of it was skipped."""
    skipped: list[tuple[int, str]] = field(default_factory=list)
    """(index, failure) of each sample skipped under ``on_error="skip"``."""
    seconds: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """Time spent in __getitem__, the transform and collate_fn."""


def make_batch(recipe: BatchRecipe, epoch: int, indices: list[int]) -> Made:
    """Fetch, transform and collate ``indices`` with per-sample seeding.

    Raises:
        SampleError: a sample failed and ``on_error="raise"``, or collate_fn failed.
    """
    samples: list[Any] = []
    skipped: list[tuple[int, str]] = []
    fetch_s = transform_s = 0.0
    for index in indices:
        seed_sample(sample_seed_for(recipe.seed, epoch, index))
        stage = "__getitem__"
        try:
            t0 = time.perf_counter()
            sample = recipe.dataset[index]
            t1 = time.perf_counter()
            fetch_s += t1 - t0
            if recipe.transform is not None:
                stage = "transform"
                sample = recipe.transform(sample)
                transform_s += time.perf_counter() - t1
        except Exception as exc:
            path = sample_path(recipe.dataset, index)
            message = describe_failure(index, stage, path, exc)
            if recipe.on_error == "skip":
                skipped.append((index, message))
                continue
            detail = "".join(traceback.format_exception(exc))
            raise SampleError(
                message, index=index, stage=stage, path=path, indices=indices, detail=detail
            ) from exc
        finally:
            clear_sample()
        samples.append(sample)
    if not samples:
        return Made(None, skipped, (fetch_s, transform_s, 0.0))
    t2 = time.perf_counter()
    try:
        batch = recipe.collate_fn(samples)
    except Exception as exc:
        raise SampleError(
            f"collate_fn failed on the batch of indices {indices}: {type(exc).__name__}: {exc}",
            stage="collate_fn",
            indices=indices,
            detail="".join(traceback.format_exception(exc)),
        ) from exc
    return Made(batch, skipped, (fetch_s, transform_s, time.perf_counter() - t2))


def run_worker(
    recipe: BatchRecipe,
    session: str,
    worker_id: int,
    tasks: Connection,
    results: Connection,
    parent_pid: int,
) -> None:
    """The worker process: take ``(generation, epoch, batch_id, indices)`` tasks until ``None``.

    Replies ``("ok", generation, batch_id, packed, skipped, seconds)`` or
    ``("err", generation, batch_id, SampleError)``. Exits by itself when its parent dies.
    """
    # Ctrl-C reaches the whole process group; the training process decides what happens.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Intra-op threads in every worker would oversubscribe the cores the pool is sized for.
    torch.set_num_threads(1)
    prefix = slab_prefix(session, worker_id)
    sequence = 0
    try:
        while True:
            if not tasks.poll(_PARENT_CHECK_S):
                if os.getppid() != parent_pid:
                    break
                continue
            task = tasks.recv()
            if task is None:
                return
            generation, epoch, batch_id, indices = task
            reply: tuple[Any, ...]
            try:
                made = make_batch(recipe, epoch, indices)
                packed = None
                if made.batch is not None:
                    packed = pack(made.batch, f"{prefix}{sequence}")
                    sequence += 1
                reply = ("ok", generation, batch_id, packed, made.skipped, made.seconds)
            except SampleError as exc:
                reply = ("err", generation, batch_id, exc)
            except SharedMemoryFullError as exc:
                error = SampleError(str(exc), stage="transport", indices=indices)
                reply = ("err", generation, batch_id, error)
            results.send(reply)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the parent closed our pipes: it is gone or shutting down
    # Leaving without a stop message means the parent is gone: nobody else will unlink our slabs.
    remove_slabs(prefix)
