"""Shared memory with no name: what the cache's processes share, freed with the last of them.

The training process makes a region (an anonymous ``memfd``); its workers get the descriptor by
inheritance (fork) or with their start-up arguments (spawn, forkserver), never by a path. So a
region can be found by no other process, and the kernel frees its pages once every process that
held it is gone, however they ended: SIGKILL to the whole job leaves nothing in ``/dev/shm``.

Each process maps the region itself and locks it through an open file description of its own
(``/proc/self/fd/N`` reopened), because ``flock`` belongs to a description and fork shares
them: parent and child would otherwise hold the lock at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import threading
from collections.abc import Iterator
from multiprocessing import reduction
from multiprocessing.context import get_spawning_popen
from typing import Any

from drapps.runtime.slabs import create_slab


class SharedRegion:
    """``size`` bytes of zeroed shared memory (pages are allocated as they are written).

    Args:
        size: bytes.
        name: its name in ``/proc/<pid>/fd`` (``/memfd:drapps-<name>``), for people reading it.
    """

    def __init__(self, size: int, name: str) -> None:
        if size < 1:
            raise ValueError(f"a shared region needs >= 1 byte, got {size!r}")
        self.size = size
        self.name = name
        self._fd = create_slab(name=name)
        try:
            os.ftruncate(self._fd, size)
        except BaseException:
            os.close(self._fd)
            raise
        self._start_process()

    def _start_process(self) -> None:
        """This process's own mapping and lock: made on first use."""
        self._pid = os.getpid()
        self._map: mmap.mmap | None = None
        self._lock_fd = -1
        self._thread_lock = threading.Lock()

    def _own(self) -> None:
        if self._pid != os.getpid():  # a forked child: the descriptor is inherited, not ours
            self._start_process()

    @property
    def view(self) -> mmap.mmap:
        """The region, mapped in this process."""
        self._own()
        if self._map is None:
            if self._fd < 0:
                raise ValueError(f"shared region {self.name} is closed")
            self._map = mmap.mmap(self._fd, self.size, flags=mmap.MAP_SHARED)
        return self._map

    @contextlib.contextmanager
    def locked(self) -> Iterator[mmap.mmap]:
        """The region, held under a lock every process and thread respects."""
        view = self.view
        with self._thread_lock:
            if self._lock_fd < 0:
                self._lock_fd = os.open(f"/proc/self/fd/{self._fd}", os.O_RDWR)
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            try:
                yield view
            finally:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def discard(self, start: int, end: int) -> None:
        """Give the pages of ``[start, end)`` back to the kernel; they read as zeros after."""
        view = self.view
        page = mmap.PAGESIZE
        first = (start + page - 1) // page * page
        if end - first >= page and hasattr(mmap, "MADV_REMOVE"):
            view.madvise(mmap.MADV_REMOVE, first, (end - first) // page * page)
        else:
            view[start:end] = bytes(end - start)

    def close(self) -> None:
        """Unmap and close this process's handles (others keep theirs). Idempotent."""
        self._own()
        if self._map is not None:
            with contextlib.suppress(BufferError):  # a view still exported: freed with it
                self._map.close()
            self._map = None
        for fd in (self._lock_fd, self._fd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._lock_fd = self._fd = -1

    def __reduce__(self) -> Any:
        if self._fd < 0:
            raise ValueError(f"shared region {self.name} is closed")
        if get_spawning_popen() is None:
            raise TypeError(
                f"shared region {self.name} reaches other processes only with their start-up "
                "arguments (a worker's)"
            )
        return (_reopen, (self.size, self.name, reduction.DupFd(self._fd)))


def _reopen(size: int, name: str, handle: Any) -> SharedRegion:
    region = SharedRegion.__new__(SharedRegion)
    region.size, region.name = size, name
    region._fd = handle.detach()
    region._start_process()
    return region
