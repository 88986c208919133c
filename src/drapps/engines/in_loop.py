"""Whether the training loop should make its batches itself: the pool engine's try of the
executor with no workers, for batches that cost less to make than to wait for.

A worker pool pays per batch: a task sent, the batch packed, received and handed over, and a
process or thread more on the cores. For a cheap batch (a table's rows, tensors in memory)
that is most of the time, and the loop makes more batches a second alone, as DataLoader's
``num_workers=0`` does. Which side wins depends on the user's ``__getitem__`` and step, so it
is measured: :class:`InLoopRule` watches the pool's batches, and once the loop waits longer
for one than the workers take to make one, the engine tries making them in the loop. The try
is kept only where the loop's time per batch falls by ``margin``; otherwise the workers come
back, and the next try waits twice as long. Kept, the rule keeps watching: once making a
batch in the loop takes ``margin`` times longer than the loop took per batch with the
workers, they come back.

The batches are the same either way: under ``workers="auto"`` every sample is seeded from
``(seed, epoch, index)`` wherever it is made (or, in the loop, checked to draw from no global
generator: :meth:`~drapps.engines.inline.InlineEngine.check_draws`). Where a worker died,
hung or lost a task, no try is made: the workers make a lost batch again and replace a hung
worker, which the loop cannot.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Literal

from drapps.telemetry._sections import format_duration as _dur

Verdict = Literal["try", "keep", "back"]


@dataclass
class InLoopRule:
    """The decision, from the times the pool engine reports per batch.

    Example:
        >>> rule = InLoopRule(warm=0, window=4)
        >>> # the pool: a batch every 1 ms, the loop waiting 0.9 ms of it, 0.2 ms to make one
        >>> [rule.pool_batch(t * 1e-3, 0.9e-3, t * 0.2e-3) for t in range(1, 6)]
        [None, None, None, None, 'try']
        >>> # in the loop: a batch every 0.25 ms
        >>> [rule.loop_batch(5e-3 + t * 0.25e-3, 0.2e-3) for t in range(1, 6)]
        [None, None, None, None, 'keep']
        >>> rule.state, round(rule.gain, 1)
        ('kept', 4.0)
    """

    warm: int = 8
    """Batches passed over before a reading: the pool's first (the workers start), and a
    try's first (the workers finish what they hold and exit)."""
    window: int = 16
    """Batches per reading."""
    margin: float = 1.15
    """The try is kept where the loop's median time per batch falls by this factor, and
    the workers come back where making a batch in the loop takes this factor longer than the
    loop took per batch with them."""
    backoff: int = 64
    """Pool batches before another try after one that was not kept (doubled each time)."""
    state: Literal["pool", "trying", "kept"] = "pool"
    pool_s: float = 0.0
    """The loop's median seconds per batch over the pool's last reading."""
    loop_s: float = 0.0
    """The loop's median seconds per batch over the last reading in the loop."""
    make_s: float = 0.0
    """The workers' seconds making a batch over the pool's last reading."""
    wait_s: float = 0.0
    """The loop's median wait for a batch from the pool over its last reading."""
    tries: int = 0
    why: str | None = None
    """The last decision, in words (None before the first)."""
    _skip: int = 8
    _last: float | None = None
    _gaps: list[float] = field(default_factory=list)
    _times: list[float] = field(default_factory=list)  # waits for the pool; making in the loop
    _made_from: float | None = None

    def __post_init__(self) -> None:
        if self.warm < 0 or self.window < 2 or self.margin < 1 or self.backoff < 1:
            raise ValueError(
                f"InLoopRule needs warm >= 0, window >= 2, margin >= 1 and backoff >= 1, got "
                f"{self.warm}, {self.window}, {self.margin}, {self.backoff}"
            )
        self._skip = self.warm

    @property
    def gain(self) -> float:
        """The loop's time per batch with the workers over its time in the loop."""
        return self.pool_s / self.loop_s if self.loop_s > 0 else 0.0

    def restart(self) -> None:
        """Drop the reading under way: a new epoch (the gap across its start, workers
        starting, is no reading), or a move between the loop and the workers."""
        self._last = None
        self._gaps.clear()
        self._times.clear()
        self._made_from = None

    def pool_batch(self, now: float, waited: float, made_total: float) -> Verdict | None:
        """A batch from the pool reached the loop at ``now`` after it ``waited`` seconds for
        it; ``made_total``: the workers' seconds making batches so far. Returns "try" once
        the loop waits longer for a batch than the workers take to make one."""
        gap, self._last = (None if self._last is None else now - self._last), now
        if self._skip > 0:
            self._skip -= 1
            return None
        if gap is None or self._made_from is None:
            self._made_from = made_total
            return None
        self._gaps.append(gap)
        self._times.append(waited)
        if len(self._gaps) < self.window:
            return None
        self.pool_s = statistics.median(self._gaps)
        self.wait_s = statistics.median(self._times)
        self.make_s = (made_total - self._made_from) / len(self._gaps)
        self._gaps.clear()
        self._times.clear()
        self._made_from = made_total
        if self.make_s <= 0 or self.wait_s <= self.make_s:
            return None
        self.state, self.tries = "trying", self.tries + 1
        self._last, self._skip = None, self.warm  # the workers' exit: no reading
        self.why = (
            f"the loop waited {_dur(self.wait_s)} for a batch the workers made in "
            f"{_dur(self.make_s)}: trying batches made in the training process"
        )
        return "try"

    def loop_batch(self, now: float, made: float) -> Verdict | None:
        """A batch made in the loop (in ``made`` seconds) reached it at ``now``. Returns "keep"
        when a try wins, "back" when the workers should come back (a try that lost, or
        batches that grew dearer than the workers' pace), else None."""
        gap, self._last = (None if self._last is None else now - self._last), now
        if self._skip > 0:
            self._skip -= 1
            return None
        if gap is None:
            return None
        self._gaps.append(gap)
        self._times.append(made)
        if len(self._gaps) < self.window:
            return None
        self.loop_s = statistics.median(self._gaps)
        made_s = statistics.median(self._times)
        self._gaps.clear()
        self._times.clear()
        if self.state == "trying":
            if self.loop_s * self.margin <= self.pool_s:
                self.state = "kept"
                self.why = (
                    f"a batch took {_dur(made_s)} to make here and the loop waited "
                    f"{_dur(self.wait_s)} for one from the workers: made in the training "
                    f"process, a batch every {_dur(self.loop_s)} against {_dur(self.pool_s)} "
                    f"with workers ({self.gain:.1f}x)"
                )
                return "keep"
            self.why = (
                f"made in the training process, a batch every {_dur(self.loop_s)} against "
                f"{_dur(self.pool_s)} with workers: workers kept"
            )
            return self._back()
        if made_s > self.pool_s * self.margin:
            self.why = (
                f"a batch took {_dur(made_s)} to make in the training process, longer than "
                f"the {_dur(self.pool_s)} per batch the loop took with workers: workers back"
            )
            return self._back()
        return None

    def _back(self) -> Verdict:
        self.state = "pool"
        self._skip = self.warm + self.backoff * 2 ** (self.tries - 1)
        self.restart()
        return "back"
