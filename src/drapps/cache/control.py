"""The cache's shared control block: the codec in use, on/off, the counters, the profile.

Workers read the codec once per batch and add their counters once per batch, under the
block's lock; the training process sets the codec (the controller's ``codec`` knob) and reads
the counters. It lives in a nameless shared region (:mod:`drapps.cache._region`) rather than a
``multiprocessing.Value``, so that any pool's workers (processes started any way, or other
pools later) share it, and nothing of it outlives the loader's processes.
"""

from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass, field
from typing import Any

from drapps.cache._region import SharedRegion

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
_CLAIMS = ("profile",)
"""Names a process may claim once (:meth:`ControlBlock.claim`), one bit each."""
_FLAGS = struct.Struct("<qq")  # claimed bits, length of the JSON that follows
_SIZE = 64 * 1024


class ControlBlock:
    """int64 slots: the codec's index (:data:`OFF` for "off"), enabled, counters; the names
    claimed; and the codec profile as JSON (written once)."""

    def __init__(self) -> None:
        self._region = SharedRegion(_SIZE, "cache-control")

    def read(self) -> tuple[int, bool, dict[str, int]]:
        """(codec index, enabled, counters)."""
        with self._region.locked() as view:
            codec, enabled, *counts = _SLOTS.unpack_from(view, 0)
        return codec, bool(enabled), dict(zip(COUNTERS, counts, strict=True))

    def set(self, *, codec: int | None = None, enabled: bool | None = None) -> None:
        with self._region.locked() as view:
            slots = list(_SLOTS.unpack_from(view, 0))
            if codec is not None:
                slots[0] = codec
            if enabled is not None:
                slots[1] = int(enabled)
            _SLOTS.pack_into(view, 0, *slots)

    def add(self, counts: dict[str, int]) -> None:
        """Add ``counts`` to the shared counters."""
        with self._region.locked() as view:
            slots = list(_SLOTS.unpack_from(view, 0))
            for i, name in enumerate(COUNTERS):
                slots[2 + i] += counts.get(name, 0)
            _SLOTS.pack_into(view, 0, *slots)

    def claim(self, name: str) -> bool:
        """True for the one process that first claims ``name`` (one of ``_CLAIMS``)."""
        bit = 1 << _CLAIMS.index(name)
        with self._region.locked() as view:
            claimed, length = _FLAGS.unpack_from(view, _SLOTS.size)
            if claimed & bit:
                return False
            _FLAGS.pack_into(view, _SLOTS.size, claimed | bit, length)
        return True

    def write_json(self, value: Any) -> None:
        """Keep ``value`` (the codec profile) as JSON.

        Raises:
            ValueError: it takes more than the block has room for.
        """
        data = json.dumps(value).encode()
        start = _SLOTS.size + _FLAGS.size
        if start + len(data) > _SIZE:
            raise ValueError(f"a {len(data)}-byte profile does not fit the cache's control block")
        with self._region.locked() as view:
            claimed, _ = _FLAGS.unpack_from(view, _SLOTS.size)
            view[start : start + len(data)] = data
            _FLAGS.pack_into(view, _SLOTS.size, claimed, len(data))

    def read_json(self) -> Any:
        """What :meth:`write_json` kept, or None."""
        start = _SLOTS.size + _FLAGS.size
        with self._region.locked() as view:
            _, length = _FLAGS.unpack_from(view, _SLOTS.size)
            data = bytes(view[start : start + length]) if length else b""
        return json.loads(data) if data else None

    def close(self) -> None:
        self._region.close()


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
