"""Monitor: samples the machine and the pipeline, and turns each tick into a State.

System figures come from psutil (and NVML when ``nvidia-ml-py`` is installed and a GPU is
present; its absence is normal), energy from :mod:`drapps.telemetry.energy`. Pipeline figures
come from a snapshot function the loader provides (:class:`~drapps.runtime.stats.PipelineSnapshot`,
the one snapshot ``Loader.stats()`` reads too), so this module knows nothing of the runtime's
internals.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

import psutil

from drapps.control.state import State, percentile
from drapps.runtime.stats import PipelineSnapshot, process_memory
from drapps.telemetry.energy import EnergyMeter

logger = logging.getLogger(__name__)


class GpuMeter:
    """GPU utilisation, memory and power of the first GPU through NVML, or nothing (no
    ``nvidia-ml-py``, no driver, no GPU)."""

    def __init__(self) -> None:
        self._handle: Any = None
        try:
            import pynvml  # from nvidia-ml-py: pip install 'drapps-loader[gpu]'

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception as exc:  # no module, no driver, or no device: all normal
            logger.debug("no GPU telemetry: %s", repr(exc))

    def read(self) -> tuple[float | None, int | None, float | None]:
        """(utilisation 0..1, memory used in bytes, power in watts), each None if unknown."""
        if self._handle is None:
            return None, None, None
        try:
            util = self._nvml.nvmlDeviceGetUtilizationRates(self._handle)
            memory = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
        except Exception:
            return None, None, None
        try:
            power: float | None = self._nvml.nvmlDeviceGetPowerUsage(self._handle) / 1000.0
        except Exception:  # not every board reports power
            power = None
        return util.gpu / 100.0, int(memory.used), power

    def energy_mj(self) -> int | None:
        """NVML's total energy of the GPU in millijoules since the driver loaded, or None (no
        GPU, no NVML, or a board older than Volta)."""
        if self._handle is None:
            return None
        try:
            return int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))
        except Exception:
            return None


def _since_boot() -> float:
    """Seconds since boot on the clock /proc's process start times use."""
    return time.clock_gettime(time.CLOCK_BOOTTIME) if hasattr(time, "CLOCK_BOOTTIME") else 0.0


def _started_since_boot(pid: int) -> float | None:
    """When ``pid`` started, in seconds since boot (/proc's start time in clock ticks; psutil's
    create_time is only as exact as the boot time's whole second), or None where unknown."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
        return int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


PSS_EVERY_S = 2.0
"""Seconds between reads of a process's proportional set size: the kernel walks its page
tables for it (1-2 ms for a worker with torch loaded), so in between it is carried forward by
the change in the process's resident set, which costs microseconds. Every process is read
again whenever a worker starts or exits: a fork shares pages that the others held alone, and
an exit leaves them to the others, neither of which moves any resident set."""


def _run_queue_wait_s(pid: int) -> float | None:
    """Seconds the main thread of ``pid`` has waited on a run queue, ready to run (the second
    figure of /proc's schedstat), or None where the kernel does not say."""
    try:
        with open(f"/proc/{pid}/schedstat") as schedstat:
            return int(schedstat.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


class Monitor:
    """Call :meth:`sample` once per tick; each call reports the interval since the last."""

    def __init__(self, pipeline: Callable[[], PipelineSnapshot]) -> None:
        self._pipeline = pipeline
        self._start = time.monotonic()
        try:
            self._cpus = sorted(os.sched_getaffinity(0))
        except AttributeError:
            self._cpus = list(range(psutil.cpu_count() or 1))
        self._me = psutil.Process()
        self._processes: dict[int, psutil.Process] = {}
        self._gpu = GpuMeter()
        self.energy = EnergyMeter(gpu=self._gpu)
        self._cpu_s = 0.0  # the pipeline's CPU seconds since the first sample, for the estimate
        self._last_energy = self.energy.read(0.0)
        self.joules = 0.0
        """Joules counted since the monitor started (see :attr:`energy`'s ``source``)."""
        self._last_t = time.monotonic()
        self._last_boot = _since_boot()  # to tell a worker started since the last sample
        self._last_cpu: dict[int, float] = {}
        self._pss: dict[int, tuple[float, int, int]] = {}  # pid: (read at, PSS, RSS then)
        self._private: dict[int, int] = {}  # pid: private bytes, as last read
        self._last_wait = _run_queue_wait_s(self._me.pid)
        self._last_io = self._io()
        self._last: PipelineSnapshot | None = None
        psutil.cpu_percent(percpu=True)  # primes psutil's per-core counters
        self.per_worker: dict[int, dict[str, float]] = {}
        """Per worker pid: cores used and RSS bytes over the last interval."""

    def begin(self) -> None:
        """Start the measured time now: the next :meth:`sample` reports what happened since
        (the pipeline's counters, this job's CPU, the machine's), and ``State.t`` counts from
        here. A loader calls it when its loop starts, so the first tick measures loading, not
        the time the loader sat unused, nor nothing at all."""
        now = time.monotonic()
        pipe = self._pipeline()
        for pid in (self._me.pid, *pipe.worker_pids):
            self._cpu_and_rss(pid, 1.0)  # their CPU counts from here
        self._start = self._last_t = now
        self._last = pipe
        self._last_energy = self.energy.read(self._cpu_s)
        self._last_wait = _run_queue_wait_s(self._me.pid)
        self._last_io = self._io()
        self._last_boot = _since_boot()
        psutil.cpu_percent(percpu=True)

    @staticmethod
    def _io() -> tuple[float, float]:
        disk = psutil.disk_io_counters()
        net = psutil.net_io_counters()
        return (
            float(disk.read_bytes) if disk else 0.0,
            float(net.bytes_sent + net.bytes_recv) if net else 0.0,
        )

    def _process(self, pid: int) -> psutil.Process | None:
        process = self._processes.get(pid)
        if process is None:
            try:
                process = self._processes[pid] = psutil.Process(pid)
            except psutil.NoSuchProcess:
                return None
        return process

    def _cpu_and_rss(self, pid: int, dt: float) -> tuple[float, int]:
        process = self._me if pid == self._me.pid else self._process(pid)
        if process is None:
            return 0.0, 0
        try:
            with process.oneshot():
                times = process.cpu_times()
                rss = process.memory_info().rss
        except psutil.NoSuchProcess:
            self._processes.pop(pid, None)
            return 0.0, 0
        total = times.user + times.system
        previous = self._last_cpu.get(pid)
        if previous is None:  # first seen: all of its CPU if it started since the last sample
            started = _started_since_boot(pid)
            born_since = started is not None and started >= self._last_boot - 0.02
            previous = 0.0 if born_since else total
        self._last_cpu[pid] = total
        return (total - previous) / dt, rss

    def _held(self, pid: int, rss: int, now: float, fresh: bool = False) -> int | None:
        """Proportional bytes ``pid`` holds: read every :data:`PSS_EVERY_S` (or now, when
        ``fresh``), carried by the change in ``rss`` in between; None where the kernel does
        not say."""
        last = self._pss.get(pid)
        if fresh or last is None or now - last[0] >= PSS_EVERY_S:
            memory = process_memory(pid)
            if memory is None:
                self._pss.pop(pid, None)
                return None
            pss, self._private[pid] = memory
            self._pss[pid] = (now, pss, rss)
            return pss
        return max(0, last[1] + rss - last[2])

    def sample(self) -> State:
        now = time.monotonic()
        dt = max(now - self._last_t, 1e-6)
        pipe = self._pipeline()
        last = self._last or pipe
        per_core = psutil.cpu_percent(percpu=True)
        mine = [per_core[i] for i in self._cpus if i < len(per_core)] or per_core
        cpu_util = sum(mine) / (100.0 * len(mine))
        total, idle = float(len(self._cpus)), len(self._cpus) * (1.0 - cpu_util)
        if pipe.pool_cores is not None:  # workers on a cluster: its view of its cores
            total, idle = pipe.pool_cores
            cpu_util = 1.0 - idle / total if total > 0 else 1.0
        main_cpu, main_rss = self._cpu_and_rss(self._me.pid, dt)
        # A worker started or gone since the last sample changed who shares which pages.
        fresh = set(pipe.worker_pids) != set(last.worker_pids)
        held = [self._held(self._me.pid, main_rss, now, fresh)]
        waited = _run_queue_wait_s(self._me.pid)
        main_wait = 0.0
        if waited is not None and self._last_wait is not None:
            main_wait = max(0.0, waited - self._last_wait) / dt
        self._last_wait = waited
        self.per_worker = {}
        for pid in pipe.worker_pids:
            cores, rss = self._cpu_and_rss(pid, dt)
            self.per_worker[pid] = {"cpu": cores, "rss": float(rss)}
            if rss:  # gone since it was listed otherwise
                held.append(self._held(pid, rss, now, fresh))
                if held[-1] is not None:
                    self.per_worker[pid]["pss"] = float(held[-1])
                    self.per_worker[pid]["private"] = float(self._private.get(pid, 0))
        helper_rss = 0
        for pid in pipe.helper_pids:  # the zygote: it holds the dataset, makes no batch
            _, rss = self._cpu_and_rss(pid, dt)
            if rss:
                helper_rss += rss
                held.append(self._held(pid, rss, now, fresh))
        alive = {*pipe.worker_pids, *pipe.helper_pids, self._me.pid}
        for gone in set(self._last_cpu) - alive:
            self._last_cpu.pop(gone, None)
            self._processes.pop(gone, None)
            self._pss.pop(gone, None)
            self._private.pop(gone, None)
        disk, net = self._io()
        private = sorted(w["private"] for w in self.per_worker.values() if "private" in w)
        memory = psutil.virtual_memory()
        gpu_util, gpu_memory, gpu_power = self._gpu.read()
        workers_cpu = sum(w["cpu"] for w in self.per_worker.values())
        self._cpu_s += (main_cpu + workers_cpu) * dt
        reading = self.energy.read(self._cpu_s)
        joules = self.energy.between(self._last_energy, reading).total_j
        self._last_energy, self.joules = reading, self.joules + joules
        staged = pipe.device_batches - last.device_batches
        recent = [latency for arrived, latency in pipe.latencies if arrived > self._last_t]
        state = State(
            t=now - self._start,
            cores=max(1, round(total)),
            cpu_util=cpu_util,
            idle_cores=idle,
            main_cpu=main_cpu,
            workers_cpu=workers_cpu,
            rss_bytes=main_rss + helper_rss + int(sum(w["rss"] for w in self.per_worker.values())),
            pss_bytes=None if None in held else sum(h for h in held if h is not None),
            worker_private_bytes=int(private[len(private) // 2]) if private else None,
            available_bytes=int(memory.available),
            total_bytes=int(memory.total),
            disk_read_bps=max(0.0, disk - self._last_io[0]) / dt,
            net_bps=max(0.0, net - self._last_io[1]) / dt,
            gpu_util=gpu_util,
            gpu_memory_bytes=gpu_memory,
            queue_batches=pipe.ready_batches,
            queue_bytes=pipe.ready_bytes,
            memory_budget=pipe.memory_budget,
            wait_fraction=min(1.0, max(0.0, (pipe.wait_s - last.wait_s) / dt)),
            latency_p50_s=percentile(recent, 0.5),
            latency_p99_s=percentile(recent, 0.99),
            throughput=max(0, pipe.samples - last.samples) / dt,
            workers=pipe.workers,
            target_workers=pipe.target_workers,
            workers_added=max(0, pipe.workers - last.workers),
            max_workers=pipe.max_workers,
            prefetch=pipe.prefetch_depth,
            split=pipe.split,
            lookahead=pipe.lookahead or None,
            epoch_left=pipe.epoch_left,
            in_flight=sum(recent) / dt,
            main_wait=main_wait,
            priority=pipe.priority,
            sample_tail=float((pipe.sample_costs or {}).get("tail_ratio", 1.0)),
            device_stage_s=(pipe.device_s - last.device_s) / staged if staged > 0 else 0.0,
            device_stage_share=min(1.0, max(0.0, pipe.device_s - last.device_s) / dt),
            offload=pipe.offload,
            device_squeezed=(
                min(1.0, (pipe.device_squeezed - last.device_squeezed) / staged)
                if staged > 0
                else 0.0
            ),
            gpu_power_w=gpu_power,
            power_w=joules / dt,
            energy_source=self.energy.source,
            **cache_state(pipe.cache, last.cache),
        )
        if pipe.executor_choice:
            state.extra["executor"] = int(pipe.executor == "threads")
        self._last_t, self._last_io, self._last = now, (disk, net), pipe
        self._last_boot = _since_boot()
        return state

    @property
    def last_snapshot(self) -> PipelineSnapshot | None:
        """The pipeline snapshot the last :meth:`sample` read."""
        return self._last


def cache_state(now: Any, before: Any) -> dict[str, Any]:
    """The State's ``cache_*`` fields from two :class:`~drapps.cache.CacheStats` (None
    without a cache)."""
    if now is None:
        return {"cache_fill": 0.0}
    counts, old = now.counts, before.counts if before is not None else {}

    def delta(name: str) -> int:
        return int(counts.get(name, 0) - old.get(name, 0))

    hits, misses = delta("hits"), delta("misses")
    budget = max(1, now.budget)
    return {
        "codec": now.codec,
        "cache_hit_rate": hits / (hits + misses) if hits + misses else 0.0,
        "cache_read_ms": delta("read_ns") / hits / 1e6 if hits else 0.0,
        "cache_make_ms": delta("make_ns") / misses / 1e6 if misses else 0.0,
        "cache_fill": min(1.0, sum(now.held_bytes.values()) / budget),
        "cache_not_admitted": delta("not_admitted") / misses if misses else 0.0,
        "cache_held_bytes": int(sum(now.held_bytes.values())),
        "cache_budget_bytes": int(now.budget),
        "cache_samples": int(now.samples),
        "cache_profile": dict(now.profile),
    }
