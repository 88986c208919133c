"""The ``drapps`` command line."""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated ints like 0,1,2, got {text!r}"
        ) from None
    if not values:
        raise argparse.ArgumentTypeError(f"expected at least one int, got {text!r}")
    return values


def _name_list(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _bench_list() -> str:
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


def _bench(args: argparse.Namespace) -> int:
    if args.list:
        print(_bench_list())
        return 0
    from drapps.bench.report import markdown
    from drapps.bench.runner import BenchConfig, run_benchmark, with_overrides

    base = BenchConfig.quick() if args.quick else BenchConfig()
    try:
        config = with_overrides(
            base,
            workloads=args.workload,
            scenarios=args.scenario,
            systems=args.systems,
            workers=args.workers,
            static_workers=args.static_workers,
            measure_batches=args.batches,
            repeats=args.repeats,
            step_ms=args.step_ms,
            consumer=args.consumer,
            size=args.size,
            data_dir=args.data_dir,
        )
        results = run_benchmark(config, progress=not args.no_progress)
    except (ValueError, FileNotFoundError, ImportError) as exc:
        print(f"drapps bench: {exc}", file=sys.stderr)
        return 2
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = Path(args.out) if args.out else Path("bench-results") / stamp
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    table = markdown(results)
    (out / "results.md").write_text(table + "\n")
    print(table)
    print(
        f"\nresults: {out / 'results.json'} and results.md; plots: "
        f"drapps bench-plot {out / 'results.json'}",
        file=sys.stderr,
    )
    return 0


def _bench_plot(args: argparse.Namespace) -> int:
    from drapps.bench.plots import plot

    source = Path(args.results)
    try:
        results = json.loads(source.read_text())
        if results.get("benchmark") != "drapps-bench" or results.get("version") != 2:
            raise ValueError("it is not a results.json written by this version of drapps bench")
    except (OSError, ValueError) as exc:
        print(f"drapps bench-plot: cannot read {source}: {exc}", file=sys.stderr)
        return 2
    try:
        paths = plot(results, Path(args.out) if args.out else source.parent)
    except ImportError as exc:
        print(f"drapps bench-plot: {exc}", file=sys.stderr)
        return 2
    for path in paths:
        print(path)
    return 0


def load_dataset(spec: str) -> object:
    """``module:factory`` -> the dataset (``factory()`` if callable, else the object itself)."""
    import importlib

    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"--dataset must look like module:factory, got {spec!r}")
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")  # like `python -m`: modules in the current folder are found
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import {module_name!r} for --dataset: {exc}") from exc
    try:
        factory = getattr(module, attribute)
    except AttributeError:
        names = sorted(n for n in dir(module) if not n.startswith("_"))
        raise ValueError(
            f"{module_name!r} has no {attribute!r} for --dataset; it has {names}"
        ) from None
    dataset = factory() if callable(factory) and not hasattr(factory, "__getitem__") else factory
    if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
        raise ValueError(
            f"--dataset {spec} gave a {type(dataset).__name__}, not a map-style dataset"
        )
    return dataset


def _profile(args: argparse.Namespace) -> int:
    import time

    import drapps

    try:
        dataset = load_dataset(args.dataset)
        workers: int | str = "auto" if args.workers == "auto" else int(args.workers)
        loader = drapps.Loader(
            dataset,
            batch_size=args.batch_size,
            shuffle=True,
            workers=workers,  # type: ignore[arg-type]
            persistent_workers=workers != 0,
            trace=args.trace,
            control_interval=args.interval,
            progress=args.progress,
        )
    except ValueError as exc:
        print(f"drapps profile: {exc}", file=sys.stderr)
        return 2
    delivered = 0
    with loader:
        while delivered < args.batches:
            for _ in loader:
                delivered += 1
                if args.step_ms:
                    time.sleep(args.step_ms / 1000)
                if delivered >= args.batches:
                    break
            if len(loader) == 0:
                break
    print(loader.report())
    stats = loader.stats()
    print(
        f"\n{stats.batches} batches, {stats.samples} samples; final workers {stats.workers}; "
        f"{stats.worker_restarts} worker restarts, {stats.samples_skipped} samples skipped."
    )
    if args.trace:
        print(f"trace: {args.trace}", file=sys.stderr)
    return 0


def _train(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from drapps.train import TrainConfig, train

    try:
        config = TrainConfig(
            recipe=args.recipe,
            data=args.data,
            model=args.model,
            amp=args.amp,
            accumulate=args.accumulate,
            max_k=args.max_k,
            checkpointing=args.checkpointing,
            zero=args.zero,
            nproc=args.nproc,
            schedule=args.schedule,
            warmup=args.warmup,
            scaling=args.scaling,
            lr=args.lr,
            micro_batch=args.micro_batch,
            max_steps=args.max_steps,
            target=args.target,
            eval_every=args.eval_every,
            eval_batches=args.eval_batches,
            adaptive=not args.no_adaptive,
            device=args.device,
            workers=int(args.workers) if args.workers.isdigit() else args.workers,
            seed=args.seed,
            log_every=args.log_every,
        )
        report = train(config)
    except (ValueError, FileNotFoundError, ImportError) as exc:
        print(f"drapps train: {exc}", file=sys.stderr)
        return 2
    print(report.describe())
    if args.out:
        Path(args.out).write_text(json.dumps(asdict(report), indent=1))
    return 0


def _train_data(args: argparse.Namespace) -> int:
    from drapps.train.standin import write_cifar10_standin, write_wikitext2_standin

    try:
        if args.dataset == "cifar10":
            per_class = (500, 100) if args.small else (5000, 1000)
            folder = write_cifar10_standin(args.out, *per_class)
        else:
            folder = write_wikitext2_standin(args.out, max_bytes=1_000_000 if args.small else None)
    except (FileNotFoundError, ImportError) as exc:
        print(f"drapps train-data: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.dataset} stand-in to {folder}")
    return 0


def _train_ablation(args: argparse.Namespace) -> int:
    from drapps.train.ablation import ARMS, markdown, run_ablation

    common = [a for a in args.train_args if a != "--"]
    if not common:
        print("drapps train-ablation: give the drapps train options after --", file=sys.stderr)
        return 2
    try:
        results = run_ablation(
            common, arms=args.arms or tuple(ARMS), repeats=args.repeats, seed=args.seed
        )
    except (ValueError, RuntimeError) as exc:
        print(f"drapps train-ablation: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    table = markdown(results)
    (out / "results.md").write_text(table)
    print(table)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="drapps", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    commands = parser.add_subparsers(dest="command", required=True)
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
    bench.add_argument("--quick", action="store_true", help="smoke size: image, steady, ~2 min")
    bench.add_argument("--workload", type=_name_list, help="image, text, synthetic (a,b ok)")
    bench.add_argument(
        "--scenario",
        type=_name_list,
        help="steady, cpu-contention, consumer-shift, slow-io (default steady,cpu-contention)",
    )
    bench.add_argument("--systems", type=_name_list, help="default: every available one")
    bench.add_argument("--workers", type=_int_list, help="DataLoader counts (default 0..2x cores)")
    bench.add_argument(
        "--static-workers", type=_int_list, help="drapps-static counts (default: usable cores)"
    )
    bench.add_argument("--repeats", type=int, help="interleaved repeats per case (3)")
    bench.add_argument("--batches", type=int, help="timed batches per run")
    bench.add_argument("--consumer", help="sleep (default), cpu-model or none")
    bench.add_argument("--step-ms", type=float, help="the sleep consumer's step per batch")
    bench.add_argument("--size", help="data and run size: smoke, quick or default")
    bench.add_argument("--data-dir", type=Path, help="data cache (default ~/.cache/drapps)")
    bench.add_argument("--out", help="output folder (default bench-results/<UTC time>)")
    bench.add_argument("--no-progress", action="store_true", help="no progress bar")
    bench.set_defaults(run=_bench)
    bench_plot = commands.add_parser(
        "bench-plot",
        help="PNG plots from a drapps bench results.json",
        description="Throughput and loop wait over time per system, and end-to-end time per "
        "scenario, from the JSON `drapps bench` wrote (needs the 'plot' extra: matplotlib).",
    )
    bench_plot.add_argument("results", help="path to results.json")
    bench_plot.add_argument("--out", help="folder for the PNGs (default: beside the JSON)")
    bench_plot.set_defaults(run=_bench_plot)
    profile = commands.add_parser(
        "profile",
        help="run your dataset under telemetry and print a bottleneck report",
        description="Load a map-style dataset from module:factory (factory() is called), run "
        "a drapps.Loader over it for --batches batches with the controller on, and print "
        "where the time went.",
    )
    profile.add_argument("--dataset", required=True, help="module:factory, e.g. mydata:make")
    profile.add_argument("--batches", type=int, default=200, help="batches to run (200)")
    profile.add_argument("--batch-size", type=int, default=32, help="samples per batch (32)")
    profile.add_argument("--workers", default="auto", help="'auto' (default) or a count")
    profile.add_argument("--step-ms", type=float, default=0.0, help="simulated training step")
    profile.add_argument("--interval", type=float, default=0.5, help="controller tick seconds")
    profile.add_argument("--trace", help="also write the JSONL trace here")
    profile.add_argument("--progress", action="store_true", help="live status line")
    profile.set_defaults(run=_profile)
    _add_train_parsers(commands)
    from drapps.sim.commands import add_parsers

    add_parsers(commands)
    return parser


def _add_train_parsers(commands: Any) -> None:
    train = commands.add_parser(
        "train",
        help="train a recipe with any mix of the training-efficiency toolkit",
        description="Train ResNet on CIFAR-10 or GPT-2 on WikiText-2 from a local copy in the "
        "published format. With no options it is the founding proposal's baseline (fp32, AdamW "
        "at a constant 1e-4); each option adds one optimisation. Prints progress and a final "
        "report: time to --target, peak memory, throughput, final quality.",
    )
    train.add_argument("--recipe", required=True, help="resnet-cifar10 or gpt2-wikitext2")
    train.add_argument("--data", required=True, help="folder with the recipe's data")
    train.add_argument(
        "--model",
        help="resnet18, resnet50, resnet18-w16, resnet18-w4, gpt2-small, gpt2-mini, gpt2-tiny",
    )
    train.add_argument("--amp", default="fp32", help="fp32 (default), bf16 or fp16")
    train.add_argument("--accumulate", default="1", help="micro-batches per step, or gns")
    train.add_argument("--max-k", type=int, default=16, help="largest k with gns (16)")
    train.add_argument("--checkpointing", default="none", help="none, sqrt or a segment count")
    train.add_argument("--zero", type=int, choices=(0, 1, 2), help="ZeRO stage (0 = DDP)")
    train.add_argument("--nproc", type=int, default=1, help="local processes with --zero (1)")
    train.add_argument("--schedule", default="constant", help="constant or warmup-cosine")
    train.add_argument("--warmup", type=float, default=0.05, help="warmup share (0.05)")
    train.add_argument(
        "--scaling", default="sqrt", help="lr rule when k changes: none, linear, sqrt"
    )
    train.add_argument("--lr", type=float, default=1e-4, help="peak learning rate (1e-4)")
    train.add_argument("--micro-batch", type=int, help="samples per micro-batch")
    train.add_argument("--max-steps", type=int, default=200, help="optimizer steps (200)")
    train.add_argument("--target", type=float, help="quality for time-to-target")
    train.add_argument("--eval-every", type=int, default=50, help="steps between evaluations")
    train.add_argument("--eval-batches", type=int, help="evaluation batches (default all)")
    train.add_argument("--no-adaptive", action="store_true", help="never switch pieces off")
    train.add_argument("--device", default="auto", help="auto, cpu or cuda")
    train.add_argument("--workers", default="auto", help="loader workers: auto or a count")
    train.add_argument("--seed", type=int, default=0, help="model init and data order")
    train.add_argument("--log-every", type=int, default=10, help="steps between progress lines")
    train.add_argument("--out", help="write the report as JSON here")
    train.set_defaults(run=_train)
    data = commands.add_parser(
        "train-data",
        help="write stand-in CIFAR-10 / WikiText-2 files made from local sources",
        description="cifar10: 32x32 crops of ten scikit-image photos as CIFAR-10 binary "
        "batches; wikitext2: Debian's python3.11-doc text as wiki.*.raw files. Real data is "
        "never downloaded; use these to try the recipes.",
    )
    data.add_argument("dataset", choices=("cifar10", "wikitext2"))
    data.add_argument("out", help="folder to write")
    data.add_argument("--small", action="store_true", help="a tenth of the size")
    data.set_defaults(run=_train_data)
    ablation = commands.add_parser(
        "train-ablation",
        help="the toolkit's ablation: baseline, each piece alone, all together",
        description="Run `drapps train` with the options after -- once per arm (baseline, "
        "warmup-cosine, accumulate-gns, amp-bf16, checkpointing, all), each in a fresh "
        "process with the off-switches disabled, repeats interleaved; writes results.json "
        "and results.md (medians, each arm against the baseline).",
    )
    ablation.add_argument("--arms", type=_name_list, help="subset of arms (default all)")
    ablation.add_argument("--repeats", type=int, default=1, help="interleaved repeats (1)")
    ablation.add_argument("--seed", type=int, default=0, help="shuffle seed of the run order")
    ablation.add_argument("--out", default="train-ablation", help="output folder")
    ablation.add_argument("train_args", nargs=argparse.REMAINDER, help="-- drapps train options")
    ablation.set_defaults(run=_train_ablation)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
