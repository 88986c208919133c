"""Recycling: what the training process keeps mapped of the slabs it received, and releases.

Once the last tensor over a received slab is garbage-collected in the process that received
it, a release notice goes back to the worker that wrote it (:class:`SlabRecycler`, sent by the
dispatcher), which writes a later batch into the slab
(:class:`~drapps.runtime.slabs.SlabWriter`). The training process decides which released slabs
are kept (their worker's share, within the memory budget) and keeps them mapped for their next
batch (:class:`ReceivedMappings`). Only the process that received a slab sends its notice (a
forked child's copies of the finalizers do nothing), and a slab that was mapped while that
process forked is never written again: the child shares its pages and may still read them
(:func:`fork_count`).
"""

from __future__ import annotations

import collections
import contextlib
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import NamedTuple

from drapps.runtime.slabs import KEEP_FREE, KEEP_SLABS, map_slab_address, unmap_slab

# ------------------------------------------------------------------------------ forks
# A slab mapped in a process that then forks is mapped in the child too; writing a later batch
# over it would change what the child reads. The count goes up before and after every fork
# (odd while one is under way), except the forks that start drapps' own workers, which never
# read the batches they inherit.
_forks = [0]
_starting_worker = threading.local()


def _count_fork() -> None:
    if not getattr(_starting_worker, "active", False):
        _forks[0] += 1


os.register_at_fork(before=_count_fork, after_in_parent=_count_fork)


def fork_count() -> int:
    """Forks counted in this process so far, each twice (odd while one is under way); the
    forks that start drapps' own workers are not counted (:func:`starting_worker`)."""
    return _forks[0]


@contextlib.contextmanager
def starting_worker() -> Iterator[None]:
    """Forks inside this block start drapps workers: they do not make held slabs unreusable."""
    _starting_worker.active = True
    try:
        yield
    finally:
        _starting_worker.active = False


class _Retired(NamedTuple):
    """A received slab whose last tensor is gone, waiting for :meth:`ReceivedMappings.retire`
    to decide whether its mapping is kept."""

    key: tuple[int, int]
    address: int
    size: int
    sender: int | None
    reusable: bool
    release: Callable[[bool], None]


class SlabRecycler:
    """The receiver's side: release notices, gathered per worker for the dispatcher to send
    (:meth:`drain`). Finalizers add to it from any thread, the collector's included, so it
    takes no lock (a deque's append and popleft are atomic).

    Args:
        room: bytes the memory budget has left for one more kept slab (None: no budget).
    """

    def __init__(self, room: Callable[[], int] | None = None) -> None:
        self._notices: collections.deque[tuple[int, int, bool]] = collections.deque()
        self._closed = False
        self.mappings = ReceivedMappings(room=room)
        """The receiver's mappings of this recycler's released slabs, for
        :func:`~drapps.runtime.transport.unpack`."""

    def releaser(self, worker: int, slab: int) -> Callable[[bool], None]:
        """What to call, with whether the slab may be written again, once ``slab`` of
        ``worker`` is released."""

        def release(reusable: bool) -> None:
            if not self._closed:
                self._notices.append((worker, slab, reusable))

        return release

    def drain(self) -> dict[int, list[tuple[int, bool]]]:
        """The notices since the last call, by worker."""
        notices: dict[int, list[tuple[int, bool]]] = {}
        while self._notices:
            worker, slab, reusable = self._notices.popleft()
            notices.setdefault(worker, []).append((slab, reusable))
        return notices

    def close(self) -> None:
        """Send no more notices (the workers are stopping; their slabs go with them)."""
        self._closed = True
        self._notices.clear()
        self.mappings.close()


class ReceivedMappings:
    """The receiver's mappings of released slabs, kept for the slab's next batch (one set per
    :class:`SlabRecycler`, closed with it), and the decision which released slabs are kept.

    A recycled slab comes back with a new descriptor for the same file: found here by its
    inode, it is read through the mapping it had, so the training process pays no ``mmap``,
    page-table population or ``munmap`` per batch. A released slab is kept (here mapped, in
    its worker open) only while it fits both its worker's share (:data:`KEEP_FREE` slabs of
    the largest it has sent, or as many smaller ones as fit in their bytes, at most
    :data:`KEEP_SLABS`) and the memory budget's ``room()``; any other is unmapped and its worker
    told to close it. So what is kept is exactly what is counted (:meth:`held_bytes`). A
    worker that closed a kept slab names it with its next batch (:meth:`forget`); a worker
    that exits sends none of its slabs again: :meth:`gone` unmaps them at once. A forked
    child unmaps its inherited copies at once.

    Args:
        keep: the worker's share, in slabs of the largest it sent (:data:`KEEP_FREE`).
        room: bytes the budget has left for one more kept slab (None: no budget).
    """

    def __init__(self, keep: int = KEEP_FREE, room: Callable[[], int] | None = None) -> None:
        self.keep = keep
        self.room = room
        # file key -> (address, bytes mapped, the sender's id or None)
        self._held: collections.OrderedDict[tuple[int, int], tuple[int, int, int | None]] = (
            collections.OrderedDict()
        )
        self._largest: dict[int | None, int] = {}  # sender -> the largest slab it sent
        # Released slabs not kept, until their worker says it closed them (its pages live
        # till then): file key -> (bytes, sender).
        self._closing: dict[tuple[int, int], tuple[int, int | None]] = {}
        self._gone: set[int] = set()  # senders that exited
        # Files mapped for a batch not yet retired, and those of them their sender closed
        # meanwhile (past its memory of sent slabs): such a slab is never sent again.
        self._live: set[tuple[int, int]] = set()
        self._dead: set[tuple[int, int]] = set()
        # Finalizers run in whichever thread drops a batch, maybe inside a collection that
        # an allocation here began, with the lock held: they never wait for it (:meth:`retire`).
        self._lock = threading.Lock()
        self._retiring: collections.deque[_Retired] = collections.deque()
        self._closed = False
        _OPEN_MAPPINGS.add(self)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """The lock, held; the slabs retired meanwhile are settled as it is let go."""
        try:
            with self._lock:
                yield
        finally:
            self._settle()

    def map(self, fd: int, nbytes: int) -> tuple[tuple[int, int], int, int]:
        """(file key, address, bytes mapped) of at least ``nbytes`` of slab ``fd``: the whole
        file is mapped (a recycled slab never shrinks), so a later, smaller batch or part
        written into it is read through the same mapping."""
        stat = os.fstat(fd)
        key = (stat.st_dev, stat.st_ino)
        with self._locked():
            held = self._held.pop(key, None)
            if held is not None and held[1] >= nbytes:
                self._live.add(key)
                return key, held[0], held[1]
        if held is not None:
            unmap_slab(held[0], held[1])
        size = max(nbytes, stat.st_size)
        address = map_slab_address(fd, size)
        with self._locked():
            self._live.add(key)
            self._dead.discard(key)  # a new file on a freed inode: not the one closed
        return key, address, size

    def retire(
        self,
        key: tuple[int, int],
        address: int,
        size: int,
        sender: int | None,
        reusable: bool,
        release: Callable[[bool], None],
    ) -> None:
        """A received slab's last tensor is gone: keep its mapping for the slab's next batch
        when it is ``reusable`` and fits its worker's share and the budget's room; else (or
        once closed, or once ``sender`` is :meth:`gone`) unmap it. Then ``release`` is called
        with whether it was kept: its worker keeps the slab only then.

        From a finalizer, in any thread: where the lock is held (by another thread, or by this
        one, which a collection interrupted), its holder decides as it lets go."""
        self._retiring.append(_Retired(key, address, size, sender, reusable, release))
        self._settle()

    def _settle(self) -> None:
        """Decide the retired slabs waiting, unless the lock is held (its holder settles)."""
        while self._retiring:
            if not self._lock.acquire(blocking=False):
                return
            unmapped: list[tuple[int, int]] = []
            told: list[tuple[Callable[[bool], None], bool]] = []
            try:
                while self._retiring:
                    retired = self._retiring.popleft()
                    self._live.discard(retired.key)
                    closed = retired.key in self._dead  # by its sender, while it was live
                    self._dead.discard(retired.key)
                    kept = retired.reusable and not closed and self._keep(retired, unmapped)
                    if not kept:
                        unmapped.append((retired.address, retired.size))
                        if not closed:
                            self._note_closing(retired.key, retired.size, retired.sender)
                    told.append((retired.release, kept))
            finally:
                self._lock.release()
            for address, size in unmapped:
                unmap_slab(address, size)
            for release, kept in told:
                release(kept)

    def _keep(self, retired: _Retired, unmapped: list[tuple[int, int]]) -> bool:
        """Whether ``retired`` is kept mapped (with the lock held); a mapping of its file held
        already goes to ``unmapped``."""
        key, size, sender = retired.key, retired.size, retired.sender
        if (previous := self._held.pop(key, None)) is not None:
            unmapped.append(previous[:2])  # mapped again meanwhile: this one is the slab's
        largest = self._largest[sender] = max(size, self._largest.get(sender, 0))
        mine = [held for held in self._held.values() if held[2] == sender]
        share = len(mine) < self.keep or (
            len(mine) < KEEP_SLABS and sum(held[1] for held in mine) + size <= self.keep * largest
        )
        kept = (
            not self._closed
            and (sender is None or sender not in self._gone)
            and share
            and (self.room is None or size <= self.room())
        )
        if kept:
            self._held[key] = (retired.address, size, sender)
        return kept

    def _note_closing(self, key: tuple[int, int], size: int, sender: int | None) -> None:
        if sender is not None and sender not in self._gone and not self._closed:
            self._closing[key] = (size, sender)

    def held_bytes(self) -> int:
        """Bytes of released slabs still held: kept for reuse (each mapped here, open in its
        worker), or not kept and not yet closed by their worker."""
        with self._locked():
            return self.held_bytes_unlocked()

    def held_bytes_unlocked(self) -> int:
        """:meth:`held_bytes` for ``room()``, which runs with the lock held."""
        kept = sum(size for _, size, _ in self._held.values())
        return kept + sum(size for size, _ in self._closing.values())

    def forget(self, keys: tuple[tuple[int, int], ...]) -> None:
        """Unmap the kept mappings of these files (their sender closed them: they will not
        come back, and the mapping alone holds their pages). One still live (a worker closes
        the oldest of its sent slabs past its memory, while the loop holds their batches) is
        neither kept nor awaited once its batch is let go."""
        gone = []
        with self._locked():
            for key in keys:
                if key in self._live:
                    self._dead.add(key)
                self._closing.pop(key, None)
                if (held := self._held.pop(key, None)) is not None:
                    gone.append(held)
        for address, size, _ in gone:
            unmap_slab(address, size)

    def gone(self, sender: int) -> None:
        """``sender`` exited: unmap the kept mappings of the slabs it wrote, and keep none
        of its slabs released from now on (its descriptors closed with it, so a mapping
        here would be all that holds their pages, and it will send none of them again)."""
        with self._locked():
            self._gone.add(sender)
            keys = [key for key, held in self._held.items() if held[2] == sender]
            keys += [key for key, closing in self._closing.items() if closing[1] == sender]
        self.forget(tuple(keys))

    def close(self) -> None:
        """Unmap every kept mapping and keep none from now on."""
        with self._locked():
            self._closed = True
            held, self._held = list(self._held.values()), collections.OrderedDict()
            self._closing.clear()
        for address, size, _ in held:
            unmap_slab(address, size)

    def __len__(self) -> int:
        return len(self._held)


_OPEN_MAPPINGS: weakref.WeakSet[ReceivedMappings] = weakref.WeakSet()


def _close_in_child() -> None:
    for mappings in list(_OPEN_MAPPINGS):
        mappings._lock = threading.Lock()  # another thread may have held it at the fork
        retiring, mappings._retiring = list(mappings._retiring), collections.deque()
        for retired in retiring:  # the parent's, waiting for a decision: not the child's
            unmap_slab(retired.address, retired.size)
        mappings.close()


os.register_at_fork(after_in_child=_close_in_child)


def release_slab(owner: int, release: Callable[[bool], None], forks: int | None) -> None:
    """A received slab's last tensor is gone: ``release`` it, in the process ``owner``
    only, as reusable when no fork began since it was mapped (``forks``)."""
    if os.getpid() == owner:
        release(forks is not None and _forks[0] == forks)


def retire_slab(
    owner: int,
    release: Callable[[bool], None],
    forks: int | None,
    mappings: ReceivedMappings,
    key: tuple[int, int],
    address: int,
    size: int,
    sender: int | None,
    on_release: Callable[[int], None] | None,
    nbytes: int,
) -> None:
    """The last tensor over a received, recyclable slab is gone: its batch's bytes are no
    longer live; keep the mapping for the slab's next batch when it may be written again and
    fits (:meth:`ReceivedMappings.retire`), and tell its worker."""
    if os.getpid() != owner:
        unmap_slab(address, size)  # a forked child's copy of the mapping
        return
    if on_release is not None:  # first: the budget's room then counts this slab as kept
        on_release(nbytes)
    reusable = forks is not None and _forks[0] == forks
    mappings.retire(key, address, size, sender, reusable, release)
