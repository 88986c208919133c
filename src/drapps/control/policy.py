"""The Policy protocol and the registry of policies by name.

The built-in policies register themselves when ``drapps.control`` is imported; a user's policy
registers the same way (``@POLICIES.register("mine")``) and ``Loader(policy="mine")`` finds it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from drapps.control.action import Action
from drapps.control.state import State
from drapps.registry import Registry


@runtime_checkable
class Policy(Protocol):
    """Decides, once per tick, how the pipeline's knobs should move.

    A policy may also define ``bind(movable: tuple[str, ...])``: the Controller calls it once
    with the names of the knobs it may move (a fixed knob is left out), so that the policy
    does not spend ticks trying moves the Controller would clip.
    """

    def decide(self, state: State) -> Action:
        """The action for this tick (the controller clips it to bounds before applying)."""
        ...


POLICIES: Registry[Callable[..., Policy]] = Registry("policy")
"""Policy factories by name: ``POLICIES.get(name)(**kwargs)`` builds one."""


def register_policy(name: str) -> Callable[[Callable[..., Policy]], Callable[..., Policy]]:
    """Decorator: make a policy constructible by name (``Loader(policy=name)``)."""
    register: Callable[[Callable[..., Policy]], Callable[..., Policy]] = POLICIES.register(name)
    return register


def policy_names() -> list[str]:
    """Names of the registered policies."""
    return POLICIES.names()


def check_policy(policy: Any) -> None:
    """Refuse a loader's ``policy=`` that is neither a registered name nor an object with
    ``decide(state)``.

    Raises:
        ValueError: naming the policy given and the registered names.
    """
    if isinstance(policy, str):
        if policy not in policy_names():
            raise ValueError(
                f"policy must be one of {policy_names()} or an object with decide(), got {policy!r}"
            )
    elif not callable(getattr(policy, "decide", None)):
        raise ValueError(
            f"policy must be a registered name or an object with decide(state), got {policy!r}"
        )


def make_policy(name: str, **kwargs: Any) -> Policy:
    """Build the policy registered as ``name``.

    Raises:
        ValueError: no policy has that name (the message lists the valid ones).
    """
    return POLICIES.get(name)(**kwargs)
