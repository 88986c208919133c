"""State: one typed snapshot of the machine and the pipeline per controller tick.

The same definition drives the real loader and the simulator, so it depends on nothing in
``drapps.runtime``; :meth:`State.vector` is what a learned policy reads.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar

import numpy as np


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values`` as ``latency_p50_s`` / ``latency_p99_s`` define it (the
    value at rank ``q * n``, 0 when there are none); the real monitor and the simulator both
    use it, so their States agree."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass(frozen=True)
class State:
    """What the controller sees at one tick (rates and fractions over the last interval)."""

    t: float
    """Seconds since the controller started."""
    cores: int
    """Cores this process may use."""
    cpu_util: float
    """Mean utilisation of those cores, 0..1 (everything running on them, not just us)."""
    idle_cores: float
    """Cores' worth of idle CPU (cores * (1 - cpu_util))."""
    main_cpu: float
    """Cores used by the training process itself (the training loop and drapps' threads)."""
    workers_cpu: float
    """Cores used by all worker processes together."""
    rss_bytes: int
    """Resident memory of the training process and its workers, each process's resident set
    in full: pages a forked worker shares with the training process count once per process
    (see :attr:`pss_bytes` and :attr:`held_bytes`)."""
    available_bytes: int
    """Memory available to new allocations on the machine."""
    total_bytes: int
    """Physical memory of the machine."""
    disk_read_bps: float
    """Bytes/s read from disks, machine-wide (0 where the kernel does not say)."""
    net_bps: float
    """Bytes/s sent + received, machine-wide."""
    gpu_util: float | None
    """GPU utilisation 0..1 through NVML, None without a GPU or NVML."""
    gpu_memory_bytes: int | None
    """GPU memory in use, None without a GPU or NVML."""
    queue_batches: int
    """Ready batches waiting for the training loop."""
    queue_bytes: int
    """Bytes those batches hold."""
    memory_budget: int
    """Bytes ready batches may hold."""
    wait_fraction: float
    """Share of the interval the training loop spent blocked waiting for a batch, 0..1."""
    latency_p50_s: float
    """Median seconds from dispatching a batch to receiving it, over the interval."""
    latency_p99_s: float
    """99th-percentile batch latency over the interval."""
    throughput: float
    """Samples/s delivered to the training loop over the interval."""
    workers: int
    """Workers taking tasks now."""
    max_workers: int
    """Upper bound on workers."""
    prefetch: int
    """Prefetch depth (batches in flight + ready)."""
    split: int | None = None
    """Index of the first op run in the device stage after the reorder buffer, when the
    pipeline has a ``split`` knob; None otherwise."""
    codec: str | None = None
    """Codec of the sample cache, when the pipeline has a ``codec`` knob; None otherwise."""
    offload: float | None = None
    """Share of each batch's samples whose ops from the split on run in the device stage,
    when the pipeline has an ``offload`` knob; None otherwise."""
    lookahead: int | None = None
    """Batches past the next one whose work may start early, when the pipeline has a
    ``lookahead`` knob (a worker pool that schedules work); None otherwise."""
    priority: str | None = None
    """The workers' CPU priority (``"normal"`` or ``"low"``), when the pipeline has a
    ``priority`` knob (worker processes); None otherwise."""
    epoch_left: int | None = None
    """Batches of the epoch not yet handed to the training loop; None where unknown (an
    iterable dataset, between epochs) or where epochs do not end."""
    in_flight: float | None = None
    """Batches being made, on average over the interval: the sum of the latencies of the
    batches received in it over its length (Little's law). None where not measured (older
    traces)."""
    pss_bytes: int | None = None
    """Memory the training process and its workers hold, each page once: the sum of their
    proportional set sizes (a page n processes map counts 1/n in each; Linux). A forked worker
    shows most of the training process's pages in its resident set, but holds only the pages
    it wrote (tens of MiB against hundreds). None where not measured."""
    worker_private_bytes: int | None = None
    """The median worker's private memory: the pages it alone maps, which another worker
    would hold again (copy-on-read of a forked dataset, its own buffers). None where not
    measured."""
    target_workers: int | None = None
    """Workers asked of the pool (by the constructor, the controller or ``resize()``): the
    count it starts at each epoch's start, where :attr:`workers` counts those running, 0
    between two epochs whose workers are not kept. None where not known (older traces, the
    simulator)."""
    workers_added: int = 0
    """Workers the pool grew by since the last tick (its size now less its size then, where
    more): each is a process started, or a parked one taken back, and its pages are held
    from that moment (0 in older traces)."""
    main_wait: float = 0.0
    """Cores' worth of time the training loop's thread was ready to run but waited for a CPU
    over the interval (the kernel's run-queue wait; 0 where it does not say): with
    :attr:`main_cpu`, what the loop asked of the CPU, not only what it got."""
    sample_tail: float = 1.0
    """p99 over median of the recent per-sample costs (1.0 where not measured): above about
    8, a few slow samples hold whole batches unless they are cut into parts."""
    device_stage_s: float = 0.0
    """Mean seconds the device stage spent per batch over the interval (moving it to the
    device and running the ops after the split; 0 without a device stage)."""
    device_stage_share: float = 0.0
    """Share of the interval the device stage was busy (on a GPU: its stream's time)."""
    device_squeezed: float = 0.0
    """Share of the interval's staged batches the device stage ran in pieces (or on the CPU)
    for want of device memory: above 0, the device is under memory pressure."""
    gpu_power_w: float | None = None
    """GPU power draw in watts through NVML, None without a GPU or NVML."""
    power_w: float | None = None
    """Mean watts over the interval: the CPU package and DRAM by RAPL (machine-wide), or an
    estimate from the pipeline's CPU time, plus the GPU by NVML's energy counter; how, in
    :attr:`energy_source`. None where not measured (older traces)."""
    energy_source: str | None = None
    """How :attr:`power_w` was counted, in words (it says "estimate" when it is one)."""
    cache_hit_rate: float = 0.0
    """Share of the samples looked up in the sample cache over the interval that it held."""
    cache_read_ms: float = 0.0
    """Mean milliseconds to read and decode a cache hit over the interval (0 without hits)."""
    cache_make_ms: float = 0.0
    """Mean milliseconds to make a sample the cache missed (fetch + cached ops) over the
    interval (0 without misses)."""
    cache_fill: float = 0.0
    """Bytes the cache holds over its budget, 0..1 (0 without a cache)."""
    cache_not_admitted: float = 0.0
    """Share of the misses over the interval the cache had no room for."""
    cache_held_bytes: int = 0
    """Bytes the cache's entries hold now."""
    cache_budget_bytes: int = 0
    """Bytes the cache's tiers may hold."""
    cache_samples: int = 0
    """Samples in the dataset the cache keys (0: unknown)."""
    cache_profile: dict[str, list[float]] = field(default_factory=dict, hash=False)
    """Per codec the cache may use: ``[stored bytes per sample, encode ms, decode ms]``,
    measured on its first samples (empty until then)."""
    extra: dict[str, Any] = field(default_factory=dict, hash=False)
    """Values of knobs that have no field of their own, by knob name."""

    FEATURES: ClassVar[tuple[str, ...]] = (
        "cpu_util",
        "idle_core_share",
        "main_cpu_share",
        "workers_cpu_share",
        "memory_available_share",
        "gpu_util",
        "queue_fill",
        "queue_bytes_share",
        "wait_fraction",
        "latency_p50_log",
        "latency_spread_log",
        "throughput_log",
        "worker_share",
        "prefetch_per_worker",
        "busy_share",
    )

    SPLIT_FEATURES: ClassVar[tuple[str, ...]] = ("device_stage_share",)
    """Appended to :attr:`FEATURES` for a policy that moves the ``split`` knob."""

    CODEC_FEATURES: ClassVar[tuple[str, ...]] = (
        "cache_hit_rate",
        "cache_read_share",
        "cache_fill",
        "cache_not_admitted",
        "codec_size_share",
        "cache_fit",
    )
    """Appended for a policy that moves the ``codec`` knob: hits, the cost of a hit against a
    remake, how full the cache is and how many misses it turned away, the current codec's
    entry size against the largest profiled one's, and the share of the dataset that fits at
    the current codec."""

    OFFLOAD_FEATURES: ClassVar[tuple[str, ...]] = (
        "offload",
        "device_stage_share",
        "gpu_busy",
    )
    """Appended for a policy that moves the ``offload`` knob: the share itself, the stage's
    busy share and the GPU's (repeated where the split's features have them: each knob's
    features are its own, so a policy reads the same vector whatever else it moves)."""

    LOOKAHEAD_FEATURES: ClassVar[tuple[str, ...]] = ("lookahead_per_prefetch", "sample_tail_log")
    """Appended for a policy that moves the ``lookahead`` knob: how far past the prefetch depth
    work may start, and how heavy-tailed samples' costs are (p99 over median, log)."""

    PRIORITY_FEATURES: ClassVar[tuple[str, ...]] = ("priority_low",)
    """Appended for a policy that moves the ``priority`` knob: 1 once the workers run at low
    priority (the training process's CPU share is in :attr:`FEATURES` already)."""

    EXECUTOR_FEATURES: ClassVar[tuple[str, ...]] = ("executor_threads",)
    """Appended for a policy that moves the ``executor`` knob: 1 while the workers are threads
    (what they cost shows in :attr:`FEATURES`: the training process's CPU share, the
    workers', the throughput)."""

    ALL_FEATURES: ClassVar[frozenset[str]] = frozenset(
        FEATURES
        + SPLIT_FEATURES
        + CODEC_FEATURES
        + OFFLOAD_FEATURES
        + LOOKAHEAD_FEATURES
        + PRIORITY_FEATURES
        + EXECUTOR_FEATURES
    )
    """Every feature a policy may read (a policy file names the ones it was trained on)."""

    @classmethod
    def features(cls, knobs: Sequence[str] = ("workers", "prefetch")) -> tuple[str, ...]:
        """The features a policy moving ``knobs`` reads, in :meth:`vector` order."""
        split = cls.SPLIT_FEATURES if "split" in knobs else ()
        codec = cls.CODEC_FEATURES if "codec" in knobs else ()
        offload = cls.OFFLOAD_FEATURES if "offload" in knobs else ()
        lookahead = cls.LOOKAHEAD_FEATURES if "lookahead" in knobs else ()
        priority = cls.PRIORITY_FEATURES if "priority" in knobs else ()
        executor = cls.EXECUTOR_FEATURES if "executor" in knobs else ()
        return cls.FEATURES + split + codec + offload + lookahead + priority + executor

    @property
    def queue_fill(self) -> float:
        """Ready batches over the most the queue can hold now: the prefetch depth, or what
        is left of the epoch near its end. The queue drains as an epoch ends because there
        is nothing left to make, not because the workers fall behind: all that is left,
        ready, is a full queue (and an epoch with nothing left holds all it can)."""
        room = self.prefetch if self.epoch_left is None else min(self.prefetch, self.epoch_left)
        return self.queue_batches / room if room > 0 else 1.0

    @property
    def held_bytes(self) -> int:
        """Memory the pipeline holds: :attr:`pss_bytes` where measured, else :attr:`rss_bytes`."""
        return self.pss_bytes if self.pss_bytes is not None else self.rss_bytes

    @property
    def busy_share(self) -> float:
        """Batches being made per worker, 0..1: near 1 the workers are all at work (on the
        CPU or waiting on reads); near 0 they sit idle because the queue is full, and fewer
        would do. 0 where not measured."""
        if self.in_flight is None:
            return 0.0
        return min(1.0, self.in_flight / max(1, self.workers))

    def feature_values(self) -> dict[str, float]:
        """Every feature by name, each scaled to roughly [0, 1] (before clipping)."""
        cores = max(1, self.cores)
        p50 = max(self.latency_p50_s, 1e-4)
        gpu = self.gpu_util if self.gpu_util is not None else 0.0
        read = self.cache_read_ms / max(self.cache_make_ms, self.cache_read_ms, 1e-6)
        size, fit = self._codec_sizes()
        lookahead = self.lookahead if self.lookahead is not None else 2 * self.prefetch
        return {
            "cpu_util": self.cpu_util,
            "idle_core_share": self.idle_cores / cores,
            "main_cpu_share": self.main_cpu / cores,
            "workers_cpu_share": self.workers_cpu / cores,
            "memory_available_share": self.available_bytes / max(1, self.total_bytes),
            "gpu_util": gpu,
            "queue_fill": self.queue_fill,
            "queue_bytes_share": self.queue_bytes / max(1, self.memory_budget),
            "wait_fraction": self.wait_fraction,
            "latency_p50_log": (math.log10(p50) + 4) / 5,  # 0.1 ms -> 0, 10 s -> 1
            "latency_spread_log": math.log10(max(self.latency_p99_s, p50) / p50) / 2,
            "throughput_log": math.log10(1 + self.throughput) / 6,  # up to a million samples/s
            "worker_share": self.workers / max(1, self.max_workers),
            "prefetch_per_worker": self.prefetch / max(1, self.workers) / 8,
            "busy_share": self.busy_share,
            "device_stage_share": self.device_stage_share,
            "cache_hit_rate": self.cache_hit_rate,
            "cache_read_share": read,
            "cache_fill": self.cache_fill,
            "cache_not_admitted": self.cache_not_admitted,
            "codec_size_share": size,
            "cache_fit": fit,
            "offload": self.offload or 0.0,
            "gpu_busy": self.gpu_util if self.gpu_util is not None else self.device_stage_share,
            "lookahead_per_prefetch": lookahead / max(1, self.prefetch) / 8,  # default: 0.25
            "sample_tail_log": math.log10(max(1.0, self.sample_tail)) / 2,  # 100x -> 1
            "priority_low": 1.0 if self.priority == "low" else 0.0,
            "executor_threads": float(self.extra.get("executor", 0) == 1),
        }

    def vector(
        self,
        knobs: Sequence[str] = ("workers", "prefetch"),
        features: Sequence[str] | None = None,
    ) -> np.ndarray:
        """The ``features`` named (default: :meth:`features` of ``knobs``, in that order),
        each clipped to [0, 1] (float32).

        Raises:
            KeyError: a name that is not a feature.
        """
        values = self.feature_values()
        names = self.features(knobs) if features is None else features
        return np.clip(np.asarray([values[n] for n in names], dtype=np.float32), 0.0, 1.0)

    def _codec_sizes(self) -> tuple[float, float]:
        """The current codec's entry size over the largest profiled one's, and the share of
        the dataset the budget holds at the current codec (both 0 until profiled)."""
        profile = self.cache_profile
        stored = profile.get(self.codec or "", [0.0])[0]
        if not profile or stored <= 0:
            return 0.0, 0.0
        largest = max(sizes[0] for sizes in profile.values())
        fit = self.cache_budget_bytes / (stored * self.cache_samples) if self.cache_samples else 0
        return stored / max(largest, 1e-9), min(1.0, fit)

    def knob(self, name: str) -> Any:
        """The current value of the knob called ``name``.

        Raises:
            ValueError: the pipeline this State describes has no such knob.
        """
        typed = _KNOB_FIELDS.get(name)
        value = getattr(self, typed) if typed is not None else self.extra.get(name)
        if value is None:
            raise ValueError(f"this State has no knob named {name!r}")
        return value

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if not data["extra"]:
            del data["extra"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> State:
        """Inverse of :meth:`as_dict`; unknown keys are ignored (newer traces), and older
        traces' ``split_point`` is read as ``split``."""
        names = {f.name for f in fields(cls)}
        data = {"split": data.get("split_point"), **data}
        return cls(**{k: v for k, v in data.items() if k in names})


_KNOB_FIELDS = {
    "workers": "workers",
    "prefetch": "prefetch",
    "split": "split",
    "codec": "codec",
    "lookahead": "lookahead",
    "offload": "offload",
    "priority": "priority",
}
