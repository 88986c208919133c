"""LoaderStats: the counters a loader reports through ``Loader.stats()``."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class LoaderStats:
    """A snapshot of a loader's counters (cumulative since the loader was made)."""

    epoch: int
    """Epoch of the current (or last) iteration; -1 before the first."""
    batches: int
    """Batches delivered to the training loop."""
    samples: int
    """Samples delivered to the training loop."""
    samples_skipped: int
    """Samples dropped under ``on_error="skip"``."""
    skipped: tuple[tuple[int, str], ...]
    """The last (up to 100) skipped samples: (index, what failed)."""
    workers: int
    """Workers taking tasks now (0 when batches are made in the calling process). After a
    shrink, surplus workers stay parked for a few seconds so a grow can reuse them."""
    target_workers: int
    """Worker count asked for (by the constructor or :meth:`Loader.resize`)."""
    worker_pids: tuple[int, ...]
    """Process ids of the worker processes alive now (parked ones included)."""
    prefetch_depth: int
    """Batches allowed in flight + ready."""
    ready_batches: int
    """Batches made and waiting for the training loop."""
    ready_bytes: int
    """Bytes held by the ready batches."""
    peak_ready_bytes: int
    """Most bytes the ready batches ever held."""
    memory_budget: int
    """Bytes the ready batches may hold."""
    in_flight: int
    """Batches being made by workers now."""
    wait_s: float
    """Seconds the training loop spent waiting for batches."""
    worker_restarts: int
    """Workers that died or hung and were replaced."""
    timeouts: int
    """Batches that overran ``timeout``."""
    retries: int
    """Tasks re-queued after their worker died or hung."""
    pickled_bytes: int
    """Bytes of batch structure sent through worker pipes (array bytes go by shared memory)."""
    shared_bytes: int
    """Bytes of array data received through shared memory."""
    fetch_s: float
    """Seconds spent in ``dataset.__getitem__`` (all workers)."""
    transform_s: float
    """Seconds spent in ``transform`` (all workers)."""
    collate_s: float
    """Seconds spent in ``collate_fn`` (all workers)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
