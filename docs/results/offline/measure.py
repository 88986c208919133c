"""Offline fine-tuning measured on this machine: collect traces, fine-tune, compare.

Each run is the bench's ``image`` workload through ``drapps.Loader(workers="auto")`` under one
of the bench's load scenarios, with a 40 ms sleeping training step, in a process of its own:

    python docs/results/offline/measure.py collect --scenario cpu-contention --runs 3 OUT
    python docs/results/offline/measure.py collect --scenario slow-io --cache --runs 3 OUT
    drapps train-policy --offline OUT/traces/*.jsonl --steps 5000 --out OUT/tuned.npz
    python docs/results/offline/measure.py compare --policies heuristic,rl,OUT/tuned.npz \\
        --scenarios cpu-contention,slow-io --repeats 3 OUT

    python docs/results/offline/measure.py workers --counts 1,2,4,8 --step-ms 0 OUT

``collect`` writes a trace per run (the heuristic and the shipped policy, alternating);
``compare`` runs every policy on every scenario, repeats interleaved, and writes
``compare.json`` and ``compare.md``: median samples/s, loop wait, peak RSS of the training
process tree (each process's resident set in full, sampled every 10 batches), peak memory
the tree held (the largest ``State.held_bytes`` in the run's trace: shared pages once), and
mean reward per controller tick (from each run's trace). ``workers`` runs
fixed worker counts and adds the CPU each batch cost the workers and the training process.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

import drapps
from drapps.bench.data import default_data_dir
from drapps.bench.scenarios import scenario_class
from drapps.bench.workloads import workload_class
from drapps.control.rl import MlpPolicy
from drapps.telemetry import read_trace

BATCH, WARMUP, STEP_S = 32, 12, 0.040


def one_run(
    policy: str,
    scenario_name: str,
    batches: int,
    trace: Path,
    step_s: float = STEP_S,
    cache: bool = False,
) -> dict[str, Any]:
    """One run in this process; the result as a dict. ``policy`` ``static:N``: N fixed workers."""
    workload_type = workload_class("image")
    workload = workload_type(workload_type.prepare(default_data_dir(), "default", 0))
    scenario = scenario_class(scenario_name)()
    workers: Any = "auto"
    chosen: Any = MlpPolicy.load(policy) if policy.endswith(".npz") else policy
    if policy.startswith("static:"):
        chosen, workers = "static", int(policy.split(":")[1])
    peak = 0
    try:
        with drapps.Loader(
            workload.dataset(scenario.throttle()), batch_size=BATCH, drop_last=True,
            workers=workers, persistent_workers=True, policy=chosen, cache=cache or None,
            shuffle=True, seed=0, trace=trace, control_interval=0.25,
        ) as loader:  # fmt: skip
            it = iter(loader)
            for _ in range(WARMUP):
                next(it)
            waits, start = [], time.perf_counter()
            for b in range(batches):
                factor = scenario.before_batch(b, batches)
                asked = time.perf_counter()
                try:
                    next(it)
                except StopIteration:
                    it = iter(loader)
                    next(it)
                waits.append(time.perf_counter() - asked)
                time.sleep(step_s * factor)
                if b % 10 == 0:
                    me = psutil.Process()
                    tree = [me, *me.children(recursive=True)]
                    helpers = scenario.helper_pids()
                    peak = max(peak, sum(p.memory_info().rss for p in tree
                                         if p.pid not in helpers and p.is_running()))  # fmt: skip
            elapsed = time.perf_counter() - start
            workers = loader.stats().workers
    finally:
        scenario.stop()
    rows = read_trace(trace).rows
    ticks = list(itertools.pairwise(r for r in rows if r.t >= rows[-1].t - elapsed))
    made = sum(b.state.throughput * (b.t - a.t) for a, b in ticks) / BATCH
    per_batch = {  # CPU milliseconds per batch delivered, over the timed ticks
        f"{who}_cpu_ms": 1000 * sum(getattr(b.state, f"{who}_cpu") * (b.t - a.t)
                                    for a, b in ticks) / max(made, 1e-9)
        for who in ("workers", "main")
    }  # fmt: skip
    return {
        **per_batch,
        "policy": policy,
        "scenario": scenario_name,
        "samples_per_s": batches * BATCH / elapsed,
        "wait_fraction": sum(waits) / elapsed,
        "peak_rss_mib": peak / 2**20,
        "peak_held_mib": max(r.state.held_bytes for r in rows) / 2**20 if rows else float("nan"),
        "mean_reward": statistics.fmean(r.reward for r in rows) if rows else float("nan"),
        "ticks": len(rows),
        "final_workers": workers,
    }


def spawn(
    policy: str,
    scenario: str,
    batches: int,
    trace: Path,
    step_s: float = STEP_S,
    cache: bool = False,
) -> dict[str, Any]:
    """:func:`one_run` in a fresh process (nothing one run warms carries into the next)."""
    done = subprocess.run(
        [sys.executable, __file__, "one", policy, scenario, str(batches), str(trace),
         str(step_s), "cache" if cache else "none"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def collect(args: argparse.Namespace) -> None:
    folder = Path(args.out) / "traces"
    folder.mkdir(parents=True, exist_ok=True)
    for k in range(args.runs):
        for policy in ("heuristic", "rl"):
            cached = "-cache" if args.cache else ""
            trace = folder / f"{args.scenario}{cached}-{policy}-{k}.jsonl"
            result = spawn(policy, args.scenario, args.batches, trace, cache=args.cache)
            print(json.dumps(result), flush=True)


def compare(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(args.traces or scratch)
        folder.mkdir(parents=True, exist_ok=True)
        for repeat in range(args.repeats):
            for scenario in args.scenarios.split(","):
                for policy in args.policies.split(","):
                    trace = folder / f"{scenario}-{Path(policy).stem}-{repeat}.jsonl"
                    result = spawn(policy, scenario, args.batches, trace, cache=args.cache)
                    result = {**result, "repeat": repeat}
                    print(json.dumps(result), flush=True)
                    runs.append(result)
    (out / "compare.json").write_text(json.dumps(runs, indent=1))
    table = compare_table(runs, args)
    (out / "compare.md").write_text(table)
    print(table, end="")


def compare_table(runs: list[dict[str, Any]], args: argparse.Namespace) -> str:
    """``compare``'s Markdown table of ``runs``."""
    lines = [
        "| scenario | policy | samples/s (min-max) | loop waited | mean reward per tick "
        "| peak held MiB | peak RSS sum MiB | workers at end |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for scenario in args.scenarios.split(","):
        for policy in args.policies.split(","):
            mine = [r for r in runs if r["scenario"] == scenario and r["policy"] == policy]

            def median(key: str, rows: list[dict[str, Any]] = mine) -> float:
                return statistics.median(r[key] for r in rows)

            rates = [r["samples_per_s"] for r in mine]
            helds = [r["peak_held_mib"] for r in mine if "peak_held_mib" in r]
            held = (
                f"{statistics.median(helds):.0f} ({min(helds):.0f}-{max(helds):.0f})"
                if helds
                else "-"
            )
            lines.append(
                f"| {scenario} | {Path(policy).stem} | {median('samples_per_s'):.0f} "
                f"({min(rates):.0f}-{max(rates):.0f}) | {median('wait_fraction'):.0%} "
                f"| {median('mean_reward'):.2f} | {held} | {median('peak_rss_mib'):.0f} "
                f"| {', '.join(str(r['final_workers']) for r in mine)} |"
            )
    lines.append(
        f"\nMedians of {args.repeats} interleaved repeats, {args.batches} timed batches of "
        f"{BATCH} after {WARMUP}, a {STEP_S * 1000:.0f} ms sleeping step, a tick every 0.25 s"
        + (", the sample cache on." if args.cache else ".")
    )
    return "\n".join(lines) + "\n"


def per_count(args: argparse.Namespace) -> None:
    """Fixed worker counts, interleaved: what each costs per batch on this machine."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    counts = [int(n) for n in args.counts.split(",")]
    runs = []
    for repeat in range(args.repeats):
        for n in counts:
            trace = out / f"{args.scenario}-{n}-{repeat}.jsonl"
            result = spawn(f"static:{n}", args.scenario, args.batches, trace, args.step_ms / 1000)
            runs.append({**result, "workers": n, "repeat": repeat})
            print(json.dumps(runs[-1]), flush=True)
    (out / "workers.json").write_text(json.dumps(runs, indent=1))
    lines = [
        "| workers | samples/s (min-max) | loop waited | worker CPU ms/batch "
        "| training process CPU ms/batch | peak RSS MiB |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for n in counts:
        mine = [r for r in runs if r["workers"] == n]
        rates = [r["samples_per_s"] for r in mine]

        def median(key: str, rows: list[dict[str, Any]] = mine) -> float:
            return statistics.median(r[key] for r in rows)

        lines.append(
            f"| {n} | {median('samples_per_s'):.0f} ({min(rates):.0f}-{max(rates):.0f}) "
            f"| {median('wait_fraction'):.0%} | {median('workers_cpu_ms'):.1f} "
            f"| {median('main_cpu_ms'):.1f} | {median('peak_rss_mib'):.0f} |"
        )
    lines.append(
        f"\n`{args.scenario}`, medians of {args.repeats} interleaved repeats, {args.batches} "
        f"timed batches of {BATCH} after {WARMUP}, a {args.step_ms:g} ms sleeping step."
    )
    (out / "workers.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    if sys.argv[1:2] == ["one"]:
        policy, scenario, batches, trace, step_s, cache = sys.argv[2:8]
        result = one_run(
            policy, scenario, int(batches), Path(trace), float(step_s), cache == "cache"
        )
        print(json.dumps(result))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    first = commands.add_parser("collect")
    first.add_argument("--scenario", default="cpu-contention")
    first.add_argument("--runs", type=int, default=3)
    first.add_argument("--batches", type=int, default=450)
    first.add_argument("--cache", action="store_true", help="the sample cache on (cache=True)")
    first.add_argument("out")
    second = commands.add_parser("compare")
    second.add_argument("--policies", default="heuristic,rl")
    second.add_argument("--scenarios", default="cpu-contention,slow-io")
    second.add_argument("--repeats", type=int, default=3)
    second.add_argument("--batches", type=int, default=450)
    second.add_argument("--cache", action="store_true", help="the sample cache on (cache=True)")
    second.add_argument("--traces", help="keep each run's trace in this folder")
    second.add_argument("out")
    third = commands.add_parser("workers")
    third.add_argument("--counts", default="1,2,3,4,6,8")
    third.add_argument("--scenario", default="steady")
    third.add_argument("--step-ms", type=float, default=0.0)
    third.add_argument("--repeats", type=int, default=2)
    third.add_argument("--batches", type=int, default=300)
    third.add_argument("out")
    args = parser.parse_args()
    {"collect": collect, "compare": compare, "workers": per_count}[args.command](args)


if __name__ == "__main__":
    main()
