"""``none``: the array's bytes as they are; the cheapest decode (a view of the read buffer)."""

from __future__ import annotations

from typing import Any

import numpy as np

from drapps.cache.codec import Codec, Encoded


class Raw(Codec):
    """No compression."""

    name = "none"

    def encode(self, array: np.ndarray) -> Encoded:
        return Encoded(array.reshape(-1).view(np.uint8).data)

    def decode(
        self, payload: memoryview, meta: dict[str, Any], dtype: np.dtype, shape: tuple[int, ...]
    ) -> np.ndarray:
        return np.frombuffer(payload, dtype=dtype).reshape(shape)
