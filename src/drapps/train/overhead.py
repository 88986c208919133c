"""OverheadGuard: decides, from per-step timings, whether a measurement costs too much.

One slow step on a busy machine must not switch a piece off, and every rank of a distributed
run must reach the same verdict. So the guard waits for ``window`` steps, takes each step's
share (measurement seconds / step seconds), and switches off only when the ``quantile``-th share
is above the limit, by default when three quarters of the steps were over it. Under
``torch.distributed`` the ranks average that quantile before comparing, so they agree.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import torch
import torch.distributed as dist


@dataclass
class OverheadGuard:
    """Collects per-step shares and gives one verdict after ``window`` steps.

    Args:
        limit: the share of step time above which the measurement is switched off.
        window: steps to collect before deciding.
        quantile: which quantile of the shares must exceed ``limit`` (0.25: three quarters of
            the steps were over it).

    Example:
        >>> guard = OverheadGuard(limit=0.1, window=4)
        >>> for measure_s in (0.01, 0.3, 0.01, 0.01):  # one slow step among four
        ...     guard.record(measure_s, step_s=1.0)
        >>> guard.verdict(), guard.reason
        (False, None)
    """

    limit: float
    window: int = 20
    quantile: float = 0.25
    shares: list[float] = field(default_factory=list)
    measure_s: float = 0.0
    step_s: float = 0.0
    decided: bool | None = None
    """None while collecting; True once switched off; False once kept."""
    reason: str | None = None
    """Why it was switched off, in words (None while on)."""
    typical: float | None = None
    """The share that decided (the ranks' mean of the quantile), once decided."""

    def __post_init__(self) -> None:
        if not self.limit > 0:
            raise ValueError(f"limit must be > 0, got {self.limit!r}")
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window!r}")
        if not 0.0 <= self.quantile <= 1.0:
            raise ValueError(f"quantile must be in [0, 1], got {self.quantile!r}")

    def record(self, measure_s: float, step_s: float) -> None:
        """One step's measurement time and whole step time (ignored once decided)."""
        if self.decided is not None or step_s <= 0.0:
            return
        self.measure_s += measure_s
        self.step_s += step_s
        self.shares.append(min(1.0, measure_s / step_s))

    @property
    def share(self) -> float:
        """Measurement share of step time over the steps recorded (frozen once decided)."""
        return self.measure_s / self.step_s if self.step_s > 0 else 0.0

    def verdict(self) -> bool:
        """Whether to switch the measurement off now (decided once, after ``window`` steps)."""
        if self.decided is not None or len(self.shares) < self.window:
            return bool(self.decided)
        ordered = sorted(self.shares)
        typical = ordered[min(len(ordered) - 1, int(self.quantile * len(ordered)))]
        typical = _mean_over_ranks(typical)
        self.typical = typical
        self.decided = typical > self.limit
        if self.decided:
            self.reason = (
                f"measuring took {typical:.0%} of step time on {1 - self.quantile:.0%} of "
                f"{len(self.shares)} steps (median {statistics.median(self.shares):.0%}), "
                f"over the {self.limit:.0%} limit"
            )
        return self.decided


def _mean_over_ranks(value: float) -> float:
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return value
    tensor = torch.tensor([value], dtype=torch.float64)
    if dist.get_backend() == "nccl":
        tensor = tensor.cuda()
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return float(tensor.item()) / dist.get_world_size()
