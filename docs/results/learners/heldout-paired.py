"""The shipped policy against the heuristic on the same scenarios of each held-out family,
with the paired difference's standard error: python heldout-paired.py EPISODES [FAMILY...].

Each family is drawn alone (``evaluate(..., [family])``), so its scenarios do not depend on
which other families run, and the families can be split between processes.
"""

from __future__ import annotations

import sys

import numpy as np

from drapps.sim.evaluate import evaluate
from drapps.sim.families import family_names


def rewards(policy: str, family: str, episodes: int) -> np.ndarray:
    run = evaluate({policy: policy}, [family], episodes=episodes, seed=0, baselines=())
    return np.array([summary["mean_reward"] for summary in run.runs[family][policy]])


def main(episodes: int, families: list[str]) -> None:
    print(f"{episodes} scenarios per family, seed 0: mean reward per tick")
    print("| family | heuristic | rl | rl - heuristic | standard error |")
    print("|---|---:|---:|---:|---:|")
    for family in families or family_names(held_out=True):
        heuristic, learned = rewards("heuristic", family, episodes), rewards("rl", family, episodes)
        d = learned - heuristic
        se = d.std(ddof=1) / np.sqrt(len(d))
        means = f"{heuristic.mean():.4f} | {learned.mean():.4f}"
        print(f"| {family} | {means} | {d.mean():+.4f} | {se:.4f} |", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2:])
