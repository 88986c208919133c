"""Turning the loader's ``cache=`` argument into a running :class:`SampleCache` (or none)."""

from __future__ import annotations

from typing import Any

from drapps.cache.sample_cache import SampleCache, namespace_of
from drapps.cache.settings import Cache


def open_cache(
    cache: Cache | bool | str | None, dataset: Any, transform: Any, *, iterable: bool
) -> SampleCache | None:
    """The sample cache the loader runs, or None.

    ``"auto"`` (the loader's default) caches only where it is safe and lossless: a dataset
    that says it is deterministic and worth caching (a ``cache_fingerprint()`` method that
    returns a string; drapps' ImageFolder and PackedText do) and whose entries are projected
    to fit the budget (checked after the first entries; the cache turns itself off if not).

    Raises:
        ValueError: ``cache`` is not "auto", a bool, None or a :class:`Cache`, or a cache is
            asked for an iterable dataset (its samples have no index to key).
    """
    if cache is None or cache is False:
        return None
    auto = isinstance(cache, str) and cache == "auto"
    if not (auto or cache is True or isinstance(cache, Cache)):
        raise ValueError(
            f"cache must be 'auto', True, False, None or a drapps.Cache, got {cache!r}"
        )
    if iterable:
        if auto:
            return None
        raise ValueError(
            "cache: an iterable dataset's samples have no index to key a cache entry by; use "
            "a map-style dataset, or cache=None"
        )
    settings = cache if isinstance(cache, Cache) else Cache()
    method = getattr(dataset, "cache_fingerprint", None)
    fingerprint = method() if callable(method) else None  # once: ImageFolder's stats every file
    if auto and not isinstance(fingerprint, str):
        return None
    ops = list(getattr(transform, "ops", ())) if hasattr(transform, "run_sample") else []
    prefix = transform.deterministic_prefix() if ops else 0
    key = getattr(transform, "key", None) if ops else None
    namespace = namespace_of(settings, dataset, fingerprint, ops[:prefix], key)
    try:
        samples = len(dataset)
    except TypeError:
        samples = None
    if auto and samples is None:
        return None
    return SampleCache(settings, namespace, prefix, samples, auto=auto)
