"""The Learner base class, its registry, and export of a trained network to an MlpPolicy."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

from torch import nn

from drapps.control.rl import MlpPolicy
from drapps.sim.env import PipelineEnv

_REGISTRY: dict[str, Callable[[], Learner]] = {}


class Learner(ABC):
    """Trains a policy in a :class:`PipelineEnv` and returns it as an :class:`MlpPolicy`."""

    @abstractmethod
    def train(self, env: PipelineEnv, steps: int, seed: int) -> MlpPolicy:
        """Train for ``steps`` environment steps, seeded by ``seed``."""


def register_learner(name: str) -> Callable[[type[Learner]], type[Learner]]:
    def add(cls: type[Learner]) -> type[Learner]:
        if name in _REGISTRY:
            raise ValueError(f"a learner named {name!r} is already registered")
        _REGISTRY[name] = cls
        return cls

    return add


def learner_names() -> list[str]:
    return sorted(_REGISTRY)


def make_learner(name: str) -> Learner:
    """The learner registered as ``name``.

    Raises:
        ValueError: no learner has that name (the message lists them).
    """
    if name not in _REGISTRY:
        raise ValueError(f"learner must be one of {learner_names()}, got {name!r}")
    return _REGISTRY[name]()


def export_mlp(linears: Sequence[nn.Linear], meta: dict[str, Any]) -> MlpPolicy:
    """The NumPy policy computing the same scores as ``linears`` with tanh between them."""
    layers = [
        (linear.weight.detach().cpu().numpy().T.copy(), linear.bias.detach().cpu().numpy().copy())
        for linear in linears
    ]
    return MlpPolicy(layers, meta)
