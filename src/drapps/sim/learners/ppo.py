"""PPO from stable-baselines3: the default learner.

The actor is the shipped policy's shape (tanh MLP, 64x64 by default); the deterministic policy
(the highest logit) is what is exported and shipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from drapps._optional import require
from drapps.control.rl import MlpPolicy
from drapps.sim.env import PipelineEnv
from drapps.sim.learners._base import Learner, export_mlp, learn_quietly, register_learner


@dataclass(frozen=True)
class PpoConfig:
    """Hyperparameters handed to ``stable_baselines3.PPO``."""

    hidden: tuple[int, ...] = (64, 64)
    """Hidden layer widths of the actor and of the critic."""
    gamma: float = 0.95
    """Discount per controller tick."""
    lr: float = 3e-4
    n_steps: int = 1024
    """Steps collected per update."""
    batch: int = 128
    epochs: int = 10
    ent_coef: float = 0.01
    """Entropy bonus (keeps exploring the 9 actions)."""


@register_learner("ppo")
class Ppo(Learner):
    """Proximal policy optimisation (stable-baselines3)."""

    def __init__(self, config: PpoConfig | None = None) -> None:
        self.config = config or PpoConfig()
        self.model: Any = None
        """The stable-baselines3 model of the last training run."""

    def train(self, env: PipelineEnv, steps: int, seed: int) -> MlpPolicy:
        sb3 = require("stable_baselines3")
        c = self.config
        model = sb3.PPO(
            "MlpPolicy",
            env,
            learning_rate=c.lr,
            n_steps=min(c.n_steps, max(steps, 64)),
            batch_size=c.batch,
            n_epochs=c.epochs,
            gamma=c.gamma,
            ent_coef=c.ent_coef,
            policy_kwargs={
                "net_arch": {"pi": list(c.hidden), "vf": list(c.hidden)},
                "activation_fn": nn.Tanh,
            },
            seed=seed,
            device="cpu",
            verbose=0,
        )
        learn_quietly(model, steps)
        self.model = model
        actor = [m for m in model.policy.mlp_extractor.policy_net if isinstance(m, nn.Linear)]
        return export_mlp(
            [*actor, model.policy.action_net],
            {"learner": "ppo", "steps": steps, "seed": seed},
            env.knobs,
        )
