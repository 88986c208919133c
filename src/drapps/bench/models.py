"""The ``cuda-model`` consumer's training step: a real model's forward and backward on the GPU.

ResNet-50 (He et al., 2016: bottleneck blocks of 3, 4, 6 and 3, widths 256 to 2048) built here
so that the bench needs no torchvision, trained with automatic mixed precision (bfloat16
autocast, channels-last memory) and SGD with momentum, as an ImageNet recipe does. Each step
ends when the GPU has finished it, so the loop's wait for the next batch is the GPU's idle time
and the throughput is the training's, not the rate of queueing kernels.

Example:
    >>> import torch
    >>> model = resnet50(classes=10)
    >>> model(torch.zeros(2, 3, 64, 64)).shape
    torch.Size([2, 10])
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


class Bottleneck(nn.Module):
    """1x1 -> 3x3 (stride here) -> 1x1 with 4x expansion, and a projected shortcut where the
    shape changes."""

    def __init__(self, inputs: int, width: int, stride: int) -> None:
        super().__init__()
        out = 4 * width
        self.body = nn.Sequential(
            nn.Conv2d(inputs, width, 1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.Conv2d(width, out, 1, bias=False),
            nn.BatchNorm2d(out),
        )
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or inputs != out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(inputs, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


def resnet50(classes: int = 1000) -> nn.Module:
    """ResNet-50 for ``classes`` classes (25.6 M parameters at 1000)."""
    layers: list[nn.Module] = [
        nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, stride=2, padding=1),
    ]
    inputs = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for block in range(blocks):
            layers.append(Bottleneck(inputs, width, stride if block == 0 else 1))
            inputs = 4 * width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(inputs, classes)]
    return nn.Sequential(*layers)


class DeviceStep:
    """One mixed-precision SGD step of ``model`` on ``device``, waited for.

    Args:
        model: builds the network (after ``torch.manual_seed(seed)``: every case trains the
            same weights).
        device: where it trains ("cuda", "cuda:1"; "cpu" runs the same step in float32).
        prepare: the batched step before the model (normalisation), run on ``device``.
    """

    def __init__(
        self,
        model: Callable[[], nn.Module],
        device: str | torch.device,
        prepare: Callable[[torch.Tensor], torch.Tensor] = lambda x: x.float(),
        seed: int = 0,
    ) -> None:
        torch.manual_seed(seed)
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.model = model().to(self.device)
        if self.cuda:
            self.model = self.model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        self.prepare = prepare
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        x = x.to(self.device, non_blocking=True)
        y = y.to(self.device, non_blocking=True)
        x = self.prepare(x)
        if self.cuda:
            x = x.contiguous(memory_format=torch.channels_last)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.cuda):
            loss = nn.functional.cross_entropy(self.model(x), y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        if self.cuda:
            torch.cuda.current_stream(self.device).synchronize()
