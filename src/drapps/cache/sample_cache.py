"""The sample cache: what the deterministic prefix of the pipeline made, kept across epochs.

:class:`SampleCache` is the running cache the loader makes from the user's
:class:`~drapps.cache.Cache` and hands to every worker.
A sample's entry holds ``dataset[i]`` after the pipeline's ops up to the first one that draws
randomness (or that drapps cannot see into), so the random suffix (crops, flips, masking) runs
after the cache, seeded exactly as without it. Entries live in tiers, shared memory first and
then a disk directory; a sample that fits in neither (or that a tier fails to store) is made
every epoch, and the stats say how many are.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

from drapps.cache.arena import ArenaTier
from drapps.cache.codec import Codec
from drapps.cache.control import COUNTERS, OFF, CacheStats, ControlBlock
from drapps.cache.entry import CorruptEntry, Uncacheable, pack, unpack
from drapps.cache.none import Raw
from drapps.cache.profile import ProfileRecorder
from drapps.cache.settings import Cache, budget_bytes
from drapps.cache.tier import DirectoryTier, Tier

logger = logging.getLogger(__name__)

_SAMPLES_TO_PROJECT = 32  # entries made before an "auto" cache judges whether the dataset fits


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
        _check_tiers(settings)
        self.owner = os.getpid()
        # The memory tier and the control block are nameless shared memory: nothing of them
        # stays behind, however the loader's processes end.
        self.tiers: list[Tier] = []
        try:
            memory = ArenaTier(_memory_budget(settings.memory), samples, "memory")
            self.tiers.append(memory.open())
            if settings.disk is not None:
                disk = Path(settings.disk)
                budget = _disk_budget(settings.disk_bytes, disk)
                directory = DirectoryTier(
                    disk / "drapps-cache", budget, "disk", shared_group=settings.shared_group
                )
                self.tiers.append(directory.open())
            self.tiers += [tier.open() for tier in settings.tiers]
            self.control = ControlBlock()
            self.control.set(codec=0, enabled=True)
        except BaseException:
            for tier in self.tiers:
                tier.close()
            raise
        self._pending = dict.fromkeys(COUNTERS, 0)
        self._codec_index = 0
        self._enabled = True
        self._profile: ProfileRecorder | None = None
        self._profiling = len(self.codecs) > 1
        self._unmigrated: set[str] = set()  # keys whose re-encoding found no room
        self._refused = 0  # size of the last entry no tier had room for
        self._warned_uncacheable = False
        self._warned: set[str] = set()  # tier failures logged once per process

    # ------------------------------------------------------------------ worker side

    def held_ops(self, split: int) -> int:
        """How many of the Pipeline's ops the entries hold for samples split at ``split`` (a
        split before the prefix's end caches less)."""
        return min(self.prefix, split)

    def begin_batch(self) -> bool:
        """Read the codec in use and whether the cache is on (once per batch); True if on."""
        codec, enabled, _ = self.control.read()
        if codec != self._codec_index:  # entries of another size: try again
            self._unmigrated.clear()
            self._refused = 0
        self._codec_index, self._enabled = codec, enabled
        return enabled and codec != OFF

    def get(self, index: Any, ops: int) -> tuple[Any, bool] | None:
        """``(sample, exact)`` from the cache, or None (a miss: make it and :meth:`put` it)."""
        key = self.key(index, ops)
        t0 = time.perf_counter_ns()
        for tier in self.tiers:
            data = self._read(tier, key, index)
            if data is None:
                continue
            if isinstance(data, bytes):
                data = bytearray(data)  # arrays decoded in place must be writable
            try:
                sample, exact, written_by = unpack(data, self.decoders)
            except CorruptEntry as exc:
                logger.warning("dropping a corrupt cache entry of sample %r: %s", index, str(exc))
                self._drop(tier, key)
                continue
            self._pending["hits"] += 1
            self._pending["lossy_hits"] += not exact
            self._pending["read_ns"] += time.perf_counter_ns() - t0
            self._migrate(tier, key, written_by, sample)
            return sample, exact
        self._pending["misses"] += 1
        return None

    def put(self, index: Any, ops: int, sample: Any, make_ns: int) -> None:
        """Store what was made for ``index`` in the first tier with room."""
        self._pending["make_ns"] += make_ns
        if self.auto and not (self._enabled and self.control.read()[1]):
            self._enabled = False  # turned off since this batch began (here or elsewhere)
            return
        self._measure(sample)
        t0 = time.perf_counter_ns()
        if self._refused and all(t.free() < self._refused for t in self.tiers):
            # Full: encoding a sample only to be refused would cost every miss an encode.
            self._pending["not_admitted"] += 1
            self._pending["write_ns"] += time.perf_counter_ns() - t0
            return
        try:
            packed = pack(sample, self._codec(), self.fallback, self.settings.min_psnr)
        except Uncacheable as exc:
            if not self._warned_uncacheable:
                self._warned_uncacheable = True
                logger.warning("sample %r is not cached: %s", index, str(exc))
            self._pending["not_admitted"] += 1
            return
        key = self.key(index, ops)
        self._refused = 0
        for tier in self.tiers:
            if self._write(tier, key, packed.data):
                self._pending["writes"] += 1
                self._pending["bytes_written"] += len(packed.data)
                self._pending["raw_bytes_written"] += packed.raw_bytes
                admitted = True
                break
        else:
            self._pending["not_admitted"] += 1
            self._refused = len(packed.data)
            admitted = False
        self._pending["write_ns"] += time.perf_counter_ns() - t0
        if self.auto:
            self._check_fit(full=not admitted)

    def end_batch(self, lossy: bool) -> None:
        """Add this batch's counters to the shared ones."""
        self._pending["lossy_batches"] += lossy
        self.control.add(self._pending)
        self._pending = dict.fromkeys(COUNTERS, 0)

    def key(self, index: Any, ops: int) -> str:
        return hashlib.blake2b(
            f"{self.namespace}:{ops}:{index!r}".encode(), digest_size=20
        ).hexdigest()

    def _read(self, tier: Tier, key: str, index: Any) -> bytearray | bytes | None:
        """The tier's entry for ``key``; None where it has none, cannot be read, or holds
        something that is not an entry (counted corrupt and dropped: a sample is never lost
        to what a shared directory holds)."""
        try:
            return tier.read(key)
        except CorruptEntry as exc:
            self._warn(
                "unusable",
                "the %s tier holds something that is not an entry for sample %r (%s): the "
                "sample is made again, and what is there dropped where it can be",
                tier.name,
                index,
                exc,
            )
            self._drop(tier, key)
        except OSError as exc:
            self._warn("read", "the %s tier could not read sample %r (%s)", tier.name, index, exc)
        return None

    def _write(self, tier: Tier, key: str, data: bytes) -> bool:
        """Whether the tier stored the entry; a store that fails is one without room."""
        try:
            return tier.write(key, data)
        except OSError as exc:
            self._warn("write", "the %s tier could not store %s (%s)", tier.name, key, exc)
            return False

    def _drop(self, tier: Tier, key: str) -> None:
        self._pending["corrupt"] += 1
        try:
            tier.drop(key)
        except OSError as exc:
            self._warn("drop", "the %s tier could not drop %s (%s)", tier.name, key, exc)

    def _warn(self, what: str, message: str, *args: Any) -> None:
        """Log a tier's failure: the first of each kind in this process as a warning. An error
        is logged as its text: a record that held it would hold its traceback's frames."""
        args = tuple(str(a) if isinstance(a, BaseException) else a for a in args)
        if what in self._warned:
            logger.debug(message, *args)
        else:
            self._warned.add(what)
            logger.warning(message + " (further ones are logged at debug level)", *args)

    def _codec(self) -> Codec:
        return self.codecs[self._codec_index] if self._codec_index >= 0 else self.fallback

    def _measure(self, sample: Any) -> None:
        """Profile every codec on this process's first samples, if it is the one that claims
        the profile (one worker measures; the result is shared through the control file)."""
        if not self._profiling:
            return
        if self._profile is None:
            if not self.control.claim("profile"):
                self._profiling = False
                return
            self._profile = ProfileRecorder(self.codecs, self.settings.min_psnr)
        if self._profile.add(sample):
            self.control.write_json(self._profile.result())
            self._profiling, self._profile = False, None

    def _migrate(self, tier: Tier, key: str, written_by: frozenset[str], sample: Any) -> None:
        """Re-encode an entry that the codec in use has not been asked to write, so a codec
        change reaches the entries made before it, one read each."""
        codec = self._codec()
        if key in self._unmigrated or codec.name in written_by:
            return
        packed = pack(sample, codec, self.fallback, self.settings.min_psnr)
        if self._write(tier, key, packed.data):
            self._pending["migrations"] += 1
        else:
            self._unmigrated.add(key)  # no room for it re-encoded: keep it as it is

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
            self.control.set(enabled=False)
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
            self.control.set(codec=OFF)
            return
        if name not in names:
            raise ValueError(f"codec must be one of {[*names, 'off']}, got {name!r}")
        self.control.set(codec=names.index(name))

    def stats(self) -> CacheStats:
        codec, enabled, counts = self.control.read()
        held = {t.name: t.held() for t in self.tiers}
        return CacheStats(
            codec="off" if codec == OFF else self.codecs[codec].name,
            enabled=enabled,
            profile=self.control.read_json() or {},
            budget=sum(t.budget for t in self.tiers),
            samples=self.samples or 0,
            held_bytes={name: b for name, (b, _) in held.items()},
            entries={name: n for name, (_, n) in held.items()},
            counts=counts,
        )

    def close(self) -> None:
        """Let go of the shared-memory tier (freed once the workers have exited too; the disk
        tier stays for the next run). Idempotent."""
        if os.getpid() != self.owner:
            return
        self.control.close()
        for tier in self.tiers:
            tier.close()

    def __repr__(self) -> str:
        names = [c.name for c in self.codecs]
        return f"SampleCache({self.namespace[:12]}, prefix={self.prefix}, codecs={names})"


def _check_tiers(settings: Cache) -> None:
    """Raise unless ``settings.tiers`` are tiers whose names are their own."""
    names = ["memory", "disk"]
    for tier in settings.tiers:
        if not isinstance(tier, Tier):
            raise ValueError(
                f"Cache.tiers must hold Tier objects (drapps.cache.tier), got {tier!r}"
            )
        if tier.name in names:
            raise ValueError(f"Cache.tiers: a tier named {tier.name!r} is already in the cache")
        names.append(tier.name)


def _memory_budget(memory: int | str) -> int:
    if memory != "auto":
        return budget_bytes(memory, "Cache.memory")
    machine = psutil.virtual_memory()
    return int(min(machine.total / 4, machine.available / 2))


def _disk_budget(disk_bytes: int | str, root: Path) -> int:
    if disk_bytes != "auto":
        return budget_bytes(disk_bytes, "Cache.disk_bytes")
    root.mkdir(parents=True, exist_ok=True)
    return shutil.disk_usage(root).free // 2


def namespace_of(
    settings: Cache, dataset: Any, fingerprint: str | None, ops: Sequence[Any], key: Any
) -> str:
    """The identity entry keys start from: the dataset's (``Cache.key``, else its
    ``fingerprint``, else a hash of it pickled), the cached ops' and the sample part they
    apply to.

    Raises:
        ValueError: the dataset has no fingerprint and cannot be pickled while a disk tier
            (which outlives the run) needs a stable identity.
    """
    identity = settings.key if settings.key is not None else fingerprint
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
