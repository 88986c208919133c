"""The Loader: a drop-in for ``torch.utils.data.DataLoader`` whose worker pool can change size.

Example:
    >>> import torch, drapps
    >>> data = [torch.full((2,), i) for i in range(10)]
    >>> with drapps.Loader(data, batch_size=4, workers=0) as loader:
    ...     [batch.shape for batch in loader]
    [torch.Size([4, 2]), torch.Size([4, 2]), torch.Size([2, 2])]
"""

from __future__ import annotations

import multiprocessing
import os
import secrets
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Literal

from torch.utils.data import default_collate

from drapps._autotune import AutoTuner, make_tuner
from drapps.control.policy import Policy
from drapps.runtime.config import LoaderConfig
from drapps.runtime.dispatcher import Dispatcher
from drapps.runtime.errors import SampleError
from drapps.runtime.plan import Plan
from drapps.runtime.seeding import preserved_global_rngs
from drapps.runtime.stats import LoaderStats
from drapps.runtime.worker import BatchRecipe, make_batch

_STATE_VERSION = 1
_KEPT_SKIPS = 100


class Loader:
    """Batches from a map-style dataset, made by a worker pool whose size may change mid-epoch.

    Batch ``b`` of epoch ``e`` holds the same samples, in the same order, with the same
    augmentation randomness whatever the worker count, resizes or worker restarts: before sample
    ``i`` is fetched, Python's ``random``, NumPy's global RNG and torch's default generator are
    seeded from ``(seed, e, i)``, and :func:`drapps.sample_rng` gives an explicit generator. Each
    ``iter(loader)`` is the next epoch (:meth:`set_epoch` overrides). Workers persist across
    epochs until :meth:`close` (or garbage collection, or the end of the with-block).

    Args:
        dataset: any map-style dataset (``__len__`` and ``__getitem__``).
        batch_size: samples per batch.
        shuffle: visit the dataset in an order drawn from (seed, epoch).
        seed: seeds order and augmentation; None draws one at random (kept in ``state_dict``).
        drop_last: drop a last batch shorter than ``batch_size``.
        collate_fn: list of samples -> batch; default ``torch.utils.data.default_collate``.
        transform: callable applied to each sample in the worker (must pickle for spawn).
        workers: 0 (calling process), an int (fixed), or "auto".
        max_workers: bound on ``workers`` and :meth:`resize` (default twice the usable cores).
        prefetch: batches made ahead in total, or "auto" (two per worker).
        memory_budget: bytes ready batches may hold ("auto", an int, or "512MB"/"2GiB").
        on_error: "raise" (error names the index) or "skip" (skipped and counted).
        timeout: seconds before a worker stuck on one batch is replaced and the batch retried
            (worker processes only: with ``workers=0`` nothing can replace the caller).
        max_attempts: attempts at a batch whose worker keeps dying or hanging.
        multiprocessing_context: "fork", "spawn" or "forkserver" (default: platform's).
        policy: with ``workers="auto"``, the controller's policy: "heuristic" (default),
            "rl" (the learned policy shipped with drapps), "static", or any object with
            ``decide(state) -> Action``.
        min_workers: the fewest workers the controller may go down to.
        control_interval: seconds between controller ticks.
        trace: write every tick's State, Action and Reward to this JSONL file.
        progress: show a live one-line status on stderr.

    Raises:
        ValueError: for any invalid argument, naming it and what it received.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int = 1,
        shuffle: bool = False,
        seed: int | None = 0,
        drop_last: bool = False,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        transform: Callable[[Any], Any] | None = None,
        workers: int | Literal["auto"] = "auto",
        max_workers: int | None = None,
        prefetch: int | Literal["auto"] = "auto",
        memory_budget: int | str = "auto",
        on_error: Literal["raise", "skip"] = "raise",
        timeout: float | None = 60.0,
        *,
        max_attempts: int = 3,
        multiprocessing_context: str | None = None,
        policy: str | Policy = "heuristic",
        min_workers: int = 1,
        control_interval: float = 0.5,
        trace: str | os.PathLike[str] | None = None,
        progress: bool = False,
    ) -> None:
        if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
            raise ValueError(
                "dataset must be a map-style dataset with __len__ and __getitem__, "
                f"got {type(dataset).__name__}"
            )
        if seed is None:
            seed = secrets.randbits(63)
        self.config = LoaderConfig(
            batch_size=batch_size,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            collate_fn=collate_fn,
            transform=transform,
            workers=workers,
            max_workers=max_workers,
            prefetch=prefetch,
            memory_budget=memory_budget,
            on_error=on_error,
            timeout=timeout,
            max_attempts=max_attempts,
            multiprocessing_context=multiprocessing_context,
            policy=policy,
            min_workers=min_workers,
            control_interval=control_interval,
            trace=None if trace is None else os.fspath(trace),
            progress=progress,
        )
        self.dataset = dataset
        self._recipe = BatchRecipe(
            dataset, transform, collate_fn or default_collate, seed, on_error
        )
        self._memory_budget = self.config.resolved_memory_budget
        self._dispatcher: Dispatcher | None = None
        workers_now = self.config.initial_workers
        if workers_now > 0:
            context = None
            if multiprocessing_context is not None:
                context = multiprocessing.get_context(multiprocessing_context)
            self._dispatcher = Dispatcher(
                self._recipe,
                workers=workers_now,
                prefetch=None if prefetch == "auto" else prefetch,
                memory_budget=self._memory_budget,
                timeout=timeout,
                max_attempts=max_attempts,
                context=context,
            )
        self._tuner = make_tuner(self)
        # Runs on close(), garbage collection or interpreter exit, whichever comes first; it
        # holds the tuner and dispatcher, never the loader, so the loader stays collectable.
        self._finalizer = weakref.finalize(self, _shutdown, self._tuner, self._dispatcher)
        self._lock = threading.Lock()
        self._closed = False
        self._next_epoch = 0
        self._next_batch = 0
        self._active: _EpochIterator | None = None
        self._epoch = -1
        self._batches = 0
        self._samples = 0
        self._skipped: list[tuple[int, str]] = []
        self._skipped_total = 0
        self._inline_wait_s = 0.0

    # -------------------------------------------------------------------------- iteration

    def __len__(self) -> int:
        return len(self._plan(0))

    def __iter__(self) -> Iterator[Any]:
        if self._closed:
            raise RuntimeError("this drapps.Loader is closed")
        if self._tuner is not None:
            self._tuner.start()
        with self._lock:
            plan = self._plan(self._next_epoch)
            start = self._next_batch
            self._next_epoch, self._next_batch = plan.epoch + 1, 0
            self._epoch = plan.epoch
            iterator = _EpochIterator(self, plan, start)
            self._active = iterator
        return iterator

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter(loader)`` run ``epoch`` (from its first batch)."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
        with self._lock:
            self._next_epoch, self._next_batch = epoch, 0
            self._active = None

    def _plan(self, epoch: int) -> Plan:
        c = self.config
        return Plan(len(self.dataset), c.batch_size, c.shuffle, c.drop_last, c.seed, epoch)

    # ------------------------------------------------------------------------------ resume

    def state_dict(self) -> dict[str, Any]:
        """Where iteration stands: loading it into a new loader resumes at the next batch."""
        with self._lock:
            active = self._active
            if active is not None and not active.finished:
                epoch, next_batch = active.plan.epoch, active.position
            else:
                epoch, next_batch = self._next_epoch, self._next_batch
        c = self.config
        return {
            "version": _STATE_VERSION,
            "epoch": epoch,
            "next_batch": next_batch,
            "seed": c.seed,
            "num_samples": len(self.dataset),
            "batch_size": c.batch_size,
            "shuffle": c.shuffle,
            "drop_last": c.drop_last,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`: the next ``iter(loader)`` yields the remaining batches.

        Raises:
            ValueError: the state is malformed or was taken from a loader with another seed,
                dataset length, batch size, shuffle or drop_last.
        """
        if not isinstance(state, dict):
            raise ValueError(f"state must be a dict from Loader.state_dict(), got {state!r}")
        if state.get("version") != _STATE_VERSION:
            raise ValueError(
                f"state version must be {_STATE_VERSION}, got {state.get('version')!r}"
            )
        current = self.state_dict()
        for key in ("seed", "num_samples", "batch_size", "shuffle", "drop_last"):
            if state.get(key) != current[key]:
                raise ValueError(
                    f"state was saved with {key}={state.get(key)!r} but this loader has "
                    f"{key}={current[key]!r}"
                )
        epoch, next_batch = state.get("epoch"), state.get("next_batch")
        if not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"state epoch must be an int >= 0, got {epoch!r}")
        if not isinstance(next_batch, int) or not 0 <= next_batch <= len(self._plan(epoch)):
            raise ValueError(
                f"state next_batch must be in [0, {len(self._plan(epoch))}], got {next_batch!r}"
            )
        with self._lock:
            self._next_epoch, self._next_batch = epoch, next_batch
            self._active = None

    # ----------------------------------------------------------------------------- control

    def resize(self, workers: int) -> None:
        """Change the worker count now, mid-epoch, without losing or reordering data.

        Growing reuses workers parked by a recent shrink, else starts processes at once.
        Shrinking parks the surplus workers: they finish the batches they hold and take no
        more; a parked worker not reused within 5 seconds exits.

        Raises:
            ValueError: ``workers`` is not in [1, max_workers], or this loader has no pool
                (it was made with ``workers=0``).
        """
        limit = self.config.resolved_max_workers
        if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= limit:
            raise ValueError(f"workers must be an int in [1, {limit}], got {workers!r}")
        if self._dispatcher is None:
            raise ValueError("resize() needs worker processes; this loader was made with workers=0")
        self._dispatcher.resize(workers)

    def stats(self) -> LoaderStats:
        """Counters of what the loader has done so far."""
        d = self._dispatcher
        if d is None:
            counters: dict[str, float] = {}
            pids: tuple[int, ...] = ()
            target = depth = 0
        else:
            counters = d.snapshot()
            pids = d.pool.pids()
            target, depth = d.target_workers, d.prefetch_depth
        buffer = d.buffer if d is not None else None
        return LoaderStats(
            epoch=self._epoch,
            batches=self._batches,
            samples=self._samples,
            samples_skipped=self._skipped_total,
            skipped=tuple(self._skipped),
            workers=len(d.pool.live()) if d is not None else 0,
            target_workers=target,
            worker_pids=pids,
            prefetch_depth=depth,
            ready_batches=len(buffer) if buffer is not None else 0,
            ready_bytes=buffer.bytes if buffer is not None else 0,
            peak_ready_bytes=buffer.peak_bytes if buffer is not None else 0,
            memory_budget=self._memory_budget,
            in_flight=d.in_flight() if d is not None else 0,
            wait_s=buffer.wait_s if buffer is not None else self._inline_wait_s,
            worker_restarts=int(counters.get("worker_restarts", 0)),
            timeouts=int(counters.get("timeouts", 0)),
            retries=int(counters.get("retries", 0)),
            pickled_bytes=int(counters.get("pickled_bytes", 0)),
            shared_bytes=int(counters.get("shared_bytes", 0)),
            fetch_s=counters.get("fetch_s", 0.0),
            transform_s=counters.get("transform_s", 0.0),
            collate_s=counters.get("collate_s", 0.0),
        )

    def report(self) -> str:
        """A bottleneck report in plain words and figures, from the controller's telemetry.

        Telemetry is recorded with ``workers="auto"``, ``trace=...`` or ``progress=True``.
        """
        from drapps.telemetry.report import bottleneck_report

        rows = list(self._tuner.rows) if self._tuner is not None else []
        return bottleneck_report(rows, self.stats().as_dict())

    def _record(self, batch_samples: int, skipped: list[tuple[int, str]]) -> None:
        self._batches += batch_samples > 0
        self._samples += batch_samples
        if skipped:
            self._skipped_total += len(skipped)
            self._skipped = (self._skipped + skipped)[-_KEPT_SKIPS:]

    # --------------------------------------------------------------------------- lifecycle

    def close(self) -> None:
        """Stop the controller and the workers, free their shared memory. Idempotent."""
        self._closed = True
        self._finalizer()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _shutdown(tuner: AutoTuner | None, dispatcher: Dispatcher | None) -> None:
    if tuner is not None:
        tuner.stop()
    if dispatcher is not None:
        dispatcher.shutdown()


class _EpochIterator:
    """Yields one epoch's batches in order; superseded by the loader's next ``iter()``."""

    def __init__(self, loader: Loader, plan: Plan, start: int) -> None:
        self.loader = loader
        self.plan = plan
        self.position = start
        self.finished = start >= len(plan)
        if loader._dispatcher is not None and not self.finished:
            loader._dispatcher.start_epoch(plan, start)

    def __iter__(self) -> _EpochIterator:
        return self

    def __len__(self) -> int:
        return len(self.plan) - self.position

    def __next__(self) -> Any:
        loader = self.loader
        if loader._active is not self:
            raise RuntimeError(
                "this epoch's iterator was superseded by a newer iter(loader), set_epoch() or "
                "load_state_dict()"
            )
        while not self.finished:
            batch, samples, skipped = self._make_next()
            loader._record(samples, skipped)
            if batch is not None:
                return batch
        raise StopIteration

    def _make_next(self) -> tuple[Any, int, list[tuple[int, str]]]:
        loader = self.loader
        dispatcher = loader._dispatcher
        if self.position >= len(self.plan):
            self.finished = True
            return None, 0, []
        batch_id = self.position
        if dispatcher is None:
            indices = self.plan.batch(batch_id)
            start = time.perf_counter()
            try:
                with preserved_global_rngs():
                    made = make_batch(loader._recipe, self.plan.epoch, indices)
            finally:
                self._advance()
                loader._inline_wait_s += time.perf_counter() - start
            return made.batch, len(indices) - len(made.skipped), made.skipped
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
        indices = self.plan.batch(batch_id)
        return entry.batch, len(indices) - len(entry.skipped), entry.skipped

    def _advance(self) -> None:
        self.position += 1
        if self.position >= len(self.plan):
            self.finished = True
