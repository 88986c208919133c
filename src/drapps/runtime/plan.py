"""The epoch plan: which indices make batch ``b`` of epoch ``e``.

The plan depends only on (dataset length, batch size, shuffle, drop_last, seed, epoch), never on
the worker count, so batch ``b`` is the same list of indices however the pool is sized.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

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
