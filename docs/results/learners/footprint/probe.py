"""Does shedding pay in the simulator, and what does a policy do there?

    python docs/results/learners/footprint/probe.py [POLICY.npz ...]

For two draws each of ``cached-epochs`` and ``consumer-shift`` (seeds 101 and 103): first the
mean reward per tick over the last 45 s when the pool, started at one worker per core, sheds a
worker a tick from t=15 s down to each target count (static prefetch of 2 per worker), under
idle weights 0, 0.5 and 1; then, for each policy given, the softmax of its scores summed by
worker move (-1, 0, +1, over the other knobs' moves) at t=15, 30 and 45 s of its own run: a
PPO policy's odds; a DDQN policy's scores are Q-values, of which it takes the largest, so for
it only the workers it ends at say what it does.
"""

from __future__ import annotations

import statistics
import sys
from typing import Any

import numpy as np

from drapps.control.controller import Tick
from drapps.control.policy import Policy
from drapps.control.reward import RewardWeights, reward
from drapps.control.rl import MlpPolicy
from drapps.control.state import State
from drapps.sim import Scenario, simulate
from drapps.sim.families import draw

DRAWS = (("cached-epochs", 1), ("cached-epochs", 3), ("consumer-shift", 1), ("consumer-shift", 3))
TICKS, SHED_AT = 120, 30


def _states(scenario: Scenario, policy: Policy | str, seed: int, **options: Any) -> list[State]:
    """The State of every tick of ``policy``'s run."""
    states: list[State] = []

    def keep(tick: Tick) -> None:
        states.append(tick.state)

    simulate(scenario, policy, seed=seed, on_tick=keep, **options)
    return states


def shed_rewards() -> None:
    for family, seed in DRAWS:
        scenario = draw(family, np.random.default_rng(100 + seed), 60.0)
        start = min(scenario.pipeline.cores, scenario.pipeline.worker_limit)
        for idle in (0.0, 0.5, 1.0):
            weights = RewardWeights(idle=idle)
            cells = []
            for target in range(1, start + 1):
                schedule, workers = [], start
                for tick in range(TICKS):
                    if tick >= SHED_AT and workers > target:
                        workers -= 1
                    schedule.append((workers, 2 * workers))
                states = _states(
                    scenario, "static", seed, workers=start, schedule=schedule, weights=weights
                )
                mean = statistics.fmean(reward(s, weights) for s in states[SHED_AT:])
                cells.append(f"{target}: {mean:.2f}")
            print(f"{family} draw {seed}, {start} cores, idle={idle:g}:  " + "  ".join(cells))


def worker_odds(path: str) -> None:
    policy = MlpPolicy.load(path)
    for family, seed in DRAWS:
        scenario = draw(family, np.random.default_rng(100 + seed), 60.0)
        states = _states(scenario, policy, seed)
        for state in states[SHED_AT::SHED_AT]:
            scores = policy.scores(state.vector(features=policy.features))
            odds = np.exp(scores - scores.max())
            odds /= odds.sum()
            moves = {-1: 0.0, 0: 0.0, 1: 0.0}
            for action, p in zip(policy.actions, odds, strict=True):
                moves[action.workers] += float(p)
            print(
                f"{path} {family} draw {seed} t={state.t:.0f}s: {state.workers} workers, "
                f"busy {state.busy_share:.2f}, waited {state.wait_fraction:.0%}; "
                f"shed {moves[-1]:.2f} hold {moves[0]:.2f} grow {moves[1]:.2f}"
            )


if __name__ == "__main__":
    shed_rewards()
    for name in sys.argv[1:]:
        worker_odds(name)
