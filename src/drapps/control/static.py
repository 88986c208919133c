"""The static policy: fixed knobs, the baseline every adaptive policy is measured against."""

from __future__ import annotations

from drapps.control.action import NOOP, Action
from drapps.control.policy import register_policy
from drapps.control.state import State


@register_policy("static")
class StaticPolicy:
    """Never changes anything (the loader keeps the workers and prefetch it started with)."""

    def decide(self, state: State) -> Action:
        return NOOP
