"""Connecting to Redis: one place for the URL forms, credentials and timeouts drapps uses."""

from __future__ import annotations

from typing import Any

from drapps._optional import require

# One redaction for every message, error and repr about a URL; it lives with Source, which
# needs it a floor below the integrations.
from drapps.engines.source import redact_url as redact

# A Redis that stops answering must not hang a worker or the training loop: every call gives
# up after this long and the caller decides (the cache tier goes on without it).
SOCKET_TIMEOUT_S = 2.0
CONNECT_TIMEOUT_S = 1.0


def check_url(url: Any, what: str) -> str:
    """``url`` if it is a Redis URL (``redis://``, ``rediss://`` or ``unix://``).

    Raises:
        ValueError: anything else, naming ``what`` it was given as.
    """
    if not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://")):
        shown = repr(redact(url)) if isinstance(url, str) else redact(url)
        raise ValueError(
            f"{what} must be a Redis URL (redis://[user:password@]host:port/db, rediss://... "
            f"or unix:///path/to/redis.sock), got {shown}"
        )
    return url


def connect(url: str, *, username: str | None = None, password: str | None = None) -> Any:
    """A ``redis.Redis`` client for ``url`` (credentials in the URL, or given here for an
    ACL user), with drapps' timeouts; raw bytes in and out (no decoding, no pickling)."""
    redis = require("redis")
    extra: dict[str, Any] = {}
    if username is not None:
        extra["username"] = username
    if password is not None:
        extra["password"] = password
    return redis.Redis.from_url(
        url,
        socket_timeout=SOCKET_TIMEOUT_S,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        health_check_interval=30,
        **extra,
    )


def redis_errors() -> tuple[type[BaseException], ...]:
    """The exceptions that mean Redis is unreachable or did not answer in time (redis-py
    wraps socket errors in these). Not the builtin TimeoutError or OSError: those are
    drapps' own, e.g. a queue reader's wait running out."""
    redis = require("redis")
    return (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


def response_error() -> type[BaseException]:
    """The exception for a call Redis answered with an error (NOPERM, OOM, NOGROUP, ...)."""
    return require("redis").exceptions.ResponseError


def watch_error() -> type[BaseException]:
    """The exception for a transaction a watched key's change called off (WATCH/MULTI)."""
    return require("redis").exceptions.WatchError
