"""The benchmark runner: drapps.Loader vs torch's DataLoader on the JPEG training pipeline.

Method: every (system, worker count) is one *case*. Each repeat runs every case once, in an
order shuffled per repeat (interleaving spreads machine drift over all cases), and each run
skips ``warmup_batches`` (worker start-up, page cache) before timing ``measure_batches``. Results
are medians over repeats with the min-max spread; the environment is recorded beside them.
"""

from __future__ import annotations

import gc
import logging
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Generator, Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import psutil
import torch
from torch.utils.data import DataLoader

import drapps
from drapps.bench.consumers import CONSUMERS, make_consumer
from drapps.bench.data import default_data_dir, make_jpeg_folder
from drapps.bench.environment import describe_environment
from drapps.datasets import ImageFolder
from drapps.ops import Compose, RandomHorizontalFlip, RandomResizedCrop, ToCHWTensor

logger = logging.getLogger(__name__)

SYSTEMS = ("torch", "drapps")
RESIZE_CASE = "drapps-resizing"
AUTO_CASE = "drapps-auto"
SCENARIOS = ("steady", "cpu-hog")


@dataclass(frozen=True)
class BenchConfig:
    """What to run. ``BenchConfig.quick()`` is the smoke size."""

    workers: tuple[int, ...] = (0, 1, 2, 3, 4)
    """Worker counts to compare (each system runs each)."""
    systems: tuple[str, ...] = SYSTEMS
    """Which of "torch" (DataLoader) and "drapps" to run."""
    batch_size: int = 32
    """Images per batch."""
    warmup_batches: int = 12
    """Batches drawn before timing starts; more than the deepest prefetch (2 per worker), so
    batches made ahead during start-up are drained and do not flatter the timed window."""
    measure_batches: int = 60
    """Batches timed per run."""
    repeats: int = 5
    """Interleaved repeats per case (the table shows medians)."""
    images: int = 2400
    """JPEGs in the generated dataset."""
    step_ms: float = 0.0
    """Step time of the "sleep" consumer, per batch."""
    consumer: str = "none"
    """The training loop: "none" (the loader alone), "sleep" (``step_ms`` per batch, an
    accelerator stand-in) or "cpu-model" (a small CNN's forward/backward on the CPU)."""
    scenario: str = "steady"
    """"steady", or "cpu-hog": a process burns a core during the middle third of the run."""
    auto: bool = False
    """Also run drapps with workers="auto" (the controller)."""
    resize_probe: bool = True
    """Also run drapps at 2 workers resized 2 <-> 3 every ``resize_every`` batches."""
    resize_every: int = 8
    """Batches between resizes in the resize probe."""
    data_dir: Path = field(default_factory=default_data_dir)
    """Where the generated dataset is cached."""
    seed: int = 0
    """Seed of the dataset, the shuffles and the case order."""

    def __post_init__(self) -> None:
        if self.consumer not in CONSUMERS:
            raise ValueError(f"consumer must be one of {list(CONSUMERS)}, got {self.consumer!r}")
        if self.scenario not in SCENARIOS:
            raise ValueError(f"scenario must be one of {list(SCENARIOS)}, got {self.scenario!r}")
        if self.consumer == "sleep" and self.step_ms <= 0:
            raise ValueError(f"the sleep consumer needs step_ms > 0, got {self.step_ms!r}")
        unknown = set(self.systems) - set(SYSTEMS)
        if unknown:
            raise ValueError(f"systems must be among {list(SYSTEMS)}, got {sorted(unknown)}")
        if not self.workers or any(w < 0 for w in self.workers):
            raise ValueError(f"workers must be a non-empty list of ints >= 0, got {self.workers}")
        for name in ("batch_size", "measure_batches", "repeats", "images", "resize_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if self.images < self.batch_size:
            raise ValueError(
                f"images={self.images} is fewer than one batch (batch_size={self.batch_size})"
            )

    @classmethod
    def quick(cls, **overrides: Any) -> BenchConfig:
        """A smoke size: a minute or two on 2 cores."""
        base = {"repeats": 3, "images": 1024, "measure_batches": 20}
        return cls(**{**base, **overrides})


def image_dataset(config: BenchConfig) -> ImageFolder:
    """The ImageNet-style pipeline: read, decode, random-resized-crop 224, flip, CHW uint8."""
    folder = make_jpeg_folder(config.data_dir, config.images, seed=config.seed)
    transform = Compose([RandomResizedCrop(224), RandomHorizontalFlip(), ToCHWTensor()])
    return ImageFolder(folder, transform=transform)


def _open(system: str, workers: int | str, dataset: ImageFolder, config: BenchConfig) -> Any:
    if system == "torch":
        if not isinstance(workers, int):
            raise ValueError(f"DataLoader needs an int worker count, got {workers!r}")
        generator = torch.Generator().manual_seed(config.seed)
        return DataLoader(
            dataset,  # type: ignore[arg-type]  # map-style by protocol, not by subclassing
            batch_size=config.batch_size,
            shuffle=True,
            num_workers=workers,
            drop_last=True,
            generator=generator,
            # Runs span epochs; re-forking workers every epoch would be an unfair baseline.
            persistent_workers=workers > 0,
        )
    return drapps.Loader(
        dataset,
        batch_size=config.batch_size,
        shuffle=True,
        seed=config.seed,
        drop_last=True,
        workers=workers,  # type: ignore[arg-type]
        max_workers=max(4, workers + 1) if isinstance(workers, int) else None,
    )


def _cpu_seconds() -> dict[int, float]:
    """User + system CPU seconds of this process and each live descendant, by pid."""
    me = psutil.Process()
    seconds = {}
    for process in [me, *me.children(recursive=True)]:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        seconds[process.pid] = times.user + times.system
    return seconds


def _epochs(loader: Iterable[Any]) -> Generator[Any, None, None]:
    """Batches from epoch after epoch, so a run may be longer than the dataset."""
    while True:
        yield from loader


def warm_page_cache(dataset: ImageFolder) -> None:
    """Read every file once, so runs start alike instead of whichever finds a warm cache.

    On a machine that reclaims page cache aggressively (DAMON, small RAM), random reads of a
    cold file cost several times the decode; the benchmark measures loaders, not the disk.
    """
    for path, _ in dataset.samples:
        with open(path, "rb") as file:
            file.read()


def _burn_a_core() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def run_case(
    system: str, workers: int | str, dataset: ImageFolder, config: BenchConfig
) -> dict[str, Any]:
    """One timed run of one case."""
    resizing = system == RESIZE_CASE
    consume = make_consumer(config.consumer, config.step_ms)
    loader = _open("torch" if system == "torch" else "drapps", workers, dataset, config)
    started = time.perf_counter()
    it = _epochs(loader)
    next(it)
    first_batch_s = time.perf_counter() - started
    for _ in range(config.warmup_batches - 1):
        next(it)
    waits, after_resize = [], []
    samples = 0
    third = config.measure_batches // 3
    hog: subprocess.Popen[bytes] | None = None
    cpu_before = _cpu_seconds()
    t0 = time.perf_counter()
    try:
        for b in range(config.measure_batches):
            if resizing and b % config.resize_every == 0:
                loader.resize(3 if (b // config.resize_every) % 2 == 0 else 2)
            if config.scenario == "cpu-hog" and b in (third, 2 * third):
                if hog is None:
                    hog = _burn_a_core()
                else:
                    hog.kill()
            before = time.perf_counter()
            images, labels = next(it)
            waited = time.perf_counter() - before
            waits.append(waited)
            if resizing and b % config.resize_every < 2:
                after_resize.append(waited)
            samples += len(images)
            consume(images, labels)
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    elapsed = time.perf_counter() - t0
    cpu_after = _cpu_seconds()
    # Processes alive at both ends: the workers (a resized-away worker's last share is lost).
    cpu_s = sum(cpu_after[p] - cpu_before[p] for p in cpu_after.keys() & cpu_before.keys())
    final_workers = workers
    if isinstance(loader, drapps.Loader):
        final_workers = loader.stats().workers
    it.close()
    if isinstance(loader, drapps.Loader):
        loader.close()
    del loader
    gc.collect()
    waits.sort()
    result = {
        "system": system,
        "workers": workers,
        "samples_per_s": samples / elapsed,
        "cpu_ms_per_batch": 1000 * cpu_s / config.measure_batches,
        "wait_fraction": sum(waits) / elapsed,
        "final_workers": final_workers,
        "first_batch_s": first_batch_s,
        "wait_p50_ms": 1000 * waits[len(waits) // 2],
        "wait_p99_ms": 1000 * waits[min(len(waits) - 1, int(0.99 * len(waits)))],
        "wait_max_ms": 1000 * waits[-1],
    }
    if resizing:
        result["wait_after_resize_max_ms"] = 1000 * max(after_resize)
    return result


def _cases(config: BenchConfig) -> list[tuple[str, int | str]]:
    cases: list[tuple[str, int | str]] = [
        (system, n) for system in config.systems for n in config.workers
    ]
    if config.resize_probe and "drapps" in config.systems:
        cases.append((RESIZE_CASE, 2))
    if config.auto:
        cases.append((AUTO_CASE, "auto"))
    return cases


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Median and spread per case over its repeats."""
    grouped: dict[tuple[str, Any], list[dict[str, Any]]] = {}
    for run in runs:
        grouped.setdefault((run["system"], run["workers"]), []).append(run)
    summary = []
    for (system, workers), group in grouped.items():
        row: dict[str, Any] = {
            "system": system,
            "workers": workers,
            "repeats": len(group),
            "final_workers": [r["final_workers"] for r in group],
        }
        for metric in group[0]:
            if metric in ("system", "workers", "final_workers"):
                continue
            values = [r[metric] for r in group]
            row[metric] = statistics.median(values)
            row[f"{metric}_min"], row[f"{metric}_max"] = min(values), max(values)
        summary.append(row)
    return summary


def run_benchmark(config: BenchConfig, progress: bool = True) -> dict[str, Any]:
    """Run every case ``repeats`` times, interleaved; returns runs, summary and environment."""
    dataset = image_dataset(config)
    cases = _cases(config)
    warm_page_cache(dataset)
    order = random.Random(config.seed)
    runs = []
    total = len(cases) * config.repeats
    for repeat in range(config.repeats):
        shuffled = cases[:]
        order.shuffle(shuffled)
        for system, workers in shuffled:
            run = run_case(system, workers, dataset, config)
            run["repeat"] = repeat
            runs.append(run)
            if progress:
                print(
                    f"[{len(runs):3d}/{total}] {system:16s} workers={workers}: "
                    f"{run['samples_per_s']:7.1f} samples/s",
                    file=sys.stderr,
                    flush=True,
                )
    summary = summarize([{k: v for k, v in r.items() if k != "repeat"} for r in runs])
    config_record = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items()}
    return {
        "benchmark": "image-loader",
        "workload": "ImageFolder JPEG 500x400 q90 -> decode -> RandomResizedCrop(224) -> flip "
        "-> CHW uint8",
        "config": config_record,
        "environment": describe_environment(),
        "runs": runs,
        "summary": summary,
    }


def with_overrides(config: BenchConfig, **overrides: Any) -> BenchConfig:
    return replace(config, **{k: v for k, v in overrides.items() if v is not None})
