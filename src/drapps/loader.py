"""The Loader: a drop-in for ``torch.utils.data.DataLoader`` whose worker pool can change size.

Example:
    >>> import torch, drapps
    >>> data = [torch.full((2,), i) for i in range(10)]
    >>> with drapps.Loader(data, batch_size=4, num_workers=0) as loader:
    ...     [batch.shape for batch in loader]
    [torch.Size([4, 2]), torch.Size([4, 2]), torch.Size([2, 2])]
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal

import torch
from torch.utils.data import BatchSampler, default_collate, default_convert

from drapps._autotune import AutoTuner, make_tuner
from drapps._epoch import Epoch, MapEpoch, StreamEpoch
from drapps.codecs.cache import SampleCache
from drapps.codecs.settings import Cache
from drapps.codecs.setup import open_cache
from drapps.control.knobs import CodecKnob, Knob, SplitKnob
from drapps.control.policy import Policy
from drapps.integrations.ray_pool import RayBackend, RayPool, check_ray_loader, resolve_backend
from drapps.ops.device_stage import DeviceStage, resolve_device
from drapps.ops.pipeline import Pipeline, check_split
from drapps.runtime.config import LoaderConfig, checked_index, resolve_workers
from drapps.runtime.cores import HostShare
from drapps.runtime.dispatcher import Dispatcher
from drapps.runtime.plan import EpochPlan, Plan, SampledPlan
from drapps.runtime.sampling import (
    check_dataset,
    check_sampling,
    default_sampler,
    draw_base_seed,
    draw_batches,
    is_distributed,
    is_iterable_dataset,
    plain_key,
    rank_shard,
    stream_length,
    world,
)
from drapps.runtime.stats import LoaderStats, PipelineSnapshot, inline_snapshot
from drapps.runtime.stream import StreamPool
from drapps.runtime.transport import pinner
from drapps.runtime.worker import BatchRecipe

logger = logging.getLogger(__name__)

_STATE_VERSION = 2
_KEPT_SKIPS = 100
_warned: set[str] = set()


class Loader:
    """Batches from a dataset, made by a worker pool whose size may change mid-epoch.

    The arguments up to ``in_order`` are ``torch.utils.data.DataLoader``'s, in its order and
    with its meaning, so ``DataLoader(`` can be replaced by ``drapps.Loader(``. With the same
    ``torch.manual_seed`` (or ``generator``) and sampler the batches are the ones DataLoader
    gives. On top of that, batch ``b`` of an epoch holds the same samples with the same
    augmentation randomness whatever the worker count, resizes or worker restarts: before
    sample ``i`` is fetched, Python's ``random``, NumPy's global RNG and torch's default
    generator are seeded from ``(seed, epoch, i)``, and :func:`drapps.sample_rng` gives an
    explicit generator. Each ``iter(loader)`` is the next epoch (:meth:`set_epoch` overrides).

    Args:
        dataset: a map-style dataset (``__getitem__``; ``__len__`` for the default samplers)
            or an iterable one (``IterableDataset``, or any object with ``__iter__`` and no
            ``__getitem__``): each worker iterates its own copy, sharding through
            ``torch.utils.data.get_worker_info()``.
        batch_size: samples per batch; None turns auto-batching off (each sample is passed
            to ``collate_fn`` alone, by default ``default_convert``).
        shuffle: visit the dataset in a random order (from ``seed``, or as DataLoader's
            ``RandomSampler`` draws it).
        sampler: yields the dataset keys of an epoch (e.g. ``DistributedSampler``).
        batch_sampler: yields lists of keys, one per batch.
        num_workers: DataLoader's name for ``workers``: 0, an int, or "auto".
        collate_fn: list of samples -> batch; default ``torch.utils.data.default_collate``.
        pin_memory: deliver batches in page-locked memory when an accelerator is present.
        drop_last: drop a last batch shorter than ``batch_size``.
        timeout: seconds a worker may spend on one batch before it is replaced and the batch
            retried (0 or None: no limit). Worker processes only.
        worker_init_fn: called with the worker id in each new worker process.
        multiprocessing_context: "fork", "spawn", "forkserver" or a context object.
        generator: the torch generator for the base seed and ``RandomSampler``.
        prefetch_factor: batches made ahead per worker (default 2).
        persistent_workers: keep workers between epochs (False: new workers every epoch).
        pin_memory_device: deprecated in torch; the current accelerator is used.
        in_order: accepted; drapps always delivers batches in order (determinism).
        seed: an int makes order and augmentation the same in every run (and lets
            :meth:`set_epoch` replay an epoch); None draws from torch's RNG as DataLoader does.
        transform: callable applied to each sample in the worker (must pickle for spawn). A
            :class:`drapps.ops.Pipeline` with a ``split`` runs its ops before the split in
            the workers and the rest on each batch after the reorder buffer, in the
            training process.
        split: with a Pipeline transform, where to cut it: an int (fixed), "auto" (the
            controller moves the cut one op at a time while training runs, keeping a move
            only if throughput rose), or None (the Pipeline's own ``split``). Batches are the
            same whatever the split (bit for bit on one device; see ``docs/device.md``).
        device: where the device stage runs: "cuda" moves each batch there from pinned
            memory on a side stream and runs the ops after the split on it, batched; None
            or "cpu" runs them in the training process. Batches are delivered on ``device``.
        cache: keep each sample as the deterministic start of the pipeline leaves it
            (``dataset[i]`` and a Pipeline's ops before its first random one) in shared
            memory and on disk, and read it back in later epochs instead of remaking it: a
            :class:`drapps.Cache` (budget, tiers, codec, ``min_psnr`` for lossy codecs),
            True (``Cache()``), None/False (off), or "auto" (the default: on, losslessly,
            for datasets that declare themselves deterministic, such as drapps' ImageFolder
            and PackedText, while the dataset fits the budget). Batches are the same with and
            without it (bit for bit with a lossless codec). See ``docs/cache.md``.
        backend: where workers run: "process" (worker processes on this machine) or "ray"
            (Ray actors on the cluster ``ray.init()`` joins, or a local one; a
            :class:`drapps.RayBackend` for its options). Batches are the same either way;
            the controller sizes the actor pool as it sizes the processes, up to the
            cluster's CPUs. See ``docs/scale-out.md``.
        workers: 0 (calling process), an int (fixed), or "auto" (the default).
        max_workers: bound on ``workers`` and :meth:`resize` (default twice the usable cores).
        prefetch: batches made ahead in total, or "auto" (``prefetch_factor`` per worker).
        memory_budget: bytes ready batches may hold ("auto", an int, or "512MB"/"2GiB").
        on_error: "raise" (error names the index) or "skip" (skipped and counted).
        max_attempts: attempts at a batch whose worker keeps dying or hanging.
        policy: with ``workers="auto"``, the controller's policy: "heuristic" (default),
            "rl", "static", or any object with ``decide(state) -> Action``.
        min_workers: the fewest workers the controller may go down to.
        control_interval: seconds between controller ticks.
        trace: write every tick's State, Action and Reward to this JSONL file.
        progress: print a status line to stderr every 5 s (10 s into a file): samples/s
            and the loop's wait averaged over that span, workers, ready batches, CPU, RSS.
        shard_by_rank: under ``torch.distributed`` with no distributed sampler, give each
            rank its own shard, as ``DistributedSampler(shuffle, seed, drop_last)`` would.
        source: read batches from a Redis queue that ``drapps serve`` producers fill
            (``"redis://host:port/db?queue=NAME"``) instead of making them here; the result
            is a :class:`drapps.integrations.remote_loader.RemoteLoader`. See
            ``docs/scale-out.md``.

    Raises:
        ValueError: for any invalid argument, naming it and what it received.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        # Loader(source="redis://...") reads batches that producers elsewhere make.
        if cls is Loader and kwargs.get("source") is not None:
            from drapps.integrations.remote_loader import RemoteLoader

            return RemoteLoader(*args, **kwargs)
        return super().__new__(cls)

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
        timeout: float | None = 60.0,
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
        device: str | torch.device | None = None,
        cache: Cache | bool | Literal["auto"] | None = "auto",
        backend: Literal["process", "ray"] | RayBackend = "process",
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
        shard_by_rank: bool = True,
        source: str | None = None,
    ) -> None:
        if source is not None:
            raise ValueError(f"source= is read by drapps.Loader itself, not {type(self).__name__}")
        if dataset is None:
            raise ValueError(
                "dataset is required (or source='redis://host:port/db?queue=NAME' to read the "
                "batches `drapps serve` makes)"
            )
        check_dataset(dataset)
        check_sampling(dataset, batch_size, shuffle, sampler, batch_sampler, drop_last)
        if generator is not None and not isinstance(generator, torch.Generator):
            raise ValueError(f"generator must be a torch.Generator or None, got {generator!r}")
        for name, flag in (("pin_memory", pin_memory), ("in_order", in_order)):
            if not isinstance(flag, bool):
                raise ValueError(f"{name} must be a bool, got {flag!r}")
        self.config = LoaderConfig(
            batch_size=batch_size if batch_sampler is None else None,
            shuffle=bool(shuffle),
            seed=seed,
            drop_last=drop_last,
            collate_fn=collate_fn,
            transform=transform,
            split=split,
            device=None if device is None else str(device),
            workers=resolve_workers(num_workers, workers),
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
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            pin_memory=pin_memory,
            shard_by_rank=shard_by_rank,
        )
        ray_backend = resolve_backend(backend)
        if ray_backend is not None:
            check_ray_loader(self.config, dataset, cache)
            cache = None
        c = self.config
        # DataLoader's attributes, which frameworks read.
        self.dataset = dataset
        self.batch_size = c.batch_size
        self.drop_last = drop_last if batch_sampler is None else False
        self.generator = generator
        self._user_sampler = batch_sampler if batch_sampler is not None else sampler
        if sampler is None:
            sampler = default_sampler(dataset, c.shuffle, generator)
        self.sampler: Any = sampler
        if batch_sampler is None and batch_size is not None:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        self.batch_sampler: Any = batch_sampler
        self._auto_collation = batch_sampler is not None
        default = default_collate if self._auto_collation else default_convert
        self.collate_fn = collate_fn or default
        self.pin_memory = pin_memory
        self.pin_memory_device = pin_memory_device
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = c.context
        self.prefetch_factor = prefetch_factor if prefetch_factor or c.workers == 0 else 2
        self.persistent_workers = persistent_workers
        self.in_order = in_order
        if not in_order:
            _warn_once(
                "in_order",
                "drapps delivers batches in order always (in_order=False "
                "is accepted and changes nothing): that is what keeps them deterministic",
            )
        self._iterable = is_iterable_dataset(dataset)
        self._memory_budget = c.resolved_memory_budget
        resolved = resolve_device(device)
        on_cuda = resolved is not None and resolved.type == "cuda"
        # A non-blocking copy to the GPU needs page-locked memory: pin in the dispatcher.
        finish = pinner(pin_memory or on_cuda, "" if on_cuda else pin_memory_device)
        self._finish = finish
        self._dispatcher: Dispatcher | None = None
        self._stream: StreamPool | None = None
        self._stream_workers = c.initial_workers
        per_worker = prefetch_factor or 2
        self._pipeline = transform if isinstance(transform, Pipeline) else None
        self._split = self._initial_split(split)
        self._device_stage = (
            DeviceStage(self._pipeline, resolved or "cpu")
            if self._pipeline is not None or resolved is not None
            else None
        )
        self._cache = open_cache(cache, dataset, transform, iterable=self._iterable)
        # A Pipeline goes to the workers whole; each task says where to stop (set_split).
        self._recipe = BatchRecipe(
            dataset,
            transform,
            self.collate_fn,
            on_error,
            self._auto_collation,
            worker_init_fn,
            cache=self._cache,
        )
        pool = RayPool(self._recipe, ray_backend) if ray_backend is not None else None
        if pool is not None:  # bounded by the cluster's CPUs, and starting with all of them
            cap = c.max_workers or pool.max_workers()
            try:
                self.config = c = dataclasses.replace(c, max_workers=cap)
            except ValueError as exc:
                pool.shutdown()
                raise ValueError(f"{exc} (the Ray cluster has CPUs for {cap} actors)") from None
        initial = c.resolved_max_workers if pool is not None and c.workers == "auto" else None
        if self._iterable and c.initial_workers > 0:
            self._stream = StreamPool(
                self._recipe,
                self.batch_size,
                self.drop_last,
                context=c.context,
                prefetch_per_worker=per_worker,
                timeout=c.resolved_timeout,
                finish=finish,
            )
        elif not self._iterable and c.initial_workers > 0:
            self._dispatcher = Dispatcher(
                self._recipe,
                workers=initial or c.initial_workers,
                prefetch=None if prefetch == "auto" else prefetch,
                prefetch_per_worker=per_worker,
                memory_budget=self._memory_budget,
                timeout=c.resolved_timeout,
                max_attempts=max_attempts,
                context=c.context,
                finish=finish,
                split=self._split,
                pool=pool,
            )
        self._budget = HostShare() if c.workers == "auto" and pool is None else None
        self._owner = os.getpid()
        try:
            self._tuner = make_tuner(
                c,
                _weak_snapshot(self),
                self._dispatcher,
                self._budget.grant if self._budget is not None else None,
                knobs=[*self._split_knobs(), *self._codec_knobs()],
            )
        except BaseException:  # e.g. an unwritable trace path: free what was set up
            _shutdown(
                self._owner,
                None,
                self._dispatcher,
                self._stream,
                self._budget,
                self._device_stage,
                self._cache,
            )
            raise
        # Runs on close(), garbage collection or interpreter exit, whichever comes first; it
        # holds the tuner and the pools, never the loader, so the loader stays collectable.
        self._finalizer = weakref.finalize(
            self,
            _shutdown,
            self._owner,
            self._tuner,
            self._dispatcher,
            self._stream,
            self._budget,
            self._device_stage,
            self._cache,
        )
        self._lock = threading.Lock()
        self._closed = False
        self._next_epoch = 0
        self._next_batch = 0
        self._pending: SampledPlan | None = None
        self._base_seed: int | None = None
        self._epochs_started = 0
        # A weak reference: the iterator holds the loader, not the other way round, so a
        # dropped loader is freed at once rather than by the cyclic collector.
        self._active: Callable[[], Epoch | None] = lambda: None
        self._epoch = -1
        self._batches = 0
        self._samples = 0
        self._skipped: list[tuple[Any, str]] = []
        self._skipped_total = 0
        self._inline_wait_s = 0.0
        self._stage_wait_s = 0.0  # the loop's wait for a batch staged ahead
        self._warned_shard = False

    # -------------------------------------------------------------------------- iteration

    @property
    def num_workers(self) -> int:
        """Worker processes asked for now (the controller changes it under "auto")."""
        if self._dispatcher is not None:
            return self._dispatcher.target_workers
        return self._stream_workers if self._stream is not None else 0

    @property
    def _index_sampler(self) -> Iterable[Any]:
        return self.batch_sampler if self.batch_sampler is not None else self.sampler

    def __len__(self) -> int:
        if self._iterable:
            return stream_length(self.dataset, self.batch_size, self.drop_last)
        shard = self._rank_shard(0, warn=False)
        return len(shard if shard is not None else self._index_sampler)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        if self._closed:
            raise RuntimeError("this drapps.Loader is closed")
        if os.getpid() != self._owner:
            raise RuntimeError(
                f"this drapps.Loader belongs to process {self._owner}; a forked child "
                f"(pid {os.getpid()}) cannot iterate it: make a new Loader in the child"
            )
        if self._tuner is not None:
            self._tuner.start()
        self._claim_cores()
        with self._lock:
            fresh = not self.persistent_workers and self._epochs_started > 0
            self._epochs_started += 1
            iterator: MapEpoch | StreamEpoch
            if self._iterable:
                epoch, start = self._next_epoch, self._next_batch
                self._next_epoch, self._next_batch = epoch + 1, 0
                iterator = StreamEpoch(self, epoch, self._epoch_seed(), start, fresh)
            else:
                plan, start = self._next_plan()
                iterator = MapEpoch(self, plan, start, fresh)
            self._epoch = iterator.epoch
            self._active = weakref.ref(iterator)
        return iterator

    def _next_plan(self) -> tuple[EpochPlan, int]:
        plan: EpochPlan
        if self._pending is not None:
            plan, self._pending = self._pending, None
            start = plan.first
        else:
            plan, start = self._make_plan(self._next_epoch), self._next_batch
        self._next_epoch, self._next_batch = plan.epoch + 1, 0
        return plan, start

    def _make_plan(self, epoch: int) -> EpochPlan:
        c = self.config
        seed = self._epoch_seed()
        shard = self._rank_shard(epoch, warn=True)
        if shard is not None:
            return SampledPlan(draw_batches(shard, self._auto_collation), seed, epoch)
        if self._user_sampler is None and (c.seed is not None or not c.shuffle):
            size = c.batch_size or 1
            return Plan(len(self.dataset), size, c.shuffle, self.drop_last, seed, epoch)
        return SampledPlan(draw_batches(self._index_sampler, self._auto_collation), seed, epoch)

    def _epoch_seed(self) -> int:
        """The seed of the epoch about to start, drawn as DataLoader draws its base seed (once
        per iterator, so once in all with persistent workers) unless ``seed`` was given."""
        if self.config.seed is not None:
            return self.config.seed
        if self._base_seed is None or not self.persistent_workers:
            self._base_seed = draw_base_seed(self.generator)
        return self._base_seed

    def _rank_shard(self, epoch: int, *, warn: bool) -> Iterable[Any] | None:
        """This rank's share under torch.distributed, when drapps shards for the user."""
        if not self.config.shard_by_rank or self._iterable:
            return None
        ranks = world()
        if ranks is None:
            return None
        rank, size = ranks
        if self._user_sampler is not None:
            if warn and not is_distributed(self._user_sampler):
                _warn_once(
                    "sampler-not-distributed",
                    f"torch.distributed runs {size} ranks but the sampler "
                    f"{type(self._user_sampler).__name__} is not a distributed one: every "
                    "rank iterates all of it (use DistributedSampler to split it)",
                )
            return None
        c = self.config
        seed = (c.seed or 0) % 2**62  # DistributedSampler's default seed is 0
        if warn and not self._warned_shard:
            self._warned_shard = True
            logger.warning(
                "drapps: torch.distributed runs %d ranks and no DistributedSampler was given: "
                "rank %d reads its own shard, as DistributedSampler(shuffle=%s, seed=%s, "
                "drop_last=%s) would (shard_by_rank=False turns this off)",
                size,
                rank,
                c.shuffle,
                seed,
                self.drop_last,
            )
        return rank_shard(
            self.dataset,
            rank,
            size,
            shuffle=c.shuffle,
            seed=seed,
            epoch=epoch,
            batch_size=self.batch_size,
            drop_last=self.drop_last,
        )

    def _claim_cores(self) -> None:
        """Under torch.distributed, keep this loader's workers within its share of the host."""
        if self._budget is None or self._dispatcher is None:
            return
        granted = self._budget.grant(self._dispatcher.target_workers, self.config.min_workers)
        if granted != self._dispatcher.target_workers:
            self._dispatcher.resize(granted)

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter(loader)`` run ``epoch`` from its first batch; passed on to the
        sampler's own ``set_epoch`` (e.g. ``DistributedSampler``) when it has one."""
        epoch = checked_index("epoch", epoch)
        samplers = (self.sampler, self.batch_sampler, getattr(self.batch_sampler, "sampler", None))
        for sampler in {id(s): s for s in samplers if s is not None}.values():
            if callable(getattr(sampler, "set_epoch", None)):
                sampler.set_epoch(epoch)
        with self._lock:
            self._next_epoch, self._next_batch = epoch, 0
            self._pending = None
            self._active = lambda: None

    # ------------------------------------------------------------------------------ resume

    def state_dict(self) -> dict[str, Any]:
        """Where iteration stands: loading it into a new loader resumes at the next batch.

        Plain data (JSON-serialisable for integer keys). An epoch whose order the loader's
        own ``seed`` determines is stored as (epoch, next batch); an epoch a sampler drew is
        stored with its remaining batches, since a sampler cannot in general redraw them.
        """
        with self._lock:
            active = self._active()
            plan: EpochPlan | None = None
            if active is not None and not active.finished:
                epoch, next_batch = active.epoch, active.position
                plan = active.plan
            elif self._pending is not None:
                plan = self._pending
                epoch, next_batch = plan.epoch, plan.first
            else:
                epoch, next_batch = self._next_epoch, self._next_batch
        c = self.config
        state: dict[str, Any] = {
            "version": _STATE_VERSION,
            "epoch": epoch,
            "next_batch": next_batch,
            "seed": c.seed,
            "num_samples": len(self.dataset) if hasattr(self.dataset, "__len__") else None,
            "batch_size": self.batch_size,
            "shuffle": c.shuffle,
            "drop_last": self.drop_last,
        }
        if plan is not None and (isinstance(plan, SampledPlan) or c.seed is None):
            state["seed"] = plan.seed
            state["batches"] = [
                [plain_key(key) for key in plan.batch(b)] for b in range(next_batch, len(plan))
            ]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`: the next ``iter(loader)`` yields the remaining batches.

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
        current = self.state_dict()
        batches = state.get("batches")
        keys: tuple[str, ...] = ("num_samples", "batch_size")
        if batches is None:
            keys = ("seed", "num_samples", "batch_size", "shuffle", "drop_last")
        for key in keys:
            if state.get(key) != current[key]:
                raise ValueError(
                    f"state was saved with {key}={state.get(key)!r} but this loader has "
                    f"{key}={current[key]!r}"
                )
        pending = None
        if batches is not None:
            if not isinstance(batches, list) or not all(isinstance(b, list) for b in batches):
                raise ValueError("state batches must be a list of lists of dataset keys")
            seed = checked_index("state seed", state.get("seed"))
            pending = SampledPlan(tuple(batches), seed, epoch, first=next_batch)
        elif not self._iterable:
            length = len(self._make_plan_for_check(epoch))
            if next_batch > length:
                raise ValueError(f"state next_batch must be in [0, {length}], got {next_batch!r}")
        with self._lock:
            self._next_epoch, self._next_batch = epoch, next_batch
            self._pending = pending
            self._active = lambda: None

    def _make_plan_for_check(self, epoch: int) -> Plan:
        c = self.config
        return Plan(len(self.dataset), c.batch_size or 1, c.shuffle, self.drop_last, 0, epoch)

    # ----------------------------------------------------------------------------- control

    def resize(self, workers: int) -> None:
        """Change the worker count now, mid-epoch, without losing or reordering data.

        Growing reuses workers parked by a recent shrink, else starts processes at once.
        Shrinking parks the surplus workers: they finish the batches they hold and take no
        more; a parked worker not reused within 5 seconds exits. An iterable dataset's
        streams cannot move between workers: its new count applies from the next epoch.

        Raises:
            ValueError: ``workers`` is not in [1, max_workers], or this loader has no pool
                (it was made with ``workers=0``).
        """
        limit = self.config.resolved_max_workers
        if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= limit:
            raise ValueError(f"workers must be an int in [1, {limit}], got {workers!r}")
        if self._dispatcher is None and self._stream is None:
            raise ValueError("resize() needs worker processes; this loader was made with workers=0")
        if self._stream is not None:
            self._stream_workers = workers
            return
        assert self._dispatcher is not None
        self._dispatcher.resize(workers)

    def set_split(self, split: int) -> None:
        """Move the split of a :class:`drapps.ops.Pipeline` transform: batches dispatched from
        now on run its ops before ``split`` in the workers and the rest after the reorder
        buffer. Batches already made keep the split they were made with, so every batch is
        the same whatever the split and whenever it moves.

        Raises:
            ValueError: the transform is not a Pipeline, or ``split`` is not one of its
                ``split_points()`` this loader can run (a split before the end needs batches
                of a map-style dataset).
        """
        if self._pipeline is None:
            raise ValueError("set_split() needs a drapps.ops.Pipeline as the transform")
        split = self._check_split(split)
        self._split = split
        if self._dispatcher is not None:
            self._dispatcher.set_split(split)

    def _initial_split(self, split: int | str | None) -> int | None:
        """The split to start from, checked against the transform and the dataset."""
        if self._pipeline is None:
            if split is not None:
                raise ValueError(
                    f"split={split!r} needs a drapps.ops.Pipeline as the transform, got "
                    f"{self.config.transform!r}"
                )
            return None
        start = self._pipeline.split if split is None or split == "auto" else split
        return self._check_split(start)

    def _split_points(self) -> list[int]:
        """The splits this loader can run (a split before the end needs a map-style dataset
        with batches)."""
        assert self._pipeline is not None
        end = len(self._pipeline.ops)
        if self._iterable or not self._auto_collation:
            return [end]
        return self._pipeline.split_points()

    def _split_knobs(self) -> list[Knob]:
        """The split knob for the controller (adjustable with ``split="auto"``)."""
        if self._pipeline is None or self._dispatcher is None:
            return []
        points = self._split_points()
        return [
            SplitKnob(
                _weak_method(self, "set_split"),
                low=points[0],
                high=points[-1],
                adjustable=self.config.split == "auto",
            )
        ]

    def set_codec(self, codec: str) -> None:
        """Write new cache entries with ``codec`` (one of the cache's codecs, or "off" to
        bypass the cache); entries made before are re-encoded as they are read.

        Raises:
            ValueError: the loader has no cache, or ``codec`` is not one of its codecs.
        """
        if self._cache is None:
            raise ValueError(f"set_codec({codec!r}): this loader has no sample cache (cache=None)")
        self._cache.set_codec(codec)

    def _codec_knobs(self) -> list[Knob]:
        """The codec knob for the controller (adjustable with ``Cache(codec="auto")``)."""
        if self._cache is None:
            return []
        choices = (*(c.name for c in self._cache.codecs), "off")
        adjustable = self._cache.settings.codec == "auto" and len(choices) > 2
        return [CodecKnob(self._cache.set_codec, choices=choices, adjustable=adjustable)]

    def _check_split(self, split: Any) -> int:
        """``split`` as an int, if this loader can run its Pipeline cut there; else raise."""
        assert self._pipeline is not None
        split = check_split(split, self._pipeline.split_points())
        if split >= len(self._pipeline.ops):
            return split
        if self._iterable:
            raise ValueError(
                "transform: a Pipeline split before its end needs a map-style dataset (an "
                "iterable dataset's samples have no index to seed the batch stage's ops from)"
            )
        if not self._auto_collation:
            raise ValueError(
                "transform: a Pipeline split before its end needs batches; batch_size=None "
                "turns batching off"
            )
        return split

    def stats(self) -> LoaderStats:
        """Counters of what the loader has done so far."""
        return LoaderStats.of(
            self.snapshot(),
            epoch=self._epoch,
            batches=self._batches,
            samples_skipped=self._skipped_total,
            skipped=tuple(self._skipped),
        )

    def snapshot(self) -> PipelineSnapshot:
        """The pipeline's counters now: what :meth:`stats`, the monitor and the controller read."""
        limits = {"memory_budget": self._memory_budget}
        max_workers = self.config.resolved_max_workers
        snapshot: PipelineSnapshot
        if self._dispatcher is not None:
            snapshot = self._dispatcher.snapshot(
                samples=self._samples, max_workers=max_workers, **limits
            )
        elif self._stream is not None:
            snapshot = self._stream.snapshot(
                samples=self._samples,
                max_workers=max_workers,
                target_workers=self._stream_workers,
                **limits,
            )
        else:
            snapshot = inline_snapshot(self._samples, self._inline_wait_s, **limits)
        if self._cache is not None:
            snapshot = dataclasses.replace(snapshot, cache=self._cache.stats())
        stage = self._device_stage
        if stage is None:
            return snapshot
        seconds, batches = stage.totals()
        return dataclasses.replace(
            snapshot,
            wait_s=snapshot.wait_s + self._stage_wait_s,
            split=self._split,
            device_s=seconds,
            device_batches=batches,
        )

    def report(self) -> str:
        """A bottleneck report in plain words and figures, from the controller's telemetry.

        Telemetry is recorded with ``workers="auto"``, ``trace=...`` or ``progress=True``.
        """
        from drapps.telemetry.report import bottleneck_report

        rows = list(self._tuner.rows) if self._tuner is not None else []
        return bottleneck_report(
            rows,
            self.stats().as_dict(),
            persistent_workers=self.persistent_workers if self.num_workers else None,
        )

    def _record(self, batch_samples: int, skipped: list[tuple[Any, str]]) -> None:
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


def _shutdown(
    owner: int,
    tuner: AutoTuner | None,
    dispatcher: Dispatcher | None,
    stream: StreamPool | None,
    budget: HostShare | None,
    stage: DeviceStage | None,
    cache: SampleCache | None,
) -> None:
    # Only the process that made the loader acts: a forked child inherits this finalizer (and
    # may collect its copy of the loader), and must not stop its parent's workers.
    if os.getpid() != owner:
        return
    if tuner is not None:
        tuner.stop()
    if dispatcher is not None:
        dispatcher.shutdown()
    if stream is not None:
        stream.shutdown()
    if budget is not None:
        budget.release()
    if stage is not None:
        stage.close()
    if cache is not None:
        cache.close()  # after the workers: none of them is writing to it any more


def _weak_snapshot(loader: Loader) -> Callable[[], PipelineSnapshot]:
    """``loader.snapshot`` through a weak reference, so the controller does not keep it alive."""
    ref = weakref.ref(loader)

    def snapshot() -> PipelineSnapshot:
        alive = ref()
        if alive is None:
            raise RuntimeError("the loader was garbage-collected")
        return alive.snapshot()

    return snapshot


def _weak_method(loader: Loader, name: str) -> Callable[[Any], None]:
    """``loader.<name>`` through a weak reference (for knobs the controller thread holds)."""
    ref = weakref.ref(loader)

    def call(value: Any) -> None:
        alive = ref()
        if alive is None:
            raise RuntimeError("the loader was garbage-collected")
        getattr(alive, name)(value)

    return call


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, stacklevel=3)
