"""Online fine-tuning against the fixed shipped policy on long simulated runs.

Each episode draws a scenario of a held-out family and runs it twice with the same seed: the
shipped policy as it is, and the same policy wrapped in an OnlineTuner that keeps learning
from the ticks. The runs last long enough for the tuner's whole update budget to be spent.

    python docs/results/online/measure.py --minutes 20 --episodes 3

It ran at commit 6b801cb, the last with the tuner (it measured no gain, and the tuner was
removed after); check that commit out to run it again. Output: results.md.
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np

from drapps.control import OnlineConfig, OnlineTuner
from drapps.control.rl import MlpPolicy
from drapps.sim.families import draw, family_names
from drapps.sim.run import simulate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--episodes", type=int, default=3)
    args = parser.parse_args()
    duration = 60.0 * args.minutes
    print("| family | fixed: reward / throughput | tuned: reward / throughput | tuned - fixed |")
    print("|---|---:|---:|---:|")
    gains = []
    # The tuner steps the policy's own knobs; the families with a split or offload share to
    # move are left out (the fixed policy would have the heuristic's rules move those).
    families = [f for f in family_names(held_out=True) if f not in ("device-offload", "gpu-decode")]
    for k, family in enumerate(families):
        fixed, tuned = [], []
        for episode in range(args.episodes):
            rng = np.random.default_rng([7, k, episode])
            scenario = draw(family, rng, duration)
            seed = int(rng.integers(2**31))
            fixed.append(simulate(scenario, MlpPolicy.shipped(), duration=duration, seed=seed))
            # a roomy time budget: what is measured is the learning, not the guard that
            # switches it off on a busy machine
            learner = OnlineTuner(MlpPolicy.shipped(), OnlineConfig(budget_s=0.05))
            tuned.append(simulate(scenario, learner, duration=duration, seed=seed))
        a = statistics.fmean(r.mean_reward for r in fixed)
        b = statistics.fmean(r.mean_reward for r in tuned)
        gains.append(b - a)
        print(
            f"| {family} | {a:.2f} / {statistics.fmean(r.throughput for r in fixed):.0f} "
            f"| {b:.2f} / {statistics.fmean(r.throughput for r in tuned):.0f} | {b - a:+.2f} |"
        )
    print(f"\nmean change in reward per tick: {statistics.fmean(gains):+.2f}; "
          f"{args.episodes} episodes of {args.minutes:g} simulated minutes per family")  # fmt: skip


if __name__ == "__main__":
    main()
