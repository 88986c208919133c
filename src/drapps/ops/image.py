"""Image ops on HWC uint8 NumPy arrays, the ImageNet-style training pipeline's pieces.

Random parameters come from :func:`drapps.sample_rng` inside a loader sample, so the pipeline is
deterministic per (seed, epoch, index); used elsewhere (e.g. under torch's DataLoader) they fall
back to a per-process generator. Outputs stay uint8: normalising to float belongs after the
batch crosses processes, where it costs a quarter of the bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from drapps._optional import require
from drapps.runtime.seeding import active_rng


def decode_jpeg(data: bytes) -> np.ndarray:
    """Decode JPEG bytes to an RGB HWC uint8 array (libjpeg-turbo through simplejpeg)."""
    simplejpeg = require("simplejpeg")
    return simplejpeg.decode_jpeg(data, colorspace="RGB")


class Compose:
    """Apply ops in order."""

    def __init__(self, ops: Sequence[Callable[[Any], Any]]) -> None:
        if not all(callable(op) for op in ops):
            raise ValueError(f"every op must be callable, got {list(ops)!r}")
        self.ops = list(ops)

    def __call__(self, x: Any) -> Any:
        for op in self.ops:
            x = op(x)
        return x

    def __repr__(self) -> str:
        return f"Compose({self.ops!r})"


class RandomResizedCrop:
    """Crop a random area and aspect ratio, then resize to ``size`` x ``size``.

    Same sampling as torchvision's RandomResizedCrop: 10 tries of (scale, log-uniform ratio),
    then a central crop clamped to the ratio bounds.
    """

    def __init__(
        self,
        size: int,
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
    ) -> None:
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"size must be an int >= 1, got {size!r}")
        if not 0 < scale[0] <= scale[1] <= 1:
            raise ValueError(f"scale must satisfy 0 < min <= max <= 1, got {scale!r}")
        if not 0 < ratio[0] <= ratio[1]:
            raise ValueError(f"ratio must satisfy 0 < min <= max, got {ratio!r}")
        self.size, self.scale, self.ratio = size, scale, ratio

    def crop_box(self, height: int, width: int, rng: np.random.Generator) -> tuple[int, ...]:
        area = height * width
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            target = area * rng.uniform(*self.scale)
            aspect = math.exp(rng.uniform(*log_ratio))
            w = round(math.sqrt(target * aspect))
            h = round(math.sqrt(target / aspect))
            if 0 < w <= width and 0 < h <= height:
                top = int(rng.integers(0, height - h + 1))
                left = int(rng.integers(0, width - w + 1))
                return top, left, h, w
        in_ratio = width / height
        if in_ratio < self.ratio[0]:
            w, h = width, round(width / self.ratio[0])
        elif in_ratio > self.ratio[1]:
            h, w = height, round(height * self.ratio[1])
        else:
            w, h = width, height
        return (height - h) // 2, (width - w) // 2, h, w

    def __call__(self, image: np.ndarray) -> np.ndarray:
        cv2 = require("cv2")
        top, left, h, w = self.crop_box(image.shape[0], image.shape[1], active_rng())
        crop = image[top : top + h, left : left + w]
        return cv2.resize(crop, (self.size, self.size), interpolation=cv2.INTER_LINEAR)

    def __repr__(self) -> str:
        return f"RandomResizedCrop(size={self.size}, scale={self.scale}, ratio={self.ratio})"


class RandomCrop:
    """Pad by ``padding`` pixels of zeros on every side, then crop a random ``size`` x ``size``.

    The CIFAR augmentation (32x32 images, ``padding=4``).
    """

    def __init__(self, size: int, padding: int = 0) -> None:
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size!r}")
        if padding < 0:
            raise ValueError(f"padding must be >= 0, got {padding!r}")
        self.size, self.padding = size, padding

    def __call__(self, image: np.ndarray) -> np.ndarray:
        p = self.padding
        if p:
            pad = ((p, p), (p, p)) + ((0, 0),) * (image.ndim - 2)
            image = np.pad(image, pad)
        height, width = image.shape[:2]
        if height < self.size or width < self.size:
            raise ValueError(
                f"cannot crop {self.size}x{self.size} from a padded {height}x{width} image"
            )
        rng = active_rng()
        top = int(rng.integers(0, height - self.size + 1))
        left = int(rng.integers(0, width - self.size + 1))
        return image[top : top + self.size, left : left + self.size]

    def __repr__(self) -> str:
        return f"RandomCrop(size={self.size}, padding={self.padding})"


class RandomHorizontalFlip:
    """Mirror left-right with probability ``p``."""

    def __init__(self, p: float = 0.5) -> None:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"p must be in [0, 1], got {p!r}")
        self.p = p

    def __call__(self, image: np.ndarray) -> np.ndarray:
        return image[:, ::-1] if active_rng().random() < self.p else image

    def __repr__(self) -> str:
        return f"RandomHorizontalFlip(p={self.p})"


class ToCHWTensor:
    """HWC uint8 array -> contiguous CHW uint8 tensor (what default_collate stacks)."""

    def __call__(self, image: np.ndarray) -> torch.Tensor:
        if image.ndim == 2:
            image = image[:, :, None]
        return torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1)))

    def __repr__(self) -> str:
        return "ToCHWTensor()"
