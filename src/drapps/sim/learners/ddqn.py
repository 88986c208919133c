"""Double DQN with prioritized experience replay: a value-based alternative to PPO.

stable-baselines3's DQN has neither the double-Q target nor prioritized replay, so this is a
compact implementation (van Hasselt et al. 2016; Schaul et al. 2016): an online and a target
Q-network of the shipped policy's shape, epsilon-greedy exploration, targets
``r + gamma * Q_target(s', argmax_a Q_online(s', a))``, and a Huber loss weighted by the
replay's importance weights.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from drapps.control.rl import MlpPolicy
from drapps.sim.env import PipelineEnv
from drapps.sim.learners._base import Learner, export_mlp, register_learner, tanh_mlp
from drapps.sim.learners.replay import PrioritizedReplay

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DdqnConfig:
    """Hyperparameters of :class:`Ddqn` (defaults suit the pipeline environment)."""

    hidden: tuple[int, ...] = (64, 64)
    """Hidden layer widths."""
    gamma: float = 0.95
    """Discount per controller tick."""
    lr: float = 5e-4
    buffer: int = 50_000
    """Transitions kept for replay."""
    batch: int = 64
    warmup: int = 500
    """Steps of random actions before learning starts."""
    target_every: int = 500
    """Steps between copies of the online network into the target network."""
    epsilon: tuple[float, float] = (1.0, 0.05)
    """Exploration rate at the start and after ``explore`` of the steps."""
    explore: float = 0.5
    """Share of the steps over which epsilon decays."""
    alpha: float = 0.6
    """Priority exponent of the replay."""
    beta: tuple[float, float] = (0.4, 1.0)
    """Importance-weight exponent, annealed from the first to the second over the run."""


@register_learner("ddqn")
class Ddqn(Learner):
    """Double DQN with prioritized replay."""

    def __init__(self, config: DdqnConfig | None = None) -> None:
        self.config = config or DdqnConfig()

    def train(self, env: PipelineEnv, steps: int, seed: int) -> MlpPolicy:
        c = self.config
        torch.manual_seed(seed)
        rng = np.random.default_rng(seed)
        obs_size = env.observation_space.shape[0]
        actions = int(env.action_space.n)
        online = tanh_mlp([obs_size, *c.hidden, actions])
        target = tanh_mlp([obs_size, *c.hidden, actions])
        target.load_state_dict(online.state_dict())
        optimizer = torch.optim.Adam(online.parameters(), lr=c.lr)
        replay = PrioritizedReplay(c.buffer, obs_size, alpha=c.alpha)
        obs, _ = env.reset(seed=seed)
        episode_reward, episodes = 0.0, []
        for step in range(steps):
            progress = step / max(1, steps)
            epsilon = c.epsilon[0] + (c.epsilon[1] - c.epsilon[0]) * min(1.0, progress / c.explore)
            if step < c.warmup or rng.random() < epsilon:
                action = int(rng.integers(actions))
            else:
                with torch.no_grad():
                    action = int(online(torch.as_tensor(obs)).argmax())
            next_obs, reward, terminated, truncated, _ = env.step(action)
            # A truncated episode (time limit) is not terminal: its value is bootstrapped.
            replay.add(obs, action, reward, next_obs, terminated)
            episode_reward += reward
            obs = next_obs
            if terminated or truncated:
                episodes.append(episode_reward)
                episode_reward = 0.0
                obs, _ = env.reset()
                if len(episodes) % 20 == 0:
                    logger.info(
                        "ddqn step %d: mean episode reward %.2f", step, np.mean(episodes[-20:])
                    )
            if step >= c.warmup and len(replay) >= c.batch:
                beta = c.beta[0] + (c.beta[1] - c.beta[0]) * progress
                self._learn(online, target, optimizer, replay, beta, rng)
            if step % c.target_every == 0:
                target.load_state_dict(online.state_dict())
        linears = [m for m in online if isinstance(m, nn.Linear)]
        return export_mlp(linears, {"learner": "ddqn", "steps": steps, "seed": seed}, env.knobs)

    def _learn(
        self,
        online: nn.Module,
        target: nn.Module,
        optimizer: torch.optim.Optimizer,
        replay: PrioritizedReplay,
        beta: float,
        rng: np.random.Generator,
    ) -> None:
        c = self.config
        indices, weights = replay.sample(c.batch, beta, rng)
        obs = torch.as_tensor(replay.obs[indices])
        actions = torch.as_tensor(replay.actions[indices])
        rewards = torch.as_tensor(replay.rewards[indices])
        next_obs = torch.as_tensor(replay.next_obs[indices])
        dones = torch.as_tensor(replay.dones[indices])
        with torch.no_grad():
            best = online(next_obs).argmax(dim=1, keepdim=True)
            value = target(next_obs).gather(1, best).squeeze(1)
            goal = rewards + c.gamma * (1.0 - dones) * value
        q = online(obs).gather(1, actions.unsqueeze(1)).squeeze(1)
        errors = goal - q
        loss = (
            torch.as_tensor(weights) * nn.functional.smooth_l1_loss(q, goal, reduction="none")
        ).mean()
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(online.parameters(), 10.0)
        optimizer.step()
        replay.update(indices, errors.detach().numpy())
