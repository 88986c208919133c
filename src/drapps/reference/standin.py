"""Stand-in data in the recipes' real formats, made from what this machine ships.

CIFAR-10 and WikiText-2 are never downloaded. For demonstrations without a local copy:

- ``cifar10``: 32x32 crops of ten scikit-image photos (astronaut, coffee, chelsea, ...), the
  photo being the class, written as CIFAR-10 binary batches (50,000 train, 10,000 test by
  default). A real, learnable classification task, though easier than CIFAR-10.
- ``wikitext2``: Debian's python3.11-doc reST sources (about 11 MB of English), split by file
  90/5/5 into ``wiki.{train,valid,test}.raw``.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from drapps._optional import require
from drapps.datasets.cifar10 import write_cifar10
from drapps.datasets.wikitext import write_wikitext

PHOTOS = (
    "astronaut",
    "coffee",
    "chelsea",
    "rocket",
    "retina",
    "hubble_deep_field",
    "immunohistochemistry",
    "colorwheel",
    "camera",
    "coins",
)
DOC_SOURCES = Path("/usr/share/doc/python3.11/html/_sources")


def _photo(name: str) -> np.ndarray:
    data = require("skimage.data")
    image = getattr(data, name)()
    if image.ndim == 2:
        image = np.repeat(image[:, :, None], 3, axis=2)
    return np.ascontiguousarray(image[:, :, :3].astype(np.uint8))


def _crops(image: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    cv2 = require("cv2")
    height, width = image.shape[:2]
    out = np.empty((count, 32, 32, 3), dtype=np.uint8)
    for i in range(count):
        size = int(rng.integers(48, max(49, min(height, width) // 2)))
        top = int(rng.integers(0, height - size + 1))
        left = int(rng.integers(0, width - size + 1))
        crop = image[top : top + size, left : left + size]
        out[i] = cv2.resize(crop, (32, 32), interpolation=cv2.INTER_AREA)
    return out


def write_cifar10_standin(
    root: str | os.PathLike[str],
    train_per_class: int = 5000,
    test_per_class: int = 1000,
    seed: int = 0,
) -> Path:
    """Write the CIFAR-10-format photo-crop stand-in under ``root``; returns the batches folder."""
    rng = np.random.default_rng(seed)
    splits = []
    for per_class in (train_per_class, test_per_class):
        images = []
        labels = []
        for label, name in enumerate(PHOTOS):
            images.append(_crops(_photo(name), per_class, rng))
            labels += [label] * per_class
        order = rng.permutation(len(labels))
        splits.append((np.concatenate(images)[order], np.asarray(labels)[order]))
    return write_cifar10(root, splits[0], splits[1], format="binary")


def write_wikitext2_standin(
    root: str | os.PathLike[str], sources: Path = DOC_SOURCES, max_bytes: int | None = None
) -> Path:
    """Write the python3.11-doc stand-in as WikiText-2 raw files under ``root``."""
    files = sorted(sources.rglob("*.txt"))
    if not files:
        raise FileNotFoundError(
            f"no .txt sources under {sources}: install Debian's python3.11-doc "
            "(apt-get install python3.11-doc)"
        )
    texts: dict[str, list[str]] = {"train": [], "valid": [], "test": []}
    size = 0
    for i, path in enumerate(files):
        split = "valid" if i % 20 == 0 else "test" if i % 20 == 1 else "train"
        text = path.read_text(encoding="utf-8", errors="replace").strip()
        texts[split].append(text)
        size += len(text)
        if max_bytes is not None and size >= max_bytes:
            break
    return write_wikitext(
        root, {split: "\n\n".join(parts) + "\n" for split, parts in texts.items()}
    )
