"""Trace files of simulated runs on the training families (the shipped policy and the
heuristic, the same scenario each), to mix with real traces in offline fine-tuning:

    PYTHONHASHSEED=0 python docs/results/learners/real-held/mix/simtraces.py SIM 2
    drapps train-policy --offline REAL/traces/*.jsonl SIM/*.jsonl \
        --steps 10000 --out tuned-mix.npz

(REAL: the twelve real traces of ``real-held/``, which ``docs/results/offline/measure.py
collect`` wrote; the ones used are in the history, see ``docs/results/README.md``.)

(the scenario draws are seeded by the family name's hash, hence PYTHONHASHSEED).
"""

import sys
from pathlib import Path

import numpy as np

from drapps.sim.families import draw, family_names
from drapps.sim.run import simulate
from drapps.telemetry.trace import TraceRow, TraceWriter

out, episodes = Path(sys.argv[1]), int(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
for f in family_names(held_out=False):
    for ep in range(episodes):
        rng = np.random.default_rng([1234, hash(f) % 1000, ep])
        scenario = draw(f, rng, 60.0)
        seed = int(rng.integers(2**31))
        for policy in ("rl", "heuristic"):
            run = simulate(scenario, policy, duration=60.0, interval=0.5, seed=seed)
            writer = TraceWriter(
                out / f"sim-{f}-{policy}-{ep}.jsonl", {"batch_size": scenario.pipeline.batch_size}
            )
            for tick in run.ticks:
                writer.write(
                    TraceRow(tick.state.t, tick.state, tick.action, dict(tick.applied), tick.reward)
                )
            writer.close()
print("wrote", len(list(out.glob("*.jsonl"))))
