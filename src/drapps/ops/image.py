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
from drapps.ops.geometry import map_batch, resize_image
from drapps.ops.op import Op, Spec, expect, expect_image, stage_device
from drapps.runtime.seeding import active_rng

_IMAGE = Spec("array", "uint8", "HWC")


def decode_jpeg(data: bytes) -> np.ndarray:
    """Decode JPEG bytes to an RGB HWC uint8 array (libjpeg-turbo through simplejpeg)."""
    simplejpeg = require("simplejpeg")
    return simplejpeg.decode_jpeg(data, colorspace="RGB")


class DecodeJPEG(Op):
    """JPEG bytes -> RGB HWC uint8 array (:func:`decode_jpeg` as an op).

    Batchable: in the device stage it decodes a list of JPEGs, on the CPU with libjpeg-turbo,
    or on a CUDA device with nvJPEG when torchvision is installed (one batched call; the
    images come out as CHW uint8 tensors on the GPU, which :class:`ToCHWTensor` passes on).
    nvJPEG's pixels may differ from libjpeg-turbo's by a few levels (its IDCT and upsampling).
    """

    batchable = True

    def __init__(self) -> None:
        require("simplejpeg")  # a missing extra is named here, not at the first batch

    def declare(self, takes: Spec) -> Spec:
        expect(self, takes, kind="bytes")
        return _IMAGE

    def __call__(self, data: bytes) -> np.ndarray:
        return decode_jpeg(data)

    def apply_batch(self, batch: Any, rngs: Sequence[np.random.Generator] | None) -> Any:
        device = stage_device()
        if device is not None and device.type == "cuda" and _nvjpeg() is not None:
            data = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in batch]
            return _nvjpeg()(data, device=device)
        return [decode_jpeg(data) for data in batch]


def _nvjpeg() -> Any:
    """torchvision's ``decode_jpeg`` (batched, ``device="cuda"``: nvJPEG), or None."""
    try:
        from torchvision.io import decode_jpeg as tv_decode_jpeg
    except Exception:  # torchvision is optional (and has no CPU wheel here)
        return None
    return tv_decode_jpeg


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


class RandomResizedCrop(Op):
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

    random = True
    batchable = True

    def declare(self, takes: Spec) -> Spec:
        expect_image(self, takes)
        if takes.kind == "tensor":
            return Spec("tensor", takes.dtype, "CHW", takes.device, uniform=True)
        given = takes if takes.known else _IMAGE
        return Spec(given.kind, given.dtype, given.layout, given.device, uniform=True)

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

    def __call__(self, image: Any) -> Any:
        return self._crop(image, active_rng())

    def _crop(self, image: Any, rng: np.random.Generator) -> Any:
        if isinstance(image, torch.Tensor):
            return self._crop_tensor(image, rng)
        cv2 = require("cv2")
        top, left, h, w = self.crop_box(image.shape[0], image.shape[1], rng)
        crop = image[top : top + h, left : left + w]
        return cv2.resize(crop, (self.size, self.size), interpolation=cv2.INTER_LINEAR)

    def _crop_tensor(self, image: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
        # The tensor path resizes with resize_image (antialiased), in a worker and in the
        # batch stage alike; the array path keeps OpenCV's faster INTER_LINEAR.
        top, left, h, w = self.crop_box(image.shape[-2], image.shape[-1], rng)
        return resize_image(image[:, top : top + h, left : left + w], (self.size, self.size))

    def apply_batch(self, batch: Any, rngs: Sequence[np.random.Generator] | None) -> Any:
        """Crop and resize each sample of a list (or stacked batch): CHW tensors give a stacked
        batch, HWC arrays a list."""
        assert rngs is not None
        return map_batch(batch, lambda x, i: self._crop(x, rngs[i]), stack=True)

    def __repr__(self) -> str:
        return f"RandomResizedCrop(size={self.size}, scale={self.scale}, ratio={self.ratio})"


class RandomCrop(Op):
    """Pad by ``padding`` pixels of zeros on every side, then crop a random ``size`` x ``size``.

    The CIFAR augmentation (32x32 images, ``padding=4``).
    """

    def __init__(self, size: int, padding: int = 0) -> None:
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size!r}")
        if padding < 0:
            raise ValueError(f"padding must be >= 0, got {padding!r}")
        self.size, self.padding = size, padding

    random = True
    batchable = True

    def declare(self, takes: Spec) -> Spec:
        expect_image(self, takes)
        if takes.kind == "tensor":
            return Spec("tensor", takes.dtype, "CHW", takes.device, uniform=True)
        given = takes if takes.known else _IMAGE
        return Spec(given.kind, given.dtype, given.layout, given.device, uniform=True)

    def _box(self, height: int, width: int, rng: np.random.Generator) -> tuple[int, int]:
        if height < self.size or width < self.size:
            raise ValueError(
                f"cannot crop {self.size}x{self.size} from a padded {height}x{width} image"
            )
        top = int(rng.integers(0, height - self.size + 1))
        left = int(rng.integers(0, width - self.size + 1))
        return top, left

    def _crop_tensor(self, image: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
        p = self.padding
        if p:
            image = torch.nn.functional.pad(image, (p, p, p, p))
        top, left = self._box(image.shape[-2], image.shape[-1], rng)
        return image[..., top : top + self.size, left : left + self.size].contiguous()

    def __call__(self, image: Any) -> Any:
        return self._crop(image, active_rng())

    def _crop(self, image: Any, rng: np.random.Generator) -> Any:
        if isinstance(image, torch.Tensor):
            return self._crop_tensor(image, rng)
        p = self.padding
        if p:
            pad = ((p, p), (p, p)) + ((0, 0),) * (image.ndim - 2)
            image = np.pad(image, pad)
        top, left = self._box(image.shape[0], image.shape[1], rng)
        return image[top : top + self.size, left : left + self.size]

    def apply_batch(self, batch: Any, rngs: Sequence[np.random.Generator] | None) -> Any:
        """Pad and crop each sample of a list (or stacked batch): CHW tensors give a stacked
        batch, HWC arrays a list."""
        assert rngs is not None
        return map_batch(batch, lambda x, i: self._crop(x, rngs[i]), stack=True)

    def __repr__(self) -> str:
        return f"RandomCrop(size={self.size}, padding={self.padding})"


class RandomHorizontalFlip(Op):
    """Mirror left-right with probability ``p``: an HWC array, or a CHW tensor (batchable)."""

    random = True
    batchable = True

    def __init__(self, p: float = 0.5) -> None:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"p must be in [0, 1], got {p!r}")
        self.p = p

    def declare(self, takes: Spec) -> Spec:
        expect_image(self, takes)
        return takes

    def __call__(self, image: Any) -> Any:
        if active_rng().random() >= self.p:
            return image
        return _mirror(image)

    def apply_batch(self, batch: Any, rngs: Sequence[np.random.Generator] | None) -> Any:
        """Flip the chosen samples of an NCHW batch, on the batch's device."""
        assert rngs is not None
        chosen = [k for k, rng in enumerate(rngs) if rng.random() < self.p]
        if not isinstance(batch, torch.Tensor):  # a list of differently sized samples
            picked = set(chosen)
            return map_batch(batch, lambda x, i: _mirror(x) if i in picked else x, stack=False)
        if not chosen:
            return batch
        index = torch.tensor(chosen, device=batch.device)
        out = batch.clone()
        out[index] = batch[index].flip(-1)
        return out

    def __repr__(self) -> str:
        return f"RandomHorizontalFlip(p={self.p})"


def _mirror(image: Any) -> Any:
    return image.flip(-1) if isinstance(image, torch.Tensor) else image[:, ::-1]


class ToCHWTensor(Op):
    """HWC uint8 array -> contiguous CHW uint8 tensor (what default_collate stacks).

    Batchable on a list of arrays (a split before it); CHW tensors in such a list (what
    nvJPEG decoding gives in a CUDA device stage) pass through.
    """

    batchable = True

    def declare(self, takes: Spec) -> Spec:
        expect(self, takes, kind="array", layouts=("HWC", "HW"))
        return Spec("tensor", takes.dtype or "uint8", "CHW", uniform=takes.uniform)

    def __call__(self, image: np.ndarray) -> torch.Tensor:
        if image.ndim == 2:
            image = image[:, :, None]
        return torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1)))

    def apply_batch(self, batch: Any, rngs: Sequence[np.random.Generator] | None) -> Any:
        device = stage_device()

        def convert(image: Any, _: int) -> torch.Tensor:
            if isinstance(image, torch.Tensor):
                return image
            tensor = self(image)
            return tensor if device is None else tensor.to(device, non_blocking=True)

        return map_batch(batch, convert, stack=False)

    def __repr__(self) -> str:
        return "ToCHWTensor()"


class Normalize(Op):
    """CHW tensor -> float32 ``(x * scale - mean) / std`` per channel (batchable: belongs after
    the reorder buffer, where uint8 has crossed processes at a quarter of float32's bytes).

    Args:
        mean, std: per channel (one value each applies to every channel).
        scale: applied first; the default maps uint8 to [0, 1].
    """

    batchable = True

    def __init__(self, mean: Sequence[float], std: Sequence[float], scale: float = 1 / 255) -> None:
        if len(mean) != len(std) or not mean:
            raise ValueError(f"mean and std need the same length >= 1, got {mean!r}, {std!r}")
        if any(s <= 0 for s in std):
            raise ValueError(f"std must be > 0, got {std!r}")
        self.mean, self.std, self.scale = tuple(mean), tuple(std), scale

    def declare(self, takes: Spec) -> Spec:
        expect(self, takes, kind="tensor", layout="CHW")
        return Spec("tensor", "float32", "CHW", takes.device, uniform=takes.uniform)

    def _apply(self, x: torch.Tensor) -> torch.Tensor:
        shape = (len(self.mean), 1, 1)
        mean = torch.tensor(self.mean, dtype=torch.float32, device=x.device).view(shape)
        std = torch.tensor(self.std, dtype=torch.float32, device=x.device).view(shape)
        return (x.to(torch.float32) * self.scale - mean) / std

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        return self._apply(image)

    def apply_batch(self, batch: Any, rngs: Sequence[np.random.Generator] | None) -> Any:
        if isinstance(batch, torch.Tensor):
            return self._apply(batch)
        return map_batch(batch, lambda x, _: self._apply(x), stack=False)

    def __repr__(self) -> str:
        return f"Normalize(mean={self.mean}, std={self.std}, scale={self.scale:g})"
