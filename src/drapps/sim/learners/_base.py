"""The Learner base class, its registry, and export of a trained network to an MlpPolicy."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

from torch import nn

from drapps.control.rl import KNOBS, MlpPolicy
from drapps.registry import Registry
from drapps.sim.env import PipelineEnv


class Learner(ABC):
    """Trains a policy in a :class:`PipelineEnv` and returns it as an :class:`MlpPolicy`."""

    continuous: bool = False
    """True for a learner of continuous actions: it needs ``PipelineEnv(continuous=True)``."""

    @abstractmethod
    def train(self, env: PipelineEnv, steps: int, seed: int) -> MlpPolicy:
        """Train for ``steps`` environment steps, seeded by ``seed``."""


LEARNERS: Registry[Callable[[], Learner]] = Registry("learner")
"""Learner classes by name; the built-ins register when ``drapps.sim.learners`` is imported."""


def register_learner(name: str) -> Callable[[type[Learner]], type[Learner]]:
    """Class decorator: make a learner available by name (``drapps train-policy --learner``)."""
    register: Callable[[type[Learner]], type[Learner]] = LEARNERS.register(name)
    return register


def learner_names() -> list[str]:
    return LEARNERS.names()


def make_learner(name: str) -> Learner:
    """The learner registered as ``name``.

    Raises:
        ValueError: no learner has that name (the message lists them).
    """
    return LEARNERS.get(name)()


def tanh_mlp(sizes: Sequence[int]) -> nn.Sequential:
    """Linear layers of ``sizes`` with tanh between them: the shipped policy's shape, which
    :func:`export_mlp` turns into an :class:`MlpPolicy`."""
    layers: list[nn.Module] = []
    for k in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[k], sizes[k + 1]))
        if k < len(sizes) - 2:
            layers.append(nn.Tanh())
    return nn.Sequential(*layers)


def learn_quietly(model: Any, steps: int) -> None:
    """``model.learn(steps)`` for a stable-baselines3 model, with a logger that writes
    nowhere: its default one makes a folder in the temporary directory at every run, empty
    when nothing is printed, and leaves it there."""
    from stable_baselines3.common.logger import Logger

    model.set_logger(Logger(folder=None, output_formats=[]))
    model.learn(total_timesteps=steps)


def export_mlp(
    linears: Sequence[nn.Linear],
    meta: dict[str, Any],
    knobs: Sequence[str] = KNOBS,
    *,
    continuous: bool = False,
) -> MlpPolicy:
    """The NumPy policy computing the same outputs as ``linears`` with tanh between them, for
    ``knobs`` (the environment's); ``continuous`` for one output per knob (SAC's mean)."""
    layers = [
        (linear.weight.detach().cpu().numpy().T.copy(), linear.bias.detach().cpu().numpy().copy())
        for linear in linears
    ]
    return MlpPolicy(layers, meta, knobs, continuous)
