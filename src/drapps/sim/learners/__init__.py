"""Learners that train a policy in the simulator (extra ``rl``): PPO (default), SAC and
DDQN+PER."""

from drapps.sim.learners import ddqn, ppo, sac
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
    "sac",
]
