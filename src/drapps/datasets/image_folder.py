"""ImageFolder: ``root/<class>/<image>.jpg`` -> (transformed image, class index)."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from typing import Any

from drapps._optional import require
from drapps.datasets._fingerprint import file_fingerprint
from drapps.datasets.read_ahead import ReadAhead
from drapps.ops.image import decode_jpeg

IMAGE_EXTENSIONS = (".jpg", ".jpeg")


class ImageFolder:
    """The torchvision ImageFolder layout, decoding JPEGs with libjpeg-turbo.

    Attributes:
        classes: sorted class folder names; a sample's target is its index here.
        samples: ``(path, target)`` per sample, in sorted order (also used to name a
            failing sample's file in loader errors).

    Args:
        root: the folder of class folders.
        transform: applied to each decoded image.
        decode: JPEG bytes -> image (HWC uint8 RGB by default).
        read: path -> bytes; a plain file read by default (the benchmark passes a throttled
            one to model slow storage). Called from several threads when reading ahead.
        read_threads: files read at once ahead of their samples when a drapps worker hints
            its next indices (:meth:`read_ahead`); 0 reads each file only when its sample is
            asked for.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        transform: Callable[[Any], Any] | None = None,
        decode: Callable[[bytes], Any] = decode_jpeg,
        read: Callable[[str], bytes] | None = None,
        read_threads: int = 4,
    ) -> None:
        if decode is decode_jpeg:
            require("simplejpeg")  # a missing extra is named here, not at the first batch
        self.root = os.fspath(root)
        if not os.path.isdir(self.root):
            raise ValueError(f"root must be a directory of class folders, got {self.root!r}")
        self.classes = sorted(e.name for e in os.scandir(self.root) if e.is_dir())
        self.samples: list[tuple[str, int]] = []
        for target, name in enumerate(self.classes):
            folder = os.path.join(self.root, name)
            for file in sorted(os.listdir(folder)):
                if file.lower().endswith(IMAGE_EXTENSIONS):
                    self.samples.append((os.path.join(folder, file), target))
        if not self.samples:
            raise ValueError(f"found no {'/'.join(IMAGE_EXTENSIONS)} files under {self.root!r}")
        if not isinstance(read_threads, int) or read_threads < 0:
            raise ValueError(f"read_threads must be an int >= 0, got {read_threads!r}")
        self.transform = transform
        self.decode = decode
        self.read = read
        self.read_threads = read_threads
        reader = functools.partial(_read_file, read)  # not a bound method: no cycle via threads
        self._reads = ReadAhead(reader, threads=read_threads) if read_threads else None

    def __len__(self) -> int:
        return len(self.samples)

    def cache_fingerprint(self) -> str | None:
        """Identity for the sample cache: the files (path, size, mtime) and the decoder; None
        with a ``transform`` (it may draw randomness, so samples must not be kept)."""
        if self.transform is not None:
            return None
        return file_fingerprint([path for path, _ in self.samples], self.decode)

    def read_ahead(self, indices: Sequence[int]) -> None:
        """Start reading the files of ``indices``, in this order, in background threads (a
        hint: drapps' workers give each task's indices, and those of the task queued behind
        it, before making them)."""
        if self._reads is not None:
            self._reads.hint([self.samples[index][0] for index in indices])

    def close(self) -> None:
        """Stop the read-ahead threads (a later hint starts them again)."""
        if self._reads is not None:
            self._reads.close()

    def __getitem__(self, index: int) -> tuple[Any, int]:
        path, target = self.samples[index]
        data = self._reads.take(path) if self._reads is not None else _read_file(self.read, path)
        image = self.decode(data)
        if self.transform is not None:
            image = self.transform(image)
        return image, target


def _read_file(read: Callable[[str], bytes] | None, path: str) -> bytes:
    if read is not None:
        return read(path)
    with open(path, "rb") as file:
        return file.read()
