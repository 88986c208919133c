"""A/B of two checkouts of drapps on the quick image bench, interleaved: A, B, A, B, ...

Each round runs ``drapps bench`` once per checkout (``PYTHONPATH`` points at its ``src``), one
repeat of the drapps systems, loader-bound (no consumer), steady; rounds alternate the order.
The comparison is the paired log-ratio per round (B over A) with a 95% t interval.

    python docs/results/engine-ab/ab.py OLD_SRC NEW_SRC --rounds 6 --out docs/results/engine-ab

(``--workload text`` for the text pipeline; ``--size default``, ``--consumer sleep --step-ms 10``
for the full-size data and a training step; a later option replaces the earlier one.)

(``OLD_SRC``/``NEW_SRC``: the ``src`` folders of two ``git worktree`` checkouts.)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def run(
    src: str, out: Path, systems: str, workload: str = "image", extra: tuple[str, ...] = ()
) -> dict[str, float]:
    """samples/s per drapps system of one bench run of the checkout at ``src``; ``extra``:
    more bench options (``--size default``, ``--consumer sleep --step-ms 10``)."""
    env = {**os.environ, "PYTHONPATH": src}
    command = [
        sys.executable, "-m", "drapps.cli", "bench", "--workload", workload,
        "--scenario", "steady", "--consumer", "none", "--systems", systems,
        "--repeats", "1", "--size", "quick", "--no-progress", "--out", str(out), *extra,
    ]  # fmt: skip
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
    runs = json.loads((out / "results.json").read_text())["runs"]
    return {r["case"]: r["samples_per_s"] for r in runs}


def interval(ratios: list[float]) -> tuple[float, float, float]:
    """Median ratio and the 95% t interval of the mean log-ratio, as ratios."""
    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    half = 0.0
    if len(logs) > 1:
        t = {2: 12.71, 3: 4.30, 4: 3.18, 5: 2.78, 6: 2.57, 7: 2.45, 8: 2.36, 9: 2.31, 10: 2.26}
        half = t.get(len(logs), 2.0) * statistics.stdev(logs) / math.sqrt(len(logs))
    return statistics.median(ratios), math.exp(mean - half), math.exp(mean + half)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--systems", default="drapps-static,drapps-heuristic")
    parser.add_argument("--workload", default="image")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--size", default="quick")
    parser.add_argument("--consumer", default="none")
    parser.add_argument("--step-ms", default=None)
    args = parser.parse_args()
    extra = ("--size", args.size, "--consumer", args.consumer)
    if args.step_ms is not None:
        extra += ("--step-ms", args.step_ms)
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(args.rounds):
            order = [("old", args.old), ("new", args.new)]
            found = {}
            for name, src in order if n % 2 == 0 else order[::-1]:
                found[name] = run(
                    src, Path(tmp) / f"{n}-{name}", args.systems, args.workload, extra
                )
            rounds.append(found)
            print(n, json.dumps(found), flush=True)
    summary = {}
    for case in rounds[0]["old"]:
        ratios = [r["new"][case] / r["old"][case] for r in rounds]
        median, low, high = interval(ratios)
        summary[case] = {
            "old_median": statistics.median(r["old"][case] for r in rounds),
            "new_median": statistics.median(r["new"][case] for r in rounds),
            "ratio_median": median,
            "ratio_95": [low, high],
            "within_noise": low <= 1.0 <= high,
        }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(
        json.dumps({"rounds": rounds, "summary": summary}, indent=1)
    )
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
