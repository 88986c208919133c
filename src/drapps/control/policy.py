"""The Policy protocol and the registry of policies by name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from drapps.control.action import Action
from drapps.control.state import State


@runtime_checkable
class Policy(Protocol):
    """Decides, once per tick, how the pipeline's knobs should move."""

    def decide(self, state: State) -> Action:
        """The action for this tick (the controller clips it to bounds before applying)."""
        ...


_REGISTRY: dict[str, Callable[..., Policy]] = {}


def register_policy(name: str) -> Callable[[Callable[..., Policy]], Callable[..., Policy]]:
    """Class decorator: make a policy constructible by name (``Loader(policy=name)``)."""

    def add(factory: Callable[..., Policy]) -> Callable[..., Policy]:
        if name in _REGISTRY:
            raise ValueError(f"a policy named {name!r} is already registered")
        _REGISTRY[name] = factory
        return factory

    return add


def policy_names() -> list[str]:
    _load_builtins()
    return sorted(_REGISTRY)


def make_policy(name: str, **kwargs: Any) -> Policy:
    """Build the policy registered as ``name``.

    Raises:
        ValueError: no policy has that name (the message lists the valid ones).
    """
    _load_builtins()
    if name not in _REGISTRY:
        raise ValueError(f"policy must be one of {sorted(_REGISTRY)}, got {name!r}")
    return _REGISTRY[name](**kwargs)


def _load_builtins() -> None:
    # Importing the modules registers them; done lazily to keep import order free of cycles.
    from drapps.control import heuristic, rl, static  # noqa: F401
