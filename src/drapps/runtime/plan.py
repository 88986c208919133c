"""The epoch plan: which indices make batch ``b`` of epoch ``e``.

A :class:`Plan` depends only on (dataset length, batch size, shuffle, drop_last, seed, epoch);
a :class:`SampledPlan` holds the batches a sampler drew when the epoch began. Neither depends on
the worker count, so batch ``b`` is the same list of indices however the pool is sized.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from drapps.runtime.seeding import ORDER_STREAM, mix_seed


@dataclass(frozen=True)
class Plan:
    """The batches of one epoch."""

    num_samples: int
    """Length of the dataset."""
    batch_size: int
    """Samples per batch (the last one may be shorter unless ``drop_last``)."""
    shuffle: bool
    """Visit the dataset in a seeded random order."""
    drop_last: bool
    """Drop a last batch shorter than ``batch_size``."""
    seed: int
    """The loader's seed."""
    epoch: int
    """Epoch number; with ``shuffle`` every epoch has its own order."""

    def __post_init__(self) -> None:
        if self.num_samples < 0:
            raise ValueError(f"num_samples must be >= 0, got {self.num_samples!r}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size!r}")
        if self.epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {self.epoch!r}")

    def __len__(self) -> int:
        if self.drop_last:
            return self.num_samples // self.batch_size
        return -(-self.num_samples // self.batch_size)

    @cached_property
    def order(self) -> np.ndarray:
        """The epoch's sample order (a permutation of ``range(num_samples)``)."""
        if not self.shuffle:
            return np.arange(self.num_samples, dtype=np.int64)
        rng = np.random.Generator(np.random.PCG64(mix_seed(ORDER_STREAM, self.seed, self.epoch)))
        return rng.permutation(self.num_samples).astype(np.int64)

    def batch(self, batch_id: int) -> list[int]:
        """The indices of batch ``batch_id``, in delivery order."""
        if not 0 <= batch_id < len(self):
            raise IndexError(f"batch_id must be in [0, {len(self)}), got {batch_id!r}")
        start = batch_id * self.batch_size
        return self.order[start : start + self.batch_size].tolist()


@dataclass(frozen=True)
class SampledPlan:
    """An epoch whose batches a sampler drew: the batches, as lists of dataset keys.

    A sampler's order cannot be recomputed from a seed in general (it may draw from torch's
    global generator, or hold state), so the epoch's batches are drawn once, when the epoch
    starts, and kept; workers, resizes and retries then all see the same list.
    """

    batches: tuple[list[Any], ...]
    """Batch ``b`` is ``batches[b]``: the keys the sampler gave, in order."""
    seed: int
    """Seeds each sample's augmentation with (seed, epoch, index)."""
    epoch: int
    """Epoch number."""
    first: int = 0
    """Batch id of ``batches[0]``: a resumed epoch keeps its ids."""

    def __len__(self) -> int:
        return self.first + len(self.batches)

    def batch(self, batch_id: int) -> list[Any]:
        """The keys of batch ``batch_id``, in delivery order."""
        if not self.first <= batch_id < len(self):
            raise IndexError(f"batch_id must be in [{self.first}, {len(self)}), got {batch_id!r}")
        return self.batches[batch_id - self.first]


EpochPlan = Plan | SampledPlan
"""What a loader iterates: its own seeded order, or a sampler's."""
