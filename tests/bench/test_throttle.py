from __future__ import annotations

import gc
import multiprocessing as mp
import pickle
import time
from pathlib import Path

import pytest

from drapps.bench.throttle import IoThrottle


def _read_all(throttle: IoThrottle, path: str, times: int) -> None:
    for _ in range(times):
        throttle.read(path)


def test_bandwidth_is_shared_by_processes(tmp_path: Path) -> None:
    data = tmp_path / "blob"
    data.write_bytes(b"x" * 100_000)
    throttle = IoThrottle(mb_per_s=2.0)
    try:
        start = time.monotonic()
        ctx = mp.get_context("spawn")
        readers = [ctx.Process(target=_read_all, args=(throttle, str(data), 2)) for _ in range(2)]
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join(30)
        assert all(r.exitcode == 0 for r in readers)
        # 4 reads of 100 kB at 2 MB/s in all: at least 0.2 s, however many readers. A lower
        # bound holds on any machine, however slow.
        assert time.monotonic() - start >= 0.2
    finally:
        throttle.close()
    assert not Path(throttle.path).exists()


def test_latency_per_read_and_a_slice(tmp_path: Path) -> None:
    data = tmp_path / "blob"
    data.write_bytes(bytes(range(256)))
    throttle = IoThrottle(mb_per_s=1000, latency_ms=30)
    try:
        start = time.monotonic()
        assert throttle.read(data, offset=10, size=5) == bytes(range(10, 15))
        assert time.monotonic() - start >= 0.03
        copy = pickle.loads(pickle.dumps(throttle))
        assert copy.path == throttle.path and repr(copy) == repr(throttle)
        copy.close()  # a copy does not own the bucket
        assert Path(throttle.path).exists()
    finally:
        throttle.close()


def test_bad_rates_are_named() -> None:
    with pytest.raises(ValueError, match="mb_per_s must be > 0, got 0"):
        IoThrottle(0)
    with pytest.raises(ValueError, match="latency_ms must be >= 0, got -1"):
        IoThrottle(1, latency_ms=-1)


_HELD: list[IoThrottle] = []


def _drop_the_held_one() -> None:
    _HELD.clear()  # the child's copy, collected in the child
    gc.collect()


def test_an_unclosed_throttle_removes_its_bucket_once_collected() -> None:
    """A bench stopped halfway leaves no bucket file behind; a forked reader's copy, collected
    in the reader, leaves the creator's in place."""
    _HELD.append(IoThrottle(mb_per_s=10.0))
    path = Path(_HELD[0].path)
    reader = mp.get_context("fork").Process(target=_drop_the_held_one)
    reader.start()
    reader.join(30)
    assert reader.exitcode == 0 and path.exists()
    _HELD.clear()
    gc.collect()
    assert not path.exists()
