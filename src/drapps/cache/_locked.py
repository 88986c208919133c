"""A small file every process of a cache locks exclusively before reading or writing it."""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class LockedFile:
    """``path``, opened by each process itself and locked with ``flock`` while in use.

    flock belongs to an open file description, which fork shares: a descriptor opened before a
    fork would let parent and child hold the lock at once. So each process opens its own, on
    first use, and a pickled copy (a worker's) starts without one.

    The file is written through, so it must be this user's own regular file: a symbolic link
    (which would make the writes land on whatever it points at), another kind of file, or
    another user's file is refused with :class:`PermissionError`. With ``group`` set, a file of
    that group is accepted too (a cache shared by a group), and one this process makes is
    readable and writable by the group.

    Args:
        path: the file (made if missing).
        group: a group id whose members' file is accepted; None: this user's only.
    """

    def __init__(self, path: str | os.PathLike[str], group: int | None = None) -> None:
        self.path = Path(path)
        self.group = group
        self._fd = -1
        self._pid = -1

    @contextlib.contextmanager
    def locked(self) -> Iterator[int]:
        """The file's descriptor, held under an exclusive lock for the block.

        Raises:
            PermissionError: the file is a link, not a regular file, or not this user's
                (or the group's).
        """
        if self._pid != os.getpid():
            self._fd = self._open()
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

    def _open(self) -> int:
        mode = 0o600 if self.group is None else 0o660
        try:
            fd = os.open(self.path, _FLAGS, mode)
        except OSError as exc:
            if os.path.islink(self.path):  # O_NOFOLLOW's ELOOP
                raise PermissionError(
                    f"{self.path} is a symbolic link: refusing to write through it (remove it; "
                    "drapps makes a new one)"
                ) from None
            raise PermissionError(f"{self.path} cannot be opened: {exc.strerror}") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise PermissionError(f"{self.path} is not a regular file (remove it)")
            if info.st_uid == os.getuid():
                if stat.S_IMODE(info.st_mode) != mode:
                    os.fchmod(fd, mode)  # the umask's mode, or an earlier one, made right
            elif self.group is None or info.st_gid != self.group:
                group = "" if self.group is None else f" nor to its group ({self.group})"
                raise PermissionError(
                    f"{self.path} belongs to user {info.st_uid}, not to this user "
                    f"({os.getuid()}){group}: refusing to trust it"
                )
        except BaseException:
            os.close(fd)
            raise
        return fd

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fd": -1, "_pid": -1}
