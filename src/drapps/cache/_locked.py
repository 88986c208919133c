"""A small file every process of a cache locks exclusively before reading or writing it."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class LockedFile:
    """``path``, opened by each process itself and locked with ``flock`` while in use.

    flock belongs to an open file description, which fork shares: a descriptor opened before a
    fork would let parent and child hold the lock at once. So each process opens its own, on
    first use, and a pickled copy (a worker's) starts without one.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._fd = -1
        self._pid = -1

    @contextlib.contextmanager
    def locked(self) -> Iterator[int]:
        """The file's descriptor, held under an exclusive lock for the block."""
        if self._pid != os.getpid():
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            self._pid = os.getpid()
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            yield self._fd
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        """Close this process's descriptor (the file stays)."""
        if self._pid == os.getpid() and self._fd >= 0:
            os.close(self._fd)
        self._fd, self._pid = -1, -1

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fd": -1, "_pid": -1}
