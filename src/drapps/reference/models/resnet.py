"""ResNet-18 and ResNet-50 for 32x32 inputs (CIFAR): 3x3 stem, no max-pool, four stages."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a residual (ResNet-18/34)."""

    expansion = 1

    def __init__(self, inputs: int, width: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, width, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.shortcut = _shortcut(inputs, width, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3, 1x1 expand by 4, with a residual (ResNet-50/101)."""

    expansion = 4

    def __init__(self, inputs: int, width: int, stride: int) -> None:
        super().__init__()
        out = width * self.expansion
        self.conv1 = nn.Conv2d(inputs, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.shortcut = _shortcut(inputs, out, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        return F.relu(self.bn3(self.conv3(y)) + self.shortcut(x))


def _shortcut(inputs: int, out: int, stride: int) -> nn.Module:
    if stride == 1 and inputs == out:
        return nn.Identity()
    return nn.Sequential(nn.Conv2d(inputs, out, 1, stride, bias=False), nn.BatchNorm2d(out))


DEPTHS: dict[int, tuple[type[BasicBlock] | type[Bottleneck], tuple[int, ...]]] = {
    18: (BasicBlock, (2, 2, 2, 2)),
    50: (Bottleneck, (3, 4, 6, 3)),
}


class ResNet(nn.Module):
    """A CIFAR ResNet whose residual blocks form one ``nn.Sequential`` (``self.blocks``).

    Keeping the blocks in one stack lets :func:`~drapps.train.checkpoint_blocks` segment them.

    Args:
        depth: 18 or 50.
        width: channels of the first stage (64 in the paper); stages double it.
        num_classes: output classes.

    Example:
        >>> import torch
        >>> ResNet(18, width=8)(torch.randn(2, 3, 32, 32)).shape
        torch.Size([2, 10])
    """

    def __init__(self, depth: int = 18, width: int = 64, num_classes: int = 10) -> None:
        super().__init__()
        if depth not in DEPTHS:
            raise ValueError(f"depth must be one of {sorted(DEPTHS)}, got {depth!r}")
        if width < 1:
            raise ValueError(f"width must be >= 1, got {width!r}")
        block, counts = DEPTHS[depth]
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU()
        )
        blocks: list[nn.Module] = []
        inputs = width
        for stage, count in enumerate(counts):
            stage_width = width * 2**stage
            for i in range(count):
                stride = 2 if stage > 0 and i == 0 else 1
                blocks.append(block(inputs, stage_width, stride))
                inputs = stage_width * block.expansion
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(inputs, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))
