"""The executor knob in the simulator: policies on the held-out ``gil-switch`` family.

Each episode is one draw of the family (a pipeline whose threads win until a GIL-heavy
transform turns on mid-run); every policy meets the same draws and seeds. Throughput is given
against the best fixed setting in hindsight, over both executors: the best worker count with
worker processes or with threads, whichever made more (``oracle_static`` on each).

Policies:
  heuristic-before  the heuristic as it was before the simulator modelled the executor
                    (loaded from git: ``--before REV``)
  heuristic-held    today's heuristic, executor held where the scenario starts it
  heuristic         today's heuristic, moving the executor
  ppo               PPO trained on workers and prefetch only (executor held)
  ppo-executor      PPO trained on workers, prefetch and the executor

Run from the repository root:
    .venv/bin/python docs/results/learners/executor/compare.py --episodes 24
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from drapps.control.rl import MlpPolicy
from drapps.sim import simulate
from drapps.sim.families import draw
from drapps.sim.run import oracle_static
from drapps.sim.scenario import Scenario

HERE = Path(__file__).resolve().parent


def old_heuristic(rev: str) -> type:
    """The heuristic policy class at ``rev``, registered under another name."""
    text = subprocess.run(
        ["git", "show", f"{rev}:src/drapps/control/heuristic.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    text = text.replace('@register_policy("heuristic")', '@register_policy("heuristic-before")')
    path = Path(tempfile.mkdtemp()) / "heuristic_before.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("heuristic_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["heuristic_before"] = module
    spec.loader.exec_module(module)
    return module.HeuristicPolicy


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=24)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=100)
    parser.add_argument("--before", default="249cc653")
    args = parser.parse_args()
    before = old_heuristic(args.before)
    learned = {
        "ppo": MlpPolicy.load(HERE / "ppo-workers-prefetch.npz"),
        "ppo-executor": MlpPolicy.load(HERE / "ppo-workers-prefetch-executor.npz"),
    }
    rows: dict[str, list[float]] = {}
    waits: dict[str, list[float]] = {}
    moves: dict[str, list[int]] = {}
    episodes = []
    for episode in range(args.episodes):
        rng = np.random.default_rng([args.seed, episode])
        scenario = draw("gil-switch", rng, args.duration)
        seed = int(rng.integers(2**31))
        kw = {"duration": args.duration, "seed": seed}
        best = {
            executor: oracle_static(
                Scenario(scenario.pipeline.replace(executor=executor), scenario.changes), **kw
            ).throughput
            for executor in ("process", "thread")
        }
        runs = {
            "heuristic-before": simulate(scenario, before(), **kw),
            "heuristic-held": simulate(scenario, "heuristic", move_executor=False, **kw),
            "heuristic": simulate(scenario, "heuristic", **kw),
            "ppo": simulate(scenario, learned["ppo"], **kw),
            "ppo-executor": simulate(scenario, learned["ppo-executor"], **kw),
        }
        top = max(best.values())
        record = {
            "episode": episode,
            "cores": scenario.pipeline.cores,
            "starts_on": scenario.pipeline.executor,
            "best_fixed": {k: round(v, 1) for k, v in best.items()},
        }
        for name, run in runs.items():
            path = [int(t.applied.get("executor", 0)) for t in run.ticks]
            changes = sum(a != b for a, b in zip(path, path[1:]))
            rows.setdefault(name, []).append(run.throughput / top)
            waits.setdefault(name, []).append(run.wait_fraction)
            moves.setdefault(name, []).append(changes)
            record[name] = {"relative": round(run.throughput / top, 4), "changes": changes}
        episodes.append(record)
    lines = [
        f"gil-switch, {args.episodes} episodes of {args.duration:g} s (seed {args.seed}); "
        "throughput against the best fixed setting over both executors",
        "",
        "| policy | throughput (mean) | min | loop waited | executor changes (median) |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in rows:
        lines.append(
            f"| {name} | {statistics.fmean(rows[name]):.1%} | {min(rows[name]):.1%} | "
            f"{statistics.fmean(waits[name]):.0%} | {statistics.median(moves[name]):g} |"
        )
    table = "\n".join(lines)
    print(table)
    (HERE / "table.md").write_text(table + "\n")
    (HERE / "episodes.json").write_text(json.dumps(episodes, indent=1) + "\n")


if __name__ == "__main__":
    main()
