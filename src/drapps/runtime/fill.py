"""Ready fill: batches formed from the samples that are made, so none waits on a straggler.

With ``defer_after`` set, the dispatcher does not assemble planned batches. Every sample that
comes back (in a part of its planned batch) joins a pool keyed by its place in the plan, and
delivery ``k`` takes, in plan order,

- the first ``size_k`` samples still owed, once they are all made (the planned batch when
  nothing was deferred before it), or
- once the training loop has waited ``defer_after`` seconds for them, the first ``size_k``
  samples that are made: a straggler joins a later delivery instead, and samples planned for
  later batches fill its place (but not a repeat of the straggler's key: a key the plan gives
  again is delivered in the plan's order of its repeats, each of which draws its own).

``size_k`` is the planned batch's size, so an epoch has as many batches as planned and every
sample comes exactly once. This gives up what the seed fixes (which samples form batch ``b``)
for never waiting on one slow sample, MinatoLoader's trade; each delivery says which samples
it holds (their places in the plan), so ``state_dict`` resumes with exactly the samples still
owed and a recorded epoch replays bit for bit through a batch sampler.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from drapps.runtime.plan import EpochPlan
from drapps.runtime.sampling import key_of

Place = tuple[int, int]
"""A sample's place in the plan: (batch id, position in the batch)."""


@dataclass
class Filled:
    """One delivery's samples, in plan order."""

    slot: int
    """Its delivery number (the batch id the training loop sees)."""
    places: list[Place]
    keys: list[Any]
    samples: list[Any]
    """The made samples (places that were skipped are left out)."""
    skipped: list[tuple[Any, str]] = field(default_factory=list)
    error: BaseException | None = None
    """The error of its first sample that failed (``on_error="raise"``)."""


class ReadyFill:
    """The pool of made samples of one epoch, and the deliveries formed from it.

    Args:
        plan: the epoch's plan.
        start: the first batch id delivered (a resumed epoch starts past 0).
    """

    def __init__(self, plan: EpochPlan, start: int) -> None:
        self._plan = plan
        self.slot = start
        self._end = len(plan)
        self._keys: dict[Place, Any] = {}
        self._owed: dict[Place, None] = {}  # insertion-ordered: plan order
        for batch_id in range(start, self._end):
            for position, key in enumerate(plan.batch(batch_id)):
                self._owed[batch_id, position] = None
                self._keys[batch_id, position] = key
        # A plan that gives a key again: its repeats are delivered in order (see form()).
        self._repeating = any(plan.repeats_of(b) is not None for b in range(start, self._end))
        self._made: dict[Place, Any] = {}
        self._skipped: dict[Place, str] = {}
        self._failed: dict[Place, BaseException] = {}
        self._parts: set[tuple[int, int]] = set()
        self.deferred = 0
        """Samples that joined a later delivery than planned."""

    @property
    def done(self) -> bool:
        return self.slot >= self._end

    def has(self, batch_id: int, part: int) -> bool:
        """Whether part ``part`` of ``batch_id`` came back already (a duplicate)."""
        return (batch_id, part) in self._parts

    @property
    def pooled(self) -> int:
        """Samples made and not delivered yet."""
        return len(self._made) + len(self._skipped) + len(self._failed)

    def add(
        self,
        batch_id: int,
        part: int,
        places: Sequence[int],
        samples: Sequence[Any],
        kept: Sequence[int],
        skipped: Sequence[tuple[Any, str]],
    ) -> None:
        """Part ``part`` of ``batch_id`` came back: its samples, made at the batch positions
        ``places[kept[i]]``, the rest skipped (under ``on_error="skip"``)."""
        self._parts.add((batch_id, part))
        kept_set = set(kept)
        for local, sample in zip(kept, samples, strict=True):
            self._made[batch_id, places[local]] = sample
        lost = [p for i, p in enumerate(places) if i not in kept_set]
        for position, (_, message) in zip(lost, skipped, strict=True):
            self._skipped[batch_id, position] = message

    def skip(self, batch_id: int, part: int, places: Sequence[int], message: str) -> None:
        """Part ``part`` could not be made and samples that fail are skipped: so are these."""
        self._parts.add((batch_id, part))
        for position in places:
            self._skipped[batch_id, position] = message

    def fail(self, batch_id: int, part: int, places: Sequence[int], error: BaseException) -> None:
        """Part ``part`` failed and failures raise: the delivery that takes its samples
        raises ``error``."""
        self._parts.add((batch_id, part))
        for position in places:
            self._failed[batch_id, position] = error

    def _here(self, place: Place) -> bool:
        return place in self._made or place in self._skipped or place in self._failed

    def form(self, waited_s: float | None, defer_after: float) -> Filled | None:
        """The next delivery, or None while it should wait (see the module docstring).

        Args:
            waited_s: how long the training loop has been waiting for it (None: not waiting).
            defer_after: seconds of that wait after which made samples fill it.
        """
        if self.done:
            return None
        size = len(self._plan.batch(self.slot))
        head = []
        for place in self._owed:
            head.append(place)
            if len(head) == size:
                break
        if all(self._here(p) for p in head):
            return self._take(head)
        if waited_s is None or waited_s < defer_after:
            return None
        if self.pooled < min(size, len(self._owed)):
            return None  # not enough made yet: keep waiting for whichever comes first
        ready = []
        passed: set[int] = set()  # keys passed over: a later repeat of one waits for it
        for place in self._owed:  # made samples sit within the dispatcher's lookahead
            key = key_of(self._keys[place]) if self._repeating else 0
            if self._here(place) and key not in passed:
                ready.append(place)
                if len(ready) == size:
                    break
            elif self._repeating:
                passed.add(key)
        if len(ready) < min(size, len(self._owed)):
            return None  # made ones are repeats of a straggler's key: wait for it
        self.deferred += sum(p not in ready for p in head)
        return self._take(ready)

    def _take(self, places: list[Place]) -> Filled:
        filled = Filled(self.slot, places, [self._keys[p] for p in places], [])
        for place in places:
            del self._owed[place]
            if place in self._skipped:
                filled.skipped.append((self._keys[place], self._skipped.pop(place)))
            elif place in self._failed:
                error = self._failed.pop(place)
                filled.error = filled.error or error
            else:
                filled.samples.append(self._made.pop(place))
        self.slot += 1
        return filled
