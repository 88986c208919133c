"""Codecs and the sample cache.

``drapps.Loader(..., cache=drapps.Cache(...))`` keeps what the deterministic prefix of the
pipeline made (decoded images, token ids) in shared memory and on disk, compressed by a codec
the controller may change at run time. See ``docs/cache.md``.
"""

from drapps.cache.codec import Codec, Encoded, psnr
from drapps.cache.control import CacheStats
from drapps.cache.registry import CODECS, available
from drapps.cache.sample_cache import SampleCache
from drapps.cache.settings import Cache

__all__ = ["CODECS", "Cache", "CacheStats", "Codec", "Encoded", "SampleCache", "available", "psnr"]
