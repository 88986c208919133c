"""Action: small discrete steps on the pipeline's knobs, with the reason a policy took them."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

STEPS = (-1, 0, 1)
STEP_KNOBS = (
    "workers", "prefetch", "split", "offload", "lookahead", "codec", "priority", "executor"
)  # fmt: skip
"""The knobs an Action moves by steps (in :meth:`Action.space` order). In :attr:`Action.other`:
``offload`` steps by a quarter of the share, ``lookahead`` doubles or halves, ``codec`` moves
to the next smaller (+1) or larger (-1) codec, ``priority`` lowers the workers' (-1) and
``executor`` tries threads (+1) or goes back to worker processes (-1)."""
_FIELDS = ("workers", "prefetch", "split")


@dataclass(frozen=True)
class Action:
    """Changes to apply now. Each knob moves by at most one step per tick."""

    workers: int = 0
    """-1, 0 or +1 worker."""
    prefetch: int = 0
    """-1, 0 or +1 batch of prefetch depth."""
    split: int = 0
    """-1, 0 or +1 op moved across the split between the workers and the device stage (used
    when the pipeline has a ``split`` knob)."""
    codec: str | None = None
    """Codec to switch the sample cache to, None to keep it (used when the pipeline has a
    ``codec`` knob)."""
    reason: str = ""
    """Why the policy chose this, in words (shown in the report and the trace)."""
    other: dict[str, Any] = field(default_factory=dict, hash=False)
    """Moves of knobs that have no field of their own, by knob name."""

    def __post_init__(self) -> None:
        for name in ("workers", "prefetch", "split"):
            if getattr(self, name) not in STEPS:
                raise ValueError(
                    f"Action.{name} must be one of {STEPS}, got {getattr(self, name)!r}"
                )

    def moves(self) -> dict[str, Any]:
        """The move asked of each knob, by knob name (steps for step knobs, a value for
        choice knobs); knobs not asked to move are absent."""
        moves: dict[str, Any] = {
            k: v for k, v in (("workers", self.workers), ("prefetch", self.prefetch),
                              ("split", self.split)) if v != 0
        }  # fmt: skip
        if self.codec is not None:
            moves["codec"] = self.codec
        # A float is a value to set (0.0 included); an int 0 is no step.
        moves.update({k: v for k, v in self.other.items() if _moves(v)})
        return moves

    @property
    def is_noop(self) -> bool:
        return not self.moves()

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if not data["other"]:
            del data["other"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Action:
        keys = ("workers", "prefetch", "split", "codec", "reason", "other")
        return cls(**{k: data[k] for k in keys if k in data})

    @staticmethod
    def space(knobs: Sequence[str] = ("workers", "prefetch")) -> tuple[Action, ...]:
        """The discrete actions a learned policy picks from: every combination of one step
        of each of ``knobs`` (:data:`STEP_KNOBS`), the first knob varying slowest.

        Raises:
            ValueError: a knob that is not a step knob, or one named twice.
        """
        unknown = [k for k in knobs if k not in STEP_KNOBS]
        if unknown or len(set(knobs)) != len(knobs) or not knobs:
            raise ValueError(f"knobs must be distinct names from {list(STEP_KNOBS)}, got {knobs!r}")
        return tuple(
            Action.of_steps(dict(zip(knobs, steps, strict=True)))
            for steps in itertools.product(STEPS, repeat=len(knobs))
        )

    @staticmethod
    def of_steps(steps: dict[str, int]) -> Action:
        """The Action of one step per knob: fields for those that have one, ``other`` for the
        rest (zero steps left out, so a no-op is :data:`NOOP`).

        Example:
            >>> Action.of_steps({"workers": 1, "lookahead": -1, "prefetch": 0})
            Action(workers=1, prefetch=0, split=0, codec=None, reason='', other={'lookahead': -1})
        """
        fields = {k: v for k, v in steps.items() if k in _FIELDS}
        other = {k: v for k, v in steps.items() if k not in _FIELDS and v != 0}
        return Action(**fields, other=other)  # type: ignore[arg-type]

    def describe(self, knobs: Sequence[str]) -> str:
        """The steps of ``knobs`` in words, e.g. ``"workers+1 prefetch+0"``."""
        return " ".join(f"{k}{self.step(k):+d}" for k in knobs)

    def step(self, knob: str) -> int:
        """The step this action asks of the step knob ``knob`` (0: none)."""
        if knob in _FIELDS:
            return int(getattr(self, knob))
        move = self.other.get(knob, 0)
        return int(move) if isinstance(move, int) else 0


NOOP = Action()


def _moves(value: Any) -> bool:
    """Whether an ``other`` entry asks for a change: a value to set, or a non-zero step."""
    return value is not None and (isinstance(value, float | str) or value != 0)
