"""Per-sample cost: what making a sample will take, predicted before it is made.

The dispatcher learns from the seconds each sample took (a worker measures its fetch and
transform, less any time it waited for a core another process held: see
:func:`drapps.runtime.worker.runqueue_wait`) and predicts the next ones with two models side
by side:

- a **history** baseline: the sample's own last cost, else the running median;
- a small **learned** model: a 3-8-1 MLP in NumPy over (seen before, its last cost against the
  median, its file size against the median size), trained online by SGD on log cost.

Both are scored on measured samples before they learn from them (the error of a prediction
made without the answer; every fourth batch, which is plenty and keeps the cost down), and the
one with the lower running error predicts. Predicting and learning cost a few microseconds per
sample; :meth:`SampleCosts.report` says how many and how accurate.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

_WINDOW = 512  # recent costs the median and the tail are read from
_WARMUP = 256  # samples before the learned model may be chosen
_ERROR_DECAY = 0.02  # weight of each new sample in the running errors
SLOW = 8.0
"""A sample that costs this many times the running median counts as slow (a straggler)."""
_LEARN_EVERY = 4  # learning steps taken at once, every _LEARN_SAMPLES samples (~100 us each)
_LEARN_SAMPLES = 128  # samples observed between two scorings (4 batches of 32, however cut)
_HIDDEN = 8
_LEARNING_RATE = 0.05


class CostMlp:
    """A 3-8-1 tanh network over per-sample features, predicting log(cost / median)."""

    def __init__(self, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.w1 = rng.normal(0.0, 0.5, (3, _HIDDEN))
        self.b1 = np.zeros(_HIDDEN)
        self.w2 = rng.normal(0.0, 0.1, _HIDDEN)
        self.b2 = 0.0

    def predict(self, x: np.ndarray) -> np.ndarray:
        return np.tanh(x @ self.w1 + self.b1) @ self.w2 + self.b2

    def learn(self, x: np.ndarray, y: np.ndarray) -> None:
        """One SGD step on the mean squared error over the rows of ``x``."""
        hidden = np.tanh(x @ self.w1 + self.b1)
        error = hidden @ self.w2 + self.b2 - y
        grad_hidden = np.outer(error, self.w2) * (1.0 - hidden**2)
        n = len(y)
        self.w2 -= _LEARNING_RATE * hidden.T @ error / n
        self.b2 -= _LEARNING_RATE * float(error.mean())
        self.w1 -= _LEARNING_RATE * x.T @ grad_hidden / n
        self.b1 -= _LEARNING_RATE * grad_hidden.mean(axis=0)


def percentiles(values: np.ndarray, qs: Sequence[float]) -> list[float]:
    """``np.percentile(values, qs)`` (its linear interpolation, the same figures) from a
    partial sort around the ranks it reads: 11 against 59 us on a window of 512, read by the
    dispatcher every other batch."""
    last = len(values) - 1
    ranks = [q / 100 * last for q in qs]
    floors = [int(np.floor(r)) for r in ranks]
    around = sorted({k for f in floors for k in (f, min(f + 1, last))})
    part = np.partition(values, around)
    out = []
    for rank, lo in zip(ranks, floors, strict=True):
        a, b = part[lo], part[min(lo + 1, last)]
        t = rank - lo
        # numpy's lerp: from the nearer end, so that t = 1 gives b exactly
        out.append(float(b - (b - a) * (1 - t) if t >= 0.5 else a + (b - a) * t))
    return out


class SampleCosts:
    """Measured per-sample costs of one dataset and the predictions made from them.

    Args:
        size: the dataset's length when it has one (indices outside ``0..size-1``, or keys
            that are not ints, are predicted at the median).
        path_of: the file behind an index, when the dataset lists its files: its size on disk
            is a feature of the learned model.

    Example:
        >>> costs = SampleCosts(4)
        >>> costs.observe([0, 1, 2, 3], [0.001, 0.001, 0.001, 0.050])  # any slow? (warming up)
        False
        >>> [round(float(c), 3) for c in costs.predict([3, 0])]
        [0.05, 0.001]
    """

    def __init__(self, size: int | None, path_of: Callable[[int], str | None] | None = None):
        self._size = size if size is not None and size > 0 else 0
        self._last = np.full(self._size, np.nan, dtype=np.float32)
        self._path_of = path_of
        self._bytes = np.full(self._size, np.nan, dtype=np.float32) if path_of else None
        self._recent = np.zeros(_WINDOW)
        self._count = 0
        self._median = 0.0
        self._mean = 0.0
        self._learnt_at = 0  # samples observed at the last scoring
        self.p99 = 0.0
        """p99 seconds per sample, as of the last :meth:`tail_ratio`."""
        self._median_bytes = 1.0
        self._sized = 0
        self._mlp = CostMlp()
        self.errors = {"history": 0.0, "learned": 0.0}
        """Running mean absolute error of each model, in log(cost) (0.69: off by 2x)."""
        self.model_s = 0.0
        """Seconds spent predicting and learning (the predictor's own cost)."""
        self.slow = 0
        """Samples measured at :data:`SLOW` times the median or more."""
        self.slow_excess_s = 0.0
        """Seconds those samples took beyond the median."""
        self.predicted = 0

    # ------------------------------------------------------------------------------ reading

    @property
    def observed(self) -> int:
        return self._count

    @property
    def median(self) -> float:
        """Median seconds per sample over the recent window (0 before any was measured)."""
        return self._median

    @property
    def mean(self) -> float:
        """Mean seconds per sample over the recent window (0 before any was measured)."""
        return self._mean

    def tail_ratio(self) -> float:
        """p99 / p50 of the recent window (1.0 until a window's worth was measured): how far
        the slowest samples stand from the typical one."""
        if self._count < _WINDOW // 2:
            return 1.0
        p50, p99 = percentiles(self._recent[: min(self._count, _WINDOW)], (50, 99))
        self.p99 = p99
        return float(p99 / p50) if p50 > 0 else 1.0

    def chosen(self) -> str:
        """The model that predicts now: the one with the lower running error."""
        if self._count < _WARMUP or self.errors["history"] <= self.errors["learned"]:
            return "history"
        return "learned"

    def predict(self, indices: Sequence[Any]) -> np.ndarray:
        """Predicted seconds for each of ``indices``."""
        start = time.perf_counter()
        slots = self._slots(indices)
        if self.chosen() == "history":
            out = self._history(slots)
        else:
            out = self._median * np.exp(self._mlp.predict(self._features(slots)))
        self.model_s += time.perf_counter() - start
        self.predicted += len(indices)
        return out

    def report(self) -> dict[str, float | str]:
        """What the predictor did: samples measured, each model's error, the model chosen, its
        own cost (predicting and learning) per measured sample, and the recent tail ratio."""
        return {
            "observed": self._count,
            "history_error": round(self.errors["history"], 4),
            "learned_error": round(self.errors["learned"], 4),
            "chosen": self.chosen(),
            "model_us_per_sample": round(1e6 * self.model_s / max(1, self._count), 3),
            "median_ms": round(1e3 * self._median, 4),
            "mean_ms": round(1e3 * self._mean, 4),
            "tail_ratio": round(self.tail_ratio(), 2),
            "slow_samples": self.slow,
            "slow_excess_s": round(self.slow_excess_s, 3),
        }

    # ------------------------------------------------------------------------------ learning

    def observe(self, indices: Sequence[Any], seconds: Sequence[float]) -> bool:
        """Learn from the measured ``seconds`` of ``indices`` (one batch or part); returns
        whether one of them was slow (see :data:`SLOW`)."""
        if not len(indices):
            return False
        start = time.perf_counter()
        cost = np.maximum(np.asarray(seconds, dtype=np.float64), 1e-6)
        slots = self._slots(indices)
        # Every batch's worth of samples while warming up, then one batch's in four.
        every = _LEARN_SAMPLES // _LEARN_EVERY if self._count < _WARMUP else _LEARN_SAMPLES
        learn = self._count - self._learnt_at >= every or self._count == 0
        if self._count and learn:  # score both models on what they would have said
            self._learnt_at = self._count
            actual = np.log(cost)
            guess = np.log(np.maximum(self._history(slots), 1e-6))
            learned_x = self._features(slots)
            learned = math.log(self._median) + self._mlp.predict(learned_x)
            w = min(1.0, _ERROR_DECAY * len(cost))
            for name, predicted in (("history", guess), ("learned", learned)):
                err = float(np.abs(predicted - actual).mean())
                self.errors[name] += w * (err - self.errors[name])
            target = actual - math.log(self._median)
            for _ in range(_LEARN_EVERY):
                self._mlp.learn(learned_x, target)
        slow = cost[cost >= SLOW * self._median] if self._count >= _WARMUP else cost[:0]
        self.slow += len(slow)
        self.slow_excess_s += float((slow - self._median).sum())
        for value in cost:
            self._recent[self._count % _WINDOW] = value
            self._count += 1
        known = slots >= 0
        self._last[slots[known]] = cost[known]
        window = self._recent[: min(self._count, _WINDOW)]
        middle = len(window) // 2
        self._median = float(np.partition(window, middle)[middle])
        self._mean = float(window.mean())
        self.model_s += time.perf_counter() - start
        return len(slow) > 0

    # ------------------------------------------------------------------------------ internals

    def _slots(self, indices: Sequence[Any]) -> np.ndarray:
        """Each index's place in the history arrays, or -1 (not an int in range)."""
        slots = np.fromiter(
            (i if type(i) is int and 0 <= i < self._size else -1 for i in indices),
            dtype=np.int64,
            count=len(indices),
        )
        return slots

    def _history(self, slots: np.ndarray) -> np.ndarray:
        out = np.full(len(slots), self._median)
        known = slots >= 0
        last = self._last[slots[known]]
        out[known] = np.where(np.isnan(last), self._median, last)
        return out

    def _features(self, slots: np.ndarray) -> np.ndarray:
        x = np.zeros((len(slots), 3))
        known = slots >= 0
        if self._median <= 0:
            return x
        last = self._last[slots[known]]
        seen = ~np.isnan(last)
        column = np.zeros(len(last))
        column[seen] = np.log(np.maximum(last[seen], 1e-6) / self._median)
        x[known, 0] = seen
        x[known, 1] = column
        if self._bytes is not None:
            x[known, 2] = np.log(self._file_bytes(slots[known]) / self._median_bytes)
        return x

    def _file_bytes(self, slots: np.ndarray) -> np.ndarray:
        """Sizes on disk of ``slots`` (stat once per index), the median refreshed as they come."""
        known_bytes = self._bytes
        if known_bytes is None:
            return np.ones(len(slots))
        sizes = known_bytes[slots]
        for j in np.flatnonzero(np.isnan(sizes)):
            path = self._path_of(int(slots[j])) if self._path_of is not None else None
            try:
                size = os.stat(path).st_size if path else 0
            except OSError:
                size = 0
            known_bytes[slots[j]] = sizes[j] = max(1, size)
            self._sized += 1
            if self._sized in (1, 16) or self._sized % 256 == 0:
                self._median_bytes = float(np.median(known_bytes[~np.isnan(known_bytes)]))
        return np.maximum(sizes, 1.0)
