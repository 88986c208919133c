"""Colour jitter on uint8 CHW tensors, per sample or batched, bit-identical between the two.

Brightness, then contrast, then saturation (a fixed order, unlike torchvision's shuffled one, so
the op draws exactly three numbers per sample), each blended and truncated back to uint8 as
torchvision does for uint8 images. The contrast mean is taken over integers (an int64 sum of the
truncated grayscale), so it is exact in any summation order: a batched run equals the per-sample
one bit for bit on the same device.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from drapps.ops.op import Op, Spec, expect
from drapps.runtime.seeding import active_rng

_GRAY = (0.2989, 0.587, 0.114)  # ITU-R 601-2 luma, as torchvision


def _gray(x: torch.Tensor) -> torch.Tensor:
    """Luma of ``... x 3 x H x W`` float pixels, truncated to integers (``... x 1 x H x W``)."""
    r, g, b = x.unbind(-3)
    return (r * _GRAY[0] + g * _GRAY[1] + b * _GRAY[2]).trunc().unsqueeze(-3)


def _blend(x: torch.Tensor, other: torch.Tensor, ratio: torch.Tensor) -> torch.Tensor:
    """``ratio * x + (1 - ratio) * other`` clamped to [0, 255] and truncated, in float32."""
    return (ratio * x + (1.0 - ratio) * other).clamp_(0, 255).trunc_()


class ColorJitter(Op):
    """Randomly change brightness, contrast and saturation of uint8 CHW RGB tensors.

    Each factor is drawn uniformly from ``[max(0, 1 - v), 1 + v]`` for the strength ``v``
    given (0 leaves that property alone and draws nothing).

    Example:
        >>> import torch
        >>> from drapps.ops import ColorJitter
        >>> out = ColorJitter(brightness=0.4)(torch.full((3, 2, 2), 100, dtype=torch.uint8))
        >>> out.dtype, out.shape
        (torch.uint8, torch.Size([3, 2, 2]))
    """

    random = True
    batchable = True

    def __init__(self, brightness: float = 0.0, contrast: float = 0.0, saturation: float = 0.0):
        for name, value in (
            ("brightness", brightness),
            ("contrast", contrast),
            ("saturation", saturation),
        ):
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")
        self.strengths = (float(brightness), float(contrast), float(saturation))

    def declare(self, takes: Spec) -> Spec:
        expect(self, takes, kind="tensor", dtype="uint8", layout="CHW")
        return takes

    def _factors(self, rng: np.random.Generator) -> list[float]:
        return [float(rng.uniform(max(0.0, 1 - v), 1 + v)) if v else 1.0 for v in self.strengths]

    def _jitter(self, x: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
        """``x``: N x 3 x H x W uint8; ``factors``: N x 3 (brightness, contrast, saturation)."""
        if x.dtype != torch.uint8 or x.dim() != 4 or x.shape[1] != 3:
            raise ValueError(f"ColorJitter takes uint8 3 x H x W images, got {x.dtype} {x.shape}")
        f = factors.to(device=x.device, dtype=torch.float32).view(-1, 3, 1, 1, 1)
        out = x.to(torch.float32)
        b, c, s = self.strengths
        if b:
            out = _blend(out, torch.zeros_like(out), f[:, 0])
        if c:
            gray = _gray(out).to(torch.int64)
            mean = gray.sum(dim=(-3, -2, -1), keepdim=True).to(torch.float64)
            mean = (mean / gray[0].numel()).to(torch.float32)
            out = _blend(out, mean.expand_as(out), f[:, 1])
        if s:
            out = _blend(out, _gray(out).expand_as(out), f[:, 2])
        return out.to(torch.uint8)

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        factors = torch.tensor([self._factors(active_rng())], dtype=torch.float64)
        return self._jitter(image[None], factors)[0]

    def apply_batch(self, batch: Any, rngs: Sequence[np.random.Generator] | None) -> Any:
        """Jitter a stacked batch at once, or each sample of a list."""
        assert rngs is not None
        factors = torch.tensor([self._factors(rng) for rng in rngs], dtype=torch.float64)
        if isinstance(batch, torch.Tensor):
            return self._jitter(batch, factors)
        return [self._jitter(x[None], factors[i : i + 1])[0] for i, x in enumerate(batch)]

    def __repr__(self) -> str:
        b, c, s = self.strengths
        return f"ColorJitter(brightness={b:g}, contrast={c:g}, saturation={s:g})"
