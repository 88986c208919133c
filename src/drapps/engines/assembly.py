"""A loader's moving parts, built from its settings and stopped together.

:func:`assemble` builds the sample cache, the batch recipe, the Pipeline's split and device
stage, chooses the engine (:func:`~drapps.engines.choice.choose_engine`), and starts the tuner
over the knobs each owner gives. :class:`Parts` merges their counters into one
:class:`~drapps.runtime.stats.PipelineSnapshot` and shuts them down in order. It never holds
the loader, so a loader stays collectable while its controller thread runs.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable
from typing import Any

from drapps.cache.sample_cache import SampleCache
from drapps.cache.setup import open_cache
from drapps.control.knobs import CodecKnob, Knob, OffloadKnob, SplitKnob
from drapps.control.policy import check_policy
from drapps.engines.backends import Backend, source_engine
from drapps.engines.base import Engine
from drapps.engines.choice import choose_engine
from drapps.engines.cursor import EpochCursor
from drapps.engines.epoch import Delivered, Epoch
from drapps.engines.sharding import CoreClaim
from drapps.engines.source import Source
from drapps.engines.tuner import AutoTuner, make_tuner
from drapps.ops.device_stage import DeviceStage, resolve_device
from drapps.ops.split import Split
from drapps.runtime.config import LoaderConfig
from drapps.runtime.pinning import pinner
from drapps.runtime.stats import LoaderStats, PipelineSnapshot
from drapps.runtime.worker import BatchRecipe, fetches_batches

THREAD_PREFIX = "drapps-"
"""How the names of drapps' own threads begin (workers, dispatcher, controller, sample
threads)."""


class Parts:
    """The engine and the other owners of a loader's knobs and counters."""

    def __init__(
        self,
        engine: Engine,
        *,
        stage: DeviceStage | None = None,
        cache: SampleCache | None = None,
        split: Split | None = None,
        claim: CoreClaim | None = None,
    ) -> None:
        self.engine, self.stage, self.cache, self.split = engine, stage, cache, split
        self.claim = claim
        self.delivered = Delivered()
        self.tuner: AutoTuner | None = None
        self.owner = os.getpid()
        self.closed = False
        self.turn = threading.RLock()
        """Held while an epoch starts or takes a batch from the engine: an ``iter(loader)``
        in one thread waits for a ``next()`` under way in another, so a batch of the new
        epoch never reaches the iterator it superseded."""

    def snapshot(self) -> PipelineSnapshot:
        """Every part's counters now, in one snapshot."""
        snapshot = self.engine.snapshot(self.delivered.samples)
        if self.cache is not None:
            snapshot = dataclasses.replace(snapshot, cache=self.cache.stats())
        if self.stage is None:
            return snapshot
        seconds, batches = self.stage.totals()
        return dataclasses.replace(
            snapshot,
            wait_s=snapshot.wait_s + self.delivered.stage_wait_s,
            split=self.split.value if self.split is not None else None,
            offload=self.split.share if self.split is not None and self.split.shared else None,
            device_s=seconds,
            device_batches=batches,
            device_squeezed=self.stage.squeezed,
        )

    def stats(self) -> LoaderStats:
        """The snapshot and what the epochs delivered so far (the loader's ``stats()``)."""
        d = self.delivered
        return LoaderStats.of(
            self.snapshot(),
            epoch=d.epoch,
            batches=d.batches,
            samples_skipped=d.samples_skipped,
            skipped=tuple(d.skipped),
            first_batch_s=d.first_batch_s,
            loading_s=d.loading_s,
        )

    def report(self, length: Callable[[], int], persistent_workers: bool, workers: Any) -> str:
        """The loader's ``report()``, from the tuner's rows and :meth:`stats` (``length``: the
        loader's ``len()``; ``workers``: its setting, an int or "auto")."""
        from drapps.telemetry.report import bottleneck_report

        tuner = self.tuner
        if tuner is None:
            return (
                "No report: this loader was made with telemetry=False, which turns off what "
                "the report reads."
            )
        rows = list(tuner.rows)
        stats = self.stats()
        try:  # an epoch's samples, from the batches in one and the samples per batch so far
            epoch_samples = round(length() * stats.samples / stats.batches) or None
        except (TypeError, ZeroDivisionError):  # no length, or no batch yet
            epoch_samples = None
        return bottleneck_report(
            rows,
            stats.as_dict(),
            persistent_workers=persistent_workers if self.engine.workers else None,
            epoch_samples=epoch_samples,
            workers=workers,
        )

    def start_epoch(self, cursor: EpochCursor, length: Callable[[], int]) -> Epoch:
        """The iterator of the epoch ``cursor`` holds next (``length``: the loader's
        ``len()``, for an iterable dataset's epoch).

        Raises:
            RuntimeError: called in a process other than the one that made the parts.
        """
        if os.getpid() != self.owner:
            raise RuntimeError(
                f"this drapps.Loader belongs to process {self.owner}; a forked child "
                f"(pid {os.getpid()}) cannot iterate it: make a new Loader in the child"
            )
        self.delivered.begin()
        if self.claim is not None:
            self.claim.claim(self.engine)
        split = self.split
        with self.turn:
            live = cursor.under_way()
            if isinstance(live, Epoch) and live.step_aside():
                cursor.step_aside(live)  # else superseded: its next() says so
            job = cursor.next_job(self.engine.workers)
            epoch = Epoch(
                job,
                self.engine,
                self.stage,
                self.delivered,
                is_current=cursor.is_current,
                split=(lambda: split.value) if split is not None else (lambda: None),
                length=length,
                reported=lambda: cursor.reported,
                dataset=cursor.dataset,
                batched=cursor.batched,
                batch_size=cursor.batch_size or 1,
                turn=self.turn,
                ended=cursor.ended,
                closed=lambda: self.closed,
            )
            self.delivered.epoch = job.epoch
            epoch.on_let_go = cursor.follow(epoch)
        if self.tuner is not None:  # its threads start after the epoch's workers' zygote
            self.tuner.start()
        return epoch

    def knobs(self) -> list[Knob]:
        """The knobs beside the engine's: the split and the offload share (moved only where
        workers make batches) and the cache's codec."""
        knobs: list[Knob] = []
        split = self.split
        if split is not None and self.engine.tunable:
            points = split.points
            knobs.append(
                SplitKnob(split.set, low=points[0], high=points[-1], adjustable=split.adjustable)
            )
            if split.shared:
                knobs.append(OffloadKnob(split.set_share, adjustable=split.share_adjustable))
        if self.cache is not None:
            choices = (*(c.name for c in self.cache.codecs), "off")
            adjustable = self.cache.settings.codec == "auto" and len(choices) > 2
            knobs.append(CodecKnob(self.cache.set_codec, choices=choices, adjustable=adjustable))
        return knobs

    def shutdown(self) -> None:
        """Stop the tuner, the engine, the stage and the cache, in that order. Idempotent.

        Called on one of drapps' own threads (a garbage collection that ran there found the
        loader unreachable, or a dataset closed it from a worker thread), it hands the work
        to a thread of its own and returns: stopping joins the loader's threads, perhaps
        the very one it was called on, which would wait for itself until a timeout.
        """
        # Only the process that made the loader acts: a forked child inherits its finalizer
        # (and may collect its copy of the loader), and must not stop its parent's workers.
        if os.getpid() != self.owner:
            return
        self.closed = True
        if threading.current_thread().name.startswith(THREAD_PREFIX):
            # Not a daemon: an interpreter that exits now waits for the workers to stop.
            threading.Thread(target=self._stop, name="drapps-closer").start()
            return
        self._stop()

    def _stop(self) -> None:
        if self.tuner is not None:
            self.tuner.stop()
        self.engine.shutdown()
        if self.claim is not None:
            self.claim.release()
        if self.stage is not None:
            self.stage.close()
        if self.cache is not None:
            self.cache.close()  # after the workers: none of them is writing to it any more


def assemble(
    config: LoaderConfig,
    dataset: Any,
    *,
    collate_fn: Callable[[Any], Any],
    worker_init_fn: Callable[[int], None] | None,
    batched: bool,
    iterable: bool,
    cache: Any,
    device: Any,
    backend: Backend,
    pin_memory_device: str,
    engine: Engine | None = None,
) -> tuple[Parts, LoaderConfig]:
    """Build what a loader with ``config`` runs; returns it with the config as the backend
    bounds it (a Ray cluster's CPUs cap ``max_workers``).

    Args:
        engine: one made already (a source's), which then runs alone.
    """
    c = config
    check_policy(c.policy)
    if engine is not None:
        parts = Parts(engine)
        parts.tuner = make_tuner(c, parts.snapshot, engine)
        return parts, c
    backend.check(c.workers, dataset, cache)
    if not backend.local or not backend.caches:
        # Ray's actors may run elsewhere, out of reach of this machine's memory; threads
        # would share one process's handles.
        cache = None
    resolved = resolve_device(device)
    on_cuda = resolved is not None and resolved.type == "cuda"
    # A non-blocking copy to the GPU needs page-locked memory: pin as batches arrive.
    finish = pinner(c.pin_memory or on_cuda, "" if on_cuda else pin_memory_device)
    split = Split.of(c.transform, c.split, indexed=not iterable, batched=batched, offload=c.offload)
    stage = None
    if split is not None or resolved is not None:
        stage = DeviceStage(split.pipeline if split is not None else None, resolved or "cpu")
    samples = open_cache(cache, dataset, c.transform, iterable=iterable)
    # A Pipeline goes to the workers whole; each task says where to split it.
    recipe = BatchRecipe(
        dataset,
        c.transform,
        collate_fn,
        c.on_error,
        batched,
        worker_init_fn,
        cache=samples,
        reseed=c.seeds_per_sample,
        first_dtype=c.workers not in ("auto", 0),  # stacked as DataLoader's workers do
        getitems=not c.makes_samples_apart
        and not iterable
        and fetches_batches(dataset, batched, c.transform),
    )
    try:
        engine, c = choose_engine(c, recipe, backend, finish, split, iterable)
    except BaseException:
        for part in (stage, samples):
            if part is not None:
                part.close()
        raise
    claim = CoreClaim(c.min_workers) if c.workers == "auto" and backend.local else None
    parts = Parts(engine, stage=stage, cache=samples, split=split, claim=claim)
    if split is not None:
        split.listen(engine.set_split)
    try:
        parts.tuner = make_tuner(
            c,
            parts.snapshot,
            engine,
            claim.grant if claim is not None else None,
            knobs=parts.knobs(),
        )
    except BaseException:  # e.g. an unwritable trace path: free what was set up
        parts.shutdown()
        raise
    return parts, c


def open_source(
    source: Any, changed: set[str], batch_size: Any, prefetch: Any, timeout: Any, pin_memory: bool
) -> tuple[Engine, Any]:
    """The engine that reads ``source``'s batches (a URL or a :class:`Source`), connected,
    and the stand-in for the producers' dataset (its length).

    Args:
        changed: the loader's arguments given other than their defaults: those of the
            dataset side are refused, naming where they belong.

    Raises:
        ValueError: an unknown source, or an argument the producers own.
    """
    spec = source if isinstance(source, Source) else Source(source)
    engine: Engine = source_engine(spec.url)(
        spec,
        changed=changed,
        batch_size=batch_size,
        prefetch=prefetch,
        timeout=timeout,
        finish=pinner(pin_memory),
    )
    return engine, engine.dataset  # type: ignore[attr-defined]
