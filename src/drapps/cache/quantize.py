"""``quantize-16`` / ``quantize-8``: arrays to 16 or 8 bits per element.

Integer data whose range fits (GPT-2 token ids in 16 bits, uint8 pixels in 8) is stored as an
offset from its minimum: exact, so this is a lossless codec for it. Float data is mapped
affinely onto the ``2**bits`` levels between its minimum and maximum: lossy, with every element
within half a step, ``(max - min) / (2 * (2**bits - 1))``, of its original (the declared bound,
kept in the entry's meta as ``max_error``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from drapps.cache.codec import Codec, Encoded


class Quantize(Codec):
    """``bits`` (8 or 16) per element."""

    lossy = True

    def __init__(self, bits: int = 16) -> None:
        if bits not in (8, 16):
            raise ValueError(f"quantize bits must be 8 or 16, got {bits!r}")
        self.bits = bits
        self.name = f"quantize-{bits}"  # type: ignore[misc]
        self._store = np.dtype(np.uint8 if bits == 8 else np.uint16)

    def encode(self, array: np.ndarray) -> Encoded | None:
        if array.size == 0 or array.dtype == np.bool_:
            return None
        levels = (1 << self.bits) - 1
        if np.issubdtype(array.dtype, np.integer):
            if array.dtype.itemsize <= self._store.itemsize:
                return None  # already as narrow
            first, last = int(array.min()), int(array.max())
            if last - first > levels:
                return None  # narrowing would lose values: not this codec's job
            stored = (array.astype(np.int64) - first).astype(self._store)
            return Encoded(stored.tobytes(), {"offset": first}, exact=True)
        if not np.issubdtype(array.dtype, np.floating):
            return None
        low, high = float(array.min()), float(array.max())
        if not (np.isfinite(low) and np.isfinite(high)):
            return None
        step = (high - low) / levels or 1.0
        stored = np.rint((array.astype(np.float64) - low) / step).astype(self._store)
        meta = {"low": low, "step": step, "max_error": step / 2}
        return Encoded(stored.tobytes(), meta, exact=high == low)

    def decode(
        self, payload: memoryview, meta: dict[str, Any], dtype: np.dtype, shape: tuple[int, ...]
    ) -> np.ndarray:
        stored = np.frombuffer(payload, dtype=self._store).reshape(shape)
        if "offset" in meta:
            return (stored.astype(np.int64) + meta["offset"]).astype(dtype)
        return (stored * meta["step"] + meta["low"]).astype(dtype)
