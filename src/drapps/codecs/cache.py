"""The sample cache: what the deterministic prefix of the pipeline made, kept across epochs.

:class:`Cache` is what a user writes (``drapps.Loader(..., cache=Cache(...))``);
:class:`SampleCache` is the running cache the loader makes from it and hands to every worker.
A sample's entry holds ``dataset[i]`` after the pipeline's ops up to the first one that draws
randomness (or that drapps cannot see into), so the random suffix (crops, flips, masking) runs
after the cache, seeded exactly as without it. Entries live in tiers, shared memory first and
then a disk directory; a sample that fits in neither is made every epoch, and the stats say how
many are.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import pickle
import shutil
import struct
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from drapps.codecs.codec import Codec
from drapps.codecs.entry import CorruptEntry, codecs_of, pack, unpack
from drapps.codecs.none import Raw
from drapps.codecs.registry import CODECS, available
from drapps.codecs.tier import DirectoryTier
from drapps.runtime.config import parse_bytes

logger = logging.getLogger(__name__)

SHM_ROOT = Path("/dev/shm")
_PREFIX = "drapps-cache-"
_SAMPLES_TO_PROJECT = 32  # entries made before an "auto" cache judges whether the dataset fits


@dataclass(frozen=True)
class Cache:
    """Settings of the sample cache (``drapps.Loader(..., cache=Cache(...))``).

    Example:
        >>> import drapps
        >>> cache = drapps.Cache(memory="1GiB", codec="zstd")
        >>> cache.codec
        'zstd'
    """

    memory: int | str = "auto"
    """Bytes of shared memory the entries may hold: an int, "512MB"/"2GiB", or "auto" (a
    quarter of the machine's memory, at most half of what ``/dev/shm`` has free)."""
    disk: str | os.PathLike[str] | None = None
    """A directory for the disk tier, used when shared memory is full; its entries outlive
    the run (keys name the dataset and the pipeline, so a changed one never reads them).
    None: no disk tier."""
    disk_bytes: int | str = "auto"
    """Bytes the disk tier may hold ("auto": half the free space of its file system)."""
    codec: str | Codec = "auto"
    """Codec for new entries: a registered name (``drapps.codecs.CODECS``), a :class:`Codec`,
    or "auto" (the controller picks one of ``codecs`` from the measured state; "none" until
    it does)."""
    codecs: tuple[str | Codec, ...] | None = None
    """What "auto" may choose from. Default: the lossless codecs installed (``none``,
    ``quantize-16``, ``lz4``, ``zstd``), and ``jpeg`` when ``min_psnr`` allows lossy ones."""
    min_psnr: float | None = None
    """Allow lossy codecs, keeping a lossy encoding only where it decodes at this PSNR (dB) or
    better; elsewhere the entry is stored losslessly. None: every entry is exact."""
    key: str | None = None
    """The dataset's identity in entry keys. Default: ``dataset.cache_fingerprint()`` where
    the dataset has one (drapps' datasets: files, sizes and mtimes), else a hash of the
    pickled dataset."""

    def __post_init__(self) -> None:
        for name in ("memory", "disk_bytes"):
            value = getattr(self, name)
            if value != "auto":
                try:
                    budget_bytes(value, name)
                except (TypeError, ValueError) as exc:
                    raise ValueError(f"Cache.{name}: {exc}") from None
        if self.min_psnr is not None and not (
            isinstance(self.min_psnr, (int, float)) and self.min_psnr > 0
        ):
            raise ValueError(
                f"Cache.min_psnr must be a positive number of dB, got {self.min_psnr!r}"
            )
        for codec in (*(self.codecs or ()), self.codec):
            if codec == "auto":
                continue
            resolved = codec if isinstance(codec, Codec) else CODECS.get(codec)
            if resolved.lossy and self.min_psnr is None and not _exact_for_integers(resolved):
                raise ValueError(
                    f"Cache: codec {resolved.name!r} is lossy; allow it with min_psnr=... "
                    "(for example Cache(min_psnr=40)) or pick a lossless codec"
                )
        if self.codecs is not None and not self.codecs:
            raise ValueError("Cache.codecs must name at least one codec, got ()")

    def choices(self) -> tuple[Codec, ...]:
        """The codecs this cache may use, resolved."""
        if self.codecs is not None:
            names: Sequence[str | Codec] = self.codecs
        elif self.codec != "auto":
            names = (self.codec,)
        else:
            names = [n for n in ("none", "quantize-16", "lz4", "zstd") if n in available()]
            if self.min_psnr is not None and "jpeg" in available():
                names.append("jpeg")
        codecs = [c if isinstance(c, Codec) else CODECS.get(c) for c in names]
        if self.codec != "auto" and self.codecs is not None:
            first = self.codec if isinstance(self.codec, Codec) else CODECS.get(self.codec)
            codecs = [first, *(c for c in codecs if c.name != first.name)]
        return tuple(codecs)


def _exact_for_integers(codec: Codec) -> bool:
    """Quantisation is exact on integer data whose range fits: allowed without a PSNR floor
    (it declines float data then)."""
    return codec.name.startswith("quantize")


# Counters the workers add to and the training process reads (int64 slots of the control
# file; slot 0 is the codec in use, as an index into the cache's codecs, -1 for "off").
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
_CONTROL = struct.Struct(f"<qq{len(COUNTERS)}q")  # codec, enabled, counters
_OFF = -1


@dataclass
class CacheStats:
    """What the cache has done (all workers, cumulative)."""

    codec: str
    """The codec new entries are written with ("off": the cache is bypassed)."""
    enabled: bool
    """False once an "auto" cache found the dataset would not fit."""
    budget: int = 0
    """Bytes all tiers may hold."""
    held_bytes: dict[str, int] = field(default_factory=dict)
    """Bytes held per tier ("memory", "disk")."""
    entries: dict[str, int] = field(default_factory=dict)
    """Entries per tier."""
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


class SampleCache:
    """The running cache (made by the loader; pickled to each worker).

    Args:
        settings: the user's :class:`Cache`.
        namespace: identity of the dataset and of the cached ops (keys start from it).
        prefix: how many of the Pipeline's ops are cached (0: ``dataset[i]`` only).
        samples: the dataset's length, when known (an "auto" cache projects its size).
        auto: turn off (and free the memory) if the dataset is projected not to fit.
    """

    def __init__(
        self, settings: Cache, namespace: str, prefix: int, samples: int | None, auto: bool
    ) -> None:
        self.settings = settings
        self.namespace = namespace
        self.prefix = prefix
        self.samples = samples
        self.auto = auto
        self.codecs = settings.choices()
        self.decoders: dict[str, Codec] = {c.name: c for c in (*self.codecs, Raw())}
        self.fallback = Raw()
        SHM_ROOT.mkdir(exist_ok=True)
        remove_orphan_caches()
        self.root = SHM_ROOT / f"{_PREFIX}{os.getpid()}-{os.urandom(4).hex()}"
        self.root.mkdir()
        self.owner = os.getpid()
        self.tiers = [
            DirectoryTier(self.root / "entries", _memory_budget(settings.memory), "memory").open()
        ]
        if settings.disk is not None:
            disk = Path(settings.disk)
            budget = _disk_budget(settings.disk_bytes, disk)
            self.tiers.append(DirectoryTier(disk / "drapps-cache", budget, "disk").open())
        self._control = self.root / ".control"
        self._fd = -1
        self._pid = -1
        self._pending = dict.fromkeys(COUNTERS, 0)
        self._codec_index = 0
        self._enabled = True
        self._write_control(codec=0, enabled=1)

    # ------------------------------------------------------------------ worker side

    def cut(self, stop: int) -> int:
        """How many of the Pipeline's ops the entries hold for samples cut at ``stop`` (a
        split before the prefix's end caches less)."""
        return min(self.prefix, stop)

    def begin_batch(self) -> bool:
        """Read the codec in use and whether the cache is on (once per batch); True if on."""
        codec, enabled = self._read_control()[:2]
        self._codec_index, self._enabled = codec, bool(enabled)
        return self._enabled and codec != _OFF

    def get(self, index: Any, cut: int) -> tuple[Any, bool] | None:
        """``(sample, exact)`` from the cache, or None (a miss: make it and :meth:`put` it)."""
        key = self.key(index, cut)
        t0 = time.perf_counter_ns()
        for tier in self.tiers:
            data = tier.read(key)
            if data is None:
                continue
            try:
                sample, exact = unpack(data, self.decoders)
            except CorruptEntry as exc:
                logger.warning("dropping a corrupt cache entry of sample %r: %s", index, exc)
                tier.drop(key)
                self._pending["corrupt"] += 1
                continue
            self._pending["hits"] += 1
            self._pending["lossy_hits"] += not exact
            self._pending["read_ns"] += time.perf_counter_ns() - t0
            self._migrate(tier, key, data, sample)
            return sample, exact
        self._pending["misses"] += 1
        return None

    def put(self, index: Any, cut: int, sample: Any, make_ns: int) -> None:
        """Store what was made for ``index`` in the first tier with room."""
        self._pending["make_ns"] += make_ns
        if self.auto and not (self._enabled and self._read_control()[1]):
            self._enabled = False  # turned off since this batch began (here or elsewhere)
            return
        t0 = time.perf_counter_ns()
        packed = pack(sample, self._codec(), self.fallback, self.settings.min_psnr)
        key = self.key(index, cut)
        for tier in self.tiers:
            if tier.write(key, packed.data):
                self._pending["writes"] += 1
                self._pending["bytes_written"] += len(packed.data)
                self._pending["raw_bytes_written"] += packed.raw_bytes
                admitted = True
                break
        else:
            self._pending["not_admitted"] += 1
            admitted = False
        self._pending["write_ns"] += time.perf_counter_ns() - t0
        if self.auto:
            self._check_fit(full=not admitted)

    def end_batch(self, lossy: bool) -> None:
        """Add this batch's counters to the shared ones."""
        self._pending["lossy_batches"] += lossy
        with self._locked() as fd:
            values = list(_CONTROL.unpack(os.pread(fd, _CONTROL.size, 0)))
            for i, name in enumerate(COUNTERS):
                values[2 + i] += self._pending[name]
            os.pwrite(fd, _CONTROL.pack(*values), 0)
        self._pending = dict.fromkeys(COUNTERS, 0)

    def key(self, index: Any, cut: int) -> str:
        return hashlib.blake2b(
            f"{self.namespace}:{cut}:{index!r}".encode(), digest_size=20
        ).hexdigest()

    def _codec(self) -> Codec:
        return self.codecs[self._codec_index] if self._codec_index >= 0 else self.fallback

    def _migrate(self, tier: DirectoryTier, key: str, data: bytearray, sample: Any) -> None:
        """Re-encode an entry that the codec in use has not been asked to write, so a codec
        change reaches the entries made before it, one read each."""
        codec = self._codec()
        if codec.name in codecs_of(data):
            return
        packed = pack(sample, codec, self.fallback, self.settings.min_psnr)
        if tier.write(key, packed.data):
            self._pending["migrations"] += 1

    def _check_fit(self, full: bool) -> None:
        """Turn an "auto" cache off once it is full, or projected from its first entries
        to overflow before it holds the whole dataset."""
        held = [tier.held() for tier in self.tiers]
        entries = sum(n for _, n in held)
        budget = sum(tier.budget for tier in self.tiers)
        if full:
            projected = (
                float("inf")
                if not entries
                else sum(b for b, _ in held) / entries * (self.samples or 0)
            )
        elif entries < _SAMPLES_TO_PROJECT or self.samples is None:
            return
        else:
            projected = sum(b for b, _ in held) / entries * self.samples
        if full or projected > budget:
            logger.info(
                "sample cache off: the dataset would take ~%.0f MB of cache, more than the "
                "%.0f MB budget (pass cache=drapps.Cache(...) to cache part of it)",
                projected / 1e6,
                budget / 1e6,
            )
            self._write_control(enabled=0)
            self._enabled = False
            for tier in self.tiers:
                tier.clear()

    # ------------------------------------------------------------------ training process side

    def set_codec(self, name: str) -> None:
        """Write new entries with codec ``name`` ("off": bypass the cache). Entries already
        made are re-encoded as they are read.

        Raises:
            ValueError: ``name`` is not one of this cache's codecs.
        """
        names = [c.name for c in self.codecs]
        if name == "off":
            self._write_control(codec=_OFF)
            return
        if name not in names:
            raise ValueError(f"codec must be one of {[*names, 'off']}, got {name!r}")
        self._write_control(codec=names.index(name))

    def stats(self) -> CacheStats:
        codec, enabled, *counts = self._read_control()
        held = {t.name: t.held() for t in self.tiers}
        return CacheStats(
            codec="off" if codec == _OFF else self.codecs[codec].name,
            enabled=bool(enabled),
            budget=sum(t.budget for t in self.tiers),
            held_bytes={name: b for name, (b, _) in held.items()},
            entries={name: n for name, (_, n) in held.items()},
            counts=dict(zip(COUNTERS, counts, strict=True)),
        )

    def close(self) -> None:
        """Free the shared-memory tier (the disk tier stays for the next run). Idempotent."""
        if os.getpid() != self.owner:
            return
        if self._pid == os.getpid() and self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        for tier in self.tiers[1:]:
            tier._close_fd()
        shutil.rmtree(self.root, ignore_errors=True)

    # ------------------------------------------------------------------ the control file

    def _read_control(self) -> list[int]:
        with self._locked() as fd:
            return list(_CONTROL.unpack(os.pread(fd, _CONTROL.size, 0)))

    def _write_control(self, **values: int) -> None:
        with self._locked() as fd:
            raw = os.pread(fd, _CONTROL.size, 0)
            current = (
                list(_CONTROL.unpack(raw))
                if len(raw) == _CONTROL.size
                else [0] * (2 + len(COUNTERS))
            )
            if "codec" in values:
                current[0] = values["codec"]
            if "enabled" in values:
                current[1] = values["enabled"]
            os.pwrite(fd, _CONTROL.pack(*current), 0)

    @contextlib.contextmanager
    def _locked(self) -> Any:
        import fcntl

        if self._pid != os.getpid():
            self._fd = os.open(self._control, os.O_RDWR | os.O_CREAT, 0o600)
            self._pid = os.getpid()
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            yield self._fd
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fd": -1, "_pid": -1}

    def __repr__(self) -> str:
        names = [c.name for c in self.codecs]
        return f"SampleCache({self.root}, prefix={self.prefix}, codecs={names})"


def budget_bytes(value: int | str, name: str) -> int:
    """A tier's budget: 0 (the tier is not used) or a size :func:`parse_bytes` reads."""
    return (
        0
        if isinstance(value, int) and not isinstance(value, bool) and value == 0
        else parse_bytes(value, name)
    )


def _memory_budget(memory: int | str) -> int:
    if memory != "auto":
        return budget_bytes(memory, "Cache.memory")
    free = shutil.disk_usage(SHM_ROOT).free
    return int(min(psutil.virtual_memory().total / 4, free / 2))


def _disk_budget(disk_bytes: int | str, root: Path) -> int:
    if disk_bytes != "auto":
        return budget_bytes(disk_bytes, "Cache.disk_bytes")
    root.mkdir(parents=True, exist_ok=True)
    return shutil.disk_usage(root).free // 2


def namespace_of(settings: Cache, dataset: Any, ops: Sequence[Any], key: Any) -> str:
    """The identity entry keys start from: the dataset's, the cached ops' and the sample part
    they apply to.

    Raises:
        ValueError: the dataset has no fingerprint and cannot be pickled while a disk tier
            (which outlives the run) needs a stable identity.
    """
    identity = settings.key
    if identity is None and callable(getattr(dataset, "cache_fingerprint", None)):
        identity = dataset.cache_fingerprint()
    if identity is None:
        try:
            identity = hashlib.blake2b(pickle.dumps(dataset), digest_size=20).hexdigest()
        except Exception as exc:
            if settings.disk is not None:
                raise ValueError(
                    f"Cache: the dataset ({type(dataset).__name__}) cannot be pickled to key a "
                    f"disk cache ({exc}); give it a cache_fingerprint() method or pass "
                    "Cache(key=...)"
                ) from None
            identity = os.urandom(16).hex()  # memory only: the run's own entries
    try:
        cached_ops = pickle.dumps(list(ops))
    except Exception:
        cached_ops = repr(list(ops)).encode()
    digest = hashlib.blake2b(digest_size=20)
    for part in (str(identity).encode(), cached_ops, repr(key).encode()):
        digest.update(part)
        digest.update(b"\0")
    return digest.hexdigest()


def remove_orphan_caches() -> None:
    """Remove shared-memory tiers whose loader's process is gone (killed before closing)."""
    for path in SHM_ROOT.glob(f"{_PREFIX}*"):
        pid = path.name[len(_PREFIX) :].partition("-")[0]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
