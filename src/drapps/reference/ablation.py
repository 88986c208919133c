"""The toolkit's ablation: the baseline, each piece alone, and all together, as fresh processes.

Each run is ``drapps train`` in its own process (so peak memory is the run's own), with the
off-switches disabled so that every piece is measured as configured. Repeats are interleaved in
a seeded shuffle; the table reports medians and each arm against the baseline.
"""

from __future__ import annotations

import json
import random
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from drapps.bench.confidence import describe_interval

# Each piece's own flags. The scheduled arm warms up to a 10x higher peak: a warmup to the
# baseline's 1e-4 would only be slower than the constant 1e-4.
ARMS: dict[str, tuple[str, ...]] = {
    "baseline": (),
    "warmup-cosine": ("--schedule", "warmup-cosine", "--lr", "1e-3"),
    "accumulate-gns": ("--accumulate", "gns"),
    "amp-bf16": ("--amp", "bf16"),
    "checkpointing": ("--checkpointing", "sqrt"),
}
ARMS["all"] = tuple(flag for name, flags in ARMS.items() if name != "baseline" for flag in flags)
# The loader as an arm: the same run fed by torch's DataLoader instead of drapps.Loader.
ARMS["loader-dataloader"] = ("--loader", "dataloader")


def run_arm(common: Sequence[str], flags: Sequence[str], timeout: float) -> dict[str, Any]:
    """One ``drapps train`` run in a fresh process; its report as a dict."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        command = [sys.executable, "-m", "drapps.cli", "train", *common, *flags]
        command += ["--no-adaptive", "--out", str(out)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
        report: dict[str, Any] = json.loads(out.read_text())
        return report


def run_ablation(
    common: Sequence[str],
    arms: Sequence[str] = tuple(ARMS),
    repeats: int = 1,
    seed: int = 0,
    timeout: float = 3600.0,
) -> dict[str, Any]:
    """Run every arm ``repeats`` times, interleaved; returns runs, medians and the environment."""
    unknown = [arm for arm in arms if arm not in ARMS]
    if unknown:
        raise ValueError(f"unknown arms {unknown}; choose from {', '.join(ARMS)}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats!r}")
    from drapps.bench.environment import describe_environment

    order = [arm for _ in range(repeats) for arm in arms]
    random.Random(seed).shuffle(order)
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
    for i, arm in enumerate(order, 1):
        print(f"[{i}/{len(order)}] {arm}", file=sys.stderr, flush=True)
        runs[arm].append(run_arm(common, ARMS[arm], timeout))
    return {
        "common": list(common),
        "arms": {arm: list(ARMS[arm]) for arm in arms},
        "repeats": repeats,
        "environment": describe_environment(),
        "runs": runs,
        "medians": {arm: _medians(reports) for arm, reports in runs.items()},
    }


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    # A target missed in any repeat makes the median time unknown, not optimistic.
    return statistics.median(present) if present and len(present) == len(values) else None


def _medians(reports: list[dict[str, Any]]) -> dict[str, float | None]:
    keys = (
        "time_to_target",
        "throughput",
        "peak_memory_bytes",
        "activation_bytes",
        "final_quality",
        "train_seconds",
        "final_k",
    )
    return {key: _median([r[key] for r in reports]) for key in keys}


def markdown(results: dict[str, Any]) -> str:
    """The ablation table: medians, each arm relative to the baseline, and the 95% t interval
    of the mean time to target and throughput (two arms whose intervals overlap are not shown
    to differ)."""
    medians = results["medians"]
    first = next(iter(results["runs"].values()))[0]
    unit, quality = first["items_unit"], first["quality_name"]
    target = first["settings"].get("target")
    base = medians.get("baseline", {})
    lines = [
        f"`drapps train {' '.join(results['common'])}`, {results['repeats']} interleaved "
        f"repeat(s), medians; off-switches disabled.",
        "",
        f"| arm | time to {quality} {target} (s) | 95% CI of the mean | throughput ({unit}/s) "
        f"| 95% CI of the mean | train time (s) | activations / micro-batch (MiB) "
        f"| peak memory (MiB) | final {quality} | final k |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for arm, m in medians.items():
        runs = results["runs"][arm]
        lines.append(
            f"| {arm} "
            f"| {_cell(m['time_to_target'], base.get('time_to_target'), '.1f', 'not reached')} "
            f"| {describe_interval([r['time_to_target'] for r in runs], '.1f')} "
            f"| {_cell(m['throughput'], base.get('throughput'), ',.0f')} "
            f"| {describe_interval([r['throughput'] for r in runs], ',.0f')} "
            f"| {_fmt(m['train_seconds'], '.1f')} "
            f"| {_cell(_mib(m['activation_bytes']), _mib(base.get('activation_bytes')), '.1f')} "
            f"| {_fmt(_mib(m['peak_memory_bytes']), ',.0f')} "
            f"| {_fmt(m['final_quality'], '.2f')} | {_fmt(m['final_k'], '.0f')} |"
        )
    env = results["environment"]
    lines += ["", f"Environment: {json.dumps(env)}"]
    return "\n".join(lines) + "\n"


def _mib(value: float | None) -> float | None:
    return None if value is None else value / 2**20


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _cell(value: float | None, base: float | None, spec: str, missing: str = "-") -> str:
    if value is None:
        return missing
    if base:
        return f"{format(value, spec)} ({value / base:.2f}x)"
    return format(value, spec)
