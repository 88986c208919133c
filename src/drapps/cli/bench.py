"""``drapps bench`` and ``drapps bench-plot``."""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

from drapps.cli._args import Commands, UsageError, check_positive, int_list, name_list


def bench_list() -> str:
    from drapps.bench.runner import CONSUMERS
    from drapps.bench.scenarios import SCENARIOS
    from drapps.bench.systems import SYSTEMS
    from drapps.bench.workloads import WORKLOADS

    lines = ["workloads (--workload):"]
    lines += [f"  {name:18s} {w.summary}" for name, w in WORKLOADS.items()]
    lines += ["scenarios (--scenario):"]
    lines += [f"  {name:18s} {s.summary}" for name, s in SCENARIOS.items()]
    lines += ["systems (--systems):"]
    for name, system in SYSTEMS.items():
        reason = system.unavailable()
        note = f" [unavailable: {reason}]" if reason else ""
        lines.append(f"  {name:18s} {system.summary}{note}")
    lines += ["consumers (--consumer):", "  " + ", ".join(CONSUMERS)]
    return "\n".join(lines)


def _process_start() -> float:
    """This process's start as a ``time.monotonic()`` reading: a budget counts the
    interpreter's start and the imports too, as the person waiting does."""
    import time

    import psutil

    age = max(0.0, time.time() - psutil.Process().create_time())
    return time.monotonic() - age


def bench_command(args: argparse.Namespace) -> int:
    if args.list:
        print(bench_list())
        return 0
    from drapps.bench.report import brief, markdown
    from drapps.bench.runner import BenchConfig, run_benchmark, with_overrides

    base = BenchConfig.quick() if args.quick else BenchConfig()
    if args.repeats is not None and base.max_repeats is not None and args.max_repeats is None:
        args.max_repeats = max(base.max_repeats, args.repeats)  # --repeats raises the floor
    try:
        config = with_overrides(
            base,
            workloads=args.workload,
            scenarios=args.scenario,
            systems=args.systems,
            workers=args.workers,
            static_workers=args.static_workers,
            measure_batches=args.batches,
            measure_s=args.seconds,
            repeats=args.repeats,
            max_repeats=args.max_repeats,
            budget_s=args.budget,
            step_ms=args.step_ms,
            batch_size=args.batch_size,
            consumer=args.consumer,
            device=args.device,
            cache=args.cache or None,
            cache_memory=args.cache_memory,
            size=args.size,
            data_dir=args.data_dir,
        )
        results = run_benchmark(config, progress=not args.no_progress, started=_process_start())
    except (ValueError, FileNotFoundError, ImportError) as exc:
        raise UsageError(str(exc)) from None
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = Path(args.out) if args.out else Path("bench-results") / stamp
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "results.md").write_text(markdown(results) + "\n")
    print(brief(results))
    print(
        f"\nfull tables: {out / 'results.md'}; JSON: {out / 'results.json'}; plots: "
        f"drapps bench-plot {out / 'results.json'}",
        file=sys.stderr,
    )
    return 0


def bench_plot_command(args: argparse.Namespace) -> int:
    from drapps.bench.plots import plot

    source = Path(args.results)
    try:
        results = json.loads(source.read_text())
        if results.get("benchmark") != "drapps-bench" or results.get("version") != 2:
            raise ValueError("it is not a results.json written by this version of drapps bench")
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {source}: {exc}") from None
    try:
        paths = plot(results, Path(args.out) if args.out else source.parent)
    except ImportError as exc:
        raise UsageError(str(exc)) from None
    for path in paths:
        print(path)
    return 0


def bench_scale_out_command(args: argparse.Namespace) -> int:
    from drapps.bench.scale_out import run

    check_positive(args, "workers", "repeats", "epochs", minimum=1)
    try:
        result = run(
            Path(args.out),
            workers=args.workers,
            repeats=args.repeats,
            max_repeats=args.max_repeats,
            budget_s=args.budget,
            epochs=args.epochs,
            size=args.size,
        )
    except (ImportError, RuntimeError) as exc:
        raise UsageError(str(exc)) from None
    from drapps.bench.scale_out import markdown

    print(markdown(result, result["what_if"]), end="")
    return 0


def add_commands(commands: Commands) -> None:
    """Add ``bench`` and ``bench-plot``."""
    bench = commands.add_parser(
        "bench",
        help="the benchmark suite: drapps vs DataLoader (every worker count) and tf.data",
        description="Run realistic pipelines (--workload) under steady and changing load "
        "(--scenario) through each loading system (--systems), feeding a training step "
        "(--consumer). Medians of interleaved repeats, each run a fresh process; JSON and a "
        "Markdown table go to --out, plots come from `drapps bench-plot`. With no options: "
        "the image workload, steady and cpu-contention, every available system, 3 repeats "
        "(about 12 minutes on 2 cores). `drapps bench --list` names every choice.",
    )
    bench.add_argument("--list", action="store_true", help="list workloads, scenarios, systems")
    bench.add_argument(
        "--quick",
        action="store_true",
        help="under 3 minutes with its plots, however busy the machine: image, loader-bound, "
        "steady and cpu-contention, DataLoader at 1x-2x the cores, tf.data and drapps; "
        "3 repeats (more while the verdict is not separated, fewer and shorter where the "
        "machine is slow) within a 160 s budget",
    )
    bench.add_argument(
        "--workload", type=name_list, help="image, image-gil, text, synthetic, stragglers (a,b ok)"
    )
    bench.add_argument(
        "--scenario",
        type=name_list,
        help="steady, cpu-contention, consumer-shift, slow-io (default steady,cpu-contention)",
    )
    bench.add_argument("--systems", type=name_list, help="default: every available one")
    bench.add_argument("--workers", type=int_list, help="DataLoader counts (default 0..2x cores)")
    bench.add_argument(
        "--static-workers", type=int_list, help="drapps-static counts (default: usable cores)"
    )
    bench.add_argument("--repeats", type=int, help="interleaved repeats per case (3)")
    bench.add_argument(
        "--max-repeats",
        type=int,
        help="repeat past --repeats, up to this many, until the verdict's comparisons separate",
    )
    bench.add_argument(
        "--budget",
        type=float,
        help="wall-clock seconds for the whole run (--quick: 160): where the machine is too "
        "slow for the repeats asked, fewer repeats and shorter timed windows, and the verdict "
        "says so",
    )
    bench.add_argument("--batches", type=int, help="timed batches per run")
    bench.add_argument(
        "--seconds",
        type=float,
        help="time each run for at least this long, past --batches if needed (steady only)",
    )
    bench.add_argument("--consumer", help="sleep (default), cpu-model, cuda-model or none")
    bench.add_argument("--step-ms", type=float, help="the sleep consumer's step per batch")
    bench.add_argument(
        "--batch-size", type=int, help="samples per batch for every workload (default: its own)"
    )
    bench.add_argument(
        "--device", help="where drapps-split's device stage runs (cuda; default: the CPU)"
    )
    bench.add_argument(
        "--cache",
        action="store_true",
        help="measure the sample cache: epochs 2+ of the cache systems against DataLoader, "
        "tf.data and drapps without a cache (epoch 1 is recorded as the warm-up)",
    )
    bench.add_argument("--cache-memory", help="the cache systems' memory budget (e.g. 150MB)")
    bench.add_argument("--size", help="data and run size: smoke, quick or default")
    bench.add_argument("--data-dir", type=Path, help="data cache (default ~/.cache/drapps)")
    bench.add_argument("--out", help="output folder (default bench-results/<UTC time>)")
    bench.add_argument("--no-progress", action="store_true", help="no progress bar")
    bench.set_defaults(run=bench_command)
    bench_plot = commands.add_parser(
        "bench-plot",
        help="PNG plots from a drapps bench results.json",
        description="Throughput and loop wait over time per system, and end-to-end time per "
        "scenario, from the JSON `drapps bench` wrote (needs the 'plot' extra: matplotlib).",
    )
    bench_plot.add_argument("results", help="path to results.json")
    bench_plot.add_argument("--out", help="folder for the PNGs (default: beside the JSON)")
    bench_plot.set_defaults(run=bench_plot_command)
    scale_out = commands.add_parser(
        "bench-scale-out",
        help="the Ray and Redis paths against the local loader, and a simulated what-if",
        description="Times the image workload through local worker processes, Ray actors "
        "(backend='ray') and drapps serve producers over Redis (source='redis://...'), "
        "interleaved, and simulates 1-8 preprocessing machines calibrated on the runs. Needs "
        "the ray and redis extras and redis-server; run it in a loopback-only network "
        "namespace (make bench-scale-out does).",
    )
    scale_out.add_argument("--out", default="bench-results/scale-out", help="results folder")
    scale_out.add_argument("--workers", type=int, default=2, help="workers per path (2)")
    scale_out.add_argument("--repeats", type=int, default=5, help="interleaved repeats (5)")
    scale_out.add_argument("--epochs", type=int, default=2, help="epochs per timing (2)")
    scale_out.add_argument("--size", choices=("smoke", "quick"), default="quick")
    scale_out.set_defaults(run=bench_scale_out_command)
