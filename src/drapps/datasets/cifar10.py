"""CIFAR-10 from a local copy, in either of its published formats.

- python: ``cifar-10-batches-py/{data_batch_1..5,test_batch}``, each a pickled dict with
  ``b"data"`` (N x 3072 uint8, channel-major 32x32 planes) and ``b"labels"``.
- binary: ``cifar-10-batches-bin/{data_batch_1..5,test_batch}.bin``, records of one label byte
  followed by the same 3072 bytes.

Nothing is downloaded: point ``root`` at the extracted folder (or its parent).
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

CLASSES = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)
_RECORD = 1 + 3 * 32 * 32
_TRAIN = [f"data_batch_{i}" for i in range(1, 6)]
_TEST = ["test_batch"]


def _find(root: Path) -> tuple[Path, Literal["python", "binary"]]:
    for folder in (root, root / "cifar-10-batches-py", root / "cifar-10-batches-bin"):
        if (folder / "data_batch_1").is_file() or (folder / "test_batch").is_file():
            return folder, "python"
        if (folder / "data_batch_1.bin").is_file() or (folder / "test_batch.bin").is_file():
            return folder, "binary"
    raise FileNotFoundError(
        f"no CIFAR-10 batches under {root}: expected cifar-10-batches-py/data_batch_1 "
        "(python format) or cifar-10-batches-bin/data_batch_1.bin (binary format)"
    )


# What a CIFAR-10 python batch holds besides dicts, lists, bytes, strings and numbers: NumPy
# arrays (the published files store ``data`` as one), rebuilt through these names only.
_ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.numeric", "_frombuffer"),  # pickle protocol 5
    ("numpy._core.numeric", "_frombuffer"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("_codecs", "encode"),  # how Python 3 writes bytes at pickle protocol 2
}


class _BatchUnpickler(pickle.Unpickler):
    """Admits only what the CIFAR-10 python format holds: a crafted file cannot run code."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"a CIFAR-10 batch holds dicts, lists, bytes, numbers and NumPy arrays; this file "
            f"asks for {module}.{name}, which is refused"
        )


def _read_python(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with open(path, "rb") as file:
        try:
            batch = _BatchUnpickler(file, encoding="bytes").load()
        except (pickle.UnpicklingError, EOFError, ValueError) as exc:
            raise ValueError(f"{path} is not a CIFAR-10 python batch: {exc}") from exc
    try:
        data = np.asarray(batch[b"data"], dtype=np.uint8)
        labels = np.asarray(batch[b"labels"], dtype=np.int64)
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{path} is not a CIFAR-10 python batch (no data/labels)") from exc
    if data.ndim != 2 or data.shape[1] != 3072 or len(labels) != len(data):
        raise ValueError(f"{path}: expected N x 3072 data and N labels, got {data.shape}")
    return data.reshape(-1, 3, 32, 32), labels


def _read_binary(path: Path) -> tuple[np.ndarray, np.ndarray]:
    raw = np.fromfile(path, dtype=np.uint8)
    if raw.size % _RECORD:
        raise ValueError(
            f"{path} has {raw.size} bytes, not a whole number of {_RECORD}-byte CIFAR-10 records"
        )
    records = raw.reshape(-1, _RECORD)
    return records[:, 1:].reshape(-1, 3, 32, 32), records[:, 0].astype(np.int64)


class CIFAR10:
    """The CIFAR-10 train (50,000) or test (10,000) split as ``(HWC uint8 image, label)`` pairs.

    Args:
        root: the extracted ``cifar-10-batches-py`` / ``-bin`` folder or its parent.
        train: the five training batches, or the test batch.
        transform: applied to each HWC uint8 image (e.g. ``RandomCrop(32, 4)``, a flip and
            ``ToCHWTensor``).
        target_transform: applied to each label.
        download: accepted for torchvision's signature; nothing is downloaded, and without the
            files the error says so.

    Attributes:
        images: the N x 32 x 32 x 3 uint8 images (``data`` is the same array, as in
            torchvision); ``labels``: their labels (``targets``, a list of ints).
        classes: the ten class names; ``class_to_idx`` each one's label.

    Example:
        >>> import tempfile, numpy as np
        >>> scratch = tempfile.TemporaryDirectory()
        >>> images = np.zeros((5, 3, 32, 32), np.uint8)  # five training batches of one
        >>> root = write_cifar10(scratch.name, (images, range(5)), (images[:2], [3, 4]))
        >>> ds = CIFAR10(root, train=False)  # or the folder of the published files
        >>> image, label = ds[1]
        >>> image.shape, label
        ((32, 32, 3), 4)
        >>> scratch.cleanup()
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        train: bool = True,
        transform: Callable[[np.ndarray], Any] | None = None,
        target_transform: Callable[[int], Any] | None = None,
        download: bool = False,
    ) -> None:
        try:
            folder, self.format = _find(Path(root))
        except FileNotFoundError as exc:
            if download:
                raise FileNotFoundError(
                    f"{exc}; drapps downloads nothing (download=True): extract the published "
                    "archive there first"
                ) from None
            raise
        names = _TRAIN if train else _TEST
        suffix = ".bin" if self.format == "binary" else ""
        read = _read_binary if self.format == "binary" else _read_python
        images, labels = [], []
        for name in names:
            path = folder / f"{name}{suffix}"
            if not path.is_file():
                raise FileNotFoundError(f"missing CIFAR-10 batch {path}")
            data, label = read(path)
            images.append(data)
            labels.append(label)
        # HWC, the layout the image ops take; one contiguous array, shared by forked workers.
        self.images = np.ascontiguousarray(np.concatenate(images).transpose(0, 2, 3, 1))
        self.labels = np.concatenate(labels)
        if self.labels.size and not 0 <= int(self.labels.min()) <= int(self.labels.max()) <= 9:
            raise ValueError(f"CIFAR-10 labels must be 0..9, found {self.labels.max()}")
        self.data, self.targets = self.images, self.labels.tolist()
        self.classes = list(CLASSES)
        self.class_to_idx = {name: label for label, name in enumerate(CLASSES)}
        self.transform = transform
        self.target_transform = target_transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        image: Any = self.images[index]
        if self.transform is not None:
            image = self.transform(image)
        label = int(self.labels[index])
        if self.target_transform is not None:
            return image, self.target_transform(label)
        return image, label


def write_cifar10(
    root: str | os.PathLike[str],
    train: tuple[np.ndarray, Sequence[int] | np.ndarray],
    test: tuple[np.ndarray, Sequence[int] | np.ndarray],
    format: Literal["python", "binary"] = "binary",
) -> Path:
    """Write NCHW (or NHWC) uint8 32x32 images and labels as CIFAR-10 batch files.

    The training set is split over five batches as in the original. Returns the batches folder.
    """
    if format not in ("python", "binary"):
        raise ValueError(f"format must be 'python' or 'binary', got {format!r}")
    folder = Path(root) / f"cifar-10-batches-{'py' if format == 'python' else 'bin'}"
    folder.mkdir(parents=True, exist_ok=True)
    parts: list[tuple[str, np.ndarray, np.ndarray]] = []
    for names, (images, labels) in ((_TRAIN, train), (_TEST, test)):
        images = np.asarray(images, dtype=np.uint8)
        if images.ndim == 4 and images.shape[-1] == 3 and images.shape[1] != 3:
            images = images.transpose(0, 3, 1, 2)
        if images.shape[1:] != (3, 32, 32):
            raise ValueError(f"images must be N x 3 x 32 x 32 uint8, got {images.shape}")
        label_array: np.ndarray = np.asarray(labels, dtype=np.int64)
        for name, chunk in zip(
            names, np.array_split(np.arange(len(images)), len(names)), strict=True
        ):
            parts.append((name, images[chunk], label_array[chunk]))
    for name, part_images, part_labels in parts:
        flat = part_images.reshape(len(part_images), -1)
        if format == "python":
            batch = {b"data": flat, b"labels": part_labels.tolist(), b"batch_label": name.encode()}
            with open(folder / name, "wb") as file:
                pickle.dump(batch, file)
        else:
            records = np.concatenate([part_labels.astype(np.uint8)[:, None], flat], axis=1)
            records.tofile(folder / f"{name}.bin")
    return folder
