"""Time the simulator: environment steps per second on one scenario family.

    python speed.py [--family stragglers] [--rounds 7] [--out speed.json] [SRC ...]

Each round runs ``EPISODES`` episodes of ``--family`` (the same draws every round, seeded),
``DURATION`` simulated seconds each, through ``PipelineEnv`` holding every knob (the
no-op action): a step is the simulator advancing 0.5 s, observing its State, the Controller
clipping the action and the reward, as in training. Given source trees (``SRC``, each a
folder holding the ``drapps`` package), rounds alternate between them, each in a fresh
process, after one warm-up round each; it prints the median and the range of steps per
second of CPU time per tree and writes them, with the commit and the machine, as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

EPISODES, DURATION = 8, 60.0


def one_round(family: str) -> float:
    """Steps per second of this process's CPU time over one round (CPU time, not the wall:
    on a shared machine the wall counts other processes' turns)."""
    from drapps.control.action import NOOP
    from drapps.sim.env import PipelineEnv

    env = PipelineEnv([family], duration=DURATION, random_start=False)
    steps, spent = 0, 0.0
    for episode in range(EPISODES):
        began = time.process_time()
        env.reset(seed=episode)
        done = False
        while not done:
            _, _, _, done, _ = env.apply(NOOP)
            steps += 1
        spent += time.process_time() - began
    return steps / spent


def in_tree(src: str, family: str) -> float:
    env = {**os.environ, "PYTHONPATH": src, "OMP_NUM_THREADS": "1"}
    code = f"import speed; print(speed.one_round({family!r}))"
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {here!r}); {code}"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="stragglers")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out")
    parser.add_argument("src", nargs="*", help="source trees to compare (default: this one)")
    args = parser.parse_args()
    trees = args.src or [os.path.join(os.path.dirname(__file__), "..", "..", "..", "src")]
    rates: dict[str, list[float]] = {tree: [] for tree in trees}
    for tree in trees:
        in_tree(tree, args.family)  # warm-up: imports, caches
    for _ in range(args.rounds):
        for tree in trees:
            rates[tree].append(in_tree(tree, args.family))
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    result = {
        "family": args.family,
        "episodes": EPISODES,
        "duration_s": DURATION,
        "checkout": commit,  # the commit checked out where it ran, not the trees'
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cpus",
        "python": platform.python_version(),
        "steps_per_s": {
            tree: {"median": statistics.median(r), "min": min(r), "max": max(r), "rounds": r}
            for tree, r in rates.items()
        },
    }
    for tree, r in rates.items():
        print(f"{tree}: {statistics.median(r):,.0f} steps/s ({min(r):,.0f}-{max(r):,.0f})")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
