"""One epoch of a Loader: the iterator ``iter(loader)`` returns.

A map-style epoch delivers the batches of a plan in order (from the reorder buffer, or made in
the calling process with ``workers=0``); an iterable dataset's epoch reads the stream pool
round-robin (or iterates the dataset in the calling process). Both are superseded by the
loader's next ``iter()``, ``set_epoch()`` or ``load_state_dict()``.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from drapps.ops.device_stage import DeviceStage, Staged
from drapps.ops.pipeline import Pipeline
from drapps.runtime.dispatcher import Dispatcher
from drapps.runtime.errors import SampleError, sample_error
from drapps.runtime.plan import EpochPlan
from drapps.runtime.reorder import Entry
from drapps.runtime.sampling import key_of
from drapps.runtime.seeding import preserved_global_rngs, sample_seed_for
from drapps.runtime.stream import StreamBatcher, StreamPool
from drapps.runtime.worker import BatchRecipe, make_batch

Skipped = list[tuple[Any, str]]


class Loader(Protocol):
    """What an epoch reads and counts on the :class:`drapps.Loader` that made it."""

    batch_size: int | None
    drop_last: bool
    _active: Callable[[], Epoch | None]
    _dispatcher: Dispatcher | None
    _stream: StreamPool | None
    _stream_workers: int
    _recipe: BatchRecipe
    _finish: Callable[[Any], Any] | None
    _auto_collation: bool
    _inline_wait_s: float
    _pipeline: Pipeline | None
    _split: int | None
    _device_stage: DeviceStage | None
    _stage_wait_s: float

    def __len__(self) -> int: ...

    def _record(self, batch_samples: int, skipped: Skipped) -> None: ...


class Epoch:
    """What both kinds of epoch share: position, the supersession check, the counters."""

    plan: EpochPlan | None = None

    def __init__(self, loader: Loader, epoch: int, position: int) -> None:
        self.loader = loader
        self.epoch = epoch
        self.position = position
        self.finished = False

    def __iter__(self) -> Epoch:
        return self

    def __next__(self) -> Any:
        raise NotImplementedError

    def check_current(self) -> None:
        if self.loader._active() is not self:
            raise RuntimeError(
                "this epoch's iterator was superseded by a newer iter(loader), set_epoch() or "
                "load_state_dict()"
            )


@dataclass
class _Ahead:
    """The next batch, taken from the reorder buffer and being staged in the stage's thread."""

    batch_id: int
    entry: Entry
    staged: Future[Staged]


class MapEpoch(Epoch):
    """Yields one epoch's batches of a map-style dataset, in order.

    With worker processes and a device stage that has work, batch ``b + 1`` is taken from the
    reorder buffer as soon as it is there and staged in the stage's thread while the training
    loop steps on batch ``b``; it still counts as undelivered (``position``) until returned.
    """

    def __init__(self, loader: Loader, plan: EpochPlan, start: int, fresh: bool) -> None:
        super().__init__(loader, plan.epoch, start)
        self._ahead: _Ahead | None = None
        self.plan = plan
        self.finished = start >= len(plan)
        if loader._dispatcher is not None and not self.finished:
            loader._dispatcher.start_epoch(plan, start, fresh_workers=fresh)

    def __len__(self) -> int:
        assert self.plan is not None
        return len(self.plan) - self.position

    def __next__(self) -> Any:
        self.check_current()
        loader = self.loader
        while not self.finished:
            batch, samples, skipped = self._make_next()
            loader._record(samples, skipped)
            # With batch_size=None a sample may itself be None; a skipped one is not delivered.
            if batch is not None or (samples and not loader._auto_collation):
                return batch
        raise StopIteration

    def _make_next(self) -> tuple[Any, int, Skipped]:
        loader, plan = self.loader, self.plan
        assert plan is not None
        dispatcher = loader._dispatcher
        if self.position >= len(plan):
            self.finished = True
            return None, 0, []
        batch_id = self.position
        if dispatcher is None:
            indices = plan.batch(batch_id)
            start = time.perf_counter()
            stop = loader._split
            try:
                with preserved_global_rngs():
                    made = make_batch(loader._recipe, plan.seed, self.epoch, indices, stop)
            finally:
                self._advance()
                loader._inline_wait_s += time.perf_counter() - start
            batch = made.batch
            if batch is not None and loader._finish is not None:
                batch = loader._finish(batch)
            try:
                staged = self._staged(batch, indices, made.skipped, stop)
            except Exception as exc:
                raise _stage_error(exc, batch_id, indices) from exc
            return (
                staged,
                len(indices) - len(made.skipped),
                made.skipped,
            )
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead.batch_id == batch_id:
            entry: Entry | None = ahead.entry
        else:
            entry = dispatcher.buffer.get(alive=dispatcher.alive)
        if entry is None:
            self.finished = True
            return None, 0, []
        self._advance()
        if entry.error is not None:
            error = entry.error
            if isinstance(error, SampleError) and error.detail and hasattr(error, "add_note"):
                error.add_note(f"worker traceback:\n{error.detail}")
            raise error
        indices = plan.batch(batch_id)
        try:
            if ahead is not None and ahead.batch_id == batch_id:
                batch = self._collect(ahead)
            else:
                batch = self._staged(entry.batch, indices, entry.skipped, entry.stop)
        except Exception as exc:
            raise _stage_error(exc, batch_id, indices) from exc
        self._stage_next(dispatcher)
        return batch, len(indices) - len(entry.skipped), entry.skipped

    def _stage_next(self, dispatcher: Dispatcher) -> None:
        """Start staging the next batch in the stage's thread if it has arrived already."""
        stage, plan = self.loader._device_stage, self.plan
        assert plan is not None
        if stage is None or self.finished or stage.idle(self.loader._split):
            return  # nothing to overlap: leave the next batch in the buffer (and its budget)
        entry = dispatcher.buffer.get_ready()
        if entry is None:
            return
        batch_id = self.position
        if entry.error is None and entry.batch is not None and not stage.idle(entry.stop):
            seeds = self._seeds(plan.batch(batch_id), entry.skipped)
            staged = stage.ahead(entry.batch, seeds, entry.stop)
        else:  # an error to raise, or nothing to stage: handed over as it is
            staged = Future()
            staged.set_result(Staged(entry.batch))
        self._ahead = _Ahead(batch_id, entry, staged)

    def _collect(self, ahead: _Ahead) -> Any:
        """The staged batch, waiting for its stage to finish (counted as the loop's wait)."""
        stage = self.loader._device_stage
        assert stage is not None
        began = time.perf_counter()
        try:
            staged = ahead.staged.result()
        finally:
            self.loader._stage_wait_s += time.perf_counter() - began
        return stage.finish(staged)

    def _staged(self, batch: Any, indices: list[Any], skipped: Skipped, stop: int | None) -> Any:
        """``batch`` through the device stage: moved to the loader's device, and through the
        ops of its Pipeline from ``stop``, the split it was made with."""
        stage = self.loader._device_stage
        if stage is None or batch is None:
            return batch
        seeds = self._seeds(indices, skipped) if stage.has_ops(stop) else ()
        return stage.run(batch, seeds, stop)

    def _seeds(self, indices: list[Any], skipped: Skipped) -> list[int]:
        """The seeds of a batch's delivered samples, in batch order."""
        assert self.plan is not None
        dropped = {key_of(index) for index, _ in skipped}
        return [
            sample_seed_for(self.plan.seed, self.epoch, key)
            for key in map(key_of, indices)
            if key not in dropped
        ]

    def _advance(self) -> None:
        assert self.plan is not None
        self.position += 1
        if self.position >= len(self.plan):
            self.finished = True


class StreamEpoch(Epoch):
    """One epoch over an iterable dataset: in the calling process, or round-robin over the
    stream workers. A resumed epoch replays its first ``start`` batches and drops them."""

    def __init__(self, loader: Loader, epoch: int, seed: int, start: int, fresh: bool) -> None:
        super().__init__(loader, epoch, 0)
        stream = loader._stream
        self._batches: Iterator[tuple[Any, Skipped]]
        if stream is None:
            self._batches = self._inline()
        else:
            generation = stream.start_epoch(loader._stream_workers, seed, fresh=fresh)
            self._batches = stream.batches(generation)
        for _ in range(start):
            if next(self._batches, None) is None:
                self.finished = True
                break
            self.position += 1

    def __len__(self) -> int:
        """Batches left, from the dataset's ``__len__`` (TypeError without one, as in torch)."""
        return max(0, len(self.loader) - self.position)

    def _inline(self) -> Iterator[tuple[Any, Skipped]]:
        loader = self.loader
        batcher = StreamBatcher(loader._recipe, loader.batch_size, loader.drop_last)
        while True:
            try:
                batch = batcher.next_batch()
            except StopIteration:
                return
            skipped, batcher.skipped = batcher.skipped, []
            yield (loader._finish(batch) if loader._finish is not None else batch), skipped

    def __next__(self) -> Any:
        self.check_current()
        loader = self.loader
        if self.finished:
            raise StopIteration
        start = time.perf_counter()
        try:
            batch, skipped = next(self._batches)
        except BaseException:  # the end of the stream, or its failure: this epoch is over
            self.finished = True
            raise
        finally:
            if loader._stream is None:
                loader._inline_wait_s += time.perf_counter() - start
        self.position += 1
        loader._record(_batch_len(batch, loader.batch_size or 1), skipped)
        stage = loader._device_stage
        return stage.run(batch, (), None) if stage is not None and batch is not None else batch


def _stage_error(exc: Exception, batch_id: int, indices: list[Any]) -> SampleError:
    """A device stage failure as the training loop sees it: naming the batch, its indices and
    the op, and an instance of the original type (as a failing sample's error is)."""
    where = getattr(exc, "drapps_op", "moving the batch")
    return sample_error(
        f"the device stage failed at {where} on batch {batch_id} (indices {indices}): "
        f"{type(exc).__name__}: {exc}",
        type(exc),
        index=None,
        stage="device_stage",
        indices=indices,
        detail="".join(traceback.format_exception(exc)),
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
