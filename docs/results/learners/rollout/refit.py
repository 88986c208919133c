"""Fit a policy again to labels ``train.py --labels`` wrote, at another temperature.

    python docs/results/learners/rollout/refit.py LABELS.npz OUT.npz --temperature T
        [--evaluate N] [--seed S]

The same fit as the learner's (``drapps.sim.learners.rollout.fit``); ``--evaluate N`` scores it
with the heuristic and the shipped policy on N scenarios of every held-out family.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from torch import nn
from train import report  # beside this script

from drapps.control.rl import KNOBS
from drapps.sim.learners._base import export_mlp
from drapps.sim.learners.rollout import Labels, RolloutConfig, fit, regret


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("labels")
    parser.add_argument("out")
    parser.add_argument("--temperature", type=float, required=True)
    parser.add_argument("--evaluate", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = np.load(args.labels)
    labels = Labels(data["features"], data["returns"], data["own"], data["prior"])
    net = fit(labels, RolloutConfig(temperature=args.temperature), args.seed)
    policy = export_mlp([m for m in net if isinstance(m, nn.Linear)], {}, KNOBS)
    policy.meta.update({"learner": "rollout", "temperature": args.temperature})
    scores = policy.scores(labels.features)
    changed = float(np.mean(scores.argmax(axis=1) != labels.own))
    print(
        f"temperature {args.temperature}: return given up per State "
        f"{regret(scores, labels.returns):.3f}"
        f" (the followed policy's own choices: "
        f"{regret(np.eye(labels.returns.shape[1])[labels.own], labels.returns):.3f}); "
        f"{changed:.0%} of its choices changed"
    )
    policy.save(args.out)
    if args.evaluate > 0:
        report(policy, args.evaluate, args.seed, args.out)


if __name__ == "__main__":
    main()
