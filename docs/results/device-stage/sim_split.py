"""The heuristic moving the split against the same heuristic with the split held, in the
simulator, on 20 scenarios drawn from the ``device-offload`` family (60 simulated s each).

Run: python docs/results/device-stage/sim_split.py
"""

import statistics

import numpy as np

from drapps.sim import simulate
from drapps.sim.families import draw

ratios, moved = [], 0
for seed in range(20):
    scenario = draw("device-offload", np.random.default_rng(seed), 60.0)
    free = simulate(scenario, "heuristic", duration=60.0, seed=seed)
    held = simulate(scenario, "heuristic", duration=60.0, seed=seed, move_split=False)
    ratios.append(free.throughput / held.throughput)
    moved += free.summary()["final_split"] < len(scenario.pipeline.device_ops)
print(
    f"throughput, split moved / held: median {statistics.median(ratios):.2f}x, "
    f"min {min(ratios):.2f}x, max {max(ratios):.2f}x; the split moved in {moved} of 20"
)
