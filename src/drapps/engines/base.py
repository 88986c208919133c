"""The engine protocol: what makes a loader's batches, behind one small contract.

A :class:`drapps.Loader` holds DataLoader's arguments and picks one engine; the engine makes the
batches of each epoch and owns the knobs that change how (workers, prefetch). Members: the
inline engine (the training process itself), the pool engine (a dispatcher over any
:class:`~drapps.runtime.pool.WorkerPool`: processes, threads, Ray actors), the stream engine
(an iterable dataset's worker processes), and the remote engine (batches from ``drapps serve``
producers through Redis). Each one passes the same conformance check (``tests/conformance.py``).
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from drapps.control.controller import Bounds, default_knobs
from drapps.control.knobs import Knob
from drapps.runtime.plan import EpochPlan
from drapps.runtime.stats import PipelineSnapshot

Skipped = list[tuple[Any, str]]


@dataclass(frozen=True)
class EpochJob:
    """One epoch an engine is asked to make."""

    epoch: int
    seed: int
    """The epoch's base seed: per-sample randomness comes from (seed, epoch, index)."""
    plan: EpochPlan | None
    """The batches by index; None for an iterable dataset, whose workers read streams."""
    start: int = 0
    """The first batch to make (a resumed epoch starts past 0)."""
    fresh: bool = False
    """Start the epoch with new workers (DataLoader's ``persistent_workers=False``)."""
    persistent: bool = True
    """Keep the workers once the epoch is over (False: they exit, as DataLoader's do)."""
    workers: int | None = None
    """An iterable dataset's resumed epoch: the workers it streamed in (None: the engine's)."""
    rngs: list[dict[str, Any]] | None = None
    """A resumed epoch of persistent stream workers: each one's RNG states at its start."""
    pipe_seed: int = 0
    """An ``IterDataPipe``'s shared seed this epoch: its shuffles draw from it, alike in every
    worker (DataLoader's shared seed). Unused by any other dataset."""
    draw: Callable[[], EpochPlan] | None = None
    """Draws the plan, where the sampler's order is drawn at the iterator's first ``next()``
    (``plan`` is None until then): DataLoader without workers calls ``iter()`` on its sampler
    as its iterator is made, and draws the first batch at the first ``next()``, so a draw from
    torch's generator in between (a model made, a second iterator's batch) comes first."""


@dataclass
class EngineBatch:
    """One batch as an engine hands it over: the batch, or the error to raise in its place."""

    batch: Any
    skipped: Skipped = field(default_factory=list)
    split: Any = None
    """The Pipeline split the batch was made with: its device stage starts there."""
    error: BaseException | None = None
    batch_id: int | None = None
    """The batch's id in its epoch when the engine may hand batches over out of order (a
    loader with ``in_order=False``); None: the next in order."""
    keys: list[Any] | None = None
    """The dataset keys the batch holds where they are not its planned batch's (a batch
    filled from made samples, ``defer_after``); None: the plan's."""
    places: list[tuple[int, int]] | None = None
    """Those samples' places in the plan: (batch id, position)."""


@dataclass(frozen=True)
class Limits:
    """What the loader bounds every engine by."""

    memory_budget: int
    """Bytes ready batches may hold."""
    max_workers: int
    """The most workers the engine may run."""


class Engine(ABC):
    """Makes the batches of one epoch at a time. Not thread-safe: the loader calls it from the
    training loop; the controller reaches it only through :meth:`knobs` and :meth:`snapshot`."""

    kind: str = ""
    """The engine's name in errors and reports."""
    holds: str = "its workers hold where the epoch stands"
    """Why an epoch under way cannot be handed over (:meth:`beside`), in an error's words."""
    tunable: bool = False
    """A controller can move its workers and prefetch while it runs."""
    count_held_by: str | None = None
    """Why a controller cannot move its worker count, in the report's words (None: not
    worth telling)."""

    @property
    @abstractmethod
    def workers(self) -> int:
        """Workers asked for now (0: batches are made in the calling process)."""

    @abstractmethod
    def start_epoch(self, job: EpochJob) -> None:
        """Begin making ``job``'s batches from ``job.start``; supersedes any epoch under way."""

    @abstractmethod
    def next(self) -> EngineBatch | None:
        """The epoch's next batch, in order, waiting for it; None once the epoch is over."""

    def ready(self) -> EngineBatch | None:
        """The next batch if it is made already, without waiting (None: not yet, or never
        ahead of the loop). What it returns is the next :meth:`next` would have returned."""
        return None

    def stream_rngs(self) -> list[dict[str, Any]] | None:
        """An iterable dataset's persistent workers: each one's RNG states at the start of
        the epoch under way (they draw on from epoch to epoch); None otherwise."""
        return None

    def end_epoch(self, job: EpochJob) -> None:
        """``job`` was iterated to its end: its workers exit unless ``job.persistent``."""
        return None

    def let_go(self, job: EpochJob) -> None:
        """``job``, the epoch under way, was let go of before its end (a loop that broke out
        of it), from its iterator's ``__del__``: its workers exit unless ``job.persistent``,
        as DataLoader's iterator shuts its workers down when it is collected. Never blocks."""
        return None

    def beside(self, job: EpochJob, start: int) -> Engine | None:
        """An engine that makes ``job``'s batches from ``start`` on in the calling process,
        beside this one, which moves on to a newer epoch (a second ``iter(loader)`` while
        the first still has batches, as DataLoader runs two iterators side by side), or in
        workers of its own; None where this engine cannot hand its epoch over (:attr:`holds`
        says why)."""
        return None

    def keep_workers(self) -> None:
        """The user set the worker count (:meth:`drapps.Loader.resize`): batches are made
        by workers from now on, where the engine could have moved them into the training
        process."""
        return None

    def resize(self, workers: int) -> None:
        """Change the worker count now, without losing or reordering data."""
        raise ValueError(
            f"resize() needs worker processes; this loader makes batches with the {self.kind} "
            "engine (workers=0)"
        )

    def set_split(self, split: Any) -> None:
        """Make batches from now on with a Pipeline transform's ops before ``split`` (an int,
        or a :class:`drapps.ops.cut.Cut` that offloads only a share of each batch)."""
        return None

    def set_prefetch(self, depth: int | None) -> None:
        """Set the batches made ahead (None: the engine's default)."""
        raise ValueError(f"the {self.kind} engine has no prefetch depth to set")

    def batch_bytes(self) -> int:
        """Bytes of the largest batch made so far (0: not known)."""
        return 0

    def knobs(self, bounds: Bounds, grant: Any = None) -> list[Knob]:
        """The knobs this engine owns (workers and prefetch), within ``bounds``. An engine
        that cannot move them lists them held, so every trace has the same columns."""
        held = dataclasses.replace(bounds, adjust_workers=False, adjust_prefetch=False)
        return default_knobs(self, held, held_by=self.count_held_by)

    @abstractmethod
    def snapshot(self, samples: int) -> PipelineSnapshot:
        """The engine's counters now, with ``samples`` delivered so far."""

    @abstractmethod
    def shutdown(self) -> None:
        """Stop every worker and free their memory. Idempotent."""
