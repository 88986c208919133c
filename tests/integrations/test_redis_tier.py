"""The Redis cache tier against a real redis-server on loopback (password, no persistence)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from _redis_server import PASSWORD, redis_server

import drapps
from drapps.integrations.redis_tier import RedisTier

pytestmark = pytest.mark.integration  # starts real engines or interpreters


class Photos:
    """Deterministic uint8 images that say so (``cache_fingerprint``), as ImageFolder does."""

    def __init__(self, n: int, side: int = 16) -> None:
        self.n, self.side = n, side

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        rng = np.random.default_rng(i)
        return rng.integers(0, 255, (3, self.side, self.side), dtype=np.uint8)

    def cache_fingerprint(self) -> str:
        return f"photos-{self.n}-{self.side}"


def epoch(loader: drapps.Loader) -> list[torch.Tensor]:
    return [b.clone() for b in loader]


def redis_cache(url: str, **tier: Any) -> drapps.Cache:
    return drapps.Cache(memory=0, codec="none", tiers=(RedisTier(url, **tier),))


def counts(loader: drapps.Loader) -> dict[str, int]:
    stats = loader.stats().cache
    assert stats is not None
    return stats["counts"]


def test_a_second_job_reads_what_the_first_wrote() -> None:
    data = Photos(48)
    reference = epoch(drapps.Loader(data, batch_size=8, shuffle=True, seed=0, cache=None))
    with redis_server() as server:
        with drapps.Loader(
            data, batch_size=8, shuffle=True, seed=0, workers=2, cache=redis_cache(server.url)
        ) as first:
            assert all(torch.equal(a, b) for a, b in zip(reference, epoch(first), strict=True))
            assert counts(first)["writes"] == 48
        # Another job (its own loader and workers) with the same dataset and pipeline prefix.
        with drapps.Loader(
            data, batch_size=8, shuffle=True, seed=0, workers=2, cache=redis_cache(server.url)
        ) as second:
            assert all(torch.equal(a, b) for a, b in zip(reference, epoch(second), strict=True))
            assert (counts(second)["hits"], counts(second)["misses"]) == (48, 0)
        # Another dataset does not see those entries.
        with drapps.Loader(
            Photos(48, 8), batch_size=8, workers=0, cache=redis_cache(server.url)
        ) as other:
            epoch(other)
            assert counts(other)["hits"] == 0


def test_the_job_goes_on_when_redis_dies_and_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    data = Photos(40)
    reference = epoch(drapps.Loader(data, batch_size=4, seed=0, cache=None))
    with redis_server() as server:
        loader = drapps.Loader(data, batch_size=4, seed=0, workers=0, cache=redis_cache(server.url))
        with loader, caplog.at_level(logging.WARNING, logger="drapps.integrations.redis_tier"):
            got = []
            for n, batch in enumerate(loader):
                got.append(batch.clone())
                if n == 3:
                    server.kill()
            got2 = epoch(loader)  # the whole next epoch without Redis
        assert all(torch.equal(a, b) for a, b in zip(reference, got, strict=True))
        assert all(torch.equal(a, b) for a, b in zip(reference, got2, strict=True))
        warnings = [r.getMessage() for r in caplog.records if "unreachable" in r.getMessage()]
        assert len(warnings) == 1
        assert PASSWORD not in warnings[0] and "***" in warnings[0]


def test_worker_processes_go_on_when_redis_dies() -> None:
    data = Photos(64)
    reference = epoch(drapps.Loader(data, batch_size=4, seed=1, cache=None))
    with redis_server() as server:
        with drapps.Loader(
            data, batch_size=4, seed=1, workers=2, cache=redis_cache(server.url, retry_s=60)
        ) as loader:
            epoch(loader)
            got = []
            for n, batch in enumerate(loader):
                got.append(batch.clone())
                if n == 2:
                    server.kill()
        assert all(torch.equal(a, b) for a, b in zip(reference, got, strict=True))


def test_redis_eviction_bounds_the_tier_and_evicted_entries_are_misses() -> None:
    data = Photos(96, 128)  # 48 KB samples, 4.7 MB in all; Redis itself takes ~1 MB
    with redis_server("--maxmemory", "4mb", "--maxmemory-policy", "allkeys-lru") as server:
        tier = RedisTier(server.url)
        cache = drapps.Cache(memory=0, codec="none", tiers=(tier,))
        # Shuffled: a sequential scan of more than fits under LRU would miss every time.
        kwargs: dict[str, Any] = {"batch_size": 8, "shuffle": True, "seed": 0}
        with drapps.Loader(data, workers=0, cache=cache, **kwargs) as loader:
            reference = epoch(drapps.Loader(data, cache=None, **kwargs))
            epoch(loader)
            loader.set_epoch(0)
            assert all(torch.equal(a, b) for a, b in zip(reference, epoch(loader), strict=True))
            c = counts(loader)
            assert 0 < c["hits"] < 96 and c["misses"] > 96, c  # some were evicted
            assert tier.budget == 4 * 2**20  # "auto" read Redis' maxmemory
            assert tier.held()[0] <= 1.1 * 4 * 2**20


def test_a_full_redis_without_eviction_refuses_and_counts_it() -> None:
    data = Photos(96, 128)
    with redis_server("--maxmemory", "4mb", "--maxmemory-policy", "noeviction") as server:
        with drapps.Loader(data, batch_size=8, workers=0, cache=redis_cache(server.url)) as loader:
            epoch(loader)
            assert counts(loader)["not_admitted"] > 0


def test_a_wrong_password_is_a_warning_not_a_failure(caplog: pytest.LogCaptureFixture) -> None:
    data = Photos(8)
    with redis_server() as server:
        url = f"redis://:wrong@127.0.0.1:{server.port}/0"
        with caplog.at_level(logging.WARNING, logger="drapps.integrations.redis_tier"):
            with drapps.Loader(data, batch_size=4, workers=0, cache=redis_cache(url)) as loader:
                assert len(epoch(loader)) == 2
        assert any("unreachable" in r.getMessage() for r in caplog.records)


def test_tier_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="RedisTier url must be a Redis URL"):
        RedisTier("http://localhost:6379")
    with pytest.raises(ValueError, match="RedisTier budget"):
        RedisTier("redis://127.0.0.1:6379", budget="lots")
    with pytest.raises(ValueError, match="prefix must be a non-empty str"):
        RedisTier("redis://127.0.0.1:6379", prefix="")
    assert "***" in repr(RedisTier("redis://user:secret@127.0.0.1:6379/0"))


def test_a_unix_socket_and_an_acl_user_work(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import redis

    sock = str(tmp_path / "redis.sock")
    with redis_server("--unixsocket", sock, "--unixsocketperm", "700") as server:
        admin = redis.Redis(port=server.port, password=PASSWORD)
        admin.acl_setuser(
            "trainer",
            enabled=True,
            passwords=["+trainer-pw"],
            keys=["drapps:*"],
            commands=["+@all"],
        )
        admin.close()
        tier = RedisTier(f"unix://{sock}?db=0", username="trainer", password="trainer-pw")
        cache = drapps.Cache(memory=0, codec="none", tiers=(tier,))
        with drapps.Loader(Photos(16), batch_size=4, workers=2, cache=cache) as loader:
            epoch(loader)
            assert counts(loader)["writes"] == 16
        # The user may touch only drapps:* keys: another prefix is refused, as a miss.
        other = RedisTier(
            f"unix://{sock}?db=0", username="trainer", password="trainer-pw", prefix="x:"
        )
        with caplog.at_level(logging.WARNING, logger="drapps.integrations.redis_tier"):
            assert other.open().write("k", b"v") is False
            assert other.read("k") is None
        refusals = [r for r in caplog.records if "refuses keys under 'x:'" in r.getMessage()]
        assert len(refusals) == 1
