"""Learners that train a policy in the simulator (extra ``rl``): PPO (default), SAC,
DDQN+PER and rollout policy iteration."""

from drapps.sim.learners import ddqn, ppo, rollout, sac
from drapps.sim.learners._base import (
    LEARNERS,
    Learner,
    export_mlp,
    learner_names,
    make_learner,
)

__all__ = [
    "LEARNERS",
    "Learner",
    "ddqn",
    "export_mlp",
    "learner_names",
    "make_learner",
    "ppo",
    "rollout",
    "sac",
]
