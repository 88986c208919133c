"""The live offload share against fixed shares, in the simulator, on 20 scenarios drawn from the
held-out ``gpu-decode`` family (60 simulated s each; the split held at 0, the decode; the
workers moved by the heuristic in every run).

For each scenario: the heuristic moving the share from 0.5, the same heuristic with the share
held at each of 0, 1/4, 1/2, 3/4 and 1 (the best of them in hindsight is "best fixed"), and
an upper bound for any live share: per 10-s window, the best fixed share's throughput there.

Run: python docs/results/gpu-offload/sim_offload.py
"""

import statistics

import numpy as np

from drapps.sim import simulate
from drapps.sim.families import draw
from drapps.sim.scenario import Scenario

SHARES = (0.0, 0.25, 0.5, 0.75, 1.0)
live_best, live_start, bound_best = [], [], []
for seed in range(20):
    scenario = draw("gpu-decode", np.random.default_rng(seed), 60.0)
    live = simulate(scenario, "heuristic", duration=60.0, seed=seed, move_split=False)
    fixed = {}
    for share in SHARES:
        held = Scenario(scenario.pipeline.replace(offload=share), scenario.changes, scenario.name)
        fixed[share] = simulate(
            held, "heuristic", duration=60.0, seed=seed, move_split=False, move_offload=False
        )
    best = max(run.throughput for run in fixed.values())
    per_tick = {share: [t.state.throughput for t in run.ticks] for share, run in fixed.items()}
    windows = range(0, len(per_tick[0.0]), 20)
    bound = statistics.fmean(
        max(statistics.fmean(ticks[i : i + 20]) for ticks in per_tick.values()) for i in windows
    )
    live_best.append(live.throughput / best)
    live_start.append(live.throughput / fixed[0.5].throughput)
    bound_best.append(bound / best)


def spread(values: list[float]) -> str:
    return f"median {statistics.median(values):.2f}x (min {min(values):.2f}, max {max(values):.2f})"


print(f"live share / best fixed share (hindsight): {spread(live_best)}")
print(f"live share / the start share (0.5) held:   {spread(live_start)}")
print(f"best share per 10-s window / best fixed:   {spread(bound_best)}")
