"""Train PPO (or ``--learner ddqn``) with a training reward whose footprint weight is FOOTPRINT,
then compare it with the heuristic and the shipped policy on the held-out families under that
reward.

    python docs/results/learners/footprint/train.py FOOTPRINT OUT.npz [--idle W] [--steps N]
        [--episodes E] [--n-steps N] [--batch B] [--ent C] [--learner ddqn]

``--idle W`` adds the reward's idle-worker term at weight W (training and scoring both);
``--n-steps``, ``--batch`` and ``--ent`` set PPO's rollout length, minibatch and entropy bonus.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from drapps.control.reward import RewardWeights
from drapps.control.rl import MlpPolicy
from drapps.sim.env import PipelineEnv
from drapps.sim.evaluate import evaluate
from drapps.sim.families import family_names
from drapps.sim.learners._base import make_learner
from drapps.sim.learners.ppo import Ppo, PpoConfig


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("footprint", type=float)
    parser.add_argument("--idle", type=float, default=0.0)
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=150_000)
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n-steps", type=int, default=PpoConfig.n_steps)
    parser.add_argument("--batch", type=int, default=PpoConfig.batch)
    parser.add_argument("--ent", type=float, default=PpoConfig.ent_coef)
    parser.add_argument("--learner", default="ppo", help="ppo (with the options above) or ddqn")
    args = parser.parse_args()
    torch.set_num_threads(1)
    families = family_names(held_out=False)
    weights = RewardWeights(footprint=args.footprint, idle=args.idle)
    env = PipelineEnv(families, weights=weights)
    began = time.perf_counter()
    config = PpoConfig(n_steps=args.n_steps, batch=args.batch, ent_coef=args.ent)
    learner = Ppo(config) if args.learner == "ppo" else make_learner(args.learner)
    policy = learner.train(env, args.steps, args.seed)
    policy.meta.update(
        {
            "families": families,
            "train_s": round(time.perf_counter() - began, 1),
            "train_footprint": args.footprint,
            "train_idle": args.idle,
            "learner": args.learner,
        }
    )
    if args.learner == "ppo":
        policy.meta["ppo"] = {
            "n_steps": config.n_steps,
            "batch": config.batch,
            "ent_coef": config.ent_coef,
        }
    policy.save(args.out)
    print(f"trained in {policy.meta['train_s']} s; wrote {args.out}", flush=True)
    result = evaluate(
        {"heuristic": "heuristic", "rl": MlpPolicy.shipped(), "new": policy},
        family_names(held_out=True),
        episodes=args.episodes,
        seed=args.seed,
        weights=weights,
    )
    print(result.markdown())
    table = result.table()
    for name in ("heuristic", "rl", "new"):
        print(
            name,
            "mean reward",
            round(statistics.fmean(t[name]["reward"] for t in table.values()), 3),
            "relative",
            round(statistics.fmean(t[name]["relative"] for t in table.values()), 4),
        )
    with open(args.out.replace(".npz", ".json"), "w") as fh:
        json.dump(table, fh, indent=1)


if __name__ == "__main__":
    main()
