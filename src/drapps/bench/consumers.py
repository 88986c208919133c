"""Training-loop stand-ins the benchmark feeds: a fixed sleep (an accelerator step) or a
real small CNN's forward and backward on the CPU, competing with the workers for cores."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import nn

CONSUMERS = ("none", "sleep", "cpu-model")


class CpuModel:
    """A small CNN trained on each batch: uint8 NCHW -> float -> conv -> pool -> linear."""

    def __init__(self, classes: int = 9, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.model = nn.Sequential(
            nn.Conv2d(3, 16, kernel_size=7, stride=4),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(8),
            nn.Flatten(),
            nn.Linear(16 * 8 * 8, classes),
        )
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)

    def __call__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        x = images.float().div_(255.0)
        loss = nn.functional.cross_entropy(self.model(x), labels)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()


def make_consumer(name: str, step_ms: float) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """The per-batch training step ``name`` stands for."""
    if name == "none":
        return lambda images, labels: None
    if name == "sleep":
        return lambda images, labels: time.sleep(step_ms / 1000)
    if name == "cpu-model":
        return CpuModel()
    raise ValueError(f"consumer must be one of {list(CONSUMERS)}, got {name!r}")
