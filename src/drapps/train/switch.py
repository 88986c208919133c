"""An optimisation that times itself on and off for a few steps and keeps itself only if it pays.

An optimisation's overhead can exceed its benefit (fp16 autocast on a CPU, checkpointing a model
that fits anyway). So each one is tried both ways on the real training steps, interleaved, and
the verdict is logged.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable

logger = logging.getLogger(__name__)


class OffSwitch:
    """A/B trial of one optimisation over real training steps, then a logged verdict.

    The first ``warmup_steps`` steps run with it on and are not timed (allocation, autotuning);
    then it alternates on and off for ``2 * trial_steps`` steps, timed by the caller through
    :meth:`record`. It stays on when its throughput is within ``tolerance`` of the plain one or
    better, or when ``needed()`` says it is required regardless (e.g. memory would not fit).

    Args:
        name: what is being tried, for the log.
        trial_steps: timed steps per arm.
        warmup_steps: untimed steps before the trial.
        tolerance: the slowdown accepted for the optimisation's other benefits.
        needed: called once at the verdict; True keeps the optimisation whatever it costs.

    Example:
        >>> switch = OffSwitch("amp", trial_steps=2, warmup_steps=0)
        >>> for seconds in [0.5, 1.0, 0.5, 1.0]:  # on, off, on, off
        ...     switch.record(seconds, items=32)
        >>> switch.enabled, switch.verdict
        (True, 'amp: kept: 2.00x the throughput without it')
    """

    def __init__(
        self,
        name: str,
        trial_steps: int = 4,
        warmup_steps: int = 2,
        tolerance: float = 0.05,
        needed: Callable[[], bool] | None = None,
    ) -> None:
        if trial_steps < 1:
            raise ValueError(f"trial_steps must be >= 1, got {trial_steps!r}")
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps!r}")
        if tolerance < 0:
            raise ValueError(f"tolerance must be >= 0, got {tolerance!r}")
        self.name = name
        self.trial_steps = trial_steps
        self.warmup_steps = warmup_steps
        self.tolerance = tolerance
        self.needed = needed
        self.steps = 0
        self.rates: dict[bool, list[float]] = {True: [], False: []}
        self.decided: bool | None = None
        self.verdict = f"{name}: on trial"

    @property
    def enabled(self) -> bool:
        """Whether the optimisation should be on for the coming step."""
        if self.decided is not None:
            return self.decided
        trial = self.steps - self.warmup_steps
        return trial < 0 or trial % 2 == 0

    def record(self, seconds: float, items: int) -> None:
        """Report the step just run with :attr:`enabled`'s setting: its time and items."""
        if seconds <= 0 or items < 1:
            raise ValueError(f"need seconds > 0 and items >= 1, got {seconds!r}, {items!r}")
        if self.decided is None and self.steps >= self.warmup_steps:
            self.rates[self.enabled].append(items / seconds)
        self.steps += 1
        if self.decided is None and min(len(r) for r in self.rates.values()) >= self.trial_steps:
            self._decide()

    def _decide(self) -> None:
        on = statistics.median(self.rates[True])
        off = statistics.median(self.rates[False])
        ratio = on / off
        if self.needed is not None and self.needed():
            self.decided = True
            self.verdict = f"{self.name}: kept because it is needed ({ratio:.2f}x the throughput)"
        elif ratio >= 1.0 - self.tolerance:
            self.decided = True
            self.verdict = f"{self.name}: kept: {ratio:.2f}x the throughput without it"
        else:
            self.decided = False
            self.verdict = (
                f"{self.name}: switched off: {ratio:.2f}x the throughput without it "
                f"({on:.1f} vs {off:.1f} items/s)"
            )
        (logger.info if self.decided else logger.warning)("%s", self.verdict)
