"""Measuring codecs on images: ratio, bits per pixel, encode/decode speed, PSNR and SSIM.

``drapps codec compare`` runs :func:`compare_codecs` on decoded images of a folder and
:func:`rate_distortion` for JPEG over a range of qualities beside each learned codec, so the
two can be read as one rate-distortion chart. Times are medians over the images, in one
process and thread (``torch.set_num_threads(1)``), as a worker would run them.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from drapps._optional import require
from drapps.cache.codec import Codec, psnr
from drapps.cache.jpeg import Jpeg


def ssim(reference: np.ndarray, decoded: np.ndarray) -> float:
    """Structural similarity of two HWC uint8 images (scikit-image's, over the channels)."""
    metrics = require("skimage.metrics")
    return float(metrics.structural_similarity(reference, decoded, channel_axis=-1, data_range=255))


def measure(codec: Codec, images: Sequence[np.ndarray]) -> dict[str, Any]:
    """One codec over ``images`` (HWC uint8): sizes, speeds and quality."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    raw = stored = 0
    encode_s, decode_s, psnrs, ssims = [], [], [], []
    try:
        for image in images:
            t0 = time.perf_counter()
            encoded = codec.encode(image)
            t1 = time.perf_counter()
            if encoded is None:
                raise ValueError(
                    f"{codec.name} declines {image.dtype} images of shape {image.shape}"
                )
            payload = memoryview(bytes(encoded.payload))
            back = codec.decode(payload, encoded.meta, image.dtype, image.shape)
            t2 = time.perf_counter()
            raw += image.nbytes
            stored += len(payload)
            encode_s.append(t1 - t0)
            decode_s.append(t2 - t1)
            psnrs.append(psnr(image, back))
            ssims.append(ssim(image, back))
    finally:
        torch.set_num_threads(threads)
    pixels = sum(image.shape[0] * image.shape[1] for image in images)
    mb = raw / len(images) / 1e6
    finite = [p for p in psnrs if np.isfinite(p)]
    return {
        "codec": codec.name,
        "ratio": raw / stored,
        "bpp": 8 * stored / pixels,
        "encode_ms": 1000 * statistics.median(encode_s),
        "decode_ms": 1000 * statistics.median(decode_s),
        "encode_mb_s": mb / statistics.median(encode_s),
        "decode_mb_s": mb / statistics.median(decode_s),
        "psnr": statistics.fmean(finite) if finite else float("inf"),
        "ssim": statistics.fmean(ssims),
    }


def compare_codecs(codecs: Sequence[Codec], images: Sequence[np.ndarray]) -> list[dict[str, Any]]:
    """:func:`measure` for each codec."""
    return [measure(codec, images) for codec in codecs]


def rate_distortion(
    images: Sequence[np.ndarray],
    qualities: Sequence[int] = (10, 20, 30, 40, 50, 60, 70, 80, 90, 95),
) -> list[dict[str, Any]]:
    """JPEG's curve: :func:`measure` at each quality (bits per pixel against PSNR / SSIM)."""
    return [{**measure(Jpeg(q), images), "quality": q} for q in qualities]


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as a markdown table."""
    lines = [
        "| codec | ratio | bits/pixel | encode MB/s | decode MB/s | encode ms | decode ms "
        "| PSNR dB | SSIM |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        quality = "exact" if not np.isfinite(r["psnr"]) else f"{r['psnr']:.1f}"
        lines.append(
            f"| {r['codec']} | {r['ratio']:.2f} | {r['bpp']:.2f} | {r['encode_mb_s']:.0f} | "
            f"{r['decode_mb_s']:.0f} | {r['encode_ms']:.2f} | {r['decode_ms']:.2f} | "
            f"{quality} | {r['ssim']:.4f} |"
        )
    return "\n".join(lines) + "\n"
