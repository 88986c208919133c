"""Datasets the ``drapps serve`` producers of ``test_redis_queue.py`` load (module:factory)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch


class Photos:
    """Deterministic images plus augmentation-style randomness from the per-sample seed."""

    def __init__(self, n: int = 96, delay: float = 0.0, bad: int = -1) -> None:
        self.n, self.delay, self.bad = n, delay, bad

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        if self.delay:
            time.sleep(self.delay)
        if i == self.bad:
            raise ValueError(f"sample {i} is broken")
        rng = np.random.default_rng(i)
        image = torch.from_numpy(rng.integers(0, 255, (3, 16, 16), dtype=np.uint8))
        return {"image": image, "noise": torch.rand(2), "index": i}


def photos() -> Photos:
    return Photos()


def slow_photos() -> Photos:
    return Photos(delay=0.02)


def broken_photos() -> Photos:
    return Photos(bad=13)
