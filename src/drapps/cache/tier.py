"""A tier of the sample cache: a directory of entry files with a byte budget.

The disk tier is a directory the user names, kept across runs. An entry is written to a
temporary file and renamed into place, so a reader sees a whole entry or none, and a worker
killed mid-write leaves only a temporary file that the next :meth:`DirectoryTier.open`
removes. The bytes held are counted in a ledger file under an exclusive ``flock``, so every
process respects one budget.

What the directory holds is not trusted beyond what its permissions say. It is private to its
user (folders 0700, files 0600) unless made for a group (``shared_group``: folders 2770, files
0660, and files of the group's members read); one that others can write into is refused when
opened. An entry is read only if it is a regular file (no link is followed, no FIFO waited
on), of this user or the group, and no larger than the budget; anything else there counts as
a corrupt entry, and the sample is made again. A write that fails (a full disk, a quota, a
read-only file system) is a sample not cached, never an error.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import stat
import struct
from pathlib import Path
from typing import Protocol, runtime_checkable

from drapps.cache._locked import LockedFile
from drapps.cache.entry import CorruptEntry

logger = logging.getLogger(__name__)

_LEDGER = ".ledger"
_TMP = ".tmp-"
_COUNTS = struct.Struct("<qq")  # bytes held, entries
_LARGEST = 1 << 30
"""No entry file is larger (a sample of over 1 GiB is not cached): a file planted in the
directory cannot make a reader allocate more."""
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_GROUP_WRITE, _OTHERS_WRITE = stat.S_IWGRP, stat.S_IWOTH
_UNWRITTEN = "an entry could not be written to %s (%s): the sample is not cached"


@runtime_checkable
class Tier(Protocol):
    """What the sample cache needs of a tier (the seam a shared cache, e.g. Redis, plugs into).

    A tier is made in the training process, opened once there (:meth:`open`), then pickled to
    every worker; each method may be called from any of those processes at once, so the
    budget must be kept where they all see it. Entries are whole byte strings (the cache
    checks them); a tier only stores, finds and counts them.
    """

    name: str
    """Its name in stats ("memory", "disk", ...); unique within a cache."""
    budget: int
    """Bytes its entries may hold."""

    def open(self) -> Tier:
        """Prepare it (in the training process, before workers start); return it."""
        ...

    def read(self, key: str) -> bytearray | bytes | None:
        """The entry's bytes, or None.

        Raises:
            CorruptEntry: what it holds under ``key`` is no entry it can trust (the cache
                counts it corrupt, drops it and makes the sample again).
        """
        ...

    def write(self, key: str, data: bytes) -> bool:
        """Store (or replace) ``key`` if the budget has room; False when it has not, or when
        the store failed (the sample is then not cached)."""
        ...

    def drop(self, key: str) -> None:
        """Remove ``key`` (a corrupt entry); no error if it is gone or cannot be removed."""
        ...

    def held(self) -> tuple[int, int]:
        """(bytes, entries) it holds now."""
        ...

    def free(self) -> int:
        """Bytes the budget still has room for."""
        ...

    def clear(self) -> None:
        """Remove every entry."""
        ...

    def close(self) -> None:
        """Release what this process holds for it (its entries stay)."""
        ...


class DirectoryTier:
    """Entries under ``root``, at most ``budget`` bytes of them.

    Args:
        root: the directory (made if missing).
        budget: bytes the entries may hold.
        name: "disk", or another name for stats and messages.
        shared_group: share the directory with its group (folders 2770, files 0660, files of
            the group's members read) instead of keeping it to this user (0700, 0600).
    """

    def __init__(
        self, root: str | os.PathLike[str], budget: int, name: str, *, shared_group: bool = False
    ) -> None:
        if budget < 0:
            raise ValueError(f"the {name} tier's budget must be >= 0 bytes, got {budget!r}")
        self.root = Path(root)
        self._root = os.fspath(root)  # str paths: pathlib costs microseconds a lookup
        self.budget = int(budget)
        self.name = name
        self.shared_group = shared_group
        self._folder_mode = 0o2770 if shared_group else 0o700  # setgid: files take its group
        self._file_mode = 0o660 if shared_group else 0o600
        self._gid: int | None = None  # the directory's group, whose files a shared tier reads
        self._ledger = LockedFile(self.root / _LEDGER)
        self._warned: set[str] = set()

    def open(self) -> DirectoryTier:
        """Make the directory (or check that only this user, or its group, can write into
        it), remove what dead writers left, and recount the ledger from the entries there
        (the training process calls this once, before workers start).

        Raises:
            PermissionError: the directory, a folder in it or its ledger can be written by
                other users (another user's, a link, or writable by them).
        """
        self._gid = self._make_root()
        self._ledger.group = self._gid if self.shared_group else None
        self._make_folders(strict=True)
        held = entries = 0
        for i in range(256):
            with os.scandir(f"{self._root}/{i:02x}") as items:
                for item in items:
                    if item.name.startswith(_TMP):
                        with contextlib.suppress(OSError):
                            os.unlink(item.path)
                        continue
                    info = item.stat(follow_symlinks=False)
                    if self._distrust(info) is None and info.st_size <= self.budget:
                        held += info.st_size
                        entries += 1
        with self._ledger.locked() as fd:
            os.pwrite(fd, _COUNTS.pack(held, entries), 0)
        return self

    def path(self, key: str) -> str:
        """Where ``key``'s entry lives (keys are hex; the first two digits name a folder)."""
        return f"{self._root}/{key[:2]}/{key}"

    def read(self, key: str) -> bytearray | None:
        """The entry's bytes, or None when there is none.

        Raises:
            CorruptEntry: the path holds something else than an entry file this tier trusts
                (a link, a directory, a FIFO, a file too large or of another user).
        """
        path = self.path(key)
        try:
            fd = os.open(path, _READ)  # non-blocking: a FIFO opens at once, and is refused
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            problem = "is a symbolic link" if exc.errno == errno.ELOOP else exc.strerror
            raise CorruptEntry(f"{path}: {problem}") from None
        try:
            info = os.fstat(fd)
            problem = self._distrust(info)
            if problem is not None:
                raise CorruptEntry(f"{path} {problem}")
            if info.st_size > self.budget:
                return None  # an entry made under a larger budget: not this run's to read
            data = bytearray(info.st_size)
            view = memoryview(data)
            got = 0
            while got < info.st_size and (n := os.readv(fd, [view[got:]])):
                got += n
            return data if got == info.st_size else None
        except OSError as exc:
            raise CorruptEntry(f"{path} cannot be read: {exc.strerror}") from None
        finally:
            os.close(fd)

    def write(self, key: str, data: bytes) -> bool:
        """Store ``data`` as ``key`` if the budget has room for it (replacing an entry of the
        same key); False when it has not, or when the file system refused the write (full,
        over quota, read-only: logged once)."""
        if len(data) > min(self.budget, _LARGEST):
            return False
        path = self.path(key)
        try:
            old = self._counted(path)
            delta, added = len(data) - max(old, 0), int(old < 0)
            if not self._reserve(delta, added):
                return False
        except OSError as exc:
            self._warn("write", _UNWRITTEN, path, exc)
            return False
        tmp = f"{self._root}/{key[:2]}/{_TMP}{os.getpid()}-{os.urandom(4).hex()}"
        try:
            fd = os.open(tmp, _CREATE, self._file_mode)
            try:
                if self.shared_group:
                    os.fchmod(fd, self._file_mode)  # the umask's mode would keep the group out
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
            os.replace(tmp, path)  # atomic: readers see the old entry, the new one, or none
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            with contextlib.suppress(OSError):
                self._reserve(-delta, -added, force=True)
            if not isinstance(exc, OSError):
                raise
            self._warn("write", _UNWRITTEN, path, exc)
            return False
        return True

    def drop(self, key: str) -> None:
        """Remove the entry (a corrupt one, or one being replaced elsewhere); what cannot be
        removed (a directory planted there) is left, and logged once."""
        path = self.path(key)
        try:
            size = self._counted(path)
            os.unlink(path)
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as exc:
            self._warn("drop", "%s cannot be removed (%s): it is skipped on every read", path, exc)
            return
        if size >= 0:
            with contextlib.suppress(OSError):
                self._reserve(-size, -1, force=True)

    def held(self) -> tuple[int, int]:
        """(bytes, entries) the tier holds now."""
        with self._ledger.locked() as fd:
            return _COUNTS.unpack(os.pread(fd, _COUNTS.size, 0).ljust(_COUNTS.size, b"\0"))

    def free(self) -> int:
        """Bytes the budget still has room for."""
        return self.budget - self.held()[0]

    def clear(self) -> None:
        """Remove every entry (the directory stays)."""
        for child in self.root.iterdir() if self.root.exists() else ():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child, ignore_errors=True)
        self._make_folders(strict=False)
        with self._ledger.locked() as fd:
            os.pwrite(fd, _COUNTS.pack(0, 0), 0)

    def close(self) -> None:
        """Close this process's ledger descriptor (the entries stay)."""
        self._ledger.close()

    def _make_root(self) -> int:
        """Make or check the directory; its group id."""
        self.root.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(self._root, self._folder_mode)
        except FileExistsError:
            pass
        else:
            os.chmod(self._root, self._folder_mode)  # the umask, and setgid, which mkdir drops
        info = os.stat(self._root)
        problem = self._distrust_folder(info)
        if problem is not None:
            raise PermissionError(f"disk cache directory {self._root} {problem}")
        self._set_mode(self._root, info)
        return info.st_gid

    def _make_folders(self, *, strict: bool) -> None:
        """Make the 256 folders of entries; ``strict``: check those already there."""
        for i in range(256):
            folder = f"{self._root}/{i:02x}"
            try:
                os.mkdir(folder, self._folder_mode)
            except FileExistsError:
                if not strict:
                    continue
                info = os.lstat(folder)
                problem = self._distrust_folder(info)
                if problem is not None:
                    raise PermissionError(f"disk cache folder {folder} {problem}") from None
                self._set_mode(folder, info)
            except OSError:
                if strict:
                    raise
            else:
                if self.shared_group:
                    os.chmod(folder, self._folder_mode)

    def _set_mode(self, folder: str, info: os.stat_result) -> None:
        """Give a folder of this user's the tier's mode: private, a folder an earlier version
        made readable by others; shared, one a private run made."""
        if info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) != self._folder_mode:
            os.chmod(folder, self._folder_mode)

    def _distrust_folder(self, info: os.stat_result) -> str | None:
        """Why a folder of this tier cannot be used, or None."""
        mode = stat.S_IMODE(info.st_mode)
        if not stat.S_ISDIR(info.st_mode):
            return "is not a directory (remove it; drapps makes one)"
        if info.st_uid != os.getuid() and not self.shared_group:
            return (
                f"belongs to user {info.st_uid}, not to this user ({os.getuid()}); a private "
                "cache must be this user's (or share it: drapps.Cache(shared_group=True))"
            )
        if mode & _OTHERS_WRITE or (mode & _GROUP_WRITE and not self.shared_group):
            who = "every user" if self.shared_group else "other users"
            fix = (
                "chmod o-w it"
                if self.shared_group
                else "chmod go-w it, or share it with its group: drapps.Cache(shared_group=True)"
            )
            return f"can be written by {who} (mode {mode:o}); {fix}"
        return None

    def _distrust(self, info: os.stat_result) -> str | None:
        """Why a file found where an entry goes is no entry to read, or None."""
        if not stat.S_ISREG(info.st_mode):
            return f"is not a regular file but a {_kind(info.st_mode)}"
        if info.st_size > _LARGEST:
            return f"holds {info.st_size} bytes, more than any entry does"
        if info.st_uid != os.getuid() and not (self.shared_group and info.st_gid == self._gid):
            return f"belongs to user {info.st_uid}"
        return None

    def _counted(self, path: str) -> int:
        """The size the ledger counts for ``path`` (an entry it trusts, within the budget: a
        larger one, made under a larger budget, is left alone), -1 for none."""
        try:
            info = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            return -1
        usable = self._distrust(info) is None and info.st_size <= self.budget
        return info.st_size if usable else -1

    def _reserve(self, delta: int, entries: int, *, force: bool = False) -> bool:
        with self._ledger.locked() as fd:
            held, count = _COUNTS.unpack(os.pread(fd, _COUNTS.size, 0).ljust(_COUNTS.size, b"\0"))
            if not force and delta > 0 and held + delta > self.budget:
                return False
            os.pwrite(fd, _COUNTS.pack(max(0, held + delta), max(0, count + entries)), 0)
            return True

    def _warn(self, what: str, message: str, path: str, exc: OSError) -> None:
        """Log a failure once per process and kind (a full disk fails every write)."""
        reason = exc.strerror or str(exc)
        if what in self._warned:
            logger.debug(f"the {self.name} tier: {message}", path, reason)
            return
        self._warned.add(what)
        logger.warning(
            f"the {self.name} tier: {message} (further failures like this one are logged at "
            "debug level)",
            path,
            reason,
        )

    def __repr__(self) -> str:
        group = ", shared_group=True" if self.shared_group else ""
        return f"DirectoryTier({str(self.root)!r}, budget={self.budget}, name={self.name!r}{group})"


def _kind(mode: int) -> str:
    for test, kind in (
        (stat.S_ISDIR, "directory"),
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISLNK, "symbolic link"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
    ):
        if test(mode):
            return kind
    return "special file"
