"""Policies against each other on simulated scenario families.

Every policy meets the same scenarios (same seeds). Besides the policies given, two baselines:
``oracle-static``, the best fixed worker count found by trying them all in hindsight, and
``dataloader``, ``torch.utils.data.DataLoader``'s default (``num_workers=0``: batches made in
the training loop). Throughput is reported relative to the oracle, per episode, then averaged.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from drapps.control.policy import Policy
from drapps.control.reward import RewardWeights
from drapps.sim.families import draw
from drapps.sim.run import SimRun, oracle_static, simulate

BASELINES = ("oracle-static", "dataloader")


@dataclass
class Evaluation:
    """Per family and policy, the runs' summaries."""

    runs: dict[str, dict[str, list[dict[str, Any]]]] = field(default_factory=dict)
    """family -> policy -> one summary per episode (``SimRun.summary()`` plus ``relative``)."""

    def table(self) -> dict[str, dict[str, dict[str, float]]]:
        """family -> policy -> mean relative throughput, wait, reward and convergence."""
        out: dict[str, dict[str, dict[str, float]]] = {}
        for family, policies in self.runs.items():
            out[family] = {}
            for name, runs in policies.items():
                converged = [r["convergence_s"] for r in runs if r["convergence_s"] is not None]
                out[family][name] = {
                    "relative": statistics.fmean(r["relative"] for r in runs),
                    "wait": statistics.fmean(r["wait_fraction"] for r in runs),
                    "reward": statistics.fmean(r["mean_reward"] for r in runs),
                    "convergence_s": statistics.median(converged) if converged else float("nan"),
                }
        return out

    def markdown(self) -> str:
        """One table: a row per family, a column group per policy."""
        table = self.table()
        names = list(next(iter(table.values())).keys()) if table else []
        lines = [
            "| family | " + " | ".join(names) + " |",
            "|---|" + "---:|" * len(names),
        ]
        for family, policies in table.items():
            cells = [
                f"{p['relative']:.1%} / {p['wait']:.0%} / {p['reward']:.2f} / "
                f"{p['convergence_s']:.1f} s"
                for p in policies.values()
            ]
            lines.append(f"| {family} | " + " | ".join(cells) + " |")
        lines.append(
            "\nEach cell: throughput relative to oracle-static (mean over episodes) / share of "
            "time the training loop waited / mean reward per tick (the shared reward: it also "
            "charges memory) / median seconds to settle after a change."
        )
        return "\n".join(lines)


def evaluate(
    policies: Mapping[str, Policy | str],
    families: Sequence[str],
    *,
    episodes: int = 10,
    duration: float = 60.0,
    interval: float = 0.5,
    seed: int = 0,
    baselines: Sequence[str] = BASELINES,
    weights: RewardWeights | None = None,
) -> Evaluation:
    """Run every policy (fresh per episode when given by name) on ``episodes`` scenarios of
    each family, seeded by ``seed``, scored by the reward with ``weights`` (default: the
    shared reward's)."""
    for name in baselines:
        if name not in BASELINES:
            raise ValueError(f"baselines must be among {BASELINES}, got {name!r}")
    result = Evaluation()
    for f_index, family in enumerate(families):
        per_policy: dict[str, list[dict[str, Any]]] = {}
        for episode in range(episodes):
            rng = np.random.default_rng([seed, f_index, episode])
            scenario = draw(family, rng, duration)
            run_seed = int(rng.integers(2**31))
            runs: dict[str, SimRun] = {}
            oracle = oracle_static(
                scenario, duration=duration, interval=interval, seed=run_seed, weights=weights
            )
            if "oracle-static" in baselines:
                runs["oracle-static"] = oracle
            if "dataloader" in baselines:
                runs["dataloader"] = simulate(
                    scenario,
                    duration=duration,
                    interval=interval,
                    seed=run_seed,
                    workers=0,
                    weights=weights,
                )
            for name, policy in policies.items():
                runs[name] = simulate(
                    scenario,
                    policy,
                    duration=duration,
                    interval=interval,
                    seed=run_seed,
                    weights=weights,
                )
            for name, run in runs.items():
                summary = run.summary()
                summary["relative"] = run.throughput / max(oracle.throughput, 1e-9)
                per_policy.setdefault(name, []).append(summary)
        result.runs[family] = per_policy
    return result
