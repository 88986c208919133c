"""A tier of the sample cache: a directory of entry files with a byte budget.

The shared-memory tier is a directory on ``/dev/shm`` (tmpfs: its files are pages of RAM that
every worker maps); the disk tier is a directory the user names, kept across runs. One class
serves both. An entry is written to a temporary file and renamed into place, so a reader sees
a whole entry or none, and a worker killed mid-write leaves only a temporary file that the next
:meth:`DirectoryTier.open` removes. The bytes held are counted in a ledger file under an
exclusive ``flock``, so every process respects one budget.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import struct
from pathlib import Path
from typing import Protocol, runtime_checkable

from drapps.cache._locked import LockedFile

_LEDGER = ".ledger"
_TMP = ".tmp-"
_COUNTS = struct.Struct("<qq")  # bytes held, entries


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
        """The entry's bytes, or None."""
        ...

    def write(self, key: str, data: bytes) -> bool:
        """Store (or replace) ``key`` if the budget has room; False when it has not."""
        ...

    def drop(self, key: str) -> None:
        """Remove ``key`` (a corrupt entry); no error if it is gone."""
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
        name: "memory" or "disk", for stats and messages.
    """

    def __init__(self, root: str | os.PathLike[str], budget: int, name: str) -> None:
        if budget < 0:
            raise ValueError(f"the {name} tier's budget must be >= 0 bytes, got {budget!r}")
        self.root = Path(root)
        self._root = os.fspath(root)  # str paths: pathlib costs microseconds a lookup
        self.budget = int(budget)
        self.name = name
        self._ledger = LockedFile(self.root / _LEDGER)

    def open(self) -> DirectoryTier:
        """Make the directory, remove what dead writers left, and recount the ledger from
        the entries there (the training process calls this once, before workers start)."""
        self.root.mkdir(parents=True, exist_ok=True)
        self._make_fanout()
        held = entries = 0
        for path in self.root.glob("*/*"):
            if path.name.startswith(_TMP):
                path.unlink(missing_ok=True)
            elif path.is_file():
                held += path.stat().st_size
                entries += 1
        with self._ledger.locked() as fd:
            os.pwrite(fd, _COUNTS.pack(held, entries), 0)
        return self

    def path(self, key: str) -> str:
        """Where ``key``'s entry lives (keys are hex; the first two digits name a folder)."""
        return f"{self._root}/{key[:2]}/{key}"

    def read(self, key: str) -> bytearray | None:
        """The entry's bytes, or None when there is none."""
        try:
            with open(self.path(key), "rb", buffering=0) as file:
                size = os.fstat(file.fileno()).st_size
                data = bytearray(size)
                view = memoryview(data)
                got = 0
                while got < size and (n := file.readinto(view[got:])):
                    got += n
                return data if got == size else None
        except FileNotFoundError:
            return None

    def write(self, key: str, data: bytes) -> bool:
        """Store ``data`` as ``key`` if the budget has room for it (replacing an entry of the
        same key); False when it has not."""
        path = self.path(key)
        old = _size(path)
        delta, added = len(data) - max(old, 0), int(old < 0)
        if not self._reserve(delta, added):
            return False
        tmp = f"{self._root}/{key[:2]}/{_TMP}{os.getpid()}-{os.urandom(4).hex()}"
        try:
            with open(tmp, "wb", buffering=0) as file:
                file.write(data)
            self._commit(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            self._reserve(-delta, -added, force=True)
            raise
        return True

    def drop(self, key: str) -> None:
        """Remove the entry (a corrupt one, or one being replaced elsewhere)."""
        path = self.path(key)
        size = _size(path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
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
            if child.is_dir():
                shutil.rmtree(child, ignore_errors=True)
        self._make_fanout()
        with self._ledger.locked() as fd:
            os.pwrite(fd, _COUNTS.pack(0, 0), 0)

    def close(self) -> None:
        """Close this process's ledger descriptor (the entries stay)."""
        self._ledger.close()

    def _make_fanout(self) -> None:
        for i in range(256):
            os.makedirs(f"{self._root}/{i:02x}", exist_ok=True)

    def _commit(self, tmp: str, path: str) -> None:
        os.replace(tmp, path)  # atomic: readers see the old entry, the new one, or none

    def _reserve(self, delta: int, entries: int, *, force: bool = False) -> bool:
        with self._ledger.locked() as fd:
            held, count = _COUNTS.unpack(os.pread(fd, _COUNTS.size, 0).ljust(_COUNTS.size, b"\0"))
            if not force and delta > 0 and held + delta > self.budget:
                return False
            os.pwrite(fd, _COUNTS.pack(max(0, held + delta), max(0, count + entries)), 0)
            return True

    def __repr__(self) -> str:
        return f"DirectoryTier({str(self.root)!r}, budget={self.budget}, name={self.name!r})"


def _size(path: str) -> int:
    """The file's size, -1 when there is none."""
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return -1
