"""``lz4``: fast lossless compression (LZ4 frame); decodes at GB/s, compresses little on photos."""

from __future__ import annotations

from typing import Any

import numpy as np

from drapps._optional import require
from drapps.cache.codec import Codec, Encoded


class Lz4(Codec):
    """LZ4 frame format at its default (fastest) level."""

    name = "lz4"

    def encode(self, array: np.ndarray) -> Encoded:
        frame = require("lz4.frame")
        return Encoded(frame.compress(array.reshape(-1).view(np.uint8).data, store_size=True))

    def decode(
        self, payload: memoryview, meta: dict[str, Any], dtype: np.dtype, shape: tuple[int, ...]
    ) -> np.ndarray:
        frame = require("lz4.frame")
        return np.frombuffer(bytearray(frame.decompress(payload)), dtype=dtype).reshape(shape)
