"""The codec registry: name -> codec instance (``CODECS.get("zstd")``)."""

from __future__ import annotations

import importlib.util

from drapps.cache.codec import Codec
from drapps.cache.jpeg import Jpeg
from drapps.cache.lz4 import Lz4
from drapps.cache.none import Raw
from drapps.cache.quantize import Quantize
from drapps.cache.zstd import Zstd
from drapps.registry import Registry

CODECS: Registry[Codec] = Registry("codec")
"""Registered codecs. A user's codec registers with ``CODECS.register("name", MyCodec())``."""

# module each built-in needs (None: nothing beyond NumPy)
_NEEDS = {
    "none": None,
    "quantize-16": None,
    "quantize-8": None,
    "lz4": "lz4",
    "zstd": "zstandard",
    "zstd-1": "zstandard",
    "zstd-9": "zstandard",
    "jpeg": "simplejpeg",
    "jpeg-75": "simplejpeg",
}

for _codec in (
    Raw(),
    Quantize(16),
    Quantize(8),
    Lz4(),
    Zstd(3),
    Zstd(1),
    Zstd(9),
    Jpeg(90),
    Jpeg(75),
):
    CODECS.register(_codec.name, _codec, lossy=_codec.lossy)


def available() -> list[str]:
    """Registered codecs whose library is installed."""
    return [
        name
        for name in CODECS.names()
        if _NEEDS.get(name) is None or importlib.util.find_spec(_NEEDS[name]) is not None  # type: ignore[arg-type]
    ]
