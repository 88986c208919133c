"""The sample cache in the simulator: hit rate from what fits, per-codec costs and sizes.

A cached sample skips the part of a worker's work the cache holds (``make_share`` of
``cpu_s``, and its storage read) and costs a decode instead; a miss costs the full work and,
while the budget has room, an encode. The first epoch is all misses. Entries count by codec,
so a codec change re-encodes entries as they are read (paying the new codec's encode once) and
changes how many fit, as in the real cache. Counts are expected values (fractions of a batch),
which keeps a simulated run deterministic in its cache behaviour.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class CodecModel:
    """One codec on this dataset's samples (what the real cache's profile measures)."""

    name: str
    stored_bytes: float
    """Bytes one entry takes."""
    encode_s: float
    """CPU seconds to encode one sample."""
    decode_s: float
    """CPU seconds to read and decode one entry."""


@dataclass(frozen=True)
class CacheModel:
    """A sample cache on the simulated pipeline."""

    samples: int
    """Samples in the dataset (an epoch)."""
    budget_bytes: int
    """Bytes the entries may hold."""
    codecs: tuple[CodecModel, ...]
    """The codecs the cache may use; the first is where it starts, unless ``codec`` says."""
    make_share: float = 0.8
    """Share of a batch's worker CPU (``cpu_s``) a hit saves: fetch, decode, the cached ops."""
    codec: str | None = None
    """The codec to start with (None: the first)."""

    def __post_init__(self) -> None:
        if self.samples < 1 or self.budget_bytes < 0:
            raise ValueError(
                f"CacheModel needs samples >= 1 and budget_bytes >= 0, got {self.samples}, "
                f"{self.budget_bytes}"
            )
        if not self.codecs:
            raise ValueError("CacheModel.codecs must hold at least one codec")
        if not 0 <= self.make_share <= 1:
            raise ValueError(f"CacheModel.make_share must be in [0, 1], got {self.make_share}")
        if self.codec is not None and self.codec not in self.names:
            raise ValueError(f"CacheModel.codec must be one of {self.names}, got {self.codec!r}")

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.codecs]


@dataclass
class CacheSim:
    """The cache's state during a run."""

    model: CacheModel
    codec: str = ""
    entries: dict[str, float] = field(default_factory=dict)
    seen: float = 0.0
    """Samples looked up so far (the first ``samples`` are the first epoch)."""
    hits: float = 0.0
    misses: float = 0.0
    not_admitted: float = 0.0
    read_s: float = 0.0
    make_s: float = 0.0

    def __post_init__(self) -> None:
        self.codec = self.codec or self.model.codec or self.model.codecs[0].name
        self._by_name = {c.name: c for c in self.model.codecs}

    def set_codec(self, name: str) -> None:
        if name not in self._by_name:
            raise ValueError(f"codec must be one of {self.model.names}, got {name!r}")
        self.codec = name

    @property
    def held_bytes(self) -> float:
        return sum(n * self._by_name[c].stored_bytes for c, n in self.entries.items())

    def batch(self, size: int, make_s: float) -> tuple[float, float]:
        """Look up a batch of ``size`` samples, each costing ``make_s`` CPU seconds to make.

        Returns:
            (CPU seconds the batch's cached part costs, share of its samples that missed:
            they read storage).
        """
        m, now = self.model, self._by_name[self.codec]
        first_epoch = self.seen < m.samples
        held = sum(self.entries.values())
        hit_share = 0.0 if first_epoch else min(1.0, held / m.samples)
        hits, misses = size * hit_share, size * (1 - hit_share)
        self.seen += size
        cpu = 0.0
        # Hits: decode as written; entries of another codec are re-encoded if they fit.
        for name, count in list(self.entries.items()):
            share = hits * count / held if held else 0.0
            cpu += share * self._by_name[name].decode_s
            if name != self.codec and share > 0:
                cpu += share * now.encode_s
                grow = now.stored_bytes - self._by_name[name].stored_bytes
                if grow <= 0 or self.held_bytes + share * grow <= m.budget_bytes:
                    self.entries[name] -= share
                    self.entries[self.codec] = self.entries.get(self.codec, 0.0) + share
        # Misses: made again; admitted (and encoded) while there is room.
        room = max(0.0, (m.budget_bytes - self.held_bytes) / max(now.stored_bytes, 1.0))
        room = min(room, m.samples - sum(self.entries.values()))
        admitted = min(misses, room) if first_epoch or room > 0 else 0.0
        cpu += misses * make_s + admitted * now.encode_s
        self.entries[self.codec] = self.entries.get(self.codec, 0.0) + admitted
        self.hits += hits
        self.misses += misses
        self.not_admitted += misses - admitted
        self.read_s += hits * (sum(c.decode_s for c in self.model.codecs if c.name == self.codec))
        self.make_s += misses * make_s
        return cpu, misses / size if size else 0.0

    def profile(self) -> dict[str, list[float]]:
        """What the real cache's profile reports: ``[stored bytes, encode ms, decode ms]``."""
        return {
            c.name: [c.stored_bytes, 1000 * c.encode_s, 1000 * c.decode_s]
            for c in self.model.codecs
        }
