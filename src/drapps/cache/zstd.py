"""``zstd``: lossless Zstandard at a level (``zstd`` is level 3, ``zstd-9`` level 9)."""

from __future__ import annotations

from typing import Any

import numpy as np

from drapps._optional import require
from drapps.cache.codec import Codec, Encoded


class Zstd(Codec):
    """Zstandard at ``level`` (1-22: higher is smaller and slower to encode; decoding speed
    barely changes)."""

    def __init__(self, level: int = 3) -> None:
        if not 1 <= level <= 22:
            raise ValueError(f"zstd level must be in 1..22, got {level!r}")
        self.level = level
        self.name = "zstd" if level == 3 else f"zstd-{level}"  # type: ignore[misc]

    def encode(self, array: np.ndarray) -> Encoded:
        zstandard = require("zstandard")
        compressor = zstandard.ZstdCompressor(level=self.level)
        return Encoded(compressor.compress(array.reshape(-1).view(np.uint8).data))

    def decode(
        self, payload: memoryview, meta: dict[str, Any], dtype: np.dtype, shape: tuple[int, ...]
    ) -> np.ndarray:
        zstandard = require("zstandard")
        raw = zstandard.ZstdDecompressor().decompress(payload)
        return np.frombuffer(bytearray(raw), dtype=dtype).reshape(shape)
