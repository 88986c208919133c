"""A sample-cache tier in Redis, shared by every job and rank that reads the same data.

Entry keys hash the dataset's identity, the cached ops and the index (see
:func:`drapps.cache.sample_cache.namespace_of`), so two jobs, or the ranks of one job, that read the
same dataset through the same deterministic prefix find each other's entries. Entries are the
cache's own checked bytes (codec-compressed, CRC-protected); nothing is pickled. The size is
bounded by Redis itself (``maxmemory`` and its eviction policy): an evicted entry is a miss,
and a write Redis refuses (``noeviction`` and full) counts as not admitted.

A Redis that goes away does not stop the job: the tier logs one warning, answers every call as
a miss until it can reach Redis again (tried every ``retry_s``), and the samples are made as if
there were no cache.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from typing import Any

from drapps.cache.settings import budget_bytes
from drapps.integrations._redis import check_url, connect, redact, redis_errors, response_error

logger = logging.getLogger(__name__)

_UNBOUNDED = 2**62


class RedisTier:
    """Cache entries in a Redis database (``Cache(tiers=(RedisTier(url),))``).

    Args:
        url: ``redis://[user:password@]host:port/db``, ``rediss://...`` (TLS) or
            ``unix:///path/redis.sock?db=0``.
        budget: bytes the tier counts on: an int or "2GiB", or "auto" (Redis' ``maxmemory``;
            unbounded when it has none). Redis' eviction keeps the real bound.
        prefix: what every key starts with, so several caches can share a database.
        username, password: an ACL user, when not given in the URL.
        retry_s: how long an unreachable Redis is left alone before it is tried again.
        name: its name in the cache's stats.

    Example:
        >>> import drapps
        >>> from drapps.integrations.redis_tier import RedisTier
        >>> tier = RedisTier("redis://127.0.0.1:6379/0", budget="1GiB")
        >>> cache = drapps.Cache(memory=0, tiers=(tier,))  # entries only in Redis
        >>> tier.budget
        1073741824
    """

    def __init__(
        self,
        url: str,
        *,
        budget: int | str = "auto",
        prefix: str = "drapps:cache:",
        username: str | None = None,
        password: str | None = None,
        retry_s: float = 5.0,
        name: str = "redis",
    ) -> None:
        self.url = check_url(url, "RedisTier url")
        if not isinstance(prefix, str) or not prefix:
            raise ValueError(f"RedisTier prefix must be a non-empty str, got {prefix!r}")
        if not isinstance(retry_s, (int, float)) or retry_s <= 0:
            raise ValueError(f"RedisTier retry_s must be > 0 seconds, got {retry_s!r}")
        self._budget_setting = budget
        self.budget = _UNBOUNDED if budget == "auto" else budget_bytes(budget, "RedisTier budget")
        self.prefix = prefix
        self.name = name
        self._credentials = (username, password)
        self._retry_s = float(retry_s)
        self._client: Any = None
        self._down_until = 0.0
        self._warned = False
        self._warned_refused = False

    # ------------------------------------------------------------------ the Tier protocol

    def open(self) -> RedisTier:
        """Connect and read the budget from Redis when it is "auto"; an unreachable Redis is
        warned about and tried again later."""
        client = self._connected()
        if client is not None and self._budget_setting == "auto":
            with contextlib.suppress(*redis_errors(), Exception):
                maxmemory = int(client.info("memory").get("maxmemory", 0))
                self.budget = maxmemory or _UNBOUNDED
        return self

    def read(self, key: str) -> bytes | None:
        client = self._connected()
        if client is None:
            return None
        try:
            data = client.get(self.prefix + key)
        except redis_errors() as exc:
            self._lost(exc)
            return None
        except response_error() as exc:  # NOPERM, WRONGTYPE, ...
            self._refused(exc)
            return None
        return None if data is None else bytes(data)

    def write(self, key: str, data: bytes) -> bool:
        client = self._connected()
        if client is None:
            return False
        try:
            client.set(self.prefix + key, data)
        except response_error() as exc:
            if "OOM" not in str(exc):  # OOM is full under noeviction: not admitted, quietly
                self._refused(exc)
            return False
        except redis_errors() as exc:
            self._lost(exc)
            return False
        return True

    def drop(self, key: str) -> None:
        client = self._connected()
        if client is None:
            return
        try:
            client.delete(self.prefix + key)
        except redis_errors() as exc:
            self._lost(exc)
        except response_error() as exc:
            self._refused(exc)

    def held(self) -> tuple[int, int]:
        """(bytes Redis uses, keys in its database), or (0, 0) while it is unreachable.
        Redis may be shared, so both count everything there, not only this tier's entries."""
        client = self._connected()
        if client is None:
            return 0, 0
        try:
            used = int(client.info("memory").get("used_memory", 0))
            return used, int(client.dbsize())
        except redis_errors() as exc:
            self._lost(exc)
            return 0, 0
        except response_error():  # a user without INFO rights
            return 0, 0

    def free(self) -> int:
        if self._connected() is None:
            return 0
        return max(0, self.budget - self.held()[0])

    def clear(self) -> None:
        """Remove every entry under this tier's prefix."""
        client = self._connected()
        if client is None:
            return
        try:
            batch: list[bytes] = []
            for key in client.scan_iter(match=_glob_escape(self.prefix) + "*", count=1000):
                batch.append(key)
                if len(batch) >= 1000:
                    client.unlink(*batch)
                    batch.clear()
            if batch:
                client.unlink(*batch)
        except redis_errors() as exc:
            self._lost(exc)
        except response_error() as exc:
            self._refused(exc)

    def close(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None

    # --------------------------------------------------------------------------- plumbing

    def _connected(self) -> Any:
        """The client, or None while Redis is considered unreachable."""
        if self._client is not None:
            return self._client
        if time.monotonic() < self._down_until:
            return None
        try:
            client = connect(self.url, username=self._credentials[0], password=self._credentials[1])
            client.ping()
        except redis_errors() as exc:
            self._lost(exc)
            return None
        if self._warned:
            logger.warning("the Redis cache tier at %s is reachable again", redact(self.url))
            self._warned = False
        self._client = client
        return client

    def _lost(self, exc: BaseException) -> None:
        self.close()
        self._down_until = time.monotonic() + self._retry_s
        if not self._warned:
            self._warned = True
            logger.warning(
                "the Redis cache tier at %s is unreachable (%s: %s); going on without it "
                "(samples are made as on a miss) and trying again every %.0f s",
                redact(self.url),
                type(exc).__name__,
                str(exc),
                self._retry_s,
            )

    def _refused(self, exc: BaseException) -> None:
        """Redis answered but refused (an ACL user without rights to these keys): say so
        once; the calls count as misses and entries as not admitted."""
        if not self._warned_refused:
            self._warned_refused = True
            logger.warning(
                "the Redis cache tier at %s refuses keys under %r (%s); going on without it",
                redact(self.url),
                self.prefix,
                str(exc),
            )

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_client"] = None  # each process connects for itself
        return state

    def __repr__(self) -> str:
        return f"RedisTier({redact(self.url)!r}, budget={self.budget}, prefix={self.prefix!r})"


def _glob_escape(text: str) -> str:
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)
