"""Decode only what a random-resized crop needs: JPEG DCT-domain downscaling fused with the crop.

libjpeg-turbo can run its inverse DCT at 1/2, 1/4 or 1/8 scale, which skips most of the IDCT,
colour conversion and upsampling work. :class:`DecodeRandomResizedCrop` reads the JPEG's header,
draws the crop box on the full-size image exactly as :class:`~drapps.ops.RandomResizedCrop`
does (same generator, same draws), and decodes at the smallest of those scales at which the box
still covers ``size`` x ``size`` pixels; the box, scaled, is then resized to ``size`` as on the
full path. So batches stay deterministic across worker counts, and the pixels differ from
decode-then-crop only by the resampling path: the DCT's downscale replaces part of OpenCV's
bilinear one (which does not low-pass, so on large reductions the fused path aliases less). The
box is rounded to the reduced image's pixel grid, a shift of at most half a reduced pixel.

Region decoding: with drapps' compiled decoder (``drapps.ops._jpeg_region``, built at install
time against the system's libjpeg-turbo), only the rows and iMCU columns the box covers go through
the inverse DCT, upsampling and colour conversion; the rows above it are only entropy-decoded and
the decode stops after its last row, as tf.data's ``decode_and_crop_jpeg`` does. Its pixels are
the whole-image decode's, bit for bit, at every scale (one column beyond the box on each side is
decoded so the chroma upsampling sees the same neighbours), so it changes speed, never batches.
Without the compiled decoder (no compiler or no libjpeg headers at install time), the op decodes
the whole photo; :data:`REGION_DECODER` says which is in use.
"""

from __future__ import annotations

import numpy as np

from drapps._optional import require
from drapps.ops.image import RandomResizedCrop
from drapps.ops.op import Op, Spec, expect
from drapps.runtime.seeding import active_rng

try:
    import drapps.ops._jpeg_region as _jpeg_region
except ImportError:  # not built: no compiler or no libjpeg headers when installed
    _jpeg_region = None  # type: ignore[assignment]

REGION_DECODER: str | None = None if _jpeg_region is None else _jpeg_region.library_version()
"""The library region decodes run on (``"libjpeg-turbo 2.1.5"``), or None when the compiled
decoder is missing and every decode is of the whole photo."""

PATHS = ("full", "reduced", "region")
"""What :attr:`DecodeRandomResizedCrop.last_path` can say: the whole photo at full size, the
whole photo at a reduced DCT scale, or only the box's rows and columns (at any scale)."""

REDUCTIONS = (8, 4, 2)
"""The IDCT scales used, as denominators (libjpeg-turbo's fast power-of-two ones)."""


def reduction(crop_height: int, crop_width: int, size: int) -> int:
    """The largest denominator ``d`` in 8, 4, 2 at which a crop still covers ``size`` pixels
    both ways when decoded at 1/d scale; 1 when none does.

    Example:
        >>> reduction(900, 1000, 224), reduction(448, 500, 224), reduction(447, 900, 224)
        (4, 2, 1)
    """
    for d in REDUCTIONS:
        if crop_height >= size * d and crop_width >= size * d:
            return d
    return 1


def decode_region(
    data: bytes, top: int, left: int, height: int, width: int, denom: int = 1
) -> np.ndarray:
    """The box (in the 1/``denom`` scaled image's pixels) of a JPEG, decoded alone: RGB HWC uint8,
    equal to the same box of the whole image decoded at that scale.

    Raises RuntimeError when the compiled decoder is missing (:data:`REGION_DECODER` is None),
    ValueError for data libjpeg cannot read or a box outside the image, and NotImplementedError
    for CMYK JPEGs.

    Example:
        >>> import numpy as np, simplejpeg
        >>> photo = np.random.default_rng(0).integers(0, 256, (64, 80, 3), dtype=np.uint8)
        >>> data = simplejpeg.encode_jpeg(photo, colorspace="RGB")
        >>> whole = simplejpeg.decode_jpeg(data, colorspace="RGB")
        >>> box = whole[9:39, 17:57]
        >>> REGION_DECODER is None or bool((decode_region(data, 9, 17, 30, 40) == box).all())
        True
    """
    if _jpeg_region is None:
        raise RuntimeError(
            "drapps' region decoder was not built (it needs a C compiler and libjpeg-turbo's "
            "headers when drapps is installed; Debian: apt-get install libjpeg62-turbo-dev)"
        )
    pixels, rows, cols, channels, x0 = _jpeg_region.decode_region(
        data, top, left, height, width, denom
    )
    return np.frombuffer(pixels, np.uint8).reshape(rows, cols, channels)[:, x0 : x0 + width]


def jpeg_size(data: bytes) -> tuple[int, int]:
    """(height, width) of a JPEG, from its header alone."""
    simplejpeg = require("simplejpeg")
    try:
        height, width, _, _ = simplejpeg.decode_jpeg_header(data)
    except ValueError as exc:
        raise ValueError(f"not a JPEG that libjpeg-turbo can read: {exc}") from None
    return int(height), int(width)


class DecodeRandomResizedCrop(Op):
    """JPEG bytes -> a random-resized ``size`` x ``size`` crop (HWC uint8 RGB), decoding at the
    smallest DCT scale the crop allows.

    Draws the same box as ``DecodeJPEG()`` followed by ``RandomResizedCrop(size, scale, ratio)``
    in a :class:`~drapps.ops.Compose`; with ``reduce=False`` it is that full path, pixel for
    pixel. See the module docstring for how the pixels differ when it reduces. Region decoding
    never changes the pixels, only the time.

    Args:
        size: output side in pixels.
        scale, ratio: as :class:`~drapps.ops.RandomResizedCrop`.
        reduce: decode at 1/2, 1/4 or 1/8 scale when the crop allows it (the default);
            False decodes at full size.
        region: decode only the box's rows and columns when the compiled decoder is there
            (the default); False always decodes the whole photo.

    Example:
        >>> import numpy as np, simplejpeg
        >>> photo = np.zeros((1000, 1200, 3), dtype=np.uint8)
        >>> data = simplejpeg.encode_jpeg(photo, colorspace="RGB")
        >>> op = DecodeRandomResizedCrop(224, scale=(1.0, 1.0), ratio=(1.2, 1.2))
        >>> op(data).shape, op.last_reduction
        ((224, 224, 3), 4)
        >>> op.last_path in PATHS
        True
    """

    random = True

    def __init__(
        self,
        size: int,
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        reduce: bool = True,
        region: bool = True,
    ) -> None:
        for name, value in (("reduce", reduce), ("region", region)):
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be True or False, got {value!r}")
        self.crop = RandomResizedCrop(size, scale, ratio)  # checks size, scale and ratio
        require("simplejpeg")  # a missing extra is named here, not at the first batch
        self.reduce, self.region = reduce, region
        self.last_reduction = 1
        """The denominator the last call decoded at (1: full size), for tests and profiling."""
        self.last_path = "full"
        """Which of :data:`PATHS` the last call took."""

    def declare(self, takes: Spec) -> Spec:
        expect(self, takes, kind="bytes")
        return Spec("array", "uint8", "HWC", uniform=True)

    def __call__(self, data: bytes) -> np.ndarray:
        return self.apply(data, active_rng())

    def apply(self, data: bytes, rng: np.random.Generator) -> np.ndarray:
        """Decode and crop ``data`` with the box drawn from ``rng``."""
        simplejpeg, cv2 = require("simplejpeg"), require("cv2")
        height, width = jpeg_size(data)
        top, left, h, w = self.crop.crop_box(height, width, rng)
        size = self.crop.size
        d = reduction(h, w, size) if self.reduce else 1
        rows, cols = -(-height // d), -(-width // d)  # libjpeg's size at 1/d: ceil(side / d)
        if d > 1:  # the box on the scaled image's grid
            sy, sx = rows / height, cols / width
            y0, x0 = round(top * sy), round(left * sx)
            y1 = max(y0 + 1, min(rows, round((top + h) * sy)))
            x1 = max(x0 + 1, min(cols, round((left + w) * sx)))
            top, left, h, w = y0, x0, y1 - y0, x1 - x0
        region = None
        if self.region and _jpeg_region is not None:
            try:
                region = decode_region(data, top, left, h, w, d)
                self.last_path = "region"
            except NotImplementedError:  # CMYK: the whole-image decode converts it
                pass
        if region is None:
            image = simplejpeg.decode_jpeg(data, colorspace="RGB", min_height=rows, min_width=cols)
            region = image[top : top + h, left : left + w]
            self.last_path = "full" if d == 1 else "reduced"
        self.last_reduction = d
        return cv2.resize(region, (size, size), interpolation=cv2.INTER_LINEAR)

    def __repr__(self) -> str:
        return (
            f"DecodeRandomResizedCrop(size={self.crop.size}, scale={self.crop.scale}, "
            f"ratio={self.crop.ratio}, reduce={self.reduce}, region={self.region})"
        )
