"""``drapps profile``: a user's dataset under telemetry, and its bottleneck report."""

from __future__ import annotations

import argparse
import sys
import time

from drapps.cli._args import Commands, UsageError, load_object


def load_dataset(spec: str) -> object:
    """``module:factory`` -> the dataset (``factory()`` if callable, else the object itself).

    Raises:
        ValueError: the spec names nothing, or something that is not a map-style dataset.
    """
    factory = load_object(spec, "--dataset")
    dataset = factory() if callable(factory) and not hasattr(factory, "__getitem__") else factory
    if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
        raise ValueError(
            f"--dataset {spec} gave a {type(dataset).__name__}, not a map-style dataset"
        )
    return dataset


def profile_command(args: argparse.Namespace) -> int:
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
        raise UsageError(str(exc)) from None
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
        stats = loader.stats()  # before the loader closes, as the report
        report = loader.report()
    print(report)
    # The worker count is the report's to tell: the count the run settled on, not whatever a
    # try had it at in the last tick.
    print(
        f"\n{stats.batches} batches, {stats.samples} samples; {stats.worker_restarts} worker "
        f"restarts, {stats.samples_skipped} samples skipped."
    )
    if args.trace:
        print(f"trace: {args.trace}", file=sys.stderr)
    return 0


def add_commands(commands: Commands) -> None:
    """Add ``profile``."""
    profile = commands.add_parser(
        "profile",
        help="run your dataset under telemetry and print a bottleneck report",
        description="Load a map-style dataset from module:factory (factory() is called), run "
        "a drapps.Loader over it for --batches batches, and print where the time went and "
        "what to change (with --workers auto the controller chooses the count).",
    )
    profile.add_argument("--dataset", required=True, help="module:factory, e.g. mydata:make")
    profile.add_argument("--batches", type=int, default=200, help="batches to run (200)")
    profile.add_argument("--batch-size", type=int, default=32, help="samples per batch (32)")
    profile.add_argument(
        "--workers", default="auto", help="'auto' (default) or a count, kept as given"
    )
    profile.add_argument("--step-ms", type=float, default=0.0, help="simulated training step")
    profile.add_argument("--interval", type=float, default=0.5, help="controller tick seconds")
    profile.add_argument("--trace", help="also write the JSONL trace here")
    profile.add_argument("--progress", action="store_true", help="live status line")
    profile.set_defaults(run=profile_command)
