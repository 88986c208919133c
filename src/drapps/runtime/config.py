"""The loader's configuration: one frozen dataclass, validated when it is made."""

from __future__ import annotations

import inspect
import multiprocessing
import operator
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, fields
from multiprocessing.context import BaseContext
from typing import Any, Literal

import numpy as np
import psutil

from drapps.runtime.errors import ArgumentError, warn_user
from drapps.runtime.slabs import slab_space

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B?)\s*$", re.IGNORECASE)


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask, not the machine's total)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def parse_bytes(value: int | str, name: str = "memory_budget") -> int:
    """``4096``, ``"512MB"``, ``"2GiB"``, ``"1.5G"`` -> bytes."""
    value = python_number(value)
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ArgumentError(
            f"{name} must be 'auto', a byte count or a size like '2GiB', got {value!r}"
        )
    if isinstance(value, int):
        number = value
    else:
        match = _SIZE.match(value)
        if match is None:
            raise ArgumentError(
                f"{name} must be 'auto', a byte count or a size like '512MB' or '2GiB', "
                f"got {value!r}"
            )
        amount, unit = match.groups()
        unit = unit.upper()
        base = 1024 if "I" in unit else 1000
        power = "BKMGT".index(unit[0]) if unit and unit[0] != "B" else 0
        number = int(float(amount) * base**power)
    if number <= 0:
        raise ArgumentError(f"{name} must be > 0 bytes, got {value!r}")
    return number


def auto_memory_budget() -> int:
    """A quarter of available RAM (at least 64 MiB). Slabs are anonymous shared memory, which
    ``/dev/shm``'s size does not bound; where they are files there instead (no
    ``memfd_create``), never more than half its free space, the other half being head room for
    the batches the training loop still holds."""
    budget = max(psutil.virtual_memory().available // 4, 64 * 2**20)
    space = slab_space()
    if space is not None:
        budget = min(budget, space // 2)
    return max(budget, 1)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def python_number(value: Any) -> Any:
    """A NumPy number (or anything else with ``__index__``) as a Python int or float, as
    DataLoader takes counts and seconds from a config or an array; bools, and what is no
    number, as given, for the checks to name."""
    if isinstance(value, bool | np.bool_ | int | float | str) or value is None:
        return value
    if isinstance(value, np.floating):
        return float(value)
    try:
        return operator.index(value)
    except TypeError:
        return value


def _is_seconds(value: Any) -> bool:
    """A number of seconds > 0 (bools are not numbers here)."""
    return not isinstance(value, bool) and isinstance(value, int | float) and value > 0


@dataclass(frozen=True)
class PoolSettings:
    """How a worker pool's dispatcher runs, made once from a :class:`LoaderConfig`
    (:meth:`LoaderConfig.pool_settings`)."""

    workers: int
    """The count to start with."""
    memory_budget: int
    """Bytes the batches made ahead may hold."""
    prefetch: int | None = None
    """Batches made ahead in total; None: ``prefetch_per_worker`` per worker."""
    prefetch_per_worker: int = 2
    timeout: float | None = None
    """Seconds a worker may spend on one task before it is replaced (None: no limit; 0: a
    limit that follows the batches' times, :class:`~drapps.runtime.retries.HangLimit`)."""
    max_attempts: int = 3
    """Attempts at a batch whose worker keeps dying or hanging."""
    context: BaseContext | None = None
    """The start method's context for worker processes (None: the default)."""
    deal: str = "least_loaded"
    """Which worker gets a batch (see :class:`~drapps.runtime.dealing.Dealer`)."""
    dispatch: str = "auto"
    """Cut batches into parts made by several workers: ``"auto"`` when samples' costs are
    heavy-tailed, ``"samples"`` always, ``"batches"`` never (see
    :class:`~drapps.runtime.schedule.Schedule`)."""
    lookahead: int | None = None
    """Batches past the next one whose work may start early (None: twice the depth)."""
    defer_after: float | None = None
    """Fill batches from the samples made (see :mod:`drapps.runtime.fill`): seconds the loop
    may wait for a batch's own samples before made ones fill it (None: planned batches only).
    Batches are then cut into parts whatever ``dispatch`` says."""
    deepen_for_tails: bool = False
    """While samples' costs are heavy-tailed, prefetch as many more batches as the slowest
    samples (p99) last batch intervals, within the memory budget, so the other workers keep
    making batches while one waits on a straggler (for a depth drapps chooses)."""


@dataclass(frozen=True)
class LoaderConfig:
    """How a :class:`drapps.Loader` makes batches. Every field is checked when it is made."""

    batch_size: int | None = 1
    """Samples per batch (>= 1); None when batches come from a batch sampler or auto-batching
    is off."""
    shuffle: bool = False
    """Visit the dataset in a random order drawn from (seed, epoch)."""
    seed: int | None = None
    """Seeds the epoch order and every sample's augmentation randomness (>= 0), the same in
    every run. None: as DataLoader, each epoch draws a base seed from torch's global generator
    (or ``generator``), and the sampler draws the order from it too."""
    drop_last: bool = False
    """Drop the last batch when it is shorter than ``batch_size``."""
    collate_fn: Callable[[list[Any]], Any] | None = None
    """Turns a list of samples into a batch; None means torch's ``default_collate``."""
    transform: Callable[[Any], Any] | None = None
    """Applied to each sample as ``dataset[i]`` returns it, inside the worker (it must pickle
    for spawn). A :class:`drapps.ops.Pipeline` runs its ops before ``split`` in the workers
    and the rest on each batch after the reorder buffer, in the training process."""
    split: int | Literal["auto"] | None = None
    """With a :class:`drapps.ops.Pipeline` transform: index of the first op run on batches in
    the device stage (an int, fixed), "auto" (the controller moves it one op at a time while
    training runs, keeping a move only if throughput rose), or None (the Pipeline's own
    ``split``). Batches are the same whatever the split (see ``docs/device.md``)."""
    offload: float | Literal["auto"] | None = None
    """With a split before the Pipeline's end: the share of each batch's samples whose ops
    from the split on run in the device stage (e.g. decoded there by nvJPEG), the rest made
    whole in the workers; a number in [0, 1], "auto" (the controller moves it while training
    runs) or None (1: every sample). Batches hold the same samples, in the same order, with
    the same augmentation, at every share (see ``docs/device.md``)."""
    device: str | None = None
    """Where the device stage runs and batches are delivered: "cuda" moves each batch there
    from pinned memory on a side stream and runs the ops after the split on it, batched; None
    or "cpu": in the training process, batches stay where the workers made them."""
    workers: int | Literal["auto"] = "auto"
    """Worker processes: 0 makes batches in the calling process; "auto" lets drapps choose."""
    max_workers: int | None = None
    """Upper bound for ``workers`` and :meth:`Loader.resize` (None: twice the usable cores, and
    with ``workers="auto"`` at least 8, for datasets whose workers mostly wait on reads)."""
    prefetch: int | Literal["auto"] = "auto"
    """Batches made ahead (in flight + ready, all workers together); "auto": 2 per worker."""
    memory_budget: int | str = "auto"
    """Bytes the ready batches may hold; "auto": a quarter of available RAM. One batch is
    always allowed, so a batch larger than the budget still flows."""
    on_error: Literal["raise", "skip"] = "raise"
    """A failing sample raises in the training loop ("raise") or is skipped and counted."""
    timeout: float | None = 0
    """Seconds a worker may spend on one batch before it is deemed hung, replaced and the
    batch retried. 0 (the default, as DataLoader's): no fixed limit; a worker counts as hung
    only once one batch has taken ten times as long as the slowest it made before, and at
    least 60 s (10 minutes before its first), so a slow batch is waited for, as DataLoader
    waits, and a hung worker is not. None: never. Workers only; ``workers=0`` cannot be
    replaced."""
    max_attempts: int = 3
    """Attempts at a batch whose worker dies or hangs before the batch is given up on."""
    multiprocessing_context: str | BaseContext | None = None
    """Start method for workers ("fork", "spawn", "forkserver") or a context object; None: the
    platform default."""
    policy: Any = "heuristic"
    """With ``workers="auto"``: the controller's policy, a registered name ("heuristic",
    "rl", "static") or an object with ``decide(state) -> Action`` (checked by the control
    layer, which knows the names)."""
    min_workers: int = 1
    """Lower bound for the controller (and the starting point's floor)."""
    control_interval: float = 0.5
    """Seconds between controller ticks."""
    trace: str | None = None
    """Write every tick's State, Action and Reward to this JSONL file."""
    progress: bool = False
    """Print a status line to stderr every 5 s (10 s into a file) once batches flow: samples/s
    and the loop's wait averaged over that span, workers, ready batches, CPU, memory; a run
    that ends sooner gets one line with its averages when the loader closes."""
    telemetry: bool = True
    """Watch the pipeline and the machine every ``control_interval`` on a background thread,
    so :meth:`Loader.report` can say where the time went, whatever the worker count (a fixed
    one, 0 and iterable datasets included; with nothing to tune the thread only records).
    False: no such thread where nothing is tuned, and no report. Settings that need it refuse
    False: ``workers``, ``split`` or ``offload`` "auto", ``trace`` and ``progress``; a sample
    cache's ``codec="auto"`` keeps its first codec."""
    prefetch_factor: int | None = None
    """DataLoader's name for batches made ahead per worker (needs workers); None: 2."""
    persistent_workers: bool = False
    """Keep worker processes between epochs. False (DataLoader's default) starts each epoch
    with new workers, which see the dataset as it is then."""
    pin_memory: bool = False
    """Deliver batches in page-locked memory (when an accelerator is present)."""
    in_order: bool = True
    """Hand batches over in plan order (DataLoader's default). False: a batch made by a worker
    is handed over as soon as it is made (the lowest id first), each batch whole and exactly
    once, so a slow batch holds back none behind it; ``state_dict`` then stores the batches
    not yet delivered. Batches made in the calling process, and an iterable dataset's, come
    in order either way."""
    dispatch: Literal["auto", "batches", "samples"] = "auto"
    """How work goes to worker processes: "batches" gives each batch to one worker, as
    DataLoader does; "samples" cuts each batch into parts of about equal predicted cost made
    by several workers and collated in the training process, so a slow sample holds only its
    part; "auto" cuts batches once samples' costs are heavy-tailed (the slowest 1% over 8x the
    median). The batches are the same either way. A ``collate_fn`` of your own, and
    ``batch_size=None``, keep batches whole."""
    lookahead: int | Literal["auto"] = "auto"
    """Batches past the next one whose work may start early, slowest predicted first (bounded
    by ``prefetch`` and the memory budget); "auto": twice the prefetch depth, which the
    controller may change."""
    defer_after: float | None = None
    """Fill batches from the samples that are made (MinatoLoader's trade): seconds the training
    loop may wait for a batch's own samples before samples made for later batches fill it and
    the late ones join a later batch. Every sample still comes exactly once per epoch and
    ``state_dict`` resumes exactly, but which samples form batch ``b`` is no longer fixed by
    the seed; each epoch iterator's ``delivered_keys`` records them, to replay the epoch as
    a ``batch_sampler``. None (the default): batches as planned. Needs worker processes,
    torch's ``default_collate``, ``in_order=True`` and a fixed split."""
    shard_by_rank: bool = True
    """Under ``torch.distributed`` without a distributed sampler, give each rank its own shard
    (as ``DistributedSampler`` would) instead of the whole dataset."""

    def __post_init__(self) -> None:
        for field in fields(self):  # counts and seconds taken as Python numbers
            object.__setattr__(self, field.name, python_number(getattr(self, field.name)))
        if self.batch_size is not None and (not _is_int(self.batch_size) or self.batch_size < 1):
            raise ArgumentError(f"batch_size must be an int >= 1 or None, got {self.batch_size!r}")
        for name in ("shuffle", "drop_last"):
            if not isinstance(getattr(self, name), bool):
                raise ArgumentError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed < 2**64):
            raise ArgumentError(f"seed must be an int in [0, 2**64) or None, got {self.seed!r}")
        for name in ("collate_fn", "transform"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise ArgumentError(f"{name} must be callable or None, got {value!r}")
        split = self.split
        if (
            split is not None
            and not (isinstance(split, str) and split == "auto")
            and (isinstance(split, bool | np.bool_) or not isinstance(split, int) or split < 0)
        ):
            raise ArgumentError(f"split must be None, 'auto' or an int >= 0, got {self.split!r}")
        if self.offload is not None and not (
            isinstance(self.offload, str) and self.offload == "auto"
        ):
            object.__setattr__(self, "offload", check_share(self.offload))
        elif self.offload == "auto" and self.workers == 0:
            raise ArgumentError(
                "offload='auto' needs worker processes to share the batches with: set "
                "workers > 0 or 'auto'"
            )
        if self.split == "auto" and self.workers == 0:
            raise ArgumentError(
                "split='auto' needs worker processes to move ops away from: set workers > 0 "
                "or 'auto'"
            )
        if self.max_workers is not None and (not _is_int(self.max_workers) or self.max_workers < 1):
            raise ArgumentError(
                f"max_workers must be an int >= 1 or None, got {self.max_workers!r}"
            )
        if self.workers != "auto":
            if not _is_int(self.workers) or self.workers < 0:
                raise ArgumentError(f"workers must be 'auto' or an int >= 0, got {self.workers!r}")
            if self.workers > self.resolved_max_workers:
                raise ArgumentError(
                    f"workers={self.workers} exceeds max_workers={self.resolved_max_workers}"
                )
        if self.prefetch != "auto" and (not _is_int(self.prefetch) or self.prefetch < 1):
            raise ArgumentError(f"prefetch must be 'auto' or an int >= 1, got {self.prefetch!r}")
        if self.lookahead != "auto" and (not _is_int(self.lookahead) or self.lookahead < 1):
            raise ArgumentError(f"lookahead must be 'auto' or an int >= 1, got {self.lookahead!r}")
        if self.defer_after is not None:
            self._check_defer()
        if self.dispatch not in ("auto", "batches", "samples"):
            raise ArgumentError(
                f"dispatch must be 'auto', 'batches' or 'samples', got {self.dispatch!r}"
            )
        if self.memory_budget != "auto":
            parse_bytes(self.memory_budget)
        if self.on_error not in ("raise", "skip"):
            raise ArgumentError(f"on_error must be 'raise' or 'skip', got {self.on_error!r}")
        if self.timeout is not None and not (self.timeout == 0 or _is_seconds(self.timeout)):
            raise ArgumentError(
                f"timeout option should be non-negative: a number of seconds (0: following "
                f"the batches' times; None: no limit), got {self.timeout!r}"
            )
        for name in ("persistent_workers", "pin_memory", "shard_by_rank", "in_order"):
            if not isinstance(getattr(self, name), bool):
                raise ArgumentError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.prefetch_factor is not None:
            if not _is_int(self.prefetch_factor) or self.prefetch_factor < 1:
                raise ArgumentError(
                    f"prefetch_factor must be an int >= 1 or None, got {self.prefetch_factor!r}"
                )
            if self.workers == 0:
                raise ArgumentError(
                    "prefetch_factor needs worker processes (as in DataLoader): set num_workers "
                    "> 0 or 'auto', or leave prefetch_factor as None"
                )
            if self.prefetch != "auto":
                raise ArgumentError(
                    "give prefetch (batches in total) or prefetch_factor (per worker), not both: "
                    f"got prefetch={self.prefetch!r}, prefetch_factor={self.prefetch_factor!r}"
                )
        ahead = self.prefetch_factor or (self.prefetch if self.prefetch != "auto" else 0)
        if ahead > _FAR_AHEAD:
            name = "prefetch_factor" if self.prefetch_factor else "prefetch"
            warn_user(
                f"{name}={ahead} asks for more batches made ahead than a training loop can use; "
                f"the memory budget ({self.memory_budget!r}) is what bounds them, so set "
                f"memory_budget= for a bound of your own (or a {name} of a few batches)"
            )
        if self.persistent_workers and self.workers == 0:
            raise ArgumentError(
                "persistent_workers option needs num_workers > 0 (persistent_workers=True "
                "needs num_workers > 0, as in DataLoader)"
            )
        if not _is_int(self.max_attempts) or self.max_attempts < 1:
            raise ArgumentError(f"max_attempts must be an int >= 1, got {self.max_attempts!r}")
        if not _is_int(self.min_workers) or not self.min_workers >= 1:
            raise ArgumentError(f"min_workers must be an int >= 1, got {self.min_workers!r}")
        if self.min_workers > self.resolved_max_workers:
            raise ArgumentError(
                f"min_workers={self.min_workers} exceeds max_workers={self.resolved_max_workers}"
            )
        if not _is_seconds(self.control_interval):
            raise ArgumentError(
                f"control_interval must be a number of seconds > 0, got {self.control_interval!r}"
            )
        if not isinstance(self.progress, bool):
            raise ArgumentError(f"progress must be a bool, got {self.progress!r}")
        if not isinstance(self.telemetry, bool):
            raise ArgumentError(f"telemetry must be a bool, got {self.telemetry!r}")
        if not self.telemetry:
            self._check_without_telemetry()
        context = self.multiprocessing_context
        methods = multiprocessing.get_all_start_methods()
        if isinstance(context, str) and context not in methods:
            raise ArgumentError(
                f"multiprocessing_context option should specify a valid start method in "
                f"{methods!r}, but got multiprocessing_context={context!r} (or give a context "
                "object, or None for the platform's default)"
            )
        if context is not None and not isinstance(context, str | BaseContext):
            raise ArgumentError(
                "multiprocessing_context option should be a valid context object or a string "
                f"specifying the start method, but got multiprocessing_context={context!r}"
            )
        if context is not None and self.workers == 0:
            raise ArgumentError(
                "multiprocessing_context can only be used with multi-process loading "
                f"(num_workers > 0), but got num_workers=0 and multiprocessing_context={context!r}"
            )

    def _check_without_telemetry(self) -> None:
        """``telemetry=False`` with a setting that reads the telemetry is refused."""
        for needs, name, instead in (
            (self.workers == "auto", "workers='auto'", "give a worker count (num_workers=n)"),
            (self.split == "auto", "split='auto'", "give a split"),
            (self.offload == "auto", "offload='auto'", "give a share"),
            (self.trace is not None, f"trace={self.trace!r}", "leave trace out"),
            (self.progress, "progress=True", "leave progress out"),
        ):
            if needs:
                raise ArgumentError(
                    f"telemetry=False turns off the telemetry that {name} needs: {instead}, "
                    "or leave telemetry on"
                )

    def _check_defer(self) -> None:
        value = self.defer_after
        if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
            raise ArgumentError(f"defer_after must be None or a number >= 0, got {value!r}")
        for wrong, why in (
            (self.workers == 0, "worker processes (workers > 0 or 'auto')"),
            (not self.in_order, "in_order=True (batches are filled in order)"),
            (self.split == "auto", "a fixed split (not split='auto')"),
            (self.offload == "auto", "a fixed offload share (not offload='auto')"),
            (self.batch_size is None, "a batch_size (batches to fill)"),
        ):
            if wrong:
                raise ArgumentError(f"defer_after={value!r} needs {why}")

    @classmethod
    def of(cls, arguments: dict[str, Any], **resolved: Any) -> LoaderConfig:
        """The config of a loader made with ``arguments`` (its keyword arguments by name),
        with the fields in ``resolved`` taken from there instead."""
        return cls(**{f.name: resolved.get(f.name, arguments[f.name]) for f in fields(cls)})

    @property
    def resolved_max_workers(self) -> int:
        """``max_workers``, else twice the usable cores (or the count asked, if more: a count
        past the cores is warned about, as DataLoader does, and run); with ``workers="auto"``
        at least ``AUTO_MAX_WORKERS``, room for a dataset whose workers mostly wait on reads
        (the controller keeps a worker past the cores only while the loop waits and cores
        sit idle)."""
        if self.max_workers is not None:
            return self.max_workers
        if self.workers == "auto":
            return max(2 * usable_cores(), AUTO_MAX_WORKERS)
        return max(2 * usable_cores(), self.workers)

    @property
    def seeds_per_sample(self) -> bool:
        """Whether each sample's global RNG draws come from (seed, epoch, index): with a
        ``seed``, with ``workers="auto"`` (whose count changes), and where samples of a batch
        are made apart (``dispatch="samples"``, ``defer_after``). A fixed count without a
        seed draws as DataLoader's workers do, from each worker's own RNGs, seeded once."""
        return self.seed is not None or self.workers == "auto" or self.makes_samples_apart

    @property
    def makes_samples_apart(self) -> bool:
        """Whether the user asked for a batch's samples to be made apart (``dispatch=
        "samples"``, ``defer_after``): each is then made, and seeded, on its own."""
        return self.dispatch == "samples" or self.defer_after is not None

    def pool_settings(
        self, workers: int | None = None, memory_budget: int | None = None
    ) -> PoolSettings:
        """The pool's settings (``workers``: the count to start with, where not
        :attr:`initial_workers`; ``memory_budget``: the budget resolved already, where it
        was, so that one figure holds for the loader and its pool)."""
        if memory_budget is None:
            memory_budget = self.resolved_memory_budget
        return PoolSettings(
            workers=self.initial_workers if workers is None else workers,
            memory_budget=memory_budget,
            prefetch=None if self.prefetch == "auto" else self.prefetch,
            prefetch_per_worker=self.prefetch_factor or 2,
            timeout=self.resolved_timeout,
            max_attempts=self.max_attempts,
            context=self.context,
            # A fixed count deals batches as DataLoader does, in order or out of it.
            deal=(
                "least_loaded"
                if self.workers == "auto"
                else "round_robin"
                if self.in_order
                else "in_turn"
            ),
            dispatch=self.dispatch,
            lookahead=None if self.lookahead == "auto" else self.lookahead,
            defer_after=self.defer_after,
            deepen_for_tails=self.prefetch == "auto" and self.prefetch_factor is None,
        )

    @property
    def initial_workers(self) -> int:
        """Worker count at start ("auto": one per usable core, within the bounds; the
        controller sheds workers the loop does not need and adds them under contention)."""
        if self.workers == "auto":
            return min(max(usable_cores(), self.min_workers), self.resolved_max_workers)
        return self.workers

    @property
    def resolved_timeout(self) -> float | None:
        """Seconds per batch before a worker counts as hung: None for no limit, 0.0 for the
        limit that follows the batches (:class:`~drapps.runtime.retries.HangLimit`)."""
        return None if self.timeout is None else float(self.timeout)

    @property
    def context(self) -> BaseContext | None:
        """The multiprocessing context workers start from (None: the platform default)."""
        if isinstance(self.multiprocessing_context, str):
            return multiprocessing.get_context(self.multiprocessing_context)
        return self.multiprocessing_context

    @property
    def resolved_memory_budget(self) -> int:
        if self.memory_budget == "auto":
            return auto_memory_budget()
        return parse_bytes(self.memory_budget)


AUTO_MAX_WORKERS = 8
"""The least ``max_workers`` defaults to under ``workers="auto"``."""


def resolve_workers(num_workers: Any, workers: Any) -> Any:
    """One worker setting from DataLoader's ``num_workers`` and drapps' ``workers``."""
    num_workers, workers = python_number(num_workers), python_number(workers)
    if num_workers is not None and workers is not None and num_workers != workers:
        raise ArgumentError(
            f"num_workers and workers name the same setting; got num_workers={num_workers!r} "
            f"and workers={workers!r}"
        )
    typed = workers is None and num_workers is not None and num_workers != "auto"
    if typed and not _is_int(num_workers):
        raise ArgumentError(f"num_workers must be an int >= 0 or 'auto', got {num_workers!r}")
    if typed and num_workers < 0:
        # DataLoader's words, naming the argument the user typed.
        raise ArgumentError(
            "num_workers option should be non-negative; use num_workers=0 to disable "
            f"multiprocessing, got num_workers={num_workers!r}"
        )
    chosen = workers if workers is not None else num_workers
    return "auto" if chosen is None else chosen


def checked_index(name: str, value: Any) -> int:
    """An int >= 0 from an int or NumPy integer; booleans and out-of-range values refused."""
    if isinstance(value, bool):
        raise ArgumentError(f"{name} must be an int >= 0, got {value!r}")
    try:
        number = operator.index(value)
    except TypeError:
        raise ArgumentError(f"{name} must be an int >= 0, got {value!r}") from None
    if number < 0:
        raise ArgumentError(f"{name} must be an int >= 0, got {value!r}")
    if number >= 2**63:
        raise ArgumentError(f"{name} must be below 2**63, got {value!r}")
    return number


_FAR_AHEAD = 1024
"""More batches made ahead than this (``prefetch``, or ``prefetch_factor`` per worker) is
never what a loop needs: it gets a warning."""


def warn_excessive_workers(workers: Any) -> None:
    """DataLoader's warning, in its words (which scripts filter on), for more workers than
    usable cores."""
    cores = usable_cores()
    if _is_int(workers) and workers > cores:
        warn_user(
            f"This DataLoader will create {workers} worker processes in total. Our suggested "
            f"max number of worker in current system is {cores}, which is smaller than what "
            "this DataLoader is going to create. Please be aware that excessive worker creation "
            "might get DataLoader running slow or even freeze, lower the worker number to avoid "
            "potential slowness/freeze if necessary."
        )


def changed_arguments(function: Callable[..., Any], named: dict[str, Any]) -> set[str]:
    """The names in ``named`` given a value other than their default in ``function``'s
    signature (plain values compared by value, anything else by identity)."""
    defaults = inspect.signature(function).parameters
    plain = (str, int, float, bool, type(None))

    def same(value: Any, default: Any) -> bool:
        if value is default:
            return True
        return isinstance(value, plain) and type(value) is type(default) and value == default

    return {name for name, value in named.items() if not same(value, defaults[name].default)}


def check_share(share: Any) -> float:
    """An offload share as a float in [0, 1] (the loader's argument, ``set_offload``'s and
    the share knob's owner all check it here).

    Raises:
        ValueError: not a real number in [0, 1].
    """
    if isinstance(share, bool) or not isinstance(share, int | float) or not 0 <= share <= 1:
        raise ArgumentError(
            f"offload must be a number in [0, 1] (or 'auto' for the loader's argument), "
            f"got {share!r}"
        )
    return float(share)
