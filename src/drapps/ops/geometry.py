"""Resizing and cropping CHW image tensors, one sample or a batch, on any device.

:func:`resize_image` is the one interpolation every tensor op uses (bilinear with antialiasing,
as torchvision's ``v2.Resize`` does by default), so a resize gives the same pixels in a worker
and in the batch stage on the same device. On the CPU a uint8 image goes through torch's uint8
kernel; elsewhere it is resized in float32 and rounded back, which may differ from the CPU
result by one intensity level (two at most, measured on CUDA; see ``docs/device.md``).

A batch is a stacked ``N x C x H x W`` tensor, or a list of ``C x H x W`` tensors when the
samples differ in size (a split before the op that makes them uniform, see
:class:`~drapps.ops.pipeline.Pipeline`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from drapps.ops.op import Op, Spec, expect_image

Size = tuple[int, int]


def resize_image(image: torch.Tensor, size: Size) -> torch.Tensor:
    """A ``C x H x W`` tensor resized to ``size`` (height, width): bilinear, antialiased.

    Returns a contiguous tensor of the input's dtype, on the input's device.
    """
    if tuple(image.shape[-2:]) == tuple(size):
        return image.contiguous()
    if image.dtype == torch.uint8 and image.device.type == "cpu":
        # torch's uint8 path is fastest (and exact to itself) on a channels-last view.
        x = image[None].contiguous(memory_format=torch.channels_last)
        out = F.interpolate(x, size=size, mode="bilinear", antialias=True, align_corners=False)
        return out[0].contiguous()
    x = image[None].to(torch.float32)
    out = F.interpolate(x, size=size, mode="bilinear", antialias=True, align_corners=False)[0]
    if image.dtype.is_floating_point:
        return out.to(image.dtype)
    info = torch.iinfo(image.dtype)
    return out.round_().clamp_(info.min, info.max).to(image.dtype)


def per_sample(batch: Any) -> list[Any]:
    """The samples of a stacked batch, or of a list (tensors, arrays or bytes).

    Raises:
        ValueError: ``batch`` is neither.
    """
    if isinstance(batch, torch.Tensor) and batch.dim() >= 1:
        return list(batch.unbind(0))
    if isinstance(batch, list | tuple):
        return list(batch)
    raise ValueError(f"a batch op needs a stacked tensor or a list, got {type(batch).__name__}")


def map_batch(batch: Any, fn: Callable[[Any, int], Any], *, stack: bool) -> Any:
    """``fn(sample, i)`` on each sample. ``stack``: the results are tensors of one shape,
    return them stacked; otherwise return the kind of batch given (stacked stays stacked)."""
    out = [fn(sample, i) for i, sample in enumerate(per_sample(batch))]
    tensors = all(isinstance(x, torch.Tensor) for x in out)
    if out and tensors and (stack or isinstance(batch, torch.Tensor)):
        return torch.stack(out)
    return out


def target_size(size: int | Sequence[int], name: str = "size") -> Size:
    """``size`` as (height, width): an int is a square.

    Raises:
        ValueError: not an int >= 1 or a pair of them.
    """
    if isinstance(size, int) and not isinstance(size, bool) and size >= 1:
        return size, size
    if (
        isinstance(size, Sequence)
        and len(size) == 2
        and all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in size)
    ):
        return int(size[0]), int(size[1])
    raise ValueError(f"{name} must be an int >= 1 or a (height, width) pair of them, got {size!r}")


class Resize(Op):
    """Resize a CHW tensor (or an HWC array) to ``size`` (height, width): bilinear, antialiased.

    Deterministic, so a sample cache may keep its output; batchable, so it may also run in
    the batch stage (on a list of differently sized images, giving a stacked batch).
    """

    batchable = True

    def __init__(self, size: int | Sequence[int]) -> None:
        self.size = target_size(size)

    def declare(self, takes: Spec) -> Spec:
        expect_image(self, takes)
        return Spec(takes.kind, takes.dtype, takes.layout, takes.device, uniform=True)

    def __call__(self, image: Any) -> Any:
        if isinstance(image, torch.Tensor):
            return resize_image(image, self.size)
        resized = _as_hwc(resize_image(_as_chw(image), self.size))
        return resized if image.ndim == 3 else resized[:, :, 0]

    def apply_batch(self, batch: Any, rngs: Sequence[np.random.Generator] | None) -> Any:
        return map_batch(batch, lambda x, _: self(x), stack=True)

    def __repr__(self) -> str:
        return f"Resize(size={self.size})"


class CenterCrop(Op):
    """The central ``size`` (height, width) of a CHW tensor or an HWC array (batchable).

    Raises (when applied):
        ValueError: the image is smaller than ``size``.
    """

    batchable = True

    def __init__(self, size: int | Sequence[int]) -> None:
        self.size = target_size(size)

    def declare(self, takes: Spec) -> Spec:
        expect_image(self, takes)
        return Spec(takes.kind, takes.dtype, takes.layout, takes.device, uniform=True)

    def _box(self, height: int, width: int) -> tuple[int, int]:
        h, w = self.size
        if height < h or width < w:
            raise ValueError(f"cannot center-crop {h}x{w} from a {height}x{width} image")
        return (height - h) // 2, (width - w) // 2

    def __call__(self, image: Any) -> Any:
        h, w = self.size
        if isinstance(image, torch.Tensor):
            top, left = self._box(image.shape[-2], image.shape[-1])
            return image[..., top : top + h, left : left + w].contiguous()
        top, left = self._box(image.shape[0], image.shape[1])
        return np.ascontiguousarray(image[top : top + h, left : left + w])

    def apply_batch(self, batch: Any, rngs: Sequence[np.random.Generator] | None) -> Any:
        return map_batch(batch, lambda x, _: self(x), stack=True)

    def __repr__(self) -> str:
        return f"CenterCrop(size={self.size})"


def _as_chw(image: np.ndarray) -> torch.Tensor:
    array = image if image.ndim == 3 else image[:, :, None]
    return torch.from_numpy(np.ascontiguousarray(array)).permute(2, 0, 1)


def _as_hwc(image: torch.Tensor) -> np.ndarray:
    return image.permute(1, 2, 0).contiguous().numpy()
