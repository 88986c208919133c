"""ResNet-18/50 on CIFAR-10 with the standard crop-and-flip augmentation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from drapps.datasets.cifar10 import CIFAR10, MEAN, STD
from drapps.ops.image import Compose, RandomCrop, RandomHorizontalFlip, ToCHWTensor
from drapps.reference.models.resnet import ResNet
from drapps.reference.recipes._base import Recipe

# name -> (depth, width of the first stage)
_MODELS = {
    "resnet18": (18, 64),
    "resnet50": (50, 64),
    "resnet18-w16": (18, 16),
    "resnet18-w4": (18, 4),
}


class ResNetCIFAR10(Recipe):
    name = "resnet-cifar10"
    summary = "ResNet-18/50 on CIFAR-10 (python or binary batches), top-1 test accuracy"
    quality = "accuracy"
    higher_is_better = True
    models = tuple(_MODELS)
    micro_batch = 128
    items_unit = "samples"

    def dataset(self, data: Path, train: bool, model: str) -> Any:
        if train:
            transform = Compose([RandomCrop(32, padding=4), RandomHorizontalFlip(), ToCHWTensor()])
            return CIFAR10(data, train=True, transform=transform)
        return CIFAR10(data, train=False, transform=ToCHWTensor())

    def model(self, name: str) -> nn.Module:
        self.check_model(name)
        depth, width = _MODELS[name]
        return ResNet(depth, width=width, num_classes=10)

    @staticmethod
    def _inputs(images: torch.Tensor, device: torch.device) -> torch.Tensor:
        # uint8 crosses processes; normalising here costs a quarter of the bytes.
        mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1)
        std = torch.tensor(STD, device=device).view(1, 3, 1, 1)
        return (images.to(device, non_blocking=True).float() / 255.0 - mean) / std

    def loss_sum(self, model: nn.Module, batch: Any, device: torch.device) -> torch.Tensor:
        images, labels = batch
        logits = model(self._inputs(images, device))
        return F.cross_entropy(logits.float(), labels.to(device), reduction="sum")

    def evaluate_batch(
        self, model: nn.Module, batch: Any, device: torch.device
    ) -> tuple[float, int, int]:
        images, labels = batch
        labels = labels.to(device)
        logits = model(self._inputs(images, device)).float()
        loss = F.cross_entropy(logits, labels, reduction="sum")
        correct = int((logits.argmax(1) == labels).sum())
        return float(loss), correct, self.items(batch)

    def score(self, loss_sum: float, correct: int, items: int) -> float:
        return 100.0 * correct / items
