"""The cache's shared control file: the codec in use, on/off, the counters, the profile.

Workers read the codec once per batch and add their counters once per batch, under an
exclusive ``flock``; the training process sets the codec (the controller's ``codec`` knob)
and reads the counters. A file on ``/dev/shm`` rather than a ``multiprocessing.Value``, so
that any pool's workers (processes started any way, or other pools later) can share it.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from drapps.codecs._locked import LockedFile

COUNTERS = (
    "hits",
    "misses",
    "lossy_hits",
    "corrupt",
    "not_admitted",
    "writes",
    "bytes_written",
    "raw_bytes_written",
    "read_ns",
    "write_ns",
    "make_ns",
    "lossy_batches",
    "migrations",
)
"""Counters every worker adds to (see :attr:`CacheStats.counts`)."""
OFF = -1
"""The codec slot's value while the cache is bypassed."""
_SLOTS = struct.Struct(f"<qq{len(COUNTERS)}q")  # codec index, enabled, counters


class ControlFile:
    """int64 slots in a file: the codec's index (:data:`OFF` for "off"), enabled, counters;
    and beside it the codec profile as JSON (written once)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = LockedFile(path)

    def read(self) -> tuple[int, bool, dict[str, int]]:
        """(codec index, enabled, counters)."""
        with self._file.locked() as fd:
            codec, enabled, *counts = self._slots(fd)
        return codec, bool(enabled), dict(zip(COUNTERS, counts, strict=True))

    def set(self, *, codec: int | None = None, enabled: bool | None = None) -> None:
        with self._file.locked() as fd:
            slots = self._slots(fd)
            if codec is not None:
                slots[0] = codec
            if enabled is not None:
                slots[1] = int(enabled)
            os.pwrite(fd, _SLOTS.pack(*slots), 0)

    def add(self, counts: dict[str, int]) -> None:
        """Add ``counts`` to the shared counters."""
        with self._file.locked() as fd:
            slots = self._slots(fd)
            for i, name in enumerate(COUNTERS):
                slots[2 + i] += counts.get(name, 0)
            os.pwrite(fd, _SLOTS.pack(*slots), 0)

    def claim(self, name: str) -> bool:
        """True for the one process that first claims ``name`` (a file made exclusively)."""
        try:
            os.close(os.open(self.path.parent / f".{name}.claimed", os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return False
        return True

    def write_json(self, name: str, value: Any) -> None:
        tmp = self.path.parent / f".{name}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(value))
        os.replace(tmp, self.path.parent / f"{name}.json")

    def read_json(self, name: str) -> Any:
        try:
            return json.loads((self.path.parent / f"{name}.json").read_text())
        except FileNotFoundError:
            return None

    def close(self) -> None:
        self._file.close()

    def _slots(self, fd: int) -> list[int]:
        raw = os.pread(fd, _SLOTS.size, 0)
        return list(_SLOTS.unpack(raw)) if len(raw) == _SLOTS.size else [0] * (2 + len(COUNTERS))


@dataclass
class CacheStats:
    """What the cache has done (all workers, cumulative)."""

    codec: str
    """The codec new entries are written with ("off": the cache is bypassed)."""
    enabled: bool
    """False once an "auto" cache found the dataset would not fit."""
    budget: int = 0
    """Bytes all tiers may hold."""
    samples: int = 0
    """Samples in the dataset (0 when it has no length)."""
    held_bytes: dict[str, int] = field(default_factory=dict)
    """Bytes held per tier ("memory", "disk")."""
    entries: dict[str, int] = field(default_factory=dict)
    """Entries per tier."""
    profile: dict[str, list[float]] = field(default_factory=dict)
    """Per codec, measured on the first samples: ``[stored bytes per sample, encode ms,
    decode ms]`` (empty until measured)."""
    counts: dict[str, int] = field(default_factory=dict)
    """The :data:`COUNTERS`: hits, misses, lossy hits, corrupt entries dropped, samples not
    admitted (no room), writes, bytes written (encoded / raw), time reading, writing and
    making samples (ns), batches with a lossy sample, entries re-encoded by a codec change."""

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "hit_rate": self.hit_rate, "ratio": self.ratio}

    @property
    def hit_rate(self) -> float:
        looked = self.counts.get("hits", 0) + self.counts.get("misses", 0)
        return self.counts.get("hits", 0) / looked if looked else 0.0

    @property
    def ratio(self) -> float:
        """Raw bytes over stored bytes of what was written (compression ratio)."""
        written = self.counts.get("bytes_written", 0)
        return self.counts.get("raw_bytes_written", 0) / written if written else 1.0
