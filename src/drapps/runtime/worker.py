"""Making a batch (shared by worker processes and ``workers=0``) and the worker process loop."""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import logging
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, ClassVar, Protocol

import numpy as np
import torch
from torch.utils.data import default_collate
from torch.utils.data._utils.collate import collate as collate_with
from torch.utils.data._utils.collate import collate_tensor_fn, default_collate_fn_map

from drapps.runtime.errors import (
    SampleError,
    describe_failure,
    failure,
    sample_error,
    sample_path,
)
from drapps.runtime.gil import GilMeter
from drapps.runtime.handles import shared_handle
from drapps.runtime.inbox import PARENT_GONE, Inbox, Parent
from drapps.runtime.messages import BatchFailed, BatchMade, BatchTask, WorkerFatal
from drapps.runtime.plan import Repeats
from drapps.runtime.progress import SampleClock, current_clock, use_clock
from drapps.runtime.sampling import key_of
from drapps.runtime.seeding import (
    answer_worker_info_per_thread,
    clear_sample,
    epoch_seeds,
    global_states,
    moved_generators,
    repeat_seed,
    sample_seed,
    seed_sample,
    seed_sample_later,
    seed_worker,
    set_worker_info,
    worker_info_hidden,
)
from drapps.runtime.slabs import (
    SharedMemoryFullError,
    SlabArena,
    SlabWriter,
    stack_at_first_dtype,
    uniform_cpu_tensors,
)
from drapps.runtime.transport import Packed, pack, pack_inline, send_message

logger = logging.getLogger(__name__)


class SampleStore(Protocol):
    """What a worker asks of the sample cache (:class:`drapps.cache.SampleCache` is the one
    member): the runtime sits below the cache and knows it only by this contract."""

    def begin_batch(self) -> bool:
        """Whether the cache takes part in this batch."""
        ...

    def held_ops(self, split: int) -> int:
        """How many of a Pipeline's first ``end`` ops an entry stands for."""
        ...

    def get(self, index: Any, ops: int) -> Any:
        """The sample stored for ``index`` after ``ops`` ops, or None."""
        ...

    def put(self, index: Any, ops: int, sample: Any, make_ns: int) -> None:
        """Store ``sample`` for ``index``; ``make_ns`` is what making it cost."""
        ...

    def end_batch(self, lossy: bool) -> None:
        """The batch is made (``lossy``: a lossy entry was read in it)."""
        ...


@dataclass(frozen=True)
class BatchRecipe:
    """Everything a worker needs to turn indices into a batch (sent to each worker once)."""

    dataset: Any
    transform: Callable[[Any], Any] | None
    collate_fn: Callable[[Any], Any]
    on_error: str
    auto_collation: bool = True
    """False for ``batch_size=None``: each task is one sample, passed to ``collate_fn`` alone."""
    worker_init_fn: Callable[[int], None] | None = None
    """Called with the worker's id in each new worker process, as DataLoader does."""
    cache: SampleStore | None = None
    """The sample cache (map-style datasets): samples after the transform's deterministic
    prefix, made once and read back in later epochs."""
    reseed: bool = True
    """Seed Python's, NumPy's and torch's global RNGs before each sample from (seed, epoch,
    index), so that its draws are the same whichever worker makes it. False: leave them to
    draw on as each worker's own, seeded once when it starts, as DataLoader's (what a
    ``worker_init_fn`` seeds then holds); :func:`drapps.sample_rng` is per sample either way."""
    reseed_torch: bool = False
    """With ``reseed`` False, still seed torch's default generator before each sample: a
    sample may read its seed (``torch.initial_seed()``) without drawing, which no check of
    the generators after a batch sees (the loop's checked batches,
    :meth:`~drapps.engines.inline.InlineEngine.check_draws`)."""
    first_dtype: bool = False
    """Stack a batch's tensors at its first sample's dtype in worker processes, as
    DataLoader's workers do (a fixed count); False: as DataLoader without workers, the
    default count's stand-in (:class:`~drapps.runtime.slabs.SlabArena`)."""
    watch_draws: bool = False
    """Watch the first :data:`WATCHED_SAMPLES` samples a worker makes for draws from a
    global generator, and say so in the reply (see :class:`Watch`): the evidence a pool
    that may move to threads needs (:class:`~drapps.runtime.executor_pool.ExecutorPool`)."""
    getitems: bool = False
    """Take a whole batch's samples from one call of the dataset's ``__getitems__``, as
    DataLoader's fetcher does (:func:`fetches_batches`); its batches are then never made in
    parts (:func:`splittable`). False where the loader makes samples apart by choice
    (``dispatch="samples"``, ``defer_after``), and for a transform of drapps' own."""


WATCHED_SAMPLES = 8
"""Samples each worker process watches for draws from a global generator (with
``BatchRecipe.watch_draws``); a watched sample costs about 30 us more."""


_UNMEASURED = contextlib.nullcontext()
"""The context of a sample not watched (one, reused: samples past the watch pay nothing more)."""


class Watch:
    """This process's watch of its first samples for draws from a global generator."""

    left = WATCHED_SAMPLES
    watched = 0
    drew: str | None = None
    gil = GilMeter()
    """How much of the watched samples' time ran Python bytecode (:mod:`drapps.runtime.gil`)."""

    @classmethod
    def end(cls, before: Any, samples: int, who: str) -> None:
        """``samples`` watched, the global generators' states ``before`` them given
        (:func:`global_states`); ``who`` names what made them, for the evidence's words."""
        cls.left -= samples
        cls.watched += samples
        moved = moved_generators(before, global_states())
        if moved and cls.drew is None:
            cls.drew = f"{' and '.join(moved)} ({who} did)"

    @classmethod
    def begin(cls) -> None:
        """Watch afresh: in a new worker process, which may have been forked from one that
        watched samples of its own (a batch the training process made in a worker's place)."""
        cls.left, cls.watched, cls.drew = WATCHED_SAMPLES, 0, None
        cls.gil = GilMeter()

    @classmethod
    def take(cls) -> tuple[int, str | None, tuple[float, float]]:
        """(samples watched, a draw seen, (seconds in Python, seconds measured)) since the
        last call."""
        taken = cls.watched, cls.drew, cls.gil.take()
        cls.watched = 0
        return taken


@dataclass
class Made:
    """A made batch and what happened while making it."""

    batch: Any | None
    """The collated batch; None when every sample of it was skipped."""
    skipped: list[tuple[int, str]] = field(default_factory=list)
    """(index, failure) of each sample skipped under ``on_error="skip"``."""
    seconds: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """Time spent in __getitem__, the transform and collate_fn."""
    costs: list[float] = field(default_factory=list)
    """Seconds each index took to fetch and transform, in the order of the indices."""
    kept: list[int] | None = None
    """With ``collate=False``: the positions (in the indices) of the samples in ``batch``."""
    cpu_s: float = 0.0
    """The CPU time the samples took, in the threads that made them."""


_SENT = {
    "dataset": "the dataset",
    "transform": "transform",
    "collate_fn": "collate_fn",
    "worker_init_fn": "worker_init_fn",
}


def unsendable(recipe: BatchRecipe) -> tuple[str, Exception] | None:
    """The first part of ``recipe`` that cannot be pickled to a spawned or forkserver worker,
    with why (a function or class defined inside a function, a lambda, an open handle); None
    when every part can be sent.

    It is pickled as a process start pickles it: objects that may cross only then
    (``multiprocessing.Value``, ``Lock``, ``Semaphore`` of a spawn or forkserver context, as
    DataLoader's workers receive them) are sendable; those of a fork context are not, as
    under DataLoader.
    """
    from multiprocessing import context
    from multiprocessing.reduction import ForkingPickler

    previous = context.get_spawning_popen()
    context.set_spawning_popen(_TrialStart())  # type: ignore[arg-type]
    try:
        for part, name in _SENT.items():
            try:
                ForkingPickler.dumps(getattr(recipe, part))
            except Exception as exc:  # pickle raises PicklingError, AttributeError, TypeError
                return name, exc
    finally:
        context.set_spawning_popen(previous)
    return None


class _TrialStart:
    """Stands for a starting process while :func:`unsendable` pickles: what a process start
    would pass along (a descriptor) is only counted."""

    def __init__(self) -> None:
        self.fds: list[int] = []

    def DupFd(self, fd: int) -> int:  # multiprocessing's name for it
        self.fds.append(fd)
        return len(self.fds) - 1

    def duplicate_for_child(self, fd: int) -> int:
        self.fds.append(fd)
        return fd


def collate(recipe: BatchRecipe, samples: list[Any], arena: SlabArena | None = None) -> Any:
    """``collate_fn`` over the samples (or over the one sample when auto-batching is off).

    torch's ``default_collate`` runs with ``get_worker_info()`` hidden, so that it does not
    allocate its output in shared memory (see :func:`worker_info_hidden`); given the worker's
    ``arena``, it stacks tensors straight into the slab the batch will cross in.
    """
    batch = samples if recipe.auto_collation else samples[0]
    if recipe.collate_fn is default_collate:
        with worker_info_hidden():
            if arena is not None:
                return collate_with(batch, collate_fn_map=arena.collate_map)
            if recipe.first_dtype:  # a worker with no slab (threads, Ray, Redis)
                return collate_with(batch, collate_fn_map=_FIRST_DTYPE_MAP)
            return default_collate(batch)
    return recipe.collate_fn(batch)


def make_batch(
    recipe: BatchRecipe,
    seed: int,
    epoch: int,
    indices: list[Any],
    split: Any = None,
    *,
    collate: bool = True,
    arena: SlabArena | None = None,
    sample_threads: int = 1,
    key: Hashable = None,
    timed: bool = True,
    repeats: Repeats = None,
) -> Made:
    """Fetch, transform and collate ``indices``, seeding each sample from (seed, epoch, index).

    ``split``: with a :class:`drapps.ops.Pipeline` transform, run only its ops before this
    split (the rest run on the batch after the reorder buffer); None runs it whole. A
    :class:`drapps.ops.cut.Cut` (a split with an offload share) cuts only the samples it
    offloads there and runs the others whole.
    ``collate=False``: return the list of samples made (a part of a batch, which the training
    process collates with the batch's other parts) and their positions in ``Made.kept``.
    ``arena``: collate into this slab (see :func:`collate`).
    ``sample_threads``: make up to this many samples at once, each in a thread of this
    process (:class:`SampleThreads`): for samples that wait (on reads, on storage), which the
    caller has seen draw from no global generator. The batch is the same: samples are
    collated in the indices' order, and a failure raised is the first in that order. Not
    while the sample cache takes part, nor while this process watches its first samples.
    ``key``: the task's, under which :meth:`SampleThreads.start` may have begun its samples.
    ``timed=False``: the samples' costs are wall times, not net of their wait for a core (a
    system call a sample saved where nothing reads the costs: a batch made in the loop).
    ``repeats``: how many times the epoch drew each of ``indices`` before (the plan's
    :meth:`repeats_of`; None: none), which seeds each repeat's draws apart.

    Raises:
        SampleError: a sample failed and ``on_error="raise"``, or collate_fn failed.
    """
    cache = recipe.cache if recipe.cache is not None and recipe.cache.begin_batch() else None
    maker = _SampleMaker(
        recipe, seed, epoch, indices, split, cache, current_clock(), timed, repeats
    )
    if collate and cache is None and recipe.getitems:
        fetched = maker.at_once(indices)
        if fetched is not None:
            return _collate_fetched(recipe, fetched, indices, split, arena)
        made, cpu_s = maker.in_turn(indices)  # it failed: sample by sample, skipping those
    elif sample_threads > 1 and cache is None and SampleThreads.may_run(recipe):
        made = SampleThreads.make_all(key, maker, sample_threads)
        if indices:
            # The global generators as one sample after another leaves them, for a
            # collate_fn that draws: seeded for the last (which drew nothing from them).
            seed_sample(maker.seed_at(len(indices) - 1), reseed=recipe.reseed)
            clear_sample()
        cpu_s = sum(m.cpu_s for m in made)
    else:
        made, cpu_s = maker.in_turn(indices)
    if cache is not None:
        cache.end_batch(not all(m.exact for m in made))
    samples = [m.sample for m in made if m.skipped is None]
    kept = [m.position for m in made if m.skipped is None]
    skipped = [m.skipped for m in made if m.skipped is not None]
    costs = [m.cost for m in made]
    fetch_s, transform_s = sum(m.fetch_s for m in made), sum(m.transform_s for m in made)
    if not collate:
        return Made(samples, skipped, (fetch_s, transform_s, 0.0), costs, kept, cpu_s)
    if skipped and not samples:
        return Made(None, skipped, (fetch_s, transform_s, 0.0), costs, cpu_s=cpu_s)
    t2 = time.perf_counter()
    batch = collate_samples(recipe, samples, split, indices, arena=arena)
    seconds = (fetch_s, transform_s, time.perf_counter() - t2)
    return Made(batch, skipped, seconds, costs, cpu_s=cpu_s)


@dataclass
class _Fetched:
    """What one call of a dataset's ``__getitems__`` returned, and what it cost."""

    samples: Any
    seconds: float
    cpu_s: float


def _collate_fetched(
    recipe: BatchRecipe, fetched: _Fetched, indices: list[Any], split: Any, arena: Any
) -> Made:
    """The batch of what ``__getitems__`` returned, each sample costed an equal share."""
    t0 = time.perf_counter()
    batch = collate_samples(recipe, fetched.samples, split, indices, arena=arena)
    share = fetched.seconds / max(1, len(indices))
    seconds = (fetched.seconds, 0.0, time.perf_counter() - t0)
    return Made(batch, [], seconds, [share] * len(indices), cpu_s=fetched.cpu_s)


def fetches_batches(dataset: Any, auto_collation: bool, transform: Any) -> bool:
    """Whether a whole batch's samples may come from one call of ``dataset.__getitems__``,
    as DataLoader's fetcher takes them: it has one, batches are collated, and no transform
    of drapps' own runs on each sample (see :attr:`BatchRecipe.getitems`)."""
    getitems = getattr(dataset, "__getitems__", None)
    return auto_collation and transform is None and callable(getitems) and bool(getitems)


@dataclass
class _Sample:
    """One sample made (or skipped), and what it cost."""

    position: int
    sample: Any = None
    skipped: tuple[Any, str] | None = None
    exact: bool = True
    fetch_s: float = 0.0
    transform_s: float = 0.0
    cost: float = 0.0
    cpu_s: float = 0.0


def samples_cpu_clock() -> Callable[[], float]:
    """The clock of the CPU time samples made in this thread spend (one after another, or by
    one ``__getitems__`` call): the process's where this is its only Python thread (a worker
    process), so that the native threads a sample starts (a BLAS matrix product's, OpenMP's)
    count as its CPU, not as time it waited; this thread's where others share the process
    (thread workers, the training loop), whose CPU is not the samples'."""
    return time.process_time if threading.active_count() == 1 else time.thread_time


class _SampleMaker:
    """Makes the samples of one task, one call a sample (in any thread)."""

    def __init__(
        self,
        recipe: BatchRecipe,
        seed: int,
        epoch: int,
        indices: list[Any],
        split: Any,
        cache: SampleStore | None,
        clock: SampleClock | None,
        timed: bool = True,
        repeats: Repeats = None,
    ) -> None:
        self.recipe, self.seed, self.epoch, self.indices = recipe, seed, epoch, indices
        self.repeats = repeats
        self.split, self.cache, self.clock = split, cache, clock
        # A sample's cost is net of its wait for a core (a schedstat read a sample) where
        # someone reads it: a worker's dispatcher does, a batch made in the loop has no reader.
        self.queued = runqueue_wait if timed else _not_read
        self.seed_of = epoch_seeds(seed, epoch)
        pipeline: Any = recipe.transform if hasattr(recipe.transform, "run_sample") else None
        end = pipeline.stop_of(split) if pipeline is not None else split
        self.pipeline = pipeline
        self.held = cache.held_ops(end) if cache is not None and end is not None else 0

    def __call__(self, position: int, index: Any, clocked: bool) -> _Sample:
        """Sample ``index`` (at ``position`` in the task), made or skipped; ``clocked``: say
        so on the worker's clock (one sample at a time).

        Raises:
            SampleError: it failed and ``on_error="raise"``.
        """
        cpu = time.thread_time()
        clock = self.clock if clocked else None
        t0 = time.perf_counter()
        made, _, _, _ = self.make(position, index, clock, t0, self.queued(), t0)
        made.cpu_s = time.thread_time() - cpu
        return made

    def in_turn(self, indices: list[Any]) -> tuple[list[_Sample], float]:
        """The samples of ``indices``, one after another in this thread, and the CPU seconds
        they took. Each sample is timed from where the one before ended: one reading of the
        clocks a sample, and of the CPU clock a batch (each is a system call on some hosts,
        about a microsecond, which a sample made in memory notices).

        Raises:
            SampleError: one failed and ``on_error="raise"``.
        """
        made: list[_Sample] = []
        cpu_clock = samples_cpu_clock()
        cpu = cpu_clock()
        now, queued = time.perf_counter(), self.queued()
        read_at = now
        if self._plain():
            try:
                for position, index in enumerate(indices):
                    sample, now = self.make_plain(position, index, now)
                    made.append(sample)
            finally:
                clear_sample()  # once: each sample's entry replaces the one before
            return made, cpu_clock() - cpu
        for position, index in enumerate(indices):
            sample, now, queued, read_at = self.make(
                position, index, self.clock, now, queued, read_at
            )
            made.append(sample)
        return made, cpu_clock() - cpu

    def _plain(self) -> bool:
        """Whether :meth:`make_plain` makes these samples: nothing but the dataset and a
        plain transform takes part (no cache, no Pipeline, no clock, no watch), and their
        costs are wall times (a batch made in the training process)."""
        recipe = self.recipe
        return (
            self.queued is _not_read
            and self.cache is None
            and self.pipeline is None
            and self.clock is None
            and not (recipe.watch_draws and Watch.left > 0)
        )

    def make_plain(self, position: int, index: Any, t0: float) -> tuple[_Sample, float]:
        """:meth:`make` where :meth:`_plain` holds, with the time it ended: the same sample
        and the same record, about a microsecond sooner (a sample made in memory notices).
        The sample is left entered; :meth:`in_turn` leaves the batch's last one.

        Raises:
            SampleError: it failed and ``on_error="raise"``.
        """
        recipe = self.recipe
        self._enter(position, index)
        made = _Sample(position)
        stage = "__getitem__"
        try:
            sample = recipe.dataset[index]
            t1 = time.perf_counter()
            made.fetch_s = t1 - t0
            if recipe.transform is not None:
                stage = "transform"
                sample = recipe.transform(sample)
                made.transform_s = time.perf_counter() - t1
            made.sample = sample
        except Exception as exc:
            self._failed(made, index, stage, exc)
        except SystemExit as exc:
            self._failed(made, index, stage, sample_exit(exc))
        end = time.perf_counter()
        made.cost = end - t0
        return made, end

    def at_once(self, indices: list[Any]) -> _Fetched | None:
        """What one call of the dataset's ``__getitems__`` returns for ``indices`` (passed to
        collate_fn as it is, as DataLoader does), seeded as its first sample is (its draws
        are the batch's, not each sample's); None when it failed under ``on_error="skip"``
        (the caller makes the samples one at a time, to skip only those that fail).

        Raises:
            SampleError: the call failed and ``on_error="raise"``.
        """
        recipe, dataset = self.recipe, self.recipe.dataset
        cpu_clock = samples_cpu_clock()
        cpu = cpu_clock()
        t0, queued = time.perf_counter(), self.queued()
        if indices:
            self._enter(0, indices[0])
        watched = global_states() if recipe.watch_draws and Watch.left > 0 else None
        measured = Watch.gil.measure() if watched is not None else _UNMEASURED
        fetched: Any = None
        failed = False
        try:
            with measured:
                fetched = dataset.__getitems__(list(indices))
        except Exception as exc:
            failed = True
            if recipe.on_error != "skip":
                raise failure(
                    exc,
                    f"__getitems__ failed on the batch of indices {indices}",
                    stage="__getitems__",
                    indices=indices,
                ) from exc
        finally:
            clear_sample()
            if watched is not None:
                Watch.end(watched, len(indices), "__getitems__")
        if failed:
            return None
        seconds = time.perf_counter() - t0 - (self.queued() - queued)
        return _Fetched(fetched, seconds, cpu_clock() - cpu)

    def _enter(self, position: int, index: Any) -> None:
        """Enter sample ``index`` at ``position``: its seed set (the global RNGs reseeded from
        it where the recipe says), or left to mix if asked for (``sample_seed()``,
        ``sample_rng()``)."""
        recipe = self.recipe
        if recipe.reseed or recipe.reseed_torch or self.pipeline is not None:  # ops need it
            seed = self.seed_at(position, index)
            seed_sample(seed, reseed=recipe.reseed, torch_too=recipe.reseed_torch)
        else:
            repeat = self.repeats[position] if self.repeats is not None else 0
            seed_sample_later(self.seed, self.epoch, key_of(index), repeat)

    def seed_at(self, position: int, index: Any = None) -> int:
        """The seed of the sample at ``position`` (``index``: its key, if at hand)."""
        first = self.seed_of(key_of(self.indices[position] if index is None else index))
        return first if self.repeats is None else repeat_seed(first, self.repeats[position])

    def make(
        self,
        position: int,
        index: Any,
        clock: SampleClock | None,
        t0: float,
        queued: float,
        read_at: float,
    ) -> tuple[_Sample, float, float, float]:
        """Sample ``index``, timed from ``t0`` (``time.perf_counter()``), with the time it
        ended, the last reading of :func:`runqueue_wait` and when that was taken.

        ``queued`` is that reading as of ``read_at``. It is read again as the sample ends only
        once :data:`QUEUED_READ_S` has passed since (a read is a system call of about 2 us,
        which samples made in memory notice): a sample that took less than that is costed at
        its wall time, off by at most that; one that waited for a core (a time slice, a
        millisecond or more) is costed net of the wait since the last read, which is its own
        but for at most :data:`QUEUED_READ_S` of the samples before it.

        Raises:
            SampleError: it failed and ``on_error="raise"``.
        """
        recipe, cache, held, pipeline = self.recipe, self.cache, self.held, self.pipeline
        self._enter(position, index)
        watched = global_states() if recipe.watch_draws and Watch.left > 0 else None
        stage = "__getitem__"
        if clock is not None:
            clock.begin_sample(position)
        measured = Watch.gil.measure() if watched is not None else _UNMEASURED
        made = _Sample(position)
        try:
            with measured:
                hit = cache.get(index, held) if cache is not None else None
                if hit is None:
                    sample = recipe.dataset[index]
                t1 = time.perf_counter()
                made.fetch_s = t1 - t0
                stage = "transform"
                written_s = 0.0  # the cache's write: counted with the fetch it stands in for
                if hit is not None:
                    sample, made.exact = hit
                elif cache is not None:
                    if held:
                        sample = pipeline.run_sample(sample, 0, held)
                    written = time.perf_counter()
                    cache.put(index, held, sample, int((written - t0) * 1e9))
                    written_s = time.perf_counter() - written
                if pipeline is not None:
                    start = held if cache is not None else 0
                    sample = pipeline.run_cut(sample, start, self.split, sample_seed())
                elif recipe.transform is not None:
                    sample = recipe.transform(sample)
                made.fetch_s += written_s
                made.transform_s = time.perf_counter() - t1 - written_s
                made.sample = sample
        except Exception as exc:
            self._failed(made, index, stage, exc)
        except SystemExit as exc:
            self._failed(made, index, stage, sample_exit(exc))
        finally:
            clear_sample()
            if clock is not None:
                clock.end_sample()
            if watched is not None:
                Watch.end(watched, 1, f"sample {index!r}")
        end = time.perf_counter()
        wall = end - t0
        if end - read_at < QUEUED_READ_S or self.queued is _not_read:
            made.cost = wall
            return made, end, queued, read_at
        end_queued = self.queued()
        made.cost = wall - min(end_queued - queued, wall)
        return made, end, end_queued, end

    def _failed(self, made: _Sample, index: Any, stage: str, exc: Exception) -> None:
        """Sample ``index`` failed in ``stage``: raised, named, or (``on_error="skip"``)
        recorded in ``made`` as skipped.

        Raises:
            SampleError: ``on_error="raise"``.
        """
        recipe = self.recipe
        path = sample_path(recipe.dataset, index)
        what = f"sample {index}" + (f" ({path})" if path else "") + f" failed in {stage}"
        if recipe.on_error != "skip":
            raise failure(
                exc, what, index=index, stage=stage, path=path, indices=self.indices
            ) from exc
        made.skipped = (index, describe_failure(what, exc))


class SampleThreads:
    """This process's threads for making several samples at once (``sample_threads``).

    A worker process whose samples wait (a read of 1 ms that is now and then 60 ms, object
    storage) spends most of a batch waiting on one read after another; its threads wait on
    several at once, without a process per read. The batch is still collated, written and
    sent by the worker's own thread, in the order of its indices, with the global generators
    as one sample after another would leave them. The threads also begin the samples of the
    tasks waiting in the worker's inbox (:meth:`start`, with torch's default collate), so
    that a batch held by one slow read does not leave the others idle. They live as long as
    the process, as many as the largest count asked for, ``threads`` of them at work at
    once."""

    _pool: ThreadPoolExecutor | None = None
    _size = 0
    _gate: tuple[int, threading.Semaphore] = (0, threading.Semaphore(0))
    _begun: ClassVar[dict[Hashable, list[Future[_Sample]]]] = {}

    refused: str | None = None
    """Why this process's samples are made one at a time though threads were asked for, in
    words (the dataset holds an open handle); None while they may run in threads."""

    @classmethod
    def begin(cls) -> None:
        """None yet, nor refused: in a new worker process, forked from one whose threads are
        gone and whose refusal was about its own dataset."""
        cls._pool, cls._size, cls.refused = None, 0, None
        cls._gate = (0, threading.Semaphore(0))
        cls._begun = {}

    @classmethod
    def may_run(cls, recipe: BatchRecipe) -> bool:
        """Whether samples may be made in threads now: not while this process still
        watches its first samples, one at a time, for draws from a global generator, nor
        once its dataset holds an open handle that the threads would share (opened in a
        sample, seen after it: :func:`~drapps.runtime.handles.shared_handle`)."""
        if recipe.watch_draws and Watch.left > 0:
            return False
        if cls.refused is None and (handle := shared_handle(recipe.dataset)) is not None:
            cls.refused = f"the dataset holds {handle}"
        return cls.refused is None

    @classmethod
    def start(cls, key: Hashable, maker: _SampleMaker, threads: int) -> None:
        """Begin the samples of the task ``key`` (made by ``maker``), ``threads`` at a time,
        for :meth:`make_all` to take."""
        if key in cls._begun:
            return
        pool, (_, gate) = cls._threads(threads), cls._gate

        def run(position: int, index: Any) -> _Sample:
            with gate:
                return maker(position, index, False)

        cls._begun[key] = [pool.submit(run, p, i) for p, i in enumerate(maker.indices)]

    @classmethod
    def make_all(cls, key: Hashable, maker: _SampleMaker, threads: int) -> list[_Sample]:
        """Every sample of the task ``key`` (begun by :meth:`start`, or now), in its
        indices' order; the first failure in that order is raised once every sample begun
        for the task has ended (none is left running into the next task)."""
        cls.start(key, maker, threads)
        futures = cls._begun.pop(key)
        made: list[_Sample] = []
        clock = maker.clock
        try:
            for position, future in enumerate(futures):
                if clock is not None:
                    clock.begin_sample(position)  # the sample the batch now waits on
                made.append(future.result())
        except BaseException:
            for future in futures:
                future.cancel()
            concurrent.futures.wait(futures)
            raise
        finally:
            if clock is not None:
                clock.end_sample()
        return made

    @classmethod
    def close(cls) -> None:
        """End this process's sample threads, after the samples they hold (a later task
        starts new ones)."""
        if cls._pool is not None:
            cls._pool.shutdown(wait=True)
        cls._pool, cls._size = None, 0
        cls._begun.clear()

    @classmethod
    def _threads(cls, threads: int) -> ThreadPoolExecutor:
        # The worker's own thread hides get_worker_info() while it collates (see
        # worker_info_hidden): from itself only, not from the samples made beside it.
        answer_worker_info_per_thread()
        if cls._pool is None or cls._size < threads:
            # The smaller pool's threads finish what they were given, then exit.
            if cls._pool is not None:
                cls._pool.shutdown(wait=False)
            cls._pool = ThreadPoolExecutor(threads, thread_name_prefix="drapps-sample")
            cls._size = threads
        if cls._gate[0] != threads:
            cls._gate = (threads, threading.Semaphore(threads))
        return cls._pool


def begin_waiting(recipe: BatchRecipe, tasks: list[BatchTask]) -> None:
    """Begin in threads the samples of the tasks waiting in a worker's inbox that ask for
    them (:class:`SampleThreads`). Not with a ``collate_fn`` of the user's: it runs in the
    worker's thread while those samples are made, and one that draws from a global generator
    would draw after whichever sample seeded it last."""
    if recipe.cache is not None or recipe.collate_fn is not default_collate:
        return
    if not SampleThreads.may_run(recipe):
        return
    for task in tasks:
        if task.sample_threads > 1:
            maker = _SampleMaker(
                recipe, task.seed, task.epoch, task.indices, task.split, None, None,
                repeats=task.repeats,
            )  # fmt: skip
            SampleThreads.start(task_key(task), maker, task.sample_threads)


def task_key(task: BatchTask) -> Hashable:
    """What names a task among those a worker holds."""
    return (task.generation, task.batch_id, task.part)


class _SchedStat:
    """The opening thread's ``/proc/thread-self/schedstat``, kept open (a read is ~0.5 us)
    and closed with the thread's local data."""

    def __init__(self) -> None:
        self.fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)

    def __del__(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


_threads = threading.local()


def _forget_schedstat() -> None:  # a forked child's open file is its parent's thread's
    global _threads
    _threads = threading.local()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_schedstat)


QUEUED_READ_S = 50e-6
"""How long a worker makes samples between two readings of its wait for a core (see
:meth:`_SampleMaker.make`)."""


def _not_read() -> float:
    return 0.0


def runqueue_wait() -> float:
    """Seconds this thread has spent runnable but waiting for a core, since it started.

    A sample's cost is its wall time less this wait: the work it took and the storage it
    waited on, without the time the scheduler gave its core to another process. Without it,
    more workers than cores make cheap samples look slow (a worker preempted mid-sample waits
    a time slice or two), and uniform costs look heavy-tailed. 0.0 where the kernel does not
    say (not Linux, no schedstats): costs are then wall times.
    """
    local = _threads
    stat: _SchedStat | None = getattr(local, "stat", None)
    if stat is None:
        if getattr(local, "missing", False):
            return 0.0
        try:
            stat = local.stat = _SchedStat()
        except OSError:
            local.missing = True
            return 0.0
    try:
        return int(os.pread(stat.fd, 64, 0).split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        local.missing, local.stat = True, None
        return 0.0


_NUMPY_DTYPES = frozenset(
    {torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64}
    | {torch.float16, torch.float32, torch.float64}
)


def _stack_in_this_thread(batch: Any, *, collate_fn_map: Any = None) -> torch.Tensor:
    """``torch.stack(batch)`` for same-shaped dense CPU tensors, copied by NumPy in the calling
    thread: torch's own copy spreads a large stack over its intra-op threads, whose spinning
    the training process pays for on every batch (measured: 37 against 12 ms of CPU per batch
    of 32 224x224 images, collated in the training process on 2 cores)."""
    first = batch[0]
    if first.dtype in _NUMPY_DTYPES and uniform_cpu_tensors(batch):
        out = torch.empty((len(batch), *first.shape), dtype=first.dtype)
        np.stack([t.numpy() for t in batch], out=out.numpy())
        return out
    return collate_tensor_fn(batch, collate_fn_map=collate_fn_map)


_ONE_THREAD_MAP = {**default_collate_fn_map, torch.Tensor: _stack_in_this_thread}
# A batch whose parts fixed-count workers made is stacked as one of those workers would.
_ONE_THREAD_FIRST_DTYPE_MAP: dict[Any, Callable[..., Any]] = {
    **default_collate_fn_map,
    torch.Tensor: functools.partial(stack_at_first_dtype, otherwise=_stack_in_this_thread),
}
_FIRST_DTYPE_MAP = {**default_collate_fn_map, torch.Tensor: stack_at_first_dtype}


def fresh_batches(recipe: BatchRecipe, split: Any) -> bool:
    """Whether every batch is memory its collate made: torch's ``default_collate`` over
    samples stacks each tensor and array into a new one and rebuilds every list and dict.
    Otherwise a batch may hold what the dataset returned (``batch_size=None``, a
    ``collate_fn`` of the user's, a Pipeline split whose parts are listed), which a batch made
    in the training process then shares with the dataset (see
    :func:`~drapps.runtime.transport.owned`)."""
    return recipe.auto_collation and recipe.collate_fn is default_collate and split is None


def collate_samples(
    recipe: BatchRecipe,
    samples: list[Any],
    split: Any,
    indices: Any,
    *,
    one_thread: bool = False,
    arena: SlabArena | None = None,
) -> Any:
    """The batch of ``samples`` as the recipe collates it (a Pipeline split before its end
    collates each part of a sample its own way). ``one_thread``: torch's default_collate
    stacks tensors in the calling thread (the training process collating parts); ``arena``:
    into the worker's slab.

    Raises:
        SampleError: collate_fn failed (naming ``indices``).
    """

    def collate_rest(rest: list[Any]) -> Any:
        if one_thread and recipe.collate_fn is default_collate:
            one = _ONE_THREAD_FIRST_DTYPE_MAP if recipe.first_dtype else _ONE_THREAD_MAP
            with worker_info_hidden():
                return collate_with(rest, collate_fn_map=one)
        return collate(recipe, rest, arena)

    try:
        if split is not None:  # a Pipeline split before its end: its parts may differ in shape
            pipeline: Any = recipe.transform
            return pipeline.collate(samples, collate_rest, split)
        return collate_rest(samples)
    except Exception as exc:
        raise failure(
            exc,
            f"collate_fn failed on the batch of indices {indices}",
            stage="collate_fn",
            indices=indices,
        ) from exc


def splittable(recipe: BatchRecipe) -> bool:
    """Whether a batch may be made in parts by several workers and collated where they meet:
    batches of samples (not ``batch_size=None``) collated by torch's ``default_collate`` or a
    Pipeline's collate, which hold no state and run the same in any process; and whose
    samples are seeded each on its own (``reseed``), so that they draw the same whichever
    workers make the parts. Not a batch taken from ``__getitems__`` (``getitems``): that is
    made, and seeded, whole."""
    return (
        recipe.reseed
        and recipe.auto_collation
        and recipe.collate_fn is default_collate
        and not recipe.getitems
    )


def run_worker(
    recipe: BatchRecipe,
    worker_id: int,
    tasks: Connection,
    results: Connection,
    parent_pid: int,
    slot: int = 0,
    num_workers: int = 1,
    base_seed: int = 0,
    clock: SampleClock | None = None,
) -> None:
    """The worker process: take :class:`BatchTask` messages (see :func:`answer`) until
    ``None``; :class:`SlabsFreed` says which of its slabs the training process has released
    (:class:`SlabWriter`).

    ``slot`` is the worker's id as ``torch.utils.data.get_worker_info()`` reports it (0 to
    ``num_workers - 1``; a replacement takes the id of the worker it replaces). ``clock``:
    where this worker tells the training process which sample it is making.

    Replies as :func:`answer` says. Exits by itself when its parent dies.
    """
    enter_worker_process()
    Watch.begin()
    SampleThreads.begin()
    use_clock(clock)
    seed_worker(base_seed, slot)
    set_worker_info(slot, num_workers, base_seed, recipe.dataset)
    init_error = run_worker_init(recipe, slot)
    writer = SlabWriter()
    arena = SlabArena(writer, first_dtype=recipe.first_dtype)
    inbox = Inbox(tasks, Parent(parent_pid), writer.released)
    read_ahead = read_ahead_of(recipe)
    if clock is not None:
        clock.mark_ready()
    try:
        while (task := inbox.next()) is not PARENT_GONE:
            if task is None:
                return  # asked to stop
            if read_ahead is not None or task.sample_threads > 1:
                held = [task, *inbox.waiting()]
                if read_ahead is not None:
                    hint_reads(read_ahead, held)
                if task.sample_threads > 1:
                    begin_waiting(recipe, held)
            if clock is not None:
                clock.begin_task(task.batch_id, task.part)
            if (task.num_workers, task.seed) != (num_workers, base_seed):
                num_workers, base_seed = task.num_workers, task.seed
                set_worker_info(slot, num_workers, base_seed, recipe.dataset)
            reply = answer(
                recipe, task, lambda batch: pack_batch(batch, writer, arena), init_error, arena
            )
            send_message(results, reply, writer)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the parent closed our pipes: it is gone or shutting down
    except SystemExit:
        raise  # SIGTERM: exit with its code
    except BaseException:
        # Tell the dispatcher why we die (it names this in the error it raises), then die.
        with contextlib.suppress(Exception):
            results.send(WorkerFatal(traceback.format_exc()))
        raise
    finally:
        writer.close()  # slabs have no names: what the training process maps stays with it


def answer(
    recipe: BatchRecipe,
    task: BatchTask,
    pack: Callable[[Any], Packed],
    init_error: SampleError | None = None,
    arena: SlabArena | None = None,
) -> BatchMade | BatchFailed:
    """The reply to one task, whoever runs it (a worker process, a Ray actor, a thread).

    ``task.part`` None asks for the whole batch collated, an int for those samples uncollated
    (one part of a batch cut among workers). ``arena``: the slab a whole batch is collated
    into, which ``pack`` sends (:class:`~drapps.runtime.slabs.SlabArena`).
    """
    generation, batch_id, indices, part = task.generation, task.batch_id, task.indices, task.part
    if init_error is not None:
        return BatchFailed(generation, batch_id, init_error, part)
    try:
        try:
            made = make_batch(
                recipe, task.seed, task.epoch, indices, task.split, collate=part is None,
                arena=arena if part is None else None, sample_threads=task.sample_threads,
                key=task_key(task), repeats=task.repeats,
            )  # fmt: skip
        except SampleError as exc:
            return BatchFailed(generation, batch_id, exc, part)
        try:
            packed = None if made.batch is None else pack(made.batch)
        except Exception as exc:  # the batch cannot cross: unpicklable, slab unwritable
            error = transport_error(batch_id, indices, exc)
            return BatchFailed(generation, batch_id, error, part)
    finally:
        if arena is not None:
            arena.reset()  # a batch that failed or was not sent gives its slab back
    watched, drew, (python_s, measured_s) = (
        Watch.take() if recipe.watch_draws else (0, None, (0.0, 0.0))
    )
    if watched and Watch.left <= 0:
        SampleThreads.may_run(recipe)  # the evidence threads need: no handle they would share
    return BatchMade(
        generation, batch_id, packed, made.skipped, made.seconds, made.costs, part, made.kept,
        watched, drew, python_s, measured_s, made.cpu_s,
        SampleThreads.refused,
    )  # fmt: skip


def transport_error(
    batch_id: int, indices: list[Any] | None, exc: Exception, *, received: bool = False
) -> SampleError:
    """The error for a batch that was made but cannot cross to the training process (or,
    ``received``, crossed and cannot be rebuilt there: see
    :class:`~drapps.runtime.transport.RebuildError`)."""
    which = f"batch {batch_id}" if indices is None else f"batch {batch_id} (indices {indices})"
    failed = "rebuilt in" if received else "sent to"
    return sample_error(
        f"{which} was made but could not be {failed} the training process: "
        f"{type(exc).__name__}: {exc}",
        type(exc),
        stage="transport",
        indices=indices,
        detail="".join(traceback.format_exception(exc)),
    )


def enter_worker_process() -> None:
    """What every drapps worker process does first."""
    # Ctrl-C reaches the whole process group; the training process decides what happens.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # SIGTERM to the job's process group (timeout, systemd, scancel): leave through the
    # caller's cleanup rather than die mid-write.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    # Intra-op threads in every worker would oversubscribe the cores the pool is sized for.
    torch.set_num_threads(1)


def read_ahead_of(recipe: BatchRecipe) -> Callable[[Sequence[Any]], None] | None:
    """The dataset's ``read_ahead(indices)`` hint, if it has one and no sample cache stands in
    front of it (a cached sample is not read, and reading it anyway would spend the storage
    the cache is there to save)."""
    method = getattr(recipe.dataset, "read_ahead", None)
    return method if callable(method) and recipe.cache is None else None


def hint_reads(read_ahead: Callable[[Sequence[Any]], None], tasks: list[BatchTask]) -> None:
    """Tell the dataset which indices come next, the current task's first. A hint that fails
    is dropped: the sample itself then fails in ``__getitem__``, named as usual."""
    for task in tasks:
        try:
            read_ahead(list(task.indices))
        except Exception as exc:
            logger.debug("read_ahead(%r) failed: %s", task.indices, repr(exc))


class Terminated(SystemExit):
    """A SIGTERM in a worker process: it leaves with 128 + the signal's number as its code."""


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated(128 + signum)


def sample_exit(exc: SystemExit) -> RuntimeError:
    """A sample that called ``sys.exit()`` in a worker: that sample's failure (DataLoader's
    worker exits, and its loop raises "worker exited unexpectedly", naming no sample; a
    retry would exit the next worker the same way). In the training process it exits as it
    does there, and a SIGTERM ends the worker.

    Raises:
        SystemExit: ``exc``, outside a worker or for a SIGTERM.
    """
    if isinstance(exc, Terminated) or torch.utils.data.get_worker_info() is None:
        raise exc
    return RuntimeError(f"the sample called sys.exit({exc.code!r}), which does not end a worker")


def run_worker_init(recipe: BatchRecipe, slot: int) -> SampleError | None:
    """Run ``worker_init_fn``; its failure is answered to every task instead of a crash."""
    if recipe.worker_init_fn is None:
        return None
    try:
        recipe.worker_init_fn(slot)
    except Exception as exc:
        return failure(
            exc,
            f"worker_init_fn failed in worker {slot}",
            stage="worker_init_fn",
        )
    return None


_warned_full = False


def pack_batch(
    batch: Any, writer: SlabWriter | None = None, arena: SlabArena | None = None
) -> Packed:
    """The batch in a slab (the ``arena`` it was collated into, one ``writer`` took back, or a
    new one); through the pipe instead when shared memory is full."""
    global _warned_full
    try:
        return pack(batch, writer, arena=arena)
    except SharedMemoryFullError as exc:
        if not _warned_full:
            _warned_full = True
            logger.warning("%s; sending batches through the worker's pipe meanwhile", str(exc))
        return pack_inline(batch)
