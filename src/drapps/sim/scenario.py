"""What the simulator simulates: a pipeline's parameters, and the changes a run goes through.

Costs are per batch and in seconds at full speed on one free core (CPU) or with the disk to
itself (reads): the simulator slows them down when cores or the disk are shared.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from drapps.sim.cache import CacheModel

GiB = 2**30


AUTO_MAX_WORKERS = 8
"""The least worker bound ``drapps.Loader(workers="auto")`` gives a machine (its
``AUTO_MAX_WORKERS``): a simulated 2-core machine may run 8 workers, as a real one may, so a
policy sees the same worker share on both."""


@dataclass(frozen=True)
class PipelineModel:
    """A data pipeline on one machine, feeding one training loop."""

    cores: int
    """Cores the pipeline and the training loop share."""
    batch_size: int = 32
    """Samples per batch."""
    cpu_s: float = 0.05
    """CPU seconds a worker spends making one batch (fetch, decode, transform, collate)."""
    read_s: float = 0.0
    """Seconds a worker waits on storage per batch that no other reader slows down
    (per-read latency: a network file system, a cold disk)."""
    read_bytes: int = 0
    """Bytes read from disk per batch (they share ``disk_bps`` with the other readers)."""
    disk_bps: float = math.inf
    """Disk bandwidth, bytes/s, shared by all reading workers."""
    cost_cv: float = 0.2
    """Coefficient of variation of a batch's CPU and read cost (lognormal)."""
    step_s: float = 0.04
    """Seconds per training step the training process does not use a CPU core for (the
    accelerator's share, or sleeping)."""
    step_cpu_s: float = 0.0
    """CPU seconds per training step on the training process's own thread (a CPU model, the
    Python loop); it competes with the workers for cores."""
    step_cv: float = 0.05
    """Coefficient of variation of the step time."""
    transport_s: float = 0.002
    """CPU seconds the training process spends receiving one batch from a worker."""
    gpu: bool = False
    """Whether the machine has an accelerator whose utilisation the State reports."""
    gpu_s: float = 0.0
    """Seconds per batch of a GPU transform stage run before the step (0: none)."""
    device_ops: tuple[tuple[float, float], ...] = ()
    """Ops the ``split`` knob may move, in pipeline order after the fixed part (``cpu_s``):
    each ``(worker CPU seconds, device seconds)`` per batch. With split ``k`` the first ``k``
    run in the workers (adding to ``cpu_s``) and the rest in the device stage before the
    step: on the accelerator when ``gpu`` is set, else as CPU work of the training process."""
    split: int | None = None
    """The split to start from, 0..len(device_ops) (None: all ops in the workers)."""
    offload: float | None = None
    """The offload share to start from: the share of each batch's samples whose ops from the
    split on run in the device stage, the rest in the workers (None: every sample, and no
    ``offload`` knob)."""
    outside_load: float = 0.0
    """Cores kept busy by other processes."""
    oversubscription: float = 0.018
    """Share of CPU work lost per runnable job beyond one per core (context switches, caches
    shared by more processes than cores); the CPU time is still spent. 0.018 is the least
    squares fit to the image workload loader-bound on the 2-core VM at 2, 3, 4, 6 and 8
    workers (8 made 4.8% fewer samples than 2; ``docs/results/learners/workers/``)."""
    worker_start_s: float = 0.3
    """CPU seconds a new worker spends starting before it takes tasks."""
    batch_bytes: int = 4 * 2**20
    """Bytes of one ready batch."""
    memory_budget: int = 1 * GiB
    """Bytes ready and in-flight batches may hold."""
    worker_rss: int = 300 * 2**20
    """Resident memory of one worker."""
    main_rss: int = 2 * GiB
    """Resident memory of the training process."""
    total_memory: int = 64 * GiB
    """Physical memory of the machine."""
    other_memory: int = 4 * GiB
    """Memory used by everything else on the machine."""
    max_workers: int = 0
    """Upper bound on workers (0: as ``drapps.Loader(workers="auto")`` bounds them, twice the
    cores and at least :data:`AUTO_MAX_WORKERS`)."""
    cache: CacheModel | None = None
    """A sample cache in front of the workers' work (None: none; see :mod:`drapps.sim.cache`)."""
    slow_share: float = 0.0
    """Share of samples that are slow (a multi-megapixel photo, a read that hits cold
    storage); a batch's cost is its samples' costs, so one slow sample makes a slow batch."""
    slow_factor: float = 1.0
    """A slow sample's cost as a multiple of a typical one's (``cpu_s`` and ``read_s`` stay the
    mean batch cost)."""
    slow_known: float = 1.0
    """Share of the slow samples the loader predicts before making them (the same file is
    slow every epoch); the rest are slow at random (tail reads)."""
    dispatch: str = "batches"
    """As ``drapps.Loader(dispatch=...)``: "batches" (a batch is one task), "samples" (cut
    into two parts per worker, predicted-slow samples alone, started least slack first over
    the lookahead) or "auto" (cut when slow samples cost over 8x a typical one)."""
    epoch_batches: int | None = None
    """Batches per epoch (None: one epoch without end). As a Loader with persistent workers
    between epochs: nothing of the next epoch is made before the training loop has taken the
    last batch of this one, so each epoch's end drains the queue and its start refills it
    while the loop waits."""

    executor: str | None = None
    """What the workers start as, where the executor may move (``workers="auto"`` on a
    map-style dataset): ``"process"`` (worker processes) or ``"thread"`` (threads of the
    training process). None: worker processes, and no ``executor`` knob."""
    gil_share: float = 0.0
    """Share of a batch's CPU work that holds the GIL (pure-Python transforms; decode and
    resize in C release it). Worker threads run that share one at a time, worker processes
    each in their own interpreter."""
    thread_transport_s: float = 0.0002
    """CPU seconds the training process spends taking one batch from a worker thread: the
    batch is handed over as it is, with no copy through shared memory (``transport_s`` is a
    worker process's)."""
    thread_rss: int = 16 * 2**20
    """Resident memory one worker thread adds (its stack and buffers; a worker process holds
    ``worker_rss``, its own interpreter and its copy of what it touched)."""
    thread_start_s: float = 0.005
    """CPU seconds a new worker thread spends starting (a process: ``worker_start_s``)."""

    def __post_init__(self) -> None:
        _check_int(self, "cores", 1)
        if self.epoch_batches is not None:
            _check_int(self, "epoch_batches", 1)
        _check_int(self, "batch_size", 1)
        _check_int(self, "read_bytes", 0)
        _check_int(self, "batch_bytes", 1)
        _check_int(self, "memory_budget", 1)
        _check_int(self, "max_workers", 0)
        for name in ("worker_rss", "main_rss", "total_memory", "other_memory", "thread_rss"):
            _check_int(self, name, 0)
        for name in (
            "cpu_s",
            "read_s",
            "cost_cv",
            "step_s",
            "step_cpu_s",
            "step_cv",
            "transport_s",
            "gpu_s",
            "outside_load",
            "oversubscription",
            "worker_start_s",
            "thread_transport_s",
            "thread_start_s",
        ):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not value >= 0 or math.isinf(value):
                raise ValueError(
                    f"PipelineModel.{name} must be a finite number >= 0, got {value!r}"
                )
        if not (isinstance(self.disk_bps, int | float) and self.disk_bps > 0):
            raise ValueError(
                f"PipelineModel.disk_bps must be > 0 (inf: no limit), got {self.disk_bps!r}"
            )
        for op in self.device_ops:
            if len(op) != 2 or not all(
                isinstance(v, int | float) and 0 <= v < math.inf for v in op
            ):
                raise ValueError(
                    "PipelineModel.device_ops must hold (worker seconds, device seconds) pairs "
                    f"of finite numbers >= 0, got {self.device_ops!r}"
                )
        if self.split is not None and not (
            isinstance(self.split, int) and 0 <= self.split <= len(self.device_ops)
        ):
            raise ValueError(
                f"PipelineModel.split must be None or an int in [0, {len(self.device_ops)}], "
                f"got {self.split!r}"
            )
        if self.offload is not None and not (
            isinstance(self.offload, int | float) and 0 <= self.offload <= 1
        ):
            raise ValueError(
                f"PipelineModel.offload must be None or a number in [0, 1], got {self.offload!r}"
            )
        if self.executor not in (None, "process", "thread"):
            raise ValueError(
                f"PipelineModel.executor must be None, 'process' or 'thread', got {self.executor!r}"
            )
        if not (isinstance(self.gil_share, int | float) and 0 <= self.gil_share <= 1):
            raise ValueError(f"PipelineModel.gil_share must be in [0, 1], got {self.gil_share!r}")
        if not (0 <= self.slow_share < 1 and 0 <= self.slow_known <= 1):
            raise ValueError(
                "PipelineModel.slow_share must be in [0, 1) and slow_known in [0, 1], got "
                f"{self.slow_share!r}, {self.slow_known!r}"
            )
        if not (isinstance(self.slow_factor, int | float) and 1 <= self.slow_factor < math.inf):
            raise ValueError(f"PipelineModel.slow_factor must be >= 1, got {self.slow_factor!r}")
        if self.dispatch not in ("batches", "samples", "auto"):
            raise ValueError(
                f"PipelineModel.dispatch must be 'batches', 'samples' or 'auto', "
                f"got {self.dispatch!r}"
            )
        if self.step_s + self.step_cpu_s <= 0:
            raise ValueError("a training step must take time: step_s + step_cpu_s must be > 0")
        if self.cpu_s + self.read_s + self.read_bytes <= 0:
            raise ValueError("making a batch must cost something: cpu_s, read_s or read_bytes > 0")

    @property
    def start_split(self) -> int:
        return len(self.device_ops) if self.split is None else self.split

    @property
    def cuts(self) -> bool:
        """Whether batches are cut into parts (see ``dispatch``)."""
        heavy = self.slow_share >= 0.01 and self.slow_factor >= 8
        return self.dispatch == "samples" or (self.dispatch == "auto" and heavy)

    @property
    def sample_tail(self) -> float:
        """p99 over median of the per-sample cost (what the loader's predictor reports)."""
        return float(self.slow_factor) if self.slow_share >= 0.01 else 1.0

    @property
    def worker_limit(self) -> int:
        return self.max_workers or max(2 * self.cores, AUTO_MAX_WORKERS)

    def replace(self, **changes: Any) -> PipelineModel:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class Change:
    """Something that changes mid-run, at a time or after a number of consumed batches."""

    at: float | None = None
    """Simulated seconds since the start."""
    at_batch: int | None = None
    """Batches consumed since the start (the benchmark's scenarios change by batch index)."""
    outside_load: float | None = None
    """Cores other processes keep busy from now on."""
    cpu_factor: float | None = None
    """Multiplier on every batch's CPU cost from now on (relative to the pipeline's)."""
    read_factor: float | None = None
    """Multiplier on read latency and bytes' time from now on (a slower disk: 2.0)."""
    step_factor: float | None = None
    """Multiplier on the training step from now on (a slower model: 2.0)."""
    gil_share: float | None = None
    """Share of a batch's CPU work that holds the GIL from now on (a pure-Python transform
    turned on; its cost goes in ``cpu_factor``)."""

    def __post_init__(self) -> None:
        if (self.at is None) == (self.at_batch is None):
            raise ValueError(f"a Change needs exactly one of at= or at_batch=, got {self!r}")
        if self.at is not None and not self.at >= 0:
            raise ValueError(f"Change.at must be >= 0 seconds, got {self.at!r}")
        if self.at_batch is not None and self.at_batch < 0:
            raise ValueError(f"Change.at_batch must be >= 0, got {self.at_batch!r}")
        for name in ("cpu_factor", "read_factor", "step_factor"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"Change.{name} must be > 0, got {value!r}")
        if self.gil_share is not None and not 0 <= self.gil_share <= 1:
            raise ValueError(f"Change.gil_share must be in [0, 1], got {self.gil_share!r}")
        if self.outside_load is not None and not self.outside_load >= 0:
            raise ValueError(f"Change.outside_load must be >= 0 cores, got {self.outside_load!r}")


@dataclass(frozen=True)
class Scenario:
    """A pipeline and what happens to it during a run."""

    pipeline: PipelineModel
    changes: tuple[Change, ...] = ()
    name: str = "custom"

    def what_if(
        self,
        *,
        cores: int | None = None,
        read_factor: float = 1.0,
        cpu_factor: float = 1.0,
        step_factor: float = 1.0,
    ) -> Scenario:
        """The same scenario on other hardware: more cores, a slower disk, slower CPUs, a
        faster or slower model (factors multiply times: 2.0 is twice as slow)."""
        for name, value in (
            ("read_factor", read_factor),
            ("cpu_factor", cpu_factor),
            ("step_factor", step_factor),
        ):
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value!r}")
        p = self.pipeline
        pipeline = p.replace(
            cores=p.cores if cores is None else cores,
            max_workers=0 if cores is not None else p.max_workers,
            read_s=p.read_s * read_factor,
            disk_bps=p.disk_bps / read_factor,
            cpu_s=p.cpu_s * cpu_factor,
            worker_start_s=p.worker_start_s * cpu_factor,
            transport_s=p.transport_s * cpu_factor,
            thread_transport_s=p.thread_transport_s * cpu_factor,
            thread_start_s=p.thread_start_s * cpu_factor,
            step_s=p.step_s * step_factor,
            step_cpu_s=p.step_cpu_s * step_factor,
        )
        return Scenario(pipeline, self.changes, self.name)


def _check_int(obj: object, name: str, minimum: int) -> None:
    value = getattr(obj, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{type(obj).__name__}.{name} must be an int >= {minimum}, got {value!r}")
