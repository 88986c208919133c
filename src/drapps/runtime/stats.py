"""The pipeline's counters: one frozen snapshot per read, and the public LoaderStats.

Whatever makes the batches (the dispatcher's worker pool, the stream pool of an iterable dataset,
or the training process itself with ``workers=0``) reports a :class:`PipelineSnapshot`; the
loader adds what it counts itself (samples delivered) in one place. ``Loader.stats()``, the
monitor and the controller all read that snapshot, so they agree.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

STAGES = ("fetch_s", "transform_s", "collate_s", "transport_s")
"""Stage timers, cumulative seconds over all workers."""


@dataclass(frozen=True)
class PipelineSnapshot:
    """Cumulative pipeline counters at one instant."""

    samples: int
    """Samples delivered to the training loop so far."""
    wait_s: float
    """Seconds the training loop has spent blocked waiting for batches so far, a wait still
    under way included."""
    ready_batches: int
    """Batches made and waiting for the training loop."""
    ready_bytes: int
    """Bytes those batches hold."""
    memory_budget: int
    """Bytes ready batches may hold."""
    workers: int
    """Workers taking tasks now."""
    max_workers: int
    """Upper bound on workers."""
    prefetch_depth: int
    """Batches allowed in flight + ready."""
    worker_pids: tuple[int, ...]
    """Process ids of the worker processes alive now (parked ones included)."""
    latencies: tuple[tuple[float, float], ...] = ()
    """Recent (monotonic arrival time, dispatch-to-arrival seconds) per batch."""
    stage_s: dict[str, float] = field(default_factory=dict)
    """Cumulative seconds per stage (:data:`STAGES`)."""
    target_workers: int = 0
    """Worker count asked for."""
    peak_ready_bytes: int = 0
    """Most bytes the ready batches ever held."""
    in_flight: int = 0
    """Batches being made by workers now."""
    batch_bytes: int = 0
    """Bytes of the largest batch so far (0 before the first)."""
    worker_restarts: int = 0
    timeouts: int = 0
    retries: int = 0
    pickled_bytes: int = 0
    shared_bytes: int = 0
    split: int | None = None
    """The Pipeline's split now (None without a Pipeline transform)."""
    offload: float | None = None
    """The offload share now (None unless the loader was given one)."""
    device_squeezed: int = 0
    """Batches the device stage ran in pieces or on the CPU for want of device memory."""
    device_s: float = 0.0
    """Seconds the device stage has spent on batches (completed ones)."""
    device_batches: int = 0
    """Batches the device stage has run."""
    cache: Any = None
    """The sample cache's :class:`~drapps.cache.CacheStats` (None without a cache)."""
    pool_cores: tuple[float, float] | None = None
    """(cores, idle cores) in the pool's own resource view, for pools whose workers run
    elsewhere (Ray's cluster); None: this machine's cores, as the monitor measures them."""
    cut_batches: int = 0
    """Batches made in parts by several workers (see ``LoaderConfig.dispatch``)."""
    lookahead: int = 0
    """Batches past the next one whose work may start early."""
    priority: str | None = None
    """The workers' CPU priority (``"normal"`` or ``"low"``); None where the pool cannot
    set it (Ray actors) or no pool makes batches."""
    epoch_left: int | None = None
    """Batches of the epoch not yet handed to the training loop (None: not known, as
    between epochs or for an iterable dataset)."""
    sample_costs: dict[str, Any] | None = None
    """The per-sample cost predictor's report (:meth:`drapps.runtime.cost.SampleCosts.report`);
    None where batches are not dispatched by a worker pool."""
    worker_starts_s: tuple[float, ...] = ()
    """Seconds each recent worker took from being asked for to being ready for its first
    task (where the pool can tell: process workers)."""
    helper_pids: tuple[int, ...] = ()
    """The pool's processes that make no batch (its zygote): their memory is the loader's."""
    executor: str | None = None
    """What the workers are ("processes", "threads", "Ray actors"); None without a pool."""
    executor_why: str | None = None
    """Why, in words, where they are not the default."""
    executor_choice: bool = False
    """Whether the controller may move the workers between processes and threads."""
    sample_threads: int = 1
    """How many of a batch's samples each worker makes at once now."""


def inline_snapshot(samples: int, wait_s: float, memory_budget: int) -> PipelineSnapshot:
    """The snapshot of a loader that makes batches in the training process (``workers=0``)."""
    return PipelineSnapshot(
        samples=samples,
        wait_s=wait_s,
        ready_batches=0,
        ready_bytes=0,
        memory_budget=memory_budget,
        workers=0,
        max_workers=0,
        prefetch_depth=0,
        worker_pids=(),
    )


@dataclass(frozen=True)
class LoaderStats:
    """A snapshot of a loader's counters (cumulative since the loader was made)."""

    epoch: int
    """Epoch of the current (or last) iteration; -1 before the first."""
    batches: int
    """Batches delivered to the training loop."""
    samples: int
    """Samples delivered to the training loop."""
    samples_skipped: int
    """Samples dropped under ``on_error="skip"``."""
    skipped: tuple[tuple[int, str], ...]
    """The last (up to 100) skipped samples: (index, what failed)."""
    workers: int
    """Workers taking tasks now (0 when batches are made in the calling process). After a
    shrink, surplus workers stay parked for a few seconds so a grow can reuse them."""
    target_workers: int
    """Worker count asked for (by the constructor or :meth:`Loader.resize`)."""
    worker_pids: tuple[int, ...]
    """Process ids of the worker processes alive now (parked ones included)."""
    prefetch_depth: int
    """Batches allowed in flight + ready."""
    ready_batches: int
    """Batches made and waiting for the training loop."""
    ready_bytes: int
    """Bytes held by the ready batches."""
    peak_ready_bytes: int
    """Most bytes the ready batches ever held."""
    memory_budget: int
    """Bytes the ready batches may hold."""
    in_flight: int
    """Batches being made by workers now."""
    wait_s: float
    """Seconds the training loop spent waiting for batches."""
    worker_restarts: int
    """Workers that died or hung and were replaced."""
    timeouts: int
    """Batches that overran ``timeout``."""
    retries: int
    """Tasks re-queued after their worker died or hung."""
    pickled_bytes: int
    """Bytes of batch structure sent through worker pipes (array bytes go by shared memory)."""
    shared_bytes: int
    """Bytes of array data received through shared memory."""
    fetch_s: float
    """Seconds spent in ``dataset.__getitem__`` (all workers)."""
    transform_s: float
    """Seconds spent in ``transform`` (all workers)."""
    collate_s: float
    """Seconds spent in ``collate_fn`` (all workers)."""
    split: int | None = None
    """Index of the first op of a Pipeline transform run in the device stage now (None
    without a Pipeline)."""
    offload: float | None = None
    """Share of each batch's samples whose ops from the split on run in the device stage
    (None unless the loader was given ``offload``)."""
    device_squeezed: int = 0
    """Batches the device stage ran in pieces, or on the CPU, for want of device memory."""
    device_s: float = 0.0
    """Seconds the device stage spent moving batches and running the ops after the split."""
    device_batches: int = 0
    """Batches the device stage has run."""
    cache: dict[str, Any] | None = None
    """The sample cache's counters (:class:`~drapps.cache.CacheStats` as a dict, with
    ``hit_rate`` and the compression ``ratio``); None without a cache."""
    cut_batches: int = 0
    """Batches made in parts by several workers and collated in the training process (see
    ``LoaderConfig.dispatch``)."""
    lookahead: int = 0
    """Batches past the next one whose work may start early."""
    first_batch_s: float | None = None
    """Seconds from the latest ``iter(loader)`` to its first batch (None before one)."""
    loading_s: float = 0.0
    """Seconds from each ``iter(loader)`` to the last batch it delivered, summed over the
    epochs: the time the loop iterated (its steps included), against which ``wait_s``
    and ``samples`` are read."""
    worker_starts_s: tuple[float, ...] = ()
    """Seconds each recent worker took from being asked for (at an epoch's start, or added
    mid-epoch) to being ready for its first task, oldest first (process workers)."""
    executor: str | None = None
    """What made the batches: "processes", "threads" (``backend="thread"``), "Ray actors";
    None where the training process makes them (no workers) or a stream of worker processes
    (an iterable dataset) does."""
    executor_why: str | None = None
    """Why the workers are what they are, in words, where it is not the default: threads as
    asked, or processes kept although threads were asked for, and the reason."""
    executor_choice: bool = False
    """Whether the controller chooses between processes and threads (``workers="auto"``)."""
    sample_threads: int = 1
    """How many of a batch's samples each worker process makes at once, each in a thread of
    its own: above 1 under ``workers="auto"`` where the samples wait (on reads, on storage)
    rather than compute."""
    worker_private_bytes: tuple[int, ...] = ()
    """Each worker's private memory now, in the order of :attr:`worker_pids`: the pages it
    alone maps (what it wrote, and pages of the dataset it un-shared by reading them: a
    Python object's reference count is a write). Empty where not measured."""
    sample_costs: dict[str, Any] | None = None
    """What the per-sample cost predictor learnt: samples measured, ``median_ms``,
    ``tail_ratio`` (p99 over median), each model's error (mean absolute log error:
    ``history_error``, ``learned_error``), the model ``chosen`` and its own cost
    ``model_us_per_sample``; the dispatcher's counts of ``slow_batches`` and hedged copies
    (``hedges``; ``hedges_ahead``, made before the loop waited; ``hedges_stalled``, made for
    one stalled sample before its part looked overdue); and ``stretch``, the wall seconds a
    task takes per second of its samples' own cost (above 1 with more busy workers than
    cores). None where no worker pool dispatches batches."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def of(
        cls,
        snapshot: PipelineSnapshot,
        *,
        epoch: int,
        batches: int,
        samples_skipped: int,
        skipped: tuple[tuple[int, str], ...],
        first_batch_s: float | None = None,
        loading_s: float = 0.0,
    ) -> LoaderStats:
        """The public counters from a pipeline snapshot and what the loader counted."""
        stages = snapshot.stage_s
        return cls(
            epoch=epoch,
            batches=batches,
            samples=snapshot.samples,
            samples_skipped=samples_skipped,
            skipped=skipped,
            workers=snapshot.workers,
            target_workers=snapshot.target_workers,
            worker_pids=snapshot.worker_pids,
            prefetch_depth=snapshot.prefetch_depth,
            ready_batches=snapshot.ready_batches,
            ready_bytes=snapshot.ready_bytes,
            peak_ready_bytes=snapshot.peak_ready_bytes,
            memory_budget=snapshot.memory_budget,
            in_flight=snapshot.in_flight,
            wait_s=snapshot.wait_s,
            worker_restarts=snapshot.worker_restarts,
            timeouts=snapshot.timeouts,
            retries=snapshot.retries,
            pickled_bytes=snapshot.pickled_bytes,
            shared_bytes=snapshot.shared_bytes,
            fetch_s=stages.get("fetch_s", 0.0),
            transform_s=stages.get("transform_s", 0.0),
            collate_s=stages.get("collate_s", 0.0),
            split=snapshot.split,
            offload=snapshot.offload,
            device_squeezed=snapshot.device_squeezed,
            device_s=snapshot.device_s,
            device_batches=snapshot.device_batches,
            cache=None if snapshot.cache is None else snapshot.cache.as_dict(),
            cut_batches=snapshot.cut_batches,
            lookahead=snapshot.lookahead,
            sample_costs=snapshot.sample_costs,
            first_batch_s=first_batch_s,
            loading_s=loading_s,
            worker_starts_s=snapshot.worker_starts_s,
            executor=snapshot.executor,
            executor_why=snapshot.executor_why,
            executor_choice=snapshot.executor_choice,
            sample_threads=snapshot.sample_threads,
            worker_private_bytes=tuple(
                memory[1] if (memory := process_memory(pid)) is not None else 0
                for pid in snapshot.worker_pids
            ),
        )


def process_memory(pid: int) -> tuple[int, int] | None:
    """(proportional, private) bytes of ``pid``: its proportional set size (each resident page
    divided by the number of processes that map it) and the pages it alone maps (what it
    wrote, or read into a page no other process has), from /proc's smaps_rollup (Linux 4.14
    on); None where unknown."""
    fields = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                name, _, rest = line.partition(":")
                if name in ("Pss", "Private_Clean", "Private_Dirty"):
                    fields[name] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    if "Pss" not in fields:
        return None
    return fields["Pss"], fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)
