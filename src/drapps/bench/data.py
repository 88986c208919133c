"""Benchmark data made locally: an ImageFolder tree of JPEGs from scikit-image's bundled photos."""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path

import numpy as np

from drapps._optional import require

logger = logging.getLogger(__name__)

# Colour photos scikit-image ships inside its wheel (no download); one class each.
PHOTOS = (
    "astronaut",
    "chelsea",
    "coffee",
    "colorwheel",
    "hubble_deep_field",
    "immunohistochemistry",
    "retina",
    "rocket",
    "cat",
)
_FORMAT_VERSION = 1


def default_data_dir() -> Path:
    """``$DRAPPS_DATA_DIR`` or ``~/.cache/drapps``."""
    return Path(os.environ.get("DRAPPS_DATA_DIR", Path.home() / ".cache" / "drapps"))


def _augment(photo: np.ndarray, size: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    """A random scale, rotation and crop of ``photo`` at ``size`` = (width, height)."""
    cv2 = require("cv2")
    width, height = size
    scale = rng.uniform(0.6, 1.4) * max(width / photo.shape[1], height / photo.shape[0]) * 1.2
    angle = rng.uniform(-20, 20)
    center = (photo.shape[1] / 2, photo.shape[0] / 2)
    matrix = cv2.getRotationMatrix2D(center, angle, scale)
    out_w = math.ceil(photo.shape[1] * scale)
    out_h = math.ceil(photo.shape[0] * scale)
    matrix[0, 2] += out_w / 2 - center[0]
    matrix[1, 2] += out_h / 2 - center[1]
    warped = cv2.warpAffine(photo, matrix, (out_w, out_h), borderMode=cv2.BORDER_REFLECT)
    top = int(rng.integers(0, max(1, out_h - height + 1)))
    left = int(rng.integers(0, max(1, out_w - width + 1)))
    crop = warped[top : top + height, left : left + width]
    if crop.shape[:2] != (height, width):
        crop = cv2.resize(crop, (width, height))
    return np.ascontiguousarray(crop)


def make_jpeg_folder(
    root: str | os.PathLike[str],
    num_images: int,
    size: tuple[int, int] = (500, 400),
    quality: int = 90,
    seed: int = 0,
    large: tuple[float, tuple[int, int]] | None = None,
) -> Path:
    """Write ``num_images`` JPEGs under ``root/<photo>/`` once; later calls reuse them.

    Args:
        large: (share, size): that share of the photos, drawn at random, at that size instead
            (a few multi-megapixel photos among ImageNet-sized ones).

    Returns:
        The dataset folder (``root/jpeg-<n>-<w>x<h>-q<quality>-s<seed>-v1``, with
        ``-L<share>-<w>x<h>`` before the version when ``large`` is given).
    """
    if num_images < 1:
        raise ValueError(f"num_images must be >= 1, got {num_images!r}")
    if large is not None and not 0 < large[0] < 1:
        raise ValueError(f"large's share must be in (0, 1), got {large[0]!r}")
    skimage_data = require("skimage.data")
    simplejpeg = require("simplejpeg")
    mixed = "" if large is None else f"-L{large[0]:g}-{large[1][0]}x{large[1][1]}"
    folder = Path(root) / (
        f"jpeg-{num_images}-{size[0]}x{size[1]}-q{quality}-s{seed}{mixed}-v{_FORMAT_VERSION}"
    )
    done = folder / ".complete"
    if done.exists():
        return folder
    logger.info("writing %d JPEGs to %s", num_images, folder)
    rng = np.random.default_rng(seed)
    photos = {}
    for name in PHOTOS:
        image = getattr(skimage_data, name)()
        photos[name] = np.ascontiguousarray(image[..., :3])
    for i in range(num_images):
        name = PHOTOS[i % len(PHOTOS)]
        (folder / name).mkdir(parents=True, exist_ok=True)
        big = large is not None and rng.random() < large[0]
        image = _augment(photos[name], large[1] if big and large else size, rng)
        data = simplejpeg.encode_jpeg(image, quality=quality, colorspace="RGB")
        (folder / name / f"{i:06d}.jpg").write_bytes(data)
    done.touch()
    return folder
