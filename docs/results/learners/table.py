"""The learner comparison table from compare.sh's outputs: python table.py DIR."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from drapps.control.rl import MlpPolicy, shipped_path
from drapps.sim.families import family_names


def main(out: Path) -> None:
    table = json.loads((out / "eval" / "results.json").read_text())
    names = {name: Path(name).stem if name.endswith(".npz") else name for name in
             next(iter(table.values()))}  # fmt: skip
    held_out = [f for f in family_names(held_out=True) if f in table]
    training = [f for f in family_names(held_out=False) if f in table]
    policies = [n for n in names if n not in ("oracle-static", "dataloader")]
    print("| policy | held-out reward (mean) | held-out families behind the heuristic "
          "| held-out throughput vs oracle | training-family reward | training time |")  # fmt: skip
    print("|---|---:|---|---:|---:|---:|")
    for name in policies:
        rewards = [table[f][name]["reward"] for f in held_out]
        behind = [f for f in held_out if table[f][name]["reward"] < table[f]["heuristic"]["reward"]]
        relative = statistics.fmean(table[f][name]["relative"] for f in held_out)
        trained = statistics.fmean(table[f][name]["reward"] for f in training)
        seconds = "-"
        if name.endswith(".npz") or name == "rl":
            trained_s = MlpPolicy.load(shipped_path() if name == "rl" else name).meta.get("train_s")
            seconds = "-" if trained_s is None else f"{trained_s:.0f} s"
        print(
            f"| {names[name]} | {statistics.fmean(rewards):.2f} | "
            f"{', '.join(behind) if name != 'heuristic' else '-'} | {relative:.1%} | "
            f"{trained:.2f} | {seconds} |"
        )
    print("\nHeld-out reward per family:\n")
    print("| family | " + " | ".join(names[n] for n in policies) + " |")
    print("|---|" + "---:|" * len(policies))
    for family in held_out:
        best = max(table[family][n]["reward"] for n in policies)
        cells = [
            f"**{table[family][n]['reward']:.2f}**" if table[family][n]["reward"] == best
            else f"{table[family][n]['reward']:.2f}" for n in policies
        ]  # fmt: skip
        print(f"| {family} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
