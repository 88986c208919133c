"""The codec contract: one array in, bytes out, and back; what it costs and whether it is exact.

A codec turns one array (a leaf of a cached sample: a decoded image, a token sequence) into
bytes and back. :meth:`Codec.encode` may decline an array it cannot take (JPEG on a float
tensor, 8-bit quantisation of a vocabulary of 50,257 tokens) by returning None: the cache then
stores that array with its lossless fallback. An encoding says whether it is exact, so a
lossy entry is only ever made where the user allowed it (``Cache(min_psnr=...)``) and is
counted when it is served.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np


@dataclass(frozen=True)
class Encoded:
    """One array as a codec wrote it."""

    payload: bytes | memoryview
    """The bytes to store."""
    meta: dict[str, Any] = field(default_factory=dict)
    """What :meth:`Codec.decode` needs besides the payload (scale, offset, shape, ...)."""
    exact: bool = True
    """Decoding gives back the array bit for bit."""


class Codec:
    """Turns arrays into bytes and back.

    Subclasses set :attr:`name` and implement :meth:`encode` and :meth:`decode`; a codec that
    may lose information sets :attr:`lossy` (it is then used only under a PSNR floor).
    """

    name: ClassVar[str] = "?"
    lossy: ClassVar[bool] = False
    """May give back an array that differs from what it was given."""

    def encode(self, array: np.ndarray) -> Encoded | None:
        """``array`` (C-contiguous) as bytes; None when this codec cannot take it."""
        raise NotImplementedError(f"{type(self).__name__} must implement encode")

    def decode(
        self, payload: memoryview, meta: dict[str, Any], dtype: np.dtype, shape: tuple[int, ...]
    ) -> np.ndarray:
        """The array back from :meth:`encode`'s payload and meta (writable)."""
        raise NotImplementedError(f"{type(self).__name__} must implement decode")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


def psnr(reference: np.ndarray, decoded: np.ndarray) -> float:
    """Peak signal-to-noise ratio in dB (``inf`` when equal). The peak is the dtype's range
    for integers (255 for uint8) and the data's range for floats.

    Example:
        >>> a = np.zeros((4, 4), np.uint8); b = a.copy(); b[0, 0] = 16
        >>> round(psnr(a, b), 1)
        36.1
    """
    ref = reference.astype(np.float64)
    mse = float(np.mean((ref - decoded.astype(np.float64)) ** 2))
    if mse == 0.0:
        return float("inf")
    byte_sized = np.issubdtype(reference.dtype, np.integer) and reference.dtype.itemsize == 1
    peak = 255.0 if byte_sized else float(np.ptp(ref)) or 1.0
    return 10.0 * float(np.log10(peak * peak / mse))
