"""The benchmark runner behind ``drapps bench``.

Method: a *case* is one (workload, scenario, system, worker setting). Each repeat runs every
case once, in an order shuffled per repeat, so drift of the machine spreads over all cases
instead of landing on one (:mod:`drapps.bench.repeats`). Each run is a fresh process
(``drapps.bench.case``) that draws ``warmup_batches`` (worker start-up, first epoch effects)
and then times ``measure_batches``; with a budget, fewer and shorter where the machine is slow
(:mod:`drapps.bench.budget`).
The summary gives the median and min-max over repeats; the environment is recorded beside it.
Each repeat also times each workload's per-sample pipeline in-process on one core (no loader):
that rate times the usable cores is the machine's preprocessing limit, reported with every run.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from drapps.bench.budget import RepeatPlanner
from drapps.bench.confidence import mean_interval
from drapps.bench.data import default_data_dir
from drapps.bench.environment import describe_environment
from drapps.bench.repeats import Case, Item, Progress, RunFunction, run_one, run_repeats
from drapps.bench.scenarios import SCENARIOS, scenario_class
from drapps.bench.systems import SYSTEMS, system_class
from drapps.bench.workloads import SIZES, workload_class
from drapps.runtime.config import usable_cores

__all__ = [
    "CACHE_COMPARISON",
    "CONSUMERS",
    "QUICK_BUDGET_S",
    "QUICK_SYSTEMS",
    "BenchConfig",
    "Case",
    "Progress",
    "chosen_systems",
    "plan_cases",
    "run_benchmark",
    "run_one",
    "summarize",
    "summarize_limit",
    "with_overrides",
]

logger = logging.getLogger(__name__)

CONSUMERS = ("none", "sleep", "cpu-model", "cuda-model")
_WINDOWS = {"smoke": (2, 6), "quick": (8, 80), "default": (12, 150)}
"""(warm-up, timed) batches per run for each size."""
_LIMIT_SAMPLES = {"smoke": 40, "quick": 400, "default": 1000}
"""Samples timed in-process per repeat for the preprocessing limit."""
_SHORTEST = {"smoke": 2, "quick": 30, "default": 60}
"""The fewest timed batches per run a budget may shorten each size's window to: under
``cpu-contention`` the hog's third of the window is still 10 batches or more."""


@dataclass(frozen=True)
class BenchConfig:
    """What ``drapps bench`` runs. ``BenchConfig.quick()`` is the ``--quick`` size."""

    workloads: tuple[str, ...] = ("image",)
    """Workloads to run (``drapps bench --list`` names them)."""
    scenarios: tuple[str, ...] = ("steady", "cpu-contention")
    """Scenarios to run each workload under."""
    systems: tuple[str, ...] | None = None
    """Systems to compare; None means every one available here (others are skipped, with
    the reason in the results). Naming an unavailable one is an error."""
    workers: tuple[int, ...] | None = None
    """DataLoader worker counts; None means 0..2x usable cores."""
    static_workers: tuple[int, ...] | None = None
    """drapps-static worker counts; None means one worker per usable core."""
    size: str = "default"
    """Data and run size: "smoke" (tests), "quick" (--quick) or "default"."""
    repeats: int = 3
    """Interleaved repeats per case (the tables show medians); with ``budget_s``, fewer where
    the machine is too slow to fit them."""
    max_repeats: int | None = None
    """Repeat past ``repeats``, up to this many, until every comparison of the verdict is
    separated or the next repeat would not fit ``budget_s``; None: never past ``repeats``."""
    budget_s: float | None = None
    """Wall seconds for the whole run, data preparation included: the timed window (down to
    a size's shortest) and the repeats are planned, and revised as runs are timed, to end
    within it (:mod:`drapps.bench.budget`); the verdict says what was cut. None: no budget."""
    default_systems: tuple[str, ...] | None = None
    """With ``systems`` None: run these, each where available (the others skipped with the
    reason), instead of every available system."""
    warmup_batches: int | None = None
    """Batches before timing starts; None takes the size's default."""
    measure_batches: int | None = None
    """Batches timed per run; None takes the size's default."""
    measure_s: float | None = None
    """Time each run for at least this many seconds (past ``measure_batches`` where needed),
    so that a fast system's window is as long as a slow one's; None: the batches alone. Only
    with the steady scenario (the others change by batch index)."""
    device: str | None = None
    """Where systems with a device stage (``drapps-split``) run it and deliver batches
    ("cuda"); None: the training process's CPU."""
    cache: bool = False
    """Measure the sample cache: by default the systems become DataLoader, tf.data, drapps
    without a cache and the cache systems, and timing starts at the second epoch (the first
    fills the cache; its rate is recorded as ``warmup_samples_per_s``)."""
    cache_memory: str | None = None
    """The cache systems' memory budget (e.g. "150MB"); None: "auto"."""
    consumer: str = "sleep"
    """The training step: "sleep" (a fixed step per batch, an accelerator stand-in),
    "cpu-model" (a small real model's forward and backward on the same CPU), "cuda-model"
    (ResNet-50 with mixed precision on the GPU; the cpu-model step without CUDA) or "none"."""
    step_ms: float | None = None
    """The sleep consumer's step per batch; None takes the workload's default."""
    batch_size: int | None = None
    """Samples per batch for every workload (a GPU model wants more than the CPU default);
    None: each workload's own."""
    data_dir: Path = field(default_factory=default_data_dir)
    """Where generated data is cached."""
    seed: int = 0
    """Seed of the data, the shuffles and the case order."""
    case_timeout_s: float = 900.0
    """A run taking longer than this is stopped and reported as an error."""

    def __post_init__(self) -> None:
        for name in self.workloads:
            workload_class(name)
        for name in self.scenarios:
            scenario_class(name)
        for name in self.systems or ():
            system_class(name)
        for family in ("workloads", "scenarios"):
            if not getattr(self, family):
                raise ValueError(f"{family} must name at least one, got none")
        if self.systems is not None and not self.systems:
            raise ValueError("systems must name at least one, got none")
        if self.size not in SIZES:
            raise ValueError(f"size must be one of {list(SIZES)}, got {self.size!r}")
        if self.consumer not in CONSUMERS:
            raise ValueError(f"consumer must be one of {list(CONSUMERS)}, got {self.consumer!r}")
        for name in ("workers", "static_workers"):
            counts = getattr(self, name)
            if counts is not None and (not counts or min(counts) < 0):
                raise ValueError(f"{name} must be ints >= 0, got {counts}")
        if self.measure_s is not None and not self.measure_s > 0:
            raise ValueError(f"measure_s must be None or > 0, got {self.measure_s!r}")
        if self.measure_s is not None and set(self.scenarios) != {"steady"}:
            raise ValueError(
                "measure_s times runs by the clock, so it needs the steady scenario alone "
                f"(the others change by batch index), got {list(self.scenarios)}"
            )
        if self.batch_size is not None and (
            isinstance(self.batch_size, bool)
            or not isinstance(self.batch_size, int)
            or self.batch_size < 1
        ):
            raise ValueError(f"batch_size must be None or an int >= 1, got {self.batch_size!r}")
        if self.step_ms is not None and self.step_ms <= 0:
            raise ValueError(f"step_ms must be > 0, got {self.step_ms!r}")
        if self.device is not None:
            from drapps.ops.device_stage import resolve_device

            resolve_device(self.device)  # names a bad device, or CUDA that is not there
        for name in ("repeats", "max_repeats", "warmup_batches", "measure_batches"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value!r}")
        if self.max_repeats is not None and self.max_repeats < self.repeats:
            raise ValueError(
                f"max_repeats must be >= repeats ({self.repeats}), got {self.max_repeats!r}"
            )
        if self.budget_s is not None and not self.budget_s > 0:
            raise ValueError(f"budget_s must be > 0, got {self.budget_s!r}")
        for name in self.default_systems or ():
            system_class(name)
        for name in self.scenarios:
            scenario = scenario_class(name)
            if scenario.needs_sleep_consumer and self.consumer != "sleep":
                raise ValueError(
                    f"scenario {name!r} changes the step time, so it needs --consumer sleep, "
                    f"got {self.consumer!r}"
                )
            for workload in self.workloads:
                if scenario.needs_file_reads and not workload_class(workload).reads_files:
                    raise ValueError(
                        f"scenario {name!r} throttles file reads, but workload {workload!r} "
                        "reads no files"
                    )

    @classmethod
    def quick(cls, **overrides: Any) -> BenchConfig:
        """Under three minutes, ending in a verdict: the image workload, loader-bound (no
        training step), steady and with a CPU hog for the middle third; DataLoader at 1x to 2x
        the cores, tf.data AUTOTUNE and drapps' heuristic; 3 to 10 interleaved repeats of 80
        timed batches, more while a comparison is not separated and time is left, fewer and
        shorter (down to 30 batches) where the machine is too slow for 3 in the budget:
        160 s for the run, which leaves the plots time within the three minutes."""
        cores = usable_cores()
        base: dict[str, Any] = {
            "size": "quick",
            "repeats": 3,
            "max_repeats": 10,
            "budget_s": QUICK_BUDGET_S,
            "scenarios": ("steady", "cpu-contention"),
            "consumer": "none",
            "workers": tuple(sorted({cores, cores + 1, 2 * cores})),
            "default_systems": QUICK_SYSTEMS,
        }
        return cls(**{**base, **overrides})

    @property
    def window(self) -> tuple[int, int]:
        warmup, measure = _WINDOWS[self.size]
        return self.warmup_batches or warmup, self.measure_batches or measure


def with_overrides(config: BenchConfig, **overrides: Any) -> BenchConfig:
    """``config`` with every override that is not None."""
    return replace(config, **{k: v for k, v in overrides.items() if v is not None})


QUICK_BUDGET_S = 160.0
"""``drapps bench --quick``'s budget: the whole run, so that ``make bench`` (the run, then
its plots) ends within three minutes whatever else the machine does."""
QUICK_SYSTEMS = ("dataloader", "tf-autotune", "drapps-heuristic")
"""What ``drapps bench --quick`` compares when ``--systems`` is not given."""

CACHE_COMPARISON = (
    "dataloader",
    "tf-autotune",
    "tf-autotune-cache",
    "drapps-heuristic",
    "drapps-cache",
    "drapps-cache-none",
    "drapps-cache-lz4",
    "drapps-cache-zstd",
)
"""What ``drapps bench --cache`` compares when ``--systems`` is not given."""


def chosen_systems(config: BenchConfig) -> tuple[list[str], dict[str, str]]:
    """The systems to run, and the skipped ones with why."""
    wanted = CACHE_COMPARISON if config.cache else config.default_systems
    if config.systems is None and wanted is not None:
        run = [name for name in wanted if SYSTEMS[name].unavailable() is None]
        skipped = {n: str(SYSTEMS[n].unavailable()) for n in wanted if n not in run}
        return run, skipped
    if config.systems is not None:
        for name in config.systems:
            reason = system_class(name).unavailable()
            if reason is not None:
                raise ValueError(f"system {name!r} cannot run here: {reason}")
        return list(config.systems), {}
    run, skipped = [], {}
    for name, system in SYSTEMS.items():
        if system.opt_in:
            continue  # runs only when named
        reason = system.unavailable()
        if reason is None:
            run.append(name)
        else:
            skipped[name] = reason
    return run, skipped


def plan_cases(
    config: BenchConfig, systems: list[str], cores: int, skipped: dict[str, str] | None = None
) -> list[Case]:
    """Every case to run; a system that refuses a workload is left out of it (and recorded
    in ``skipped`` as "system on workload")."""
    cases = []
    for workload in config.workloads:
        here = []
        for system in systems:
            reason = system_class(system).refuses(workload)
            if reason is None:
                here.append(system)
            elif skipped is not None:
                skipped[f"{system} on {workload}"] = reason
        for scenario in config.scenarios:
            for system in here:
                variants = system_class(system).variants(cores)
                if system.startswith("dataloader") and config.workers is not None:
                    variants = list(config.workers)
                if system.startswith("drapps-static") and config.static_workers is not None:
                    variants = list(config.static_workers)
                cases += [Case(workload, scenario, system, w) for w in variants]
    return cases


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Median and min-max per case over its repeats; the 95% t interval of the mean
    samples/s when there are 2 repeats or more."""
    grouped: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for run in runs:
        grouped.setdefault((run["workload"], run["scenario"], run["case"]), []).append(run)
    summary = []
    for (workload, scenario, case), group in grouped.items():
        row: dict[str, Any] = {
            "workload": workload,
            "scenario": scenario,
            "case": case,
            "system": group[0]["system"],
            "workers": group[0]["workers"],
            "repeats": len(group),
            "final_workers": [r["final_workers"] for r in group],
        }
        if "energy_source" in group[0]:
            row["energy_source"] = group[0]["energy_source"]
        for metric, value in group[0].items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            if metric in ("repeat", "samples", "expected_samples", "workers", "final_workers"):
                continue
            values = [r[metric] for r in group]
            row[metric] = statistics.median(values)
            row[f"{metric}_min"], row[f"{metric}_max"] = min(values), max(values)
        interval = mean_interval([r["samples_per_s"] for r in group])
        if interval is not None:
            row["samples_per_s_mean"], row["samples_per_s_ci95"] = interval
        summary.append(row)
    return summary


def _summary(workload: str, batch_size: int | None) -> str:
    """The workload's one-line summary, its "; batch N" the batch size the run used."""
    summary = workload_class(workload).summary
    if batch_size is None:
        return summary
    head, sep, _ = summary.rpartition("; batch ")
    return f"{head}; batch {batch_size}" if sep else summary


def run_benchmark(
    config: BenchConfig,
    progress: bool = True,
    *,
    run: RunFunction = run_one,
    clock: Callable[[], float] = time.monotonic,
    started: float | None = None,
) -> dict[str, Any]:
    """Prepare the data, run every case in interleaved repeats, summarise.

    With ``config.budget_s``, the timed window and the repeats are planned to end within that
    many seconds of ``started`` (a ``clock`` reading; default: now), data preparation included
    (:mod:`drapps.bench.budget`); ``results["plan"]`` records what was planned and cut. ``run``
    runs one spec in a fresh process (:func:`run_one`; the tests pass a fake and a fake
    ``clock``).
    """
    started = clock() if started is None else started
    cores = usable_cores()
    systems, skipped = chosen_systems(config)
    for name, reason in skipped.items():
        logger.warning("skipping %s: %s", name, reason)
    warmup, measure = config.window
    params = {}
    for name in config.workloads:
        workload = workload_class(name)
        params[name] = workload.prepare(config.data_dir, config.size, config.seed)
        workload(params[name]).warm()
    cases = plan_cases(config, systems, cores, skipped)
    planner = RepeatPlanner(
        config.budget_s,
        started,
        repeats=config.repeats,
        max_repeats=config.max_repeats,
        window=measure,
        shortest_window=_SHORTEST[config.size],
        measure_s=config.measure_s,
        clock=clock,
    )

    def spec(item: Item, repeat: int, window: int) -> dict[str, Any]:
        if isinstance(item, str):
            samples = _LIMIT_SAMPLES[config.size]
            return _limit_spec(item, params[item], samples, config.seed + repeat, cores)
        return _case_spec(item, config, params[item.workload], warmup, window, cores)

    measured = run_repeats(
        cases,
        config.workloads,
        planner,
        spec,
        seed=config.seed,
        timeout_s=config.case_timeout_s,
        run=run,
        clock=clock,
        progress=progress,
    )
    plan = planner.plan()
    config_record = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items()}
    config_record.update(
        repeats=len(measured.outside),
        min_repeats=config.repeats,
        warmup_batches=warmup,
        measure_batches=plan.window,
        systems=systems,
        step_ms={w: config.step_ms or workload_class(w).step_ms for w in config.workloads},
    )
    return {
        "benchmark": "drapps-bench",
        "version": 2,
        "workloads": {w: _summary(w, config.batch_size) for w in config.workloads},
        "scenarios": {s: SCENARIOS[s].summary for s in config.scenarios},
        "systems": {s: SYSTEMS[s].summary for s in systems},
        "skipped": skipped,
        "params": params,
        "config": config_record,
        "environment": describe_environment(),
        "runs": measured.runs,
        "summary": summarize(measured.runs),
        "limit": {w: summarize_limit(v, cores) for w, v in measured.limits.items() if v},
        "outside_load": measured.outside,
        "plan": plan.as_dict(),
        "bench_s": plan.elapsed_s,
    }


def _limit_spec(
    workload: str, params: dict[str, Any], samples: int, seed: int, cores: int
) -> dict[str, Any]:
    """The spec of a run timing ``workload``'s preprocessing limit."""
    return {
        "mode": "limit",
        "case": "preprocessing limit",
        "workload": workload,
        "scenario": "in-process",
        "params": params,
        "samples": samples,
        "seed": seed,
        "cores": cores,
    }


def _case_spec(
    case: Case,
    config: BenchConfig,
    params: dict[str, Any],
    warmup: int,
    measure: int,
    cores: int,
) -> dict[str, Any]:
    """The spec of one timed run of ``case``."""
    workload = workload_class(case.workload)
    batch_size = config.batch_size or workload.batch_size
    first = warmup
    if config.cache and config.warmup_batches is None:  # a whole first epoch
        first = -(-int(params["samples"]) // batch_size)
    return {
        **asdict(case),
        "case": case.name,
        "params": params,
        "batch_size": batch_size,
        "warmup_batches": first,
        "measure_batches": measure,
        "measure_s": config.measure_s,
        "consumer": config.consumer,
        "device": config.device,
        "cache_memory": config.cache_memory,
        "step_ms": config.step_ms if config.step_ms is not None else workload.step_ms,
        "seed": config.seed,
        "cores": cores,
    }


def summarize_limit(measured: list[dict[str, Any]], cores: int) -> dict[str, Any]:
    """The median single-core rate over the repeats, and it times the usable cores."""
    per_core = [m["per_core_samples_per_s"] for m in measured]
    rate = statistics.median(per_core)
    return {
        "per_core_samples_per_s": rate,
        "per_core_min": min(per_core),
        "per_core_max": max(per_core),
        "cores": cores,
        "samples_per_s": rate * cores,
    }
