"""The epoch plan: which indices make batch ``b`` of epoch ``e``.

A :class:`Plan` depends only on (dataset length, batch size, shuffle, drop_last, seed, epoch);
a :class:`SampledPlan` holds the batches a sampler drew when the epoch began (an endless
sampler's, a window of them at a time: :class:`SamplerRest`), a :class:`DrawnPlan` draws
them from one of torch's own samplers as they are needed, and a :class:`PassPlan` from a
user's sampler as the training loop asks for each (``workers=0``). None depends on the worker
count, so batch ``b`` is the same list of indices however the pool is sized.
"""

from __future__ import annotations

import itertools
import operator
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, overload

import numpy as np
from torch.utils.data import BatchSampler

from drapps.runtime.sampling import key_of
from drapps.runtime.seeding import ORDER_STREAM, mix_seed

WINDOW = 1024
"""Batches drawn at a time, at most, from a sampler that runs past its ``len()`` (an endless
sampler, as iteration-based training uses): its epoch is planned a window at a time."""

FIRST_WINDOW = 1 << 20
"""Batches a sampler without ``len()`` is drawn for at most when its epoch starts."""

WINDOW_STREAM = 0x77696E646F77  # "window"

Repeats = tuple[int, ...] | None
"""A batch's repeats: for each of its keys, how many times the epoch drew that key before
(None: none was drawn before), which seeds its draws apart
(:func:`~drapps.runtime.seeding.sample_seed_for`)."""


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

    def repeats_of(self, batch_id: int) -> Repeats:
        """None: a permutation draws no key twice."""
        return None


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
    rest: SamplerRest | None = field(default=None, compare=False, repr=False)
    """The sampler's batches past these (None: these end the epoch)."""
    saved_repeats: tuple[Repeats, ...] | None = field(default=None, compare=False, repr=False)
    """Each batch's repeats as a checkpoint saved them, counting the batches before these
    (None: counted from these batches)."""
    runs_out: RunsOut | None = field(default=None, compare=False, repr=False)
    """The sampler's draw at the ``next()`` that finds its pass over, still to be made (None:
    made, or none)."""

    def __len__(self) -> int:
        return self.first + len(self.batches)

    def batch(self, batch_id: int) -> list[Any]:
        """The keys of batch ``batch_id``, in delivery order."""
        if not self.first <= batch_id < len(self):
            raise IndexError(f"batch_id must be in [{self.first}, {len(self)}), got {batch_id!r}")
        return self.batches[batch_id - self.first]

    def repeats_of(self, batch_id: int) -> Repeats:
        """How many times the epoch drew each key of batch ``batch_id`` before (None: none)."""
        self.batch(batch_id)  # an id out of range raises there
        repeats = self._repeats
        return None if repeats is None else repeats[batch_id - self.first]

    @cached_property
    def _repeats(self) -> Sequence[Repeats] | None:
        if self.saved_repeats is not None:
            return self.saved_repeats
        return repeat_table(self.batches)


class RepeatTable(Sequence[Repeats]):
    """Each batch's :data:`Repeats`, held as one array of every place's count and the places
    where batches start: a batch's tuple is made when it is asked for. (A tuple for every
    batch, made as the epoch starts, would hold back its first batch by seconds, and take
    hundreds of MB, for a sampler of millions of samples.)"""

    def __init__(self, counts: np.ndarray, starts: np.ndarray) -> None:
        self._counts = counts
        self._starts = starts
        """Batch ``b``'s counts are ``counts[starts[b]:starts[b + 1]]``."""

    def __len__(self) -> int:
        return len(self._starts) - 1

    @overload
    def __getitem__(self, batch: int) -> Repeats: ...

    @overload
    def __getitem__(self, batch: slice) -> Sequence[Repeats]: ...

    def __getitem__(self, batch: int | slice) -> Repeats | Sequence[Repeats]:
        if isinstance(batch, slice):
            return [self[b] for b in range(*batch.indices(len(self)))]
        if not -len(self) <= batch < len(self):
            raise IndexError(f"batch {batch} of {len(self)}")
        batch %= len(self)
        counts = self._counts[self._starts[batch] : self._starts[batch + 1]]
        return tuple(counts.tolist()) if counts.any() else None


def repeat_table(batches: Sequence[list[Any]]) -> Sequence[Repeats] | None:
    """Each batch's :data:`Repeats`, counted over ``batches`` in order (a key twice in one
    batch: its second place is a repeat); None where no key comes twice."""
    sizes = [len(batch) for batch in batches]
    total = sum(sizes)
    try:
        keys = np.fromiter(
            map(operator.index, itertools.chain.from_iterable(batches)), np.int64, total
        )
    except (TypeError, OverflowError):  # keys that are not int64: count them one by one
        return _counted(batches)
    counts = _earlier(keys)
    if not counts.any():
        return None
    starts = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=starts[1:])
    return RepeatTable(counts.astype(np.int32) if total < 2**31 else counts, starts)


def repeats_in(batches: Sequence[list[Any]]) -> tuple[Repeats, ...] | None:
    """:func:`repeat_table`'s repeats, as a tuple."""
    table = repeat_table(batches)
    return None if table is None else tuple(table)


def _earlier(keys: np.ndarray) -> np.ndarray:
    """For each place in ``keys``, how many places before it hold the same key."""
    earlier = np.zeros(len(keys), dtype=np.int64)
    if len(keys) < 2:
        return earlier
    order = np.argsort(keys, kind="stable")
    ranked = keys[order]
    first = np.ones(len(keys), dtype=bool)
    first[1:] = ranked[1:] != ranked[:-1]
    places = np.arange(len(keys))
    earlier[order] = places - np.maximum.accumulate(np.where(first, places, 0))
    return earlier


def _counted(batches: Sequence[list[Any]]) -> tuple[Repeats, ...] | None:
    """:func:`repeats_in` by a count of each key (any keys)."""
    seen: dict[int, int] = {}
    found = [_count_batch(batch, seen) for batch in batches]
    return tuple(found) if any(r is not None for r in found) else None


def _count_drawn(batch: list[Any] | np.ndarray, seen: np.ndarray) -> Repeats:
    """``batch``'s repeats, given the count ``seen`` of each key in ``range(len(seen))``
    drawn before (updated)."""
    keys = np.asarray(batch, dtype=np.int64)
    repeats = seen[keys] + _earlier(keys)  # a key twice in the batch counts its earlier place
    np.add.at(seen, keys, 1)
    return tuple(repeats.tolist()) if repeats.any() else None


class KeyCounts:
    """How many times each key was drawn so far, to count a batch's repeats as it is drawn: a
    NumPy count per key where keys are small non-negative integers (4 bytes a key up to the
    largest, grown by doubling: 10 MB at most for ImageNet's 1.28M keys, where a dict of them
    holds 40 MB), a dict of them otherwise."""

    DENSE_LIMIT = 1 << 24
    """Keys from here on are counted in the dict (a count per key up to them would not pay)."""

    def __init__(self) -> None:
        self._dense = np.zeros(0, dtype=np.int32)
        self._sparse: dict[int, int] | None = None

    def count(self, batch: list[Any]) -> Repeats:
        """``batch``'s repeats given the batches counted before (it is counted too)."""
        if self._sparse is None:
            keys = _small_keys(batch)
            if keys is not None:
                top = int(keys.max()) + 1 if len(keys) else 0
                if top > len(self._dense):
                    grown = np.zeros(max(top, 2 * len(self._dense)), dtype=np.int32)
                    grown[: len(self._dense)] = self._dense
                    self._dense = grown
                return _count_drawn(keys, self._dense)
            drawn = np.flatnonzero(self._dense)
            self._sparse = dict(zip(drawn.tolist(), self._dense[drawn].tolist(), strict=True))
            self._dense = np.zeros(0, dtype=np.int32)
        return _count_batch(batch, self._sparse)


def _small_keys(batch: list[Any]) -> np.ndarray | None:
    """``batch``'s keys as int64, where all are integers in ``[0, KeyCounts.DENSE_LIMIT)``."""
    try:
        keys = np.fromiter(map(operator.index, batch), np.int64, len(batch))
    except (TypeError, OverflowError):
        return None
    if len(keys) and (keys.min() < 0 or keys.max() >= KeyCounts.DENSE_LIMIT):
        return None
    return keys


def _count_batch(batch: list[Any], seen: dict[int, int]) -> Repeats:
    """``batch``'s repeats, given how many times each key was ``seen`` before (updated)."""
    repeats = []
    for index in batch:
        key = key_of(index)
        count = seen.get(key, 0)
        seen[key] = count + 1
        repeats.append(count)
    return tuple(repeats) if any(repeats) else None


def until_raised(batches: Iterator[list[Any]], raised: list[Exception]) -> Iterator[list[Any]]:
    """``batches`` until they end or raise; what they raised is put in ``raised``. Left
    before then, it leaves ``batches`` open (``yield from`` would close them with it): an
    endless sampler's rest is drawn from them later."""
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except Exception as exc:
            # Its traceback without this frame, which holds ``raised``: a list that holds the
            # error its traceback keeps is a cycle only the garbage collector frees.
            if exc.__traceback__ is not None:
                exc.__traceback__ = exc.__traceback__.tb_next
            raised.append(exc)
            return
        yield batch


def first_window(
    batches: Iterator[list[Any]], length: int | None
) -> tuple[list[list[Any]], list[Any] | None]:
    """The batches a sampler of ``len()`` ``length`` (None: none) is drawn for when its epoch
    starts, and the one after them (None: the sampler ended there).

    With a ``len()``, that many, as DataLoader's ``len()`` counts them; without, until a key
    comes again (an endless sampler's first pass), or :data:`FIRST_WINDOW` batches.
    """
    if length is None:
        return draw_up_to(batches, FIRST_WINDOW, distinct=True)
    return draw_up_to(batches, length)


def draw_up_to(
    batches: Iterator[list[Any]], limit: int, *, distinct: bool = False
) -> tuple[list[list[Any]], list[Any] | None]:
    """Up to ``limit`` of ``batches``, and the one after them (None: they ended first).

    ``distinct``: end also before a batch that holds a key already drawn (an endless
    sampler's first pass, where it has no ``len()``).
    """
    if not distinct:
        drawn = list(itertools.islice(batches, limit))
        return drawn, (next(batches, None) if len(drawn) == limit else None)
    drawn = []
    seen: set[int] = set()
    for batch in batches:
        if len(drawn) == limit:
            return drawn, batch
        keys = {key_of(key) for key in batch}
        if drawn and not seen.isdisjoint(keys):
            return drawn, batch
        seen |= keys
        drawn.append(batch)
    return drawn, None


class RunsOut:
    """The draw a sampler makes at the ``next()`` that finds its pass over, put off until
    DataLoader's iterator would make it.

    torch's ``RandomSampler`` draws once more from its generator there (the ``randperm`` of
    an empty remainder). DataLoader asks its sampler for that ``next()`` as it reaches the
    end: without workers at the loop's ``next()`` for batch :attr:`at`, with them once the
    loop has that batch (their prefetch is then that far ahead). A loop that leaves the epoch
    sooner leaves the generator where DataLoader's leaves it.
    """

    def __init__(self, keys: Iterator[Any] | None, at: int, error: Exception | None = None) -> None:
        self._keys = keys
        self._lock = threading.Lock()  # the loop's next() and a checkpoint from another thread
        self.at = at
        """The batch the loop's ``next()`` is at when the draw is made."""
        self._error = error

    def reached(self, position: int, *, loop: bool = True) -> None:
        """The loop's ``next()`` is at batch ``position`` (``loop=False``: a checkpoint asks
        for the draw): the draw is made there (once). Where the sampler's pass raised (a
        ``RunsOut`` made with ``error``), the loop's ``next()`` raises that there, once."""
        if (self._keys is None and self._error is None) or position < self.at:
            return
        with self._lock:
            keys, self._keys = self._keys, None
            if keys is not None:
                next(keys, None)
            error = self._error if loop else None
            if error is not None:
                self._error = None
                try:
                    raise error
                finally:
                    del error  # the frame its traceback keeps must not hold it: a cycle

    def __reduce__(self) -> tuple[Any, ...]:
        return RunsOut, (None, self.at)  # a copy (or a pickle) has no sampler to draw from


def running_out_late(
    keys: Iterator[Any],
    count: int,
    batching: tuple[int, bool] | None,
    ahead: int,
    seed: int,
    epoch: int,
) -> SampledPlan:
    """The plan of a sampler whose ``count`` keys come from ``keys`` and whose last draw is at
    the ``next()`` past them (see :class:`RunsOut`), batched as torch's ``BatchSampler``
    batches them (``batching``: its batch size and ``drop_last``; None: one key a batch).

    The keys are drawn now; the last draw when DataLoader's iterator, its workers ``ahead``
    batches ahead of the loop, would ask for the batch that makes it: the short last batch
    (its keys run out), else the one past the end.
    """
    taken = list(itertools.islice(keys, count))
    if batching is None:
        batches, last = [[key] for key in taken], len(taken)
    else:
        size, drop_last = batching
        batches = list(BatchSampler(taken, size, drop_last))
        short = len(taken) % size != 0
        last = len(batches) - 1 if short and not drop_last else len(batches)
    runs_out = RunsOut(keys, last - ahead)
    if runs_out.at < 0:  # within DataLoader's first prefetch, made as its iterator starts
        runs_out.reached(0)
    return SampledPlan(tuple(batches), seed, epoch, runs_out=runs_out)


class SamplerRest:
    """What a sampler has still to give past a plan: its next batch, drawn to learn that there
    is one, and its iterator. :meth:`window` plans the next window of them.

    Each window's samples are seeded with a seed of their own, derived from the epoch's and
    the window's first batch id, and by their repeats within it, so each time an endless
    sampler gives a key it draws its augmentation anew.
    """

    def __init__(
        self,
        batches: Iterator[list[Any]],
        head: list[Any],
        base_seed: int,
        first: int,
        *,
        ahead: int = 0,
    ) -> None:
        self._batches = batches
        self._head = head
        self.base_seed = base_seed
        """The epoch's seed (the first window's)."""
        self.first = first
        """The id of the next batch: how many the sampler has given before it."""
        self.ahead = ahead
        """How many batches DataLoader's workers ask the sampler for ahead of the loop (0:
        without workers, each at the loop's own ``next()``)."""

    def window(self, epoch: int) -> SampledPlan:
        """The next window's plan (at least one batch), its ids from :attr:`first` on: up
        to :data:`WINDOW` batches.

        Where the sampler raises partway, the window is the batches it gave before, and the
        loop's ``next()`` raises the error where DataLoader's would: at the batch that asks
        the sampler for the one that failed, its workers' prefetch ahead of the loop (not
        before the window's first); the batches before it are all delivered."""
        raised: list[Exception] = []
        batches = until_raised(itertools.chain([self._head], self._batches), raised)
        drawn, after = draw_up_to(batches, WINDOW)
        seed = window_seed(self.base_seed, self.first)
        if raised:
            at = max(self.first + len(drawn) - self.ahead, self.first)
            runs_out = RunsOut(None, at, raised[0])
            return SampledPlan(tuple(drawn), seed, epoch, first=self.first, runs_out=runs_out)
        rest = None
        if after is not None:
            first = self.first + len(drawn)
            rest = SamplerRest(self._batches, after, self.base_seed, first, ahead=self.ahead)
        return SampledPlan(tuple(drawn), seed, epoch, first=self.first, rest=rest)


def rest_of(plan: EpochPlan | None) -> SamplerRest | None:
    """What an endless sampler has still to give past ``plan`` (None: ``plan`` is all)."""
    return plan.rest if isinstance(plan, SampledPlan | PassPlan) else None


def window_seed(base_seed: int, first: int) -> int:
    """The seed of an endless sampler's window from batch ``first`` on (0: the epoch's)."""
    return base_seed if first == 0 else mix_seed(WINDOW_STREAM, base_seed, first) >> 1


class DrawnPlan:
    """An epoch whose batches one of torch's samplers draws as they are needed, as DataLoader
    draws them: an ImageNet-size epoch does not wait for every batch to be drawn first.

    Only for a sampler whose random draws all happen with its first batch (torch's
    ``RandomSampler`` without a generator seeds a private one from torch's global generator
    then; ``SequentialSampler`` draws nothing) and whose length is exact: the first batch is
    drawn here, in the thread that starts the epoch, and the rest in whichever thread asks,
    from the sampler's private state alone, so every batch is the one DataLoader's would be.
    """

    def __init__(
        self,
        batches: Iterator[list[Any]],
        length: int,
        seed: int,
        epoch: int,
        *,
        keys: int | None = None,
    ):
        self._source = batches
        self._drawn: list[list[Any]] = []
        # A sampler with replacement of keys in range(keys): each batch's repeats, counted as
        # it is drawn (4 bytes a key).
        self._seen = np.zeros(keys, dtype=np.int32) if keys is not None else None
        self._repeats: list[Repeats] = []
        self._length = length
        self.seed = seed
        """Seeds each sample's augmentation with (seed, epoch, index)."""
        self.epoch = epoch
        """Epoch number."""
        self.first = 0
        self._lock = threading.Lock()
        if length:
            self.batch(0)
        else:  # DataLoader starts the sampler for an epoch of no batch too: its draws happen
            next(self._source, None)

    def __len__(self) -> int:
        return self._length

    def batch(self, batch_id: int) -> list[Any]:
        """The keys of batch ``batch_id``, in delivery order (drawn up to it now if need be)."""
        if not 0 <= batch_id < self._length:
            raise IndexError(f"batch_id must be in [0, {self._length}), got {batch_id!r}")
        with self._lock:
            drawn = self._drawn
            while len(drawn) <= batch_id:
                batch = next(self._source, None)
                if batch is None:
                    raise RuntimeError(
                        f"the sampler gave {len(drawn)} batches where its len() promised "
                        f"{self._length}"
                    )
                drawn.append(list(batch))
                if self._seen is not None:
                    self._repeats.append(_count_drawn(drawn[-1], self._seen))
            return drawn[batch_id]

    def repeats_of(self, batch_id: int) -> Repeats:
        """How many times the epoch drew each key of batch ``batch_id`` before (None: none)."""
        self.batch(batch_id)
        return self._repeats[batch_id] if self._seen is not None else None


class PassPlan:
    """An epoch whose batches a sampler of the user's gives as the training loop asks for them
    (``workers=0``), as DataLoader without workers draws them: each batch at the ``next()``
    that makes it, so a sampler that draws from torch's global generator with each batch
    draws between the training steps, as under DataLoader.

    Its length is the sampler's ``len()`` until the sampler ends sooner; :meth:`reaches` tells
    whether there is a batch ``b``, drawing up to it. A sampler that fails ends the pass: its
    error is raised once, where the batch it failed to give was asked for. Past its ``len()``
    the sampler goes on as an endless one (:attr:`rest`), as a :class:`SampledPlan` would.
    """

    def __init__(self, batches: Iterator[list[Any]], length: int, seed: int, epoch: int) -> None:
        self._source = batches
        self._drawn: list[list[Any]] = []
        self._seen = KeyCounts()
        self._repeats: list[Repeats] = []
        self._length = length
        self._error: Exception | None = None
        self._rest: SamplerRest | None = None
        self._over = False  # the sampler ended, failed, or was drawn past its len()
        self._lock = threading.Lock()
        self.seed = seed
        """Seeds each sample's augmentation with (seed, epoch, index)."""
        self.epoch = epoch
        """Epoch number."""
        self.first = 0

    def __len__(self) -> int:
        return self._length

    def reaches(self, batch_id: int) -> bool:
        """Whether the pass has a batch ``batch_id``, drawing up to it now.

        Raises:
            Exception: the sampler's, where it failed to give that batch (once).
        """
        with self._lock:
            self._draw_to(batch_id)
            if batch_id < len(self._drawn):
                return True
            error, self._error = self._error, None
        if error is not None:
            try:
                raise error
            finally:
                del error  # see RunsOut.reached
        return False

    @property
    def over(self) -> bool:
        """Whether the pass's end is known (the sampler ended, failed, or was asked for the
        batch past its ``len()``): until then, the ``next()`` past the last batch drawn asks
        the sampler, as DataLoader's does."""
        return self._over

    def draw_all(self) -> SamplerRest | None:
        """Draw the rest of the pass, and whether the sampler goes on past its ``len()`` (a
        checkpoint holds them): :attr:`rest`. A sampler's failure is not raised here; it
        waits for the ``next()`` that asks for the batch it failed to give."""
        with self._lock:
            self._draw_rest()
            return self._rest

    @property
    def rest(self) -> SamplerRest | None:
        """The sampler's batches past its ``len()`` (None: the pass ends there), drawn to learn
        whether there is one once the pass has given its batches. The sampler's error, where
        it failed, is raised (once) instead, as DataLoader's ``next()`` raises it."""
        with self._lock:
            self._draw_rest()
            error, self._error = self._error, None
        if error is not None:
            try:
                raise error
            finally:
                del error  # see RunsOut.reached
        return self._rest

    def batch(self, batch_id: int) -> list[Any]:
        """The keys of batch ``batch_id``, in delivery order (drawn up to it now if need be)."""
        if not self.reaches(batch_id):
            raise IndexError(f"batch_id must be in [0, {len(self._drawn)}), got {batch_id!r}")
        return self._drawn[batch_id]

    def repeats_of(self, batch_id: int) -> Repeats:
        """How many times the epoch drew each key of batch ``batch_id`` before (None: none)."""
        self.batch(batch_id)
        return self._repeats[batch_id]

    def _draw_to(self, batch_id: int) -> None:
        while not self._over and len(self._drawn) <= min(batch_id, self._length - 1):
            try:
                batch = next(self._source)
            except StopIteration:
                self._end()
            except Exception as exc:  # DataLoader's next() raises it, and its pass is over
                self._end()
                self._error = exc
            else:
                self._drawn.append(list(batch))
                self._repeats.append(self._seen.count(self._drawn[-1]))

    def _draw_rest(self) -> None:
        self._draw_to(self._length - 1)
        if self._over:
            return
        self._over = True
        try:
            after = next(self._source)
        except StopIteration:
            return
        except Exception as exc:
            self._error = exc
            return
        self._rest = SamplerRest(self._source, after, self.seed, len(self._drawn))

    def _end(self) -> None:
        self._over, self._length = True, len(self._drawn)


EpochPlan = Plan | SampledPlan | DrawnPlan | PassPlan
"""What a loader iterates: its own seeded order, or a sampler's."""
