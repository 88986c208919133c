"""Rollout policy iteration with chosen settings, then the held-out families.

    python docs/results/learners/rollout/train.py OUT.npz [--start heuristic|POLICY.npz]
        [--rounds R] [--episodes E] [--temperature T] [--horizon H] [--seed S]
        [--evaluate N] [--labels LABELS.npz] [--reward NAME=W,...]

``--episodes`` is per round; ``--evaluate N`` scores the result, the heuristic and the shipped
policy on N scenarios of every held-out family (0: not at all) and writes the table beside
OUT as ``.json``. ``--reward`` sets reward weights for the training, as ``drapps train-policy
--reward`` does.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from dataclasses import asdict

import numpy as np
import torch

from drapps.cli._args import reward_weights
from drapps.control.reward import RewardWeights
from drapps.control.rl import MlpPolicy
from drapps.sim.env import PipelineEnv
from drapps.sim.evaluate import evaluate
from drapps.sim.families import family_names
from drapps.sim.learners.rollout import RolloutConfig, RolloutPolicyIteration, episode_steps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--start", default="heuristic")
    parser.add_argument("--rounds", type=int, default=RolloutConfig.iterations)
    parser.add_argument("--episodes", type=int, default=300)
    parser.add_argument("--temperature", type=float, default=RolloutConfig.temperature)
    parser.add_argument("--horizon", type=int, default=RolloutConfig.horizon)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--evaluate", type=int, default=32)
    parser.add_argument("--labels", help="write the labelled States here (.npz), to fit again")
    parser.add_argument("--reward", type=reward_weights, default=RewardWeights())
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(1)
    config = RolloutConfig(
        start=args.start,
        iterations=args.rounds,
        temperature=args.temperature,
        horizon=args.horizon,
    )
    env = PipelineEnv(family_names(held_out=False), weights=args.reward)
    per_episode = episode_steps(env, config)
    began = time.perf_counter()
    learner = RolloutPolicyIteration(config)
    policy = learner.train(env, args.rounds * args.episodes * per_episode, args.seed)
    if args.labels and learner.labels is not None:
        labels = learner.labels
        prior = labels.scores(config.keep)
        np.savez(args.labels, features=labels.features, returns=labels.returns,
                 own=labels.own, prior=prior)  # fmt: skip
    policy.meta.update(
        {
            "families": family_names(held_out=False),
            "train_s": round(time.perf_counter() - began, 1),
            "temperature": args.temperature,
            "reward": asdict(args.reward),
        }
    )
    policy.save(args.out)
    print(f"trained in {policy.meta['train_s']} s; wrote {args.out}", flush=True)
    if args.evaluate > 0:
        report(policy, args.evaluate, args.seed, args.out)


def report(policy: MlpPolicy, episodes: int, seed: int, out: str) -> None:
    """Score ``policy``, the heuristic and the shipped policy on ``episodes`` scenarios of
    every held-out family; print the table and a line per policy, and write the table beside
    ``out`` as ``.json``."""
    result = evaluate(
        {"heuristic": "heuristic", "rl": MlpPolicy.shipped(), "new": policy},
        family_names(held_out=True),
        episodes=episodes,
        seed=seed,
    )
    print(result.markdown())
    table = result.table()
    for name in ("heuristic", "rl", "new"):
        behind = [f for f in table if table[f][name]["reward"] < table[f]["heuristic"]["reward"]]
        mean = statistics.fmean(t[name]["reward"] for t in table.values())
        relative = statistics.fmean(t[name]["relative"] for t in table.values())
        print(
            f"{name}: mean reward {mean:.3f}, throughput {relative:.1%} of the oracle, "
            f"behind the heuristic on {behind or 'none'}"
        )
    with open(out.removesuffix(".npz") + ".json", "w") as fh:
        json.dump(table, fh, indent=1)


if __name__ == "__main__":
    main()
