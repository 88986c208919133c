"""Where a loader's iteration stands: the next epoch and batch, its plan, and resume state.

Each ``iter(loader)`` asks the cursor for the next :class:`~drapps.engines.base.EpochJob`; the
cursor plans it (from the loader's seed, or by drawing the sampler's batches once), and its
``state_dict`` / ``load_state_dict`` save and restore the position, as torchdata's nodes keep
their own state.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch

from drapps.engines.base import EpochJob
from drapps.engines.sharding import RankShard
from drapps.runtime.config import LoaderConfig, checked_index
from drapps.runtime.plan import (
    DrawnPlan,
    EpochPlan,
    PassPlan,
    Plan,
    Repeats,
    RunsOut,
    SampledPlan,
    SamplerRest,
    draw_up_to,
    first_window,
    rest_of,
    running_out_late,
    until_raised,
)
from drapps.runtime.sampling import (
    batch_lists,
    checked_generator_state,
    draw_base_seed,
    draw_batches,
    drawn_as_needed,
    generator_state,
    is_datapipe,
    is_iterable_dataset,
    key_type,
    plain_key,
    planned_length,
    restore_keys,
    runs_out_late,
)
from drapps.runtime.stream import pipe_seed

_STATE_VERSION = 2

_Stream = tuple[int, int, list[dict[str, Any]] | None, int | None]
"""A resumed stream: its seed, its workers, each one's RNG states (or None), its pipe seed (or
None: derived from the seed)."""


class Positioned(Protocol):
    """What the cursor reads of the epoch under way (an :class:`~drapps.engines.epoch.Epoch`)."""

    epoch: int
    position: int
    plan: EpochPlan | None
    seed: int
    """The epoch's base seed (drawn, when the loader has no ``seed``)."""
    streams: int | None
    """An iterable dataset's epoch: the workers streaming it (0: the training process)."""
    rngs: list[dict[str, Any]] | None
    """Persistent stream workers: each one's RNG states at the start of the epoch."""
    pipe_seed: int
    """An ``IterDataPipe``'s shared seed in this epoch (0 for any other dataset)."""

    @property
    def ended(self) -> bool:
        """The loop has seen the epoch's end."""
        ...

    on_let_go: Callable[[Any], bool] | None
    """Called with the epoch when it is let go of before its end; returns whether nothing
    takes its place (its engine's workers may go)."""

    def undelivered(self) -> list[int] | None: ...

    def draw_order(self) -> None: ...

    @property
    def undrawn(self) -> Callable[[], EpochPlan] | None:
        """What draws the epoch's order at its first ``next()`` (None: drawn)."""
        ...

    def owed(self) -> tuple[list[list[Any]], list[Repeats]] | None: ...

    @property
    def needs_engine(self) -> bool:
        """Whether the loader's engine makes its batches, or will from its next ``next()``."""
        ...


@dataclass(frozen=True)
class Standing:
    """Where an epoch under way stands, as a checkpoint reads it: its position, its plan, the
    batches still owed, and a stream's seeds. Read while its iterator lives, or kept as it
    stood when the loop let go of the iterator before its end (a loop that breaks out)."""

    epoch: int
    next_batch: int
    plan: EpochPlan | None
    remaining: list[int] | None
    owed: tuple[list[list[Any]], list[Repeats]] | None
    stream: _Stream | None
    undrawn: Callable[[], EpochPlan] | None = None
    """What draws the epoch's order, where it was let go of before its first ``next()``."""

    @classmethod
    def of(cls, epoch: Positioned) -> Standing:
        stream = None
        if epoch.streams is not None:
            stream = (epoch.seed, epoch.streams, epoch.rngs, epoch.pipe_seed)
        return cls(
            epoch.epoch, epoch.position, epoch.plan, epoch.undelivered(), epoch.owed(), stream,
            epoch.undrawn,
        )  # fmt: skip

    def drawn(self) -> Standing:
        """This standing with its order drawn, as a checkpoint draws an epoch not yet drawn
        (a sampler that fails leaves it at its start, to be drawn again when resumed)."""
        if self.undrawn is None:
            return self
        try:
            plan: EpochPlan | None = self.undrawn()
        except Exception:
            plan = None
        return replace(self, plan=plan, undrawn=None)


@dataclass(frozen=True)
class _Undrawn:
    """An epoch whose sampler draws its order at the iterator's first ``next()``."""

    epoch: int
    seed: int
    draw: Callable[[], EpochPlan]


def _worker_settings(config: LoaderConfig) -> dict[str, Any]:
    """What a cursor reads of the loader's workers: persistent ones draw one base seed for
    all epochs; without workers, or under "auto", the order is drawn in the training
    process; ``as_asked``: the user asked for none; ``ahead``: batches DataLoader's iterator
    asks its sampler for ahead of the loop (its workers' prefetch; "auto" is held to
    DataLoader without workers)."""
    workers = config.workers if isinstance(config.workers, int) else 0
    return {
        "persistent": config.persistent_workers,
        "in_process": config.workers in (0, "auto"),
        "as_asked": config.workers == 0,
        "ahead": workers * (config.prefetch_factor or 2),
    }


class EpochCursor:
    """The epoch and batch the next ``iter(loader)`` starts from.

    Args:
        dataset: the dataset (its length is read when an epoch is planned).
        index_sampler: the batch sampler (or the sampler, without batching) DataLoader
            would iterate.
        user_sampler: the sampler or batch sampler the user gave (None: drapps plans).
        seed: the loader's seed (None: drawn from torch's RNG per iterator, as DataLoader).
        generator: the torch generator the base seed is drawn from.
        batch_size, shuffle, drop_last: the batching (``batch_size`` None with a batch
            sampler or without batching).
        batched: batches are collated (a sampler's keys are grouped by the batch sampler).
        iterable: the dataset is iterable: no plan, only the epoch and batch counts.
        persistent: one base seed for all epochs (DataLoader draws it once per iterator).
        shard_by_rank: under torch.distributed with no distributed sampler, read this rank's
            share (:class:`~drapps.engines.sharding.RankShard`).
        in_process: the loader stands in for DataLoader without workers (``workers`` 0 or
            "auto"): a sampler's order is drawn at the iterator's first ``next()``, where
            DataLoader with workers draws it as the iterator is made.
        as_asked: the training process makes each batch as the loop asks for it
            (``workers=0``): a user's sampler with a ``len()`` gives each batch then
            (:class:`~drapps.runtime.plan.PassPlan`), as under DataLoader without workers.
    """

    def __init__(
        self,
        dataset: Any,
        index_sampler: Iterable[Any] | None,
        user_sampler: Any,
        *,
        seed: int | None,
        generator: torch.Generator | None,
        batch_size: int | None,
        shuffle: bool,
        drop_last: bool,
        batched: bool,
        iterable: bool,
        persistent: bool,
        shard_by_rank: bool = True,
        in_process: bool = False,
        as_asked: bool = False,
        ahead: int = 0,
    ) -> None:
        self._dataset, self._index_sampler, self._user_sampler = (
            dataset,
            index_sampler,
            user_sampler,
        )
        self._seed, self._generator = seed, generator
        self._batching = (batch_size, shuffle, drop_last)
        self._batched, self._iterable, self._persistent = batched, iterable, persistent
        self._in_process, self._as_asked, self._ahead = in_process, as_asked, ahead
        self._shard = RankShard(
            dataset,
            user_sampler,
            enabled=shard_by_rank and not iterable,
            shuffle=shuffle,
            seed=seed,
            batch_size=batch_size,
            drop_last=drop_last,
        )
        self._lock = threading.Lock()
        self._next_epoch = 0
        self._next_batch = 0
        # The epoch after a resumed one, where an iterator beside it had run the next number.
        self._then: int | None = None
        self._pending: SampledPlan | None = None
        # A resumed endless epoch: the batches its sampler had given, and the epoch's seed.
        self._pending_rest: tuple[int, int] | None = None
        # A resumed stream's (seed, workers, each worker's RNG states or None, pipe seed).
        self._pending_stream: _Stream | None = None
        self._datapipe = is_datapipe(dataset)
        self._base_seed: int | None = None
        self.epochs_started = 0
        self.reported: int | None = None
        """The length ``len(loader)`` last reported for an iterable dataset (None: never
        asked): a stream that yields more batches gets DataLoader's warning."""
        # A weak reference: the iterator holds the loader, not the other way round. Let go
        # of before its end, it leaves what a checkpoint reads of it (``_left``), as
        # torchdata's stateful loader, which holds its iterator, would still read it.
        self._active: Callable[[], Positioned | None] = lambda: None
        self._serial = 0  # the epoch under way's; a later one's start, or a load, moves it
        self._left: Standing | None = None
        # Epochs a newer iterator took the engine from while they had batches left (weakly,
        # oldest first): the latest still held is the one under way again once the newer ends.
        self._aside: list[weakref.ref[Any]] = []

    @classmethod
    def of(
        cls,
        config: LoaderConfig,
        dataset: Any,
        index_sampler: Iterable[Any] | None,
        user_sampler: Any,
        generator: torch.Generator | None,
        batched: bool,
    ) -> EpochCursor:
        """The cursor of a loader with ``config`` (its batch size is None when batches come
        from a batch sampler, which DataLoader's rules refuse with ``drop_last``)."""
        return cls(
            dataset,
            index_sampler,
            user_sampler,
            seed=config.seed,
            generator=generator,
            batch_size=config.batch_size,
            shuffle=config.shuffle,
            drop_last=config.drop_last,
            batched=batched,
            iterable=is_iterable_dataset(dataset),
            shard_by_rank=config.shard_by_rank,
            **_worker_settings(config),
        )

    def runs_with(self, config: LoaderConfig) -> None:
        """Take the worker settings of a loader built again (a ``num_workers`` set, see
        :meth:`drapps.Loader._rebuild <drapps.loader.Loader._rebuild>`): where an epoch
        draws its base seed and order follows them, as in :meth:`of`."""
        settings = _worker_settings(config)
        self._persistent = settings["persistent"]
        self._in_process, self._as_asked = settings["in_process"], settings["as_asked"]
        self._ahead = settings["ahead"]

    @property
    def dataset(self) -> Any:
        """The loader's dataset."""
        return self._dataset

    @property
    def batch_size(self) -> int | None:
        """Samples per batch (None: a batch sampler's batches, or no batching)."""
        return self._batching[0]

    @property
    def batched(self) -> bool:
        """Batches are collated (False: ``batch_size=None``, one sample at a time)."""
        return self._batched

    def next_job(self, workers: int = 0) -> EpochJob:
        """The epoch the next ``iter(loader)`` runs; moves the cursor past it.

        Args:
            workers: the loader's workers now (an ``IterDataPipe``'s seeds are drawn as
                DataLoader draws them with that many).
        """
        with self._lock:
            first = self.epochs_started == 0
            fresh = not self._persistent and not first
            self.epochs_started += 1
            then, self._then = self._then, None
            if self._iterable:
                epoch, start = self._next_epoch, self._next_batch
                self._next_epoch, self._next_batch = then or epoch + 1, 0
                if self._pending_stream is not None:  # replayed as it was made
                    (seed, streams, rngs, pipe), self._pending_stream = self._pending_stream, None
                    if pipe is None:  # saved without one: derived from the seed, or none
                        pipe = pipe_seed(seed, epoch) if self._datapipe else 0
                    return EpochJob(
                        epoch, seed, None, start, fresh, self._persistent, streams, rngs, pipe
                    )
                seed, pipe = self._stream_seeds(epoch, workers, first)
                return EpochJob(epoch, seed, None, start, fresh, self._persistent, pipe_seed=pipe)
            plan: EpochPlan
            if self._pending is None:
                made, start = self._make_plan(self._next_epoch, first), self._next_batch
                if isinstance(made, _Undrawn):
                    self._next_epoch, self._next_batch = then or made.epoch + 1, 0
                    return EpochJob(
                        made.epoch, made.seed, None, start, fresh, self._persistent,
                        draw=made.draw,
                    )  # fmt: skip
                plan = made
            else:
                plan, self._pending = self._pending, None
                start = plan.first
                if self._pending_rest is not None:
                    (drawn, base_seed), self._pending_rest = self._pending_rest, None
                    plan = replace(plan, rest=self._passed_over(drawn, base_seed))
            self._next_epoch, self._next_batch = then or plan.epoch + 1, 0
            return EpochJob(plan.epoch, plan.seed, plan, start, fresh, self._persistent)

    def follow(self, epoch: Positioned) -> Callable[[Positioned], bool]:
        """Make ``epoch`` the one under way (held weakly); returns what it calls with itself
        when it is let go of before its end."""
        self._active = weakref.ref(epoch)
        self._serial += 1
        self._left = None
        return functools.partial(self._let_go, self._serial)

    def step_aside(self, epoch: Positioned) -> None:
        """``epoch``, the one under way, goes on beside the newer epoch about to start: once
        that one ends or is let go of, ``epoch`` is the one under way again, if still held."""
        self._aside.append(weakref.ref(epoch))

    def _let_go(self, serial: int, epoch: Positioned) -> bool:
        """``epoch``, the one under way as of ``serial``, is let go of (from its ``__del__``,
        in whichever thread dropped it, maybe holding this cursor's lock: so no lock).
        Returns whether it was the one under way and no epoch that stepped aside for it is
        under way again on the loader's engine: nothing then needs the engine's workers until
        the next epoch."""
        if serial != self._serial:
            return False
        self._left = Standing.of(epoch)
        back = self._back_from_aside()
        return back is None or not back.needs_engine

    def ended(self, epoch: Positioned) -> None:
        """``epoch``'s loop saw its end."""
        if self._active() is epoch:
            self._back_from_aside()

    def _back_from_aside(self) -> Positioned | None:
        """The epoch under way ended or was let go of: the latest one that stepped aside for
        it and has not seen its end is the one under way again, and is returned (no lock, as
        :meth:`_let_go`); one with every batch delivered too, as a checkpoint holds it."""
        while self._aside:
            epoch = self._aside.pop()()
            if epoch is not None and not epoch.ended:
                epoch.on_let_go = self.follow(epoch)
                return epoch
        return None

    def _forget(self) -> None:
        """No epoch is under way (a ``set_epoch`` or a load decided the next); with the
        lock held."""
        self._active = lambda: None
        self._serial += 1
        self._left = None
        self._aside = []

    def is_current(self, epoch: Positioned) -> bool:
        return self._active() is epoch

    def under_way(self) -> Positioned | None:
        """The epoch under way, if its iterator is still held and has not seen its end."""
        active = self._active()
        return None if active is None or active.ended else active

    def set_epoch(self, epoch: int, samplers: Iterable[Any] = ()) -> None:
        """Make the next ``iter(loader)`` run ``epoch`` from its first batch, and pass it on to
        each of ``samplers`` (and a batch sampler's sampler) that has ``set_epoch``."""
        nested = [getattr(s, "sampler", None) for s in samplers]
        for sampler in {id(s): s for s in (*samplers, *nested) if s is not None}.values():
            if callable(getattr(sampler, "set_epoch", None)):
                sampler.set_epoch(epoch)
        with self._lock:
            self._next_epoch, self._next_batch, self._then = epoch, 0, None
            self._pending, self._pending_stream, self._pending_rest = None, None, None
            self._forget()

    def length(self) -> int:
        """Batches in an epoch (this rank's share under torch.distributed)."""
        shard = self._shard.keys(0, warn=False)
        return len(shard if shard is not None else self._index_sampler)  # type: ignore[arg-type]

    def _make_plan(self, epoch: int, first: bool) -> EpochPlan | _Undrawn:
        """``epoch``'s plan, or, where the sampler draws it at the first ``next()``, what
        draws it then. A sampler's ``iter()`` and the base seed come in DataLoader's order:
        its iterator calls ``iter()`` on the sampler, then draws the base seed; with workers
        it calls ``iter()`` again as they start (once per epoch with persistent workers), and
        the first pass is dropped. So a sampler whose ``iter()`` draws (a ``randperm`` there)
        draws as DataLoader's does."""
        batch_size, shuffle, drop_last = self._batching
        shard = self._shard.keys(epoch, warn=True)  # DistributedSampler's: no global draw
        if shard is not None:
            return SampledPlan(draw_batches(shard, self._batched), self._epoch_seed(), epoch)
        if self._user_sampler is None and (self._seed is not None or not shuffle):
            size = batch_size or 1
            return Plan(len(self._dataset), size, shuffle, drop_last, self._epoch_seed(), epoch)
        sampler: Any = self._index_sampler
        assert sampler is not None
        as_needed = drawn_as_needed(sampler, self._batched)
        # Without workers each batch is drawn as asked (a PassPlan), its end draw with it.
        late = None if self._as_asked else runs_out_late(sampler, self._batched)

        def one_pass() -> Iterator[Any]:  # the sampler's iter(), called now
            if late is not None:  # its keys, batched as its BatchSampler would batch them
                return iter(late[0])
            return iter(sampler) if as_needed else batch_lists(sampler, self._batched)

        if not self._in_process and (first or not self._persistent):
            iter(sampler)  # DataLoader's iterator's own pass, dropped as its workers start
            seed = self._epoch_seed()
            batches = one_pass()
        else:
            batches = one_pass()
            seed = self._epoch_seed()

        def draw() -> EpochPlan:
            if as_needed:
                keyed = sampler.sampler  # keys in range(len(its data_source)), maybe again
                keys = len(keyed.data_source) if getattr(keyed, "replacement", False) else None
                return DrawnPlan(batches, len(sampler), seed, epoch, keys=keys)
            if late is not None:
                count = len(late[0])
                return running_out_late(batches, count, late[1], self._ahead, seed, epoch)
            length = planned_length(sampler)
            if self._as_asked and length is not None:
                return PassPlan(batches, length, seed, epoch)
            # The sampler's batches, all of them where they end within its len() (or its first
            # pass where it has none); past that it is endless, and planned a window at a time.
            raised: list[Exception] = []
            drawn, after = first_window(until_raised(batches, raised), length)
            if raised:  # the pass raised after len(drawn) batches
                if len(drawn) < self._ahead:  # within DataLoader's first prefetch: iter()
                    try:
                        raise raised[0]
                    finally:  # the frame its traceback keeps holds no reference to it
                        raised.clear()
                # DataLoader's iterator raises it from the next() that asks for the batch
                # that raised, its workers' prefetch ahead of the loop; the batches before it
                # are all delivered (DataLoader loses the one its next() held).
                runs_out = RunsOut(None, len(drawn) - self._ahead, raised[0])
                return SampledPlan(tuple(drawn), seed, epoch, runs_out=runs_out)
            rest = None
            if after is not None:
                rest = SamplerRest(batches, after, seed, len(drawn), ahead=self._ahead)
            return SampledPlan(tuple(drawn), seed, epoch, rest=rest)

        return _Undrawn(epoch, seed, draw) if self._in_process else draw()

    def _passed_over(self, drawn: int, base_seed: int) -> SamplerRest | None:
        """A resumed endless epoch's sampler: a new pass, its first ``drawn`` batches (those
        the saved epoch had planned) drawn and passed over, as torchdata's stateful loader
        fast-forwards a sampler without state of its own; None where it ends there."""
        assert self._index_sampler is not None
        batches = batch_lists(self._index_sampler, self._batched)
        passed, after = draw_up_to(batches, drawn)
        if len(passed) < drawn or after is None:
            return None
        return SamplerRest(batches, after, base_seed, drawn, ahead=self._ahead)

    def _stream_seeds(self, epoch: int, workers: int, first: bool) -> tuple[int, int]:
        """An iterable dataset's base seed and pipe seed for ``epoch`` (0: not a datapipe).

        With the loader's ``seed``, the pipe seed is derived from it (:func:`pipe_seed`).
        Without, both are drawn from the loader's generator (torch's default one) in
        DataLoader's order, so that a ``torch.manual_seed`` before each epoch repeats a
        pipe's order, and the training loop's generator is left where DataLoader leaves it: an
        iterator draws the pipe seed, then its base seed, and, where it starts workers, a
        second pipe seed that only its own copy of the pipe sees; a persistent iterator's
        later epochs draw one pipe seed each.
        """
        if not self._datapipe:
            return self._epoch_seed(), 0
        if self._seed is not None:
            seed = self._epoch_seed()
            return seed, pipe_seed(seed, epoch)
        later = self._persistent and workers > 0 and not first
        pipe = draw_base_seed(self._generator)
        seed = self._epoch_seed()
        if workers > 0 and not later:
            draw_base_seed(self._generator)
        return seed, pipe

    def _epoch_seed(self) -> int:
        """The seed of the epoch about to start, drawn as DataLoader draws its base seed (once
        per iterator, so once in all with persistent workers) unless ``seed`` was given."""
        if self._seed is not None:
            return self._seed
        if self._base_seed is None or not self._persistent:
            self._base_seed = draw_base_seed(self._generator)
        return self._base_seed

    # ------------------------------------------------------------------------------ resume

    def state_dict(self) -> dict[str, Any]:
        """Where iteration stands: loading it into a new loader resumes at the next batch.

        Plain data (JSON-serialisable for integer keys). An epoch whose order the loader's
        own ``seed`` determines is stored as (epoch, next batch); an epoch a sampler drew is
        stored with its remaining batches, since a sampler cannot in general redraw them.
        """
        active = self._active()
        if active is not None:
            active.draw_order()  # an epoch not yet drawn is held with its order
        with self._lock:
            # The epoch under way, or the one let go of before its end (None: neither).
            active = self._active()
            if active is None:
                if self._left is not None:  # let go of before its first next(): drawn now
                    self._left = self._left.drawn()
                standing = self._left
            else:
                standing = None if active.ended else Standing.of(active)
            plan: EpochPlan | None = None
            remaining: list[int] | None = None
            owed: tuple[list[list[Any]], list[Repeats]] | None = None
            pending_rest: tuple[int, int] | None = None
            stream = self._pending_stream
            then = self._then
            if standing is not None:
                epoch, next_batch, plan = standing.epoch, standing.next_batch, standing.plan
                remaining, owed = standing.remaining, standing.owed
                if standing.stream is not None:
                    stream = standing.stream
                # An iterator beside this epoch ran the next number: the one after is later.
                then = self._next_epoch if self._next_epoch != epoch + 1 else None
            elif self._pending is not None:
                plan, pending_rest = self._pending, self._pending_rest
                epoch, next_batch = plan.epoch, plan.first
            else:
                epoch, next_batch = self._next_epoch, self._next_batch
        batch_size, shuffle, drop_last = self._batching
        state: dict[str, Any] = {
            "version": _STATE_VERSION,
            "epoch": epoch,
            "next_batch": next_batch,
            "seed": self._seed,
            "num_samples": len(self._dataset) if hasattr(self._dataset, "__len__") else None,
            "batch_size": batch_size,
            "shuffle": shuffle,
            "drop_last": drop_last,
        }
        if then is not None:
            state["next_epoch"] = then
        if stream is not None:
            # A stream is replayed up to its position: with the seed it was drawn with (each
            # worker's RNGs start from it), over the same workers (each streams its shard),
            # persistent ones from the RNG states they had drawn to.
            state["seed"], state["workers"] = stream[:2]
            if stream[2] is not None:
                state["stream_rngs"] = stream[2]
            if self._datapipe and stream[3] is not None:
                state["pipe_seed"] = stream[3]
        # The sampler gives the rest of its pass now, where it gives each batch as asked, and
        # its draw at the pass's end, where that is still to come: the generator's state this
        # holds is the one the epochs after this draw from.
        rest = plan.draw_all() if isinstance(plan, PassPlan) else rest_of(plan)
        if isinstance(plan, SampledPlan) and plan.runs_out is not None:
            plan.runs_out.reached(len(plan), loop=False)
        repeats: list[Repeats] = []
        held: list[list[Any]] | None = None
        if owed is not None and plan is not None:
            # Batches filled from made samples: the samples still owed, in plan order.
            state["seed"] = plan.seed
            held, repeats = owed[0], owed[1]
        elif plan is not None and (
            isinstance(plan, SampledPlan | DrawnPlan | PassPlan)
            or self._seed is None
            or remaining is not None
        ):
            # The batches still owed, in plan order (some past next_batch may be delivered).
            ids = remaining if remaining is not None else range(next_batch, len(plan))
            state["seed"] = plan.seed
            held = [plan.batch(b) for b in ids]
            repeats = [plan.repeats_of(b) for b in ids]
        if held is not None:
            state["batches"] = [[plain_key(key) for key in batch] for batch in held]
            kind = key_type(held)
            if kind is not None:  # tensor or NumPy keys, restored as such
                state["key_type"] = kind
        if any(r is not None for r in repeats):
            # How many times the epoch drew each of those keys before (a sampler with
            # replacement): a resumed repeat draws as it would have.
            state["repeats"] = [None if r is None else list(r) for r in repeats]
        generators = self._generators()
        if generators:
            # Where the epochs after this one draw from: the resumed run goes on drawing as
            # the uninterrupted one, not from a generator seeded afresh (which would repeat
            # the first epochs' orders), and with persistent workers from the same base seed.
            state["generators"] = {role: generator_state(g) for role, g in generators.items()}
            if "loader" in generators and self._persistent and self._base_seed is not None:
                state["base_seed"] = self._base_seed
        if rest is not None:
            pending_rest = (rest.first, rest.base_seed)
        if pending_rest is not None:
            # An endless sampler's epoch: the batches it has given so far, passed over when
            # the epoch resumes, and the epoch's seed (each later window's is derived from it).
            state["sampler_batches"], state["epoch_seed"] = pending_rest
        return state

    def load_state_dict(self, state: dict[str, Any], workers: int | None = None) -> None:
        """Resume from :meth:`state_dict`: the next ``iter(loader)`` yields the remaining batches.

        Args:
            workers: the loader's worker count now (an iterable dataset's resumed epoch runs
                with the workers it was saved from, which needs workers if it had them).

        Raises:
            ValueError: the state is malformed or was taken from a loader with another seed,
                dataset length, batch size, shuffle or drop_last.
        """
        if not isinstance(state, dict):
            raise ValueError(f"state must be a dict from Loader.state_dict(), got {state!r}")
        if state.get("version") not in (1, _STATE_VERSION):
            raise ValueError(
                f"state version must be 1 or {_STATE_VERSION}, got {state.get('version')!r}"
            )
        epoch = checked_index("state epoch", state.get("epoch"))
        next_batch = checked_index("state next_batch", state.get("next_batch"))
        then = state.get("next_epoch")
        if then is not None:
            then = checked_index("state next_epoch", then)
            if then <= epoch:
                raise ValueError(f"state next_epoch must be past epoch {epoch}, got {then!r}")
        current = self.state_dict()
        batches = state.get("batches")
        streams = state.get("workers")
        keys: tuple[str, ...] = ("num_samples", "batch_size")
        if batches is None:
            keys = ("seed", "num_samples", "batch_size", "shuffle", "drop_last")
            if streams is not None and self._seed is None:
                keys = keys[1:]  # the seed this loader drew for the stream, not one it was given
        for key in keys:
            if state.get(key) != current[key]:
                raise ValueError(
                    f"state was saved with {key}={state.get(key)!r} but this loader has "
                    f"{key}={current[key]!r}"
                )
        pending, pending_stream = None, None
        if streams is not None:
            if not self._iterable:
                raise ValueError("state holds an iterable dataset's stream; this loader's is not")
            streams = checked_index("state workers", streams)
            if workers is not None and (streams == 0) != (workers == 0):
                raise ValueError(
                    f"state was saved from a loader whose iterable dataset streamed in "
                    f"{streams or 'the training process (workers=0)'}"
                    f"{' worker processes' if streams else ''}, but this loader has "
                    f"workers={workers}: the stream replays only as it was made"
                )
            rngs = state.get("stream_rngs")
            if rngs is not None and (
                not isinstance(rngs, list)
                or len(rngs) != streams
                or not all(isinstance(r, dict) for r in rngs)
            ):
                raise ValueError(f"state stream_rngs must be {streams} RNG states, got {rngs!r}")
            pipe = state.get("pipe_seed")
            pending_stream = (
                checked_index("state seed", state.get("seed")),
                streams,
                rngs,
                None if pipe is None else checked_index("state pipe_seed", pipe),
            )
        restored = self._saved_generators(state.get("generators"))
        base_seed = state.get("base_seed")
        if base_seed is not None:
            base_seed = checked_index("state base_seed", base_seed)
        pending_rest = None
        if batches is not None:
            if not isinstance(batches, list) or not all(isinstance(b, list) for b in batches):
                raise ValueError("state batches must be a list of lists of dataset keys")
            seed = checked_index("state seed", state.get("seed"))
            repeats = _saved_repeats(state.get("repeats"), batches)
            if state.get("key_type") is not None:
                batches = restore_keys(batches, state["key_type"])
            pending = SampledPlan(
                tuple(batches), seed, epoch, first=next_batch, saved_repeats=repeats
            )
            if state.get("sampler_batches") is not None:
                drawn = checked_index("state sampler_batches", state["sampler_batches"])
                if drawn < next_batch + len(batches):
                    raise ValueError(
                        f"state sampler_batches must be at least next_batch + len(batches) "
                        f"= {next_batch + len(batches)}, got {drawn!r}"
                    )
                base = checked_index("state epoch_seed", state.get("epoch_seed"))
                pending_rest = (drawn, base)
        elif not self._iterable:
            batch_size, shuffle, drop_last = self._batching
            plan = Plan(len(self._dataset), batch_size or 1, shuffle, drop_last, 0, epoch)
            if next_batch > len(plan):
                raise ValueError(
                    f"state next_batch must be in [0, {len(plan)}], got {next_batch!r}"
                )
        with self._lock:
            self._next_epoch, self._next_batch, self._then = epoch, next_batch, then
            self._pending, self._pending_stream = pending, pending_stream
            self._pending_rest = pending_rest
            for generator, saved in restored:
                generator.set_state(saved)
            if base_seed is not None:
                self._base_seed = base_seed
            self._forget()

    def _generators(self) -> dict[str, torch.Generator]:
        """The generators later epochs draw from, by role: the loader's ``generator``
        (``"loader"``) and a sampler's own (``"sampler"``: a ``RandomSampler(...,
        generator=g)``, also inside a ``BatchSampler``), each once."""
        found: dict[str, torch.Generator] = {}
        if self._generator is not None:
            found["loader"] = self._generator
        sampler = self._user_sampler
        for candidate in (sampler, getattr(sampler, "sampler", None)):  # a BatchSampler's
            generator = getattr(candidate, "generator", None)
            if isinstance(generator, torch.Generator) and generator is not self._generator:
                found["sampler"] = generator
                break
        return found

    def _saved_generators(self, saved: Any) -> list[tuple[torch.Generator, torch.Tensor]]:
        """A checkpoint's generator states, each with the generator of this loader it is
        restored to (none where the checkpoint holds none).

        Raises:
            ValueError: they are not states of the generators this loader has.
        """
        if saved is None:
            return []
        generators = self._generators()
        if not isinstance(saved, dict) or set(saved) != set(generators):
            names = sorted(map(str, saved)) if isinstance(saved, dict) else saved
            raise ValueError(
                f"state was saved with generators {names!r} but this loader has "
                f"{sorted(generators)} (the loader's generator=, a sampler's own)"
            )
        return [
            (g, checked_generator_state(saved[role], g, f"state generators[{role!r}]"))
            for role, g in generators.items()
        ]


def _saved_repeats(saved: Any, batches: list[list[Any]]) -> tuple[Repeats, ...] | None:
    """A checkpoint's ``repeats`` of its ``batches``, checked (None: none saved).

    Raises:
        ValueError: they are not one list of counts (or null) per batch, of its length.
    """
    if saved is None:
        return None
    if isinstance(saved, list) and len(saved) == len(batches):
        found: list[Repeats] = []
        for counts, batch in zip(saved, batches, strict=True):
            if counts is None:
                found.append(None)
            elif (
                isinstance(counts, list)
                and len(counts) == len(batch)
                and all(type(c) is int and c >= 0 for c in counts)
            ):
                found.append(tuple(counts))
            else:
                break
        else:
            return tuple(found)
    raise ValueError(
        f"state repeats must be one list of counts (or null) per batch of state batches, of "
        f"its length, got {saved!r}"
    )
