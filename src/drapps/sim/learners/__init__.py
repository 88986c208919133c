"""Learners that train a policy in the simulator (extra ``rl``): PPO (default) and DDQN+PER."""

from drapps.sim.learners import ddqn, ppo
from drapps.sim.learners._base import (
    LEARNERS,
    Learner,
    export_mlp,
    learner_names,
    make_learner,
)

__all__ = ["LEARNERS", "Learner", "ddqn", "export_mlp", "learner_names", "make_learner", "ppo"]
