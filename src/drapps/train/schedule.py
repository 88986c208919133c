"""Linear warmup then cosine annealing, the learning rate scaled to the effective batch size."""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch.optim.lr_scheduler import LRScheduler

ScalingRule = Literal["none", "linear", "sqrt"]
SCALING_RULES: tuple[str, ...] = ("none", "linear", "sqrt")


def scale_lr(lr: float, batch_size: int, base_batch_size: int, rule: ScalingRule) -> float:
    """``lr`` tuned at ``base_batch_size``, rescaled to ``batch_size`` by ``rule``.

    ``linear`` (Goyal et al. 2017) suits SGD; ``sqrt`` (Hoffer et al. 2017; Malladi et al. 2022)
    suits Adam-style optimizers; ``none`` keeps ``lr``.
    """
    if rule not in SCALING_RULES:
        raise ValueError(f"scaling must be one of {', '.join(SCALING_RULES)}, got {rule!r}")
    ratio = batch_size / base_batch_size
    if rule == "linear":
        return lr * ratio
    if rule == "sqrt":
        return lr * math.sqrt(ratio)
    return lr


class WarmupCosine(LRScheduler):
    """Linear warmup to each group's learning rate, then cosine annealing to ``min_lr_ratio`` of it.

    Progress is counted in optimizer steps (``unit="steps"``) or in items trained on
    (``unit="items"``: each :meth:`step` advances by the current batch size), so with an adaptive
    batch the schedule still ends after the planned number of samples or tokens. The value used
    for a step is the one at the end of that step's progress: step 0 of a 4-step warmup trains at
    1/4 of the peak, step 3 at the peak, so no step is wasted at zero.

    When the effective batch changes (:meth:`set_batch_size`, which
    :class:`~drapps.train.AdaptiveAccumulation` calls), the learning rate follows ``scaling``
    relative to ``base_batch_size``, the batch size the optimizer's learning rates were tuned at.

    Args:
        optimizer: any torch optimizer; its groups' ``lr`` are the peak rates at the base batch.
        warmup: length of the warmup, in ``unit``.
        total: length of the whole schedule, in ``unit``; after it the rate stays at the minimum.
        min_lr_ratio: the floor of the cosine, as a fraction of the peak.
        base_batch_size: the batch size the peak rates were tuned at (items).
        scaling: ``"none"``, ``"linear"`` or ``"sqrt"``.
        unit: ``"steps"`` or ``"items"``.
        last_epoch: as for every torch scheduler: -1 starts fresh, and ``k`` resumes where
            ``last_epoch`` was ``k + 1`` (with ``"initial_lr"`` in the optimizer's groups);
            ``unit="items"`` resumes from :meth:`state_dict` only.

    Example:
        >>> import torch
        >>> opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
        >>> sched = WarmupCosine(opt, warmup=2, total=6)
        >>> lrs = []
        >>> for _ in range(6):
        ...     lrs.append(round(sched.get_last_lr()[0], 3))
        ...     opt.step()
        ...     sched.step()
        >>> lrs
        [0.5, 1.0, 0.854, 0.5, 0.146, 0.0]
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        warmup: int,
        total: int,
        *,
        min_lr_ratio: float = 0.0,
        base_batch_size: int = 1,
        scaling: ScalingRule = "none",
        unit: Literal["steps", "items"] = "steps",
        last_epoch: int = -1,
    ) -> None:
        if warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {warmup!r}")
        if total <= warmup:
            raise ValueError(f"total must be > warmup, got total={total!r}, warmup={warmup!r}")
        if not 0.0 <= min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {min_lr_ratio!r}")
        if base_batch_size < 1:
            raise ValueError(f"base_batch_size must be >= 1, got {base_batch_size!r}")
        if scaling not in SCALING_RULES:
            raise ValueError(f"scaling must be one of {', '.join(SCALING_RULES)}, got {scaling!r}")
        if unit not in ("steps", "items"):
            raise ValueError(f"unit must be 'steps' or 'items', got {unit!r}")
        self.warmup, self.total = warmup, total
        self.min_lr_ratio = min_lr_ratio
        self.base_batch_size = base_batch_size
        self.batch_size = base_batch_size
        self.scaling: ScalingRule = scaling
        self.unit = unit
        if last_epoch >= 0 and unit == "items":
            raise ValueError(
                "unit='items' counts items, which last_epoch (a count of steps) does not "
                "give: resume it with load_state_dict()"
            )
        # Steps trained on before the current one. A scheduler made with last_epoch=k is where
        # one made fresh was after k + 1 steps (the constructor's step is one): as torch's own.
        self.progress = max(last_epoch, 0)
        super().__init__(optimizer, last_epoch)

    def factor(self, progress: float) -> float:
        """The schedule's multiplier of the peak rate for a step ending at ``progress``."""
        if progress < self.warmup:
            return progress / self.warmup
        t = min(1.0, (progress - self.warmup) / (self.total - self.warmup))
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * t))

    def _advance(self) -> int:
        return 1 if self.unit == "steps" else self.batch_size

    def get_lr(self) -> list[float | torch.Tensor]:
        factor = self.factor(self.progress + self._advance())
        return [
            scale_lr(float(base), self.batch_size, self.base_batch_size, self.scaling) * factor
            for base in self.base_lrs
        ]

    def step(self, epoch: int | None = None) -> None:
        if epoch is not None:
            raise TypeError("WarmupCosine.step() takes no epoch; it counts its own progress")
        if self.last_epoch >= 0:  # the constructor's initial step trains on nothing
            self.progress += self._advance()
        super().step()

    def set_batch_size(self, batch_size: int) -> None:
        """Rescale the learning rate for a new effective batch size, from the next step on."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
        self.batch_size = batch_size
        lrs = self.get_lr()
        for group, lr in zip(self.optimizer.param_groups, lrs, strict=True):
            group["lr"] = lr
        self._last_lr = [float(lr) for lr in lrs]
