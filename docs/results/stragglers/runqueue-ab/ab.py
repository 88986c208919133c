"""A/B of two checkouts on the loader-bound ``stragglers`` bench, interleaved A, B, B, A, ...

Each round runs ``drapps bench --workload stragglers --consumer none`` once per checkout
(``PYTHONPATH`` points at its ``src``) with ``drapps-static`` at the given worker counts, one
repeat of at least 15 s; rounds alternate the order. Prints per round and case samples/s and
next() p99, and the median ratio B over A:

    python docs/results/stragglers/runqueue-ab/ab.py OLD_SRC NEW_SRC --rounds 4 --workers 4,6
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def run(src: str, out: Path, workers: str) -> dict[str, tuple[float, float]]:
    env = {**os.environ, "PYTHONPATH": src}
    command = [
        sys.executable, "-m", "drapps.cli", "bench", "--workload", "stragglers",
        "--scenario", "steady", "--consumer", "none", "--systems", "drapps-static",
        "--static-workers", workers, "--repeats", "1", "--seconds", "15", "--no-progress",
        "--out", str(out),
    ]  # fmt: skip
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
    runs = json.loads((out / "results.json").read_text())["runs"]
    return {r["case"]: (r["samples_per_s"], r["wait_p99_ms"]) for r in runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--workers", default="4,6")
    args = parser.parse_args()
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as scratch:
        for k in range(args.rounds):
            order = ("a", "b") if k % 2 == 0 else ("b", "a")
            for side in order:
                got = run(getattr(args, side), Path(scratch) / f"{k}{side}", args.workers)
                for case, (rate, p99) in got.items():
                    rows.append({"round": k, "side": side, "case": case, "rate": rate, "p99": p99})
                    print(json.dumps(rows[-1]), flush=True)
    for case in sorted({str(r["case"]) for r in rows}):
        for key in ("rate", "p99"):
            ratios = []
            for k in range(args.rounds):
                pair = {r["side"]: r[key] for r in rows if r["case"] == case and r["round"] == k}
                ratios.append(float(pair["b"]) / float(pair["a"]))  # type: ignore[arg-type]
            print(f"{case} {key}: B/A median {statistics.median(ratios):.2f} "
                  f"(rounds {', '.join(f'{x:.2f}' for x in ratios)})")  # fmt: skip


if __name__ == "__main__":
    main()
