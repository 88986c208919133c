"""SAC from stable-baselines3: soft actor-critic over continuous actions, one per knob.

The environment runs with ``continuous=True``: each knob gets one output in [-1, 1]. A step
knob (workers, prefetch, split) is thresholded into a step; the offload share is set to the
value the output maps to, so SAC moves it in one tick where a discrete policy takes four steps.
The actor (tanh MLP, the shipped policy's shape) and its mean output are exported; the policy
runs deterministic, ``tanh(mean)``, with NumPy.
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
class SacConfig:
    """Hyperparameters handed to ``stable_baselines3.SAC``."""

    hidden: tuple[int, ...] = (64, 64)
    """Hidden layer widths of the actor and of each critic."""
    gamma: float = 0.95
    """Discount per controller tick."""
    lr: float = 3e-4
    buffer: int = 100_000
    """Transitions kept for replay."""
    batch: int = 256
    warmup: int = 1_000
    """Steps of random actions before learning starts."""
    train_every: int = 2
    """Environment steps between gradient steps: one per two halves SAC's cost, and a
    controller tick's transitions are strongly correlated anyway."""


@register_learner("sac")
class Sac(Learner):
    """Soft actor-critic (stable-baselines3), continuous actions."""

    continuous = True

    def __init__(self, config: SacConfig | None = None) -> None:
        self.config = config or SacConfig()
        self.model: Any = None
        """The stable-baselines3 model of the last training run."""

    def train(self, env: PipelineEnv, steps: int, seed: int) -> MlpPolicy:
        sb3 = require("stable_baselines3")
        if not env.continuous:
            raise ValueError("SAC needs a PipelineEnv(continuous=True)")
        c = self.config
        model = sb3.SAC(
            "MlpPolicy",
            env,
            learning_rate=c.lr,
            buffer_size=c.buffer,
            batch_size=c.batch,
            learning_starts=min(c.warmup, max(1, steps // 10)),
            train_freq=c.train_every,
            gradient_steps=1,
            gamma=c.gamma,
            policy_kwargs={
                "net_arch": {"pi": list(c.hidden), "qf": list(c.hidden)},
                "activation_fn": nn.Tanh,
            },
            seed=seed,
            device="cpu",
            verbose=0,
        )
        learn_quietly(model, steps)
        self.model = model
        actor = [m for m in model.actor.latent_pi if isinstance(m, nn.Linear)]
        return export_mlp(
            [*actor, model.actor.mu],
            {"learner": "sac", "steps": steps, "seed": seed},
            env.knobs,
            continuous=True,
        )
