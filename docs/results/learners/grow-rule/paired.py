"""The shipped policy with and without the growth rule, and the heuristic, on the same
scenarios of one family: python paired.py FAMILY EPISODES [SEED].

Prints each one's mean reward per tick and the paired differences with their standard
errors (one difference per scenario). "Without the rule" patches
``drapps.control.rl.may_grow`` to allow every growth.
"""

from __future__ import annotations

import sys

import numpy as np

import drapps.control.rl as rl
from drapps.sim.evaluate import evaluate


def rewards(policy: str, family: str, episodes: int, seed: int) -> np.ndarray:
    run = evaluate({policy: policy}, [family], episodes=episodes, seed=seed, baselines=())
    return np.array([summary["mean_reward"] for summary in run.runs[family][policy]])


def main(family: str, episodes: int, seed: int = 0) -> None:
    heuristic = rewards("heuristic", family, episodes, seed)
    ruled = rewards("rl", family, episodes, seed)
    rule = rl.may_grow
    rl.may_grow = lambda state: True
    try:
        free = rewards("rl", family, episodes, seed)
    finally:
        rl.may_grow = rule

    def paired(a: np.ndarray, b: np.ndarray) -> str:
        d = a - b
        return f"{d.mean():+.4f} (standard error {d.std(ddof=1) / np.sqrt(len(d)):.4f})"

    print(f"{family}, {episodes} scenarios, seed {seed}: mean reward per tick")
    print(f"  heuristic {heuristic.mean():.4f}, rl {ruled.mean():.4f}, rl without the rule {free.mean():.4f}")
    print(f"  rl - heuristic: {paired(ruled, heuristic)}")
    print(f"  rl without the rule - heuristic: {paired(free, heuristic)}")
    print(f"  rl - rl without the rule: {paired(ruled, free)}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), *(int(a) for a in sys.argv[3:4]))
