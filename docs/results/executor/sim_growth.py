"""The heuristic on every simulator family: throughput relative to the best fixed worker
count (oracle static), the mean reward per tick and the share of time the loop waited, the
mean over EPISODES 60-second episodes (the same scenarios and seeds for every checkout).

    PYTHONPATH=src .venv/bin/python docs/results/executor/sim_growth.py 6 > new.json
    PYTHONPATH=/tmp/old/src .venv/bin/python docs/results/executor/sim_growth.py 6 > old.json
"""

import json
import sys

import numpy as np

from drapps.sim.evaluate import evaluate
from drapps.sim.families import FAMILIES

episodes = int(sys.argv[1]) if len(sys.argv) > 1 else 6
result = evaluate(
    {"heuristic": "heuristic"},
    FAMILIES.names(),
    episodes=episodes,
    duration=60.0,
    baselines=("oracle-static",),
)
out = {}
for family, runs in result.runs.items():
    mine = runs["heuristic"]
    out[family] = {
        key: round(float(np.mean([r[field] for r in mine])), 3)
        for key, field in (
            ("of_oracle", "relative"),
            ("reward", "mean_reward"),
            ("waited", "wait_fraction"),
        )
    }
print(json.dumps(out, indent=1))
