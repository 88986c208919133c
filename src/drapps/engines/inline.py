"""The inline engine: batches made in the training process itself (``workers=0``).

A map-style epoch makes each planned batch when the loop asks for it; an iterable dataset is
iterated here, as DataLoader does with no workers. The loop's wait is the time spent making.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from drapps.engines.base import Engine, EngineBatch, EpochJob, Limits
from drapps.runtime.errors import SampleError
from drapps.runtime.plan import EpochPlan, PassPlan, Repeats
from drapps.runtime.seeding import (
    WorkerRngs,
    preserved_global_rngs,
    restore_states,
    saved_states,
    unmoved,
)
from drapps.runtime.stats import PipelineSnapshot, inline_snapshot
from drapps.runtime.stream import StreamBatcher, prepare_datapipe
from drapps.runtime.transport import owned
from drapps.runtime.worker import BatchRecipe, Made, fresh_batches, make_batch


class InlineEngine(Engine):
    """Makes every batch in the calling process, in plan order.

    Args:
        recipe: what a batch is made of (dataset, transform, collate, errors).
        batch_size, drop_last: batching of an iterable dataset's stream.
        limits: the loader's memory budget (reported; nothing is held ahead).
        finish: applied to each batch as it is made (pinning).
        split: a Pipeline transform's split to start with.
        seeded: the loader has a ``seed``: an iterable dataset's stream draws from RNGs of
            its own, seeded from it as a lone worker's are (False: from the training
            process's own RNGs, as under DataLoader with no workers).
        owned: the batches stand in for a worker pool's: one that may hold the dataset's
            own objects is copied, as it would cross from a worker process
            (:func:`~drapps.runtime.transport.owned`). False (``workers=0``): handed over
            as made, as DataLoader's are with no workers.
        rngs: where samples not seeded each on their own draw (a fixed count's): the global
            RNG states of a worker of this engine's own, swapped in while a batch is made,
            so the training loop's draws are not theirs; None: the training process's, as
            DataLoader's with no workers.
    """

    kind = "inline"

    def __init__(
        self,
        recipe: BatchRecipe,
        batch_size: int | None,
        drop_last: bool,
        limits: Limits,
        finish: Callable[[Any], Any] | None = None,
        split: Any = None,
        seeded: bool = False,
        owned: bool = False,
        rngs: WorkerRngs | None = None,
    ) -> None:
        self._recipe = recipe
        self._seeded = seeded
        self._owned = owned
        self._rngs = rngs
        self._batching = (batch_size, drop_last)
        self._limits = limits
        self._finish = finish
        self._split = split
        self._made: Iterator[EngineBatch] = iter(())
        self._plan: EpochPlan | None = None
        self._position = 0
        self._unseeded: BatchRecipe | None = None  # see check_draws
        self.drew = False
        """Whether a batch made unseeded moved a global generator (:meth:`check_draws`)."""
        self.wait_s = 0.0

    @property
    def workers(self) -> int:
        return 0

    @property
    def position(self) -> int:
        """The id of the planned batch :meth:`next` makes next."""
        return self._position

    def skip(self) -> None:
        """Pass over the planned batch :meth:`next` would make next (made elsewhere)."""
        self._position += 1

    def set_split(self, split: Any) -> None:
        self._split = split

    def check_draws(self, on: bool) -> None:
        """Make batches without reseeding Python's and NumPy's global generators for each
        sample (``on``), where the workers watched samples draw from none of them: seeding
        them costs ~5 us a sample, which a sample made in memory notices. Each batch is
        checked instead (~30 us): where one moved after all (a sample or the ``collate_fn``
        drew), the generators are put back, the batch is made again, seeded, and so is every
        later batch. torch's is still seeded per sample (~1 us), as a sample may read its seed
        without drawing (``torch.initial_seed()``), and put back after the batch. The batches
        are the same either way; a dataset that draws unseen by the workers has one batch's
        samples made twice. Not with the sample cache (a sample made unseeded would be
        kept), nor where a batch is one call of ``__getitems__`` (seeded once a batch)."""
        recipe = self._recipe
        able = recipe.reseed and recipe.cache is None and not recipe.getitems
        self._unseeded = (
            dataclasses.replace(recipe, reseed=False, reseed_torch=True)
            if on and able and not self.drew
            else None
        )

    def beside(self, job: EpochJob, start: int) -> InlineEngine:
        """This engine's epoch under way, handed over: the new engine goes on with it (an
        iterable dataset's stream too) while this one starts the newer epoch."""
        side = InlineEngine(
            self._recipe, *self._batching, self._limits, self._finish, self._split,
            self._seeded, self._owned, self._rngs,
        )  # fmt: skip
        side._made, side._plan, side._position = self._made, self._plan, self._position
        self._made = iter(())
        return side

    def start_epoch(self, job: EpochJob) -> None:
        self._plan, self._position = job.plan, job.start
        self._made = self._stream(job.seed, job.pipe_seed) if job.plan is None else iter(())

    def next(self) -> EngineBatch | None:
        began = time.perf_counter()
        try:
            if self._plan is None:
                return next(self._made, None)
            return self._make_planned(self._plan)
        finally:
            self.wait_s += time.perf_counter() - began

    def _make_planned(self, plan: EpochPlan) -> EngineBatch | None:
        """The next planned batch, or the error of one that failed."""
        batch_id = self._position
        if batch_id >= len(plan) or (isinstance(plan, PassPlan) and not plan.reaches(batch_id)):
            return None  # a user's sampler gives the batch now, or its error (as DataLoader's)
        self._position += 1
        split = self._split
        # Reseeded per sample, the caller's RNG streams are put back after the batch; else
        # the samples draw from them, as DataLoader's do without workers.
        try:
            indices = plan.batch(batch_id)  # drawn: the sampler draws nothing here
            repeats = plan.repeats_of(batch_id)
            if self._unseeded is not None and len(indices) > 2:
                made = self._checked(plan, indices, split, repeats)
            else:
                reseeded = self._recipe.reseed
                with preserved_global_rngs() if reseeded else self._drawing():
                    made = make_batch(
                        self._recipe, plan.seed, plan.epoch, indices, split, timed=False,
                        repeats=repeats,
                    )  # fmt: skip
        except Exception as exc:  # raised in the loop in the batch's place; the epoch goes on
            return EngineBatch(None, split=split, error=exc)
        batch = made.batch
        if self._owned and batch is not None and not fresh_batches(self._recipe, split):
            batch = owned(batch)
        return EngineBatch(self._finished(batch), made.skipped, split)

    def _drawing(self) -> contextlib.AbstractContextManager[None]:
        """Where samples not seeded each on their own draw while a batch is made."""
        return self._rngs.active() if self._rngs is not None else contextlib.nullcontext()

    def _checked(self, plan: EpochPlan, indices: list[Any], split: Any, repeats: Repeats) -> Made:
        """``indices``' batch made unseeded, or again seeded where that moved a generator
        (:meth:`check_draws`)."""
        assert self._unseeded is not None
        saved = saved_states()
        try:
            made = make_batch(
                self._unseeded, plan.seed, plan.epoch, indices, split, timed=False,
                repeats=repeats,
            )  # fmt: skip
        except Exception:
            if unmoved(saved):
                torch.default_generator.set_state(saved[2])
                raise
        else:
            if unmoved(saved):
                torch.default_generator.set_state(saved[2])
                return made
        restore_states(saved)
        self.drew, self._unseeded = True, None
        with preserved_global_rngs():
            return make_batch(
                self._recipe, plan.seed, plan.epoch, indices, split, timed=False,
                repeats=repeats,
            )  # fmt: skip

    def _stream(self, seed: int, shared_seed: int) -> Iterator[EngineBatch]:
        """The epoch's batches from the dataset's iterator, which is made now (as the epoch
        starts: DataLoader's iterator calls ``iter(dataset)`` as it is made, so a second
        ``iter()`` over an ``IterDataPipe`` invalidates the first in both)."""
        # With a seed, the stream is seeded as a lone worker's is: the same seed gives the same
        # stream on every run (and a resumed epoch replays it), and the training loop's own
        # draws neither change it nor are changed by it.
        prepare_datapipe(self._recipe.dataset, shared_seed, 1, 0)
        rngs = WorkerRngs(seed) if self._seeded else None
        with rngs.active() if rngs is not None else contextlib.nullcontext():
            batcher = StreamBatcher(self._recipe, *self._batching)
        return self._streamed(batcher, rngs)

    def _streamed(self, batcher: StreamBatcher, rngs: WorkerRngs | None) -> Iterator[EngineBatch]:
        failed: list[SampleError] = []
        while True:
            try:
                with rngs.active() if rngs is not None else contextlib.nullcontext():
                    batch = batcher.next_batch()
            except StopIteration:
                return
            except SampleError as exc:  # the stream goes on from its next item, as DataLoader's
                # Without this generator's frame: a caller that clears the error's frames
                # (traceback.clear_frames) would close the generator, and end the stream.
                if exc.__traceback__ is not None:
                    exc.__traceback__ = exc.__traceback__.tb_next
                failed.append(exc)
            if failed:
                # Yielded outside the handler and from a list: while the loop raises it, this
                # generator's frame holds no reference to it (a cycle through its traceback,
                # which only the garbage collector frees, would keep the epoch after the loop
                # let go).
                yield EngineBatch(None, error=failed.pop())
                continue
            skipped, batcher.skipped = batcher.skipped, []
            yield EngineBatch(self._finished(batch), skipped)

    def _finished(self, batch: Any) -> Any:
        return self._finish(batch) if self._finish is not None and batch is not None else batch

    def snapshot(self, samples: int) -> PipelineSnapshot:
        return inline_snapshot(samples, self.wait_s, self._limits.memory_budget)

    def shutdown(self) -> None:
        self._made, self._plan = iter(()), None
