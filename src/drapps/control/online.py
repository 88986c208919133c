"""Bounded online fine-tuning of a learned policy from the live loader's own ticks.

Off by default. When on, the policy samples its action from a softmax over its scores (a
little exploration) and, at each tick, credits the reward of the state it now sees to the
action it took last tick: a policy-gradient step (REINFORCE with a running baseline) on the
output layer only. It is bounded three ways: at most ``max_updates`` steps, the output layer
never leaves a ball of ``max_drift`` (relative) around the shipped weights, and an update that
takes longer than ``budget_s`` switches tuning off. It runs on the controller's thread, never on
the data path, and the Controller turns any exception into a held tick: it cannot stall the
pipeline. ``tuner.enabled = False`` freezes it at any time.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from dataclasses import dataclass

import numpy as np

from drapps.control.action import Action
from drapps.control.policy import register_policy
from drapps.control.reward import RewardWeights, reward
from drapps.control.rl import MlpPolicy
from drapps.control.state import State

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class OnlineConfig:
    """Bounds and rates of online fine-tuning."""

    lr: float = 0.01
    """Step size of the policy-gradient update."""
    temperature: float = 0.5
    """Softmax temperature of the sampled actions (lower: closer to the greedy choice)."""
    max_updates: int = 2000
    """Updates after which tuning stops (about 17 minutes at the default 0.5 s tick)."""
    max_drift: float = 0.25
    """Largest change of the output layer, relative to its shipped norm."""
    baseline: float = 0.05
    """Weight of each new reward in the running baseline (an exponential average)."""
    budget_s: float = 0.002
    """An update slower than this switches tuning off (the controller's tick stays cheap)."""

    def __post_init__(self) -> None:
        for name in ("lr", "temperature", "max_drift", "budget_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"OnlineConfig.{name} must be > 0, got {getattr(self, name)!r}")
        if not 0 < self.baseline <= 1:
            raise ValueError(f"OnlineConfig.baseline must be in (0, 1], got {self.baseline!r}")
        if self.max_updates < 0:
            raise ValueError(f"OnlineConfig.max_updates must be >= 0, got {self.max_updates!r}")


class OnlineTuner:
    """A learned policy that keeps learning, within bounds, from the loader it drives.

    Example:
        >>> from drapps.control.online import OnlineTuner
        >>> from drapps.control.rl import MlpPolicy
        >>> tuner = OnlineTuner(MlpPolicy.shipped())
        >>> tuner.updates, tuner.enabled
        (0, True)
    """

    def __init__(
        self,
        policy: MlpPolicy,
        config: OnlineConfig | None = None,
        *,
        weights: RewardWeights | None = None,
        seed: int = 0,
    ) -> None:
        self.policy = policy
        self.config = config or OnlineConfig()
        self.weights = weights or RewardWeights()
        self.enabled = True
        """Set to False to freeze the policy where it is (it keeps deciding, greedily)."""
        self.updates = 0
        self._origin = self._output()
        self._radius = self.config.max_drift * max(float(np.linalg.norm(self._origin)), 1e-6)
        self._rng = np.random.default_rng(seed)
        self._baseline: float | None = None
        self._last: tuple[np.ndarray, np.ndarray, int] | None = None  # hidden, probs, action

    @property
    def drift(self) -> float:
        """How far the output layer moved, relative to its shipped norm."""
        moved = float(np.linalg.norm(self._output() - self._origin))
        return moved / (self._radius / self.config.max_drift)

    def _output(self) -> np.ndarray:
        """The output layer as one matrix: weights with the bias as a last row."""
        weight, bias = self.policy.layers[-1]
        return np.vstack([weight, bias[None, :]]).astype(np.float32)

    def decide(self, state: State) -> Action:
        if not (self.enabled and self.updates < self.config.max_updates):
            self._last = None
            return self.policy.decide(state)
        hidden = self.policy.hidden(state.vector(self.policy.knobs))
        weight, bias = self.policy.layers[-1]
        scores = hidden @ weight + bias  # this tick acts on the weights before the update
        if self._last is not None:
            self._learn(reward(state, self.weights))
        logits = scores / self.config.temperature
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        choice = int(self._rng.choice(len(probs), p=probs))
        self._last = (hidden, probs, choice)
        action = self.policy.actions[choice]
        if action.is_noop:
            return action
        return dataclasses.replace(action, reason="learned policy (tuning online)")

    def _learn(self, value: float) -> None:
        assert self._last is not None
        start = time.perf_counter()
        hidden, probs, choice = self._last
        c = self.config
        if self._baseline is None:
            self._baseline = value
        advantage = value - self._baseline
        self._baseline += c.baseline * (value - self._baseline)
        grad = -probs
        grad[choice] += 1.0  # d log softmax / d logits
        step = c.lr * advantage / c.temperature
        inputs = np.append(hidden, 1.0)  # the bias row sees a constant input
        output = self._output() + step * np.outer(inputs, grad).astype(np.float32)
        moved = output - self._origin
        norm = float(np.linalg.norm(moved))
        if norm > self._radius:  # project back into the ball around the shipped weights
            output = self._origin + moved * (self._radius / norm)
        if math.isfinite(float(output.sum())):
            self.policy.layers[-1] = (output[:-1].copy(), output[-1].copy())
        self.updates += 1
        if time.perf_counter() - start > c.budget_s:
            logger.warning("online tuning took over %.1f ms: switched off", 1000 * c.budget_s)
            self.enabled = False


@register_policy("rl")
def shipped_policy(online: bool | OnlineConfig = False) -> MlpPolicy | OnlineTuner:
    """The shipped RL policy; ``online=True`` (or an ``OnlineConfig``) wraps it in an
    :class:`OnlineTuner` that keeps learning within bounds."""
    policy = MlpPolicy.shipped()
    if online is False:
        return policy
    if online is True:
        return OnlineTuner(policy)
    if isinstance(online, OnlineConfig):
        return OnlineTuner(policy, online)
    raise ValueError(f"online must be a bool or an OnlineConfig, got {online!r}")
