"""The Loader: a drop-in for ``torch.utils.data.DataLoader`` whose worker pool can change size.

It holds DataLoader's arguments and checks them, as DataLoader does, and hands the work to the
parts :func:`~drapps.engines.assembly.assemble` builds: an engine that makes the batches, the
epoch cursor that plans epochs and keeps resume state, and the owners of the other knobs.

Example:
    >>> import torch, drapps
    >>> data = [torch.full((2,), i) for i in range(10)]
    >>> with drapps.Loader(data, batch_size=4, num_workers=0) as loader:
    ...     [batch.shape for batch in loader]
    [torch.Size([4, 2]), torch.Size([4, 2]), torch.Size([2, 2])]
"""

from __future__ import annotations

import os
import types
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal

import torch
from torch.utils.data import BatchSampler, default_collate, default_convert

from drapps.cache.settings import Cache
from drapps.control.policy import Policy
from drapps.engines.assembly import assemble, open_source
from drapps.engines.backends import Backend, ThreadBackend, resolve_backend
from drapps.engines.cursor import EpochCursor
from drapps.engines.source import Source
from drapps.runtime.config import (
    LoaderConfig,
    changed_arguments,
    checked_index,
    python_number,
    resolve_workers,
    warn_excessive_workers,
)
from drapps.runtime.errors import ArgumentError
from drapps.runtime.sampling import (
    check_dataset,
    check_sampling,
    default_sampler,
    is_iterable_dataset,
    readable_keys,
    set_pipe_shuffles,
    stream_length,
)
from drapps.runtime.stats import LoaderStats, PipelineSnapshot


class _DataLoaderAttributes:
    """DataLoader's attribute rules: ``Loader[T]`` in annotations, and the attributes that fix
    what an epoch holds refuse a new value once the loader is made (DataLoader raises
    ValueError rather than silently keep the old one).

    DataLoader reads its other arguments again as each ``iter()`` makes its workers, so a
    ``collate_fn`` or ``worker_init_fn`` set on it (Lightning sets the latter under
    ``seed_everything(workers=True)``) takes effect there. drapps builds its workers and
    their engine from them as the loader is made: a new value is kept in the loader's
    arguments, and the next ``iter()`` builds them again with it, standing where the loader
    stood (:meth:`Loader._rebuild`). As under DataLoader, persistent workers once started
    keep what they were made with. A new ``generator`` is refused: the samplers drew from
    the one given. Setting a value equal to the one held changes nothing."""

    def __class_getitem__(cls, item: Any) -> types.GenericAlias:
        return types.GenericAlias(cls, item)

    _stale = False  # an argument DataLoader reads at iter() was set since: build again

    _FIXED = (
        "batch_size",
        "batch_sampler",
        "sampler",
        "drop_last",
        "dataset",
        "persistent_workers",
        "generator",
    )
    _READ_AT_ITER = (
        "collate_fn",
        "worker_init_fn",
        "timeout",
        "pin_memory",
        "pin_memory_device",
        "prefetch_factor",
        "in_order",
        "multiprocessing_context",
    )

    def __setattr__(self, name: str, value: Any) -> None:
        made = "_closed" in self.__dict__  # _closed: set last in __init__
        if (
            made
            and name in self._FIXED
            and not (name == "generator" and _same(self.__dict__.get(name), value))
        ):
            raise ValueError(
                f"{name} attribute should not be set after {type(self).__name__} is initialized"
            )
        if made and name in self._READ_AT_ITER and not _same(self.__dict__.get(name), value):
            self._arguments[name] = value  # type: ignore[attr-defined]
            self._stale = True
        super().__setattr__(name, value)


def _same(held: Any, value: Any) -> bool:
    """Whether ``value`` is the attribute value held (itself, or equal as plain data)."""
    if held is value:
        return True
    plain = (bool, int, float, str, type(None))
    return isinstance(held, plain) and isinstance(value, plain) and held == value


class Loader(_DataLoaderAttributes):
    """Batches from a dataset, made by a worker pool whose size may change mid-epoch.

    The arguments up to ``in_order`` are ``torch.utils.data.DataLoader``'s, in its order and
    with its meaning, so ``DataLoader(`` can be replaced by ``drapps.Loader(``. With the same
    ``torch.manual_seed`` (or ``generator``) and sampler the batches are the ones DataLoader
    gives, and with a fixed count and no ``seed`` so is what samples draw from the global
    RNGs (each worker's, seeded once). With ``workers="auto"`` or a ``seed``, batch ``b`` of an
    epoch holds the same samples with the same augmentation randomness whatever the worker
    count, resizes or worker restarts: before sample ``i`` is fetched, Python's ``random``,
    NumPy's global RNG and torch's default generator are seeded from ``(seed, epoch, i)``.
    :func:`drapps.sample_rng` gives an explicit per-sample generator either way. Each
    ``iter(loader)`` is the next epoch (:meth:`set_epoch` overrides).

    Args:
        dataset: a map-style dataset (``__getitem__``; ``__len__`` for the default samplers)
            or an iterable one (``IterableDataset``, or any object with ``__iter__`` and no
            ``__getitem__``): each worker iterates its own copy, sharding through
            ``torch.utils.data.get_worker_info()``.
        batch_size, shuffle, sampler, batch_sampler, num_workers, collate_fn, pin_memory,
            drop_last, timeout, worker_init_fn, multiprocessing_context, generator,
            prefetch_factor, persistent_workers, pin_memory_device, in_order: DataLoader's,
            with its meaning. Where drapps differs: ``num_workers`` is ``workers``' other name
            and also takes "auto" (the default); a worker over ``timeout`` on one batch is
            replaced and the batch retried. 0 (the default, as DataLoader's) sets no fixed
            limit: a worker counts as hung once one batch takes ten times the slowest before
            it, and at least 60 s (10 minutes before its first); None: never.
        seed, transform, split, offload, device, workers, max_workers, prefetch, memory_budget,
            on_error, max_attempts, policy, min_workers, control_interval, trace, progress,
            telemetry, dispatch, lookahead, defer_after, shard_by_rank: drapps' own settings, each
            documented once, on the field of the same name of :class:`drapps.LoaderConfig`.
        cache: keep each sample as the deterministic start of the pipeline leaves it
            (``dataset[i]`` and a Pipeline's ops before its first random one) in shared
            memory and on disk, and read it back in later epochs instead of remaking it: a
            :class:`drapps.Cache` (budget, tiers, codec, ``min_psnr`` for lossy codecs),
            True (``Cache()``), None/False (off), or "auto" (the default: on, losslessly,
            for datasets that declare themselves deterministic, such as drapps' ImageFolder
            and PackedText, while the dataset fits the budget). Batches are the same with and
            without it (bit for bit with a lossless codec). See ``docs/cache.md``.
        backend: where workers run: "process" (worker processes on this machine),
            "thread" (threads of this process: no batch crosses a process boundary, for
            work that releases the GIL; a dataset that draws from a global generator or has
            a ``worker_init_fn`` keeps processes, with a warning; no sample cache, so an
            explicit ``cache`` is refused and "auto" runs without one) or "ray" (Ray actors on
            the cluster ``ray.init()`` joins, or a local one; a :class:`drapps.RayBackend`
            for its options). Batches are the same whichever runs them; the controller
            sizes threads and actors as it sizes processes. See ``docs/executors.md`` and
            ``docs/scale-out.md``.
        workers: 0 (calling process), an int (fixed), or "auto" (the default).
        max_workers: bound on ``workers`` and :meth:`resize` (default: see LoaderConfig).
        prefetch: batches made ahead in total, or "auto" (``prefetch_factor`` per worker).
        memory_budget: bytes ready batches may hold ("auto", an int, or "512MB"/"2GiB").
        on_error: "raise" (error names the index) or "skip" (skipped and counted).
        max_attempts: attempts at a batch whose worker keeps dying or hanging.
        policy: with ``workers="auto"``, the controller's policy: "heuristic" (default),
            "rl", "static", or any object with ``decide(state) -> Action``.
        min_workers: the fewest workers the controller may go down to.
        control_interval: seconds between controller ticks.
        trace: write every tick's State, Action and Reward to this JSONL file.
        progress: print a status line to stderr every 5 s (10 s into a file) once batches
            flow: samples/s and the loop's wait averaged over that span, workers, ready
            batches, CPU, memory (a shorter run gets one line when the loader closes).
        telemetry: watch the pipeline and the machine on a background thread for
            :meth:`report`, whatever the worker count (True, the default); False turns it off
            where nothing is tuned.
        shard_by_rank: under ``torch.distributed`` with no distributed sampler, give each
            rank its own shard, as ``DistributedSampler(shuffle, seed, drop_last)`` would.
        source: read batches from a Redis queue that ``drapps serve`` producers fill
            (``"redis://host:port/db?queue=NAME"``, or a :class:`drapps.Source` for its
            options) instead of making them here; the dataset side (``dataset``,
            ``transform``, workers, ...) then belongs to ``drapps serve``. Batches are those a
            local loader with the same seed gives. See ``docs/scale-out.md``.

    Raises:
        ArgumentError: for any invalid argument, naming it and what it received; both a
            ``ValueError`` and a ``TypeError``, as DataLoader raises one or the other.
    """

    def __init__(
        self,
        dataset: Any = None,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Iterable[Any] | None = None,
        batch_sampler: Iterable[list[Any]] | None = None,
        num_workers: int | Literal["auto"] | None = None,
        collate_fn: Callable[[Any], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float | None = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: torch.Generator | None = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        seed: int | None = None,
        transform: Callable[[Any], Any] | None = None,
        split: int | Literal["auto"] | None = None,
        offload: float | Literal["auto"] | None = None,
        device: str | torch.device | None = None,
        cache: Cache | bool | Literal["auto"] | None = "auto",
        backend: Literal["process", "thread", "ray"] | Backend = "process",
        workers: int | Literal["auto"] | None = None,
        max_workers: int | None = None,
        prefetch: int | Literal["auto"] = "auto",
        memory_budget: int | str = "auto",
        on_error: Literal["raise", "skip"] = "raise",
        max_attempts: int = 3,
        policy: str | Policy = "heuristic",
        min_workers: int = 1,
        control_interval: float = 0.5,
        trace: str | os.PathLike[str] | None = None,
        progress: bool = False,
        telemetry: bool = True,
        dispatch: Literal["auto", "batches", "samples"] = "auto",
        lookahead: int | Literal["auto"] = "auto",
        defer_after: float | None = None,
        shard_by_rank: bool = True,
        source: str | Source | None = None,
    ) -> None:
        # DataLoader reads its flags for their truth (and counts as numbers of any kind, as
        # LoaderConfig does; batch_size is torch's samplers', an int).
        pin_memory, persistent_workers = bool(pin_memory), bool(persistent_workers)
        in_order = bool(in_order)
        named = {k: v for k, v in locals().items() if k != "self"}  # the arguments, so read
        if source is not None:  # the producers hold the dataset: learn its length from them
            given = changed_arguments(Loader.__init__, named)
            counts = python_number(prefetch), python_number(timeout)
            remote, dataset = open_source(source, given, batch_size, *counts, pin_memory)
        elif dataset is None:
            raise ArgumentError(
                "dataset is required (or source='redis://host:port/db?queue=NAME' to read the "
                "batches `drapps serve` makes)"
            )
        check_dataset(dataset)
        check_sampling(dataset, batch_size, shuffle, sampler, batch_sampler, drop_last)
        set_pipe_shuffles(dataset, shuffle)
        if generator is not None and not isinstance(generator, torch.Generator):
            raise ArgumentError(f"generator must be a torch.Generator or None, got {generator!r}")
        config = LoaderConfig.of(
            named,
            batch_size=batch_size if batch_sampler is None else None,
            shuffle=bool(shuffle),
            device=None if device is None else str(device),
            workers=0 if source is not None else resolve_workers(num_workers, workers),
            trace=None if trace is None else os.fspath(trace),
        )
        if source is None and config.workers == 0 and timeout not in (0, None):
            raise ArgumentError(
                "timeout needs num_workers > 0: with num_workers=0 each batch is made inside "
                "the training loop's own next(), which no timeout can interrupt (DataLoader "
                f"refuses it too); got timeout={timeout!r}"
            )
        # DataLoader's attributes, which frameworks read.
        self.dataset = dataset
        self.batch_size = config.batch_size
        self.drop_last = drop_last if batch_sampler is None else False
        self.generator = generator
        user_sampler = batch_sampler if batch_sampler is not None else sampler
        self.sampler: Any = sampler
        if sampler is None:  # not `or`: an empty sampler is falsy
            self.sampler = default_sampler(dataset, config.shuffle, generator)
        if batch_sampler is None and batch_size is not None:
            batch_sampler = BatchSampler(self.sampler, batch_size, drop_last)
        self.batch_sampler: Any = batch_sampler
        batched = batch_sampler is not None
        self.collate_fn = collate_fn or (default_collate if batched else default_convert)
        self.pin_memory, self.pin_memory_device = pin_memory, pin_memory_device
        self.timeout, self.worker_init_fn = timeout, worker_init_fn
        self.multiprocessing_context = config.context
        self.prefetch_factor = prefetch_factor if prefetch_factor or config.workers == 0 else 2
        self.persistent_workers, self.in_order = persistent_workers, in_order
        backend = resolve_backend(backend)
        if isinstance(backend, ThreadBackend):  # probed with the sampler's keys where it can
            backend.keys = readable_keys(
                batch_sampler if batched else self.sampler, batches=batched
            )
        # DataLoader's warning is about processes; it gives it here and as each iterator
        # starts its workers (only the first, with persistent workers).
        self._warn_workers = backend.name != "thread"
        if self._warn_workers:
            warn_excessive_workers(config.workers)
        self._iterable = is_iterable_dataset(dataset)
        self._parts, self.config = assemble(
            config,
            dataset,
            collate_fn=self.collate_fn,
            worker_init_fn=worker_init_fn,
            batched=batched,
            iterable=self._iterable,
            cache=None if source is not None else cache,
            device=device,
            backend=backend,
            pin_memory_device=pin_memory_device,
            engine=remote if source is not None else None,
        )
        index_sampler = batch_sampler if batched else self.sampler
        self._cursor = EpochCursor.of(
            self.config, dataset, index_sampler, user_sampler, generator, batched
        )
        self._arguments = named
        # Runs on close(), garbage collection or interpreter exit, whichever comes first; it
        # holds the parts, never the loader, so the loader stays collectable.
        self._finalizer = weakref.finalize(self, self._parts.shutdown)
        self._closed = False

    # -------------------------------------------------------------------------- iteration

    @property
    def num_workers(self) -> int:
        """Workers asked for now (the controller changes it under "auto"). A count set here
        takes effect at the next ``iter()``, as DataLoader's (:meth:`resize` changes it
        now, mid-epoch)."""
        if self._stale and self._asked_workers() != "auto":  # set, before the iter() that
            return int(self._asked_workers())  # applies it
        return self._parts.engine.workers

    @num_workers.setter
    def num_workers(self, workers: int | Literal["auto"]) -> None:
        if _same(self.config.workers, python_number(workers)):
            return
        resolve_workers(workers, None)  # refused now, naming it, as the constructor does
        self._arguments.update(num_workers=workers, workers=None)
        self._stale = True

    def __len__(self) -> int:
        if self._iterable:
            length = stream_length(self.dataset, self.batch_size, self.drop_last)
            self._cursor.reported = length
            return length
        return self._cursor.length()

    def __iter__(self) -> Iterator[Any]:
        if self._closed:
            raise RuntimeError("this drapps.Loader is closed")
        if self._stale and (self._set_to_no_workers() or not self._workers_kept()):
            self._rebuild()
        if self._warn_workers and not (self.persistent_workers and self._cursor.epochs_started):
            warn_excessive_workers(self.config.workers)
        return self._parts.start_epoch(self._cursor, self.__len__)

    def _workers_kept(self) -> bool:
        """Whether persistent workers have started: DataLoader's go on as they were made."""
        return self.persistent_workers and self._cursor.epochs_started > 0

    def _asked_workers(self) -> int | str:
        """The count the loader's arguments ask for now (one set since included)."""
        return resolve_workers(self._arguments["num_workers"], self._arguments["workers"])

    def _set_to_no_workers(self) -> bool:
        """Whether ``num_workers`` was set to 0: DataLoader then makes the next epoch in the
        training process, its persistent workers or not."""
        return self._asked_workers() == 0

    def _rebuild(self) -> None:
        """Build the workers and their engine again from the arguments as set now (see
        :class:`_DataLoaderAttributes`), as DataLoader makes its workers at each ``iter()``:
        the epoch cursor, the samplers and the dataset stay, so the loader stands where it
        stood. The new parts are built before the old ones stop, so an argument the
        constructor refuses is refused here, naming it, and the loader keeps what it had. A
        ``trace`` file starts over, and the report covers the run from here."""
        arguments = self._arguments
        if self._set_to_no_workers():  # what DataLoader's constructor takes only with workers
            arguments = {**arguments, "persistent_workers": False, "prefetch_factor": None}
        with warnings.catch_warnings():  # DataLoader's count warning: once, from __iter__
            warnings.filterwarnings("ignore", message="This DataLoader will create")
            fresh = type(self)(**arguments)
        fresh._finalizer.detach()  # its parts are this loader's now
        self._finalizer()
        self._parts, self.config = fresh._parts, fresh.config
        self._cursor.runs_with(fresh.config)
        self._warn_workers = fresh._warn_workers
        self._finalizer = weakref.finalize(self, self._parts.shutdown)
        self._stale = False

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter(loader)`` run ``epoch`` from its first batch; passed on to the
        sampler's own ``set_epoch`` (e.g. ``DistributedSampler``) when it has one."""
        self._cursor.set_epoch(checked_index("epoch", epoch), (self.sampler, self.batch_sampler))

    def state_dict(self) -> dict[str, Any]:
        """Where iteration stands (plain data); see :meth:`EpochCursor.state_dict
        <drapps.engines.cursor.EpochCursor.state_dict>`."""
        return self._cursor.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`: the next ``iter(loader)`` yields the remaining batches.

        Raises:
            ValueError: the state is malformed or was taken from a loader with another seed,
                dataset length, batch size, shuffle or drop_last.
        """
        self._cursor.load_state_dict(state, workers=self.num_workers)

    # ----------------------------------------------------------------------------- control

    def resize(self, workers: int) -> None:
        """Change the worker count now, mid-epoch, without losing or reordering data (an
        iterable dataset's streams cannot move: its count applies from the next epoch).
        Under ``workers="auto"`` the batches stay with workers from then on: where the
        loader made them in the training process, the workers come back.

        Raises:
            ValueError: ``workers`` is not in [1, max_workers], or this loader has no pool
                (it was made with ``workers=0``).
        """
        limit, workers = self.config.resolved_max_workers, python_number(workers)
        if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= limit:
            raise ArgumentError(f"workers must be an int in [1, {limit}], got {workers!r}")
        self._parts.engine.keep_workers()
        self._parts.engine.resize(workers)

    def set_split(self, split: int) -> None:
        """Move the split of a :class:`drapps.ops.Pipeline` transform for the batches made
        from now on (see :meth:`drapps.ops.split.Split.set`).

        Raises:
            ValueError: the transform is not a Pipeline, or this loader cannot run ``split``.
        """
        if self._parts.split is None:
            raise ValueError("set_split() needs a drapps.ops.Pipeline as the transform")
        self._parts.split.set(split)

    def set_offload(self, share: float) -> None:
        """Offload ``share`` of each batch's samples to the device stage from now on: their
        ops from the split on run there, the others' in the workers (see
        :meth:`drapps.ops.split.Split.set_share`).

        Raises:
            ValueError: the transform is not a Pipeline, or ``share`` is not in [0, 1].
        """
        if self._parts.split is None:
            raise ValueError("set_offload() needs a drapps.ops.Pipeline as the transform")
        self._parts.split.set_share(share)

    def set_codec(self, codec: str) -> None:
        """Write new cache entries with ``codec`` (one of the cache's, or "off" to bypass it).

        Raises:
            ValueError: the loader has no cache, or ``codec`` is not one of its codecs.
        """
        if self._parts.cache is None:
            raise ValueError(f"set_codec({codec!r}): this loader has no sample cache (cache=None)")
        self._parts.cache.set_codec(codec)

    def stats(self) -> LoaderStats:
        """Counters of what the loader has done so far."""
        return self._parts.stats()

    def snapshot(self) -> PipelineSnapshot:
        """The pipeline's counters now: what :meth:`stats`, the monitor and the controller read."""
        return self._parts.snapshot()

    def report(self) -> str:
        """Where the time went and what to change, in plain words and figures, from the
        telemetry recorded so far (every loader records it unless ``telemetry=False``):
        the loop's wait, throughput, each stage's share, the worker count and why, CPU,
        memory, energy, and the advice that holds for the run."""
        return self._parts.report(self.__len__, self.persistent_workers, self.config.workers)

    # --------------------------------------------------------------------------- lifecycle

    def close(self) -> None:
        """Stop the controller and the workers, free their shared memory. Idempotent."""
        self._closed = True
        self._finalizer()

    def __enter__(self) -> Loader:
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        """A copy (``copy.deepcopy``; pickle, as ``torch.multiprocessing.spawn`` sends its
        arguments) is a new loader made with the same arguments (copied, as DataLoader's
        are) and standing where this one stands (its :meth:`state_dict`), with workers of
        its own; a copy of a closed loader is closed. It writes no ``trace``: opened again,
        this loader's file would start over."""
        arguments = {**self._arguments, "trace": None}
        return (_rebuilt, (type(self), arguments, self.state_dict(), self._closed))

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _rebuilt(cls: type[Loader], arguments: dict[str, Any], state: Any, closed: bool) -> Loader:
    """A copied loader (see :meth:`Loader.__reduce__`)."""
    loader = cls(**arguments)
    loader.load_state_dict(state)
    if closed:
        loader.close()
    return loader
