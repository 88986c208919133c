"""What a training recipe provides to the reference trainer."""

from __future__ import annotations

import abc
from pathlib import Path
from typing import Any

import torch
from torch import nn


class Recipe(abc.ABC):
    """A model family, its data in a real format, its loss and its quality metric."""

    name: str
    summary: str
    quality: str
    """Name of the quality metric (``accuracy``, ``perplexity``)."""
    higher_is_better: bool
    models: tuple[str, ...]
    """Model sizes ``--model`` accepts; the first is the default."""
    micro_batch: int
    """Default micro-batch size (the usual published one for the model family)."""
    items_unit: str
    """What the loss averages over: ``samples`` or ``tokens``."""

    @abc.abstractmethod
    def dataset(self, data: Path, train: bool, model: str) -> Any:
        """The train or evaluation split under ``data``, items ready for ``drapps.Loader``."""

    @abc.abstractmethod
    def model(self, name: str) -> nn.Module:
        """A fresh model; it keeps its residual blocks in ``model.blocks`` (an nn.Sequential)."""

    @abc.abstractmethod
    def loss_sum(self, model: nn.Module, batch: Any, device: torch.device) -> torch.Tensor:
        """Summed (not averaged) loss over the batch's items."""

    def items(self, batch: Any) -> int:
        """What the loss sums over in ``batch``: its samples, or its label tokens."""
        labels = batch[1]
        return int(labels.numel()) if self.items_unit == "tokens" else len(labels)

    @abc.abstractmethod
    def score(self, loss_sum: float, correct: int, items: int) -> float:
        """The quality metric from summed evaluation loss and correct predictions."""

    @abc.abstractmethod
    def evaluate_batch(
        self, model: nn.Module, batch: Any, device: torch.device
    ) -> tuple[float, int, int]:
        """Summed loss, correct predictions and items of one evaluation batch."""

    def check_model(self, name: str) -> None:
        if name not in self.models:
            raise ValueError(
                f"recipe {self.name} has models {', '.join(self.models)}, got {name!r}"
            )

    def reached(self, quality: float, target: float) -> bool:
        return quality >= target if self.higher_is_better else quality <= target
