"""Action: small discrete steps on the pipeline's knobs, with the reason a policy took them."""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass
from typing import Any

STEPS = (-1, 0, 1)


@dataclass(frozen=True)
class Action:
    """Changes to apply now. Each knob moves by at most one step per tick."""

    workers: int = 0
    """-1, 0 or +1 worker."""
    prefetch: int = 0
    """-1, 0 or +1 batch of prefetch depth."""
    split: int = 0
    """-1, 0 or +1 op moved across the CPU/GPU split (reserved for the GPU-stage issue)."""
    codec: str | None = None
    """Codec to switch the cache to, None to keep it (reserved for the codec issue)."""
    reason: str = ""
    """Why the policy chose this, in words (shown in the report and the trace)."""

    def __post_init__(self) -> None:
        for name in ("workers", "prefetch", "split"):
            if getattr(self, name) not in STEPS:
                raise ValueError(
                    f"Action.{name} must be one of {STEPS}, got {getattr(self, name)!r}"
                )

    @property
    def is_noop(self) -> bool:
        return self.workers == 0 and self.prefetch == 0 and self.split == 0 and self.codec is None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Action:
        return cls(
            **{k: data[k] for k in ("workers", "prefetch", "split", "codec", "reason") if k in data}
        )

    @staticmethod
    def space() -> tuple[Action, ...]:
        """The discrete actions a learned policy picks from (workers x prefetch steps)."""
        return tuple(Action(w, p) for w, p in itertools.product(STEPS, STEPS))


NOOP = Action()
