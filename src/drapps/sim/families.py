"""Scenario families: seeded generators of random pipelines, for training and evaluation.

Each family draws a :class:`Scenario` from a random generator: cores from 2 to 64, stage costs,
consumer speeds, and the changes the run goes through. Training draws from the training
families; the held-out families (never seen in training) measure whether a policy generalises.
A family is a function ``(rng, duration) -> Scenario`` registered by name.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np

from drapps.registry import Registry
from drapps.sim.cache import CacheModel, CodecModel
from drapps.sim.scenario import Change, GiB, PipelineModel, Scenario

Family = Callable[[np.random.Generator, float], Scenario]

FAMILIES: Registry[Family] = Registry("scenario family")
"""Scenario families by name, tagged ``held_out=True`` when training never sees them."""
MiB = 2**20


def register_family(name: str, *, held_out: bool = False) -> Callable[[Family], Family]:
    """Decorator: make a scenario generator available by name."""

    register: Callable[[Family], Family] = FAMILIES.register(name, held_out=held_out)
    return register


def family_names(*, held_out: bool | None = None) -> list[str]:
    """All families, or only the training (``held_out=False``) or held-out ones."""
    if held_out is None:
        return sorted(FAMILIES.names())
    return sorted(FAMILIES.names(held_out=held_out))


def check_families(names: Sequence[str]) -> list[str]:
    """``names`` as a list, once each is known to be a family.

    Raises:
        ValueError: a name is not a family (the message lists them).
    """
    return FAMILIES.check(list(names))


def check_sources(families: Sequence[str | Family]) -> list[str | Family]:
    """``families`` as a list, each a known family's name or a family itself (a generator
    with a ``name``, such as a :class:`~drapps.sim.calibration.TraceFamily` of real runs).

    Raises:
        ValueError: a name is not a family (the message lists them), or an entry is neither
            a name nor a named generator.
    """
    for entry in families:
        if isinstance(entry, str):
            FAMILIES.get(entry)
        elif not callable(entry) or not isinstance(getattr(entry, "name", None), str):
            raise ValueError(f"a family must be a name or a generator with a name, got {entry!r}")
    return list(families)


def family_label(family: str | Family) -> str:
    """A family's name, whether given by name or as a generator."""
    return family if isinstance(family, str) else str(getattr(family, "name", "custom"))


def draw(family: str | Family, rng: np.random.Generator, duration: float = 60.0) -> Scenario:
    """One scenario of ``family`` (a registered name, or a family itself).

    Raises:
        ValueError: no family has that name (the message lists them).
    """
    generate = FAMILIES.get(family) if isinstance(family, str) else family
    scenario = generate(rng, duration)
    pipeline = scenario.pipeline.replace(epoch_batches=_epoch(rng, scenario.pipeline))
    return Scenario(pipeline, scenario.changes, family_label(family))


def _epoch(rng: np.random.Generator, p: PipelineModel) -> int | None:
    """Batches per epoch: a cache's dataset; otherwise, for two draws in three, 2 to 60
    seconds of the training loop's steps (a small dataset ends an epoch every few seconds,
    as the bench's does), and none for the third (epochs longer than a run)."""
    if p.cache is not None:
        return max(1, p.cache.samples // p.batch_size)
    seconds = _log_uniform(rng, 2.0, 60.0)
    if rng.uniform() < 1 / 3:
        return None
    return max(2, round(seconds / (p.step_s + p.step_cpu_s + p.gpu_s + p.transport_s)))


# ---------------------------------------------------------------------------- building blocks


def _log_uniform(rng: np.random.Generator, low: float, high: float) -> float:
    return float(math.exp(rng.uniform(math.log(low), math.log(high))))


def _machine(
    rng: np.random.Generator, *, cost_cv: tuple[float, float] = (0.1, 0.4)
) -> PipelineModel:
    """A machine and a CPU-bound pipeline needing between 0.2x and 1.6x its cores in workers
    to keep up with an accelerator-bound training step."""
    cores = int(rng.choice([2, 2, 4, 4, 8, 16, 32, 64]))
    step_s = _log_uniform(rng, 0.01, 0.3)
    need = cores * rng.uniform(0.2, 1.6)  # worker-seconds of CPU per step
    total = int(max(16, 4 * cores) * GiB * rng.choice([1, 2, 4]))
    batch_bytes = int(_log_uniform(rng, 0.2, 16) * MiB)
    return PipelineModel(
        cores=cores,
        batch_size=int(rng.choice([32, 64, 128, 256])),
        cpu_s=need * step_s,
        cost_cv=rng.uniform(*cost_cv),
        step_s=step_s,
        step_cv=rng.uniform(0.0, 0.15),
        transport_s=min(0.2 * step_s, batch_bytes / (4 * GiB)),  # ~4 GB/s through shared memory
        worker_start_s=rng.uniform(0.1, 1.0),
        batch_bytes=batch_bytes,
        memory_budget=total // 4,
        worker_rss=int(_log_uniform(rng, 100, 800) * MiB),
        main_rss=int(rng.uniform(1, 4) * GiB),
        total_memory=total,
        other_memory=int(total * rng.uniform(0.05, 0.3)),
    )


def _change_window(rng: np.random.Generator, duration: float) -> tuple[float, float]:
    start = rng.uniform(0.2, 0.45) * duration
    return start, start + rng.uniform(0.2, 0.35) * duration


def _hogged(
    rng: np.random.Generator, p: PipelineModel, duration: float, share: tuple[float, float]
) -> Scenario:
    """``p`` with another process taking a share of its cores (at least one) for a while."""
    start, end = _change_window(rng, duration)
    hog = float(max(1, round(p.cores * rng.uniform(*share))))
    return Scenario(p, (Change(at=start, outside_load=hog), Change(at=end, outside_load=0.0)))


def _cached(rng: np.random.Generator, p: PipelineModel, duration: float) -> PipelineModel:
    """``p`` with a sample cache over a dataset of a few epochs per run, whose budget holds
    15-110% of it at the largest codec; three codecs trade entry size for decode time (a
    smaller one fits 2-5x more and decodes 3-10x slower), and the cache starts at a random
    one, so the best codec may be either way."""
    samples = p.batch_size * max(8, round(duration / p.step_s / rng.uniform(3.0, 8.0)))
    make_share = rng.uniform(0.6, 0.9)
    make = p.cpu_s * make_share / p.batch_size  # CPU seconds a hit saves per sample
    raw = _log_uniform(rng, 50e3, 2e6)
    codecs = (
        CodecModel("raw", raw, make * 0.02, make * rng.uniform(0.03, 0.08)),
        CodecModel("lz4", raw * rng.uniform(0.4, 0.6), make * 0.1, make * rng.uniform(0.1, 0.2)),
        CodecModel("zstd", raw * rng.uniform(0.2, 0.35), make * 0.5, make * rng.uniform(0.2, 0.5)),
    )
    budget = int(raw * samples * rng.uniform(0.15, 1.1))
    start = str(rng.choice([c.name for c in codecs]))
    cache = CacheModel(samples, budget, codecs, make_share=make_share, codec=start)
    return p.replace(cache=cache)


# ---------------------------------------------------------------------------- training families


@register_family("cpu-bound")
def cpu_bound(rng: np.random.Generator, duration: float) -> Scenario:
    """Workers decode and transform on the CPU; the training step runs on an accelerator."""
    return Scenario(_machine(rng))


@register_family("io-latency")
def io_latency(rng: np.random.Generator, duration: float) -> Scenario:
    """Reads wait on storage latency (a network file system): more workers than cores pay."""
    p = _machine(rng)
    read_s = p.cpu_s * rng.uniform(1.0, 4.0)
    return Scenario(p.replace(read_s=read_s, cpu_s=p.cpu_s * rng.uniform(0.1, 0.4)))


@register_family("disk-bandwidth")
def disk_bandwidth(rng: np.random.Generator, duration: float) -> Scenario:
    """Reads share a disk's bandwidth: past its saturation more workers only cost memory."""
    p = _machine(rng)
    read_bytes = int(_log_uniform(rng, 1, 32) * MiB)
    batches_per_s = rng.uniform(0.5, 1.5) / p.step_s  # the disk sustains about the step rate
    return Scenario(
        p.replace(read_bytes=read_bytes, disk_bps=read_bytes * batches_per_s, read_s=0.002)
    )


@register_family("cpu-consumer")
def cpu_consumer(rng: np.random.Generator, duration: float) -> Scenario:
    """The training step itself uses a core (a CPU model): workers compete with it."""
    p = _machine(rng)
    cpu_share = rng.uniform(0.3, 1.0)
    return Scenario(p.replace(step_cpu_s=p.step_s * cpu_share, step_s=p.step_s * (1 - cpu_share)))


@register_family("contention")
def contention(rng: np.random.Generator, duration: float) -> Scenario:
    """Another process takes cores for a while (a CPU hog), then leaves."""
    p = _machine(rng)
    return _hogged(rng, p, duration, (0.25, 0.75))


@register_family("consumer-shift")
def consumer_shift(rng: np.random.Generator, duration: float) -> Scenario:
    """The training step gets slower, then faster (another model phase, a new sequence length)."""
    p = _machine(rng)
    start, end = _change_window(rng, duration)
    slow = rng.uniform(1.5, 3.0)
    return Scenario(
        p, (Change(at=start, step_factor=slow), Change(at=end, step_factor=1 / rng.uniform(1.5, 3)))
    )


@register_family("memory-bound")
def memory_bound(rng: np.random.Generator, duration: float) -> Scenario:
    """Reads wait on storage, so workers past the cores pay, but each worker holds so much
    memory (a large dataset index, a decoder's buffers) that the machine runs short before
    the reads are hidden: past that point (0.75x to 1.75x the cores, below the worker limit
    of 2x) a worker costs memory and buys nothing."""
    p = _machine(rng)
    p = p.replace(read_s=p.cpu_s * rng.uniform(1.0, 3.0), cpu_s=p.cpu_s * rng.uniform(0.2, 0.5))
    # room above the reward's memory floor (5% available), less a few ready batches
    free = 0.95 * p.total_memory - p.other_memory - p.main_rss - 4 * p.batch_bytes
    fits = p.cores * rng.uniform(0.75, 1.75)  # below and above the cores, within the limit
    return Scenario(p.replace(worker_rss=max(64 * MiB, int(free / fits))))


@register_family("slow-reads")
def slow_reads(rng: np.random.Generator, duration: float) -> Scenario:
    """Reads wait on storage, and a few samples wait 10-40x the rest, mostly at random (a
    cold object store, a busy network file system): the loader cuts batches into parts
    (dispatch "auto"), and starting the known-slow ones early (the lookahead) or keeping more
    reads in flight (workers) hides the tail."""
    p = _machine(rng)
    p = p.replace(read_s=p.cpu_s * rng.uniform(0.5, 2.0), cpu_s=p.cpu_s * rng.uniform(0.2, 0.6))
    return Scenario(
        p.replace(
            slow_share=rng.uniform(0.02, 0.08),
            slow_factor=_log_uniform(rng, 10, 40),
            slow_known=rng.uniform(0.0, 0.5),
            dispatch="auto",
        )
    )


@register_family("cached-epochs")
def cached_epochs(rng: np.random.Generator, duration: float) -> Scenario:
    """A sample cache over a few epochs of reads that wait on storage: a cache hit saves a
    read and most of a sample's CPU, and the codec decides how much of the dataset fits
    against what a hit costs to decode."""
    p = _machine(rng)
    p = p.replace(read_s=p.cpu_s * rng.uniform(0.0, 1.5))
    return Scenario(_cached(rng, p, duration))


# ---------------------------------------------------------------------------- held-out families


@register_family("bursty", held_out=True)
def bursty(rng: np.random.Generator, duration: float) -> Scenario:
    """Batch costs vary wildly (variable-size images, long documents) under contention."""
    p = _machine(rng, cost_cv=(0.8, 1.5))
    return _hogged(rng, p, duration, (0.2, 0.5))


@register_family("slow-disk", held_out=True)
def slow_disk(rng: np.random.Generator, duration: float) -> Scenario:
    """Storage latency rises mid-run (a busy network file system) and recovers."""
    p = _machine(rng)
    p = p.replace(read_s=p.cpu_s * rng.uniform(0.3, 1.0), cpu_s=p.cpu_s * rng.uniform(0.3, 0.7))
    start, end = _change_window(rng, duration)
    return Scenario(
        p, (Change(at=start, read_factor=rng.uniform(2, 4)), Change(at=end, read_factor=1.0))
    )


@register_family("gpu-stage", held_out=True)
def gpu_stage(rng: np.random.Generator, duration: float) -> Scenario:
    """A GPU transform stage before the step and a CPU-hungry training loop, with a hog."""
    p = _machine(rng)
    gpu_s = p.step_s * rng.uniform(0.1, 0.5)
    p = p.replace(gpu=True, gpu_s=gpu_s, step_cpu_s=p.step_s * rng.uniform(0.1, 0.4))
    return _hogged(rng, p, duration, (0.25, 0.5))


@register_family("memory-tight", held_out=True)
def memory_tight(rng: np.random.Generator, duration: float) -> Scenario:
    """Big workers on a small machine: too many of them starve memory; the step speeds up
    mid-run."""
    p = _machine(rng)
    total = p.total_memory
    free = total - p.other_memory - p.main_rss
    worker_rss = int(free / (p.cores * rng.uniform(1.0, 2.0)))  # 2x cores workers do not fit
    start, _ = _change_window(rng, duration)
    return Scenario(
        p.replace(worker_rss=worker_rss),
        (Change(at=start, step_factor=rng.uniform(0.4, 0.7)),),
    )


@register_family("device-offload", held_out=True)
def device_offload(rng: np.random.Generator, duration: float) -> Scenario:
    """Workers short of cores beside an accelerator with room: three augmentation ops that
    cost the workers much and the accelerator little may move into the device stage; another
    process takes cores for a while."""
    p = _machine(rng)
    need = p.cpu_s / p.step_s
    if need < p.cores:  # short of cores without the move, so that moving can pay
        p = p.replace(cpu_s=p.step_s * p.cores * rng.uniform(1.2, 2.0))
    ops = tuple(
        (p.cpu_s * rng.uniform(0.1, 0.25), p.step_s * rng.uniform(0.02, 0.1)) for _ in range(3)
    )
    return _hogged(rng, p.replace(gpu=True, device_ops=ops), duration, (0.25, 0.5))


@register_family("stragglers", held_out=True)
def stragglers(rng: np.random.Generator, duration: float) -> Scenario:
    """A few samples cost 10-60x the rest (multi-megapixel photos, reads from cold storage),
    some predictable and some not; the loader cuts batches into parts (dispatch "auto"), and
    part of the slow work waits on storage rather than the CPU."""
    p = _machine(rng)
    read_s = p.cpu_s * rng.uniform(0.0, 1.5)
    return Scenario(
        p.replace(
            read_s=read_s,
            slow_share=rng.uniform(0.01, 0.06),
            slow_factor=_log_uniform(rng, 10, 60),
            slow_known=rng.uniform(0.0, 1.0),
            dispatch="auto",
        )
    )


@register_family("gpu-decode", held_out=True)
def gpu_decode(rng: np.random.Generator, duration: float) -> Scenario:
    """JPEG decode that the workers or the GPU may run, per sample: the offload share says how
    much of each batch the GPU decodes, where the model steps too (the GPU decodes as fast as
    half to one and a half times the machine's cores). The workers are about short of cores.
    For a quarter of the run another job takes most of the cores (the GPU should decode more);
    for another quarter the model's step grows severalfold (a larger phase of training: the GPU
    should decode less): the best share moves with them."""
    p = _machine(rng)
    p = p.replace(cpu_s=p.step_s * p.cores * rng.uniform(1.0, 1.6))
    decode_cpu = p.cpu_s * rng.uniform(0.6, 0.85)
    decode_gpu = decode_cpu / (p.cores * rng.uniform(0.5, 1.5))
    p = p.replace(
        cpu_s=p.cpu_s - decode_cpu,
        gpu=True,
        device_ops=((decode_cpu, decode_gpu),),
        split=0,
        offload=0.5,
    )
    length = 0.25 * duration
    first = rng.uniform(0.1, 0.25) * duration
    second = first + length + rng.uniform(0.05, 0.2) * duration
    hog = float(max(1, round(p.cores * rng.uniform(0.5, 0.8))))
    heavy = rng.uniform(2.0, 4.0)
    windows = [
        (Change(at=0.0, outside_load=hog), Change(at=0.0, outside_load=0.0)),
        (Change(at=0.0, step_factor=heavy), Change(at=0.0, step_factor=1.0)),
    ]
    if rng.uniform() < 0.5:
        windows.reverse()
    changes = []
    for start, (begin, end) in zip((first, second), windows, strict=True):
        changes += [
            dataclasses.replace(begin, at=start),
            dataclasses.replace(end, at=start + length),
        ]
    return Scenario(p, tuple(changes))


@register_family("cache-slow-storage", held_out=True)
def cache_slow_storage(rng: np.random.Generator, duration: float) -> Scenario:
    """A sample cache, and reads whose storage latency rises 3-6x mid-run (a busy network
    file system) and stays: a miss gets dearer, so a codec that fits more of the dataset
    pays more than it did."""
    p = _machine(rng)
    p = p.replace(read_s=p.cpu_s * rng.uniform(0.2, 1.0))
    start, _ = _change_window(rng, duration)
    return Scenario(
        _cached(rng, p, duration), (Change(at=start, read_factor=rng.uniform(3.0, 6.0)),)
    )


@register_family("cpu-step-contention", held_out=True)
def cpu_step_contention(rng: np.random.Generator, duration: float) -> Scenario:
    """A training step that is part CPU work (a heavy host side, a CPU model) and part
    accelerator, workers that could use every core, and a hog for a while: lowering the
    workers' priority gives the step its core back, but against the hog they keep less."""
    p = _machine(rng)
    p = p.replace(cpu_s=p.step_s * p.cores * rng.uniform(0.6, 1.1))
    cpu_share = rng.uniform(0.3, 0.7)
    p = p.replace(step_cpu_s=p.step_s * cpu_share, step_s=p.step_s * (1 - cpu_share))
    return _hogged(rng, p, duration, (0.25, 0.5))


@register_family("gil-switch", held_out=True)
def gil_switch(rng: np.random.Generator, duration: float) -> Scenario:
    """The executor's choice, made twice: 2 to 8 cores, workers short of them whose transforms
    mostly release the GIL (decode and resize in C), and batches that cost the training
    process 10-25% of a worker's CPU for the batch to receive from a worker process, so threads
    of the training process make more, at a fraction of the memory. Mid-run a pure-Python
    transform is turned on: most of a batch's work then holds the GIL, and it costs more, so
    worker processes make more from then on. The run starts on either executor."""
    p = _machine(rng)
    cores = int(rng.choice([2, 2, 4, 8]))  # threads win on few cores; past them the GIL binds
    cpu_s = p.step_s * cores * rng.uniform(1.0, 1.5)
    p = p.replace(
        cores=cores,
        cpu_s=cpu_s,
        transport_s=cpu_s * rng.uniform(0.1, 0.25),
        executor=str(rng.choice(["process", "thread"])),
        gil_share=rng.uniform(0.02, 0.5 / cores),
    )
    start, _ = _change_window(rng, duration)
    heavy = Change(at=start, gil_share=rng.uniform(0.6, 0.9), cpu_factor=rng.uniform(1.2, 2.0))
    return Scenario(p, (heavy,))
