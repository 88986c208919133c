"""The heuristic and the shipped policy on the families whose batches are cut into parts, with
the simulator's hedged copies and without: python evaluate.py {on,off}.

4 seeded episodes of 60 s of ``stragglers`` and ``slow-reads`` (``drapps.sim.evaluate``, seed
0); ``off`` makes every Simulator with ``hedge=False`` (``simulate`` has no such argument).
Prints each family's table (relative throughput, wait, mean reward, convergence) and the
copies each policy's runs sent.
"""

from __future__ import annotations

import functools
import json
import sys

import drapps.sim.engine as engine
from drapps.sim.evaluate import evaluate


def main(mode: str) -> None:
    if mode not in ("on", "off"):
        raise SystemExit(f"usage: python evaluate.py {{on,off}}, got {mode!r}")
    if mode == "off":
        engine.Simulator.__init__ = functools.partialmethod(  # type: ignore[method-assign]
            engine.Simulator.__init__, hedge=False
        )
    result = evaluate({"heuristic": "heuristic", "rl": "rl"}, ["stragglers", "slow-reads"],
                      episodes=4, seed=0)  # fmt: skip
    copies = {
        family: {name: sum(run["hedges"] for run in runs) for name, runs in policies.items()}
        for family, policies in result.runs.items()
    }
    print(json.dumps({"hedging": mode, "table": result.table(), "hedges": copies}, indent=1))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "")
