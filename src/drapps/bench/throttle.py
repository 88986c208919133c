"""A slow disk shared by every process that reads through it: the ``slow-io`` scenario.

Real slow storage (a network file system, a cold cache on a busy disk) has two costs: a fixed
latency per read, which more readers in parallel hide, and a bandwidth, which they share. The
throttle models both. The bandwidth is a token bucket kept in a small file: each read takes the
file's lock, books ``size / rate`` seconds on the shared timeline and sleeps until its slot ends,
so the total stays at ``rate`` whether reads come from threads, forked workers or spawned ones.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import struct
import tempfile
import time
import weakref
from typing import Any

_SLOT = struct.Struct("d")


def _remove(path: str, owner: int) -> None:
    if os.getpid() == owner:  # not a forked child's copy, collected in the child
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


class IoThrottle:
    """Reads files at no more than ``mb_per_s`` in all, plus ``latency_ms`` per read.

    Picklable (it carries only the bucket's path), so a dataset holding one can go to worker
    processes of any start method. The creator owns the bucket file; ``close()`` removes it.

    Example:
        >>> throttle = IoThrottle(mb_per_s=50, latency_ms=1)
        >>> data = throttle.read(__file__)
        >>> throttle.close()
    """

    def __init__(self, mb_per_s: float, latency_ms: float = 0.0, path: str | None = None) -> None:
        if not mb_per_s > 0:
            raise ValueError(f"mb_per_s must be > 0, got {mb_per_s!r}")
        if latency_ms < 0:
            raise ValueError(f"latency_ms must be >= 0, got {latency_ms!r}")
        self.mb_per_s = float(mb_per_s)
        self.latency_ms = float(latency_ms)
        self._owner = path is None
        self._removal: weakref.finalize[Any, Any] | None = None
        if path is None:
            fd, path = tempfile.mkstemp(prefix="drapps-bench-io-", suffix=".bucket")
            os.write(fd, _SLOT.pack(0.0))
            os.close(fd)
            # Removed by close(), or else once the creator's throttle is collected or the
            # interpreter exits: a bench stopped halfway leaves no bucket behind.
            self._removal = weakref.finalize(self, _remove, path, os.getpid())
        self.path = path

    def __getstate__(self) -> dict[str, object]:
        return {"mb_per_s": self.mb_per_s, "latency_ms": self.latency_ms, "path": self.path}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._owner, self._removal = False, None

    def wait_for(self, size: int) -> None:
        """Block as a disk would before ``size`` bytes arrive."""
        cost = size / (self.mb_per_s * 1e6)
        with open(self.path, "r+b") as bucket:
            fcntl.flock(bucket, fcntl.LOCK_EX)
            try:
                now = time.monotonic()  # CLOCK_MONOTONIC: one timeline for every process
                (free_at,) = _SLOT.unpack(bucket.read(_SLOT.size))
                done = max(now, free_at) + cost
                bucket.seek(0)
                bucket.write(_SLOT.pack(done))
            finally:
                fcntl.flock(bucket, fcntl.LOCK_UN)
        done = max(done, now + self.latency_ms / 1000)
        delay = done - time.monotonic()
        if delay > 0:
            time.sleep(delay)

    def read(self, path: str | os.PathLike[str], offset: int = 0, size: int = -1) -> bytes:
        """``size`` bytes of ``path`` from ``offset`` (all of it by default), throttled."""
        with open(path, "rb") as file:
            file.seek(offset)
            data = file.read(size)
        self.wait_for(len(data))
        return data

    def close(self) -> None:
        if self._owner and self._removal is not None:
            self._removal()
            self._owner = False

    def __repr__(self) -> str:
        return f"IoThrottle(mb_per_s={self.mb_per_s:g}, latency_ms={self.latency_ms:g})"


class TailedReads:
    """File reads from storage with a heavy-tailed latency: most reads take nothing extra, a
    ``share`` of them wait ``tail_ms`` times a Pareto draw (shape 1.5, capped at 10x): a cold
    object store, a busy network filesystem. Reads go through ``throttle`` too when given.

    Picklable; each process draws from its own generator.

    Example:
        >>> reads = TailedReads(share=0.0)
        >>> len(reads(__file__)) > 0
        True
    """

    def __init__(
        self, share: float = 0.03, tail_ms: float = 40.0, throttle: IoThrottle | None = None
    ) -> None:
        if not 0 <= share <= 1:
            raise ValueError(f"share must be in [0, 1], got {share!r}")
        if tail_ms < 0:
            raise ValueError(f"tail_ms must be >= 0, got {tail_ms!r}")
        self.share, self.tail_ms, self.throttle = share, tail_ms, throttle
        self._rng: random.Random | None = None
        self._pid = 0

    def __getstate__(self) -> dict[str, object]:
        return {"share": self.share, "tail_ms": self.tail_ms, "throttle": self.throttle}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._rng, self._pid = None, 0

    def delay_s(self) -> float:
        """Seconds the next read waits beyond its transfer."""
        if self._rng is None or self._pid != os.getpid():
            self._rng, self._pid = random.Random(), os.getpid()  # seeded from os.urandom
        if self._rng.random() >= self.share:
            return 0.0
        return self.tail_ms / 1000 * min(10.0, self._rng.paretovariate(1.5))

    def __call__(self, path: str | os.PathLike[str]) -> bytes:
        delay = self.delay_s()
        if delay:
            time.sleep(delay)
        if self.throttle is not None:
            return self.throttle.read(path)
        with open(path, "rb") as file:
            return file.read()
