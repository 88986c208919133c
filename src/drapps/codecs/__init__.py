"""Codecs and the sample cache.

``drapps.Loader(..., cache=drapps.Cache(...))`` keeps what the deterministic prefix of the
pipeline made (decoded images, token ids) in shared memory and on disk, compressed by a codec
the controller may change at run time. See ``docs/cache.md``.
"""

from drapps.codecs.cache import SampleCache
from drapps.codecs.codec import Codec, Encoded, psnr
from drapps.codecs.control import CacheStats
from drapps.codecs.registry import CODECS, available
from drapps.codecs.settings import Cache

__all__ = ["CODECS", "Cache", "CacheStats", "Codec", "Encoded", "SampleCache", "available", "psnr"]
