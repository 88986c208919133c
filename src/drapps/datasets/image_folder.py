"""ImageFolder: ``root/<class>/.../<image>.jpg`` -> (transformed image, class index)."""

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

    As torchvision's: each folder under ``root`` is a class, and its images are the files
    anywhere under it (sub-folders and links to folders included) whose names end with one of
    ``extensions``, in sorted order. A class folder without one is an error unless
    ``allow_empty``.

    Attributes:
        classes: sorted class folder names; a sample's target is its index here.
        class_to_idx: each class name's index.
        samples: ``(path, target)`` per sample, in sorted order (also used to name a
            failing sample's file in loader errors); ``imgs`` is the same list.
        targets: each sample's target.

    Args:
        root: the folder of class folders.
        transform: applied to each decoded image.
        target_transform: applied to each sample's class index.
        decode: JPEG bytes -> image (HWC uint8 RGB by default).
        read: path -> bytes; a plain file read by default (the benchmark passes a throttled
            one to model slow storage). Called from several threads when reading ahead.
        read_threads: files read at once ahead of their samples when a drapps worker hints
            its next indices (:meth:`read_ahead`); 0 reads each file only when its sample is
            asked for.
        extensions: the file name endings that are images, in any case (``.jpg`` and
            ``.jpeg`` by default; give others with a ``decode`` that reads them).
        is_valid_file: path -> whether it is an image, in the place of ``extensions``.
        allow_empty: keep a class folder without images (its index stays taken).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        transform: Callable[[Any], Any] | None = None,
        decode: Callable[[bytes], Any] = decode_jpeg,
        read: Callable[[str], bytes] | None = None,
        read_threads: int = 4,
        extensions: str | Sequence[str] | None = None,
        allow_empty: bool = False,
        target_transform: Callable[[int], Any] | None = None,
        is_valid_file: Callable[[str], bool] | None = None,
    ) -> None:
        if decode is decode_jpeg:
            require("simplejpeg")  # a missing extra is named here, not at the first batch
        if not isinstance(read_threads, int) or read_threads < 0:
            raise ValueError(f"read_threads must be an int >= 0, got {read_threads!r}")
        if is_valid_file is not None and extensions is not None:
            raise ValueError("give extensions or is_valid_file, not both")
        if is_valid_file is not None and not callable(is_valid_file):
            raise TypeError(f"is_valid_file must be a callable path -> bool, got {is_valid_file!r}")
        endings = _endings(IMAGE_EXTENSIONS if extensions is None else extensions)
        wanted = "valid" if is_valid_file is not None else "/".join(endings)
        is_image = is_valid_file or functools.partial(_ends_with, endings)
        self.root = os.fspath(root)
        if not os.path.isdir(self.root):
            kind = NotADirectoryError if os.path.exists(self.root) else FileNotFoundError
            raise kind(f"root must be a directory of class folders, got {self.root!r}")
        self.classes = sorted(e.name for e in os.scandir(self.root) if e.is_dir())
        if not self.classes:
            raise FileNotFoundError(f"found no class folder in {self.root!r}")
        self.class_to_idx = {name: target for target, name in enumerate(self.classes)}
        self.samples: list[tuple[str, int]] = []
        empty = []
        for target, name in enumerate(self.classes):
            found = _images(os.path.join(self.root, name), is_image)
            self.samples.extend((path, target) for path in found)
            if not found:
                empty.append(name)
        if empty and not allow_empty:
            raise FileNotFoundError(
                f"found no {wanted} file in the class folder(s) {', '.join(empty)} "
                f"under {self.root!r} (allow_empty=True keeps such a class)"
            )
        self.imgs = self.samples
        self.targets = [target for _, target in self.samples]
        self.transform = transform
        self.target_transform = target_transform
        self.decode = decode
        self.read = read
        self.read_threads = read_threads
        reader = functools.partial(_read_file, read)  # not a bound method: no cycle via threads
        self._reads = ReadAhead(reader, threads=read_threads) if read_threads else None

    def __len__(self) -> int:
        return len(self.samples)

    def cache_fingerprint(self) -> str | None:
        """Identity for the sample cache: the files (path, size, mtime) and the decoder; None
        with a ``transform`` or ``target_transform`` (either may draw randomness, so samples
        must not be kept)."""
        if self.transform is not None or self.target_transform is not None:
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
        if self.target_transform is not None:
            return image, self.target_transform(target)
        return image, target


def _endings(extensions: Any) -> tuple[str, ...]:
    """``extensions`` (a str or several) as lower-case name endings."""
    listed = (extensions,) if isinstance(extensions, str) else extensions
    try:
        endings = tuple(listed)
    except TypeError:
        endings = ()
    if not endings or not all(isinstance(e, str) and e for e in endings):
        raise ValueError(
            f"extensions must be a file name ending or several, such as '.png', got {extensions!r}"
        )
    return tuple(e.lower() for e in endings)


def _ends_with(endings: tuple[str, ...], path: str) -> bool:
    return path.lower().endswith(endings)


def _images(folder: str, is_image: Callable[[str], bool]) -> list[str]:
    """The files under ``folder``, at any depth and through links, that ``is_image`` takes
    (given each one's path): sorted as torchvision's ImageFolder lists them. A link back to
    a folder the walk is in is not followed (torchvision's walk goes round it until the path
    is too long)."""
    places: list[tuple[str, list[str]]] = []
    within = {folder: {os.path.realpath(folder)}}  # each place's folders, as real paths
    for place, folders, files in os.walk(folder, followlinks=True):
        places.append((place, files))
        inside = within.pop(place)
        kept = []
        for name in folders:
            real = os.path.realpath(os.path.join(place, name))
            if real not in inside:
                kept.append(name)
                within[os.path.join(place, name)] = inside | {real}
        folders[:] = kept
    found: list[str] = []
    for place, files in sorted(places):
        paths = (os.path.join(place, file) for file in sorted(files))
        found.extend(path for path in paths if is_image(path))
    return found


def _read_file(read: Callable[[str], bytes] | None, path: str) -> bytes:
    if read is not None:
        return read(path)
    with open(path, "rb") as file:
        return file.read()
