"""What telemetry costs a training loop, measured two ways on a loop of tiny in-memory
batches (where a per-batch cost shows most).

- Wall time: each repeat times one pass of ``--batches`` batches for telemetry on and off, in
  an order that alternates between repeats, after one untimed pass of each; the figures are
  the median time per batch of each with its spread (lowest to highest repeat), and the
  median of the paired differences (on minus off within a repeat). On a busy machine the
  spread can exceed the difference.
- CPU time: the telemetry thread's own CPU seconds over each pass with telemetry on (read
  from its thread clock), per batch and as a share of one core; noise from other processes
  does not enter it.

A benchmark, not a test: nothing here passes or fails. Results are printed and, with
``--out``, written as JSON with the machine and commit they come from::

    python -m drapps.bench.telemetry_overhead --batches 20000 --repeats 9 --workers 0,2
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from collections.abc import Sequence
from typing import Any

import torch

SAMPLES = 1024
"""Samples in the dataset; an epoch is ``SAMPLES / batch_size`` batches and passes run as
many epochs as they need (``persistent_workers`` keeps the workers between them)."""


def time_pass(
    workers: int, telemetry: bool, batches: int, batch_size: int
) -> tuple[float, float | None]:
    """Seconds per batch over one pass of ``batches`` batches after the first (the loader's
    making, its workers' start-up and its closing left out: what is measured is the cost
    each batch carries), and the CPU seconds the telemetry thread used over the pass (None
    with telemetry off)."""
    import drapps

    data = [torch.zeros(8) for _ in range(SAMPLES)]
    loader = drapps.Loader(
        data,
        batch_size=batch_size,
        shuffle=True,
        num_workers=workers,
        persistent_workers=workers > 0,
        telemetry=telemetry,
    )
    with loader:
        taken, began, cpu_began = -1, 0.0, 0.0
        while taken < batches:
            for _ in loader:
                taken += 1
                if taken == 0:
                    began, cpu_began = time.perf_counter(), _telemetry_cpu_s()
                elif taken == batches:
                    break
        elapsed = time.perf_counter() - began
        cpu = _telemetry_cpu_s() - cpu_began if telemetry else None
    return elapsed / batches, cpu


def _telemetry_cpu_s() -> float:
    """CPU seconds the telemetry thread (``drapps-controller``) has used, 0 without one."""
    for thread in threading.enumerate():
        if thread.name == "drapps-controller" and thread.ident is not None:
            return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    return 0.0


def measure(workers: int, batches: int, repeats: int, batch_size: int) -> dict[str, Any]:
    """Interleaved repeats of telemetry on and off at one worker count."""
    settings = (True, False)
    for telemetry in settings:  # warm-up: imports, first forks, allocator
        time_pass(workers, telemetry, max(1, batches // 10), batch_size)
    seconds: dict[bool, list[float]] = {True: [], False: []}
    thread_share = []  # the telemetry thread's CPU seconds per second of the pass
    for repeat in range(repeats):
        for telemetry in settings if repeat % 2 == 0 else settings[::-1]:
            per_batch, cpu = time_pass(workers, telemetry, batches, batch_size)
            seconds[telemetry].append(per_batch)
            if cpu is not None:
                thread_share.append(cpu / (per_batch * batches))
    paired = [on - off for on, off in zip(seconds[True], seconds[False], strict=True)]
    off = statistics.median(seconds[False])
    thread_us = [1e6 * share * t for share, t in zip(thread_share, seconds[True], strict=True)]
    return {
        "workers": workers,
        "us_per_batch": {
            ("on" if k else "off"): _summary([1e6 * s for s in v]) for k, v in seconds.items()
        },
        "paired_difference_us": _summary([1e6 * d for d in paired]),
        "paired_difference_share": statistics.median(paired) / off if off else None,
        "thread_cpu_share_of_a_core": _summary(thread_share),
        "thread_cpu_us_per_batch": _summary(thread_us),
    }


def _summary(values: Sequence[float]) -> dict[str, Any]:
    return {
        "median": statistics.median(values),
        "low": min(values),
        "high": max(values),
        "values": list(values),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m drapps.bench.telemetry_overhead")
    parser.add_argument("--batches", type=int, default=20_000, help="batches a pass (20000)")
    parser.add_argument("--repeats", type=int, default=9, help="timed passes a setting (9)")
    parser.add_argument("--batch-size", type=int, default=4, help="samples a batch (4)")
    parser.add_argument("--workers", default="0,2", help="worker counts, comma-separated")
    parser.add_argument("--out", help="write the results here as JSON")
    args = parser.parse_args(argv)
    from drapps.bench.environment import describe_environment

    results = {
        "environment": describe_environment(),
        "batches": args.batches,
        "repeats": args.repeats,
        "batch_size": args.batch_size,
        "runs": [
            measure(int(w), args.batches, args.repeats, args.batch_size)
            for w in args.workers.split(",")
        ],
    }
    for run in results["runs"]:
        on, off = run["us_per_batch"]["on"], run["us_per_batch"]["off"]
        diff = run["paired_difference_us"]
        print(
            f"workers={run['workers']}: telemetry on {on['median']:.1f} us a batch "
            f"({on['low']:.1f}-{on['high']:.1f}), off {off['median']:.1f} "
            f"({off['low']:.1f}-{off['high']:.1f}); paired difference {diff['median']:+.2f} us "
            f"({diff['low']:+.2f} to {diff['high']:+.2f}), "
            f"{100 * (run['paired_difference_share'] or 0):+.2f}% of a batch; the telemetry "
            f"thread's CPU {run['thread_cpu_us_per_batch']['median']:.2f} us a batch "
            f"({run['thread_cpu_us_per_batch']['low']:.2f}-"
            f"{run['thread_cpu_us_per_batch']['high']:.2f}), "
            f"{100 * run['thread_cpu_share_of_a_core']['median']:.3f}% of a core"
        )
    if args.out:
        with open(args.out, "w") as out:
            json.dump(results, out, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
