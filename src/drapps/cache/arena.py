"""The cache's memory tier: entries in one nameless shared region, found through an index in it.

A :class:`~drapps.cache._region.SharedRegion` holds a header, an open-addressing index (one
slot per key: its digest, offset and length) and the entries, allocated one after another.
Every process of the loader maps the same region; index changes happen under its lock, while
entry bytes are copied in and out without it. The region has no name, so nothing of the cache
stays in ``/dev/shm`` after any signal to any of the loader's processes.

The space of an entry replaced (a codec change re-encodes it) or dropped (corrupt) goes on a
free list, sorted by offset and merged with its neighbours, and is taken first-fit by later
writes; a full arena refuses new entries, as a tier over its budget does. Each record starts
with its key's digest, checked before and after every read, so a read never returns another
key's entry; a record written over while it was being copied fails its entry's checksum and
is made again.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any

import numpy as np

from drapps.cache._region import SharedRegion

_HEADER = struct.Struct("<8sqqqqqq")  # magic, slots, used, held, entries, generation, free
_MAGIC = b"DRARENA1"
_SLOT = struct.Struct("<16sqq")  # key digest, offset in the data area, length (-1: dropped)
_DIGEST = 16
_ALIGN = 64
_MAX_LOAD = 0.75
_PAGE = 4096
_FREE_BLOCKS = 65536  # free-list capacity; a block freed beyond it stays unused until clear


class ArenaTier:
    """Entries in shared memory, at most ``budget`` bytes of them.

    Args:
        budget: bytes the entries may take (their space, dropped and replaced ones included).
        entries: how many entries to expect (the index is sized for twice as many); None:
            one per 4 KiB of budget.
        name: its name in stats.
    """

    def __init__(self, budget: int, entries: int | None = None, name: str = "memory") -> None:
        if budget < 0:
            raise ValueError(f"the {name} tier's budget must be >= 0 bytes, got {budget!r}")
        self.budget = int(budget)
        self.name = name
        expected = entries if entries is not None else self.budget // _PAGE
        self.slots = 1 << max(10, min(26, (2 * max(1, expected) - 1).bit_length()))
        self._free_at = _HEADER.size + self.slots * _SLOT.size
        index_end = self._free_at + _FREE_BLOCKS * 16
        self._data = (index_end + _PAGE - 1) // _PAGE * _PAGE
        # The budget bounds the entries' bytes, as a directory tier's does; each record's
        # digest and alignment get room of their own.
        self._space = self.budget + int(_MAX_LOAD * self.slots) * (_DIGEST + _ALIGN)
        self._region: SharedRegion | None = None

    def open(self) -> ArenaTier:
        """Make the region (in the training process, before the workers start)."""
        if self._region is None:
            self._region = SharedRegion(self._data + self._space, f"cache-{self.name}")
            with self._region.locked() as view:
                _HEADER.pack_into(view, 0, _MAGIC, self.slots, 0, 0, 0, 0, 0)
        return self

    @property
    def region(self) -> SharedRegion:
        if self._region is None:
            raise ValueError(f"the {self.name} tier is not open")
        return self._region

    def read(self, key: str) -> bytearray | None:
        """The entry's bytes, or None when there is none (or its record is not this key's)."""
        digest = _digest(key)
        with self.region.locked() as view:
            found = self._find(view, digest)
            if found is None:
                return None
            _, offset, length = found
        start = self._data + offset
        record = memoryview(self.region.view)
        try:
            if record[start : start + _DIGEST] != digest:  # rewritten since: not this key's
                return None
            data = bytearray(record[start + _DIGEST : start + _DIGEST + length])
            return data if record[start : start + _DIGEST] == digest else None
        finally:
            record.release()

    def write(self, key: str, data: bytes) -> bool:
        """Store (or replace) ``key`` if the arena has room; False when it has not."""
        digest = _digest(key)
        claimed = self._allocate(_DIGEST + len(data), digest)
        if claimed is None:
            return False
        offset, generation = claimed
        start = self._data + offset
        view = memoryview(self.region.view)
        try:
            view[start : start + _DIGEST] = digest
            view[start + _DIGEST : start + _DIGEST + len(data)] = data
        except BaseException:
            with self.region.locked() as locked:
                if _HEADER.unpack_from(locked, 0)[5] == generation:  # not cleared meanwhile
                    self._forget(locked, offset, len(data))
            raise
        finally:
            view.release()
        return self._publish(digest, offset, len(data), generation)

    def _allocate(self, nbytes: int, replacing: bytes) -> tuple[int, int] | None:
        """(offset, generation) of ``nbytes`` taken from the data area, or None: no room.
        The entry being replaced (digest ``replacing``) gives its space up first, as a file
        replaced in a directory tier does."""
        size = _rounded(nbytes)
        with self.region.locked() as view:
            self._remove(view, replacing)
            magic, slots, used, held, entries, generation, count = _HEADER.unpack_from(view, 0)
            if entries + 1 > _MAX_LOAD * slots or held + nbytes - _DIGEST > self.budget:
                return None
            # The entry's bytes count from now, not from its publication: two writers that
            # both saw room for one would otherwise both be admitted past the budget.
            held, entries = held + nbytes - _DIGEST, entries + 1
            blocks = self._blocks(view)
            fits = np.flatnonzero(blocks[:count, 1] >= size)
            if len(fits):  # first fit from the free list
                at = int(fits[0])
                offset = int(blocks[at, 0])
                if blocks[at, 1] == size:
                    blocks[at : count - 1] = blocks[at + 1 : count].copy()
                    count -= 1
                else:
                    blocks[at] = (offset + size, blocks[at, 1] - size)
            elif used + size <= self._space:
                offset, used = used, used + size
            else:
                return None
            _HEADER.pack_into(view, 0, magic, slots, used, held, entries, generation, count)
        return offset, generation

    def _publish(self, digest: bytes, offset: int, length: int, generation: int) -> bool:
        """Point the index at a record written in full (a writer killed before this leaves
        unreachable bytes, counted against the budget until the arena is cleared)."""
        with self.region.locked() as view:
            now = _HEADER.unpack_from(view, 0)[5]
            if now != generation:
                return False  # cleared while we wrote: the space is no longer ours
            slot, old = self._probe(view, digest)
            if slot is None:
                self._forget(view, offset, length)  # its reservation and its space
                return False
            if old is not None and old[2] >= 0:
                self._forget(view, old[1], old[2])
            _SLOT.pack_into(view, _HEADER.size + slot * _SLOT.size, digest, offset, length)
        return True

    def _remove(self, view: Any, digest: bytes) -> None:
        """Drop ``digest``'s entry from the index (a tombstone keeps later keys' probes going)
        and free its space; nothing if it has none."""
        found = self._find(view, digest)
        if found is not None:
            slot, offset, length = found
            _SLOT.pack_into(view, _HEADER.size + slot * _SLOT.size, digest, offset, -1)
            self._forget(view, offset, length)

    def _forget(self, view: Any, offset: int, length: int) -> None:
        """An entry leaves the index, or an allocation is given up: its bytes no longer
        count, its space is free."""
        magic, slots, used, held, entries, generation, count = _HEADER.unpack_from(view, 0)
        _HEADER.pack_into(
            view, 0, magic, slots, used, held - length, entries - 1, generation, count
        )
        self._release(view, offset, _DIGEST + length)

    def _release(self, view: Any, offset: int, nbytes: int) -> None:
        """Put ``nbytes`` at ``offset`` on the free list, merged with its neighbours (or back
        to the unallocated tail when it ends there)."""
        size = _rounded(nbytes)
        magic, slots, used, held, entries, generation, count = _HEADER.unpack_from(view, 0)
        blocks = self._blocks(view)
        at = int(np.searchsorted(blocks[:count, 0], offset))
        start, end = offset, offset + size
        if at > 0 and blocks[at - 1, 0] + blocks[at - 1, 1] == start:
            at -= 1
            start = int(blocks[at, 0])
            blocks[at : count - 1] = blocks[at + 1 : count].copy()
            count -= 1
        if at < count and blocks[at, 0] == end:
            end += int(blocks[at, 1])
            blocks[at : count - 1] = blocks[at + 1 : count].copy()
            count -= 1
        if end == used:
            used = start
        elif count < _FREE_BLOCKS:
            blocks[at + 1 : count + 1] = blocks[at:count].copy()
            blocks[at] = (start, end - start)
            count += 1
        _HEADER.pack_into(view, 0, magic, slots, used, held, entries, generation, count)

    def _blocks(self, view: Any) -> np.ndarray:
        """The free list: (offset, size) rows, sorted by offset (the first ``count`` live)."""
        return np.frombuffer(view, np.int64, 2 * _FREE_BLOCKS, self._free_at).reshape(-1, 2)

    def drop(self, key: str) -> None:
        """Remove ``key`` (a corrupt entry); no error if it is gone."""
        with self.region.locked() as view:
            self._remove(view, _digest(key))

    def held(self) -> tuple[int, int]:
        """(bytes, entries) it holds now."""
        with self.region.locked() as view:
            _, _, _, held, entries, _, _ = _HEADER.unpack_from(view, 0)
        return held, entries

    def free(self) -> int:
        """Bytes of entries the budget still has room for."""
        return max(0, self.budget - self.held()[0])

    def clear(self) -> None:
        """Remove every entry and give their pages back."""
        with self.region.locked() as view:
            _, slots, used, _, _, generation, _ = _HEADER.unpack_from(view, 0)
            self.region.discard(_HEADER.size, self._data)
            self.region.discard(self._data, self._data + used)
            _HEADER.pack_into(view, 0, _MAGIC, slots, 0, 0, 0, generation + 1, 0)

    def close(self) -> None:
        """Release this process's mapping (the entries stay while another process holds
        the region; after the last, the kernel frees them)."""
        if self._region is not None:
            self._region.close()

    def _find(self, view: Any, digest: bytes) -> tuple[int, int, int] | None:
        slot, found = self._probe(view, digest)
        if slot is None or found is None or found[2] < 0:
            return None
        return slot, found[1], found[2]

    def _probe(self, view: Any, digest: bytes) -> tuple[int | None, tuple[bytes, int, int] | None]:
        """(the slot of ``digest``, or the first free one; what that slot holds, or None)."""
        mask = self.slots - 1
        slot = int.from_bytes(digest[:8], "little") & mask
        for _ in range(self.slots):
            at = _HEADER.size + slot * _SLOT.size
            held = _SLOT.unpack_from(view, at)
            if held[0] == digest:
                return slot, held
            if held[2] == 0:  # never used: the key is not further on
                return slot, None
            slot = (slot + 1) & mask
        return None, None

    def __repr__(self) -> str:
        return f"ArenaTier(budget={self.budget}, slots={self.slots}, name={self.name!r})"


def _rounded(nbytes: int) -> int:
    return (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN


def _digest(key: str) -> bytes:
    return hashlib.blake2b(key.encode(), digest_size=_DIGEST).digest()
