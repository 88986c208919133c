"""One epoch of a Loader: the iterator ``iter(loader)`` returns, over any engine.

It takes the engine's batches in order, runs a device stage on them (staging batch ``b + 1``
in the stage's thread while the loop steps on ``b`` when the engine has it already), and
counts what it delivers. A newer ``iter(loader)`` while it still has batches takes the engine
(DataLoader runs two iterators side by side): this epoch then makes the rest of its batches in
the training process, and takes the engine back once the newer one has ended or been let go
of. ``set_epoch()`` and ``load_state_dict()`` supersede it.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from drapps.engines.accelerate_state import epoch_state
from drapps.engines.base import Engine, EngineBatch, EpochJob, Skipped
from drapps.engines.inline import InlineEngine
from drapps.ops.device_stage import DeviceStage, Staged
from drapps.runtime.errors import SampleError, anew, failure, warn_user
from drapps.runtime.plan import EpochPlan, PassPlan, Repeats, SampledPlan, rest_of
from drapps.runtime.sampling import key_of
from drapps.runtime.seeding import epoch_seeds, repeat_seed

_KEPT_SKIPS = 100


@dataclass
class Delivered:
    """What the training loop has received so far, counted by its epochs."""

    epoch: int = -1
    """Epoch of the current (or last) iteration; -1 before the first."""
    batches: int = 0
    samples: int = 0
    samples_skipped: int = 0
    skipped: list[tuple[Any, str]] = field(default_factory=list)
    """The last 100 skipped samples: (index, what failed)."""
    stage_wait_s: float = 0.0
    """Seconds the loop waited for a batch staged ahead in the device stage."""
    first_batch_s: float | None = None
    """Seconds from the latest epoch's start to its first batch."""
    began: float | None = None
    """When the latest epoch started, until its first batch came."""
    loading_s: float = 0.0
    """Seconds from each ``iter(loader)`` to the last batch it delivered, summed."""
    since: float | None = None
    """When the latest epoch started, or its latest batch came."""

    def begin(self) -> None:
        """An epoch starts now (``iter(loader)``)."""
        self.began = self.since = time.monotonic()

    def record(self, samples: int, skipped: Skipped, delivered: bool) -> None:
        now = time.monotonic()
        if self.since is not None:
            self.loading_s += now - self.since
        self.since = now
        if self.began is not None:
            self.first_batch_s, self.began = now - self.began, None
        self.batches += delivered
        self.samples += samples
        if skipped:
            self.samples_skipped += len(skipped)
            self.skipped = (self.skipped + skipped)[-_KEPT_SKIPS:]


@dataclass
class _Ahead:
    """The next batch, taken from the engine and being staged in the stage's thread."""

    batch_id: int
    made: EngineBatch
    staged: Future[Staged]


class Epoch:
    """Yields one epoch's batches in order.

    Args:
        job: the epoch (its plan, or None for an iterable dataset's stream).
        engine: makes the batches.
        stage: the device stage, or None.
        delivered: the loader's counters, which this epoch adds to.
        is_current: whether this epoch is still the loader's current one.
        split: the Pipeline split now (the stage overlaps only batches with ops left to run).
        length: the batches of a stream epoch (its dataset's ``__len__``; TypeError without).
        batched: batches are collated (``batch_size=None`` delivers samples, which may be None).
        batch_size: samples counted for a stream batch whose length cannot be read.
        turn: held while this epoch takes a batch from the engine (the loader's, which its
            next epoch's start takes too).
        reported: the length ``len(loader)`` reported for a stream (None: not asked).
        dataset: the dataset (named in the warning for a stream longer than reported).
        ended: called with this epoch when its loop sees its end (the cursor's ``ended``).
        closed: whether the loader is closed.
    """

    def __init__(
        self,
        job: EpochJob,
        engine: Engine,
        stage: DeviceStage | None,
        delivered: Delivered,
        *,
        is_current: Callable[[Any], bool],
        split: Callable[[], int | None],
        length: Callable[[], int],
        batched: bool,
        batch_size: int,
        turn: threading.RLock | None = None,
        reported: Callable[[], int | None] = lambda: None,
        dataset: Any = None,
        ended: Callable[[Epoch], None] = lambda epoch: None,
        closed: Callable[[], bool] = lambda: False,
    ) -> None:
        self._turn = turn if turn is not None else contextlib.nullcontext()
        self._pid = os.getpid()  # the process whose loop holds it
        self.epoch = job.epoch
        self.seed = job.seed
        self.pipe_seed = job.pipe_seed
        self._job = job
        self.plan = job.plan
        self.position = job.start if job.plan is not None else 0
        self.finished = (
            job.plan is not None and job.start >= len(job.plan) and rest_of(job.plan) is None
        )
        # The order is drawn at the first next() (:attr:`EpochJob.draw`), or by a checkpoint
        # taken before it; the engine starts at the first next().
        self._draw = job.draw
        self._draw_error: BaseException | None = None  # the sampler's, raised by next()
        self._started = job.draw is None
        self._stepped_aside = False  # a newer iter(loader) took the engine before it started
        self._engine, self._stage, self._delivered = engine, stage, delivered
        self._main = engine  # the loader's engine; _engine is another while beside a newer epoch
        self._on_end, self._closed = ended, closed
        self._superseded = "set_epoch() or load_state_dict()"  # what a newer iterator is not
        self._is_current, self._split, self._length = is_current, split, length
        self._reported, self._dataset = reported, dataset
        self._batched, self._batch_size = batched, batch_size
        self._ahead: _Ahead | None = None
        self._ended = False
        self._accelerate: Any | None = None  # its place in Accelerate's gradient state
        self._accelerate_asked = False
        self.on_let_go: Callable[[Epoch], bool] | None = None
        """Called with this epoch when it is let go of before its end (set by the cursor)."""
        self._failed = 0  # a stream's batches that failed (they count in its position)
        self._out_of_order: set[int] = set()  # ids past position delivered ahead of it
        self._places: set[tuple[int, int]] | None = None  # delivered, when batches are filled
        self.delivered_keys: list[list[Any]] = []
        """The dataset keys of each batch this epoch delivered, in order, where batches are
        filled from made samples (``defer_after``): passed as a ``batch_sampler`` (with the
        same ``seed``, and ``set_epoch``), they replay this epoch bit for bit."""
        if not self.finished and self._draw is None:
            engine.start_epoch(job)
        self.streams: int | None = None
        """An iterable dataset's epoch: the workers streaming it (0: the training process)."""
        self.rngs: list[dict[str, Any]] | None = None
        """Persistent stream workers: each one's RNG states at the start of the epoch."""
        if job.plan is None and self._draw is None:
            self.streams = engine.workers if job.workers is None else job.workers
            self.rngs = engine.stream_rngs()
        if self.streams is not None:  # a resumed stream replays its first batches, dropped
            for _ in range(job.start):
                if engine.next() is None:
                    self.finished = True
                    break
                self.position += 1

    def __iter__(self) -> Epoch:
        return self

    def __del__(self) -> None:
        # Let go of before its end (a loop that breaks out of it): the loader's checkpoint
        # still reads where it stood, as if the loop held it.
        # A forked child that drops its copy of the iterator leaves its parent's epoch alone.
        if self.__dict__.get("_pid") != os.getpid():
            return
        let_go = self.__dict__.get("on_let_go")
        if let_go is not None and not self.__dict__.get("_ended", True):
            with contextlib.suppress(Exception):  # late in the interpreter's shutdown
                # Its workers go, as DataLoader's do: the loader's engine's, where nothing
                # newer holds them, whether it made this epoch's batches or kept them for it
                # while it stepped aside for a newer iterator.
                if let_go(self) and (self._started or self._stepped_aside):
                    self._main.let_go(self._job)

    @property
    def undrawn(self) -> Callable[[], EpochPlan] | None:
        """What draws the epoch's order at its first ``next()`` (None: drawn)."""
        return self._draw

    @property
    def needs_engine(self) -> bool:
        """Whether the loader's engine makes this epoch's batches, or will from its next
        ``next()`` (:meth:`_rejoin`); False for one whose batches an engine of its own makes
        to its end (a stream's workers handed over to it)."""
        return self._engine is self._main or self._rejoins()

    def _rejoins(self) -> bool:
        return self.plan is not None and not self._out_of_order and self._ahead is None

    @property
    def ended(self) -> bool:
        """The loop has seen the epoch's end (its StopIteration): a checkpoint then points
        past it. Until then a checkpoint holds the epoch, even with every batch delivered, so
        that a resumed ``for batch in loader`` finishes it (with no batches) before the next."""
        return self._ended

    def __len__(self) -> int:
        """The epoch's batches, however far it has gone (a resumed one's too), as DataLoader's
        iterator says: the loader's ``len()`` (TypeError where it has none)."""
        return self._length()

    def __next__(self) -> Any:
        with self._turn:  # the check and the take are one step: no newer epoch starts between
            return self._next()

    def _next(self) -> Any:
        if not self._accelerate_asked:  # an Accelerator in the process learns where it ends
            self._accelerate_asked = True
            self._accelerate = epoch_state()
            if self._accelerate is not None:
                self._accelerate.begin()
        if not self._started:
            self._start()
        current = self._is_current(self)
        if not current:
            if self._ended or self.finished:  # it had ended: an exhausted iterator stays so
                raise StopIteration
            if self._engine is self._main:
                raise RuntimeError(f"this epoch's iterator was superseded by {self._superseded}")
        if self._engine is not self._main:
            if self._closed():
                raise RuntimeError("this drapps.Loader is closed")
            if current:
                self._rejoin()
        if self.plan is None:
            return self._next_streamed()
        while True:
            # Due at each batch this next() takes, a skipped one's too, and at the end.
            self._reach_the_samplers_end()
            got = None if self.finished else self._next_planned()
            if got is None:
                break
            batch, samples, skipped = got
            # A batch whose samples were all skipped is not delivered; any other is, as
            # DataLoader's: an empty one from a batch_sampler, or None from a collate_fn.
            delivered = samples > 0 or not skipped
            self._delivered.record(samples, skipped, delivered)
            if delivered:
                if self.finished and self._accelerate is not None:
                    self._accelerate.end_of_dataloader = True  # the epoch's last batch
                return batch
        self._end()
        raise StopIteration

    def step_aside(self) -> bool:
        """A newer ``iter(loader)`` takes the engine: make this epoch's remaining batches in the
        training process, or in workers of its own, from now on (:meth:`Engine.beside`); False
        where they cannot be (persistent stream workers, a queue's reader, batches filled from
        made samples): this iterator is then superseded."""
        if self._engine is not self._main or self._ended or self.finished:
            return True
        if not self._started:  # it starts beside the newer epoch, at its first next()
            self._stepped_aside = True
            return True
        return self._go_beside()

    def _go_beside(self) -> bool:
        """Make this epoch's batches beside the loader's engine from now on; False where
        they cannot be (what its ``next()`` then says is kept)."""
        if self._places is not None:
            self._superseded = (
                "a newer iter(loader): its batches are filled from the samples the workers "
                "made (defer_after), which go on with the newer one"
            )
            return False
        side = self._main.beside(self._job, self.position)
        if side is None:
            self._superseded = (
                f"a newer iter(loader): the {self._main.kind} engine cannot hand this epoch "
                f"over ({self._main.holds})"
            )
            return False
        self._engine = side
        return True

    def draw_order(self) -> None:
        """Draw the epoch's order now if it is still to be drawn (a checkpoint taken before
        the first ``next()`` holds it, so the resumed epoch is this one). A sampler's failure
        is kept for ``next()`` to raise; the epoch is then over."""
        if self._draw is None:  # drawn: no wait for a next() under way in another thread
            return
        with self._turn:
            draw, self._draw = self._draw, None
            if draw is None:
                return
            try:
                plan = draw()
            except BaseException as exc:
                self.finished = True
                if not isinstance(exc, Exception):
                    raise
                self._draw_error = exc
                return
            self.plan, self._job = plan, replace(self._job, plan=plan, draw=None)
            self.finished = self.position >= len(plan) and rest_of(plan) is None

    def _start(self) -> None:
        """Start making the epoch's batches at its first ``next()``, its order drawn first (as
        DataLoader without workers draws it then): with the loader's engine where this is
        still the loader's epoch, beside it where a newer ``iter(loader)`` took it."""
        current = self._is_current(self)
        if not current and not self._stepped_aside:
            return  # superseded by set_epoch() or load_state_dict(): nothing is drawn
        if self._closed():
            raise RuntimeError("this drapps.Loader is closed")
        self._started = True
        self.draw_order()
        error, self._draw_error = self._draw_error, None
        if error is not None:
            try:
                raise error
            finally:
                del error  # see _next_planned
        if self.finished:
            return
        if current:
            self._main.start_epoch(self._job)
        else:
            self._go_beside()  # False: its next() says why it is superseded

    def _rejoin(self) -> None:
        """The loader's epoch under way again (the newer one ended or was let go of): the
        engine makes its batches from its position on."""
        self._delivered.epoch = self.epoch
        if not self._rejoins():
            # A stream stays where it is made; so do batches delivered out of order, and
            # the engine waits for the batch staged before this epoch stepped aside.
            return
        self._main.start_epoch(replace(self._job, start=self.position, fresh=False))
        self._engine = self._main

    def _end(self) -> None:
        """The epoch was iterated to its end: the engine lets go of its workers (once)."""
        if not self._ended:
            self._ended = True
            self._engine.end_epoch(self._job)
            self._on_end(self)
        if self._accelerate is not None:
            self._accelerate.end()
            self._accelerate = None

    def _next_streamed(self) -> Any:
        if self.finished:
            self._end()
            raise StopIteration
        try:
            made = self._engine.next()
        except BaseException:  # the stream's failure: this epoch is over
            self.finished = True
            raise
        if made is None:
            self.finished = True
            self._end()
            raise StopIteration
        self.position += 1  # a failed batch too: a resumed stream replays past it
        if made.error is not None:  # this batch failed; the stream goes on
            self._failed += 1
            error, made = anew(made.error), None  # a copy: see _next_planned
            try:
                raise error
            finally:
                del error  # see _next_planned
        reported = self._reported()
        if reported is not None and self.position - self._failed > reported:
            self._warn_past_length(reported)
        batch = made.batch
        self._delivered.record(_batch_len(batch, self._batch_size), made.skipped, True)
        if self._stage is not None and batch is not None:
            return self._stage.run(batch, (), None)
        return batch

    def _warn_past_length(self, reported: int) -> None:
        """DataLoader's warning, in its words, for a stream longer than its ``__len__``;
        counted in batches where it is batched (DataLoader counts its batches against the
        dataset's ``len()`` in samples, so it says nothing until that many)."""
        unit = "batches" if self._batched else "samples"
        message = (
            f"Length of IterableDataset {self._dataset} was reported to be "
            f"{reported} (when accessing len(dataloader)), but "
            f"{self.position - self._failed} {unit} have been fetched. "
        )
        if self.streams:
            message += (
                "For multiprocessing data-loading, this could be caused by not properly "
                "configuring the IterableDataset replica at each worker (shard it by "
                "torch.utils.data.get_worker_info())."
            )
        warn_user(message)

    def _reach_the_samplers_end(self) -> None:
        """What the plan's sampler does at the loop's ``next()`` for this batch, where due
        (:class:`~drapps.runtime.plan.RunsOut`): its draw at its pass's end, or the error
        its pass raised."""
        plan = self.plan
        if isinstance(plan, SampledPlan) and plan.runs_out is not None:
            plan.runs_out.reached(self.position)

    def _next_planned(self) -> tuple[Any, int, Skipped] | None:
        """The next batch, how many samples it holds and which were skipped; None at the
        epoch's end."""
        plan = self.plan
        assert plan is not None
        batch_id = self.position
        if batch_id >= len(plan):
            if not self._next_window():
                self.finished = True
                return None
            plan, batch_id = self.plan, self.position
            assert plan is not None
            self._reach_the_samplers_end()  # a new window's: it may have raised already
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            made: EngineBatch | None = ahead.made
        else:
            side = self._engine
            if isinstance(side, InlineEngine) and side is not self._main:
                while side.position < self.position or side.position in self._out_of_order:
                    side.skip()  # delivered before this epoch stepped aside (out of order)
            made = side.next()
        if made is None:
            self.finished = True
            return None
        if made.batch_id is not None:  # handed over as made (in_order=False)
            batch_id = made.batch_id
        self._advance(batch_id)
        indices = plan.batch(batch_id)
        if made.places is not None:
            self._places = self._places or set()
            self._places.update(made.places)
            indices = made.keys if made.keys is not None else indices
            self.delivered_keys.append(list(indices))
        if made.error is not None:
            # Raised with no local left holding it: the traceback keeps this frame, and a
            # frame that held its own error would be a cycle that only the garbage collector
            # frees, keeping the workers (and what they hold) alive after the loop let go.
            # Raised as a copy: the error came from another thread (the dispatcher's, a thread
            # worker's), which may hold it a moment longer, and the raise adds this frame to
            # it, so that thread would hold the epoch, and the loader, past the loop's end.
            error, made, ahead = anew(made.error), None, None
            try:
                raise error
            finally:
                del error
        try:
            if ahead is not None:
                batch = self._collect(ahead)
            else:
                batch = self._staged(made, indices, self._repeats(batch_id, made))
        except Exception as exc:
            raise _stage_error(exc, batch_id, indices) from exc
        self._stage_next()
        return batch, len(indices) - len(made.skipped), made.skipped

    def _stage_next(self) -> None:
        """Start staging the next batch in the stage's thread if the engine has it already."""
        stage, plan = self._stage, self.plan
        assert plan is not None
        if stage is None or self.finished or stage.idle(self._split()):
            return  # nothing to overlap: leave the next batch with the engine (and its budget)
        made = self._engine.ready()
        if made is None:
            return
        batch_id = made.batch_id if made.batch_id is not None else self.position
        if made.error is None and made.batch is not None and not stage.idle(made.split):
            keys = made.keys if made.keys is not None else plan.batch(batch_id)
            seeds = self._seeds(keys, made.skipped, self._repeats(batch_id, made))
            staged = stage.ahead(made.batch, seeds, made.split)
        else:  # an error to raise, or nothing to stage: handed over as it is
            staged = Future()
            staged.set_result(Staged(made.batch))
        self._ahead = _Ahead(batch_id, made, staged)

    def _collect(self, ahead: _Ahead) -> Any:
        """The staged batch, waiting for its stage to finish (counted as the loop's wait)."""
        assert self._stage is not None
        began = time.perf_counter()
        try:
            staged = ahead.staged.result()
        finally:
            self._delivered.stage_wait_s += time.perf_counter() - began
        return self._stage.finish(staged)

    def _staged(self, made: EngineBatch, indices: list[Any], repeats: Repeats) -> Any:
        """``made``'s batch through the device stage: moved to the loader's device, and
        through the ops of its Pipeline from the split it was made with."""
        stage, batch, split = self._stage, made.batch, made.split
        if stage is None or batch is None:
            return batch
        seeds = self._seeds(indices, made.skipped, repeats) if stage.has_ops(split) else ()
        return stage.run(batch, seeds, split)

    def _repeats(self, batch_id: int, made: EngineBatch) -> Repeats:
        """The repeats of ``made``'s keys (its places', where batches are filled)."""
        plan = self.plan
        assert plan is not None
        if made.places is None:
            return plan.repeats_of(batch_id)
        found = [plan.repeats_of(b) for b, _ in made.places]
        if all(r is None for r in found):
            return None
        places = zip(found, made.places, strict=True)
        return tuple(r[p] if r is not None else 0 for r, (_, p) in places)

    def _seeds(self, indices: list[Any], skipped: Skipped, repeats: Repeats) -> list[int]:
        """The seeds of a batch's delivered samples, in batch order."""
        assert self.plan is not None
        dropped = {key_of(index) for index, _ in skipped}
        seed_of = epoch_seeds(self.plan.seed, self.epoch)
        counts = repeats if repeats is not None else itertools.repeat(0)
        return [
            repeat_seed(seed_of(key), count)
            for key, count in zip(map(key_of, indices), counts, strict=False)
            if key not in dropped
        ]

    def _advance(self, batch_id: int) -> None:
        """Count ``batch_id`` delivered: ``position`` is the first batch not yet delivered."""
        assert self.plan is not None
        if batch_id != self.position:
            self._out_of_order.add(batch_id)
        else:
            self.position += 1
            while self.position in self._out_of_order:
                self._out_of_order.discard(self.position)
                self.position += 1
        plan = self.plan
        if isinstance(plan, PassPlan) and not plan.over:
            return  # the next() past it asks the sampler whether its pass is over
        if self.position >= len(plan) and rest_of(plan) is None:
            self.finished = True

    def _next_window(self) -> bool:
        """Plan an endless sampler's next window and hand it to the engine as the rest of
        this epoch, its workers kept; False where the sampler has ended."""
        rest = rest_of(self.plan)
        if rest is None:
            return False
        window = rest.window(self.epoch)
        job = self._job
        self._engine.end_epoch(replace(job, persistent=True))
        self._job = replace(job, seed=window.seed, plan=window, start=window.first, fresh=False)
        self.plan, self.position = window, window.first
        self._out_of_order.clear()
        self._engine.start_epoch(self._job)
        return True

    def owed(self) -> tuple[list[list[Any]], list[Repeats]] | None:
        """The keys still owed, in plan order and cut to the remaining batches' sizes, and
        their repeats, where batches are filled from made samples (their samples are not the
        plan's batches); None otherwise."""
        if self._places is None or self.plan is None:
            return None
        plan, delivered = self.plan, self._places
        places = [
            (key, repeats[p] if repeats is not None else 0)
            for b in range(self._job.start, len(plan))
            for repeats in [plan.repeats_of(b)]
            for p, key in enumerate(plan.batch(b))
            if (b, p) not in delivered
        ]
        sizes = [len(plan.batch(b)) for b in range(self.position, len(plan))]
        owed: list[list[Any]] = []
        owed_repeats: list[Repeats] = []
        start = 0
        for size in sizes:
            chunk = places[start : start + size]
            counts = tuple(count for _, count in chunk)
            owed.append([key for key, _ in chunk])
            owed_repeats.append(counts if any(counts) else None)
            start += size
        return owed, owed_repeats

    def undelivered(self) -> list[int] | None:
        """The ids from ``position`` on not delivered yet, when some past it were delivered
        ahead of it (``in_order=False``); None when the epoch stands at ``position``."""
        if not self._out_of_order or self.plan is None:
            return None
        return [b for b in range(self.position, len(self.plan)) if b not in self._out_of_order]


def _stage_error(exc: Exception, batch_id: int, indices: list[Any]) -> SampleError:
    """A device stage failure as the training loop sees it: naming the batch, its indices and
    the op, and an instance of the original type (as a failing sample's error is)."""
    where = getattr(exc, "drapps_op", "moving the batch")
    return failure(
        exc,
        f"the device stage failed at {where} on batch {batch_id} (indices {indices})",
        index=None,
        stage="device_stage",
        indices=indices,
    )


def _batch_len(batch: Any, default: int) -> int:
    """Samples in a collated batch (the first tensor's length), else ``default``."""
    probe = batch
    while isinstance(probe, list | tuple) and probe:
        probe = probe[0]
    if isinstance(probe, dict) and probe:
        probe = next(iter(probe.values()))
    if isinstance(probe, torch.Tensor) and probe.dim() > 0:
        return int(probe.shape[0])
    return default
