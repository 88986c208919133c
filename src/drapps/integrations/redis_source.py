"""An engine that reads a Redis batch queue: ``drapps.Loader(source="redis://...")``.

The producers (``drapps serve``) hold the dataset and the transform; the training host's loader
holds only the plan: this engine learns the dataset's length from the producers, posts each
planned batch as a task, and hands back what comes back in batch order, each exactly once.
The loader plans epochs exactly as a local one with the same ``seed`` would, so batches are
bit-identical to a local loader's with the same dataset, transform and seed.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from drapps.engines.base import Engine, EngineBatch, EpochJob
from drapps.engines.source import Source
from drapps.integrations.redis_queue import QueueAddress, QueueReader, iterate
from drapps.runtime.config import parse_bytes
from drapps.runtime.errors import ArgumentError
from drapps.runtime.stats import PipelineSnapshot

_DATASET_SIDE = (
    "dataset", "sampler", "batch_sampler", "num_workers", "collate_fn", "worker_init_fn",
    "multiprocessing_context", "transform", "split", "device", "backend", "workers",
    "max_workers", "policy", "on_error", "cache", "prefetch_factor", "persistent_workers",
)  # fmt: skip


class RemoteDataset:
    """What the training host knows of the producers' dataset: its length."""

    def __init__(self, length: int, queue: str) -> None:
        self.length, self.queue = length, queue

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> Any:
        raise TypeError(
            f"the samples of queue {self.queue!r} are made by `drapps serve` producers; "
            "iterate the loader instead"
        )


class RedisSource(Engine):
    """Batches made by ``drapps serve`` producers, read from a Redis queue in plan order.

    Args:
        source: the queue's URL and the reader's options.
        changed: the loader's arguments given other than their defaults; the dataset side
            (``transform``, ``collate_fn``, workers, ...) belongs to ``drapps serve`` and is
            refused with a message that says so.
        batch_size: samples per batch (an int >= 1: the producers batch by index).
        prefetch: tasks posted ahead of the batch being read ("auto": 8).
        timeout: seconds without any batch before giving up (TimeoutError); 0 (the
            loader's default): 60; None: an hour.
        finish: applied to each batch as it is read (pinning).

    Raises:
        QueueInUseError: another loader reads the queue (a queue has one reader).
    """

    kind = "redis"
    holds = "a queue has one reader, which goes on with the newer iterator"

    def __init__(
        self,
        source: Source,
        *,
        changed: set[str],
        batch_size: Any,
        prefetch: Any,
        timeout: Any,
        finish: Callable[[Any], Any] | None = None,
    ) -> None:
        for name in _DATASET_SIDE:
            if name in changed:
                raise ArgumentError(
                    f"{name}: with source=... the producers make the batches; give the "
                    f"dataset side to `drapps serve` instead"
                )
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ArgumentError(
                f"batch_size must be an int >= 1 with source=..., got {batch_size!r}"
            )
        if prefetch != "auto" and (not isinstance(prefetch, int) or prefetch < 1):
            raise ArgumentError(f"prefetch must be an int >= 1 or 'auto', got {prefetch!r}")
        if timeout is not None and (not isinstance(timeout, (int, float)) or timeout < 0):
            raise ArgumentError(f"timeout must be >= 0 seconds or None, got {timeout!r}")
        self.address = QueueAddress.parse(source.url)
        self._prefetch = 8 if prefetch == "auto" else int(prefetch)
        self._finish = finish
        self._reader = QueueReader(
            self.address,
            max_batch_bytes=parse_bytes(source.max_batch_bytes, "max_batch_bytes"),
            timeout=float(timeout) if timeout else 60.0 if timeout == 0 else 3600.0,
            username=source.username,
            password=source.password,
        )
        self._finalizer = weakref.finalize(self, self._reader.close)
        try:
            length = self._reader.length()
        except BaseException:
            self._finalizer()  # let go of the queue now, not when this is collected
            raise
        self.dataset = RemoteDataset(length, self.address.name)
        self._batches: Iterator[Any] = iter(())
        self.wait_s = 0.0

    @property
    def workers(self) -> int:
        return 0  # the producers' workers are theirs, not this loader's

    def start_epoch(self, job: EpochJob) -> None:
        if job.plan is None:
            raise ValueError("a Redis source serves planned batches of a map-style dataset")
        _close(self._batches)
        self._batches = iterate(self._reader, job.plan, job.start, self._prefetch, _ignore)

    def next(self) -> EngineBatch | None:
        began = time.perf_counter()
        try:
            batch = next(self._batches, None)
        finally:
            self.wait_s += time.perf_counter() - began
        if batch is None:
            return None
        return EngineBatch(self._finish(batch) if self._finish is not None else batch)

    def snapshot(self, samples: int) -> PipelineSnapshot:
        return PipelineSnapshot(
            samples=samples,
            wait_s=self.wait_s,
            ready_batches=0,
            ready_bytes=0,
            memory_budget=0,
            workers=0,
            max_workers=0,
            prefetch_depth=self._prefetch,
            worker_pids=(),
        )

    def shutdown(self) -> None:
        """Release what the reader holds on Redis and close its connection. Idempotent."""
        _close(self._batches)
        self._finalizer()


def _ignore(batch_id: int) -> None:
    """The loader's epoch counts deliveries itself."""


def _close(batches: Iterator[Any]) -> None:
    """End an epoch's reading early: its generator hands back the tasks it holds."""
    close = getattr(batches, "close", None)
    if close is not None:
        close()
