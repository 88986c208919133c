"""``jpeg`` / ``jpeg-75``: uint8 images re-encoded as JPEG at a quality (lossy).

Takes HWC (1 or 3 channels), CHW (a tensor's layout) and HW uint8 arrays; anything else is
declined and stored by the cache's lossless fallback. Chroma is kept at full resolution (4:4:4)
so that colour edges survive.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from drapps._optional import require
from drapps.cache.codec import Codec, Encoded


def image_layout(array: np.ndarray) -> str | None:
    """ "HWC", "CHW" or "HW" for a uint8 image array, None for anything else."""
    if array.dtype != np.uint8:
        return None
    if array.ndim == 2 and min(array.shape) >= 8:
        return "HW"
    if array.ndim == 3 and array.shape[2] in (1, 3) and min(array.shape[:2]) >= 8:
        return "HWC"
    if array.ndim == 3 and array.shape[0] in (1, 3) and min(array.shape[1:]) >= 8:
        return "CHW"
    return None


def to_hwc(array: np.ndarray, layout: str) -> np.ndarray:
    if layout == "HW":
        return array[:, :, None]
    if layout == "CHW":
        return np.ascontiguousarray(array.transpose(1, 2, 0))
    return np.ascontiguousarray(array)


def from_hwc(image: np.ndarray, layout: str) -> np.ndarray:
    if layout == "HW":
        return image[:, :, 0]
    if layout == "CHW":
        return np.ascontiguousarray(image.transpose(2, 0, 1))
    return image


class Jpeg(Codec):
    """JPEG at ``quality`` (1-100), via simplejpeg (libjpeg-turbo)."""

    lossy = True

    def __init__(self, quality: int = 90) -> None:
        if not 1 <= quality <= 100:
            raise ValueError(f"jpeg quality must be in 1..100, got {quality!r}")
        self.quality = quality
        self.name = "jpeg" if quality == 90 else f"jpeg-{quality}"  # type: ignore[misc]

    def encode(self, array: np.ndarray) -> Encoded | None:
        layout = image_layout(array)
        if layout is None:
            return None
        simplejpeg = require("simplejpeg")
        image = to_hwc(array, layout)
        colorspace = "GRAY" if image.shape[2] == 1 else "RGB"
        data = simplejpeg.encode_jpeg(
            image, quality=self.quality, colorspace=colorspace, colorsubsampling="444"
        )
        return Encoded(data, {"layout": layout}, exact=False)

    def decode(
        self, payload: memoryview, meta: dict[str, Any], dtype: np.dtype, shape: tuple[int, ...]
    ) -> np.ndarray:
        simplejpeg = require("simplejpeg")
        gray = (shape[0] if meta["layout"] == "CHW" else shape[-1]) == 1 or meta["layout"] == "HW"
        image = simplejpeg.decode_jpeg(bytes(payload), colorspace="GRAY" if gray else "RGB")
        return from_hwc(image, meta["layout"]).reshape(shape)
