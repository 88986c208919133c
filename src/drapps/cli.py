"""The ``drapps`` command line."""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path


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


def _bench(args: argparse.Namespace) -> int:
    from drapps.bench.report import markdown
    from drapps.bench.runner import BenchConfig, run_benchmark, with_overrides

    base = BenchConfig.quick() if args.quick else BenchConfig()
    try:
        config = with_overrides(
            base,
            workers=args.workers,
            systems=args.systems,
            batch_size=args.batch_size,
            measure_batches=args.batches,
            repeats=args.repeats,
            images=args.images,
            step_ms=args.step_ms,
            consumer=args.consumer,
            scenario=args.scenario,
            auto=True if args.auto else None,
            data_dir=args.data_dir,
            resize_probe=False if args.no_resize_probe else None,
        )
    except ValueError as exc:
        print(f"drapps bench: {exc}", file=sys.stderr)
        return 2
    results = run_benchmark(config)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = Path(args.out) if args.out else Path("bench-results") / stamp
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    table = markdown(results)
    (out / "results.md").write_text(table + "\n")
    print(table)
    print(f"\nresults: {out / 'results.json'}", file=sys.stderr)
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="drapps", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    commands = parser.add_subparsers(dest="command", required=True)
    bench = commands.add_parser(
        "bench",
        help="compare drapps.Loader with torch's DataLoader on a JPEG training pipeline",
        description="Compare drapps.Loader with torch's DataLoader at each worker count on "
        "an ImageFolder of JPEGs (decode, random-resized-crop 224, flip). Medians of "
        "interleaved repeats; JSON and a Markdown table are written to --out.",
    )
    bench.add_argument("--quick", action="store_true", help="smoke size (a minute or two)")
    bench.add_argument("--workers", type=_int_list, help="worker counts, e.g. 0,1,2,3,4")
    bench.add_argument("--systems", type=_name_list, help="torch,drapps (default both)")
    bench.add_argument("--batch-size", type=int, help="images per batch (default 32)")
    bench.add_argument("--batches", type=int, help="timed batches per run")
    bench.add_argument("--repeats", type=int, help="interleaved repeats per case")
    bench.add_argument("--images", type=int, help="JPEGs in the generated dataset")
    bench.add_argument("--step-ms", type=float, help="step of the sleep consumer, per batch")
    bench.add_argument(
        "--consumer", help="none (the loader alone, default), sleep (--step-ms), cpu-model"
    )
    bench.add_argument("--scenario", help="steady (default) or cpu-hog (middle third)")
    bench.add_argument("--auto", action="store_true", help="also run drapps workers='auto'")
    bench.add_argument("--no-resize-probe", action="store_true", help="skip the resize probe")
    bench.add_argument("--data-dir", type=Path, help="dataset cache (default ~/.cache/drapps)")
    bench.add_argument("--out", help="output folder (default bench-results/<UTC time>)")
    bench.set_defaults(run=_bench)
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
